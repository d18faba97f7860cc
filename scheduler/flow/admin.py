"""The operator console's flow control: limits per queue or job type (ADMIN), and the job page's progress and wait.

A ``FlowLimit`` is edited through a form whose validation is ``flow.limits.validated`` (the
API's one rule), and saved through ``limit_set``/``limit_delete``. The changelist shows every
limit stored here with what it counts now; limits from handlers and settings are listed by the
API (GET /api/admin/limits) and on the queues list's "oldest waiting" panel's page.
Each limit says whether anything uses its name (the API's ``in_use``/``warning``, ``selectors.flow_name_use``): one on a
name nothing uses is kept, with a warning when saved and a mark on both lists (one query for the page).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from core.stored_json import UnreadableJSON
from scheduler import selectors
from scheduler.admin import OperatorAdmin, badge
from scheduler.exceptions import InvalidLimit
from scheduler.flow import limits as flow_limits
from scheduler.flow.aging import oldest_waiting
from scheduler.flow.explain import limit_usage
from scheduler.flow.models import FlowLimit


class FlowLimitForm(forms.ModelForm):
    """Validates with ``flow.limits.validated``: the same rule, messages and bounds as the API."""

    class Meta:
        model = FlowLimit
        fields = ("scope", "name", *flow_limits.FIELDS)

    def clean(self) -> dict[str, Any]:
        """Refuse what the API refuses, with its per-field messages."""
        data = super().clean()
        values = {f: data.get(f) for f in flow_limits.FIELDS}
        values = {k: (None if v in ("", None) else v) for k, v in values.items()}
        try:
            flow_limits.validated(values, scope=data.get("scope") or "", name=data.get("name") or "")
        except InvalidLimit as exc:
            for field, messages in (exc.details or {}).items():
                target = field if field in self.fields else None
                for message in messages:
                    self.add_error(target, message)
        return data


@admin.register(FlowLimit)
class FlowLimitAdmin(OperatorAdmin):
    """Concurrency and rate limits set by ADMINs (they win over handlers' and settings')."""

    form = FlowLimitForm
    list_display = ("scope", "name", "name_used", "concurrency", "partition", "rate", "running_now", "updated_at")
    list_filter = ("scope",)
    search_fields = ("name",)
    ordering = ("scope", "name")
    fields = ("scope", "name", *flow_limits.FIELDS)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """ADMINs set limits here."""
        return self._is_operator(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """ADMINs edit limits here."""
        return self._is_operator(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """ADMINs remove limits here."""
        return self._is_operator(request)

    def save_model(self, request: HttpRequest, obj: FlowLimit, form: Any, change: bool) -> None:
        """Save through ``limit_set`` (a renamed row is replaced: the old name's limit is removed)."""
        if change and form.initial and (form.initial.get("scope"), form.initial.get("name")) != (obj.scope, obj.name):
            flow_limits.limit_delete(scope=form.initial["scope"], name=form.initial["name"], actor=request.user)
        flow_limits.limit_set(
            scope=obj.scope,
            name=obj.name,
            data={f: getattr(obj, f) for f in flow_limits.FIELDS if getattr(obj, f)},
            actor=request.user,
        )
        saved = FlowLimit.objects.get(scope=obj.scope, name=obj.name)
        obj.pk, obj.updated_at = saved.pk, saved.updated_at
        warning = selectors.flow_name_use(scope=obj.scope, name=obj.name)["warning"]
        if warning:
            self.message_user(request, warning, messages.WARNING)

    def delete_model(self, request: HttpRequest, obj: FlowLimit) -> None:
        """Delete through ``limit_delete``."""
        flow_limits.limit_delete(scope=obj.scope, name=obj.name, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        """Delete each through ``limit_delete``."""
        for obj in queryset:
            flow_limits.limit_delete(scope=obj.scope, name=obj.name, actor=request.user)

    # The services record each change with its old and new values (``scheduler.action_log``), in
    # the change's transaction: Django's own entries for the same add, change or delete would
    # record it twice (and a rename, a delete and an add, as one change).
    def log_addition(self, request: HttpRequest, obj: Any, message: Any) -> None:
        """Nothing: ``limit_set`` recorded the addition."""

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> None:
        """Nothing: ``limit_set`` (and ``limit_delete`` for a rename) recorded the change."""

    def log_deletions(self, request: HttpRequest, queryset: Any) -> None:
        """Nothing: ``limit_delete`` records each deletion."""

    @admin.display(description="name used")
    def name_used(self, row: FlowLimit) -> SafeString:
        """ "yes", or "unused" saying no queue/type of this name is in use, the API's warning as its title.

        The page reads every row's use in one query (``changelist_view``); a row shown elsewhere asks alone.
        """
        use = getattr(row, "name_use", None) or selectors.flow_name_use(scope=row.scope, name=row.name)
        if use["in_use"]:
            return badge("yes", "#116329", data_name="in-use")
        return format_html(
            '<span title="{}">{} {}</span>',
            use["warning"],
            badge("unused", "#8a4600", data_name="in-use"),
            unused_words(row.scope),
        )

    @admin.display(description="per partition")
    def partition(self, row: FlowLimit) -> str:
        """``partition_concurrency`` per ``partition_key``, or "-"."""
        return f"{row.partition_concurrency or 1} per {row.partition_key}" if row.partition_key else "-"

    @admin.display(description="rate")
    def rate(self, row: FlowLimit) -> str:
        """``rate_limit`` per ``rate_period_seconds``, or "-"."""
        return f"{row.rate_limit} per {row.rate_period_seconds:g} s" if row.rate_limit else "-"

    @admin.display(description="running / started in window")
    def running_now(self, row: FlowLimit) -> str:
        """What the limit counts now (a snapshot)."""
        limit = flow_limits.effective_limits().get(f"{row.scope}:{row.name}")
        if limit is None:
            return "-"
        usage = limit_usage(limit)
        window = usage["admitted_in_window"]
        return f"{usage['running']}" + (f" / {window}" if window is not None else "")

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        """The list, with every limit in effect (any source) and the oldest waiting job per priority.

        Whether each name is in use (the rows of the page and the limits in effect) is read in one
        query (``selectors.flow_names_in_use``) once the page's rows are known, before it renders.
        """
        limits = flow_limits.effective_limits(fresh=True)
        effective = [{**lim.as_dict(), **limit_usage(lim)} for _, lim in sorted(limits.items())]
        extra = {"flow_effective": effective, "flow_oldest": oldest_waiting(), **(extra_context or {})}
        response = super().changelist_view(request, extra_context=extra)
        cl = (getattr(response, "context_data", None) or {}).get("cl")
        if cl is None:  # an action's redirect, or a bad filter's
            return response
        rows = list(cl.result_list)  # evaluated here: the template shows these same objects
        pairs = [(row.scope, row.name) for row in rows] + [(item["scope"], item["name"]) for item in effective]
        used = selectors.flow_names_in_use(names=pairs)
        for row in rows:
            row.name_use = selectors.flow_name_use(scope=row.scope, name=row.name, in_use=(row.scope, row.name) in used)
        for item in effective:
            key = (item["scope"], item["name"])
            item.update(selectors.flow_name_use(scope=key[0], name=key[1], in_use=key in used))
            item["unused_words"] = unused_words(item["scope"])
        return response


def unused_words(scope: str) -> str:
    """The console's mark of a limit on a name nothing uses: "no queue of this name is in use" (or type)."""
    return f"no {'queue' if scope == 'queue' else 'type'} of this name is in use"


def job_flow_html(job: Any) -> Any:
    """The job page's progress bar and waiting reason (``JobAdmin.flow``)."""
    from scheduler.flow.explain import waiting_reason

    parts = []
    if isinstance(job.progress, UnreadableJSON):  # a row edited by hand
        parts.append(format_html("<p>Progress {}</p>", job.progress))
    elif job.progress:
        parts.append(
            format_html(
                '<progress max="100" value="{}"></progress> {}% {}',
                job.progress.get("percent", 0),
                job.progress.get("percent", 0),
                job.progress.get("message", ""),
            )
        )
    waiting = waiting_reason(job)
    if waiting:
        parts.append(format_html("<p><strong>Waiting:</strong> {}</p>", waiting["message"]))
    return mark_safe("".join(parts)) if parts else "-"  # noqa: S308 - each part is built by format_html
