"""A Kafka scan: read the lifecycle topic from the beginning, without a consumer group, and count each event id.

``TopicScanner`` runs in a thread for the whole run, so it sees each message within a fraction of
a second of its delivery. After a broker restart the runner calls ``restart()``: the in-memory
broker starts an empty log, and Tansu answers a fetch above a partition's end with nothing
rather than OFFSET_OUT_OF_RANGE, so the old positions would wait until the new log grew past
them and skip everything before (seen: no message scanned for six scenarios after
``broker-restart``). ``catch_up`` waits until every partition has been read to its high
watermark.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import Counter

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.2


class TopicScanner:
    """Counts messages per ``event_id`` on ``topic``; ``copies`` is the Counter, read under ``lock``."""

    def __init__(self, *, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.copies: Counter[str] = Counter()
        self.messages = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._restart = threading.Event()
        self._positions: dict[int, int] = {}
        self._thread = threading.Thread(target=self._run, name="chaos-kafka-scan", daemon=True)
        self._consumer: Consumer | None = None

    def start(self) -> None:
        """Start reading in the background."""
        self._thread.start()

    def restart(self) -> None:
        """Read the topic from its beginning again with a new client (after the broker lost its log)."""
        self._restart.set()

    def stop(self) -> None:
        """Stop reading and close the client."""
        self._stop.set()
        self._thread.join(timeout=10)

    def _client(self) -> Consumer:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"chaos-scan-{uuid.uuid4().hex[:8]}",  # never committed: only used for fetching
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "reconnect.backoff.max.ms": 1000,
                "fetch.wait.max.ms": 50,
                "log_level": 0,
            }
        )
        consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)])
        return consumer

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._restart.is_set():
                    self._restart.clear()
                    self._close()
                    self._positions.clear()
                if self._consumer is None:
                    self._consumer = self._client()
                for message in self._consumer.consume(num_messages=1000, timeout=POLL_SECONDS):
                    if message.error() is not None:
                        continue
                    self._positions[message.partition()] = message.offset() + 1
                    try:
                        event_id = json.loads(message.value())["event_id"]
                    except (ValueError, KeyError, TypeError):
                        continue
                    with self.lock:
                        self.copies[str(event_id)] += 1
                        self.messages += 1
            except KafkaException as exc:
                logger.info("kafka scan: %s; reconnecting", exc)
                self._close()
                self._stop.wait(1.0)
        self._close()

    def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close()
            except (KafkaException, RuntimeError):
                pass

    def caught_up(self, probe: Consumer) -> bool:
        """True when every partition has been read up to its current high watermark (asked through ``probe``).

        The watermarks are asked through a second client: a librdkafka consumer is not to be
        called from two threads at once (measured: the call blocks while the scan thread polls).
        """
        try:
            for p in range(self.partitions):
                _, high = probe.get_watermark_offsets(TopicPartition(self.topic, p), timeout=2, cached=False)
                if high > 0 and self._positions.get(p, 0) < high:
                    return False
        except (KafkaException, RuntimeError):
            return False
        return True

    def catch_up(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until ``caught_up()``; return whether it was."""
        probe = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": f"chaos-probe-{uuid.uuid4().hex[:8]}", "log_level": 0}
        )
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.caught_up(probe):
                    return True
                time.sleep(0.2)
            return False
        finally:
            probe.close()

    def snapshot(self) -> dict[str, int]:
        """A copy of the per-event-id counts."""
        with self.lock:
            return dict(self.copies)
