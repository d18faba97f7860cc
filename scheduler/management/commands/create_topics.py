"""``manage.py create_topics``: provision the Kafka topic of lifecycle events (a deployment step, like migrate)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaException
from django.core.management.base import BaseCommand, CommandError

from core.command_line import positive_float
from scheduler.kafka import ADMIN_TIMEOUT_SECONDS, ensure_topic, event_stream_conf


class Command(BaseCommand):
    """Create ``KAFKA_TOPIC`` with ``KAFKA_TOPIC_PARTITIONS`` partitions unless it exists.

    The outbox relay never creates it (a lost topic re-created empty would hide the events it
    held); run this when deploying, and after a topic was lost, once its loss is understood; then
    restart the audit consumers (a running one is not assigned the re-created topic's partitions,
    docs/chaos-findings.md F8), and the event-trail reconciler re-publishes what the audit table
    misses.
    """

    help = "Create the Kafka topic of lifecycle events unless it exists."

    def add_arguments(self, parser: Any) -> None:
        """``--timeout SECONDS``: how long the broker may take to answer (default 10)."""
        parser.add_argument(
            "--timeout", type=positive_float, default=ADMIN_TIMEOUT_SECONDS, help="seconds (default 10)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Create the topic; exit 1 with the broker's error when it cannot be reached or refuses."""
        conf = event_stream_conf()
        topic = conf.topic
        try:
            created = ensure_topic(
                bootstrap_servers=conf.bootstrap_servers,
                topic=topic,
                partitions=conf.topic_partitions,
                timeout=options["timeout"],
            )
        except KafkaException as exc:
            raise CommandError(f"could not create topic {topic}: {exc}") from exc
        self.stdout.write(f"topic {topic}: {'created' if created else 'exists'}")
