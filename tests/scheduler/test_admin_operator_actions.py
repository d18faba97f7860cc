"""The console shows the operator action history: the dashboard's card (every user's latest, with links),
the Log entries list and the History pages, with hostile, long and non-ASCII names escaped."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote

from scheduler import job_actions, queues, schedules
from scheduler.models import CronSchedule, Job, Queue
from tests.support.factories import JobFactory

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert(1)</script>"
SCHEDULE = {"name": "nightly", "cron": "0 3 * * *", "job": {"type": "DEMO_TASK"}}


class TestShown:
    def _hostile_actions(self, admin_user, user) -> tuple[Job, CronSchedule]:
        job = JobFactory(owner=user, name=HOSTILE + "é" * 170)
        job_actions.job_cancel(job_id=job.id, actor=admin_user)
        schedule = schedules.schedule_create(owner=user, actor=user, **{**SCHEDULE, "name": HOSTILE + "ü" * 170})
        queues.queue_pause(name="q-" + "x" * 98, actor=admin_user)
        return job, schedule

    def test_the_dashboard_lists_every_users_latest_actions_escaped_with_links(self, operator, admin_user, user):
        job, schedule = self._hostile_actions(admin_user, user)

        page = operator.get("/admin/")

        html = page.content.decode()
        assert page.status_code == 200
        card = html[html.index('id="stint-operator-actions"') :]
        assert HOSTILE not in html
        assert "&lt;script&gt;" in card
        assert f"/admin/scheduler/job/{job.id}/change/" in card
        assert f"/admin/scheduler/cronschedule/{schedule.id}/change/" in card
        assert f"<strong>{user.username}</strong>" in card and f"<strong>{admin_user.username}</strong>" in card
        assert "/admin/admin/logentry/" in card

    def test_the_history_pages_and_the_list_render_hostile_and_long_names_escaped(self, operator, admin_user, user):
        job, schedule = self._hostile_actions(admin_user, user)
        Queue.objects.create(name="очередь")  # a row no service would make: its page still renders
        LogEntry.objects.log_actions(
            user_id=admin_user.pk,
            queryset=[Queue.objects.get(name="очередь")],
            action_flag=CHANGE,
            change_message=HOSTILE,
        )

        for url in (
            f"/admin/scheduler/job/{job.id}/history/",
            f"/admin/scheduler/cronschedule/{schedule.id}/history/",
            f"/admin/scheduler/queue/{quote('очередь')}/history/",
            "/admin/admin/logentry/",
            "/admin/admin/logentry/?q=%3Cscript",
        ):
            page = operator.get(url)
            assert page.status_code == 200, url
            assert HOSTILE not in page.content.decode(), url
        listed = operator.get("/admin/admin/logentry/").content.decode()
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in listed
        assert f"/admin/scheduler/job/{job.id}/change/" in listed

    def test_a_user_cannot_read_the_history(self, client, user):
        client.force_login(user)
        assert client.get("/admin/admin/logentry/").status_code == 302  # to the login page
