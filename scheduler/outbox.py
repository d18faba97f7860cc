"""Relay committed outbox rows to the Kafka topic ``job-lifecycle-events`` and prune the published ones.

``OutboxRelay`` leases unpublished ``OutboxEvent`` rows in id order (``FOR UPDATE SKIP LOCKED``,
so any number of relays can run side by side), produces each as one JSON message keyed by job
id with an idempotent producer, and marks a row published only after its delivery report
succeeded. The rows stay locked, in one transaction, while their batch is produced and flushed:
a flush takes milliseconds, the transaction is bounded by the delivery timeout, a crash releases
the locks at once (no lease to expire), and nothing else ever locks unpublished rows (writers
only insert new ones, the pruner only deletes published ones). A relay killed between delivery
and mark leaves the rows unpublished; the next relay sends them again and the audit consumer
stores each ``event_id`` once, so delivery is at-least-once and storage exactly-once.

Ordering: one relay produces a job's events in sequence order to one partition (the key is
the job id). With several relays, or after a failed delivery, a job's events can reach Kafka
out of order; consumers order by ``sequence``. The message shape is ``LifecycleEvent`` (see
docs/events.md).

While Kafka is unreachable the relay backs off exponentially (0.5 s doubling to 10 s); the
outbox grows and drains when Kafka returns. Enqueue, the API and workers never wait on Kafka.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from django.conf import settings
from django.db import connection, transaction

from scheduler import metrics
from scheduler.retry import backoff

logger = logging.getLogger(__name__)
kafka_logger = logging.getLogger("scheduler.outbox.kafka")

BATCH_SIZE = 500  # rows leased, produced, flushed and marked together
MAX_BATCHES_PER_TICK = 20  # a busy tick relays at most this many batches, then yields to other services
RELAY_INTERVAL_SECONDS = 0.1  # seconds between ticks (run_scheduler's tick also bounds it)
DELIVERY_TIMEOUT_MS = 5000  # librdkafka message.timeout.ms: every delivery report arrives within it
FLUSH_GRACE_SECONDS = 1.0  # seconds a flush may run past the delivery timeout (reports are due by then)
PROBE_TIMEOUT_SECONDS = 2.0  # seconds for the metadata request that tests the broker before relaying
ADMIN_TIMEOUT_SECONDS = 10.0  # seconds for topic creation
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 10.0  # a probe is one metadata request: cheap enough to retry often
LINGER_MS = 5  # ms the producer waits to fill a request; a 500-row batch flushes in ~10 ms
RECONNECT_BACKOFF_MAX_MS = 1000
# A relay stuck while holding row locks (e.g. SIGSTOPped) loses its session after this long,
# so its rows return to the other relays. Well above any healthy batch.
LOCK_HOLD_LIMIT_SECONDS = 60

RETENTION_DAYS = 7  # published rows older than this are pruned
PRUNE_BATCH = 10_000  # rows deleted per statement
PRUNE_MAX_BATCHES = 10  # statements per tick
PRUNE_INTERVAL_SECONDS = 60.0

TOPIC_REPLICATION = -1  # the broker's default.replication.factor


class LifecycleEvent(TypedDict):
    """The JSON value of a message on ``job-lifecycle-events`` (schema_version 1)."""

    schema_version: int
    event_id: str  # uuid; unique per event, the consumer's dedup key
    event_type: str  # JOB_CREATED, JOB_QUEUED, ... (scheduler.states.EventType)
    job_id: str  # uuid; also the message key
    owner_id: int | None
    sequence: int  # 1, 2, 3, ... per job, gapless, in transition order
    attempt: int  # the job's attempt number after the transition (0 before the first run)
    from_status: str | None  # None for JOB_CREATED
    to_status: str
    occurred_at: str  # ISO 8601 UTC ("...Z"), the database clock of the transition's transaction
    payload: dict[str, Any]  # type, queue, priority, plus event-specific fields


class RelayUnavailable(Exception):  # noqa: N818 - a condition, not a bug
    """Kafka did not confirm delivery; the rows stay unpublished and the relay backs off."""


class TopicMissing(RelayUnavailable):
    """The relay's topic does not exist on the broker: it is never created by the relay (see ``OutboxRelay``)."""


def _iso(value: dt.datetime) -> str:
    text = value.astimezone(dt.UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def event_document(
    *,
    event_id: uuid.UUID,
    event_type: str,
    job_id: uuid.UUID,
    owner_id: int | None,
    sequence: int,
    attempt: int,
    from_status: str,
    to_status: str,
    schema_version: int,
    payload: Any,
    occurred_at: dt.datetime,
) -> LifecycleEvent:
    """Return the message value of one outbox row (``payload`` may be the JSON text or the decoded value)."""
    if isinstance(payload, str | bytes):
        payload = json.loads(payload)
    return {
        "schema_version": schema_version,
        "event_id": str(event_id),
        "event_type": event_type,
        "job_id": str(job_id),
        "owner_id": owner_id,
        "sequence": sequence,
        "attempt": attempt,
        "from_status": from_status or None,
        "to_status": to_status,
        "occurred_at": _iso(occurred_at),
        "payload": payload if payload is not None else {},
    }


def _setting(name: str, default: Any) -> Any:
    return getattr(settings, name, default)


def _client_config(bootstrap_servers: str, client: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": client,
        # librdkafka's own log lines go to a Python logger at their own levels.
        "logger": kafka_logger,
        # Reconnect within a second of the broker's return, not librdkafka's default 10 s.
        "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
    }


def topic_exists(admin: AdminClient, topic: str, *, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """Return whether the broker has ``topic`` (a usable one: no error in its metadata).

    Lists every topic rather than asking for ``topic`` by name, which would make a broker with
    auto-creation create it. Doubles as the reachability probe: raises ``KafkaException`` when
    the broker does not answer within ``timeout`` seconds.
    """
    existing = admin.list_topics(timeout=timeout).topics.get(topic)
    return existing is not None and existing.error is None


def ensure_topic(
    *,
    bootstrap_servers: str,
    topic: str,
    partitions: int,
    timeout: float = PROBE_TIMEOUT_SECONDS,
    admin: AdminClient | None = None,
) -> bool:
    """Create ``topic`` with ``partitions`` partitions unless it exists; return True if this call created it.

    Lists every topic rather than asking for ``topic`` by name: a metadata request naming an
    unknown topic makes brokers with auto-creation (Tansu, Kafka's default) create it with their
    default partition count. Doubles as the reachability probe: raises ``KafkaException`` when
    the broker does not answer within ``timeout`` seconds. An existing topic is left as it is.
    """
    admin = admin or AdminClient(_client_config(bootstrap_servers, "stint-admin"))
    metadata = admin.list_topics(timeout=timeout)
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None:
        if len(existing.partitions) != partitions:
            logger.info("topic %s has %d partitions (configured: %d)", topic, len(existing.partitions), partitions)
        return False
    new = NewTopic(topic, num_partitions=partitions, replication_factor=TOPIC_REPLICATION)
    future = admin.create_topics([new], request_timeout=ADMIN_TIMEOUT_SECONDS)[topic]
    try:
        future.result(ADMIN_TIMEOUT_SECONDS)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False  # another relay or consumer won the race
        raise
    logger.info("created topic %s with %d partitions", topic, partitions)
    return True


@dataclass(slots=True, kw_only=True)
class _Batch:
    leased: int
    published: int
    failed: int
    error: KafkaError | None = None


# The outbox columns a message carries, in event_document()'s keyword names.
_EVENT_COLUMNS = (
    "event_id",
    "event_type",
    "job_id",
    "owner_id",
    "sequence",
    "attempt",
    "from_status",
    "to_status",
    "schema_version",
    "payload",
    "occurred_at",
)
_LEASE_SQL = f"""
    SELECT id, {", ".join(_EVENT_COLUMNS)}
    FROM stint_outbox
    WHERE published_at IS NULL
    ORDER BY id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
"""  # noqa: S608 - constant column names


class OutboxRelay:
    """Background service: publish unpublished outbox rows to Kafka, marking each after its delivery.

    ``run_once`` relays batches until the outbox is empty (at most ``MAX_BATCHES_PER_TICK``) and
    returns how many rows it marked published. On a Kafka failure it returns what it marked so
    far and waits ``backoff(failures)`` seconds (0.5 s doubling to 10 s) before trying again;
    every retry first probes the broker with a metadata request, so an outage costs no database
    work. ``on_delivered`` (instrumentation and tests) is called with the delivered row ids
    after a batch's delivery reports and before the mark, inside the lease transaction.

    The relay never creates its topic, nor lets the broker create it (``allow.auto.create.topics``
    off): a topic that vanished (a broker that lost its data) and came back empty would hide
    every event it held, and the audit consumer's offsets would point past its end. A missing
    topic is logged as an error, shown by ``outbox_topic_missing`` (1) and backed off like an
    outage; the rows stay unpublished until the topic is provisioned (``manage.py
    create_topics``, which a deployment runs once, and the audit consumer's start).
    """

    name = "outbox_relay"
    leader_only = False

    def __init__(
        self,
        *,
        bootstrap_servers: str | None = None,
        topic: str | None = None,
        partitions: int | None = None,
        batch_size: int | None = None,
        interval_seconds: float | None = None,
        delivery_timeout_ms: int | None = None,
        probe_timeout_seconds: float = PROBE_TIMEOUT_SECONDS,
        backoff_base_seconds: float = BACKOFF_BASE_SECONDS,
        backoff_max_seconds: float = BACKOFF_MAX_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        on_delivered: Callable[[Sequence[int]], None] | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers or settings.KAFKA_BOOTSTRAP_SERVERS
        self.topic = topic or settings.KAFKA_TOPIC
        self.partitions = partitions or settings.KAFKA_TOPIC_PARTITIONS
        self.batch_size = batch_size or _setting("OUTBOX_BATCH_SIZE", BATCH_SIZE)
        self.interval_seconds = interval_seconds or _setting("OUTBOX_RELAY_INTERVAL_SECONDS", RELAY_INTERVAL_SECONDS)
        self.delivery_timeout_ms = delivery_timeout_ms or _setting("KAFKA_DELIVERY_TIMEOUT_MS", DELIVERY_TIMEOUT_MS)
        self.probe_timeout_seconds = probe_timeout_seconds
        self.backoff_base_seconds = backoff_base_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.on_delivered = on_delivered
        self._clock = clock
        self._producer: Producer | None = None
        self._admin: AdminClient | None = None
        self._topic_ready = False
        self.failures = 0  # consecutive failed rounds
        self.attempts = 0  # rounds tried, i.e. not skipped while backing off
        self.retry_at: float | None = None  # clock() value before which run_once does nothing

    # -- the service protocol -----------------------------------------------------------------

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Relay up to ``MAX_BATCHES_PER_TICK`` batches; return how many rows were marked published.

        ``now`` is accepted for the service protocol and unused: publishing is not time-based.
        Raises only database errors (the caller's loop logs them); Kafka errors become backoff.
        """
        if self.retry_at is not None and self._clock() < self.retry_at:
            return 0
        published = 0
        try:
            self.attempts += 1
            if not self._topic_ready:
                if not topic_exists(self._admin_client(), self.topic, timeout=self.probe_timeout_seconds):
                    metrics.outbox_topic_missing.set(1)
                    raise TopicMissing(
                        f"topic {self.topic} does not exist; the relay never creates it (a lost topic re-created"
                        " empty would hide the events it held): provision it with `manage.py create_topics`"
                    )
                metrics.outbox_topic_missing.set(0)
                self._topic_ready = True
            for _ in range(MAX_BATCHES_PER_TICK):
                batch = self._relay_batch()
                published += batch.published
                if batch.failed:
                    raise RelayUnavailable(f"{batch.failed} of {batch.leased} deliveries failed: {batch.error}")
                if batch.leased < self.batch_size:
                    break
        except (KafkaException, RelayUnavailable) as exc:
            self._failed(exc)
            return published
        if self.failures:
            logger.info("outbox relay: Kafka reachable again after %d failed rounds", self.failures)
        self.failures = 0
        self.retry_at = None
        if published:
            logger.debug("outbox relay: published %d events", published)
        return published

    @property
    def next_delay(self) -> float:
        """Seconds the relay waits after its next failure."""
        return backoff(self.failures + 1, base=self.backoff_base_seconds, cap=self.backoff_max_seconds)

    def close(self) -> None:
        """Drop the Kafka clients (a later ``run_once`` builds new ones)."""
        self._drop_producer()
        self._admin = None

    # -- internals ------------------------------------------------------------------------------

    def _failed(self, exc: Exception) -> None:
        delay = self.next_delay
        self.failures += 1
        self.retry_at = self._clock() + delay
        # Probe (and look for the topic: it may have vanished) before the next batch, with fresh clients:
        # an old one may sit in its own reconnect backoff, and an idempotent producer whose
        # deliveries failed may bump its epoch, which some brokers (Tansu, measured) answer with
        # PRODUCER_FENCED forever. A new producer gets a new producer id.
        self._topic_ready = False
        self.close()
        logger.log(
            logging.ERROR if isinstance(exc, TopicMissing) else logging.WARNING,
            "outbox relay: Kafka unavailable (%s); unpublished rows stay in the outbox; retry in %.1f s",
            exc,
            delay,
            extra={"failures": self.failures},
        )

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(_client_config(self.bootstrap_servers, "stint-outbox-admin"))
        return self._admin

    def _producer_client(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                {
                    **_client_config(self.bootstrap_servers, "stint-outbox-relay"),
                    "enable.idempotence": True,
                    "acks": "all",
                    # Never let a produce to a vanished topic make the broker create it (see the class).
                    "allow.auto.create.topics": False,
                    "linger.ms": LINGER_MS,
                    "message.timeout.ms": self.delivery_timeout_ms,
                }
            )
        return self._producer

    def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.purge()
            producer.flush(0)

    def _relay_batch(self) -> _Batch:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_LEASE_SQL, [self.batch_size])
            rows = cursor.fetchall()
            if not rows:
                return _Batch(leased=0, published=0, failed=0)
            # The session sits idle in this transaction, holding the row locks, while Kafka confirms.
            cursor.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, true)",
                [f"{LOCK_HOLD_LIMIT_SECONDS}s"],
            )
            delivered, error = self._produce(rows)
            if self.on_delivered is not None:
                self.on_delivered(delivered)
            if delivered:
                cursor.execute(
                    "UPDATE stint_outbox SET published_at = clock_timestamp() WHERE id = ANY(%s)"
                    " RETURNING extract(epoch FROM published_at - occurred_at)",
                    [delivered],
                )
                for (lag,) in cursor.fetchall():
                    metrics.outbox_publish_lag_seconds.observe(max(0.0, float(lag)))
        return _Batch(leased=len(rows), published=len(delivered), failed=len(rows) - len(delivered), error=error)

    def _produce(self, rows: Sequence[tuple[Any, ...]]) -> tuple[list[int], KafkaError | None]:
        """Produce one message per row, flush, and return (ids delivered, first error)."""
        producer = self._producer_client()
        reports: dict[int, KafkaError | None] = {}
        for row_id, *values in rows:
            fields = dict(zip(_EVENT_COLUMNS, values, strict=True))
            document = event_document(**fields)
            producer.produce(
                self.topic,
                key=document["job_id"].encode(),
                value=json.dumps(document, separators=(",", ":")).encode(),
                headers=[("event_type", document["event_type"].encode())],
                on_delivery=lambda err, _msg, row_id=row_id: reports.__setitem__(row_id, err),
            )
        remaining = producer.flush(self.delivery_timeout_ms / 1000 + FLUSH_GRACE_SECONDS)
        delivered = [row[0] for row in rows if row[0] in reports and reports[row[0]] is None]
        error = next((e for e in reports.values() if e is not None), None)
        if (remaining or len(delivered) < len(rows)) and error is None:
            error = KafkaError(KafkaError._TIMED_OUT, f"{remaining} messages unconfirmed after flush")
        return delivered, error


class OutboxPruner:
    """Background service: delete published outbox rows older than the retention period (default 7 days).

    Unpublished rows are never deleted, however old. Several pruners may run: each deletes
    disjoint rows (``SKIP LOCKED``) and the deletes are idempotent.
    """

    name = "outbox_pruner"
    interval_seconds = PRUNE_INTERVAL_SECONDS
    leader_only = False

    def __init__(self, *, retention: dt.timedelta | None = None, batch_size: int = PRUNE_BATCH) -> None:
        days = _setting("OUTBOX_RETENTION_DAYS", RETENTION_DAYS)
        self.retention = retention if retention is not None else dt.timedelta(days=days)
        self.batch_size = batch_size

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Delete published rows with ``published_at`` before ``now - retention``; return how many.

        ``now`` defaults to the database clock.
        """
        total = 0
        for _ in range(PRUNE_MAX_BATCHES):
            with connection.cursor() as cursor:
                cursor.execute(
                    """
                    DELETE FROM stint_outbox WHERE id IN (
                        SELECT id FROM stint_outbox
                        WHERE published_at IS NOT NULL AND published_at < coalesce(%s, now()) - %s
                        ORDER BY published_at
                        LIMIT %s
                        FOR UPDATE SKIP LOCKED
                    )
                    """,
                    [now, self.retention, self.batch_size],
                )
                deleted = cursor.rowcount
            total += deleted
            if deleted < self.batch_size:
                break
        if total:
            logger.info("outbox pruner: deleted %d published events older than %s", total, self.retention)
        return total
