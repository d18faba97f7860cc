"""Relay committed outbox rows to the Kafka topic ``job-lifecycle-events``, marking each after its delivery.

``OutboxRelay`` leases unpublished ``OutboxBatch`` rows in id order (``FOR UPDATE SKIP LOCKED``,
so any number of relays can run side by side), produces each event of a row (a row holds the
events of one statement, ``scheduler.models.OutboxBatch``) as one JSON message keyed by job id
with an idempotent producer, and marks a row published only after the delivery reports of ALL
its events succeeded; a row with one failed event stays unpublished and is sent again whole.
The rows stay locked, in one transaction, while their batch is produced and flushed:
a flush takes milliseconds, the transaction is bounded by the delivery timeout, a crash releases
the locks at once (no lease to expire), and nothing else ever locks unpublished rows (writers
only insert new ones, the pruner only deletes published ones). A relay killed between delivery
and mark leaves the rows unpublished; the next relay sends them again and the audit consumer
stores each ``event_id`` once, so delivery is at-least-once and storage exactly-once.

Speed: the database writes each message's JSON (``scheduler.events.MESSAGE_SQL``), so the
relay's Python only hands text to the producer; batches are large (``OUTBOX_BATCH_SIZE``,
default 5,000 events in whole rows: two statements and one commit per batch) and the producer compresses
them (lz4), so the trail keeps up with a full-speed drain.

Ordering: one relay produces a job's events in sequence order to one partition (the key is
the job id). With several relays, or after a failed delivery, a job's events can reach Kafka
out of order; consumers order by ``sequence``. The message shape is ``LifecycleEvent`` (see
docs/events.md).

While Kafka is unreachable the relay backs off exponentially (0.5 s doubling to 10 s); the
outbox grows and drains when Kafka returns. Enqueue, the API and workers never wait on Kafka.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from django.db import connection, transaction

from scheduler import metrics
from scheduler.events import EVENTS_OF, HEADER_EVENT_TYPE, MESSAGE_SQL
from scheduler.kafka import PROBE_TIMEOUT_SECONDS, client_config, event_stream_conf, topic_exists
from scheduler.retry import backoff

logger = logging.getLogger(__name__)
KAFKA_LOGGER = "scheduler.maintenance.relay.kafka"  # librdkafka's own log lines

MAX_BATCHES_PER_TICK = 20  # a busy tick relays at most this many batches, then returns to its loop
FLUSH_GRACE_SECONDS = 1.0  # seconds a flush may run past the delivery timeout (reports are due by then)
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 10.0  # a probe is one metadata request: cheap enough to retry often
LINGER_MS = 5  # ms the producer waits to fill a request; the relay's flush sends at once anyway
COMPRESSION = "lz4"  # a 5,000-event batch is ~2 MB of similar JSON: a fraction of that on the wire
# A relay stuck while holding row locks (e.g. SIGSTOPped) loses its session after
# OUTBOX_LOCK_HOLD_SECONDS (default 60), so its rows return to the other relays. Well above any
# healthy batch (the delivery timeout plus FLUSH_GRACE_SECONDS); the reconciler's grace depends on it.

# One round trip leases the batch, bounds the lock hold, and returns each event's message. A batch
# is whole rows, oldest first after ``after``, until it holds ``events`` events (at least one row,
# whatever its size): ``cand`` sums the events of the oldest unpublished rows (read through
# outbox_unpublished), ``leased`` locks those not held by another relay. When another relay holds
# every candidate, the one row returned is (the last candidate's id, 0, NULL...): the relay asks
# again after it. The mark commits asynchronously (no wait for the WAL flush): a mark lost in a
# database crash only makes the relay send those rows again, which the audit consumer's dedup by
# event_id absorbs.
_LEASE_SQL = f"""
    WITH cand AS (
        SELECT id FROM (
            SELECT id, sum(event_count) OVER (ORDER BY id) - event_count AS before
            FROM (
                SELECT id, event_count FROM stint_outbox
                WHERE published_at IS NULL AND id > %(after)s
                ORDER BY id
                LIMIT %(events)s
            ) oldest
        ) c
        WHERE before < %(events)s
    ), leased AS MATERIALIZED (
        SELECT o.id, o.schema_version, o.occurred_at, o.events, o.packed_events
        FROM stint_outbox o,
             set_config('idle_in_transaction_session_timeout', %(hold)s, true) AS hold_limit,
             set_config('synchronous_commit', 'off', true) AS async_commit
        WHERE o.id IN (SELECT id FROM cand) AND o.published_at IS NULL
        FOR UPDATE OF o SKIP LOCKED
    )
    SELECT o.id, e.position, {MESSAGE_SQL}
    FROM leased o {EVENTS_OF}
    UNION ALL
    SELECT max(id), 0, NULL, NULL, NULL FROM cand
    WHERE NOT EXISTS (SELECT FROM leased)
    HAVING count(*) > 0
    ORDER BY 1, 2
"""  # noqa: S608 - constant SQL
MAX_SKIPS = 20  # leases retried past rows other relays hold, per batch
_MARK_SQL = """
    UPDATE stint_outbox SET published_at = clock_timestamp() WHERE id = ANY(%s)
    RETURNING extract(epoch FROM published_at - occurred_at), event_count
"""


class RelayUnavailable(Exception):  # noqa: N818 - a condition, not a bug
    """Kafka did not confirm delivery; the rows stay unpublished and the relay backs off."""


class TopicMissing(RelayUnavailable):
    """The relay's topic does not exist on the broker: it is never created by the relay (see ``OutboxRelay``)."""


@dataclass(slots=True, kw_only=True)
class _Batch:
    leased: int
    published: int
    failed: int
    error: KafkaError | None = None


class OutboxRelay:
    """Background service: publish unpublished outbox rows to Kafka, marking each after its delivery.

    ``run_once`` relays batches until the outbox is empty (at most ``MAX_BATCHES_PER_TICK``) and
    returns how many events it marked published. On a Kafka failure it returns what it marked so
    far and waits ``backoff(failures)`` seconds (0.5 s doubling to 10 s) before trying again;
    every retry first probes the broker with a metadata request, so an outage costs no database
    work. ``on_delivered`` (instrumentation and tests) is called with the ids of the rows whose
    every event was delivered, after a batch's delivery reports and before the mark, inside the
    lease transaction. ``batch_size`` counts events (whole rows are leased up to it).
    Unset arguments come from ``scheduler.kafka.event_stream_conf()``.

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
        conf = event_stream_conf()
        self.bootstrap_servers = bootstrap_servers or conf.bootstrap_servers
        self.topic = topic or conf.topic
        self.partitions = partitions or conf.topic_partitions
        self.batch_size = batch_size or conf.outbox_batch_size
        self.interval_seconds = interval_seconds or conf.outbox_relay_interval_seconds
        self.delivery_timeout_ms = delivery_timeout_ms or conf.delivery_timeout_ms
        self.lock_hold_seconds = conf.outbox_lock_hold_seconds
        self.probe_timeout_seconds = probe_timeout_seconds
        self.backoff_base_seconds = backoff_base_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.on_delivered = on_delivered
        self._clock = clock
        self._producer: Producer | None = None
        self._admin: AdminClient | None = None
        self._topic_ready = False
        self._headers: dict[str, list[tuple[str, bytes]]] = {}  # event type -> its message headers
        self.failures = 0  # consecutive failed rounds
        self.attempts = 0  # rounds tried, i.e. not skipped while backing off
        self.retry_at: float | None = None  # clock() value before which run_once does nothing

    # -- the service protocol -----------------------------------------------------------------

    def run_once(self, now: dt.datetime | None = None) -> int:
        """Relay up to ``MAX_BATCHES_PER_TICK`` batches; return how many events were marked published.

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
            self._admin = AdminClient(
                client_config(self.bootstrap_servers, "stint-outbox-admin", logger_name=KAFKA_LOGGER)
            )
        return self._admin

    def _producer_client(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(
                {
                    **client_config(self.bootstrap_servers, "stint-outbox-relay", logger_name=KAFKA_LOGGER),
                    "enable.idempotence": True,
                    "acks": "all",
                    # Never let a produce to a vanished topic make the broker create it (see the class).
                    "allow.auto.create.topics": False,
                    "linger.ms": LINGER_MS,
                    "compression.type": COMPRESSION,
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
            # The session sits idle in this transaction, holding the row locks, while Kafka confirms.
            params = {"hold": f"{self.lock_hold_seconds}s", "events": self.batch_size, "after": 0}
            for _ in range(MAX_SKIPS):
                cursor.execute(_LEASE_SQL, params)
                events = cursor.fetchall()
                if not events or events[0][2] is not None:
                    break
                params["after"] = events[0][0]  # other relays hold every candidate: look past them
                events = []
            if not events:
                return _Batch(leased=0, published=0, failed=0)
            delivered, failed, error = self._produce(events)
            if self.on_delivered is not None:
                self.on_delivered(delivered)
            published = 0
            if delivered:
                cursor.execute(_MARK_SQL, [delivered])
                observe = metrics.outbox_publish_lag_seconds.observe
                for lag, count in cursor.fetchall():
                    published += count
                    for _ in range(count):  # the lag of each event (they share their row's times)
                        observe(max(0.0, float(lag)))
        return _Batch(leased=len(events), published=published, failed=failed, error=error)

    def _produce(self, events: Sequence[tuple[Any, ...]]) -> tuple[list[int], int, KafkaError | None]:
        """Produce one message per event ``(row id, position, value, key, event type)``, flush.

        Returns (ids of the rows whose every event was delivered, events not delivered, first error).
        An event the producer refuses at once fails alone: the other rows of the batch are still
        marked, its row is not.
        """
        producer = self._producer_client()
        produce, topic, headers = producer.produce, self.topic, self._headers
        reports: list[KafkaError | None | bool] = [False] * len(events)  # False: no report yet

        def report(index: int, err: KafkaError | None) -> None:
            reports[index] = err

        for index, (_row_id, _position, value, key, event_type) in enumerate(events):
            header = headers.get(event_type)
            if header is None:
                header = headers[event_type] = [(HEADER_EVENT_TYPE, event_type.encode())]
            try:
                produce(
                    topic,
                    value=value,
                    key=key,
                    headers=header,
                    on_delivery=lambda err, _msg, index=index: report(index, err),
                )
            except KafkaException as exc:  # refused at once (e.g. larger than message.max.bytes): this event fails
                report(index, exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else KafkaError(-1))
        remaining = producer.flush(self.delivery_timeout_ms / 1000 + FLUSH_GRACE_SECONDS)
        incomplete: set[int] = set()
        failed = 0
        error: KafkaError | None = None
        for (row_id, *_), outcome in zip(events, reports, strict=True):
            if outcome is None:
                continue
            failed += 1
            incomplete.add(row_id)  # a row is marked only when every one of its events was delivered
            if error is None and outcome is not False:
                error = outcome
        delivered = list(dict.fromkeys(row[0] for row in events if row[0] not in incomplete))
        if (remaining or failed) and error is None:
            error = KafkaError(KafkaError._TIMED_OUT, f"{remaining} messages unconfirmed after flush")
        return delivered, failed, error
