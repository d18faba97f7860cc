"""Fixtures of the audit tests: the real-Kafka helpers of tests/support/kafka.py."""

from __future__ import annotations

from tests.support.kafka import audit_pool, fresh_topic, kafka_topic, private_broker  # noqa: F401 - fixtures
