"""Consume ``job-lifecycle-events`` into the audit table: every event stored once, offsets committed after the DB.

``AuditConsumer`` is one member of the consumer group ``stint-audit`` (``KAFKA_AUDIT_GROUP``); run
up to as many as the topic has partitions (more sit idle). Each round polls up to ``batch_size`` messages, stores them
(one binary ``COPY`` into a staging table, one ``INSERT ... ON CONFLICT (event_id) DO NOTHING``)
in one transaction, and only then commits the batch's offsets synchronously. A consumer killed
anywhere in that sequence leaves either an uncommitted offset (the batch is delivered again and
the insert skips what is already stored) or nothing at all: nothing is lost and nothing is stored
twice (DESIGN.md, Events).

No message stops the trail (DESIGN.md, "Rules that keep it correct"). One that is not a valid
``LifecycleEvent``, or that parses but that PostgreSQL refuses to store (a payload number such
as ``1e400``, a NUL, a lone surrogate), goes to the quarantine table (``audit.quarantine``) with
its partition, offset, raw bytes and error, and its offset is committed like the others'. When
a batch's insert fails for such a reason, the batch is split in halves until the refused rows
are alone, so the good rows of the batch are stored. Only transient database errors
(``core.dberrors``: a lost connection, a shutdown, a deadlock) are retried, and they are
retried on the batch in hand, with backoff, until it is stored: the consumer never seeks back,
so no offset can be committed past a message it did not store. A jump in a partition's offsets
(messages this consumer never received) is logged and counted; the reconciler in
``run_scheduler`` re-publishes any event that is still missing.

The consumer never creates its topic (nor does the broker for it: librdkafka's consumer default
``allow.auto.create.topics`` is off): a topic that vanished with a broker's data and came back
empty would hide every event it held (finding F7 of docs/chaos-findings.md). A missing topic is
an error in the log, ``audit_topic_missing`` 1 and backoff; ``manage.py create_topics``
provisions it. A running member that holds no partition for ``rejoin_after_seconds`` while its
topic exists and holds events its group has not committed, with no commit progress meanwhile,
replaces its Kafka client (finding F8: after the topic was lost and provisioned again, the old
client stayed assigned nothing on the restarted broker; a new one is assigned at once). It
tries again with backoff while that lasts, and counts each replacement in
``audit_consumer_rejoins_total``. A member that is idle because its group has more members than
partitions sees its peers commit, or nothing to commit, and is left alone.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from audit.models import QuarantineReason
from audit.quarantine import QuarantineEntry, quarantine_store
from core.dberrors import db_error_is_transient, db_error_summary
from scheduler import metrics
from scheduler.events import SCHEMA_VERSION
from scheduler.kafka import client_config, event_stream_conf, topic_exists
from scheduler.retry import backoff
from scheduler.states import EventType, JobStatus

logger = logging.getLogger(__name__)
KAFKA_LOGGER = "audit.consumer.kafka"  # librdkafka's own log lines

BATCH_SIZE = 5000  # messages per poll, stored by one COPY and one INSERT
POLL_TIMEOUT_SECONDS = 1.0  # a poll waits at most this long; also bounds how long a stop takes
FETCH_WAIT_MS = 50  # ms; librdkafka's default of 500 ms adds ~125 ms p50 delivery latency (measured)
RETRY_BASE_SECONDS = 0.5  # database-error backoff
RETRY_MAX_SECONDS = 30.0
START_TIMEOUT_SECONDS = 5.0  # topic check at start-up; retried with backoff
TOPIC_RETRY_MAX_SECONDS = 10.0  # a missing topic is looked for again at least this often (one listing)
REJOIN_AFTER_SECONDS = 10.0  # no partition this long (well past a rebalance) before the client may be stranded
IDLE_CHECK_SECONDS = 5.0  # while no partition is held: how often the topic and the group's commits are read
REJOIN_MAX_SECONDS = 60.0  # the longest wait between two client replacements while stranded
WATCH_TIMEOUT_SECONDS = 2.0  # each metadata, committed-offset and watermark request of the idle check

# Column limit of audit.AuditEvent: a message that would violate it is malformed, not a DB error.
MAX_INT = 2**31 - 1
# What Stint's relay writes (scheduler.events, scheduler.states): any other version, event type or
# status is not a Stint event, whatever its shape, and stays out of the jobs' trails.
SCHEMA_VERSIONS = frozenset({SCHEMA_VERSION})
EVENT_TYPES = frozenset(EventType.values)
STATUSES = frozenset(JobStatus.values)
# The instants an ``occurred_at`` may name, in UTC. PostgreSQL stores far more (4713 BC to 294276 AD),
# but a row Python cannot read back (after 9999-12-31 in UTC) answers 500 on every page that lists
# it, and readers subtract margins from occurred_at (audit.timeline), which year 1 cannot take. No
# Stint event precedes the Unix epoch: occurred_at is the database clock of the transition.
OCCURRED_AT_MIN = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
OCCURRED_AT_MAX = dt.datetime.max.replace(tzinfo=dt.UTC)


class TopicMissing(KafkaException):  # noqa: N818 - a condition, not a bug
    """The consumer's topic does not exist on the broker: the consumer never creates it (see ``AuditConsumer``)."""


class MalformedEvent(ValueError):  # noqa: N818 - the message is malformed
    """The message is not a valid lifecycle event."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRow:
    """One lifecycle event as it is stored in ``stint_audit_event``."""

    event_id: uuid.UUID
    job_id: uuid.UUID
    event_type: str
    owner_id: int | None
    sequence: int
    attempt: int
    from_status: str
    to_status: str
    schema_version: int
    payload: Any
    occurred_at: dt.datetime


def _int(doc: dict[str, Any], key: str, *, nullable: bool = False) -> int | None:
    value = doc.get(key)
    if value is None and nullable:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INT:
        raise MalformedEvent(f"{key} must be a non-negative integer")
    return value


def _choice(doc: dict[str, Any], key: str, allowed: frozenset[str], *, nullable: bool = False) -> str:
    value = doc.get(key)
    if value in (None, "") and nullable:
        return ""
    if not isinstance(value, str) or value not in allowed:
        raise MalformedEvent(f"{key} must be one of {', '.join(sorted(allowed))}{' or null' if nullable else ''}")
    return value


def parse_event(value: bytes | None) -> AuditRow:
    """Decode one message value (a ``scheduler.events.LifecycleEvent``) into an ``AuditRow``.

    ``occurred_at`` is returned in UTC. Raises MalformedEvent when the value is not JSON (or
    nested too deep to read), a field is missing or has the wrong type, ``schema_version``,
    ``event_type``, ``from_status`` (null allowed) or ``to_status`` is not one Stint writes
    (``SCHEMA_VERSIONS``, ``EVENT_TYPES``, ``STATUSES``), ``payload`` is not a JSON object, or
    ``occurred_at`` has no time zone offset or is, in UTC, outside
    ``OCCURRED_AT_MIN``..``OCCURRED_AT_MAX`` (1970 to the end of 9999).
    """
    try:
        doc = json.loads(value or b"")
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the interpreter's stack
        raise MalformedEvent(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise MalformedEvent("not a JSON object")
    try:
        event_id = uuid.UUID(str(doc["event_id"]))
        job_id = uuid.UUID(str(doc["job_id"]))
        occurred_at = dt.datetime.fromisoformat(str(doc["occurred_at"]).replace("Z", "+00:00"))
    except (KeyError, ValueError) as exc:
        raise MalformedEvent(f"bad event_id, job_id or occurred_at: {exc}") from exc
    schema_version = _int(doc, "schema_version")
    if schema_version not in SCHEMA_VERSIONS:
        raise MalformedEvent(f"schema_version must be one of {', '.join(map(str, sorted(SCHEMA_VERSIONS)))}")
    payload = doc.get("payload")
    if not isinstance(payload, dict):
        raise MalformedEvent("payload must be a JSON object")
    return AuditRow(
        event_id=event_id,
        job_id=job_id,
        event_type=_choice(doc, "event_type", EVENT_TYPES),
        owner_id=_int(doc, "owner_id", nullable=True),
        sequence=_int(doc, "sequence"),
        attempt=_int(doc, "attempt"),
        from_status=_choice(doc, "from_status", STATUSES, nullable=True),
        to_status=_choice(doc, "to_status", STATUSES),
        schema_version=schema_version,
        payload=payload,
        occurred_at=_in_utc(occurred_at),
    )


def _in_utc(occurred_at: dt.datetime) -> dt.datetime:
    if occurred_at.tzinfo is None:
        raise MalformedEvent("occurred_at needs a time zone offset")
    try:
        in_utc = occurred_at.astimezone(dt.UTC)
    except OverflowError:  # e.g. 9999-12-31T23:59:59-14:00 is in year 10000 in UTC
        in_utc = None
    if in_utc is None or not OCCURRED_AT_MIN <= in_utc <= OCCURRED_AT_MAX:
        raise MalformedEvent(
            f"occurred_at {occurred_at.isoformat()} is not, in UTC, between {OCCURRED_AT_MIN.isoformat()}"
            f" and {OCCURRED_AT_MAX.isoformat()}"
        )
    return in_utc


# The staging table of ``audit_events_store``: a session's own (TEMP), filled by binary COPY and
# emptied by the statement that moves its rows into the audit table.
_STAGE_COLUMNS = (
    ("event_id", "uuid"),
    ("job_id", "uuid"),
    ("event_type", "text"),
    ("owner_id", "int8"),
    ("sequence", "int4"),
    ("attempt", "int4"),
    ("from_status", "text"),
    ("to_status", "text"),
    ("schema_version", "int2"),
    ("payload", "jsonb"),
    ("occurred_at", "timestamptz"),
)
_NAMES = ", ".join(name for name, _ in _STAGE_COLUMNS)
_STAGE_SQL = (
    "CREATE TEMP TABLE IF NOT EXISTS stint_audit_stage ("
    + ", ".join(f"{name} {kind}" for name, kind in _STAGE_COLUMNS)
    + ")"
)
_COPY_SQL = f"COPY stint_audit_stage ({_NAMES}) FROM STDIN (FORMAT BINARY)"
_MOVE_SQL = f"""
    WITH staged AS (DELETE FROM stint_audit_stage RETURNING *)
    INSERT INTO stint_audit_event ({_NAMES}, received_at)
    SELECT {_NAMES}, clock_timestamp() FROM staged
    ON CONFLICT (event_id) DO NOTHING
"""  # noqa: S608 - constant column names


def audit_events_store(*, rows: Sequence[AuditRow]) -> int:
    """Insert ``rows`` with ``ON CONFLICT (event_id) DO NOTHING``; return how many were new.

    The rows go to a session-private staging table by one binary ``COPY`` and from there into
    ``stint_audit_event`` by one statement: a few round trips per batch, and no Python quoting
    of values. ``received_at`` is the database's ``clock_timestamp()``. Runs in the caller's
    transaction (a rollback empties the staging table too). Raises ``DatabaseError`` when
    PostgreSQL refuses a row (e.g. ``DataError`` for ``Infinity`` or ``\u0000`` in a payload) or
    the connection fails, and ``ValueError`` when a value cannot even be sent (a lone surrogate
    in the payload): ``audit_batch_store`` tells them apart.
    """
    if not rows:
        return 0
    unique = list({row.event_id: row for row in rows}.values())
    with connection.cursor() as cursor:
        # Every time: a rolled-back transaction (a refused half, a test's) takes the table's creation with it.
        cursor.execute(_STAGE_SQL)
        # Django wraps its own statements' errors (DataError, OperationalError, ...); COPY goes to psycopg directly.
        with connection.wrap_database_errors, cursor.copy(_COPY_SQL) as copy:
            copy.set_types([kind for _, kind in _STAGE_COLUMNS])
            write = copy.write_row
            for r in unique:
                write(
                    (
                        r.event_id,
                        r.job_id,
                        r.event_type,
                        r.owner_id,
                        r.sequence,
                        r.attempt,
                        r.from_status,
                        r.to_status,
                        r.schema_version,
                        Jsonb(r.payload),
                        r.occurred_at,
                    )
                )
        cursor.execute(_MOVE_SQL)
        return cursor.rowcount


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivered:
    """One message as the consumer received it: where it sits in the topic, and its raw key and value."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @classmethod
    def of(cls, message: Message) -> Delivered:
        """Copy what the consumer needs out of a confluent-kafka ``Message``."""
        return cls(
            topic=message.topic(),
            partition=message.partition(),
            offset=message.offset(),
            key=message.key(),
            value=message.value(),
        )

    def quarantined(self, *, reason: QuarantineReason, error: str, row: AuditRow | None = None) -> QuarantineEntry:
        """Return the quarantine entry of this message."""
        return QuarantineEntry(
            topic=self.topic,
            partition=self.partition,
            offset=self.offset,
            key=self.key,
            value=self.value,
            reason=reason,
            error=error,
            event_id=row.event_id if row is not None else None,
            job_id=row.job_id if row is not None else None,
        )


def audit_batch_store(*, items: Sequence[tuple[Delivered, AuditRow]]) -> tuple[int, list[QuarantineEntry]]:
    """Store the rows of ``items``, setting aside those PostgreSQL refuses; return (new rows, refused entries).

    Tries the whole batch in one transaction (``audit_events_store``). If that fails for a reason
    that is not transient (``core.dberrors.db_error_is_transient``: the data's fault, e.g.
    ``DataError`` for ``Infinity`` in a payload, or a ``UnicodeEncodeError`` from a lone
    surrogate), the batch is split in halves, each stored in its own transaction, recursively:
    k refused rows among n cost about 2·k·log2(n) statements, and every other row is stored.
    A refused row becomes a ``QuarantineEntry`` (reason REFUSED) with the error's text.

    Raises the error when it is transient (the caller retries the whole batch; rows stored
    meanwhile are skipped by ``ON CONFLICT``). Must not run inside another transaction whose
    rollback would undo the halves already stored.
    """
    stored = 0
    refused: list[QuarantineEntry] = []

    def store(part: Sequence[tuple[Delivered, AuditRow]]) -> None:
        nonlocal stored
        try:
            with transaction.atomic():
                stored += audit_events_store(rows=[row for _, row in part])
        except Exception as exc:  # the data's fault unless transient: isolate it, never stop on it
            if db_error_is_transient(exc):
                raise
            if len(part) == 1:
                delivered, row = part[0]
                refused.append(
                    delivered.quarantined(reason=QuarantineReason.REFUSED, error=_describe_error(exc), row=row)
                )
                return
            middle = len(part) // 2
            store(part[:middle])
            store(part[middle:])

    if items:
        store(items)
    return stored, refused


def _describe_error(exc: BaseException) -> str:
    sqlstate = getattr(exc, "sqlstate", None) or getattr(exc.__cause__, "sqlstate", None)
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}{f' ({sqlstate})' if sqlstate else ''}: {text}"


class AuditConsumer:
    """Consumer-group member that stores lifecycle events in the audit table (see module docstring).

    ``run()`` loops until ``stop_event`` is set (the management command sets it on SIGTERM/SIGINT),
    finishing the batch in hand first. Tests drive it with ``start()``, ``run_once()`` and
    ``close()``. Counters: ``received`` (messages), ``stored`` (new rows), ``quarantined``
    (messages set aside), ``gaps`` (offsets never received), ``rejoins`` (Kafka clients
    replaced because they were stranded without partitions).
    """

    def __init__(
        self,
        *,
        bootstrap_servers: str | None = None,
        topics: Sequence[str] | None = None,
        group_id: str | None = None,
        batch_size: int = BATCH_SIZE,
        poll_timeout: float = POLL_TIMEOUT_SECONDS,
        session_timeout_ms: int | None = None,
        stop_event: threading.Event | None = None,
        retry_base_seconds: float = RETRY_BASE_SECONDS,
        rejoin_after_seconds: float = REJOIN_AFTER_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        conf = event_stream_conf()
        self.bootstrap_servers = bootstrap_servers or conf.bootstrap_servers
        self.topics = list(topics or [conf.topic])
        self.group_id = group_id or conf.audit_group
        self.partitions = conf.topic_partitions
        self.batch_size = batch_size
        self.poll_timeout = poll_timeout
        self.session_timeout_ms = session_timeout_ms or conf.session_timeout_ms
        self.stop_event = stop_event or threading.Event()
        self.retry_base_seconds = retry_base_seconds
        self.rejoin_after_seconds = rejoin_after_seconds
        self._clock = clock
        self._consumer: Consumer | None = None
        self._idle_since: float | None = None  # clock() when this member was last seen holding no partition
        self._next_check = 0.0  # clock() before which the idle check does nothing
        self._next_rejoin = 0.0  # clock() before which the client is not replaced again
        self._committed: dict[tuple[str, int], int] | None = None  # the group's commits at the last idle check
        self._missing_logged = False
        self.rejoins = 0  # Kafka clients replaced, in all
        self._stranded_rejoins = 0  # replacements since this member last held a partition
        # (topic, partition) -> the offset after the last message received; reset on (re)assignment.
        self._next_offset: dict[tuple[str, int], int] = {}
        self.received = 0
        self.stored = 0
        self.quarantined = 0
        self.gaps = 0

    def start(self) -> None:
        """Look for the topics, then join the group (the first poll completes the join).

        Raises ``TopicMissing`` (after logging it and setting ``audit_topic_missing``) when a
        topic does not exist: it is never created here (see the module docstring). Raises
        KafkaException when the broker does not answer within 5 s.
        """
        admin = AdminClient(client_config(self.bootstrap_servers, "stint-audit-admin", logger_name=KAFKA_LOGGER))
        missing = [t for t in self.topics if not topic_exists(admin, t, timeout=START_TIMEOUT_SECONDS)]
        self._topic_missing(missing)
        if missing:
            raise TopicMissing(f"topic {', '.join(missing)} does not exist")
        self._consumer = self._new_client()
        self._idle_since = None

    def _new_client(self) -> Consumer:
        consumer = Consumer(
            {
                **client_config(
                    self.bootstrap_servers,
                    f"stint-audit-{socket.gethostname()}-{os.getpid()}",
                    logger_name=KAFKA_LOGGER,
                ),
                "group.id": self.group_id,
                "enable.auto.commit": False,
                # We commit explicit offsets; nothing is stored implicitly by a poll.
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": self.session_timeout_ms,
                # The broker holds an empty fetch this long: bounds the added latency (default 500 ms).
                "fetch.wait.max.ms": FETCH_WAIT_MS,
                # Subscribing must never make the broker create a missing topic (the librdkafka default).
                "allow.auto.create.topics": False,
            }
        )
        consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke)
        return consumer

    def run(self) -> None:
        """Consume until ``stop_event`` is set, then leave the group.

        Kafka unreachable at start-up backs off (0.5 s doubling to 30 s) and retries, a missing
        topic likewise (up to 10 s), and so does the database while a batch is in hand
        (``run_once``); none of them ends the process. Any other
        exception (a fatal Kafka error, a bug) is raised after leaving the group: the batch in
        hand was not committed, so whoever consumes next gets it again.
        """
        failures = 0
        while self._consumer is None and not self.stop_event.is_set():
            try:
                self.start()
            except TopicMissing:
                failures += 1
                self.stop_event.wait(backoff(failures, base=self.retry_base_seconds, cap=TOPIC_RETRY_MAX_SECONDS))
            except KafkaException as exc:
                failures += 1
                delay = backoff(failures, base=self.retry_base_seconds, cap=RETRY_MAX_SECONDS)
                logger.warning("audit consumer: Kafka unavailable at start-up (%s); retry in %.1f s", exc, delay)
                self.stop_event.wait(delay)
        try:
            while not self.stop_event.is_set():
                self.run_once()
        finally:
            self.close()
        logger.info(
            "audit consumer stopped: %d received, %d stored, %d quarantined, %d offsets never received",
            self.received,
            self.stored,
            self.quarantined,
            self.gaps,
        )

    def run_once(self, timeout: float | None = None) -> int:
        """Poll one batch, store it (quarantining what cannot be stored), then commit its offsets; return new rows.

        A transient database error is retried on the same batch (0.5 s doubling to 30 s) until the
        batch is stored, so this returns only once it is, or when ``stop_event`` is set meanwhile
        (then nothing is committed and the batch is delivered again to whoever consumes next). An
        outage longer than librdkafka's ``max.poll.interval.ms`` (300 s) makes the client leave
        the group: the commit then fails (logged), the client rejoins at its next poll, and the
        batch, stored by then, is delivered again and skipped by ``ON CONFLICT``.

        First, when this member holds no partition, checks whether its client is stranded and
        replaces it (see the module docstring; at most every ``IDLE_CHECK_SECONDS``).
        """
        self._watch_assignment()
        consumer = self._require()
        # Wait for the first message, then take what is already fetched, up to a batch: a batch is
        # whatever arrived meanwhile, so a quiet topic adds no wait for a batch to fill.
        messages = consumer.consume(num_messages=1, timeout=self.poll_timeout if timeout is None else timeout)
        if not messages:
            return 0
        if self.batch_size > 1:
            messages += consumer.consume(num_messages=self.batch_size - 1, timeout=0)
        batch: list[Message] = []
        items: list[tuple[Delivered, AuditRow]] = []
        malformed: list[QuarantineEntry] = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                logger.warning("audit consumer: %s", error)
                continue
            batch.append(message)
            delivered = Delivered.of(message)
            self._note_offset(delivered)
            try:
                items.append((delivered, parse_event(delivered.value)))
            except Exception as exc:  # MalformedEvent, or anything else one value provokes: never stop on it
                why = str(exc) if isinstance(exc, MalformedEvent) else _describe_error(exc)
                malformed.append(delivered.quarantined(reason=QuarantineReason.MALFORMED, error=why))
        if not batch:
            return 0
        self.received += len(batch)
        stored = self._store(items, malformed)
        if stored is None:
            return 0
        self._commit(batch)
        logger.debug("audit consumer: %d events received, %d new", len(batch), stored)
        return stored

    def assignment(self) -> list[tuple[str, int]]:
        """Return the (topic, partition) pairs this member holds now (empty before ``start()``)."""
        if self._consumer is None:
            return []
        return sorted((tp.topic, tp.partition) for tp in self._consumer.assignment())

    def stop(self) -> None:
        """Ask ``run()`` to return after the batch in hand."""
        self.stop_event.set()

    def close(self) -> None:
        """Leave the group (so its partitions move to other members at once) and drop the client."""
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    # -- internals ------------------------------------------------------------------------------

    def _require(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("AuditConsumer.start() was not called")
        return self._consumer

    def _store(self, items: Sequence[tuple[Delivered, AuditRow]], malformed: Sequence[QuarantineEntry]) -> int | None:
        """Store the batch and its quarantine, retrying transient errors; None if stopped first."""
        failures = 0
        while True:
            try:
                stored, refused = audit_batch_store(items=items)
                entries = [*malformed, *refused]
                self._quarantine(entries)
                break
            except Exception as exc:
                if not db_error_is_transient(exc):
                    raise  # audit_batch_store and _quarantine handle the data's errors themselves
                failures += 1
                delay = backoff(failures, base=self.retry_base_seconds, cap=RETRY_MAX_SECONDS)
                logger.warning("audit consumer: %s; retrying the batch in hand in %.1f s", db_error_summary(exc), delay)
                connection.close()  # reconnect for the next attempt
                if self.stop_event.wait(delay):
                    logger.info("audit consumer: stopping with a batch not stored; it will be delivered again")
                    return None
        self.stored += stored
        metrics.audit_events_stored_total.inc(stored)
        for entry in entries:
            self.quarantined += 1
            metrics.audit_messages_quarantined_total.labels(entry.reason.value).inc()
            logger.error(
                "audit consumer: quarantined %s[%d]@%d (%s): %s",
                entry.topic,
                entry.partition,
                entry.offset,
                entry.reason.label,
                entry.error,
                extra={"job_id": str(entry.job_id)} if entry.job_id else None,
            )
        return stored

    def _quarantine(self, entries: Sequence[QuarantineEntry]) -> None:
        """Write ``entries`` to the quarantine table; one that even that refuses is logged in full.

        Raises only transient database errors.
        """
        if not entries:
            return
        try:
            with transaction.atomic():
                quarantine_store(entries=entries)
            return
        except Exception as exc:  # never stop on one entry: retry each alone below
            if db_error_is_transient(exc):
                raise
        for entry in entries:
            try:
                with transaction.atomic():
                    quarantine_store(entries=[entry])
            except Exception as exc:
                if db_error_is_transient(exc):
                    raise
                logger.error(
                    "audit consumer: cannot quarantine %s[%d]@%d (%s); its value (first 200 bytes) was %r",
                    entry.topic,
                    entry.partition,
                    entry.offset,
                    _describe_error(exc),
                    (entry.value or b"")[:200],
                )

    def _note_offset(self, delivered: Delivered) -> None:
        """Log and count a jump in a partition's offsets: messages this consumer never received."""
        key = (delivered.topic, delivered.partition)
        expected = self._next_offset.get(key)
        if expected is not None and delivered.offset > expected:
            missed = delivered.offset - expected
            self.gaps += missed
            metrics.audit_offset_gaps_total.inc(missed)
            logger.warning(
                "audit consumer: %s[%d] jumped from offset %d to %d: %d messages never reached this consumer;"
                " the reconciler re-publishes any event they held",
                delivered.topic,
                delivered.partition,
                expected,
                delivered.offset,
                missed,
            )
        self._next_offset[key] = delivered.offset + 1

    def _commit(self, batch: Sequence[Message]) -> None:
        last: dict[tuple[str, int], int] = {}
        for message in batch:
            key = (message.topic(), message.partition())
            last[key] = max(last.get(key, -1), message.offset())
        offsets = [TopicPartition(topic, partition, offset + 1) for (topic, partition), offset in last.items()]
        try:
            self._require().commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # Stored but not committed: after a rebalance these are delivered again and skipped.
            logger.warning("audit consumer: offset commit failed (%s); the batch may be delivered again", exc)

    def _topic_missing(self, missing: Sequence[str]) -> None:
        """Show (gauge, one error per spell) or clear that a topic of this consumer does not exist."""
        metrics.audit_topic_missing.set(1 if missing else 0)
        if missing and not self._missing_logged:
            logger.error(
                "audit consumer: topic %s does not exist; the consumer never creates it (a lost topic re-created"
                " empty would hide the events it held): provision it with `manage.py create_topics`",
                ", ".join(missing),
            )
        elif not missing and self._missing_logged:
            logger.info("audit consumer: topic %s exists again", ", ".join(self.topics))
        self._missing_logged = bool(missing)

    def _watch_assignment(self) -> None:
        """Replace a client stranded without partitions (finding F8); see the module docstring."""
        consumer = self._consumer
        if consumer is None:
            return
        now = self._clock()
        if consumer.assignment():
            self._idle_since, self._committed, self._stranded_rejoins = None, None, 0
            return
        if self._idle_since is None:
            self._idle_since, self._next_check = now, now + IDLE_CHECK_SECONDS
            return
        if now < self._next_check:
            return
        self._next_check = now + IDLE_CHECK_SECONDS
        try:
            partitions, lag, committed = self._group_position(consumer)
        except KafkaException as exc:  # the broker is away: nothing to decide now
            logger.debug("audit consumer: idle check failed (%s)", exc)
            return
        previous, self._committed = self._committed, committed
        if partitions is None:
            return
        idle = now - self._idle_since
        if idle < self.rejoin_after_seconds or now < self._next_rejoin or lag <= 0 or previous != committed:
            return
        self._stranded_rejoins += 1
        wait = backoff(self._stranded_rejoins, base=self.rejoin_after_seconds, cap=REJOIN_MAX_SECONDS)
        self._next_rejoin = now + wait
        logger.warning(
            "audit consumer %s: no partition assigned for %.0f s while %s exists with %d events its group has not"
            " committed; replacing its Kafka client (attempt %d; the next no sooner than in %.0f s)",
            self.group_id,
            idle,
            ", ".join(self.topics),
            lag,
            self._stranded_rejoins,
            wait,
        )
        self._consumer = None
        try:
            consumer.close()
        except Exception as exc:  # a client that cannot even leave cleanly is dropped all the same
            logger.warning("audit consumer: closing the stranded client failed (%s)", exc)
        self._next_offset.clear()
        self._consumer = self._new_client()
        self._idle_since, self._committed = now, None
        self.rejoins += 1
        metrics.audit_consumer_rejoins_total.inc()

    def _group_position(self, consumer: Consumer) -> tuple[int | None, int, dict[tuple[str, int], int]]:
        """Return (partitions of the topics or None if one is missing, events not committed, commits per partition).

        Reads the topic list (which creates nothing), the group's committed offsets and each
        partition's watermarks. Raises KafkaException when the broker does not answer.
        """
        listed = consumer.list_topics(timeout=WATCH_TIMEOUT_SECONDS).topics
        missing = [t for t in self.topics if t not in listed or listed[t].error is not None]
        self._topic_missing(missing)
        if missing:
            return None, 0, {}
        wanted = [TopicPartition(t, p) for t in self.topics for p in sorted(listed[t].partitions)]
        committed = {
            (tp.topic, tp.partition): tp.offset for tp in consumer.committed(wanted, timeout=WATCH_TIMEOUT_SECONDS)
        }
        lag = 0
        for (topic, partition), offset in committed.items():
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=WATCH_TIMEOUT_SECONDS, cached=False
            )
            lag += max(0, high - (low if offset in (OFFSET_INVALID, None) or offset < low else offset))
        return len(wanted), lag, committed

    def _forget(self, partitions: Sequence[TopicPartition]) -> None:
        # A (re)assigned partition starts at the group's committed offset, wherever that is.
        for tp in partitions:
            self._next_offset.pop((tp.topic, tp.partition), None)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget(partitions)
        logger.info("audit consumer %s: assigned %s", self.group_id, _describe(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget(partitions)
        logger.info("audit consumer %s: revoked %s", self.group_id, _describe(partitions))


def _describe(partitions: Sequence[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ", ".join(f"{t}{sorted(p)}" for t, p in sorted(by_topic.items())) or "nothing"
