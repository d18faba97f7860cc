"""User pages with Django's test client: sign-in, register, jobs, job detail, schedules, readable errors."""

from __future__ import annotations

import datetime as dt
import json
import re
import zoneinfo

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import Role, User
from scheduler import leasing, schedules
from scheduler.enqueuing import enqueue
from scheduler.models import CronSchedule, Job, JobAttempt
from scheduler.states import AttemptStatus, JobStatus, Priority
from tests.support.factories import PASSWORD, JobFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    """Most users here sign in with force_login: spare argon2's deliberate cost."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def signed_in(client, user):
    """A test client with ``user``'s session."""
    client.force_login(user)
    return client


def _html(response) -> str:
    return response.content.decode()


class TestAccounts:
    def test_pages_need_a_session(self, client):
        response = client.get("/")

        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=/")

    def test_register_creates_a_user_never_an_admin_and_signs_in(self, client):
        response = client.post(
            "/register/",
            {"username": "ann", "email": "", "password1": PASSWORD, "password2": PASSWORD, "role": "ADMIN"},
            follow=True,
        )

        ann = User.objects.get(username="ann")
        assert (ann.role, ann.is_staff, ann.is_superuser) == (Role.USER, False, False)
        assert response.context["user"] == ann
        assert "Welcome, ann." in _html(response)

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ({"password1": "12345678", "password2": "12345678"}, "This password is entirely numeric."),
            ({"password1": PASSWORD, "password2": PASSWORD + "x"}, "The two passwords differ."),
            ({"username": "Taken", "password1": PASSWORD, "password2": PASSWORD}, "That username is taken."),
        ],
    )
    def test_register_shows_why_it_failed(self, client, body, message):
        UserFactory(username="taken")

        response = client.post("/register/", {"username": "bob", **body})

        assert response.status_code == 400
        assert message in _html(response)
        assert not User.objects.filter(username="bob").exists()

    def test_sign_in_and_out(self, client, user):
        response = client.post("/login/", {"username": user.username, "password": PASSWORD}, follow=True)
        assert response.context["user"] == user

        response = client.post("/logout/", follow=True)
        assert not response.context["user"].is_authenticated

    def test_too_many_sign_ins_get_a_readable_429(self, client, user, settings):
        settings.STINT_RATE_LIMITS = {**settings.STINT_RATE_LIMITS, "auth": "2/min"}
        for _ in range(2):
            client.post("/login/", {"username": user.username, "password": "wrong"})

        response = client.post("/login/", {"username": user.username, "password": PASSWORD})

        assert response.status_code == 429
        assert "Too many requests" in _html(response)
        assert "Please wait" in _html(response)
        assert int(response["Retry-After"]) >= 1
        assert "Traceback" not in _html(response)

    def test_posts_without_a_csrf_token_are_refused(self, user):
        client = Client(enforce_csrf_checks=True)
        client.force_login(user)

        response = client.post("/jobs/new/", {"type": "DEMO_TASK", "priority": "MEDIUM", "queue": "default"})

        assert response.status_code == 403
        assert not Job.objects.exists()


class TestJobList:
    def test_lists_only_my_jobs_newest_first(self, signed_in, user, other_user):
        older = JobFactory(owner=user, name="older")
        newer = JobFactory(owner=user, name="newer")
        JobFactory(owner=other_user, name="not-mine")

        page = signed_in.get("/").context["page"]

        assert [j.id for j in page.object_list] == [newer.id, older.id]

    def test_filters_and_pages(self, signed_in, user):
        JobFactory.create_batch(25, owner=user, dead=True, queue="reports")
        JobFactory(owner=user, queue="reports")

        first = signed_in.get("/", {"status": "DEAD", "queue": "reports"})
        second = signed_in.get("/", {"status": "DEAD", "queue": "reports", "page": 2})

        assert first.context["page"].paginator.count == 25
        assert len(first.context["page"].object_list) == 20 and len(second.context["page"].object_list) == 5
        assert "status=DEAD&amp;queue=reports&amp;page=2" in _html(first)

    def test_an_invalid_filter_is_shown_not_ignored(self, signed_in, user):
        JobFactory(owner=user)

        response = signed_in.get("/", {"status": "BOGUS"})

        assert response.context["page"].paginator.count == 0
        assert "Select a valid choice" in _html(response)

    def test_search_takes_the_apis_qualifiers_on_my_jobs_only(self, signed_in, user, other_user):
        mine = JobFactory(owner=user, name="nightly", payload={"customer": 42})
        failed = JobFactory(owner=user, name="weekly", payload={"customer": 7}, failed=True, last_error="Timeout: 30 s")
        JobFactory(owner=other_user, payload={"customer": 42}, failed=True, last_error="timeout")

        def ids(term: str) -> set:
            response = signed_in.get("/", {"search": term})
            assert response.status_code == 200
            return {j.id for j in response.context["page"].object_list}

        assert 'name="search"' in _html(signed_in.get("/"))
        assert ids("args.customer:42") == {mine.id}
        assert ids("error:timeout") == {failed.id}
        assert ids("week") == {failed.id}
        assert ids("args.customer:7 night") == set()
        assert ids("ARGS.customer:42") == {mine.id} and ids("Error:TIMEOUT") == {failed.id}  # any case of the name
        assert ids("30 S") == {failed.id}  # plain text: part of the last error too, as in the console
        assert 'value="args.customer:42"' in _html(signed_in.get("/", {"search": "args.customer:42"}))

    @pytest.mark.parametrize(
        ("term", "says"),
        [
            ("args.customer:", "has no value"),
            ('error:"open', "not closed"),
            ("args.:1", "is not args.&lt;key&gt;"),
            ("x" * 201, "at most 200 characters"),
            (" ".join(["a"] * 21), "at most 20 terms"),
        ],
    )
    def test_a_search_that_cannot_be_read_lists_nothing_and_says_why(self, signed_in, user, term, says):
        JobFactory(owner=user, name="a")

        response = signed_in.get("/", {"search": term})

        assert response.status_code == 200
        assert response.context["page"].paginator.count == 0
        assert says in _html(response)

    def test_status_poll_answers_for_my_jobs_only(self, signed_in, user, other_user):
        mine = JobFactory(owner=user, succeeded=True)
        theirs = JobFactory(owner=other_user)

        response = signed_in.get("/jobs/status/", {"id": [str(mine.id), str(theirs.id), "not-a-uuid"]})

        jobs = response.json()["jobs"]
        assert list(jobs) == [str(mine.id)]
        assert jobs[str(mine.id)]["status"] == "SUCCESS" and jobs[str(mine.id)]["finished"] is True
        assert 'data-status="SUCCESS"' in jobs[str(mine.id)]["badge"]


class TestNewJob:
    def test_creates_a_job_through_the_service(self, signed_in, user):
        response = signed_in.post(
            "/jobs/new/",
            {"name": "hello", "type": "DEMO_TASK", "payload": '{"result": 1}', "priority": "HIGH", "queue": "default"},
        )

        job = Job.objects.get(owner=user)
        assert response.status_code == 302 and response["Location"] == f"/jobs/{job.id}/"
        assert (job.name, job.status, job.priority, job.payload) == (
            "hello",
            JobStatus.QUEUED,
            Priority.HIGH,
            {"result": 1},
        )
        assert job.event_sequence == 2  # JOB_CREATED and JOB_QUEUED were written with it

    def test_a_future_time_schedules_it(self, signed_in, user):
        when = (timezone.now() + dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")

        signed_in.post("/jobs/new/", {"type": "DEMO_TASK", "priority": "LOW", "queue": "q", "scheduled_at": when})

        assert Job.objects.get(owner=user).status == JobStatus.SCHEDULED

    @pytest.mark.parametrize(
        ("fields", "status", "message"),
        [
            ({"payload": "{nope"}, 400, "Not valid JSON"),
            ({"max_retries": "11"}, 400, "Ensure this value is less than or equal to 10."),
            ({"queue": "bad queue"}, 400, "1-100 characters: letters, digits"),
            ({"payload": json.dumps({"blob": "x" * 11000})}, 413, "At most 10240 bytes."),
        ],
    )
    def test_validation_messages(self, signed_in, fields, status, message):
        body = {"type": "DEMO_TASK", "priority": "MEDIUM", "queue": "default", **fields}

        response = signed_in.post("/jobs/new/", body)

        assert response.status_code == status
        assert message in _html(response)
        assert 'role="alert"' in _html(response)
        assert not Job.objects.exists()

    def test_idempotency_conflict_is_a_readable_409(self, signed_in, user):
        body = {"type": "DEMO_TASK", "priority": "MEDIUM", "queue": "default", "idempotency_key": "k1"}
        signed_in.post("/jobs/new/", {**body, "payload": "{}"})

        response = signed_in.post("/jobs/new/", {**body, "payload": '{"other": true}'})

        assert response.status_code == 409
        assert "already used with a different request body" in _html(response)
        assert Job.objects.count() == 1


class TestJobDetail:
    def test_shows_fields_and_the_timeline_in_order(self, signed_in, user):
        job = enqueue("DEMO_TASK", {"result": "x"}, owner=user, name="shown")

        html = _html(signed_in.get(f"/jobs/{job.id}/"))

        assert "“shown”" in html and html.count("<h1") == 1
        assert html.index('data-event="JOB_CREATED"') < html.index('data-event="JOB_QUEUED"')
        assert "Cancel job" in html and "Retry job" not in html

    def test_another_users_job_is_a_404_everywhere(self, client, user, other_user):
        job = enqueue("DEMO_TASK", {}, owner=user)
        client.force_login(other_user)

        for url in (f"/jobs/{job.id}/", f"/jobs/{job.id}/live/"):
            response = client.get(url)
            assert response.status_code == 404
            assert "not yours to see" in _html(response)
        for url in (f"/jobs/{job.id}/cancel/", f"/jobs/{job.id}/retry/"):
            assert client.post(url).status_code == 404
        assert Job.objects.get(id=job.id).status == JobStatus.QUEUED

    def test_an_admin_may_open_anyones_job(self, client, user, admin_user):
        job = enqueue("DEMO_TASK", {}, owner=user)
        client.force_login(admin_user)

        assert client.get(f"/jobs/{job.id}/").status_code == 200

    def test_cancel_then_a_second_cancel_is_a_readable_409(self, signed_in, user):
        job = enqueue("DEMO_TASK", {}, owner=user, scheduled_at=timezone.now() + dt.timedelta(hours=1))

        response = signed_in.post(f"/jobs/{job.id}/cancel/", follow=True)
        assert "Job cancelled." in _html(response)
        assert Job.objects.get(id=job.id).status == JobStatus.CANCELLED

        response = signed_in.post(f"/jobs/{job.id}/cancel/")
        assert response.status_code == 409
        assert "A CANCELLED job cannot be cancelled." in _html(response)

    def test_attempts_say_how_many_count_against_the_budget(self, signed_in, user):
        # After a hand-back (make run's Ctrl-C) or a retry, attempts_base moved up: the page said
        # "2 (at most 4 per run)" of a job that may still make 3 more attempts.
        fresh = JobFactory(owner=user, succeeded=True, attempts=2, max_retries=3)
        handed_back = JobFactory(owner=user, succeeded=True, attempts=2, attempts_base=1, max_retries=3)

        assert "<dd>2 (at most 4)</dd>" in _html(signed_in.get(f"/jobs/{fresh.id}/"))
        html = _html(signed_in.get(f"/jobs/{handed_back.id}/"))
        assert "2 (1 counted against its budget of 4; 1 handed back or made before a retry or recovery)" in html

    def test_a_cancel_that_came_too_late_says_the_job_finished_first(self, signed_in, user):
        job = enqueue("DEMO_TASK", {}, owner=user)
        (claimed,) = leasing.claim_jobs(worker_id="test-host:1:abc", limit=1, queues=None)
        response = signed_in.post(f"/jobs/{job.id}/cancel/", follow=True)
        assert "Cancellation requested: the job stops when its handler next checks." in _html(response)

        leasing.record_outcomes([leasing.Report(job=claimed, outcome=leasing.Outcome.SUCCEEDED)])

        for url in (f"/jobs/{job.id}/", f"/jobs/{job.id}/live/"):
            html = _html(signed_in.get(url))
            assert 'id="job-cancellation"' in html
            assert "Cancellation was requested, but the job finished first (SUCCESS)" in html
            assert "Cancel job" not in html

    def test_retry_a_failed_job_and_refuse_any_other(self, signed_in, user):
        failed = JobFactory(owner=user, failed=True)
        queued = JobFactory(owner=user)

        assert "Retry job" in _html(signed_in.get(f"/jobs/{failed.id}/"))
        signed_in.post(f"/jobs/{failed.id}/retry/")
        assert Job.objects.get(id=failed.id).status == JobStatus.RETRYING

        response = signed_in.post(f"/jobs/{queued.id}/retry/")
        assert response.status_code == 409
        assert "Only a FAILED job can be retried; this one is QUEUED." in _html(response)

    def test_each_attempts_traceback_is_folded_under_its_error_and_escaped(self, signed_in, user):
        job = JobFactory(owner=user, failed=True, attempts=2)
        for n in (1, 2):
            JobAttempt.objects.create(
                job=job,
                attempt_number=n,
                status=AttemptStatus.FAILED,
                started_at=timezone.now(),
                error=f"ValueError: bad <input> {n}",
                traceback=f"Traceback (most recent call last):\n  File jobs.py, line {n}\nValueError: bad <input> {n}",
            )
        JobAttempt.objects.create(
            job=job, attempt_number=3, status=AttemptStatus.LOST, started_at=timezone.now(), error="worker died"
        )

        html = _html(signed_in.get(f"/jobs/{job.id}/"))

        folded = re.findall(
            r'<details class="traceback"><summary>Traceback of attempt (\d)</summary><pre>(.*?)</pre>', html, re.S
        )
        assert [n for n, _ in folded] == ["1", "2"]  # attempt 3 raised nothing: no empty box
        assert folded[1][1].endswith("ValueError: bad &lt;input&gt; 2")
        assert '<details class="traceback" open' not in html  # collapsed until asked

    def test_an_admins_dead_job_links_to_the_console_where_they_recover_it(self, client):
        # An ADMIN was told to "ask one" about their own dead job, with no way on the page.
        admin = UserFactory(role=Role.ADMIN, is_staff=True)
        client.force_login(admin)
        dead = JobFactory(owner=admin, dead=True)

        html = _html(client.get(f"/jobs/{dead.id}/"))

        assert "ask one" not in html
        assert f'href="/admin/scheduler/job/{dead.id}/change/"' in html and "recover it in the operator console" in html

    def test_a_dead_job_says_an_admin_recovers_it_or_offers_retry_when_owners_may(self, signed_in, user, settings):
        dead = JobFactory(owner=user, dead=True)

        html = _html(signed_in.get(f"/jobs/{dead.id}/"))
        assert "Only an ADMIN can recover it" in html and "Retry job" not in html
        response = signed_in.post(f"/jobs/{dead.id}/retry/")
        assert response.status_code == 409
        assert "Only an ADMIN can recover it" in _html(response)

        settings.SCHEDULER = {**settings.SCHEDULER, "OWNERS_MAY_RETRY_DEAD": True}
        html = _html(signed_in.get(f"/jobs/{dead.id}/"))
        assert "Only an ADMIN can recover it" not in html and "Retry job" in html
        signed_in.post(f"/jobs/{dead.id}/retry/")
        assert Job.objects.get(id=dead.id).status == JobStatus.QUEUED

    def test_live_fragment_marks_finished_jobs(self, signed_in, user):
        job = JobFactory(owner=user, succeeded=True)

        html = _html(signed_in.get(f"/jobs/{job.id}/live/"))

        assert 'data-job-finished="true"' in html and "<html" not in html


SCHEDULE = {
    "name": "every five",
    "kind": "cron",
    "cron": "*/5 * * * *",
    "timezone": "UTC",
    "enabled": "on",
    "misfire_policy": "skip",
    "overlap_policy": "allow",
    "job_type": "DEMO_TASK",
    "job_payload": "{}",
    "job_priority": "MEDIUM",
    "job_queue": "default",
}


def _times(html: str) -> list[dt.datetime]:
    return [dt.datetime.fromisoformat(t) for t in re.findall(r'<time datetime="([^"]+)">', html)]


class TestSchedules:
    def test_preview_shows_five_times_and_saves_nothing(self, signed_in):
        response = signed_in.post("/schedules/new/", {**SCHEDULE, "preview": "1"})

        times = _times(_html(response))
        assert response.status_code == 200
        assert len(times) == 5 and all(t.minute % 5 == 0 for t in times) and times == sorted(times)
        assert not CronSchedule.objects.exists()

    def test_create_then_the_edit_page_shows_the_next_five(self, signed_in, user):
        response = signed_in.post("/schedules/new/", {**SCHEDULE, "save": "1"}, follow=True)

        schedule = CronSchedule.objects.get(owner=user)
        assert schedule.cron == "*/5 * * * *" and schedule.enabled
        assert len(_times(_html(response))) == 5

    def test_the_schedule_pages_show_every_run_its_counts_and_the_last_run(self, signed_in, user):
        schedule = schedules.schedule_create(owner=user, name="hourly", cron="0 * * * *", job={"type": "DEMO_TASK"})
        never = schedules.schedule_create(owner=user, name="never yet", cron="0 3 * * *", job={"type": "DEMO_TASK"})
        jobs = [schedules.schedule_trigger(schedule_id=schedule.id, actor=user) for _ in range(22)]
        done = jobs[-1]
        Job.objects.filter(id=done.id).update(
            status=JobStatus.SUCCESS,
            started_at=done.fire_time,
            finished_at=done.fire_time + dt.timedelta(seconds=2.5),
        )
        Job.objects.filter(id=jobs[0].id).update(status=JobStatus.DEAD)

        html = _html(signed_in.get(f"/schedules/{schedule.id}/edit/"))

        assert "22 runs kept" in html
        counts = dict(re.findall(r'data-runs-status="(\w+)">.*?</span> (\d+)</span>', html))
        assert counts == {"DEAD": "1", "QUEUED": "20", "SUCCESS": "1"}
        assert "Last run: fired" in html and "in 2.50 s" in html
        rows = re.findall(r'<tr data-run="([0-9a-f-]+)">', html)
        assert rows == [str(j.id) for j in reversed(jobs)][:20]  # newest fire first, 20 a page
        older = _html(signed_in.get(f"/schedules/{schedule.id}/edit/?runs_page=2"))
        assert re.findall(r'<tr data-run="([0-9a-f-]+)">', older) == [str(jobs[1].id), str(jobs[0].id)]
        assert signed_in.get(f"/schedules/{schedule.id}/edit/?runs_page=x").status_code == 200

        listing = _html(signed_in.get("/schedules/"))
        assert f'<a href="/jobs/{done.id}/">' in listing  # the last run, linked
        row = listing[listing.index(f'data-schedule="{never.id}"') :]
        assert "never" in row[: row.index("</tr>")]

    def test_fire_times_show_in_the_schedules_zone_and_in_utc(self, signed_in, user):
        """Kathmandu is UTC+05:45: 00:30 there is 18:45 UTC the day before, so the UTC part carries its date."""
        schedule = schedules.schedule_create(
            owner=user, name="nepal", cron="30 0 * * *", timezone="Asia/Kathmandu", job={"type": "DEMO_TASK"}
        )
        first = schedule.next_fire_at.astimezone(dt.UTC)
        local = first.astimezone(zoneinfo.ZoneInfo("Asia/Kathmandu"))
        shown = f"{local:%Y-%m-%d} 00:30:00 Asia/Kathmandu ({first:%Y-%m-%d} 18:45:00 UTC)"

        assert shown in _html(signed_in.get(f"/schedules/{schedule.id}/edit/"))
        assert shown in _html(signed_in.get("/schedules/"))

        body = {**SCHEDULE, "cron": "0 9 * * *", "timezone": "Asia/Kathmandu", "preview": "1"}
        preview = _html(signed_in.post("/schedules/new/", body))
        assert re.findall(r"\d{4}-\d\d-\d\d 09:00:00 Asia/Kathmandu \(03:15:00 UTC\)", preview), preview

    def test_fire_times_across_a_daylight_saving_change_keep_the_zones_hour(self, signed_in, user):
        """Paris moves to summer time on 2027-03-28: 09:00 there is 08:00 UTC before, 07:00 UTC after."""
        schedule = schedules.schedule_create(
            owner=user, name="paris", cron="0 9 * * *", timezone="Europe/Paris", job={"type": "DEMO_TASK"}
        )
        CronSchedule.objects.filter(id=schedule.id).update(next_fire_at=dt.datetime(2027, 3, 27, 8, tzinfo=dt.UTC))

        html = _html(signed_in.get(f"/schedules/{schedule.id}/edit/"))

        assert re.findall(r'<time datetime="[^"]+">([^<]+)</time>', html)[:3] == [
            "2027-03-27 09:00:00 Europe/Paris (08:00:00 UTC)",
            "2027-03-28 09:00:00 Europe/Paris (07:00:00 UTC)",
            "2027-03-29 09:00:00 Europe/Paris (07:00:00 UTC)",
        ]

    def test_interval_schedule(self, signed_in, user):
        body = {**SCHEDULE, "kind": "interval", "cron": "", "interval_seconds": "90", "save": "1"}

        signed_in.post("/schedules/new/", body)

        assert CronSchedule.objects.get(owner=user).interval_seconds == 90

    @pytest.mark.parametrize(
        ("fields", "message"),
        [
            ({"cron": "not a cron"}, "cron"),
            ({"timezone": "Mars/Base"}, "Not an IANA time zone."),
            ({"cron": ""}, "Give a cron expression, or choose a fixed interval."),
            ({"job_payload": "[1,"}, "Not valid JSON"),
            ({"kind": "interval", "cron": "", "interval_seconds": "10"}, "at most once every 60 seconds"),
        ],
    )
    def test_errors_land_on_their_fields(self, signed_in, fields, message):
        response = signed_in.post("/schedules/new/", {**SCHEDULE, **fields, "save": "1"})

        assert response.status_code == 400
        assert message in _html(response)
        assert not CronSchedule.objects.exists()

    def test_edit_toggle_and_delete(self, signed_in, user):
        schedule = schedules.schedule_create(owner=user, name="s", cron="0 * * * *", job={"type": "DEMO_TASK"})

        signed_in.post(f"/schedules/{schedule.id}/edit/", {**SCHEDULE, "name": "renamed", "save": "1"})
        assert CronSchedule.objects.get(id=schedule.id).name == "renamed"

        signed_in.post(f"/schedules/{schedule.id}/toggle/", {"enabled": "false"})
        assert CronSchedule.objects.get(id=schedule.id).enabled is False
        assert "none while disabled" in _html(signed_in.get("/schedules/"))

        signed_in.post(f"/schedules/{schedule.id}/delete/")
        assert not CronSchedule.objects.filter(id=schedule.id).exists()

    def test_another_users_schedule_is_a_404(self, signed_in, other_user):
        theirs = schedules.schedule_create(owner=other_user, name="t", cron="0 * * * *", job={"type": "DEMO_TASK"})

        assert signed_in.get(f"/schedules/{theirs.id}/edit/").status_code == 404
        assert signed_in.post(f"/schedules/{theirs.id}/toggle/", {"enabled": "false"}).status_code == 404
        assert signed_in.post(f"/schedules/{theirs.id}/delete/").status_code == 404
        assert "“t”" not in _html(signed_in.get("/schedules/"))
        assert CronSchedule.objects.get(id=theirs.id).enabled is True
