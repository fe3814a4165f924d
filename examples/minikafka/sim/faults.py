"""Fault injection: slow and dead followers, a silent consumer, a producer burst."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from purgatory_aio import Clock, Timer

from ..broker.cluster import Cluster
from .config import SimConfig
from .network import Latency

_log = structlog.get_logger("minikafka.sim.faults")


@dataclass(frozen=True, slots=True)
class FaultEvent:
    """A fault starting or ending, ``time`` seconds into the run."""

    time: float
    fault: str
    detail: str


class FaultPlan:
    """Schedules the requested faults on the timer, at fixed fractions of the run.

    * slow-follower: one follower broker answers every fetch late and, mid-run,
      pauses for longer than the replica lag limit, so it leaves the ISR and
      later rejoins it.
    * dead-follower: another follower broker stops fetching for a third of the
      run; ``acks=all`` writes time out until the ISR drops it, then succeed
      while the ISR still meets min.insync.replicas.
    * silent-consumer: the first consumer stops polling (no heartbeats) for
      longer than its session; the coordinator expels it and rebalances.
    * producer-burst: extra producers join for a tenth of the run.

    Args:
        config: the run's settings.
        cluster: whose follower fetchers to disturb.
        clock: the run's clock.
        timer: where the fault actions are scheduled.
        rng: the run's random stream.
        start: clock time at which the run's traffic started.
        silence: ``silence(consumer_index, until)`` stops a consumer polling.
        burst: ``burst(count, until)`` starts extra producers.
    """

    def __init__(
        self,
        config: SimConfig,
        cluster: Cluster,
        clock: Clock,
        timer: Timer,
        rng: random.Random,
        start: float,
        silence: Callable[[int, float], None],
        burst: Callable[[int, float], None],
    ) -> None:
        self._config = config
        self._cluster = cluster
        self._clock = clock
        self._timer = timer
        self._rng = rng
        self._start = start
        self._silence = silence
        self._burst = burst
        #: What was injected and when, in the order it happened.
        self.events: list[FaultEvent] = []

    def schedule(self) -> None:
        config = self._config
        brokers = config.brokers
        has_followers = config.replicas > 1 and brokers > 1
        for fault in config.faults:
            if fault in ("slow-follower", "dead-follower") and not has_followers:
                self._note(0.0, fault, "skipped: no follower replicas")
            elif fault == "slow-follower":
                self._schedule_slow_follower(brokers - 2 if brokers >= 3 else brokers - 1)
            elif fault == "dead-follower":
                self._schedule_dead_follower(brokers - 1)
            elif fault == "silent-consumer":
                if config.consumers == 0:
                    self._note(0.0, fault, "skipped: no consumers")
                else:
                    self._schedule_silent_consumer()
            elif fault == "producer-burst":
                self._schedule_burst()

    def _schedule_slow_follower(self, broker: int) -> None:
        config = self._config
        duration = config.duration
        slow = Latency(self._rng, max(0.03, 20 * config.network_latency))
        pause = min(1.5 * config.replica_lag_time_max, 0.25 * duration)
        self._at(0.1 * duration, self._slow_down, broker, slow)
        self._at(0.45 * duration, self._stall, broker, pause, "slow-follower")

    def _schedule_dead_follower(self, broker: int) -> None:
        duration = self._config.duration
        self._at(0.2 * duration, self._kill, broker)
        self._at(0.6 * duration, self._revive, broker)

    def _schedule_silent_consumer(self) -> None:
        config = self._config
        length = min(2.5 * config.session_timeout, 0.25 * config.duration)
        self._at(0.35 * config.duration, self._silence_consumer, length)

    def _schedule_burst(self) -> None:
        config = self._config
        count = 2 * max(1, config.producers)
        self._at(0.7 * config.duration, self._start_burst, count, 0.1 * config.duration)

    # -- actions -------------------------------------------------------------------------------

    def _slow_down(self, broker: int, latency: Latency) -> None:
        for fetcher in self._cluster.fetchers:
            if fetcher.broker_id == broker:
                fetcher.latency = latency
        self._note(
            self._elapsed(),
            "slow-follower",
            f"broker {broker} fetches take ~{latency.mean * 1000:.0f} ms",
        )

    def _stall(self, broker: int, length: float, fault: str) -> None:
        until = self._now() + length
        for fetcher in self._cluster.fetchers:
            if fetcher.broker_id == broker:
                fetcher.stall(until)
        self._note(self._elapsed(), fault, f"broker {broker} pauses fetching for {length:g} s")

    def _kill(self, broker: int) -> None:
        for fetcher in self._cluster.fetchers:
            if fetcher.broker_id == broker:
                fetcher.stall(math.inf)
        self._note(self._elapsed(), "dead-follower", f"broker {broker} stops fetching")

    def _revive(self, broker: int) -> None:
        for fetcher in self._cluster.fetchers:
            if fetcher.broker_id == broker:
                fetcher.resume()
        self._note(self._elapsed(), "dead-follower", f"broker {broker} fetches again")

    def _silence_consumer(self, length: float) -> None:
        self._silence(0, self._now() + length)
        self._note(self._elapsed(), "silent-consumer", f"consumer 0 stops polling for {length:g} s")

    def _start_burst(self, count: int, length: float) -> None:
        self._burst(count, self._now() + length)
        self._note(self._elapsed(), "producer-burst", f"{count} extra producers for {length:g} s")

    # -- helpers -------------------------------------------------------------------------------

    def _at(self, offset: float, action: Callable[..., None], *args: object) -> None:
        self._timer.call_at(self._start + offset, action, *args)

    def _now(self) -> float:
        return self._clock.time()

    def _elapsed(self) -> float:
        return round(self._now() - self._start, 3)

    def _note(self, time: float, fault: str, detail: str) -> None:
        self.events.append(FaultEvent(time, fault, detail))
        _log.info("fault", fault=fault, detail=detail, t=time)
