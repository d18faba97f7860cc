"""Enqueue (``enqueuing``) and its validation (``jobspec``), enqueue_many; cancel/retry/recover (``job_actions``)."""

from __future__ import annotations

import datetime as dt
import sys
import uuid

import pytest
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.db.models.signals import post_init
from django.forms.models import model_to_dict
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import scheduler
from scheduler import enqueuing, job_actions
from scheduler.exceptions import IllegalTransition, InvalidJob, JobNotFound, PayloadTooLarge, UnknownJobType
from scheduler.models import Job, OutboxBatch, OutboxEvent, Queue
from scheduler.registry import handler
from scheduler.states import EventType, JobStatus, Priority
from tests.support.factories import JobFactory
from tests.support.notify import listener, notifications, raw_notifications  # noqa: F401 - a fixture and its readers

pytestmark = pytest.mark.django_db


@handler("TEST_SERVICES_DEFAULTS", max_retries=7, timeout_seconds=42)
def _with_defaults(payload, ctx):
    return None


def _events(job_id) -> list[tuple[int, str, str, str]]:
    return list(
        OutboxEvent.objects.filter(job_id=job_id)
        .order_by("sequence")
        .values_list("sequence", "event_type", "from_status", "to_status")
    )


# --- enqueue ----------------------------------------------------------------------------------


def test_enqueue_now_is_queued_with_created_and_queued_events(user):
    job = scheduler.enqueue("DEMO_TASK", {"result": 1}, owner=user)

    assert (job.status, job.owner_id, job.payload, job.event_sequence) == (JobStatus.QUEUED, user.pk, {"result": 1}, 2)
    assert (job.priority, job.queue, job.max_retries, job.timeout_seconds) == (Priority.MEDIUM, "default", 3, 300)
    assert _events(job.id) == [
        (1, EventType.JOB_CREATED, "", JobStatus.CREATED),
        (2, EventType.JOB_QUEUED, JobStatus.CREATED, JobStatus.QUEUED),
    ]
    assert Queue.objects.filter(name="default").exists()


def test_enqueue_is_one_statement_and_returns_the_job_as_stored(user):
    with CaptureQueriesContext(connection) as queries:
        job = scheduler.enqueue("DEMO_TASK", {"result": [1, "é"]}, owner=user, queue="fresh", name="n")

    assert len(queries) == 1  # queue row, job, its two events and the NOTIFY: no read-back
    assert job.get_deferred_fields() == set()  # every column already held: none is read back when used
    assert (job._state.adding, job._state.db) == (False, "default")  # as a model read from the database
    stored = Job.objects.get(id=job.id)
    assert model_to_dict(job) == model_to_dict(stored)
    columns = [f.attname for f in Job._meta.concrete_fields]
    assert {c: getattr(job, c) for c in columns} == {c: getattr(stored, c) for c in columns}
    assert (job.created_at, job.updated_at, job.scheduled_at) == (
        stored.created_at,
        stored.updated_at,
        stored.scheduled_at,
    )
    assert Queue.objects.filter(name="fresh").exists()
    job.name = "renamed"
    job.save(update_fields=["name"])  # a usable model instance, known to be in the database
    assert Job.objects.get(id=job.id).name == "renamed"


def test_the_returned_job_is_heard_by_init_signals_as_every_model_instance_is(user):
    heard = []

    def receiver(sender, instance, **kwargs):
        heard.append((instance.id, instance.status, instance.payload))

    post_init.connect(receiver, sender=Job)
    try:
        job = scheduler.enqueue("DEMO_TASK", {"result": 2}, owner=user)
    finally:
        post_init.disconnect(receiver, sender=Job)

    assert heard == [(job.id, JobStatus.QUEUED, {"result": 2})]
    assert model_to_dict(job) == model_to_dict(Job.objects.get(id=job.id))
    assert (job._state.adding, job._state.db) == (False, "default")


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_autocommit_is_one_round_trip_and_notifies_at_its_commit(listener):  # noqa: F811
    with CaptureQueriesContext(connection) as queries:
        job = scheduler.enqueue("DEMO_TASK", queue="a")
    assert len(queries) == 1  # no BEGIN/COMMIT around it: the statement is its own transaction
    assert notifications(listener) == ["a"]
    assert Job.objects.get(id=job.id).status == JobStatus.QUEUED

    later = timezone.now() + dt.timedelta(hours=1)
    scheduler.enqueue("DEMO_TASK", queue="a", scheduled_at=later)
    assert notifications(listener) == []  # a SCHEDULED job wakes no worker


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_a_callers_transaction_notifies_only_when_it_commits(listener):  # noqa: F811
    with pytest.raises(RuntimeError), transaction.atomic():
        scheduler.enqueue("DEMO_TASK", queue="gone")
        raise RuntimeError("caller rolls back")
    assert notifications(listener) == []
    assert not Job.objects.exists()

    with transaction.atomic():
        first = scheduler.enqueue("DEMO_TASK", queue="b")
        second = scheduler.enqueue("DEMO_TASK", queue="c")
        assert Job.objects.filter(id__in=[first.id, second.id]).count() == 2
    assert notifications(listener) == ["b", "c"]


@pytest.mark.django_db(transaction=True)
def test_a_notify_names_its_transaction_first_so_that_workers_can_tell_notifies_apart(listener):  # noqa: F811
    scheduler.enqueue("DEMO_TASK", queue="a")
    scheduler.enqueue("DEMO_TASK", queue="a")
    with transaction.atomic():
        scheduler.enqueue("DEMO_TASK", queue="b")
        scheduler.enqueue("DEMO_TASK", queue="c")
    enqueuing.enqueue_many([{"type": "DEMO_TASK", "queue": "e"}, {"type": "DEMO_TASK", "queue": "d"}])
    payloads = raw_notifications(listener)

    heads = [p.split(",", 1)[0] for p in payloads]
    assert [p.split(",", 1)[1] for p in payloads] == ["a", "a", "b", "c", "d,e"]
    assert all(h.startswith("#") and h[1:].isdigit() for h in heads), payloads
    # One token per transaction: the two autocommit enqueues differ, the atomic block's two share one.
    assert len({heads[0], heads[1], heads[2], heads[4]}) == 4
    assert heads[2] == heads[3]


def test_a_queue_row_exists_exactly_when_a_job_naming_it_committed():
    # A caller's transaction that rolls back takes the queue row with it; the next enqueue makes it.
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueuing.enqueue("DEMO_TASK", queue="ephemeral")
        raise RuntimeError("caller rolls back")
    assert not Queue.objects.filter(name="ephemeral").exists()
    enqueuing.enqueue("DEMO_TASK", queue="ephemeral")
    assert Queue.objects.filter(name="ephemeral").exists()


def test_enqueue_later_is_scheduled(user):
    when = timezone.now() + dt.timedelta(minutes=5)
    job = enqueuing.enqueue("DEMO_TASK", owner=user, scheduled_at=when)
    assert (job.status, job.scheduled_at) == (JobStatus.SCHEDULED, when)
    assert _events(job.id)[-1][1:] == (EventType.JOB_SCHEDULED, JobStatus.CREATED, JobStatus.SCHEDULED)


def test_enqueue_takes_the_handlers_defaults_then_the_callers(user):
    defaulted = enqueuing.enqueue("TEST_SERVICES_DEFAULTS", owner=user)
    assert (defaulted.max_retries, defaulted.timeout_seconds) == (7, 42)
    chosen = enqueuing.enqueue("TEST_SERVICES_DEFAULTS", owner=user, max_retries=1, timeout_seconds=3600)
    assert (chosen.max_retries, chosen.timeout_seconds) == (1, 3600)


@pytest.mark.parametrize("priority", ["HIGH", Priority.HIGH, 50])
def test_enqueue_accepts_a_priority_by_name_member_or_value(priority):
    assert enqueuing.enqueue("DEMO_TASK", priority=priority).priority == Priority.HIGH


@pytest.mark.parametrize("priority", [-100, -1, 37, 100])
def test_enqueue_accepts_any_whole_priority_in_range_and_reads_it_back_as_its_integer(priority):
    job = enqueuing.enqueue("DEMO_TASK", priority=priority)
    assert (job.priority, job.priority_name) == (priority, str(priority))


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_retries": 0}, "max_retries"),
        ({"max_retries": 11}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"max_retries": "3"}, "max_retries"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
        ({"timeout_seconds": 3601}, "timeout_seconds"),
        ({"timeout_seconds": False}, "timeout_seconds"),
        ({"queue": "no spaces"}, "queue"),
        ({"queue": ""}, "queue"),
        ({"scheduled_at": dt.datetime(2099, 1, 1)}, "scheduled_at"),  # naive
        ({"scheduled_at": "2099-01-01T00:00:00Z"}, "scheduled_at"),
        ({"name": "n" * 201}, "name"),
        ({"priority": "URGENT"}, "priority"),
        ({"priority": 101}, "priority"),
        ({"priority": -101}, "priority"),
        ({"priority": 2.5}, "priority"),
        ({"priority": True}, "priority"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": "k" * 256}, "idempotency_key"),
        ({"idempotency_key": "tab\tkey"}, "idempotency_key"),
        ({"idempotency_key": "ключ"}, "idempotency_key"),
        ({"idempotency_key": "needs-an-owner", "owner": None}, "idempotency_key"),
    ],
)
def test_enqueue_refuses_invalid_options(user, options, field):
    options = {"owner": user, **options}
    with pytest.raises(InvalidJob) as caught:
        enqueuing.enqueue("DEMO_TASK", **options)
    assert field in caught.value.details
    assert not Job.objects.exists()


def test_enqueue_refuses_an_unknown_type():
    with pytest.raises(UnknownJobType):
        enqueuing.enqueue("NOT_REGISTERED")


def test_enqueue_refuses_a_payload_that_is_not_json():
    with pytest.raises(InvalidJob):
        enqueuing.enqueue("DEMO_TASK", {"when": object()})
    with pytest.raises(InvalidJob):
        enqueuing.enqueue("DEMO_TASK", {"x": float("nan")})


def _nested(levels: int) -> object:
    value: object = 1
    for level in range(levels):
        value = [value] if level % 2 else {"k": value}
    return value


# The validation's quick checks (jobspec.payload_json) read the encoded text: U+0000 shows as the
# escape \u0000, and a level opens with [ or {. Text that only looks like them must still pass.
@pytest.mark.parametrize(
    "payload",
    [
        {"text": "\\u0000 written out"},  # a backslash, then "u0000": no NUL
        {"text": "\\\\u0000"},  # two backslashes, then "u0000"
        {"[": "{" * 40, "list": ["[" * 40]},  # brackets inside strings are no nesting
        _nested(32),
        {"é": ["ü ✓", "日本"]},
    ],
    ids=["escaped-backslash", "two-backslashes", "brackets-in-strings", "32-levels", "non-ascii"],
)
def test_enqueue_stores_a_payload_that_only_looks_like_a_fault(payload):
    job = enqueuing.enqueue("DEMO_TASK", payload)
    assert job.payload == payload
    assert Job.objects.get(id=job.id).payload == payload


@pytest.mark.parametrize(
    ("payload", "field_message"),
    [
        (_nested(33), "At most 32 levels of nesting."),
        ({"a": [{"k\x00": 1}]}, "Must not contain U+0000."),
        ({"a": ["x", ["y\x00"]]}, "Must not contain U+0000."),
        ({"text": "\\\x00"}, "Must not contain U+0000."),  # a backslash before the NUL
        ({"a": "\ud800"}, "lone"),
    ],
    ids=["33-levels", "nul-in-a-key", "nul-in-a-nested-value", "nul-after-a-backslash", "lone-surrogate"],
)
def test_enqueue_refuses_a_payload_postgresql_cannot_store_or_too_deep(payload, field_message):
    with pytest.raises(InvalidJob) as raised:
        enqueuing.enqueue("DEMO_TASK", payload)
    assert field_message in raised.value.details["payload"][0]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("payload", "refused"),
    [
        ({"n": [10**4300]}, True),  # 4,301 digits
        ({"n": [-(10**4299)]}, False),  # 4,300 digits
        ({"digits": "1" * 5000}, False),  # text, not a number
    ],
    ids=["4301-digits", "4300-digits", "a-string-of-digits"],
)
def test_enqueue_refuses_an_integer_no_worker_could_read_even_from_a_process_that_lifted_the_limit(payload, refused):
    # A process that had lifted Python's digit limit (sys.set_int_max_str_digits(0): a handler, a
    # project's start-up) stored it; every worker keeping the default then died on claiming the job,
    # costing each job claimed beside it an attempt, until the job was dead-lettered.
    default = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        if refused:
            with pytest.raises(InvalidJob) as raised:
                enqueuing.enqueue("DEMO_TASK", payload)
        else:
            job = enqueuing.enqueue("DEMO_TASK", payload)
    finally:
        sys.set_int_max_str_digits(default)

    if refused:
        assert raised.value.details == {"payload": ["No integer of more than 4300 digits."]}
        assert not Job.objects.exists()
    else:
        assert Job.objects.get(id=job.id).payload == payload


def test_enqueue_refuses_nesting_by_tuples_and_beyond_the_encoders_stack_as_too_deep():
    by_tuples: object = 1
    for _ in range(40):
        by_tuples = (by_tuples,)  # json.dumps writes a tuple as an array: 40 levels
    by_thousands: object = 1
    for _ in range(5000):
        by_thousands = [by_thousands]  # deeper than json.dumps' recursion can go
    for payload in (by_tuples, by_thousands):
        with pytest.raises(InvalidJob) as raised:
            enqueuing.enqueue("DEMO_TASK", payload)
        assert raised.value.details == {"payload": ["At most 32 levels of nesting."]}
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("payload", "stored"),
    [
        ({1: "a", 2: "b"}, {"1": "a", "2": "b"}),
        ({1: "a", "1": "b"}, {"1": "b"}),  # one key once written as JSON: the last wins, as in jsonb
        ({True: 1, None: 2, 1.5: 3}, {"true": 1, "null": 2, "1.5": 3}),
        (("a", 1), ["a", 1]),
        ({"nested": ({2: [()]},)}, {"nested": [{"2": [[]]}]}),
    ],
    ids=["int-keys", "colliding-keys", "other-scalar-keys", "tuple", "nested"],
)
def test_enqueue_returns_the_payload_as_stored_in_json(user, payload, stored):
    job = enqueuing.enqueue("DEMO_TASK", payload)
    assert job.payload == stored == Job.objects.get(id=job.id).payload
    # Keys that JSON makes strings hash and sort as strings: idempotency and unique keys work.
    replay = enqueuing.enqueue_request("DEMO_TASK", payload, owner=user, idempotency_key="k")
    assert enqueuing.enqueue_request("DEMO_TASK", stored, owner=user, idempotency_key="k").job.id == replay.job.id
    unique = enqueuing.enqueue_request("DEMO_TASK", payload, unique={})
    assert enqueuing.enqueue_request("DEMO_TASK", payload, unique={}).job.id == unique.job.id


def test_the_returned_job_shares_no_object_with_the_caller():
    payload = {"items": [1, 2]}
    job = enqueuing.enqueue("DEMO_TASK", payload)
    payload["items"].append(3)
    assert job.payload == {"items": [1, 2]} == Job.objects.get(id=job.id).payload


def test_enqueue_refuses_a_time_past_year_9999_in_utc():
    late = dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.timezone(dt.timedelta(hours=-5)))  # 10000-01-01 in UTC
    with pytest.raises(InvalidJob) as raised:
        enqueuing.enqueue("DEMO_TASK", scheduled_at=late)
    assert raised.value.details == {"scheduled_at": ["Must be from 0001-01-01 to 9999-12-31 23:59:59 in UTC."]}
    latest = dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.UTC)
    assert enqueuing.enqueue("DEMO_TASK", scheduled_at=latest).scheduled_at == latest


def test_enqueue_refuses_a_time_before_year_1_in_utc_with_the_same_message():
    early = dt.datetime(1, 1, 1, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=5)))  # year 0 in UTC
    with pytest.raises(InvalidJob) as raised:
        enqueuing.enqueue("DEMO_TASK", scheduled_at=early)
    assert raised.value.details == {"scheduled_at": ["Must be from 0001-01-01 to 9999-12-31 23:59:59 in UTC."]}


def test_enqueue_many_takes_a_generator():
    ids = enqueuing.enqueue_many({"type": "DEMO_TASK", "payload": {"n": n}} for n in range(3))
    assert sorted(Job.objects.filter(id__in=ids).values_list("payload__n", flat=True)) == [0, 1, 2]


def test_enqueue_many_returns_the_ids_in_the_order_of_its_items():
    # Mixed queues, priorities and due times: the statement's RETURNING order is not the items'.
    later = timezone.now() + dt.timedelta(hours=1)
    items = [
        {"type": "DEMO_TASK", "payload": {"n": n}, "queue": f"q{n % 3}", "priority": ("LOW", "HIGH")[n % 2]}
        | ({"scheduled_at": later} if n % 4 == 0 else {})
        for n in range(40)
    ]
    ids = enqueuing.enqueue_many(items)
    by_id = dict(Job.objects.filter(id__in=ids).values_list("id", "payload__n"))
    assert [by_id[i] for i in ids] == list(range(40))


@pytest.mark.parametrize(
    "item",
    [{}, "DEMO_TASK", None, {"type": "DEMO_TASK", "bogus": 1}, {"type": "DEMO_TASK", "idempotency_key": "k"}],
    ids=["no-type", "a-string", "none", "unknown-field", "idempotency-key"],
)
def test_enqueue_many_refuses_an_item_that_is_not_a_job(item):
    with pytest.raises(InvalidJob) as raised:
        enqueuing.enqueue_many([{"type": "DEMO_TASK"}, item])
    assert list(raised.value.details) == ["jobs[1]"]
    assert not Job.objects.exists()  # the valid one beside it is not inserted either


def test_enqueue_payload_limit_is_10kb_of_compact_utf8(settings):
    enqueuing.enqueue("DEMO_TASK", {"x": "a" * (10 * 1024 - 8)})
    with pytest.raises(PayloadTooLarge):
        enqueuing.enqueue("DEMO_TASK", {"x": "a" * (10 * 1024 - 7)})
    settings.SCHEDULER = {**settings.SCHEDULER, "MAX_PAYLOAD_BYTES": 100}
    with pytest.raises(PayloadTooLarge):
        enqueuing.enqueue("DEMO_TASK", {"x": "a" * 100})


def test_enqueue_many_inserts_every_job_in_one_statement_with_its_events(user):
    later = timezone.now() + dt.timedelta(hours=1)
    ids = enqueuing.enqueue_many(
        [
            {"type": "DEMO_TASK"},
            {"type": "REPORT", "priority": "LOW", "queue": "reports", "scheduled_at": later},
            {"type": "DEMO_TASK", "payload": []},
        ],
        owner=user,
    )

    jobs = {j.id: j for j in Job.objects.filter(id__in=ids)}
    assert [jobs[i].status for i in ids] == [JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.QUEUED]
    assert jobs[ids[2]].payload == []  # an empty list is a payload, not "no payload"
    assert len({j.created_at for j in jobs.values()}) == 1
    assert all(len(_events(i)) == 2 for i in ids)


@pytest.mark.parametrize("count", [1, 3])
def test_one_or_many_jobs_write_one_outbox_row_with_each_jobs_two_events_in_order(user, count):
    later = timezone.now() + dt.timedelta(hours=1)
    specs = [{"type": "DEMO_TASK", "scheduled_at": later if i == 1 else None} for i in range(count)]
    if count == 1:  # the single-job statement (scalar parameters) ...
        ids = [scheduler.enqueue("DEMO_TASK", owner=user).id]
    else:  # ... and the batch one (arrays) write the same row shape
        ids = enqueuing.enqueue_many(specs, owner=user)

    (row,) = OutboxBatch.objects.all()
    events = row.entries()
    assert row.event_count == len(events) == 2 * count
    pairs = [events[i : i + 2] for i in range(0, len(events), 2)]
    assert sorted(first["job_id"] for first, _ in pairs) == sorted(str(i) for i in ids)
    for first, second in pairs:  # a job's events stay together, in sequence order
        assert first["job_id"] == second["job_id"]
        assert (first["sequence"], first["event_type"], first["from_status"], first["to_status"]) == (
            1,
            EventType.JOB_CREATED,
            "",
            JobStatus.CREATED,
        )
        status = Job.objects.get(id=second["job_id"]).status
        event = EventType.JOB_QUEUED if status == JobStatus.QUEUED else EventType.JOB_SCHEDULED
        assert (second["sequence"], second["event_type"], second["from_status"], second["to_status"]) == (
            2,
            event,
            JobStatus.CREATED,
            status,
        )
        assert first["owner_id"] == second["owner_id"] == user.pk
        assert first["payload"] == second["payload"] == {"type": "DEMO_TASK", "queue": "default", "priority": "MEDIUM"}
        assert first["event_id"] != second["event_id"]


def test_the_package_api_enqueues_one_or_many(user):
    import scheduler

    one = scheduler.enqueue("DEMO_TASK", {"n": 1}, owner=user)
    many = scheduler.enqueue_many([{"type": "DEMO_TASK"}, {"type": "REPORT"}], owner=user)

    assert one.status == JobStatus.QUEUED
    assert set(Job.objects.filter(owner=user).values_list("id", flat=True)) == {one.id, *many}


def test_enqueue_many_is_all_or_nothing():
    with pytest.raises(InvalidJob):
        enqueuing.enqueue_many([{"type": "DEMO_TASK"}, {"type": "DEMO_TASK", "max_retries": 0}])
    assert not Job.objects.exists()


# --- cancel, retry, recover -------------------------------------------------------------------


@pytest.mark.parametrize("trait", ["queued", "scheduled"])
def test_cancel_moves_a_waiting_job_to_cancelled(user, trait):
    job = JobFactory(owner=user, **({} if trait == "queued" else {trait: True}))
    cancelled = job_actions.job_cancel(job_id=job.id, actor=user)
    assert cancelled.status == JobStatus.CANCELLED
    assert cancelled.finished_at is not None
    assert _events(job.id)[-1][1] == EventType.JOB_CANCELLED


def test_cancel_of_a_running_job_only_requests_it(user):
    job = JobFactory(owner=user, running=True)
    after = job_actions.job_cancel(job_id=job.id, actor=user)
    assert (after.status, after.cancel_requested) == (JobStatus.RUNNING, True)
    assert _events(job.id) == []


@pytest.mark.parametrize("trait", ["succeeded", "failed", "dead", "cancelled"])
def test_cancel_of_a_finished_job_is_illegal(user, trait):
    job = JobFactory(owner=user, **{trait: True})
    with pytest.raises(IllegalTransition) as caught:
        job_actions.job_cancel(job_id=job.id)
    assert caught.value.details == {"status": job.status}


def test_retry_gives_a_fresh_budget_and_clears_a_stale_cancel_request(user):
    job = JobFactory(owner=user, failed=True, attempts=4, max_retries=3, cancel_requested=True)
    assert Job.objects.get(id=job.id).attempts_left == 0

    retried = job_actions.job_retry(job_id=job.id, actor=user)

    assert (retried.status, retried.attempts_base, retried.attempts_left) == (JobStatus.RETRYING, 4, 4)
    assert (retried.cancel_requested, retried.finished_at) == (False, None)
    assert retried.scheduled_at <= timezone.now()
    event = OutboxEvent.objects.get(job_id=job.id, event_type=EventType.JOB_RETRIED)
    assert event.payload["reason"] == "manual_retry"


def test_recover_puts_a_dead_job_back_on_its_queue(admin_user):
    job = JobFactory(dead=True, attempts=4, queue="q1", cancel_requested=True)
    recovered = job_actions.job_recover(job_id=job.id, actor=admin_user)
    assert (recovered.status, recovered.attempts_left, recovered.cancel_requested) == (JobStatus.QUEUED, 4, False)
    assert _events(job.id)[-1][1:] == (EventType.JOB_RECOVERED, JobStatus.DEAD, JobStatus.QUEUED)


@pytest.mark.parametrize("action", [job_actions.job_cancel, job_actions.job_retry, job_actions.job_recover])
def test_actions_on_a_missing_job_raise_not_found(action):
    with pytest.raises(JobNotFound):
        action(job_id=uuid.uuid4())


@pytest.mark.parametrize(
    ("action", "trait"),
    [(job_actions.job_cancel, "queued"), (job_actions.job_retry, "failed"), (job_actions.job_recover, "dead")],
)
def test_actions_on_another_users_job_raise_not_found_and_change_nothing(user, other_user, action, trait):
    job = JobFactory(owner=user, **({} if trait == "queued" else {trait: True}))
    before = Job.objects.filter(id=job.id).values().get()
    with pytest.raises(JobNotFound):
        action(job_id=job.id, actor=other_user)
    assert Job.objects.filter(id=job.id).values().get() == before


def test_recover_by_the_owning_user_is_forbidden(user):
    job = JobFactory(owner=user, dead=True)
    with pytest.raises(PermissionDenied):
        job_actions.job_recover(job_id=job.id, actor=user)
    assert Job.objects.get(id=job.id).status == JobStatus.DEAD


def test_a_trusted_caller_needs_no_actor():
    # The admin site, commands and Python code call without an actor.
    job = JobFactory(dead=True)
    assert job_actions.job_recover(job_id=job.id).status == JobStatus.QUEUED
    assert job_actions.job_cancel(job_id=job.id).status == JobStatus.CANCELLED
