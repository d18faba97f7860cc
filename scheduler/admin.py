"""The operator console: jobs, schedules, workers, queues, the outbox and the operator action history in Django's admin.

No model here has an admin add, change or delete form: the only writes are the actions and the
schedule edit page (``CronScheduleAdmin.edit_view``), and each calls the same services as the
API (``scheduler.job_actions`` through ``scheduler.bulk``, ``scheduler.schedules``,
``scheduler.queues``), so no admin path can set a status by hand. Flow limits have their own
admin (``scheduler.flow.admin``).
Access is the site's rule (``config.admin_site``: active staff with role ADMIN); the
permission hooks below repeat it so that an ADMIN who is not a superuser needs no Django
model permissions.
"""

from __future__ import annotations

import copy
import datetime as dt
import uuid
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import (
    Q,
    QuerySet,
)
from django.db.models.functions import Now
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.defaultfilters import pluralize
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.formats import date_format
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timezone import localtime

from core.admin_input import GuardedModelAdmin
from scheduler import queues, schedules
from scheduler.bulk import (
    CONSOLE_BUDGET_SECONDS,
    ELIGIBLE,
    PAST_TENSE,
    BulkAction,
    BulkCounts,
    BulkOutcome,
    job_bulk_apply_filtered,
    jobs_count_for_bulk,
)
from scheduler.exceptions import InvalidQueue, StintError
from scheduler.ids import short_job_id
from scheduler.job_search import job_search_parse, jobs_filter_by_list_search
from scheduler.models import Attempt, CronSchedule, Job, OutboxEvent, Queue, WorkerNode
from scheduler.registry import registered_types
from scheduler.selectors import (
    LIST_DEFERRED,
    flow_name_use,
    flow_names_in_use,
    job_cancellation,
    jobs_count_by_status,
    owners_with_jobs,
    queue_names,
    queues_with_counts,
    worker_running_jobs,
    workers_with_liveness,
    workers_with_running_shown,
)
from scheduler.states import JobStatus, Priority, priority_label
from scheduler.templatetags.stint_ui import status_badge

ADMIN_RUNS_SHOWN = 50  # a schedule's latest runs listed on its console page
BULK_PAGE_PARAM = "p"  # the changelist's page number: meaningless for "every matching job"
OWNER_CHOICES = 100  # owners offered by the job list's owner filter
LIST_ERROR_STATUSES = frozenset({JobStatus.FAILED, JobStatus.RETRYING, JobStatus.DEAD})  # rows showing last_error
FINISHED_WITHIN = {"1h": dt.timedelta(hours=1), "24h": dt.timedelta(days=1), "7d": dt.timedelta(days=7)}


class OperatorAdmin(GuardedModelAdmin):
    """Read-only admin whose view and ``operate`` (action) permission is the site's ADMIN rule."""

    show_full_result_count = False  # one COUNT(*) per page, not two, on large tables

    def _is_operator(self, request: HttpRequest) -> bool:
        return self.admin_site.has_permission(request)

    def has_module_permission(self, request: HttpRequest) -> bool:
        """Operators see every Stint model."""
        return self._is_operator(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Operators may view."""
        return self._is_operator(request)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """Operators may run the actions (which call services)."""
        return self._is_operator(request)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Rows are created by services, never by an admin form."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Rows change only through actions (services), never by an admin form."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Nothing is deleted from here: pruning is the scheduler's."""
        return False


class ReadOnlyInline(admin.TabularInline):
    """A read-only inline, visible to operators."""

    extra = 0
    can_delete = False
    show_change_link = False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Operators may view."""
        return self.admin_site.has_permission(request)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Never."""
        return False


# -- jobs -----------------------------------------------------------------------------------------


class JobAttemptInline(ReadOnlyInline):
    """A job's attempts (``Attempt``), first first, each with its traceback folded under the error."""

    model = Attempt
    fields = ("attempt_number", "status", "worker", "started_at", "finished_at", "error_and_traceback")
    readonly_fields = fields
    ordering = ("attempt_number",)

    @admin.display(description="error")
    def error_and_traceback(self, attempt: Attempt) -> SafeString:
        """The error line, and the handler's traceback in a collapsed ``<details>`` when there is one."""
        return attempt_error_html(attempt)


def attempt_error_html(attempt: Attempt) -> SafeString:
    """Render an attempt's error and, folded, its traceback (escaped): the console's and pages' one rule."""
    return _render("admin/stint/_attempt_error.html", attempt=attempt)


def _render(template: str, **context: Any) -> SafeString:
    """Render an admin fragment from ``templates/`` (autoescaped) as safe HTML for a display method."""
    return SafeString(render_to_string(template, context))


def stacked_times(rows: list[tuple[str, Any]], *, blank: str | None = None) -> SafeString:
    """Render labelled times stacked in one column, in the site's DATETIME_FORMAT (UTC).

    A row whose time is None is left out, or shows ``blank`` when one is given.
    """
    shown = [
        (label, date_format(localtime(value), "DATETIME_FORMAT") if value else blank)
        for label, value in rows
        if value or blank is not None
    ]
    return _render("admin/stint/_stacked_times.html", rows=shown)


def badge(label: str, colour: str, *, data_name: str) -> SafeString:
    """Render a coloured state label with ``data-<data_name>="<label>"`` for tests and scripts."""
    return _render("admin/stint/_badge.html", label=label, colour=colour, data_name=data_name)


class QueueFilter(admin.SimpleListFilter):
    """Filter jobs by queue, offering the known queues (``Queue`` rows) rather than scanning jobs."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Every known queue name."""
        return [(n, n) for n in queue_names()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        """Jobs of the chosen queue."""
        return queryset.filter(queue=self.value()) if self.value() else queryset


class TypeFilter(admin.SimpleListFilter):
    """Filter jobs by type, offering the registered handler names."""

    title = "type"
    parameter_name = "type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Every registered job type."""
        return [(t, t) for t in registered_types()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        """Jobs of the chosen type (any string: a type whose handler was removed still filters)."""
        return queryset.filter(type=self.value()) if self.value() else queryset


class OwnerFilter(admin.SimpleListFilter):
    """Filter jobs by owner, offering the first ``OWNER_CHOICES`` owners that have jobs.

    Django's ``RelatedOnlyFieldListFilter`` reads ``DISTINCT owner_id`` over every job on every
    page of the list; this walks the ``job_owner_recent`` index one probe per owner instead (a
    loose index scan), so its cost follows the number of owners, not of jobs.
    """

    title = "owner"
    parameter_name = "owner__id__exact"  # the name Django's related filter used: old links keep working

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Up to ``OWNER_CHOICES`` owners with jobs, by username."""
        return [(str(pk), username) for pk, username in owners_with_jobs(limit=OWNER_CHOICES)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        """Jobs of the chosen owner; a value that is no user id is a bad filter (the admin's 400 page)."""
        if not self.value():
            return queryset
        try:
            return queryset.filter(owner_id=int(self.value()))
        except ValueError:
            raise IncorrectLookupParameters("owner must be a user id") from None


class FinishedWithinFilter(admin.SimpleListFilter):
    """Jobs that finished within the last hour, day or week, by the database's clock (``?finished_within=1h``).

    Relative, so a bookmarked "what failed in the last hour" stays the last hour; Django's date
    filter offers only calendar days.
    """

    title = "finished within"
    parameter_name = "finished_within"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """The last hour, 24 hours and 7 days."""
        return [("1h", "the last hour"), ("24h", "the last 24 hours"), ("7d", "the last 7 days")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        """Jobs finished within the span before ``now()``; another value is a bad filter (the admin's 400)."""
        if self.value() is None:
            return queryset
        span = FINISHED_WITHIN.get(self.value())
        if span is None:
            raise IncorrectLookupParameters("finished_within is 1h, 24h or 7d")
        return queryset.filter(finished_at__gte=Now() - span)


class PriorityListFilter(admin.ChoicesFieldListFilter):
    """Offer the named priorities (HIGH, MEDIUM, LOW) as ``priority__exact`` choices, without a query.

    The column holds any integer from -100 to 100 now; listing its distinct values would scan the
    whole job table on every page. Another value is still reachable as ``?priority__exact=37``.
    """

    def __init__(self, field: Any, *args: Any, **kwargs: Any) -> None:
        named = copy.copy(field)
        named.choices = [(int(p), p.name) for p in sorted(Priority, key=int, reverse=True)]
        super().__init__(named, *args, **kwargs)


class BulkCountPaginator(Paginator):
    """Django's paginator whose ``count`` query also counts the jobs each bulk action would change.

    ``bulk_counts`` (``bulk.BulkCounts``) after ``count`` is read: one scan of the matching set
    instead of a ``COUNT(*)`` and a second query for the links.
    """

    @cached_property
    def bulk_counts(self) -> BulkCounts:
        """The set's total and the jobs each action would change (``bulk.jobs_count_for_bulk``)."""
        return jobs_count_for_bulk(jobs=self.object_list)

    @cached_property
    def count(self) -> int:
        """The number of matching jobs, from ``bulk_counts``."""
        return self.bulk_counts.total


@admin.register(Job)
class JobAdmin(OperatorAdmin):
    """Jobs: badges, filters, search (``scheduler.job_search``), read-only detail, service actions."""

    list_display = (
        "short_id",
        "name",
        "type",
        "status_and_error",
        "priority_label",
        "queue",
        "owner",
        "attempts",
        "times",
    )
    list_display_links = ("short_id",)
    list_filter = (
        "status",
        ("priority", PriorityListFilter),
        QueueFilter,
        TypeFilter,
        OwnerFilter,
        FinishedWithinFilter,
        "created_at",
        "scheduled_at",
        "finished_at",
    )
    search_fields = ("name",)  # shows the search box; get_search_results reads it (job_search's rule)
    search_help_text = (
        "A job id (full, or 8+ hex digits from either end), an exact idempotency key, or part of the name, "
        "type or last error, any case; and qualifiers (their names in any case): args.customer:7 (a payload "
        'value; args.user.plan:pro nests), error:"timed out". The same search as the API and the pages.'
    )
    list_select_related = ("owner",)
    ordering = ("-created_at", "-id")
    list_per_page = 50
    actions = ("cancel_jobs", "retry_jobs", "recover_jobs")
    inlines = (JobAttemptInline,)
    readonly_fields = ("status_badge", "priority_label", "flow", "cancellation")
    fieldsets = (
        (None, {"fields": ("id", "name", "type", "status_badge", "priority_label", "queue", "owner", "flow")}),
        ("Payload", {"fields": ("payload",)}),
        (
            "Timing",
            {"fields": ("scheduled_at", "created_at", "updated_at", "started_at", "finished_at")},
        ),
        (
            "Execution",
            {
                "fields": (
                    "attempts",
                    "attempts_base",
                    "max_retries",
                    "timeout_seconds",
                    "last_error",
                    "lease_owner",
                    "lease_token",
                    "lease_expires_at",
                    "cancel_requested",
                    "cancellation",
                    "isolated",
                )
            },
        ),
        ("Origin", {"fields": ("idempotency_key", "schedule", "fire_time")}),
        ("Result", {"fields": ("result_attempt", "result_status", "result", "result_at")}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        """Jobs without their handler's result (unbounded in size), which only the detail page reads."""
        return super().get_queryset(request).defer(*LIST_DEFERRED)

    @admin.display(description="times (UTC)", ordering="created_at")
    def times(self, job: Job) -> SafeString:
        """Created, due and finished, stacked in one column (three date columns did not fit at 1400 px)."""
        return stacked_times([("created", job.created_at), ("due", job.scheduled_at), ("finished", job.finished_at)])

    @admin.display(description="progress / waiting")
    def flow(self, job: Job) -> SafeString:
        """The handler's last progress and, for a QUEUED job, why it waits (``scheduler.flow``)."""
        from scheduler.flow.admin import job_flow_html

        return job_flow_html(job)

    @admin.display(description="cancellation")
    def cancellation(self, job: Job) -> str:
        """What became of a requested cancel (``selectors.job_cancellation``), as the API and job page say; else "-"."""
        outcome = job_cancellation(job)
        return outcome["message"] if outcome else "-"

    @admin.display(description="id", ordering="id")
    def short_id(self, job: Job) -> str:
        """The last 8 hex digits of the id (``scheduler.ids.short_job_id``)."""
        return short_job_id(job.id)

    @admin.display(description="status", ordering="status")
    def status_badge(self, job: Job) -> SafeString:
        """The status as a coloured badge."""
        return status_badge(job.status)

    @admin.display(description="status", ordering="status")
    def status_and_error(self, job: Job) -> SafeString:
        """The status badge and, for a FAILED, RETRYING or DEAD job, its last error's start (Sidekiq's Dead tab)."""
        error = job.last_error if job.status in LIST_ERROR_STATUSES else ""
        return _render("admin/stint/_status_error.html", badge=status_badge(job.status), error=error)

    @admin.display(description="priority", ordering="priority")
    def priority_label(self, job: Job) -> str:
        """HIGH, MEDIUM or LOW at a named point, else the integer (``states.priority_label``)."""
        return priority_label(job.priority)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Job], search_term: str) -> tuple[Any, bool]:
        """Search as the API and the user pages do (``job_search.jobs_filter_by_list_search``).

        Qualifiers are Oban Web's filter syntax (``args.<path>:<value>``, ``error:<text>``, names
        in any letter case); the plain text left over is a full id, 8 to 32 hex digits from either
        end of the id, an exact idempotency key, or part of the name, type or last error in any
        letter case (``job_search.plain_text_q``), not Django's ``search_fields``, whose
        ``icontains`` folds no letter beyond ASCII in a C-locale database. A term that cannot be
        read matches nothing and says why.
        """
        search = job_search_parse(search_term)
        for problem in search.problems:
            self.message_user(request, f"Search: {problem}", messages.WARNING)
        return jobs_filter_by_list_search(queryset, search), False

    # -- actions on selected rows --------------------------------------------------------------

    def _apply(self, request: HttpRequest, queryset: QuerySet[Job], action: BulkAction) -> None:
        self._report(request, self._bulk(action, queryset, request))

    @staticmethod
    def _bulk(action: BulkAction, queryset: QuerySet[Job], request: HttpRequest) -> BulkOutcome:
        """Apply ``action`` to ``queryset`` as ``request``'s user, within one request's time budget."""
        return job_bulk_apply_filtered(
            action=action, queryset=queryset, actor=request.user, budget_seconds=CONSOLE_BUDGET_SECONDS
        )

    def _report(self, request: HttpRequest, outcome: BulkOutcome) -> None:
        """Show the outcome's message: a warning when nothing changed, a job failed or jobs were left."""
        done = outcome.changed or outcome.requested
        ok = done and not outcome.failed and not outcome.left
        self.message_user(request, outcome.message(), messages.SUCCESS if ok else messages.WARNING)

    @admin.action(description="Cancel selected jobs", permissions=["operate"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        """Cancel each job (RUNNING ones get a cancellation request); report changed and skipped."""
        self._apply(request, queryset, BulkAction.CANCEL)

    @admin.action(description="Retry selected FAILED jobs", permissions=["operate"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        """Retry each FAILED job; report changed and skipped."""
        self._apply(request, queryset, BulkAction.RETRY)

    @admin.action(description="Recover selected DEAD jobs", permissions=["operate"])
    def recover_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        """Recover each DEAD job; report changed and skipped."""
        self._apply(request, queryset, BulkAction.RECOVER)

    # -- actions on every job matching the changelist's filters ------------------------------------

    def get_urls(self) -> list[Any]:
        """Add ``bulk/<action>/``: the confirmation page and the apply-to-all-matching endpoint."""
        bulk = path(
            "bulk/<str:action>/",
            self.admin_site.admin_view(self.bulk_view),
            name="scheduler_job_bulk",
        )
        return [bulk, *super().get_urls()]

    def get_paginator(self, request: HttpRequest, queryset: QuerySet[Any], *args: Any, **kwargs: Any) -> Paginator:
        """For the job list, a paginator whose count also counts what each bulk action would change.

        ``BulkCountPaginator``; Django's for anything else (the history page pages log entries).
        """
        if queryset.model is not Job:
            return super().get_paginator(request, queryset, *args, **kwargs)
        return BulkCountPaginator(queryset, *args, **kwargs)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The list, with links to act on every job that matches its filters, each counting what it would change.

        "Cancel all matching (N)": N is how many of the matching jobs the action would change, not
        how many match (those it skips are not counted). The page's own count query counts them
        (``BulkCountPaginator``): no query of their own.
        """
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if not self.has_operate_permission(request) or context is None or "cl" not in context:
            return response  # a redirect (bad filters) or an operator who may only view
        counts = context["cl"].paginator.bulk_counts
        query = request.GET.copy()
        query.pop(BULK_PAGE_PARAM, None)
        context["bulk_actions"] = [
            {
                "action": action.value,
                "label": f"{action.value.capitalize()} all matching ({counts.eligible[action]})",
                "title": (
                    f"{counts.eligible[action]} of the {counts.total} matching job{pluralize(counts.total)} "
                    f"can be {PAST_TENSE[action].lower()}; the others would be skipped."
                ),
                "url": f"{reverse('admin:scheduler_job_bulk', args=[action.value])}?{query.urlencode()}",
            }
            for action in BulkAction
        ]
        return response

    def bulk_view(self, request: HttpRequest, action: str) -> HttpResponse:
        """GET: confirm, with counts, an action on every job matching the filters; POST: apply it.

        The filters are the changelist's own query string (status, type, queue, search...), so
        the set confirmed is the set the operator was looking at, across all pages. The POST
        re-reads that set: jobs that left it meanwhile are not touched, and the report counts
        what really changed.
        """
        if not self.has_operate_permission(request):
            raise PermissionDenied
        try:
            bulk_action = BulkAction(action)
        except ValueError:
            raise Http404("No such bulk action.") from None
        query = request.GET.copy()
        query.pop(BULK_PAGE_PARAM, None)
        changelist_url = f"{reverse('admin:scheduler_job_changelist')}?{query.urlencode()}"
        request.GET = query
        try:
            cl = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            self.message_user(request, "Those filters are not valid.", messages.ERROR)
            return HttpResponseRedirect(changelist_url)
        matching = cl.queryset
        if request.method == "POST":
            self._report(request, self._bulk(bulk_action, matching, request))
            return HttpResponseRedirect(changelist_url)
        by_status = jobs_count_by_status(matching)
        eligible = sum(n for status, n in by_status.items() if status in ELIGIBLE[bulk_action])
        total = sum(by_status.values())
        context = {
            **self.admin_site.each_context(request),
            "title": f"{bulk_action.value.capitalize()} all matching jobs?",
            "opts": self.opts,
            "action": bulk_action.value,
            "action_label": bulk_action.value.capitalize(),
            "action_past": PAST_TENSE[bulk_action].lower(),
            "total": total,
            "eligible": eligible,
            "skipped": total - eligible,
            "eligible_statuses": sorted(ELIGIBLE[bulk_action]),
            "by_status": sorted(by_status.items()),
            "filters": [(k, v) for k, values in query.lists() for v in values],
            "changelist_url": changelist_url,
            "form_url": request.get_full_path(),
        }
        return TemplateResponse(request, "admin/scheduler/job/bulk_confirm.html", context)


# -- schedules --------------------------------------------------------------------------------------


@admin.register(CronSchedule)
class CronScheduleAdmin(OperatorAdmin):
    """Schedules: enable/disable, trigger now, an edit page, the next five fire times and the latest runs.

    Every change goes through ``scheduler.schedules``, with the API's rules.
    """

    list_display = ("name", "owner", "timing", "timezone", "enabled", "job_template", "job_priority_name", "fires")
    list_filter = ("enabled", "job_type", "misfire_policy", "overlap_policy")
    search_fields = ("name",)
    list_select_related = ("owner",)
    ordering = ("id",)
    actions = ("enable_schedules", "disable_schedules", "trigger_schedules")
    readonly_fields = ("edit_link", "timing", "next_fire_times", "runs", "job_priority_name")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "edit_link",
                    "name",
                    "owner",
                    "timing",
                    "timezone",
                    "enabled",
                    "misfire_policy",
                    "overlap_policy",
                )
            },
        ),
        ("Fires", {"fields": ("next_fire_at", "next_fire_times", "last_fired_at")}),
        ("Runs", {"fields": ("runs",)}),
        (
            "Job template",
            {
                "fields": (
                    "job_type",
                    "job_payload",
                    "job_priority_name",
                    "job_queue",
                    "job_max_retries",
                    "job_timeout_seconds",
                )
            },
        ),
        ("Record", {"fields": ("created_at", "updated_at")}),
    )

    @admin.display(description="job")
    def job_template(self, schedule: CronSchedule) -> str:
        """The job it fires: type on queue."""
        return f"{schedule.job_type} on {schedule.job_queue}"

    @admin.display(description="job priority", ordering="job_priority")
    def job_priority_name(self, schedule: CronSchedule) -> str:
        """HIGH, MEDIUM or LOW at a named point, else the integer: as the API and the job list say it."""
        return schedule.job_priority_label

    @admin.display(description="fires (UTC)", ordering="next_fire_at")
    def fires(self, schedule: CronSchedule) -> SafeString:
        """Next and last fire, stacked in one column."""
        return stacked_times([("next", schedule.next_fire_at), ("last", schedule.last_fired_at)], blank="-")

    @admin.display(description="change")
    def edit_link(self, schedule: CronSchedule) -> SafeString:
        """A link to the edit form (``schedules.schedule_update``, the API's rules)."""
        url = reverse("admin:scheduler_cronschedule_edit", args=[schedule.id])
        return format_html('<a class="button" href="{}" id="schedule-edit-link">Edit this schedule</a>', url)

    @admin.display(description="runs (newest fire first)")
    def runs(self, schedule: CronSchedule) -> SafeString:
        """Run counts by status, the last run, and the latest ``ADMIN_RUNS_SHOWN`` fires with their jobs."""
        context = schedules.schedule_history_context(
            schedule=schedule,
            runs=schedules.schedule_runs(schedule_id=schedule.id)[:ADMIN_RUNS_SHOWN],
        )
        all_runs = f"{reverse('admin:scheduler_job_changelist')}?schedule__id__exact={schedule.id}"
        return format_html(
            '{}<p><a href="{}" id="schedule-all-runs">All {} runs in the job list</a></p>',
            render_to_string("stint/_schedule_runs.html", {**context, "admin_links": True}),
            all_runs,
            context["run_total"],
        )

    def get_urls(self) -> list[Any]:
        """Add ``<id>/edit/``: the schedule's edit form, through the same service as the API."""
        edit = path(
            "<int:schedule_id>/edit/",
            self.admin_site.admin_view(self.edit_view),
            name="scheduler_cronschedule_edit",
        )
        return [edit, *super().get_urls()]

    def edit_view(self, request: HttpRequest, schedule_id: int) -> HttpResponse:
        """GET: the form with the schedule's values; POST: ``schedules.schedule_update`` with the same rules as the API.

        The rules are the service's (cron, zone, interval, template, the minimum interval of a
        USER owner's schedule, ...): an error lands on its field with a 400, never a 500.
        The Preview button shows the next fire times of the form's timing without saving.
        """
        from pages.forms import ScheduleForm, errors_onto_form

        if not self.has_operate_permission(request):
            raise PermissionDenied
        try:
            schedule = schedules.schedule_get(schedule_id=schedule_id, actor=request.user)
        except StintError:
            raise Http404("No such schedule.") from None
        form = ScheduleForm(request.POST or None, initial=ScheduleForm.initial_from(schedule))
        preview = None
        status = 200
        if request.method == "POST":
            status = 400
            if form.is_valid() and "preview" in request.POST:
                try:
                    preview = schedules.schedule_preview(**form.timing(), count=schedules.NEXT_FIRE_TIMES)
                    status = 200
                except StintError as exc:
                    errors_onto_form(form, exc)
            elif form.is_valid():
                try:
                    schedules.schedule_update(
                        schedule_id=schedule.id, actor=request.user, changes=form.service_fields()
                    )
                except StintError as exc:
                    errors_onto_form(form, exc, prefix_map={"job": "job_"})
                    status = exc.http_status
                else:
                    self.message_user(request, f"Schedule “{form.cleaned_data['name']}” saved.", messages.SUCCESS)
                    return HttpResponseRedirect(reverse("admin:scheduler_cronschedule_change", args=[schedule.id]))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Edit schedule “{schedule.name}”",
            "opts": self.opts,
            "schedule": schedule,
            "form": form,
            "preview": preview,
            "original": schedule,
        }
        return TemplateResponse(request, "admin/scheduler/cronschedule/edit.html", context, status=status)

    @admin.display(description="when")
    def timing(self, schedule: CronSchedule) -> SafeString:
        """The cron expression (kept on one line), or "every N s"."""
        text = schedule.cron if schedule.cron is not None else f"every {schedule.interval_seconds} s"
        return format_html('<code style="white-space:nowrap">{}</code>', text)

    @admin.display(description="next five fire times (UTC)")
    def next_fire_times(self, schedule: CronSchedule) -> SafeString:
        """The next five fire times, or why there are none."""
        times = [t.isoformat() for t in schedules.schedule_next_fire_times(schedule)]
        return _render("admin/scheduler/cronschedule/_fire_times.html", times=times, enabled=schedule.enabled)

    def _each(self, request: HttpRequest, queryset: QuerySet[CronSchedule], verb: str, call: Any) -> None:
        done = failed = 0
        for schedule_id in queryset.values_list("id", flat=True):
            try:
                call(schedule_id)
            except StintError as exc:
                failed += 1
                self.message_user(request, f"Schedule {schedule_id}: {exc}", messages.ERROR)
            else:
                done += 1
        self.message_user(request, f"{verb} {done} schedule{'s' if done != 1 else ''}; {failed} failed.")

    @admin.action(description="Enable selected schedules", permissions=["operate"])
    def enable_schedules(self, request: HttpRequest, queryset: QuerySet[CronSchedule]) -> None:
        """Enable each; the next fire is the next due time from now (nothing for the disabled span)."""
        self._each(
            request,
            queryset,
            "Enabled",
            lambda sid: schedules.schedule_update(schedule_id=sid, actor=request.user, changes={"enabled": True}),
        )

    @admin.action(description="Disable selected schedules", permissions=["operate"])
    def disable_schedules(self, request: HttpRequest, queryset: QuerySet[CronSchedule]) -> None:
        """Disable each: it fires nothing more until enabled."""
        self._each(
            request,
            queryset,
            "Disabled",
            lambda sid: schedules.schedule_update(schedule_id=sid, actor=request.user, changes={"enabled": False}),
        )

    @admin.action(description="Trigger selected schedules now", permissions=["operate"])
    def trigger_schedules(self, request: HttpRequest, queryset: QuerySet[CronSchedule]) -> None:
        """Fire each once now, outside its timetable."""
        self._each(
            request,
            queryset,
            "Triggered",
            lambda sid: schedules.schedule_trigger(schedule_id=sid, actor=request.user),
        )


# -- workers ----------------------------------------------------------------------------------------


class AliveFilter(admin.SimpleListFilter):
    """Workers that heartbeat within ``WORKER_DEAD_AFTER_SECONDS`` (database clock), or not."""

    title = "liveness"
    parameter_name = "alive"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Alive or gone."""
        return [("yes", "alive"), ("no", "gone")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[WorkerNode]) -> QuerySet[WorkerNode]:
        """Filter on the ``is_alive`` annotation."""
        if self.value() in ("yes", "no"):
            return queryset.filter(is_alive=self.value() == "yes")
        return queryset


@admin.register(WorkerNode)
class WorkerNodeAdmin(OperatorAdmin):
    """Workers: alive or gone (by heartbeat, database clock), running jobs, busy slots, last heartbeat."""

    # Stacked cells (process, pool, heartbeats): thirteen columns did not fit at 1400 px.
    list_display = (
        "id",
        "liveness",
        "process",
        "pool_kind",
        "slots",
        "running_count",
        "jobs_done",
        "queue_list",
        "heartbeats",
    )
    list_filter = (AliveFilter, "pool", "hostname")
    search_fields = ("id", "hostname")
    ordering = ("-last_heartbeat_at",)
    readonly_fields = ("liveness", "slots", "running_jobs")
    fields = (
        "id",
        "liveness",
        "hostname",
        "pid",
        "supervisor_pid",
        "pool",
        "isolation",
        "slots",
        "jobs_done",
        "queues",
        "started_at",
        "last_heartbeat_at",
        "stopped_at",
        "running_jobs",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[WorkerNode]:
        """Annotate liveness, the number of RUNNING jobs each worker leases and the first few of them."""
        return workers_with_running_shown(workers_with_liveness(super().get_queryset(request)))

    @admin.display(description="state", boolean=False, ordering="is_alive")
    def liveness(self, worker: WorkerNode) -> SafeString:
        """The label "alive", or "gone" (stopped, or no heartbeat within the dead-after window)."""
        alive = getattr(worker, "is_alive", False)
        return badge("alive" if alive else "gone", "#116329" if alive else "#5a6370", data_name="status")

    @admin.display(description="process", ordering="hostname")
    def process(self, worker: WorkerNode) -> SafeString:
        """Host, pid and its supervisor's pid."""
        supervisor = f" (supervisor {worker.supervisor_pid})" if worker.supervisor_pid else ""
        return format_html("{}<br>pid {}{}", worker.hostname, worker.pid, supervisor)

    @admin.display(description="pool", ordering="pool")
    def pool_kind(self, worker: WorkerNode) -> str:
        """threads or processes, and whether it is an isolation slot."""
        return f"{worker.pool} (isolation slot)" if worker.isolation else worker.pool

    @admin.display(description="times (UTC)", ordering="-last_heartbeat_at")
    def heartbeats(self, worker: WorkerNode) -> SafeString:
        """Last heartbeat, start and stop, stacked."""
        return stacked_times(
            [("heartbeat", worker.last_heartbeat_at), ("started", worker.started_at), ("stopped", worker.stopped_at)]
        )

    @admin.display(description="busy / slots")
    def slots(self, worker: WorkerNode) -> str:
        """Busy slots over the pool size."""
        return f"{worker.busy_slots} / {worker.concurrency}"

    @admin.display(description="running jobs", ordering="running")
    def running_count(self, worker: WorkerNode) -> SafeString:
        """How many RUNNING jobs this worker holds, and links to the first few: type, short id, running for how long.

        The jobs come annotated with the page's workers (``selectors.workers_with_running_shown``),
        oldest start first; "and K more" links to the worker's page, which lists them all.
        """
        count = getattr(worker, "running", 0)
        shown = [
            {"id": brief["id"], "type": brief["type"], "seconds": max(brief["seconds"] or 0.0, 0.0)}
            for brief in getattr(worker, "running_shown", None) or []
        ]
        return _render(
            "admin/scheduler/workernode/_running_now.html",
            count=count,
            jobs=shown,
            more=max(count - len(shown), 0),
            worker_id=worker.id,
        )

    @admin.display(description="queues")
    def queue_list(self, worker: WorkerNode) -> str:
        """The queues it takes from ("all" when unrestricted)."""
        return ", ".join(worker.queues) if worker.queues else "all"

    @admin.display(description="running jobs")
    def running_jobs(self, worker: WorkerNode) -> SafeString:
        """Links to the RUNNING jobs this worker holds."""
        rows = [(j.id, j.type, str(j.started_at)) for j in worker_running_jobs(worker_id=worker.id)]
        return _render("admin/scheduler/workernode/_running_jobs.html", rows=rows)


# -- queues -----------------------------------------------------------------------------------------


@admin.register(Queue)
class QueueAdmin(OperatorAdmin):
    """Queues: paused or active, jobs waiting and running; pause and resume (``scheduler.queues``)."""

    list_display = ("name", "state", "queued", "running", "updated_at")
    list_filter = ("paused",)
    search_fields = ("name",)
    ordering = ("name",)
    actions = ("pause_queues", "resume_queues")
    fields = ("name", "state", "queued", "running", "created_at", "updated_at")
    readonly_fields = ("state", "queued", "running")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Queue]:
        """Annotate each queue's QUEUED and RUNNING job counts."""

        return queues_with_counts(super().get_queryset(request))

    @admin.display(description="state", ordering="paused")
    def state(self, queue: Queue) -> SafeString:
        """The label "paused" or "active"."""
        label, colour = ("paused", "#8a4600") if queue.paused else ("active", "#116329")
        return badge(label, colour, data_name="state")

    @admin.display(description="queued (waiting)", ordering="queued_count")
    def queued(self, queue: Queue) -> int:
        """Jobs waiting in the queue."""
        return getattr(queue, "queued_count", 0)

    @admin.display(description="running", ordering="running_count")
    def running(self, queue: Queue) -> int:
        """Jobs of the queue running now."""
        return getattr(queue, "running_count", 0)

    def _set(self, request: HttpRequest, queryset: QuerySet[Queue], *, pause: bool) -> None:
        """Pause or resume each queue; then one warning per name nothing uses (the API's ``warning``).

        A stored name no queue could have (written before names were checked) is refused by the
        service: it is named in an error and the others go on. Messages are escaped when shown.
        """
        names = list(queryset.order_by("name").values_list("name", flat=True))
        service = queues.queue_pause if pause else queues.queue_resume
        done, refused = [], []
        for name in names:
            try:
                service(name=name, actor=request.user)
            except InvalidQueue:
                refused.append(name)
            else:
                done.append(name)
        verb = "Paused" if pause else "Resumed"
        if done:
            self.message_user(request, f"{verb} {len(done)} queue{'s' if len(done) != 1 else ''}: {', '.join(done)}.")
        for name in refused:
            refusal = f"Not {verb.lower()}: {name!r} is no queue name a job could carry."
            self.message_user(request, refusal, messages.ERROR)
        used = flow_names_in_use(names=[("queue", name) for name in done])
        for name in done:
            use = flow_name_use(scope="queue", name=name, resumed=not pause, in_use=("queue", name) in used)
            if use["warning"]:
                self.message_user(request, use["warning"], messages.WARNING)

    @admin.action(description="Pause selected queues", permissions=["operate"])
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        """Pause each: no claim that begins after the pause commits takes its jobs; they wait QUEUED."""
        self._set(request, queryset, pause=True)

    @admin.action(description="Resume selected queues", permissions=["operate"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        """Resume each: workers lease from it again within one poll interval."""
        self._set(request, queryset, pause=False)


# -- outbox -----------------------------------------------------------------------------------------


class PublishedFilter(admin.SimpleListFilter):
    """Outbox events relayed to Kafka, or still waiting."""

    title = "published"
    parameter_name = "published"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        """Yes or no."""
        return [("yes", "published"), ("no", "waiting (backlog)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[OutboxEvent]) -> QuerySet[OutboxEvent]:
        """Filter on ``published_at``."""
        if self.value() == "yes":
            return queryset.filter(published_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(published_at__isnull=True)
        return queryset


def job_link(job_id: uuid.UUID) -> SafeString:
    """A link to the job's admin page, labelled with its full id."""
    return format_html('<a href="{}">{}</a>', reverse("admin:scheduler_job_change", args=[job_id]), job_id)


class EventListMixin:
    """The event lists' shared parts (outbox, audit trail).

    Search by the job's full id or the event's own ``event_id``, newest first, and the ``job``
    and ``transition`` columns.
    """

    search_fields = ("job_id",)
    search_help_text = "A job id or an event id (full)."
    ordering = ("-id",)

    @admin.display(description="job")
    def job(self, event: Any) -> SafeString:
        """Link to the job (its page may be gone once the job was cleaned up)."""
        return job_link(event.job_id)

    @admin.display(description="transition")
    def transition(self, event: Any) -> str:
        """from -> to."""
        return f"{event.from_status or '-'} \u2192 {event.to_status}"

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any], search_term: str) -> tuple[Any, bool]:
        """Exact job id or event id; anything else matches the event type."""
        term = search_term.strip()
        try:
            value = uuid.UUID(term)
        except ValueError:
            return queryset.filter(event_type__icontains=term) if term else queryset, False
        return queryset.filter(Q(job_id=value) | Q(event_id=value)), False


@admin.register(OutboxEvent)
class OutboxEventAdmin(EventListMixin, OperatorAdmin):
    """The outbox, read-only: what waits for Kafka and what was relayed."""

    list_display = (
        "id",
        "event_type",
        "job",
        "sequence",
        "transition",
        "attempt",
        "occurred_at",
        "published_at",
    )
    list_filter = (PublishedFilter, "event_type")


# -- operator actions -------------------------------------------------------------------------------


@admin.register(LogEntry)
class OperatorActionAdmin(OperatorAdmin):
    """The operator action history (``scheduler.action_log``), every user's, newest first, read-only.

    Each object's History page shows its own entries; this list shows them all, with a link to the
    object (none once it is deleted) and filters by action and kind of object.
    """

    list_display = ("action_time", "user", "action", "target", "kind", "message")
    list_display_links = None
    list_filter = ("action_flag", "content_type")
    search_fields = ("object_repr", "change_message", "=user__username")
    search_help_text = "Part of the object's name or of the message, or an exact username."
    list_select_related = ("user", "content_type")
    ordering = ("-id",)
    list_per_page = 50

    @admin.display(description="action", ordering="action_flag")
    def action(self, entry: LogEntry) -> str:
        """Added, changed or deleted."""
        return {ADDITION: "added", CHANGE: "changed", DELETION: "deleted"}.get(entry.action_flag, "?")

    @admin.display(description="object")
    def target(self, entry: LogEntry) -> SafeString:
        """The object's name, linked to its console page while it exists (escaped)."""
        url = entry.get_admin_url() if not entry.is_deletion() else None
        if url:
            return format_html('<a href="{}">{}</a>', url, entry.object_repr)
        return format_html("{}", entry.object_repr)

    @admin.display(description="message")
    def message(self, entry: LogEntry) -> str:
        """What was done: the service's plain message, or Django's own entry in words."""
        return entry.get_change_message()

    @admin.display(description="kind", ordering="content_type")
    def kind(self, entry: LogEntry) -> str:
        """The object's model, e.g. "job" or "queue"."""
        return entry.content_type.name if entry.content_type else "-"


from scheduler.flow import admin as _flow_admin  # noqa: E402,F401 - registers the flow-limit console
