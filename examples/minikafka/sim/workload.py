"""The traffic of a run: producer and consumer loops, and what consumers saw."""

from __future__ import annotations

import contextlib
import random
from typing import Literal

from purgatory_aio import Clock

from ..clients.consumer import Consumer, ConsumerRecord
from ..clients.metadata import RecordMetadata
from ..clients.producer import Producer
from ..errors import KafkaError
from .config import SimConfig

SendMode = Literal["async", "sync", "fire-and-forget"]

#: Producers cycle through these ways of sending.
SEND_MODES: tuple[SendMode, ...] = ("async", "sync", "fire-and-forget")

_PAYLOAD = bytes(range(256)) * 64


class ProducerLoop:
    """Sends records at a Poisson rate until ``until``.

    Keys, sizes and delivery delays are drawn from the run's random stream.
    """

    def __init__(
        self,
        producer: Producer,
        mode: SendMode,
        config: SimConfig,
        clock: Clock,
        rng: random.Random,
        until: float,
    ) -> None:
        self.producer = producer
        self.mode = mode
        self._config = config
        self._clock = clock
        self._rng = rng
        self.until = until
        #: Outcomes reported to send callbacks (async mode).
        self.callbacks = 0

    async def run(self) -> None:
        config = self._config
        clock = self._clock
        rng = self._rng
        producer = self.producer
        topic = config.topic
        low, high = max(1, config.record_bytes // 2), config.record_bytes * 3 // 2
        while True:
            await clock.sleep(rng.expovariate(config.rate))
            if clock.time() >= self.until:
                return
            key = None
            if rng.random() < config.keyed_ratio:
                key = b"user-%d" % rng.randrange(1000)
            value = _PAYLOAD[: rng.randint(low, max(low, high))]
            delay = 0.0
            if rng.random() < config.delayed_ratio:
                delay = round(rng.uniform(0.5, config.max_delay), 3)
            if self.mode == "sync":
                with contextlib.suppress(KafkaError):  # failures are in the producer's stats
                    await producer.send_and_wait(topic, value, key, delay=delay)
            elif self.mode == "async":
                producer.send(topic, value, key, delay=delay, callback=self._on_outcome)
            else:
                producer.send(topic, value, key, delay=delay)

    def _on_outcome(self, metadata: RecordMetadata | None, error: BaseException | None) -> None:
        self.callbacks += 1


class Deliveries:
    """What consumers received: counts, end-to-end latency, redeliveries, early sightings."""

    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0
        self.redelivered = 0
        #: Delayed messages received.
        self.delayed = 0
        #: Delayed messages received before their delivery time (must stay 0).
        self.seen_before_due = 0
        #: Seconds from when a record became due (sent, or its delivery time) to receipt.
        self.latencies: list[float] = []
        self._seen: set[tuple[str, int, int]] = set()

    def add(self, records: list[ConsumerRecord], now: float) -> None:
        seen = self._seen
        for tp, offset, record in records:
            self.records += 1
            self.bytes += record.size
            ident = (tp.topic, tp.partition, offset)
            if ident in seen:
                self.redelivered += 1
                continue
            seen.add(ident)
            due = record.timestamp + record.delay
            if record.delay > 0:
                self.delayed += 1
                if now < due:
                    self.seen_before_due += 1
            self.latencies.append(now - due)


class ConsumerLoop:
    """Polls until cancelled, except while silenced (then it neither fetches nor heartbeats)."""

    def __init__(self, consumer: Consumer, clock: Clock, deliveries: Deliveries) -> None:
        self.consumer = consumer
        self._clock = clock
        self._deliveries = deliveries
        self.silent_until = 0.0

    async def run(self) -> None:
        clock = self._clock
        while True:
            now = clock.time()
            if now < self.silent_until:
                await clock.sleep(self.silent_until - now)
                continue
            records = await self.consumer.poll()
            if records:
                self._deliveries.add(records, clock.time())
