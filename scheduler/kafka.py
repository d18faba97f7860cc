"""Kafka for the event trail: the typed settings, the client configuration and the topic's creation.

Shared by the outbox relay (``scheduler.maintenance.relay``) and the audit consumer
(``audit.consumer``), so both read one set of settings and create the topic the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

if TYPE_CHECKING:  # confluent_kafka loads librdkafka: imported where a client is made, not by every process
    from confluent_kafka.admin import AdminClient

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 2.0  # seconds for the metadata request that tests the broker
ADMIN_TIMEOUT_SECONDS = 10.0  # seconds for topic creation
RECONNECT_BACKOFF_MAX_MS = 1000  # reconnect within a second of the broker's return, not librdkafka's 10 s
TOPIC_REPLICATION = -1  # the broker's default.replication.factor


@dataclass(frozen=True, slots=True, kw_only=True)
class EventStreamConf:
    """The settings of the event trail (config/settings.py reads them from the environment); units in the names."""

    bootstrap_servers: str  # KAFKA_BOOTSTRAP_SERVERS
    topic: str  # KAFKA_TOPIC
    topic_partitions: int  # KAFKA_TOPIC_PARTITIONS
    session_timeout_ms: int  # KAFKA_SESSION_TIMEOUT_MS (consumers)
    audit_group: str  # KAFKA_AUDIT_GROUP
    delivery_timeout_ms: int  # KAFKA_DELIVERY_TIMEOUT_MS: every delivery report arrives within it
    outbox_batch_size: int  # OUTBOX_BATCH_SIZE: events the relay leases (whole rows), produces and marks together
    outbox_relay_interval_seconds: float  # OUTBOX_RELAY_INTERVAL_SECONDS
    outbox_retention_days: int  # OUTBOX_RETENTION_DAYS: published rows kept this long
    outbox_lock_hold_seconds: int  # OUTBOX_LOCK_HOLD_SECONDS: a stuck relay's session ends after this
    audit_reconcile_after_seconds: int  # AUDIT_RECONCILE_AFTER_SECONDS
    audit_quarantine_retention_days: int  # AUDIT_QUARANTINE_RETENTION_DAYS (0: kept)


def event_stream_conf() -> EventStreamConf:
    """Return the current settings as an ``EventStreamConf`` (read at each call: tests override settings).

    Raises AttributeError when a setting is missing: config/settings.py defines every one.
    """
    return EventStreamConf(
        bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS,
        topic=settings.KAFKA_TOPIC,
        topic_partitions=settings.KAFKA_TOPIC_PARTITIONS,
        session_timeout_ms=settings.KAFKA_SESSION_TIMEOUT_MS,
        audit_group=settings.KAFKA_AUDIT_GROUP,
        delivery_timeout_ms=settings.KAFKA_DELIVERY_TIMEOUT_MS,
        outbox_batch_size=settings.OUTBOX_BATCH_SIZE,
        outbox_relay_interval_seconds=settings.OUTBOX_RELAY_INTERVAL_SECONDS,
        outbox_retention_days=settings.OUTBOX_RETENTION_DAYS,
        outbox_lock_hold_seconds=settings.OUTBOX_LOCK_HOLD_SECONDS,
        audit_reconcile_after_seconds=settings.AUDIT_RECONCILE_AFTER_SECONDS,
        audit_quarantine_retention_days=settings.AUDIT_QUARANTINE_RETENTION_DAYS,
    )


def client_config(bootstrap_servers: str, client: str, *, logger_name: str) -> dict[str, Any]:
    """Return the librdkafka settings every Stint client shares: servers, client id, logging, reconnects.

    ``logger_name`` is the Python logger that receives librdkafka's own log lines at their levels.
    """
    return {
        "bootstrap.servers": bootstrap_servers,
        "client.id": client,
        "logger": logging.getLogger(logger_name),
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
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = admin or AdminClient(client_config(bootstrap_servers, "stint-admin", logger_name="scheduler.kafka.admin"))
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
