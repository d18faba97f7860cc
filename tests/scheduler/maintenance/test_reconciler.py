"""The audit reconciler: published outbox events without an audit row are published again, end to end."""

from __future__ import annotations

import datetime as dt
import uuid

from django.db import connection
from prometheus_client import REGISTRY

from audit.models import AuditEvent
from scheduler.enqueuing import enqueue_many
from scheduler.maintenance import default_services
from scheduler.maintenance.reconciler import _SCAN_SQL, STATE_NAME, AuditReconciler, minimum_reconcile_after_seconds
from scheduler.maintenance.relay import OutboxRelay
from scheduler.models import Job, OutboxBatch, OutboxEvent, OutboxReconcile
from tests.support import kafka as kafka_support
from tests.support.factories import JobFactory, outbox_row
from tests.support.kafka import consume_all

# Real-Kafka fixtures (tests/support/kafka.py): one session consumer, one topic per test.
audit_pool = kafka_support.audit_pool
kafka_topic = kafka_support.kafka_topic

T = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)  # "now" of the unit tests
MINUTE = dt.timedelta(minutes=1)


def repaired_metric() -> float:
    return REGISTRY.get_sample_value("audit_events_repaired_total") or 0.0


def outbox_event(
    *, published_at: dt.datetime | None, audited: bool, received_at: dt.datetime | None = None
) -> uuid.UUID:
    """An outbox row of one event published at ``published_at`` (None: unpublished), audited if ``audited``.

    Returns the event id. Its job exists (the reconciler skips events of deleted jobs).
    """
    event_id = uuid.uuid4()
    outbox_row(
        {"event_id": event_id, "event_type": "JOB_QUEUED", "job_id": JobFactory().id, "sequence": 1,
         "to_status": "QUEUED"},
        occurred_at=(published_at or T) - dt.timedelta(seconds=1),
        published_at=published_at,
    )  # fmt: skip
    if audited:
        audit_row(event_id=event_id, received_at=received_at or published_at or T)
    return event_id


def audit_row(
    *, received_at: dt.datetime, event_id: uuid.UUID | None = None, occurred_at: dt.datetime | None = None
) -> None:
    """An audit row received at ``received_at`` of an event that occurred at ``occurred_at`` (default: the same).

    The newest one tells the reconciler when the consumer last stored, and how far it had got.
    """
    row = AuditEvent.objects.create(
        event_id=event_id or uuid.uuid4(),
        job_id=uuid.uuid4(),
        event_type="JOB_QUEUED",
        sequence=1,
        to_status="QUEUED",
        occurred_at=occurred_at or received_at,
    )
    AuditEvent.objects.filter(id=row.id).update(received_at=received_at)


def published_at(event_id: uuid.UUID) -> dt.datetime | None:
    """When the event's original row was published (a repair never changes it)."""
    return OutboxEvent.objects.filter(event_id=event_id).order_by("id").values_list("published_at", flat=True)[0]


def copied(event_id: uuid.UUID) -> bool:
    """Whether a repair wrote a copy of the event into a new, unpublished outbox row."""
    return OutboxEvent.objects.filter(event_id=event_id, published_at=None).count() == 1 and (
        OutboxEvent.objects.filter(event_id=event_id).count() == 2
    )


def state() -> OutboxReconcile:
    return OutboxReconcile.objects.get(name=STATE_NAME)


def test_an_event_published_long_enough_ago_without_its_audit_row_is_published_again(db):
    audited = outbox_event(published_at=T - 10 * MINUTE, audited=True)
    lost = outbox_event(published_at=T - 9 * MINUTE, audited=False)
    young = outbox_event(published_at=T - 1 * MINUTE, audited=False)  # the consumer may still be on it
    waiting = outbox_event(published_at=None, audited=False)
    audit_row(received_at=T - dt.timedelta(seconds=1))  # the consumer is storing
    before = repaired_metric()

    assert AuditReconciler().run_once(now=T) == 1

    assert copied(lost)  # the relay sends the copy; the consumer's dedup makes that safe
    assert published_at(lost) == T - 9 * MINUTE
    assert not copied(audited) and not copied(young)
    assert published_at(waiting) is None and OutboxEvent.objects.filter(event_id=waiting).count() == 1
    assert repaired_metric() - before == 1
    record = state()
    assert (record.repaired_total, record.last_repair_at, record.last_run_at) == (1, T, T)
    assert record.checked_published_at == T - 5 * MINUTE  # everything published before it was compared
    assert AuditReconciler().run_once(now=T) == 0  # nothing is checked twice


def test_while_the_audit_consumer_is_stopped_missing_events_wait_instead_of_being_published_again(db):
    missing = outbox_event(published_at=T - 10 * MINUTE, audited=False)
    # Its last row, stored 2 minutes after the event was published, holds an older event: it stopped
    # (or fell behind) before it reached the missing one.
    audit_row(received_at=T - 8 * MINUTE, occurred_at=T - 11 * MINUTE)

    assert AuditReconciler().run_once(now=T) == 0
    assert not copied(missing)
    assert state().checked_published_at < T - 10 * MINUTE  # the walk waits at the missing event

    audit_row(received_at=T - dt.timedelta(seconds=5))  # the consumer is back and has moved on
    assert AuditReconciler().run_once(now=T) == 1
    assert copied(missing)


def test_an_event_lost_before_later_ones_were_stored_is_repaired_after_the_grace_with_no_newer_traffic(db):
    """Finding F5: the broker lost an acknowledged event; the consumer stored the events published after it.

    The traffic then stopped, so the consumer stored nothing ``after`` seconds past the lost
    event. It had got past it all the same (it stored an event that occurred after the lost one
    was published): the event is lost, not waiting, and is published again once its grace ends.
    """
    lost = outbox_event(published_at=T - 10 * MINUTE, audited=False)
    audit_row(
        received_at=T - 10 * MINUTE + dt.timedelta(seconds=8), occurred_at=T - 10 * MINUTE + dt.timedelta(seconds=5)
    )

    assert AuditReconciler().run_once(now=T) == 1
    assert copied(lost)


def test_the_grace_may_be_as_short_as_the_relays_lock_hold_allows_and_no_shorter(settings):
    """A mark commits at most the relay's lock hold after its ``published_at``; the grace must outlast that."""
    settings.OUTBOX_LOCK_HOLD_SECONDS = 10
    settings.AUDIT_RECONCILE_AFTER_SECONDS = 20
    reconciler = AuditReconciler()
    assert reconciler.after == dt.timedelta(seconds=20)
    assert reconciler.interval_seconds == 5.0  # a repair comes at most a quarter of the grace late
    assert minimum_reconcile_after_seconds(lock_hold_seconds=10) == 20
    assert minimum_reconcile_after_seconds(lock_hold_seconds=60) == 70


def test_events_older_than_the_outbox_retention_are_not_checked(db):
    old = outbox_event(published_at=T - dt.timedelta(days=8), audited=False)
    audit_row(received_at=T)

    assert AuditReconciler(retention=dt.timedelta(days=7)).run_once(now=T) == 0
    assert not copied(old)


def test_the_walk_goes_on_from_its_checkpoint_in_bounded_batches(db):
    events = [outbox_event(published_at=T - (20 - i) * MINUTE, audited=i != 7) for i in range(12)]
    audit_row(received_at=T)
    reconciler = AuditReconciler(batch_size=5)

    assert reconciler.run_once(now=T) == 1
    assert copied(events[7])
    assert state().checked_published_at == T - 5 * MINUTE

    later = outbox_event(published_at=T + 1 * MINUTE, audited=False)
    audit_row(received_at=T + 10 * MINUTE)
    assert reconciler.run_once(now=T + 10 * MINUTE) == 1
    assert copied(later)


def test_the_scan_walks_the_published_at_index(db):
    # A cheap query at any outbox size: a range of the partial index outbox_published_at, then one
    # probe of the audit table's unique event_id index per row (measured: 2,000 rows compared in
    # 35 ms with 2 million outbox and audit rows).
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # what the planner does once the table is large
        cursor.execute(
            "EXPLAIN " + _SCAN_SQL,
            {"lo": T - MINUTE, "lo_id": 0, "hi": T, "limit": 10},
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "outbox_published_at" in plan
    assert "stint_audit_event_event_id_key" in plan


def test_the_reconciler_runs_in_run_scheduler():
    names = {service.name: service for service in default_services()}
    assert names["audit_reconciler"].leader_only is False
    assert names["audit_quarantine_pruner"].leader_only is False


def test_an_event_deleted_from_the_audit_table_is_repaired_through_the_relay_and_consumer(db, kafka_topic, audit_pool):
    enqueue_many([{"type": "DEMO_TASK"} for _ in range(3)])
    relay = OutboxRelay()
    assert relay.run_once() == 6
    consume_all(audit_pool.consumer, kafka_topic)
    assert OutboxBatch.objects.count() == 1  # one statement, one row of six events
    victim = OutboxEvent.objects.order_by("id")[3]
    assert AuditEvent.objects.filter(event_id=victim.event_id).delete()[0] == 1
    # As if it had been published ten minutes ago and had never reached the consumer since.
    OutboxBatch.objects.filter(id=victim.outbox_id).update(published_at=victim.published_at - 10 * MINUTE)
    before = repaired_metric()

    assert AuditReconciler().run_once() == 1
    assert relay.run_once() == 1  # only the lost event is sent again, not its five neighbours
    consume_all(audit_pool.consumer, kafka_topic)

    assert AuditEvent.objects.filter(event_id=victim.event_id).count() == 1
    assert set(
        AuditEvent.objects.filter(job_id__in=OutboxEvent.objects.values("job_id")).values_list("event_id", flat=True)
    ) == set(OutboxEvent.objects.values_list("event_id", flat=True))
    assert repaired_metric() - before == 1
    assert state().repaired_total == 1


def test_the_lost_events_of_a_grouped_row_are_copied_and_its_audited_ones_are_not(db):
    jobs = [JobFactory() for _ in range(4)]
    ids = [uuid.uuid4() for _ in jobs]
    outbox_row(
        *[
            {"event_id": i, "event_type": "JOB_QUEUED", "job_id": j.id, "sequence": 2, "to_status": "QUEUED"}
            for i, j in zip(ids, jobs, strict=True)
        ],
        occurred_at=T - 10 * MINUTE,
        published_at=T - 10 * MINUTE,
    )
    for event_id in (ids[0], ids[2]):
        audit_row(event_id=event_id, received_at=T - 9 * MINUTE)
    audit_row(received_at=T - dt.timedelta(seconds=1))

    assert AuditReconciler().run_once(now=T) == 2

    copy = OutboxBatch.objects.get(published_at=None)
    assert copy.event_count == 2
    assert [e["event_id"] for e in copy.entries()] == [str(ids[1]), str(ids[3])]  # in the row's order
    assert copy.occurred_at == T - 10 * MINUTE
    assert OutboxBatch.objects.exclude(id=copy.id).get().published_at == T - 10 * MINUTE
    assert AuditReconciler().run_once(now=T) == 0


def test_events_of_a_deleted_job_are_not_published_again(db):
    # The job pruner deleted the job and its audit rows; its published events wait for the outbox pruner.
    gone = outbox_event(published_at=T - 10 * MINUTE, audited=False)
    Job.objects.filter(id=OutboxEvent.objects.get(event_id=gone).job_id).delete()
    audit_row(received_at=T - dt.timedelta(seconds=1))

    assert AuditReconciler().run_once(now=T) == 0
    assert not copied(gone)
