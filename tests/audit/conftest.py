"""Fixtures of the audit tests: the real-Kafka helpers of tests/kafka_support.py."""

from __future__ import annotations

from tests.kafka_support import audit_pool, fresh_topic, kafka_topic, private_broker  # noqa: F401 - fixtures
