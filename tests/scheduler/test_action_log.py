"""The operator action history (``scheduler.action_log``): every door (console, admin API, user API and pages)
records who did what, with a plain message, in the change's transaction, once; History pages list it."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.db import connection, transaction

from scheduler import job_actions, queues, schedules
from scheduler.action_log import action_record
from scheduler.flow import limits as flow_limits
from scheduler.flow.models import FlowLimit
from scheduler.models import Job, Queue
from scheduler.states import JobStatus
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db

SCHEDULE = {"name": "nightly", "cron": "0 3 * * *", "job": {"type": "DEMO_TASK"}}


def entries(obj=None) -> list[tuple[str, int, str]]:
    """(username, action flag, message) of every entry, or of ``obj``'s, oldest first."""
    rows = LogEntry.objects.order_by("id")
    if obj is not None:
        rows = rows.filter(object_id=str(obj.pk), content_type__model=obj._meta.model_name)
    return [(e.user.username, e.action_flag, e.change_message) for e in rows.select_related("user")]


class TestJobs:
    def test_an_owner_cancelling_through_the_api_is_recorded_on_the_job(self, user_api, user):
        job = JobFactory(owner=user)

        assert user_api.post(f"/api/jobs/{job.id}/cancel").status_code == 200

        assert entries(job) == [(user.username, CHANGE, "Cancelled (QUEUED → CANCELLED).")]

    def test_a_running_jobs_cancellation_request_retry_and_recover_are_recorded(self, admin_api, admin_user, user):
        running, failed, dead = JobFactory(running=True, owner=user), JobFactory(failed=True), JobFactory(dead=True)

        for job, action, code in ((running, "cancel", 202), (failed, "retry", 200), (dead, "recover", 200)):
            assert admin_api.post(f"/api/jobs/{job.id}/{action}").status_code == code

        name = admin_user.username
        assert entries(running) == [(name, CHANGE, "Requested cancellation (RUNNING: its worker stops it).")]
        assert entries(failed) == [(name, CHANGE, "Retried (FAILED → RETRYING).")]
        assert entries(dead) == [(name, CHANGE, "Recovered (DEAD → QUEUED, fresh attempt budget).")]

    def test_a_refused_move_and_a_trusted_caller_record_nothing(self, user_api, user):
        done = JobFactory(succeeded=True, owner=user)
        assert user_api.post(f"/api/jobs/{done.id}/cancel").status_code == 409

        job_actions.job_cancel(job_id=JobFactory().id)  # actor None: the system's own move

        assert entries() == []

    def test_a_move_that_rolls_back_leaves_no_entry(self, user):
        job = JobFactory(owner=user)

        with pytest.raises(RuntimeError), transaction.atomic():
            job_actions.job_cancel(job_id=job.id, actor=user)
            raise RuntimeError("the caller's transaction fails after the move")

        assert Job.objects.get(id=job.id).status == JobStatus.QUEUED
        assert entries() == []

    def test_recording_outside_a_transaction_is_refused(self, user):
        connection.in_atomic_block, saved = False, connection.in_atomic_block  # as autocommit code would be
        try:
            with pytest.raises(RuntimeError):
                action_record(actor=user, objects=[JobFactory.build()], flag=CHANGE, message="x")
        finally:
            connection.in_atomic_block = saved

    def test_the_pages_cancel_button_records_the_owner(self, client, user):
        client.force_login(user)
        job = JobFactory(owner=user)

        client.post(f"/jobs/{job.id}/cancel/")

        assert entries(job) == [(user.username, CHANGE, "Cancelled (QUEUED → CANCELLED).")]

    def test_a_console_bulk_cancel_records_one_entry_per_job_changed(self, operator, admin_user):
        jobs = [JobFactory(), JobFactory(), JobFactory(succeeded=True)]

        operator.post(
            "/admin/scheduler/job/",
            {"action": "cancel_jobs", ACTION_CHECKBOX_NAME: [str(j.pk) for j in jobs], "index": 0},
        )

        assert [entries(j) for j in jobs] == [
            [(admin_user.username, CHANGE, "Cancelled (QUEUED → CANCELLED).")],
            [(admin_user.username, CHANGE, "Cancelled (QUEUED → CANCELLED).")],
            [],  # skipped: its state did not allow it
        ]


class TestQueues:
    def test_pause_and_resume_through_the_api_and_the_console_are_recorded_once_per_change(
        self, admin_api, operator, admin_user
    ):
        assert admin_api.post("/api/admin/queues/reports/pause").status_code == 200
        assert admin_api.post("/api/admin/queues/reports/pause").status_code == 200  # a no-op: nothing new
        operator.post(
            "/admin/scheduler/queue/",
            {"action": "resume_queues", ACTION_CHECKBOX_NAME: ["reports"], "index": 0},
        )

        queue = Queue.objects.get(name="reports")
        assert entries(queue) == [(admin_user.username, CHANGE, "Paused."), (admin_user.username, CHANGE, "Resumed.")]

    def test_a_queues_history_page_lists_them(self, operator, admin_user):
        queues.queue_pause(name="mail:eu.v2", actor=admin_user)

        page = operator.get(f"/admin/scheduler/queue/{quote('mail:eu.v2')}/history/")

        assert page.status_code == 200
        assert "Paused." in page.content.decode()


class TestLimits:
    def test_the_api_records_set_change_and_removal_with_the_values(self, admin_api, admin_user):
        url = "/api/admin/queues/invoices/limits"
        assert admin_api.put(url, {"concurrency": 5}, format="json").status_code == 200
        assert admin_api.put(url, {"concurrency": 5}, format="json").status_code == 200  # same values
        assert admin_api.put(url, {"concurrency": 10}, format="json").status_code == 200
        assert admin_api.delete(url).status_code == 204

        name = admin_user.username
        assert entries() == [
            (name, ADDITION, "Set: concurrency 5."),
            (name, CHANGE, "Changed: concurrency 5 → 10."),
            (name, DELETION, "Removed (was concurrency 10)."),
        ]

    def test_the_consoles_own_add_change_and_delete_views_record_each_once(self, operator, admin_user):
        add = operator.post("/admin/scheduler/flowlimit/add/", {"scope": "queue", "name": "slow", "concurrency": "1"})
        assert add.status_code == 302
        row = FlowLimit.objects.get(scope="queue", name="slow")
        change = operator.post(
            f"/admin/scheduler/flowlimit/{row.pk}/change/", {"scope": "queue", "name": "slow", "concurrency": "2"}
        )
        assert change.status_code == 302
        delete = operator.post(f"/admin/scheduler/flowlimit/{row.pk}/delete/", {"post": "yes"})
        assert delete.status_code == 302

        name = admin_user.username
        assert entries() == [
            (name, ADDITION, "Set: concurrency 1."),
            (name, CHANGE, "Changed: concurrency 1 → 2."),
            (name, DELETION, "Removed (was concurrency 2)."),
        ]

    def test_a_limits_history_page_lists_them(self, operator, admin_user):
        flow_limits.limit_set(
            scope="type", name="EMAIL", data={"rate_limit": 3, "rate_period_seconds": 60}, actor=admin_user
        )
        row = FlowLimit.objects.get()

        page = operator.get(f"/admin/scheduler/flowlimit/{row.pk}/history/")

        assert page.status_code == 200
        assert "Set: rate_limit 3, rate_period_seconds 60.0." in page.content.decode()


class TestSchedules:
    def test_the_api_records_create_disable_trigger_and_delete(self, user_api, user):
        created = user_api.post("/api/schedules", SCHEDULE, format="json").json()
        sid = created["id"]
        assert user_api.patch(f"/api/schedules/{sid}", {"enabled": False}, format="json").status_code == 200
        assert user_api.patch(f"/api/schedules/{sid}", {"enabled": False}, format="json").status_code == 200
        job = user_api.post(f"/api/schedules/{sid}/trigger").json()
        assert user_api.delete(f"/api/schedules/{sid}").status_code == 204

        name = user.username
        assert entries() == [
            (name, ADDITION, "Created: cron '0 3 * * *' (UTC), fires DEMO_TASK on queue default."),
            (name, CHANGE, "Disabled."),
            (name, CHANGE, f"Triggered now: job {job['id']}."),
            (name, DELETION, "Deleted: cron '0 3 * * *' (UTC), fires DEMO_TASK on queue default, disabled."),
        ]

    def test_the_consoles_actions_and_edit_view_record_what_changed(self, operator, admin_user, user):
        schedule = schedules.schedule_create(owner=user, **SCHEDULE)  # project code: not recorded
        operator.post(
            "/admin/scheduler/cronschedule/",
            {"action": "disable_schedules", ACTION_CHECKBOX_NAME: [str(schedule.pk)], "index": 0},
        )
        form = {
            "name": "nightly v2",
            "kind": "cron",
            "cron": "0 4 * * *",
            "timezone": "UTC",
            "misfire_policy": "skip",
            "overlap_policy": "allow",
            "job_type": "DEMO_TASK",
            "job_payload": "{}",
            "job_priority": "MEDIUM",
            "job_queue": "default",
            "job_max_retries": "3",
            "job_timeout_seconds": "300",
        }
        saved = operator.post(f"/admin/scheduler/cronschedule/{schedule.pk}/edit/", {**form, "save": "1"})
        assert saved.status_code == 302

        name = admin_user.username
        assert entries(schedule) == [
            (name, CHANGE, "Disabled."),
            (name, CHANGE, "Changed name nightly → nightly v2; cron 0 3 * * * → 0 4 * * *."),
        ]
