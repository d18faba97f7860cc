"""User pages: sign in/out, register, my jobs, new job, job detail, schedules.

Thin views: a form checks the input, one service or selector does the work, a template renders
it. Visibility is the services' rule (``actor=request.user``), so another user's job or
schedule is a 404 here exactly as in the API. Domain errors are shown as messages with their
HTTP status (409 for a state conflict, 413 for a payload too large...), never as tracebacks.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import IntegrityError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.services import user_register
from audit.timeline import job_timeline
from core.stored_json import UnreadableJSON
from pages.forms import JobFilterForm, JobForm, RegisterForm, ScheduleForm, errors_onto_form
from pages.ratelimit import AUTH_SCOPE, limit_posts
from scheduler import enqueuing, job_actions, schedules, selectors
from scheduler.exceptions import JobNotFound, ScheduleNotFound, StintError
from scheduler.flow.explain import waiting_reason
from scheduler.job_search import jobs_filter_by_list_search
from scheduler.models import CronSchedule, Job
from scheduler.states import CANCELLABLE, FINISHED, JobStatus, Priority, priority_label
from scheduler.templatetags.stint_ui import status_badge

logger = logging.getLogger(__name__)

JOBS_PER_PAGE = 20
RUNS_PER_PAGE = 20  # a schedule's runs listed per page of its history
STATUS_POLL_MAX_IDS = 100  # ids one status poll may ask about
PREVIEW_COUNT = 5  # fire times a schedule preview shows
USER_SCOPE = "user"


# -- sign in, sign out, register ---------------------------------------------------------------------


class LoginView(auth_views.LoginView):
    """Session sign-in; POSTs count against the client address's ``auth`` budget."""

    template_name = "pages/login.html"
    redirect_authenticated_user = True


login_view = limit_posts(AUTH_SCOPE)(LoginView.as_view())
logout_view = auth_views.LogoutView.as_view()


@limit_posts(AUTH_SCOPE)
@require_http_methods(["GET", "POST"])
def register_view(request: HttpRequest) -> HttpResponse:
    """Create a USER account (never an ADMIN) through ``accounts.services.user_register`` and sign in."""
    if request.user.is_authenticated:
        return redirect("pages:job-list")
    form = RegisterForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = user_register(
                username=form.cleaned_data["username"],
                password=form.cleaned_data["password1"],
                email=form.cleaned_data["email"],
            )
        except ValidationError as exc:
            form.add_error("password1", exc)
        except IntegrityError:
            form.add_error("username", "That username is taken.")
        else:
            login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            messages.success(request, f"Welcome, {user.username}. Your account is ready.")
            return redirect("pages:job-list")
    status = 400 if request.method == "POST" else 200
    return render(request, "pages/register.html", {"form": form}, status=status)


# -- jobs ---------------------------------------------------------------------------------------------


@login_required
@require_GET
def job_list(request: HttpRequest) -> HttpResponse:
    """My jobs, newest first, with filters, a search (the API's: ``scheduler.job_search``) and pages.

    Statuses refresh by themselves (``job_status``). An invalid filter or search lists no job and
    says why on its field.
    """
    form = JobFilterForm(request.GET or None)
    jobs = selectors.job_list_owned(owner=request.user)
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        if data["status"]:
            jobs = jobs.filter(status=data["status"])
        if data["type"]:
            jobs = jobs.filter(type=data["type"])
        if data["priority"]:
            jobs = jobs.filter(priority=int(Priority[data["priority"]]))
        if data["queue"]:
            jobs = jobs.filter(queue=data["queue"])
        if data["search"]:
            jobs = jobs_filter_by_list_search(jobs, data["search"])
    elif form.is_bound:
        jobs = jobs.none()
    page = Paginator(jobs, JOBS_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "pages/job_list.html",
        {"form": form, "page": page, "query": query.urlencode(), "finished": FINISHED},
    )


@login_required
@require_GET
def job_status(request: HttpRequest) -> JsonResponse:
    """Return ``{"jobs": {id: {"status", "badge", "attempts", "finished"}}}`` for the caller's jobs among ``?id=``.

    Ids that are malformed, missing or someone else's are left out (never a 403 or 404 per id).
    """
    ids = []
    for raw in request.GET.getlist("id")[:STATUS_POLL_MAX_IDS]:
        try:
            ids.append(uuid.UUID(raw))
        except ValueError:
            continue
    rows = selectors.job_list_owned(owner=request.user).filter(id__in=ids).values_list("id", "status", "attempts")
    return JsonResponse(
        {
            "jobs": {
                str(job_id): {
                    "status": status,
                    "badge": str(status_badge(status)),
                    "attempts": attempts,
                    "finished": status in FINISHED,
                }
                for job_id, status, attempts in rows
            }
        }
    )


@login_required
@limit_posts(USER_SCOPE)
@require_http_methods(["GET", "POST"])
def job_new(request: HttpRequest) -> HttpResponse:
    """The new-job form; a valid one goes to ``enqueuing.enqueue_request`` as the API's POST does."""
    form = JobForm(request.POST or None)
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            try:
                outcome = enqueuing.enqueue_request(owner=request.user, **form.service_kwargs())
            except StintError as exc:
                errors_onto_form(form, exc)
                status = exc.http_status
            else:
                job = outcome.job
                if outcome.replayed:
                    messages.info(request, "A job with this idempotency key exists already: here it is.")
                else:
                    messages.success(request, f"Job {job.id} created ({job.status}).")
                return redirect("pages:job-detail", job_id=job.id)
    return render(request, "pages/job_form.html", {"form": form}, status=status)


def _job_context(request: HttpRequest, job: Job) -> dict[str, Any]:
    attempts = list(selectors.job_attempt_list(job_id=job.id, actor=request.user))
    running = selectors.job_running_attempt(job_id=job.id)  # no row until its outcome
    if running is not None:
        attempts.append(running)
    result = job.stored_result
    return {
        "job": job,
        "priority": priority_label(job.priority),
        "attempts": attempts,
        "result": result,
        "timeline": job_timeline(job_id=job.id),
        "finished": job.status in FINISHED,
        "can_cancel": job.status in CANCELLABLE or (job.status == JobStatus.RUNNING and not job.cancel_requested),
        "can_retry": job.status == JobStatus.FAILED
        or (job.status == JobStatus.DEAD and job_actions.dead_retry_allowed()),
        "dead_needs_admin": job.status == JobStatus.DEAD and not job_actions.dead_retry_allowed(),
        # An ADMIN recovers a dead job in the operator console (the job's page there has the action).
        "console_recovers": getattr(request.user, "is_admin", False) and request.user.is_staff,
        "waiting": waiting_reason(job),
        "cancellation": selectors.job_cancellation(job),
        # The budget counts from attempts_base: a handed-back attempt or those before a retry are not in it.
        "attempts_counted": job.attempts - job.attempts_base,
        # A progress value Python cannot read (a row edited by hand): said instead of a bar.
        "progress_unreadable": str(job.progress) if isinstance(job.progress, UnreadableJSON) else "",
    }


def _visible_job(request: HttpRequest, job_id: uuid.UUID) -> Job:
    try:
        return selectors.job_get(job_id=job_id, actor=request.user)
    except JobNotFound:
        raise Http404("No such job.") from None


@login_required
@require_GET
def job_detail(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    """One job: its fields, attempts, result and event timeline, with cancel/retry; 404 if not the caller's."""
    job = _visible_job(request, job_id)
    return render(request, "pages/job_detail.html", _job_context(request, job))


@login_required
@require_GET
def job_live(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    """The live part of the job page (status, attempts, result, timeline) as an HTML fragment, for polling."""
    job = _visible_job(request, job_id)
    return render(request, "pages/_job_live.html", _job_context(request, job))


def _job_action(request: HttpRequest, job_id: uuid.UUID, action: str) -> HttpResponse:
    service = job_actions.job_cancel if action == "cancel" else job_actions.job_retry
    try:
        job = service(job_id=job_id, actor=request.user)
    except JobNotFound:
        raise Http404("No such job.") from None
    except StintError as exc:
        job = _visible_job(request, job_id)
        context = {**_job_context(request, job), "error": str(exc)}
        return render(request, "pages/job_detail.html", context, status=exc.http_status)
    if action == "cancel" and job.status == JobStatus.RUNNING:
        messages.info(request, selectors.CANCEL_REQUESTED_MESSAGE)
    elif action == "cancel":
        messages.success(request, "Job cancelled.")
    else:
        messages.success(request, "Job retried: it runs again with a fresh attempt budget.")
    return redirect("pages:job-detail", job_id=job.id)


@login_required
@limit_posts(USER_SCOPE)
@require_POST
def job_cancel(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    """Cancel the job (``job_actions.job_cancel``); a finished job's 409 is shown on its page."""
    return _job_action(request, job_id, "cancel")


@login_required
@limit_posts(USER_SCOPE)
@require_POST
def job_retry(request: HttpRequest, job_id: uuid.UUID) -> HttpResponse:
    """Retry a FAILED job (a DEAD one too when owners may: ``job_actions.job_retry``); a 409 is shown on its page."""
    return _job_action(request, job_id, "retry")


# -- schedules ----------------------------------------------------------------------------------------


def _my_schedules(request: HttpRequest) -> Any:
    return schedules.schedule_visible_to(actor=request.user).filter(owner_id=request.user.pk)


def _visible_schedule(request: HttpRequest, schedule_id: int) -> CronSchedule:
    try:
        return schedules.schedule_get(schedule_id=schedule_id, actor=request.user)
    except ScheduleNotFound:
        raise Http404("No such schedule.") from None


@login_required
@require_GET
def schedule_list(request: HttpRequest) -> HttpResponse:
    """My schedules with their next fire times."""
    rows = [
        {"schedule": s, "next_fire_times": schedules.schedule_next_fire_times(s, count=PREVIEW_COUNT)}
        for s in schedules.with_last_run(_my_schedules(request))
    ]
    return render(request, "pages/schedule_list.html", {"rows": rows})


def _preview(form: ScheduleForm) -> dict[str, Any] | None:
    """Return the next fire times of the form's timing (``times``, UTC) and its ``zone``, shown in both.

    None after putting the error on the form.
    """
    timing = form.timing()
    try:
        times = schedules.schedule_preview(**timing, count=PREVIEW_COUNT)
    except StintError as exc:
        errors_onto_form(form, exc)
        return None
    return {"times": times, "zone": timing["timezone"]}


def _schedule_post(
    request: HttpRequest, form: ScheduleForm, *, save: Callable[[], CronSchedule], verb: str
) -> HttpResponse | tuple[dict[str, Any] | None, int]:
    """The POST of the schedule form, shared by new and edit: Preview, or save through ``save``.

    Returns the redirect to the saved schedule's page, or (the preview (``_preview``) or None,
    the HTTP status to render the form with: 200, or 400 / the service error's status with the
    errors on the form). A GET returns (None, 200).
    """
    if request.method != "POST":
        return None, 200
    if not form.is_valid():
        return None, 400
    if "preview" in request.POST:
        preview = _preview(form)
        return preview, 200 if preview is not None else 400
    try:
        schedule = save()
    except StintError as exc:
        errors_onto_form(form, exc, prefix_map={"job": "job_"})
        return None, exc.http_status
    messages.success(request, f"Schedule “{schedule.name}” {verb}.")
    return redirect("pages:schedule-edit", schedule_id=schedule.id)


@login_required
@limit_posts(USER_SCOPE)
@require_http_methods(["GET", "POST"])
def schedule_new(request: HttpRequest) -> HttpResponse:
    """Create a schedule (``schedules.schedule_create``); the Preview button shows the next fire times first."""
    form = ScheduleForm(request.POST or None)
    outcome = _schedule_post(
        request,
        form,
        save=lambda: schedules.schedule_create(owner=request.user, actor=request.user, **form.service_fields()),
        verb="created",
    )
    if isinstance(outcome, HttpResponse):
        return outcome
    preview, status = outcome
    return render(
        request, "pages/schedule_form.html", {"form": form, "preview": preview, "schedule": None}, status=status
    )


@login_required
@limit_posts(USER_SCOPE)
@require_http_methods(["GET", "POST"])
def schedule_edit(request: HttpRequest, schedule_id: int) -> HttpResponse:
    """Edit a schedule (``schedules.schedule_update``); shows its next five fire times; 404 if not the caller's."""
    schedule = _visible_schedule(request, schedule_id)
    form = ScheduleForm(request.POST or None, initial=ScheduleForm.initial_from(schedule))

    def save() -> CronSchedule:
        try:
            return schedules.schedule_update(schedule_id=schedule.id, actor=request.user, changes=form.service_fields())
        except ScheduleNotFound:
            raise Http404("No such schedule.") from None

    outcome = _schedule_post(request, form, save=save, verb="saved")
    if isinstance(outcome, HttpResponse):
        return outcome
    preview, status = outcome
    runs_page = Paginator(schedules.schedule_runs(schedule_id=schedule.id, actor=request.user), RUNS_PER_PAGE).get_page(
        request.GET.get("runs_page")
    )
    context = {
        "form": form,
        "preview": preview,
        "schedule": schedule,
        "next_fire_times": schedules.schedule_next_fire_times(schedule, count=PREVIEW_COUNT),
        "runs_page": runs_page,
        **schedules.schedule_history_context(schedule=schedule, runs=runs_page.object_list),
    }
    return render(request, "pages/schedule_form.html", context, status=status)


@login_required
@limit_posts(USER_SCOPE)
@require_POST
def schedule_toggle(request: HttpRequest, schedule_id: int) -> HttpResponse:
    """Enable or disable a schedule (``enabled`` = "true"/"false" in the form)."""
    enabled = request.POST.get("enabled") == "true"
    try:
        schedule = schedules.schedule_update(schedule_id=schedule_id, actor=request.user, changes={"enabled": enabled})
    except ScheduleNotFound:
        raise Http404("No such schedule.") from None
    except StintError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Schedule “{schedule.name}” {'enabled' if enabled else 'disabled'}.")
    return redirect("pages:schedule-list")


@login_required
@limit_posts(USER_SCOPE)
@require_POST
def schedule_delete(request: HttpRequest, schedule_id: int) -> HttpResponse:
    """Delete a schedule: it fires nothing more; the jobs it fired stay."""
    schedule = _visible_schedule(request, schedule_id)
    try:
        schedules.schedule_delete(schedule_id=schedule.id, actor=request.user)
    except ScheduleNotFound:
        raise Http404("No such schedule.") from None
    messages.success(request, f"Schedule “{schedule.name}” deleted.")
    return redirect("pages:schedule-list")
