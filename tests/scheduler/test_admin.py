"""The operator console: read-only job pages, service actions with counts, bulk actions on a filtered set,
schedules, workers, queues, outbox/audit and the dashboard. Django's test client, a real database."""

from __future__ import annotations

import datetime as dt
import re
import uuid

import pytest
from django.contrib.admin import site
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote as admin_quote
from django.contrib.messages import get_messages
from django.db import connection
from django.db.models import CharField, TextField
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent
from scheduler import queues, schedules
from scheduler.enqueuing import enqueue
from scheduler.ids import short_job_id
from scheduler.job_search import job_search_parse, jobs_filter_by_list_search
from scheduler.models import CronSchedule, Job, JobAttempt, LeaderFence, OutboxEvent, Queue, WorkerNode
from scheduler.states import AttemptStatus, JobStatus
from tests.support.factories import JobFactory, UserFactory
from tests.support.jobs import finished_unique_and_plain

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/scheduler/job/"


def _messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def _act(client, action: str, objects, url: str = CHANGELIST):
    return client.post(
        url, {"action": action, ACTION_CHECKBOX_NAME: [str(o.pk) for o in objects], "index": 0}, follow=True
    )


def _status(job) -> str:
    return Job.objects.values_list("status", flat=True).get(id=job.id)


class TestAccess:
    def test_a_staff_user_without_the_admin_role_is_sent_to_the_login_page(self, client):
        client.force_login(UserFactory(is_staff=True))

        response = client.get(CHANGELIST)

        assert response.status_code == 302
        assert "/admin/login/" in response["Location"]

    def test_an_admin_who_is_not_a_superuser_can_view_and_act(self, client, user):
        operator = UserFactory(admin=True, is_superuser=False)
        client.force_login(operator)
        job = JobFactory(dead=True, owner=user)

        assert client.get(CHANGELIST).status_code == 200
        response = _act(client, "recover_jobs", [job])

        assert _status(job) == JobStatus.QUEUED
        assert "Recovered 1 job; skipped 0 whose state did not allow it." in _messages(response)

    @pytest.mark.parametrize(
        "url", [f"{CHANGELIST}add/", "/admin/scheduler/queue/add/", "/admin/scheduler/outboxevent/add/"]
    )
    def test_nothing_is_added_by_form(self, operator, url):
        assert operator.get(url).status_code == 403

    def test_the_job_page_is_read_only(self, operator, user):
        job = JobFactory(owner=user)

        response = operator.post(f"{CHANGELIST}{job.id}/change/", {"status": JobStatus.SUCCESS})

        assert response.status_code == 403
        assert _status(job) == JobStatus.QUEUED


class TestJobList:
    def test_badges_filters_and_owner(self, operator, user):
        JobFactory(owner=user, name="nightly", dead=True, type="FAILING", queue="reports")
        Queue.objects.create(name="reports")

        response = operator.get(CHANGELIST)
        html = response.content.decode()

        assert response.status_code == 200
        assert 'data-status="DEAD"' in html
        for param in ("status__exact=DEAD", "priority__exact=0", "queue=reports", "type=FAILING", "owner__id__exact"):
            assert param in html
        assert "created_at__gte" in html  # date filters

    def test_times_show_seconds(self, operator, user):
        job = JobFactory(owner=user, succeeded=True)
        Job.objects.filter(id=job.id).update(created_at=dt.datetime(2026, 11, 30, 14, 28, 33, tzinfo=dt.UTC))

        html = operator.get(CHANGELIST).content.decode()
        detail = operator.get(f"{CHANGELIST}{job.id}/change/").content.decode()

        assert "2026-11-30 14:28:33" in html and "2026-11-30 14:28:33" in detail
        assert "p.m." not in html

    def test_filters_narrow_the_list(self, operator, user):
        dead = JobFactory(owner=user, dead=True, type="FAILING")
        JobFactory(owner=user, dead=True, type="DEMO_TASK")
        JobFactory(owner=user, type="FAILING")

        response = operator.get(CHANGELIST, {"status__exact": "DEAD", "type": "FAILING"})

        assert [j.id for j in response.context["cl"].result_list] == [dead.id]

    def test_the_owner_filter_offers_the_owners_with_jobs_and_narrows_to_one(self, operator, user, other_user):
        mine = JobFactory(owner=user)
        JobFactory(owner=other_user)
        UserFactory()  # no jobs: not offered

        response = operator.get(CHANGELIST, {"owner__id__exact": str(user.pk)})
        owner_filter = next(f for f in response.context["cl"].filter_specs if f.title == "owner")

        assert {label for _, label in owner_filter.lookup_choices} == {user.username, other_user.username}
        assert [j.id for j in response.context["cl"].result_list] == [mine.id]
        assert operator.get(CHANGELIST, {"owner__id__exact": "nobody"}).status_code == 302  # Django: "?e=1", no 500

    @pytest.mark.parametrize("how", ["id", "prefix", "short id", "suffix", "key", "name"])
    def test_search(self, operator, user, how):
        # Fixed ids: two version 7 ids made together share their first digits (their time).
        job = JobFactory(
            id=uuid.UUID("01a23351-5603-75a0-8a05-0c4f92cf1d36"),
            owner=user,
            name="quarterly report",
            idempotency_key="key-123",
        )
        JobFactory(id=uuid.UUID("01a23399-0000-7000-8000-000000000001"), owner=user, name="other")
        term = {
            "id": str(job.id),
            "prefix": "01a23351-56",
            "short id": short_job_id(job.id),
            "suffix": "8a05-0c4f92cf1d36",
            "key": "key-123",
            "name": "quarterly",
        }[how]

        response = operator.get(CHANGELIST, {"q": term})

        assert [j.id for j in response.context["cl"].result_list] == [job.id]

    def test_qualifiers_find_jobs_by_payload_value_and_error_text(self, operator, user):
        mine = JobFactory(owner=user, dead=True, payload={"customer": {"id": 7}}, last_error="Timeout: bank said no")
        JobFactory(owner=user, dead=True, payload={"customer": {"id": 8}}, last_error="Timeout: bank said no")
        JobFactory(owner=user, dead=True, payload={"customer": {"id": 7}}, last_error="KeyError: 'x'")

        response = operator.get(CHANGELIST, {"q": 'args.customer.id:7 error:"bank said"'})

        assert [j.id for j in response.context["cl"].result_list] == [mine.id]

    def test_plain_search_finds_error_text_and_the_list_shows_a_failed_jobs_error(self, operator, user):
        dead = JobFactory(owner=user, dead=True, last_error="ConnectionRefused: smtp <b>down</b>")
        JobFactory(owner=user, succeeded=True, last_error="an old retried error")

        response = operator.get(CHANGELIST, {"q": "smtp"})
        html = operator.get(CHANGELIST).content.decode()

        assert [j.id for j in response.context["cl"].result_list] == [dead.id]
        assert "ConnectionRefused: smtp &lt;b&gt;down&lt;/b&gt;" in html  # escaped
        assert html.count("data-last-error") == 1  # a SUCCESS job's old error is not shown

    @pytest.mark.parametrize(
        "query",
        [
            "q=args.k",
            "q=error%3A%22open",
            "q=args.k%3A1e99999",
            "q=args.k%3A" + "9" * 6000,
            "q=args.%ED%A0%80%3A1",  # a lone surrogate's bytes: Django reads U+FFFD
            "q=args." + ".".join(["k"] * 50) + "%3A1",
            "q=error%3A" + "%F0%9F%98%80" * 500,
            "q=" + "+".join(["args.k%3A1"] * 10_000),  # past MAX_TERMS: refused before any query is built
            "q=" + "+".join(["word"] * 10_000),
        ],
    )
    def test_a_search_that_cannot_be_read_is_a_message_never_a_500(self, operator, user, query):
        JobFactory(owner=user, payload={"k": 1})

        response = operator.get(f"{CHANGELIST}?{query}")

        assert response.status_code == 200
        assert response.context["cl"].result_count in (0, 1)

    def test_a_refused_search_term_says_why(self, operator, user):
        JobFactory(owner=user, payload={"k": 1})

        response = operator.get(CHANGELIST, {"q": "args.k"})

        assert response.context["cl"].result_count == 0
        assert any(m.startswith("Search: 'args.k' is not args.<key>") for m in _messages(response))

    def test_the_console_finds_what_the_api_finds_for_the_same_text(self, operator, user):
        # The console searched id, name, error and key with Django's icontains (no type, no case
        # beyond ASCII in a C-locale database); the API and the pages name or type. One rule now.
        job = JobFactory(
            owner=user, name="Quarterly Übersicht", type="REPORT", idempotency_key="key-123", last_error="Ärger: bank"
        )
        JobFactory(owner=user, name="other", last_error="KeyError")
        terms = [
            str(job.id),
            short_job_id(job.id),
            "key-123",
            "quarterly",
            "ÜBERSICHT",
            "report",
            "ärger",
            "ÄRGER: BANK",
            "keyerror",
            "Error:Ärger",
            "ARGS.k:1",
            "nothing",
            "%",
            "_",
            "\\",
            "'",
            '"',
        ]

        for term in terms:
            console = operator.get(CHANGELIST, {"q": term})
            listed = jobs_filter_by_list_search(Job.objects.all(), job_search_parse(term))
            assert {j.id for j in console.context["cl"].result_list} == set(listed.values_list("id", flat=True)), term
        assert {j.id for j in operator.get(CHANGELIST, {"q": "übersicht"}).context["cl"].result_list} == {job.id}

    @pytest.mark.parametrize(
        "query",
        [
            "q=%00",
            "q=a%00b",
            "q=error:%00",
            "q=%ED%A0%80",
            "q=" + "x" * 2000,
            "q=" + "%C3%A4" * 2000,
            "q=%25",
            "q=_",
            "q=%5C",
            "q=%27",
            "q=%22",
            "q=%22%27%5C%25_",
            "q=Error:" + "%25" * 2000,
        ],
    )
    def test_fuzzed_plain_search_is_never_a_500(self, operator, user, query):
        # Django's search read a lone quote as an empty quoted phrase and listed every job.
        JobFactory(owner=user, name="plain", type="REPORT", last_error="Bad input")

        response = operator.get(f"{CHANGELIST}?{query}")

        assert response.status_code in (200, 400)
        if response.status_code == 200:
            assert response.context["cl"].result_count == 0

    def test_finished_within_the_last_hour_by_the_database_clock(self, operator, user):
        recent = JobFactory(owner=user, dead=True)
        old = JobFactory(owner=user, dead=True)
        Job.objects.filter(id=old.id).update(finished_at=timezone.now() - dt.timedelta(hours=2))

        hour = operator.get(CHANGELIST, {"finished_within": "1h"})
        day = operator.get(CHANGELIST, {"finished_within": "24h"})

        assert [j.id for j in hour.context["cl"].result_list] == [recent.id]
        assert {j.id for j in day.context["cl"].result_list} == {recent.id, old.id}
        for bad in ("2h", "%ED%A0%80", "1" * 5000):
            assert operator.get(f"{CHANGELIST}?finished_within={bad}").status_code == 302  # Django's "?e=1"

    def test_detail_shows_attempts_result_and_the_timeline(self, operator, user):
        job = enqueue("DEMO_TASK", {"result": 1}, owner=user)
        JobAttempt.objects.create(
            job=job,
            attempt_number=1,
            status=AttemptStatus.FAILED,
            worker="w-0",
            started_at=timezone.now(),
            error="KeyError: 'x'",
            traceback="Traceback (most recent call last):\n  File \"<handler>\", line 3\nKeyError: 'x' <b>",
        )
        JobAttempt.objects.create(
            job=job, attempt_number=2, status=AttemptStatus.SUCCEEDED, worker="w-1", started_at=timezone.now()
        )
        Job.objects.filter(id=job.id).update(
            result_attempt=2, result_status=AttemptStatus.SUCCEEDED, result={"echo": 1}, result_at=timezone.now()
        )
        first = OutboxEvent.objects.get(job_id=job.id, sequence=1)
        AuditEvent.objects.create(
            event_id=first.event_id,
            job_id=job.id,
            event_type=first.event_type,
            sequence=1,
            to_status="CREATED",
            occurred_at=first.occurred_at,
        )

        html = operator.get(f"{CHANGELIST}{job.id}/change/").content.decode()

        assert "w-1" in html and "SUCCEEDED" in html  # the attempts inline
        assert "<summary>Traceback of attempt 1</summary>" in html  # folded under its error
        assert "KeyError: &#x27;x&#x27; &lt;b&gt;</pre></details>" in html  # escaped
        assert "Traceback of attempt 2" not in html
        assert "echo" in html  # the result inline
        assert html.index("JOB_CREATED") < html.index("JOB_QUEUED")  # timeline in sequence order
        assert "2 events" in html  # the audit row and its outbox twin count once

    def test_the_detail_page_says_a_cancel_came_too_late(self, operator, user):
        # The flag alone showed a tick beside a SUCCESS status; the API and the user pages explain it.
        job = JobFactory(owner=user, succeeded=True, cancel_requested=True)

        html = operator.get(f"{CHANGELIST}{job.id}/change/").content.decode()

        assert "Cancellation was requested, but the job finished first (SUCCESS)" in html


class TestJobActions:
    def test_recover_reports_changed_and_skipped(self, operator, user):
        dead = JobFactory.create_batch(2, owner=user, dead=True)
        done = JobFactory(owner=user, succeeded=True)

        response = _act(operator, "recover_jobs", [*dead, done])

        assert "Recovered 2 jobs; skipped 1 whose state did not allow it." in _messages(response)
        assert [_status(j) for j in dead] == [JobStatus.QUEUED, JobStatus.QUEUED]
        assert _status(done) == JobStatus.SUCCESS

    def test_cancel_counts_a_running_job_as_requested(self, operator, user):
        queued = JobFactory(owner=user)
        running = JobFactory(owner=user, running=True)
        done = JobFactory(owner=user, succeeded=True)

        response = _act(operator, "cancel_jobs", [queued, running, done])

        assert (
            "Cancelled 1 job; requested cancellation of 1 running; skipped 1 whose state did not allow it."
            in _messages(response)
        )
        assert _status(queued) == JobStatus.CANCELLED
        assert Job.objects.get(id=running.id).cancel_requested

    def test_retry_moves_failed_jobs_only(self, operator, user):
        failed = JobFactory(owner=user, failed=True)
        dead = JobFactory(owner=user, dead=True)

        response = _act(operator, "retry_jobs", [failed, dead])

        assert "Retried 1 job; skipped 1 whose state did not allow it." in _messages(response)
        assert _status(failed) == JobStatus.RETRYING
        assert _status(dead) == JobStatus.DEAD

    def test_actions_write_lifecycle_events_through_the_services(self, operator, user):
        job = enqueue("DEMO_TASK", {}, owner=user)

        _act(operator, "cancel_jobs", [job])

        assert (
            list(OutboxEvent.objects.filter(job_id=job.id).order_by("sequence").values_list("event_type", flat=True))[
                -1
            ]
            == "JOB_CANCELLED"
        )

    @pytest.mark.parametrize(
        ("action", "finished", "verb"),
        [("recover_jobs", JobStatus.DEAD, "Recovered"), ("retry_jobs", JobStatus.FAILED, "Retried")],
    )
    def test_a_unique_conflict_fails_that_job_with_its_reason_and_the_others_are_applied(
        self, operator, user, action, finished, verb
    ):
        a, b, c = finished_unique_and_plain(user, finished)

        response = _act(operator, action, [a, b])

        assert response.status_code == 200
        (message,) = _messages(response)
        assert message.startswith(f"{verb} 1 job; skipped 0 whose state did not allow it.")
        assert f"({short_job_id(a.id)}): A live job with the same unique content exists" in message
        assert (_status(a), _status(c)) == (finished, JobStatus.QUEUED)
        assert _status(b) != finished


class TestBulkOnTheFilteredSet:
    def test_the_changelist_links_to_bulk_actions_with_its_filters(self, operator, user):
        JobFactory(owner=user, dead=True, type="FAILING")

        html = operator.get(CHANGELIST, {"status__exact": "DEAD", "type": "FAILING", "p": "1"}).content.decode()

        link = re.search(r'href="(/admin/scheduler/job/bulk/recover/\?[^"]*)"', html)
        assert link is not None
        assert "status__exact=DEAD" in link.group(1) and "type=FAILING" in link.group(1)
        assert "p=" not in link.group(1)

    def test_each_link_counts_the_jobs_its_action_would_change_in_the_pages_one_count_query(self, operator, user):
        # "Cancel all matching (4)" over 2 DEAD, 1 SUCCESS and 1 QUEUED job cancelled one of them.
        JobFactory.create_batch(2, owner=user, dead=True)
        JobFactory(owner=user, succeeded=True)
        JobFactory(owner=user)

        with CaptureQueriesContext(connection) as queries:
            html = operator.get(CHANGELIST).content.decode()

        links = dict(re.findall(r'data-bulk-action="(\w+)"[^>]*>([^<]*)</a>', html))
        assert links == {
            "cancel": "Cancel all matching (1)",
            "retry": "Retry all matching (0)",
            "recover": "Recover all matching (2)",
        }
        assert 'title="1 of the 4 matching jobs can be cancelled; the others would be skipped."' in html
        counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"] and "stint_job" in q["sql"]]
        assert len(counts) == 1, counts  # the page's own count counts the links too

    def test_confirmation_page_shows_the_count_then_applies_to_every_page(self, operator, user):
        targets = JobFactory.create_batch(55, owner=user, dead=True, type="FAILING")  # more than one page (50)
        other_type = JobFactory(owner=user, dead=True, type="DEMO_TASK")
        url = "/admin/scheduler/job/bulk/recover/?status__exact=DEAD&type=FAILING"

        confirm = operator.get(url)
        html = confirm.content.decode()

        assert confirm.status_code == 200
        assert '<strong data-testid="bulk-total">55</strong>' in html
        assert '<strong data-testid="bulk-eligible">55</strong>' in html
        assert "Yes, recover 55 jobs" in html
        assert Job.objects.filter(status=JobStatus.DEAD).count() == 56  # a GET changes nothing

        response = operator.post(url, follow=True)

        assert response.redirect_chain[-1][0] == f"{CHANGELIST}?status__exact=DEAD&type=FAILING"
        assert "Recovered 55 jobs; skipped 0 whose state did not allow it." in _messages(response)
        assert {_status(j) for j in targets} == {JobStatus.QUEUED}
        assert _status(other_type) == JobStatus.DEAD

    def test_ineligible_jobs_in_the_set_are_counted_as_skipped(self, operator, user):
        JobFactory(owner=user, dead=True, type="FAILING")
        JobFactory(owner=user, succeeded=True, type="FAILING")
        url = "/admin/scheduler/job/bulk/recover/?type=FAILING"

        html = operator.get(url).content.decode()
        assert '<strong data-testid="bulk-skipped">1</strong>' in html

        response = operator.post(url, follow=True)
        assert "Recovered 1 job; skipped 1 whose state did not allow it." in _messages(response)

    def test_search_terms_are_part_of_the_set(self, operator, user):
        named = JobFactory(owner=user, name="alpha run")
        JobFactory(owner=user, name="beta run")

        response = operator.post("/admin/scheduler/job/bulk/cancel/?q=alpha", follow=True)

        assert "Cancelled 1 job; skipped 0 whose state did not allow it." in _messages(response)
        assert _status(named) == JobStatus.CANCELLED
        assert Job.objects.filter(status=JobStatus.QUEUED).count() == 1

    def test_a_qualifier_search_is_the_set_a_bulk_action_takes(self, operator, user):
        bank = JobFactory(owner=user, dead=True, payload={"customer": 7}, last_error="Timeout: bank")
        other = JobFactory(owner=user, dead=True, payload={"customer": 7}, last_error="KeyError")

        confirm = operator.get("/admin/scheduler/job/bulk/recover/", {"q": "args.customer:7 error:bank"})
        response = operator.post("/admin/scheduler/job/bulk/recover/?q=args.customer%3A7+error%3Abank", follow=True)

        assert confirm.context["total"] == 1
        assert "Recovered 1 job; skipped 0 whose state did not allow it." in _messages(response)
        assert (_status(bank), _status(other)) == (JobStatus.QUEUED, JobStatus.DEAD)

    def test_a_unique_conflict_in_the_set_is_reported_and_the_rest_recovered(self, operator, user):
        a, b, c = finished_unique_and_plain(user, JobStatus.DEAD)
        url = "/admin/scheduler/job/bulk/recover/?status__exact=DEAD"

        response = operator.post(url, follow=True)

        assert response.status_code == 200
        (message,) = _messages(response)
        assert message.startswith("Recovered 1 job; skipped 0 whose state did not allow it.")
        assert f"Failed for 1 job ({short_job_id(a.id)}): A live job with the same unique content exists" in message
        assert (_status(a), _status(b), _status(c)) == (JobStatus.DEAD, JobStatus.QUEUED, JobStatus.QUEUED)

    def test_unknown_action_is_404_and_bad_filters_go_back(self, operator):
        assert operator.get("/admin/scheduler/job/bulk/delete/").status_code == 404

        response = operator.get("/admin/scheduler/job/bulk/cancel/?nonsense__field=1", follow=True)

        assert "Those filters are not valid." in _messages(response)

    def test_a_non_operator_cannot_reach_it(self, client, user):
        client.force_login(user)
        JobFactory(owner=user, dead=True)

        response = client.post("/admin/scheduler/job/bulk/recover/")

        assert response.status_code == 302
        assert Job.objects.filter(status=JobStatus.DEAD).count() == 1


class TestSchedules:
    @pytest.fixture
    def schedule(self, user) -> CronSchedule:
        return schedules.schedule_create(owner=user, name="hourly", cron="0 * * * *", job={"type": "DEMO_TASK"})

    def test_detail_shows_the_next_five_fire_times(self, operator, schedule):
        html = operator.get(f"/admin/scheduler/cronschedule/{schedule.id}/change/").content.decode()

        times = re.findall(r'<time datetime="([^"]+)">', html)
        assert len(times) == 5
        parsed = [dt.datetime.fromisoformat(t) for t in times]
        assert parsed == sorted(parsed) and all(t.minute == 0 for t in parsed)

    def test_detail_lists_the_runs_with_counts_and_a_link_to_all(self, operator, schedule, user):
        jobs = [schedules.schedule_trigger(schedule_id=schedule.id, actor=user) for _ in range(3)]
        Job.objects.filter(id=jobs[1].id).update(status=JobStatus.FAILED)

        html = operator.get(f"/admin/scheduler/cronschedule/{schedule.id}/change/").content.decode()

        assert "3 runs kept" in html
        assert re.findall(r'<tr data-run="([0-9a-f-]+)">', html) == [str(j.id) for j in reversed(jobs)]
        assert f"/admin/scheduler/job/{jobs[0].id}/change/" in html
        all_runs = re.search(r'href="([^"]+)" id="schedule-all-runs"', html).group(1).replace("&amp;", "&")
        listed = operator.get(all_runs)
        assert sorted(str(j.id) for j in listed.context["cl"].result_list) == sorted(str(j.id) for j in jobs)

    def test_an_operator_edits_a_schedule_through_the_service_with_its_rules(self, operator, schedule):
        url = f"/admin/scheduler/cronschedule/{schedule.id}/edit/"
        form = {
            "name": "every two hours",
            "kind": "cron",
            "cron": "0 */2 * * *",
            "timezone": "Europe/London",
            "enabled": "on",
            "misfire_policy": "skip",
            "overlap_policy": "skip",
            "job_type": "DEMO_TASK",
            "job_payload": '{"result": 1}',
            "job_priority": "HIGH",
            "job_queue": "reports",
        }
        page = operator.get(url)
        assert page.status_code == 200 and 'value="hourly"' in page.content.decode()

        saved = operator.post(url, {**form, "save": "1"})

        assert saved.status_code == 302
        schedule.refresh_from_db()
        assert (schedule.name, schedule.cron, schedule.timezone, schedule.overlap_policy) == (
            "every two hours",
            "0 */2 * * *",
            "Europe/London",
            "skip",
        )
        assert (schedule.job_payload, schedule.job_priority, schedule.job_queue) == ({"result": 1}, 50, "reports")
        # The owner is a USER: the minimum interval applies as in the API, on its field, with a 400.
        too_often = operator.post(url, {**form, "kind": "interval", "cron": "", "interval_seconds": "30", "save": "1"})
        assert too_often.status_code == 400
        assert "at most once every 60 seconds" in too_often.content.decode()
        assert CronSchedule.objects.get(id=schedule.id).cron == "0 */2 * * *"
        for bad in ({"cron": "nope"}, {"timezone": "Mars/Base"}, {"job_payload": "{"}, {"job_type": "X"}):
            assert operator.post(url, {**form, **bad, "save": "1"}).status_code == 400, bad
        preview = operator.post(url, {**form, "preview": "1"})
        assert preview.status_code == 200 and "Preview: the next 5 fire times" in preview.content.decode()
        assert operator.get("/admin/scheduler/cronschedule/999999/edit/").status_code == 404

    @pytest.mark.parametrize(("priority", "shown"), [(None, "MEDIUM"), ("HIGH", "HIGH"), (37, "37")])
    def test_the_job_priority_reads_as_the_api_says_it_in_the_list_and_the_detail(
        self, operator, user, priority, shown
    ):
        # The console showed the template's priority as 0 where the API says MEDIUM.
        job = {"type": "DEMO_TASK"} | ({} if priority is None else {"priority": priority})
        schedule = schedules.schedule_create(owner=user, name="hourly", cron="0 * * * *", job=job)

        listed = operator.get("/admin/scheduler/cronschedule/").content.decode()
        detail = operator.get(f"/admin/scheduler/cronschedule/{schedule.id}/change/").content.decode()

        assert re.findall(r'<td class="field-job_priority_name">([^<]*)</td>', listed) == [shown]
        field = re.search(r'field-job_priority_name.*?<div class="readonly">([^<]*)</div>', detail, re.DOTALL)
        assert field is not None and field.group(1) == shown
        assert 'field-job_priority"' not in detail and "field-job_priority " not in detail

    def test_disable_enable_and_trigger(self, operator, schedule):
        url = "/admin/scheduler/cronschedule/"

        response = _act(operator, "disable_schedules", [schedule], url)
        assert "Disabled 1 schedule; 0 failed." in _messages(response)
        assert CronSchedule.objects.get(id=schedule.id).enabled is False

        _act(operator, "enable_schedules", [schedule], url)
        assert CronSchedule.objects.get(id=schedule.id).enabled is True

        response = _act(operator, "trigger_schedules", [schedule], url)
        assert "Triggered 1 schedule; 0 failed." in _messages(response)
        assert Job.objects.filter(schedule=schedule).count() == 1


class TestWorkersAndQueues:
    def test_workers_alive_or_gone_with_running_jobs(self, operator, user):
        now = timezone.now()
        common = {"hostname": "h", "pid": 1, "concurrency": 4, "pool": "threads", "started_at": now}
        WorkerNode.objects.create(id="live-1", last_heartbeat_at=now, busy_slots=1, **common)
        WorkerNode.objects.create(id="gone-1", last_heartbeat_at=now - dt.timedelta(hours=1), **common)
        JobFactory(owner=user, running=True, lease_owner="live-1")

        response = operator.get("/admin/scheduler/workernode/")
        rows = {w.id: w for w in response.context["cl"].result_list}

        assert rows["live-1"].is_alive and rows["live-1"].running == 1
        assert not rows["gone-1"].is_alive and rows["gone-1"].running == 0
        alive_only = operator.get("/admin/scheduler/workernode/", {"alive": "yes"}).context["cl"].result_list
        assert [w.id for w in alive_only] == ["live-1"]

    def test_each_worker_row_links_its_oldest_running_jobs_without_a_query_per_worker(self, operator, user):
        # Sidekiq's Busy page and Flower's workers name the jobs each worker runs, not only a count.
        now = timezone.now()
        common = {"hostname": "h", "pid": 1, "concurrency": 8, "pool": "threads", "started_at": now}
        ages = [dt.timedelta(hours=2, minutes=5, seconds=30), *(dt.timedelta(minutes=m) for m in (10, 5, 1, 0))]

        def worker_with_jobs(worker_id: str, job_type: str = "DEMO_TASK") -> list[Job]:
            WorkerNode.objects.create(id=worker_id, last_heartbeat_at=now, **common)
            return [
                JobFactory(owner=user, running=True, lease_owner=worker_id, type=job_type, started_at=now - age)
                for age in ages
            ]

        hostile = "<script>alert(1)</script>"
        first = worker_with_jobs("w/1 & <b>", job_type=hostile)
        WorkerNode.objects.create(id="idle", last_heartbeat_at=now, **common)
        url = "/admin/scheduler/workernode/"

        with CaptureQueriesContext(connection) as few:
            response = operator.get(url)
        html = response.content.decode()

        assert response.status_code == 200
        oldest = first[0]
        assert f'href="/admin/scheduler/job/{oldest.id}/change/"' in html
        assert re.search(
            rf'data-running-job="{oldest.id}">&lt;script&gt;alert\(1\)&lt;/script&gt; {short_job_id(oldest.id)}</a>, '
            r"<span [^>]*>2 h 5 min</span>",
            html,
        ), html
        assert hostile not in html
        shown = re.findall(r'data-running-job="([0-9a-f-]+)"', html)
        assert shown == [str(j.id) for j in first[:3]]  # oldest start first, at most three
        worker_page = reverse("admin:scheduler_workernode_change", args=[admin_quote("w/1 & <b>")])
        assert f'href="{worker_page}" data-running-more="2">and 2 more</a>' in html  # quoted as the admin does
        assert 'data-running-count="0"' in html  # the idle worker

        for n in range(6):
            worker_with_jobs(f"more-{n}")
        with CaptureQueriesContext(connection) as many:
            response = operator.get(url)

        assert len(re.findall(r'data-running-job="', response.content.decode())) == 7 * 3
        assert len(many.captured_queries) == len(few.captured_queries), [q["sql"] for q in many.captured_queries]

    def test_pause_and_resume_actions_go_through_the_service(self, operator, user):
        queue = queues.queue_resume(name="reports")
        JobFactory.create_batch(2, owner=user, queue="reports")
        url = "/admin/scheduler/queue/"

        response = _act(operator, "pause_queues", [queue], url)
        assert "Paused 1 queue: reports." in _messages(response)
        assert Queue.objects.get(name="reports").paused

        listed = operator.get(url).context["cl"].result_list
        assert [(q.name, q.queued_count) for q in listed] == [("reports", 2)]

        _act(operator, "resume_queues", [queue], url)
        assert not Queue.objects.get(name="reports").paused

    def test_pausing_selected_queues_warns_once_per_queue_nothing_uses(self, operator, user):
        # Every listed queue has a row, and a row counted as use: the bulk pause could never warn.
        used = queues.queue_resume(name="reports")
        JobFactory(owner=user, queue="reports", succeeded=True)
        typos = [queues.queue_resume(name="reprots"), queues.queue_resume(name="nightyl")]

        response = _act(operator, "pause_queues", [used, *typos], "/admin/scheduler/queue/")

        warnings = [str(m) for m in get_messages(response.wsgi_request) if m.level_tag == "warning"]
        assert len(warnings) == 2, warnings
        assert any("the queue 'reprots' yet: check the name." in w for w in warnings)
        assert any("the queue 'nightyl' yet: check the name." in w for w in warnings)
        assert not any("'reports'" in w for w in warnings)
        assert "Paused 3 queues: nightyl, reports, reprots." in _messages(response)
        resumed = _act(operator, "resume_queues", typos, "/admin/scheduler/queue/")
        assert sum("It is not paused." in m for m in _messages(resumed)) == 2

    def test_a_stored_queue_name_no_queue_could_have_is_named_escaped_not_a_500(self, operator):
        # A row written before names were checked (a trailing newline, markup): the pause refuses it.
        hostile = Queue.objects.create(name="<b>x</b>\n")
        fine = queues.queue_resume(name="fine")

        response = _act(operator, "pause_queues", [hostile, fine], "/admin/scheduler/queue/")

        assert response.status_code == 200
        html = response.content.decode()
        assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
        assert Queue.objects.get(name="fine").paused and not Queue.objects.get(pk=hostile.pk).paused


class TestEventsAndDashboard:
    def test_outbox_and_audit_lists_are_searchable_by_job_id(self, operator, user):
        job = enqueue("DEMO_TASK", {}, owner=user)
        enqueue("DEMO_TASK", {}, owner=user)
        AuditEvent.objects.create(
            event_id=uuid.uuid4(), job_id=job.id, event_type="JOB_CREATED", sequence=1, occurred_at=timezone.now()
        )

        outbox = operator.get("/admin/scheduler/outboxevent/", {"q": str(job.id)}).context["cl"].result_list
        audit = operator.get("/admin/audit/auditevent/", {"q": str(job.id)}).context["cl"].result_list

        assert {e.job_id for e in outbox} == {job.id} and len(outbox) == 2
        assert [e.job_id for e in audit] == [job.id]
        backlog = operator.get("/admin/scheduler/outboxevent/", {"published": "no"}).context["cl"].result_list
        assert len(backlog) == 4

    def test_the_dashboard_groups_the_last_hours_failures_by_type_and_error_class_with_links(self, operator, user):
        now = timezone.now()

        def failed(job_type: str, error: str, *, at: dt.datetime = now, status: str = AttemptStatus.FAILED):
            job = JobFactory(owner=user, dead=True, type=job_type, last_error=error)
            JobAttempt.objects.create(
                job=job, attempt_number=1, status=status, started_at=at, finished_at=at, error=error
            )
            return job

        timeouts = [failed("SYNC", f"TimeoutError: bank took {n} s") for n in (31, 45, 60)]
        failed("SYNC", "KeyError: 'customer'")
        failed("EMAIL", "SMTP down", status=AttemptStatus.TIMED_OUT)
        failed("EMAIL", 'Weird "quoted": class')
        failed("SYNC", "TimeoutError: an hour ago", at=now - dt.timedelta(minutes=61))

        html = operator.get("/admin/").content.decode()
        groups = re.findall(r'<li data-error-group="(\w+)"><strong>(\d+)</strong>', html)

        assert groups[0] == ("SYNC", "3")  # most first; the attempt of 61 minutes ago is not counted
        assert sorted(groups[1:]) == [("EMAIL", "1"), ("EMAIL", "1"), ("SYNC", "1")]
        link = "/admin/scheduler/job/?type=SYNC&amp;q=error%3ATimeoutError"
        assert f'<a href="{link}">SYNC: TimeoutError</a>' in html
        assert 'q=error%3A%22SMTP%20down%22">EMAIL: SMTP down</a>' in html  # quoted: it has a space
        assert "EMAIL: Weird &quot;quoted&quot;" in html  # no link: the search cannot quote a quote
        listed = operator.get("/admin/scheduler/job/", {"type": "SYNC", "q": "error:TimeoutError"})
        assert {j.id for j in listed.context["cl"].result_list} >= {j.id for j in timeouts}

    def test_a_dashboard_error_class_with_a_tab_links_to_a_quoted_search(self, operator, user):
        # Only a space made the link quote its class: "Bad\tInput" became error:Bad plus a plain
        # search for "Input", which also matched jobs by name.
        now = timezone.now()
        job = JobFactory(owner=user, dead=True, type="SYNC", last_error="Bad\tInput: row 7")
        JobAttempt.objects.create(
            job=job,
            attempt_number=1,
            status=AttemptStatus.FAILED,
            started_at=now,
            finished_at=now,
            error=job.last_error,
        )
        JobFactory(owner=user, dead=True, type="SYNC", name="Input sync", last_error="Bad gateway")

        html = operator.get("/admin/").content.decode()

        assert "q=error%3A%22Bad%09Input%22" in html
        listed = operator.get("/admin/scheduler/job/", {"type": "SYNC", "q": 'error:"Bad\tInput"'})
        assert [j.id for j in listed.context["cl"].result_list] == [job.id]

    def test_the_dashboard_says_when_nothing_failed_in_the_last_hour(self, operator):
        assert "No attempt failed in the last hour." in operator.get("/admin/").content.decode()

    def test_dashboard_on_the_index(self, operator, user):
        JobFactory.create_batch(2, owner=user, dead=True, last_error="boom")
        JobFactory(owner=user, scheduled_at=timezone.now() - dt.timedelta(minutes=5))
        done = JobFactory(owner=user, succeeded=True)
        JobAttempt.objects.create(
            job=done,
            attempt_number=1,
            status=AttemptStatus.SUCCEEDED,
            started_at=timezone.now(),
            finished_at=timezone.now(),
        )
        failed = JobFactory(owner=user, failed=True)
        JobAttempt.objects.create(
            job=failed,
            attempt_number=1,
            status=AttemptStatus.FAILED,
            started_at=timezone.now(),
            finished_at=timezone.now(),
        )
        LeaderFence.objects.create(role="cron", token=7, holder="host-a:123:abc")
        enqueue("DEMO_TASK", {}, owner=user)  # two unpublished outbox events
        now = timezone.now()
        WorkerNode.objects.create(
            id="w",
            hostname="h",
            pid=1,
            concurrency=4,
            busy_slots=3,
            pool="threads",
            started_at=now,
            last_heartbeat_at=now,
        )

        response = operator.get(reverse("admin:index"))
        html = response.content.decode()

        assert response.status_code == 200
        assert html.count("<h1") == 1
        assert '<span data-count-for="DEAD">2</span>' in html
        assert "Dead jobs needing attention" in html and "boom" in html
        assert "<svg" in html and "1 succeeded and 1 failed in the last hour" in html
        assert "token 7" in html and "host-a:123:abc" in html
        assert "1 live" in html and "3 of 4 slots busy" in html
        assert re.search(r'id="stint-outbox".*?<p class="stint-figure">2</p>', html, re.S)
        assert re.search(r'id="stint-oldest-queued".*?<p class="stint-figure">5 min', html, re.S)


@pytest.mark.django_db(transaction=True)
def test_the_leader_card_headlines_who_leads_and_since_when_with_the_token_in_the_detail(client, admin_user):
    from django_redis import get_redis_connection

    from scheduler import health
    from scheduler.leadership import DEFAULT_ROLE, lock_key

    LeaderFence.objects.create(role=DEFAULT_ROLE, token=42, holder="sched-1:4242:cafe")
    LeaderFence.objects.filter(role=DEFAULT_ROLE).update(updated_at=timezone.now() - dt.timedelta(hours=3))
    redis = get_redis_connection("default")
    client.force_login(admin_user)
    try:
        redis.set(lock_key(DEFAULT_ROLE), "sched-1:4242:cafe:42", ex=60)
        health.monitor.reset()
        card = _leader_card(client)
        assert re.search(r'class="stint-figure stint-leader-holder"[^>]*>sched-1:4242:cafe</p>', card)
        assert "leads since" in card and "(3 h 0 min)" in card  # the term's length, not a staleness
        assert re.search(r"leads since <time[^>]*>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</time>", card)  # with seconds
        assert "fenced write" not in card
        detail = card[card.index("<details>") :]
        assert "fencing token 42" in detail and "token 42" not in card[: card.index("<details>")]

        redis.delete(lock_key(DEFAULT_ROLE))  # the leader is gone: nobody holds the lock now
        health.monitor.reset()
        card = _leader_card(client)
        assert "nobody now" in card and "The last leader was sched-1:4242:cafe" in card
    finally:
        redis.delete(lock_key(DEFAULT_ROLE))
        health.monitor.reset()


def _leader_card(client) -> str:
    html = client.get(reverse("admin:index")).content.decode()
    start = html.index('id="stint-leader"')
    return html[start : html.index('class="stint-card"', start)]


@pytest.mark.parametrize(
    "url",
    [
        "/admin/scheduler/job/?queue=%00",
        "/admin/scheduler/job/?type__exact=a%00b",
        "/admin/scheduler/job/bulk/recover/?status__exact=%00",
        "/admin/scheduler/outboxevent/?event_type=%00",
        "/admin/audit/auditevent/?event_type=%00",
        "/admin/scheduler/workernode/?hostname=%00",
        "/admin/scheduler/cronschedule/?timezone=%00",
    ],
)
def test_a_nul_in_a_console_filter_is_a_400_not_a_500(operator, url):
    response = operator.get(url)
    assert response.status_code == 400
    assert "NUL" in response.content.decode()


def test_a_nul_in_a_console_bulk_post_is_a_400_and_changes_nothing(operator):
    job = JobFactory(status=JobStatus.QUEUED)
    response = operator.post("/admin/scheduler/job/bulk/cancel/?status__exact=%00", {"confirm": "yes"})
    assert response.status_code == 400
    assert _status(job) == JobStatus.QUEUED


@pytest.mark.parametrize("bad", ["not-a-uuid", "1", "\x00"])
@pytest.mark.parametrize("action", ["cancel_jobs", "retry_jobs", "recover_jobs"])
def test_an_action_on_a_selected_id_that_is_not_one_is_refused_with_a_message(operator, action, bad):
    job = JobFactory(status=JobStatus.QUEUED)
    response = operator.post(CHANGELIST, {"action": action, ACTION_CHECKBOX_NAME: [str(job.pk), bad], "index": 0})
    assert response.status_code in (302, 400)  # a NUL is refused by the request guard, the rest by the list
    if response.status_code == 302:
        assert "is not one" in " ".join(_messages(response))
    assert _status(job) == JobStatus.QUEUED


@pytest.mark.parametrize(
    "url",
    [
        "/admin/scheduler/job/?created_at__gte=2030-01-01T00:00:00%2B23:00",
        "/admin/scheduler/job/?finished_at__lt=2030-01-01%2000:00:00-16:00",
        "/admin/scheduler/job/bulk/cancel/?scheduled_at__gte=2030-01-01T00:00:00%2B16:00",
    ],
)
def test_a_console_time_filter_with_an_offset_postgresql_refuses_is_read_in_utc_not_a_500(operator, url):
    job = JobFactory(status=JobStatus.QUEUED)
    assert operator.get(url).status_code == 200
    response = operator.post(url.replace("/job/?", "/job/bulk/cancel/?"), {"confirm": "yes"})
    assert response.status_code in (200, 302)
    assert _status(job) == JobStatus.QUEUED  # its times are all before 2030


TEXT_KEYED = ("/admin/scheduler/queue/", "/admin/scheduler/workernode/")


@pytest.mark.parametrize("page", ["change", "history", "delete"])
@pytest.mark.parametrize("key", ["%00", "a%00b"])
@pytest.mark.parametrize("base", TEXT_KEYED)
def test_a_nul_in_a_text_primary_key_is_an_unknown_object_not_a_500(operator, base, key, page):
    queues.queue_pause(name="a")  # a row whose key is close to the one asked for

    response = operator.get(f"{base}{key}/{page}/")

    unknown = operator.get(f"{base}no-such-key/{page}/")
    assert unknown.status_code in (302, 403)  # the admin's "doesn't exist" redirect; no delete permission
    assert response.status_code == unknown.status_code
    assert response.get("Location") == unknown.get("Location")


def test_a_lone_surrogate_or_nul_in_a_text_primary_key_is_no_object(rf, admin_user):
    text_keyed = [a for m, a in site._registry.items() if isinstance(m._meta.pk, CharField | TextField)]
    assert {a.model for a in text_keyed} >= {Queue, WorkerNode}
    request = rf.get("/")
    request.user = admin_user

    for model_admin in text_keyed:
        for key in ("\ud800", "a\udfffb", "\x00"):
            assert model_admin.get_object(request, key) is None, (model_admin, key)


def test_an_action_on_a_selected_text_key_with_a_nul_is_refused_with_a_message(operator):
    queues.queue_pause(name="a")
    # A multipart form (the test client's default), which the query-string guard does not read.
    response = operator.post(
        "/admin/scheduler/queue/", {"action": "resume_queues", ACTION_CHECKBOX_NAME: ["a", "a\x00"], "index": 0}
    )
    assert response.status_code == 302
    assert "is not one" in " ".join(_messages(response))
    assert Queue.objects.get(name="a").paused


@pytest.mark.parametrize(
    "url",
    [
        "/admin/scheduler/job/?created_at__year=-1",
        "/admin/scheduler/job/?created_at__year=20260101",
        "/admin/scheduler/job/?finished_at__iso_year=0",
        "/admin/scheduler/job/?scheduled_at__date__year=-1",
        "/admin/scheduler/job/?created_at__year__gt=99999999999999999999",
        "/admin/scheduler/cronschedule/?next_fire_at__year=-1",
        "/admin/scheduler/outboxevent/?occurred_at__year=20260101",
        "/admin/audit/auditevent/?occurred_at__year=-1",
        "/admin/scheduler/queue/?created_at__year__lte=10000",
        "/admin/scheduler/workernode/?started_at__year=0",
        "/admin/scheduler/job/?name__regex=(",  # PostgreSQL refuses the pattern (DataError)
        "/admin/scheduler/queue/?name__iregex=[",
    ],
)
def test_a_filter_value_that_cannot_be_queried_is_the_admins_bad_filter_page_not_a_500(operator, url):
    JobFactory()

    response = operator.get(url)

    assert response.status_code == 302
    assert response["Location"] == f"{url.split('?')[0]}?e=1"  # Django's answer to an invalid lookup
    assert operator.get(response["Location"]).status_code == 200


@pytest.mark.parametrize("method", ["get", "post"])
def test_an_out_of_range_year_on_the_bulk_page_goes_back_and_changes_nothing(operator, method):
    job = JobFactory()

    response = getattr(operator, method)("/admin/scheduler/job/bulk/cancel/?created_at__year=-1", follow=True)

    assert response.status_code == 200
    assert "Those filters are not valid." in _messages(response)
    assert _status(job) == JobStatus.QUEUED
