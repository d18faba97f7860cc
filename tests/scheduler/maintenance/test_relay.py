"""The outbox relay and pruner against a real Kafka-compatible broker (Tansu) and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka.admin import AdminClient
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from audit.consumer import AuditConsumer
from audit.models import AuditEvent
from scheduler import lifecycle, metrics
from scheduler.enqueuing import enqueue, enqueue_many
from scheduler.events import LifecycleEvent, outbox_message
from scheduler.job_actions import job_cancel
from scheduler.kafka import ensure_topic
from scheduler.maintenance.outbox_pruner import OutboxPruner
from scheduler.maintenance.relay import OutboxRelay
from scheduler.models import OutboxBatch, OutboxEvent
from scheduler.states import JobStatus
from tests.support import kafka as kafka_support
from tests.support.clock import FakeClock
from tests.support.factories import outbox_row
from tests.support.kafka import (
    ROOT,
    Broker,
    consume_all,
    subprocess_env,
    topic_messages,
    unique_topic,
    wait_for,
)
from tests.support.net import free_port

# Real-Kafka fixtures (tests/support/kafka.py): one session consumer, one topic per test.
audit_pool = kafka_support.audit_pool
kafka_topic = kafka_support.kafka_topic
fresh_topic = kafka_support.fresh_topic
private_broker = kafka_support.private_broker

PAUSE_SECONDS = 5.0  # broker SIGSTOP in the suite; bench/outbox_pause.py does 30 s


def unpublished() -> int:
    return OutboxEvent.objects.filter(published_at__isnull=True).count()


def audit_of_this_test():
    """Audit rows of this test's jobs (the session consumer may also store other tests' leftovers)."""
    return AuditEvent.objects.filter(job_id__in=OutboxEvent.objects.values("job_id"))


def assert_audit_equals_outbox() -> None:
    """Every outbox event is in the audit table exactly once, with the same fields, and nothing else."""
    outbox = {e.event_id: e for e in OutboxEvent.objects.all()}
    audit = list(audit_of_this_test())
    assert len(audit) == len({a.event_id for a in audit}) == len(outbox)
    for a in audit:
        o = outbox[a.event_id]
        assert (a.job_id, a.event_type, a.owner_id, a.sequence, a.attempt) == (
            o.job_id,
            o.event_type,
            o.owner_id,
            o.sequence,
            o.attempt,
        )
        assert (a.from_status, a.to_status, a.occurred_at, a.payload) == (
            o.from_status,
            o.to_status,
            o.occurred_at,
            o.payload,
        )


def assert_gapless_trails() -> None:
    sequences: dict[uuid.UUID, list[int]] = defaultdict(list)
    for job_id, sequence in audit_of_this_test().values_list("job_id", "sequence"):
        sequences[job_id].append(sequence)
    for job_id, seen in sequences.items():
        assert sorted(seen) == list(range(1, len(seen) + 1)), job_id


# -- documents and topics ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("occurred_at", "text"),
    [
        (dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC), "2026-01-02T03:04:05.678000Z"),
        (dt.datetime(2026, 1, 2, 4, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=1))), "2026-01-02T03:04:05Z"),
    ],
)
def test_outbox_message_is_the_documented_json_shape(db, occurred_at, text):
    event_id, job_id = uuid.uuid4(), uuid.uuid4()
    row = outbox_row(
        {"event_type": "JOB_QUEUED", "job_id": uuid.uuid4(), "sequence": 2, "to_status": "QUEUED"},
        {
            "event_id": event_id,
            "event_type": "JOB_CREATED",
            "job_id": job_id,
            "owner_id": 7,
            "sequence": 1,
            "attempt": 0,
            "from_status": "",
            "to_status": "CREATED",
            "payload": {"type": "DEMO_TASK", "queue": "default", "priority": 1, "note": "caf\u00e9"},
        },
        occurred_at=occurred_at,
    )

    value, key, event_type = outbox_message(outbox_id=row.id, position=2)

    assert (key, event_type) == (str(job_id), "JOB_CREATED")
    assert json.loads(value) == {
        "schema_version": 1,
        "event_id": str(event_id),
        "event_type": "JOB_CREATED",
        "job_id": str(job_id),
        "owner_id": 7,
        "sequence": 1,
        "attempt": 0,
        "from_status": None,
        "to_status": "CREATED",
        "occurred_at": text,
        "payload": {"type": "DEMO_TASK", "queue": "default", "priority": 1, "note": "caf\u00e9"},
    }
    assert list(json.loads(value)) == list(LifecycleEvent.__annotations__)


def test_ensure_topic_creates_the_missing_topic_with_the_configured_partitions(db, settings):
    topic = unique_topic()
    assert ensure_topic(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, topic=topic, partitions=3) is True

    admin = AdminClient({"bootstrap.servers": settings.KAFKA_BOOTSTRAP_SERVERS})
    assert len(admin.list_topics(timeout=10).topics[topic].partitions) == 3
    again = ensure_topic(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, topic=topic, partitions=3)
    assert again is False


def test_create_topics_provisions_the_configured_topic_once(db, settings, capsys):
    settings.KAFKA_TOPIC = topic = unique_topic()
    settings.KAFKA_TOPIC_PARTITIONS = 2
    call_command("create_topics")
    call_command("create_topics")
    assert capsys.readouterr().out.splitlines() == [f"topic {topic}: created", f"topic {topic}: exists"]
    admin = AdminClient({"bootstrap.servers": settings.KAFKA_BOOTSTRAP_SERVERS})
    assert len(admin.list_topics(timeout=10).topics[topic].partitions) == 2


def test_create_topics_says_why_when_the_broker_is_unreachable(db, settings):
    settings.KAFKA_BOOTSTRAP_SERVERS = f"127.0.0.1:{free_port()}"
    with pytest.raises(CommandError, match="could not create topic"):
        call_command("create_topics", "--timeout", "0.5")


def test_relay_never_creates_a_missing_topic_it_alerts_and_backs_off(db, settings):
    """A lost topic re-created empty would hide the events it held (chaos finding F7): the relay only waits.

    Its rows stay unpublished, ``outbox_topic_missing`` says why, the relay backs off; once the
    operator provisioned the topic (``manage.py create_topics``) it publishes them.
    """
    topic = unique_topic()
    clock = FakeClock()
    relay = OutboxRelay(topic=topic, clock=clock)
    enqueue("DEMO_TASK")
    admin = AdminClient({"bootstrap.servers": settings.KAFKA_BOOTSTRAP_SERVERS})
    try:
        assert relay.run_once() == 0
        assert relay.run_once() == 0  # backing off
        clock.advance(10)
        assert relay.run_once() == 0
        assert relay.failures == 2 and relay.retry_at is not None
        assert unpublished() == 2
        assert metrics.outbox_topic_missing._value.get() == 1
        assert topic not in admin.list_topics(timeout=10).topics  # neither created by us nor by the broker

        ensure_topic(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS, topic=topic, partitions=2)
        clock.advance(10)
        assert relay.run_once() == 2
        assert metrics.outbox_topic_missing._value.get() == 0
        assert unpublished() == 0
    finally:
        relay.close()


# -- publishing --------------------------------------------------------------------------------


def test_relay_publishes_every_event_keyed_by_job_in_sequence_order_and_marks_it(db, kafka_topic, audit_pool, user):
    jobs = [enqueue("DEMO_TASK", {"result": i}, owner=user) for i in range(3)]
    job_cancel(job_id=jobs[0].id)
    relay = OutboxRelay(batch_size=2)  # four batches in one tick

    assert relay.run_once() == 7
    assert unpublished() == 0
    assert relay.run_once() == 0

    messages = topic_messages(kafka_topic)
    outbox = {str(e.event_id): e for e in OutboxEvent.objects.all()}
    assert sorted(json.loads(m.value())["event_id"] for m in messages) == sorted(outbox)
    offsets: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for message in messages:
        value = json.loads(message.value())
        event = outbox[value["event_id"]]
        assert message.key() == str(event.job_id).encode()
        assert message.headers() == [("event_type", event.event_type.encode())]
        offsets[value["job_id"]].append((message.partition(), message.offset(), value["sequence"]))
    for placed in offsets.values():
        assert len({partition for partition, _, _ in placed}) == 1  # one partition per job
        assert [seq for _, _, seq in sorted(placed)] == sorted(seq for _, _, seq in placed)

    cancelled = json.loads(next(m.value() for m in messages if b"JOB_CANCELLED" in m.value()))
    assert cancelled["job_id"] == str(jobs[0].id)
    assert (cancelled["sequence"], cancelled["from_status"], cancelled["to_status"]) == (3, "QUEUED", "CANCELLED")
    assert cancelled["owner_id"] == user.pk and cancelled["schema_version"] == 1
    assert cancelled["occurred_at"].endswith("Z")
    assert cancelled["payload"]["type"] == "DEMO_TASK"

    consume_all(audit_pool.consumer, kafka_topic)
    assert_audit_equals_outbox()
    assert_gapless_trails()


def test_a_packed_events_id_is_the_version_8_uuid_of_its_job_and_sequence_and_renders_the_same_each_time(db):
    (job_id,) = enqueue_many([{"type": "DEMO_TASK"}])
    events = [e for row in OutboxBatch.objects.order_by("id") for e in row.entries()]
    for event in events:
        digest = hashlib.md5(f"{event['job_id']}/{event['sequence']}".encode()).hexdigest()  # noqa: S324 - an id, not a secret
        expected = uuid.UUID(digest[:12] + "8" + digest[13:16] + "8" + digest[17:])
        assert uuid.UUID(event["event_id"]) == expected
        assert expected.version == 8 and expected.variant == uuid.RFC_4122
    assert [e["event_id"] for row in OutboxBatch.objects.order_by("id") for e in row.entries()] == [
        e["event_id"] for e in events
    ]
    assert [(e["job_id"], e["sequence"]) for e in events] == [(str(job_id), 1), (str(job_id), 2)]


def test_an_outbox_row_holds_exactly_one_form_of_its_events(db):
    for events, packed in [("NULL", "NULL"), ("'[]'::jsonb", "'{}'::stint_packed_event[]")]:
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            columns = "schema_version, occurred_at, event_count, events, packed_events"
            cursor.execute(f"INSERT INTO stint_outbox ({columns}) VALUES (1, now(), 0, {events}, {packed})")  # noqa: S608


def test_a_batch_of_transitions_writes_one_outbox_row_holding_each_event_in_order(db):
    job_ids = enqueue_many([{"type": "DEMO_TASK"} for _ in range(5)])
    assert list(OutboxBatch.objects.values_list("event_count", flat=True)) == [10]  # created + queued, per job
    before = set(OutboxBatch.objects.values_list("id", flat=True))

    moved = lifecycle._transition(job_ids=job_ids, to=JobStatus.CANCELLED)  # the builder under every verb

    row = OutboxBatch.objects.exclude(id__in=before).get()
    assert row.events is None  # written packed (migration 0014), rendered by entries()
    events = row.entries()
    assert row.event_count == len(events) == len(moved) == 5
    assert [e["job_id"] for e in events] == sorted(str(j) for j in job_ids)  # in id order
    assert {(e["event_type"], e["sequence"], e["from_status"], e["to_status"]) for e in events} == {
        ("JOB_CANCELLED", 3, "QUEUED", "CANCELLED")
    }
    assert len({e["event_id"] for e in events}) == 5
    for job_id in job_ids:  # each job's trail is gapless, in sequence order
        trail = OutboxEvent.objects.filter(job_id=job_id).order_by("id")
        assert [e.sequence for e in trail] == [1, 2, 3]
    assert lifecycle._transition(job_ids=job_ids, to=JobStatus.CANCELLED) == []
    assert OutboxBatch.objects.count() == 2  # a statement that moved nothing writes no row


def test_the_relay_publishes_each_event_of_a_grouped_row_once(db, kafka_topic):
    enqueue_many([{"type": "DEMO_TASK"} for _ in range(50)])

    assert OutboxRelay().run_once() == 100

    messages = topic_messages(kafka_topic)
    values = [json.loads(m.value()) for m in messages]
    assert sorted(v["event_id"] for v in values) == sorted(
        str(e) for e in OutboxEvent.objects.values_list("event_id", flat=True)
    )
    assert len({v["event_id"] for v in values}) == 100
    assert OutboxBatch.objects.get().published_at is not None


def test_a_row_with_one_undelivered_event_stays_unpublished_and_the_others_are_marked(db, kafka_topic):
    whole = outbox_row(
        *[{"event_type": "JOB_QUEUED", "job_id": uuid.uuid4(), "sequence": 2, "to_status": "QUEUED"}] * 2,
        occurred_at=timezone.now(),
    )
    poison = {"event_type": "JOB_QUEUED", "job_id": uuid.uuid4(), "sequence": 2, "to_status": "QUEUED"}
    poisoned = outbox_row(
        {"event_type": "JOB_QUEUED", "job_id": uuid.uuid4(), "sequence": 2, "to_status": "QUEUED"},
        {**poison, "payload": {"blob": "x" * 1_200_000}},  # over the producer's message.max.bytes: refused
        {"event_type": "JOB_QUEUED", "job_id": uuid.uuid4(), "sequence": 2, "to_status": "QUEUED"},
        occurred_at=timezone.now(),
    )
    relay = OutboxRelay()

    assert relay.run_once() == 2  # the whole row's two events

    assert OutboxBatch.objects.get(id=whole.id).published_at is not None
    assert OutboxBatch.objects.get(id=poisoned.id).published_at is None  # sent again whole, later
    assert relay.failures == 1
    delivered = {json.loads(m.value())["job_id"] for m in topic_messages(kafka_topic)}
    assert {e["job_id"] for e in poisoned.entries()} - delivered == {str(poison["job_id"])}


def test_events_sent_again_after_an_unmarked_delivery_are_stored_once(db, kafka_topic, audit_pool):
    enqueue_many([{"type": "DEMO_TASK"} for _ in range(5)])

    class CrashError(Exception):
        """Stands in for a relay that dies after delivery, before the mark."""

    def crash(delivered: list[int]) -> None:
        assert len(delivered) == 1  # the one outbox row of the enqueue, all 10 of its events delivered
        raise CrashError

    with pytest.raises(CrashError):
        OutboxRelay(on_delivered=crash).run_once()
    assert unpublished() == 10
    assert len(topic_messages(kafka_topic)) == 10

    assert OutboxRelay().run_once() == 10
    assert unpublished() == 0
    assert len(topic_messages(kafka_topic)) == 20  # every event is in Kafka twice

    consume_all(audit_pool.consumer, kafka_topic)
    assert_audit_equals_outbox()


RELAY_KILLED_BEFORE_MARK = """
import os, signal, django
django.setup()
from scheduler.maintenance.relay import OutboxRelay
OutboxRelay(on_delivered=lambda ids: os.kill(os.getpid(), signal.SIGKILL)).run_once()
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_relay_process_killed_after_producing_before_marking_is_stored_once(kafka_topic, audit_pool):
    enqueue_many([{"type": "DEMO_TASK"} for _ in range(20)])

    child = subprocess.run(
        [sys.executable, "-c", RELAY_KILLED_BEFORE_MARK],
        env=subprocess_env(KAFKA_TOPIC=kafka_topic),
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )

    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    assert unpublished() == 40
    assert len(topic_messages(kafka_topic)) == 40
    assert OutboxRelay().run_once() == 40
    assert len(topic_messages(kafka_topic)) == 80
    consume_all(audit_pool.consumer, kafka_topic)
    assert_audit_equals_outbox()
    assert_gapless_trails()


@pytest.mark.django_db(transaction=True)
def test_concurrent_relays_lease_disjoint_rows_and_publish_each_event_once(fresh_topic):
    for _ in range(10):
        enqueue_many([{"type": "DEMO_TASK"} for _ in range(50)])  # ten rows of 100 events
    both_hold_a_batch = threading.Barrier(2, timeout=30)
    published = [0, 0]
    errors: list[Exception] = []

    def relay_until_empty(slot: int) -> None:
        first = {"batch": True}

        def rendezvous(delivered: list[int]) -> None:
            # Both relays are inside a lease transaction at once: SKIP LOCKED gave them disjoint rows.
            if first.pop("batch", False):
                both_hold_a_batch.wait()

        relay = OutboxRelay(batch_size=100, on_delivered=rendezvous)
        try:
            while OutboxEvent.objects.filter(published_at__isnull=True).exists():
                published[slot] += relay.run_once()
        except Exception as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=relay_until_empty, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert not errors
    assert min(published) > 0 and sum(published) == 1000
    assert unpublished() == 0
    messages = topic_messages(fresh_topic)
    assert len(messages) == len({json.loads(m.value())["event_id"] for m in messages}) == 1000


# -- Kafka unavailable ---------------------------------------------------------------------------


def test_unreachable_broker_backs_off_keeps_rows_and_never_blocks_enqueue_or_the_api(db, tmp_path, user, user_api):
    port = free_port()  # nothing listens here yet
    clock = FakeClock()
    relay = OutboxRelay(
        bootstrap_servers=f"127.0.0.1:{port}", topic=unique_topic(), probe_timeout_seconds=0.5, clock=clock
    )
    first = enqueue("DEMO_TASK", owner=user)

    assert relay.run_once() == 0
    assert (relay.failures, relay.retry_at) == (1, clock.now + 0.5)
    assert relay.run_once() == 0
    assert relay.attempts == 1  # backing off: did not even try
    clock.advance(0.5)
    assert relay.run_once() == 0
    assert (relay.failures, relay.retry_at) == (2, clock.now + 1.0)
    assert relay.next_delay == 2.0

    # Neither enqueue nor the API waits on Kafka.
    second = enqueue("DEMO_TASK", owner=user)
    response = user_api.get(f"/api/jobs/{second.id}/events")
    assert response.status_code == 200 and response.json()["count"] == 0
    assert unpublished() == 4

    broker = Broker(port=port, log=tmp_path / "tansu.log")
    broker.start()
    ensure_topic(bootstrap_servers=broker.bootstrap, topic=relay.topic, partitions=3, timeout=10)  # provisioned
    relay.probe_timeout_seconds = 10  # a fresh broker on a busy machine may take a moment to answer
    try:
        clock.advance(1.0)
        assert relay.run_once() == 4
        assert (relay.failures, relay.retry_at) == (0, None)
        assert unpublished() == 0
        assert {
            json.loads(m.value())["job_id"] for m in topic_messages(relay.topic, bootstrap_servers=broker.bootstrap)
        } == {
            str(first.id),
            str(second.id),
        }
    finally:
        relay.close()
        broker.stop()


@pytest.mark.slow
def test_paused_broker_backlog_grows_then_drains_with_nothing_lost_or_doubled(db, private_broker):
    topic = unique_topic()
    ensure_topic(bootstrap_servers=private_broker.bootstrap, topic=topic, partitions=3, timeout=10)
    relay = OutboxRelay(
        bootstrap_servers=private_broker.bootstrap,
        topic=topic,
        delivery_timeout_ms=1000,
        probe_timeout_seconds=0.5,
        backoff_max_seconds=1.0,
    )
    enqueue_many([{"type": "DEMO_TASK"} for _ in range(50)])

    def relay_tick() -> None:
        relay.run_once()
        time.sleep(0.05)

    # The fresh broker's first deliveries may outlast the short timeout on a busy machine: retry.
    wait_for(lambda: unpublished() == 0, what="the first events to be published", step=relay_tick)

    private_broker.pause()
    backlog = []
    try:
        resume_at = time.monotonic() + PAUSE_SECONDS
        while time.monotonic() < resume_at:
            enqueue_many([{"type": "DEMO_TASK"} for _ in range(10)])  # enqueue goes on regardless
            relay.run_once()
            backlog.append(unpublished())
            time.sleep(0.1)
    finally:
        private_broker.resume()
    assert relay.failures >= 1
    assert backlog == sorted(backlog) and backlog[-1] >= 20 * len(backlog)  # it only grew

    wait_for(lambda: unpublished() == 0, what="the backlog to drain", step=relay_tick)
    relay.close()

    consumer = AuditConsumer(bootstrap_servers=private_broker.bootstrap, topics=[topic], group_id=unique_topic("g"))
    consumer.start()
    try:
        consume_all(consumer, topic, bootstrap_servers=private_broker.bootstrap)
    finally:
        consumer.close()
    assert_audit_equals_outbox()
    assert_gapless_trails()


# -- pruning -------------------------------------------------------------------------------------


def test_pruner_deletes_only_published_rows_older_than_the_retention(db):
    for _ in range(5):
        enqueue_many([{"type": "DEMO_TASK"} for _ in range(2)])  # one row of four events each
    now = timezone.now()
    rows = list(OutboxBatch.objects.order_by("id"))
    ages = [dt.timedelta(days=8), dt.timedelta(days=7, seconds=1), dt.timedelta(days=6), dt.timedelta(seconds=1)]
    for row, age in zip(rows, ages, strict=False):
        OutboxBatch.objects.filter(id=row.id).update(published_at=now - age)
    OutboxBatch.objects.filter(id__in=[r.id for r in rows[4:]]).update(occurred_at=now - dt.timedelta(days=30))

    assert OutboxPruner().run_once(now=now) == 2
    assert OutboxPruner().run_once(now=now) == 0
    left = OutboxBatch.objects.order_by("id")
    assert [r.id for r in left] == [r.id for r in rows[2:]]  # old unpublished rows are never pruned
    assert OutboxEvent.objects.count() == 12
    assert OutboxPruner(retention=dt.timedelta(0)).run_once(now=now) == 2


def test_relay_and_pruner_are_scheduler_services():
    from scheduler.maintenance import default_services

    names = {service.name: service for service in default_services()}
    assert names["outbox_relay"].leader_only is False
    assert names["outbox_pruner"].leader_only is False
    assert names["outbox_relay"].interval_seconds == settings.OUTBOX_RELAY_INTERVAL_SECONDS
