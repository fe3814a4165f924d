"""The simulation driver: a cluster, its clients, faults, and a clock to run them on."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from purgatory_aio import Clock, EventSink, LoopClock, Timer
from purgatory_aio.testing import ManualClock

from ..broker.cluster import Cluster
from ..broker.config import BrokerConfig
from ..clients.config import Acks, ConsumerConfig, ProducerConfig, parse_acks
from ..clients.consumer import Consumer
from ..clients.producer import Producer
from ..protocol import CreateTopicsRequest, TopicSpec
from .config import SimConfig
from .faults import FaultPlan
from .network import Latency
from .report import Report, build_report
from .sinks import OutcomeTally
from .workload import SEND_MODES, ConsumerLoop, Deliveries, ProducerLoop

T = TypeVar("T")

#: ``acks`` of producer ``i`` under ``--acks mixed`` is ``MIXED_ACKS[i % 3]``.
MIXED_ACKS: tuple[Acks, ...] = (-1, 1, 0)

#: Called with (seconds simulated so far, a one-line status).
ProgressCallback = Callable[[float, str], None]


@dataclass
class RunState:
    """Everything a run produced, for the report."""

    config: SimConfig
    cluster: Cluster
    start: float
    elapsed: float = 0.0
    producers: list[ProducerLoop] = field(default_factory=list)
    consumers: list[ConsumerLoop] = field(default_factory=list)
    deliveries: Deliveries = field(default_factory=Deliveries)
    faults: FaultPlan | None = None
    tally: OutcomeTally = field(default_factory=OutcomeTally)
    #: Records sent but neither acknowledged nor failed when the run stopped.
    unsettled: int = 0
    #: Records each producer (by index) saw fail while the run went on, leaving out the
    #: unsettled ones that closing the producer fails afterwards.
    failed_in_run: list[int] = field(default_factory=list)


class Simulation:
    """Runs producers and a consumer group against a :class:`Cluster` for ``duration``.

    With ``virtual_time`` everything (purgatories, timers, client sleeps) runs
    on one :class:`~purgatory_aio.testing.ManualClock` that the driver advances:
    minutes of traffic take seconds, and one seed gives one report. Otherwise
    the run takes ``duration`` real seconds.

    Args:
        config: what to run.
        event_sink: receives every settled operation of the cluster's purgatories.
        progress: called every 1% of the run with the time simulated and a status line.
    """

    def __init__(
        self,
        config: SimConfig,
        *,
        event_sink: EventSink | None = None,
        progress: ProgressCallback | None = None,
    ) -> None:
        problems = config.problems()
        if problems:
            raise ValueError("; ".join(problems))
        self.config = config
        self._event_sink = event_sink
        self._progress = progress
        self._rng = random.Random(config.seed)
        self._clock: Clock = ManualClock() if config.virtual_time else LoopClock()
        self._tasks: list[asyncio.Task[None]] = []
        self._next_producer_id = 0

    async def run(self) -> Report:
        config = self.config
        clock = self._clock
        rng = self._rng
        tally = OutcomeTally(self._event_sink)
        broker_config = BrokerConfig(
            brokers=config.brokers,
            min_insync_replicas=config.effective_min_insync,
            replica_lag_time_max=config.replica_lag_time_max,
        )
        cluster = Cluster(
            broker_config,
            clock=clock,
            event_sink=tally,
            follower_latency=Latency(rng, config.network_latency),
        )
        timer = Timer(clock=clock)
        state = RunState(config, cluster, clock.time(), tally=tally)
        try:
            topic = TopicSpec(config.partitions, config.replicas)
            created = await self._until_done(
                cluster.create_topics(CreateTopicsRequest({config.topic: topic}))
            )
            errors = [e.name for e in created.errors.values() if e.value]
            if errors:
                raise RuntimeError(f"creating topic {config.topic!r} failed: {', '.join(errors)}")
            start = state.start = clock.time()
            end = start + config.duration
            for i in range(config.producers):
                self._start_producer(state, timer, i, end)
            for i in range(config.consumers):
                self._start_consumer(state, i)
            state.faults = FaultPlan(
                config,
                cluster,
                clock,
                timer,
                rng,
                start,
                silence=lambda index, until: _silence(state, index, until),
                burst=lambda count, until: self._burst(state, timer, count, until),
            )
            state.faults.schedule()
            await self._run_until(state, end)
        finally:
            state.elapsed = clock.time() - state.start
            await self._stop(state, timer)
        return build_report(state)

    # -- setup ---------------------------------------------------------------------------------

    def _start_producer(self, state: RunState, timer: Timer, index: int, until: float) -> None:
        config = self.config
        acks = MIXED_ACKS[index % 3] if config.acks == "mixed" else parse_acks(config.acks)
        producer_id = self._next_producer_id
        self._next_producer_id += 1
        producer = Producer(
            state.cluster,
            ProducerConfig(
                acks=acks,
                max_in_flight=config.max_in_flight,
                request_timeout=config.request_timeout,
                delivery_timeout=6 * config.request_timeout,
                client_id=f"producer-{producer_id}",
                idempotence=config.idempotence,
            ),
            producer_id=producer_id,
            timer=timer,
            response_latency=Latency(self._rng, 2 * config.network_latency),
        )
        loop = ProducerLoop(
            producer, SEND_MODES[index % len(SEND_MODES)], config, self._clock, self._rng, until
        )
        state.producers.append(loop)
        self._spawn(loop.run(), f"producer-{producer_id}")

    def _start_consumer(self, state: RunState, index: int) -> None:
        config = self.config
        consumer = Consumer(
            state.cluster,
            ConsumerConfig(
                group_id=config.group,
                topics=(config.topic,),
                fetch_min_bytes=config.fetch_min_bytes,
                fetch_max_wait=config.fetch_max_wait,
                session_timeout=config.session_timeout,
                heartbeat_interval=config.heartbeat_interval,
                rebalance_timeout=config.rebalance_timeout,
                auto_commit_interval=1.0,
                client_id=f"consumer-{index}",
            ),
            response_latency=Latency(self._rng, 2 * config.network_latency),
        )
        loop = ConsumerLoop(consumer, self._clock, state.deliveries)
        state.consumers.append(loop)
        self._spawn(loop.run(), f"consumer-{index}")

    def _burst(self, state: RunState, timer: Timer, count: int, until: float) -> None:
        first = len(state.producers)
        for i in range(first, first + count):
            self._start_producer(state, timer, i, until)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coro, name=name))

    # -- driving time --------------------------------------------------------------------------

    async def _until_done(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable``, moving virtual time along until it is done."""
        task = asyncio.ensure_future(awaitable)
        clock = self._clock
        if isinstance(clock, ManualClock):
            while not task.done():
                await clock.advance(0.01)
        return await task

    async def _run_until(self, state: RunState, end: float) -> None:
        clock = self._clock
        step = self.config.duration / 100
        while (now := clock.time()) < end:
            target = min(end, now + step)
            if isinstance(clock, ManualClock):
                await clock.advance_to(target)
            else:
                await asyncio.sleep(target - now)
            self._check_tasks()
            if self._progress is not None:
                self._progress(clock.time() - state.start, _status(state))

    def _check_tasks(self) -> None:
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"{task.get_name()} failed") from task.exception()

    async def _stop(self, state: RunState, timer: Timer) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # Settles every request still waiting in a purgatory (outcome "shutdown").
        await state.cluster.close()
        state.unsettled = sum(
            p.producer.stats.sent - p.producer.stats.acked - p.producer.stats.failed
            for p in state.producers
        )
        state.failed_in_run = [p.producer.stats.failed for p in state.producers]
        for loop in state.producers:
            await loop.producer.close(flush=False)
        timer.close()


def _silence(state: RunState, index: int, until: float) -> None:
    if index < len(state.consumers):
        state.consumers[index].silent_until = until


def _status(state: RunState) -> str:
    acked = sum(p.producer.stats.acked for p in state.producers)
    failed = sum(p.producer.stats.failed for p in state.producers)
    shrinks = sum(1 for c in state.cluster.replicas.isr_changes if c.kind == "shrink")
    rebalances = sum(1 for e in state.cluster.coordinator.events if e.kind == "rebalance_completed")
    return (
        f"acked {acked:,} failed {failed:,} consumed {state.deliveries.records:,} "
        f"isr-shrinks {shrinks} rebalances {rebalances}"
    )


def run_simulation(
    config: SimConfig,
    *,
    event_sink: EventSink | None = None,
    progress: ProgressCallback | None = None,
) -> Report:
    """Run a simulation on a fresh event loop and return its report."""
    return asyncio.run(Simulation(config, event_sink=event_sink, progress=progress).run())
