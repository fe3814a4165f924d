"""W1, W1-check and W1-user: purgatory throughput, Kafka's TestPurgatoryPerformance model.

One schedule (per-operation latency and keys, plus Poisson arrival offsets in
open loop) is generated once from the seed and replayed against every
contender. One driver coroutine, identical for all of them, enqueues operations
and completes them at ``enqueue time + latency`` from a heap it owns; the
operations whose latency reaches the timeout are left to expire.

Closed loop (``--rate 0``) enqueues in batches of ``batch`` operations as fast as
the loop allows, yielding to the loop between batches (so the reaper, timers and
completions run), and never holds more than ``inflight`` operations outstanding:
that window bounds memory at a million operations and, when it binds, makes
contenders scan watch lists of the same length (W1-check).

Besides the two contenders a third, ``harness``, runs the same driver with no
purgatory at all; its CPU time is the driver's share, reported so the net cost
of each contender can be read off.

W1-user is W1 with the operation written the way a user writes one (W1UserOp):
a plain subclass without ``__slots__``, with its own fields set in ``__init__``,
constructed per arrival. Its net cost is the figure compared with Kafka's Java
purgatory (KAFKA_JAVA_NET_US). W1-user runs a fourth contender, ``user-code``:
the same operations constructed and completed with no purgatory at all, which
splits the purgatory's net cost into what the user's class costs and what the
library adds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import random
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import asdict, dataclass, replace
from functools import partial
from heapq import heappop, heappush
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

import purgatory_aio
from purgatory_aio import DelayedOperation, Purgatory

from ._common import (
    Meter,
    Progress,
    Record,
    Settlements,
    Ticker,
    alternate,
    distinct_keys,
    fmt,
    fmt_ratio,
    goal,
    lateness_summary,
    make_record,
    median_run,
    publish,
    quiesced,
    ratio,
    rss_bytes,
    run_on,
)
from .baselines import NaiveFutures, NaiveWaiter

_monotonic = time.monotonic

CONTENDERS = ("harness", "purgatory", "naive-futures")
#: W1-user adds the user's own code alone (UserCodeContender), and that code with the calls
#: the public contract requires (ApiFloorContender): the floors under any library.
USER_CONTENDERS = (*CONTENDERS, "user-code", "api-floor")

#: Kafka's Java purgatory and timer (trunk, the first Java version) on this machine type,
#: quiet, driven by the W1 schedule: CPU per operation net of its driver. The goal W1-user
#: and the outside variant are held to.
KAFKA_JAVA_NET_US = 2.0


@dataclass(frozen=True, slots=True)
class W1Params:
    n: int = 1_000_000
    rate: float = 0.0  # arrivals per second; 0 = closed loop
    inflight: int = 100_000  # closed loop: most operations outstanding at once
    batch: int = 256  # closed loop: operations enqueued between two yields to the loop
    keys_per_op: int = 3
    key_space: int = 100
    pct50: float = 0.020
    pct75: float = 0.050
    timeout: float = 0.200
    seed: int = 1
    check: bool = False  # W1-check: complete through check_and_complete(key)
    user: bool = False  # W1-user: a user-style operation class (W1UserOp)
    repeat: int = 1

    @property
    def workload(self) -> str:
        return "w1-check" if self.check else "w1-user" if self.user else "w1"


# -- the schedule ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Schedule:
    latencies: list[float]
    keys: list[tuple[int, ...]]
    arrivals: list[float] | None  # offsets from the start, open loop only


# Generated once per process and sliced: a schedule of n operations is the first n of
# any longer one with the same seed, so runs of different sizes replay the same prefix.
_POOL: dict[tuple[object, ...], tuple[list[float], list[tuple[int, ...]]]] = {}
_UNIT_ARRIVALS: dict[int, list[float]] = {}


def _latencies_and_keys(
    n: int, seed: int, keys_per_op: int, key_space: int, pct50: float, pct75: float
) -> tuple[list[float], list[tuple[int, ...]]]:
    pool_key = (seed, keys_per_op, key_space, pct50, pct75)
    cached = _POOL.get(pool_key)
    if cached is not None and len(cached[0]) >= n:
        return cached[0][:n], cached[1][:n]
    mu = math.log(pct50)
    sigma = (math.log(pct75) - mu) / 0.67449  # z of the 75th percentile
    lognormal = random.Random(seed).lognormvariate
    latencies = [lognormal(mu, sigma) for _ in range(n)]
    uniform = random.Random(seed + 1).random
    keys = [distinct_keys(uniform, keys_per_op, key_space) for _ in range(n)]
    _POOL.clear()  # keep one pool: at a million operations it is ~100 MB
    _POOL[pool_key] = (latencies, keys)
    return latencies, keys


def _arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Poisson arrival offsets: unit-rate exponential gaps, scaled to ``rate``."""
    unit = _UNIT_ARRIVALS.get(seed)
    if unit is None or len(unit) < n:
        gap = random.Random(seed + 2).expovariate
        t = 0.0
        unit = []
        for _ in range(n):
            t += gap(1.0)
            unit.append(t)
        _UNIT_ARRIVALS.clear()
        _UNIT_ARRIVALS[seed] = unit
    scale = 1.0 / rate
    return [t * scale for t in unit[:n]]


def make_schedule(params: W1Params) -> Schedule:
    latencies, keys = _latencies_and_keys(
        params.n, params.seed, params.keys_per_op, params.key_space, params.pct50, params.pct75
    )
    arrivals = _arrivals(params.n, params.rate, params.seed) if params.rate > 0 else None
    return Schedule(latencies, keys, arrivals)


# -- contenders -----------------------------------------------------------------------------


class Contender(Protocol):
    name: str

    async def start(self, settlements: Settlements) -> None: ...

    async def enqueue(self, start: int, stop: int) -> list[Any]: ...

    def complete(self, token: Any, index: int) -> None: ...

    async def finish(self) -> Record: ...


def _settle(op: DelayedOperation[None], settlements: Settlements) -> None:
    """Count one settled operation (and its lateness when it expired)."""
    if op.expired:
        settlements.expired_one(_monotonic() - cast(float, op.deadline))
    else:
        settlements.completed_one()


class W1Op(DelayedOperation[None]):
    """Completed only by ``force_complete`` (W1), as in Kafka's tool."""

    __slots__ = ()
    settlements: ClassVar[Settlements]

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        _settle(self, self.settlements)


class W1CheckOp(DelayedOperation[None]):
    """Completed when ``check_and_complete`` finds its flag set (W1-check)."""

    __slots__ = ("ready",)
    settlements: ClassVar[Settlements]

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False

    def try_complete(self) -> bool:
        return self.ready and self.force_complete()

    def on_complete(self) -> None:
        _settle(self, self.settlements)


class W1UserOp(DelayedOperation[None]):
    """W1's operation as a user writes it: no ``__slots__`` (instances have a
    ``__dict__``), the request's own fields set in ``__init__``, the sink passed in."""

    def __init__(self, timeout: float, index: int, settlements: Settlements) -> None:
        super().__init__(timeout)
        self.index = index
        self.settlements = settlements

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        _settle(self, self.settlements)


class PurgatoryContender:
    name = "purgatory"

    def __init__(self, schedule: Schedule, params: W1Params) -> None:
        self._keys = schedule.keys
        self._timeout = params.timeout
        self._check = params.check
        self._purgatory = Purgatory("bench-w1")
        self._settlements: Settlements | None = None

    async def start(self, settlements: Settlements) -> None:
        W1Op.settlements = settlements
        W1CheckOp.settlements = settlements
        self._settlements = settlements
        await self._purgatory.__aenter__()
        if self._check:
            self.complete = self._complete_by_check  # type: ignore[method-assign]

    async def enqueue_user_ops(self, start: int, stop: int) -> list[Any]:
        """W1-user: one user-style operation per arrival, one awaited watch each."""
        settlements = self._settlements
        assert settlements is not None
        watch = self._purgatory.try_complete_else_watch
        keys = self._keys
        timeout = self._timeout
        ops: list[Any] = []
        for index in range(start, stop):
            op = W1UserOp(timeout, index, settlements)
            await watch(op, keys[index])
            ops.append(op)
        return ops

    async def enqueue(self, start: int, stop: int) -> list[Any]:
        watch = self._purgatory.try_complete_else_watch
        keys = self._keys
        timeout = self._timeout
        make = W1CheckOp if self._check else W1Op
        ops: list[Any] = []
        append = ops.append
        for index in range(start, stop):
            op = make(timeout)
            await watch(op, keys[index])
            append(op)
        return ops

    def complete(self, token: Any, index: int) -> None:
        token.force_complete()

    def _complete_by_check(self, token: Any, index: int) -> None:
        token.ready = True
        self._purgatory.check_and_complete(self._keys[index][0])

    def watched(self) -> int:
        return self._purgatory.watched

    async def finish(self) -> Record:
        p = self._purgatory
        stats = p.stats()
        leftover = p.num_delayed
        await p.shutdown()
        return {
            "left_pending": leftover,
            "stats_completed": stats.completed,
            "stats_expired": stats.expired,
            "purged": stats.purged,
            # Diagnostics only (reaper passes), read without relying on the private name.
            "timer_wakeups": getattr(getattr(p, "_timer", None), "wakeups", None),
        }


class NaiveContender:
    name = "naive-futures"

    def __init__(self, schedule: Schedule, params: W1Params) -> None:
        self._keys: list[tuple[Hashable, ...]] = schedule.keys  # type: ignore[assignment]
        self._timeout = params.timeout
        self._check = params.check
        self._naive: NaiveFutures | None = None

    async def start(self, settlements: Settlements) -> None:
        self._naive = NaiveFutures(settlements)
        if self._check:
            self.complete = self._complete_by_check  # type: ignore[method-assign]

    async def enqueue(self, start: int, stop: int) -> list[Any]:
        assert self._naive is not None
        watch = self._naive.watch
        keys = self._keys
        timeout = self._timeout
        return [watch(keys[index], timeout) for index in range(start, stop)]

    def complete(self, token: Any, index: int) -> None:
        assert self._naive is not None
        self._naive.complete(token)

    def _complete_by_check(self, token: NaiveWaiter, index: int) -> None:
        assert self._naive is not None
        token.ready = True
        self._naive.complete_ready(self._keys[index][0])

    def watched(self) -> int:
        assert self._naive is not None
        return sum(len(s) for s in self._naive.watchers.values())

    async def finish(self) -> Record:
        assert self._naive is not None
        return {"left_pending": self._naive.cancel_all()}


class HarnessContender:
    """The driver alone: operations settle with no purgatory and no timer."""

    name = "harness"

    def __init__(self, schedule: Schedule, params: W1Params) -> None:
        self._latencies = schedule.latencies
        self._timeout = params.timeout
        self._settlements: Settlements | None = None

    async def start(self, settlements: Settlements) -> None:
        self._settlements = settlements

    async def enqueue(self, start: int, stop: int) -> list[Any]:
        settlements = self._settlements
        assert settlements is not None
        latencies = self._latencies
        timeout = self._timeout
        for index in range(start, stop):
            if latencies[index] >= timeout:
                settlements.expired_one(0.0)
        return list(range(start, stop))

    def complete(self, token: Any, index: int) -> None:
        assert self._settlements is not None
        self._settlements.completed_one()

    def watched(self) -> int:
        return 0

    async def finish(self) -> Record:
        return {"left_pending": 0}


async def _two_tries(op: W1UserOp) -> bool:
    """The calls the contract makes per watch, with nothing else: an awaited coroutine that
    tries the operation, (would watch it,) and tries it again."""
    return op.try_complete() or op.try_complete()


class UserCodeContender(HarnessContender):
    """W1-user's operations with no purgatory: the driver plus the user's own code.

    Each arrival constructs its W1UserOp, and each completion calls its
    ``on_complete``, as the purgatory would; operations due to expire settle as in
    the harness (their ``on_complete`` is not counted, so this is a lower bound).
    Its net cost is what the operation class itself costs, which no library can
    save: ``naive ÷ user-code`` (net) is the most any purgatory could reach on
    ``naive ÷ purgatory`` with operations written this way.
    """

    name = "user-code"
    #: Whether each arrival also makes the calls the contract requires (ApiFloorContender).
    api_calls = False

    async def enqueue(self, start: int, stop: int) -> list[Any]:
        settlements = self._settlements
        assert settlements is not None
        latencies = self._latencies
        timeout = self._timeout
        api_calls = self.api_calls
        ops: list[Any] = []
        for index in range(start, stop):
            op = W1UserOp(timeout, index, settlements)
            if api_calls:
                await _two_tries(op)
            if latencies[index] >= timeout:
                settlements.expired_one(0.0)
            ops.append(op)
        return ops

    def complete(self, token: Any, index: int) -> None:
        token.on_complete()


class ApiFloorContender(UserCodeContender):
    """``user-code`` plus the calls into the user's code that the contract itself requires.

    ``await try_complete_else_watch(op, keys)`` must call ``try_complete`` twice (try,
    watch, try again) inside an awaited coroutine, and completion must call
    ``on_complete``. This contender makes exactly those calls and keeps nothing, so
    its net cost is the floor under any implementation of the contract with this
    operation class, compiled core or not: ``naive ÷ api-floor`` (net) is the most
    ``naive ÷ purgatory`` can ever reach here.
    """

    name = "api-floor"
    api_calls = True


#: What makes a contender from the schedule and parameters (a contender class).
ContenderFactory = Callable[[Schedule, W1Params], Contender]

_FACTORIES: dict[str, type[PurgatoryContender | NaiveContender | HarnessContender]] = {
    "purgatory": PurgatoryContender,
    "naive-futures": NaiveContender,
    "harness": HarnessContender,
    "user-code": UserCodeContender,
    "api-floor": ApiFloorContender,
}


# -- the driver -----------------------------------------------------------------------------


async def drive(
    contender: Any, schedule: Schedule, params: W1Params, settlements: Settlements, ticker: Ticker
) -> Record:
    """Replay ``schedule`` against ``contender`` until every operation settled."""
    latencies = schedule.latencies
    arrivals = schedule.arrivals
    n = len(latencies)
    closed = arrivals is None
    timeout = params.timeout
    cap = params.inflight
    batch = params.batch
    enqueue = contender.enqueue
    complete = contender.complete
    sleep = asyncio.sleep
    loop = asyncio.get_running_loop()
    grain = loop_granularity(loop)
    heap: list[tuple[float, int, Any]] = []
    i = 0
    t0 = _monotonic()
    enqueued_at = t0
    rss0 = rss_peak = rss_bytes()
    next_sample = t0
    samples = inflight_sum = inflight_max = watched_sum = 0
    while i < n or heap:
        now = _monotonic()
        while heap and heap[0][0] <= now:
            _, index, token = heappop(heap)
            complete(token, index)
        stop = i
        room = 0
        if i < n:
            if closed:
                room = cap - (i - settlements.settled)
                if room > 0:
                    stop = min(n, i + batch, i + room)
            else:
                limit = min(n, i + batch)
                assert arrivals is not None
                while stop < limit and t0 + arrivals[stop] <= now:
                    stop += 1
        if stop > i:
            tokens = await enqueue(i, stop)
            index = i
            for token in tokens:
                latency = latencies[index]
                if latency < timeout:
                    heappush(heap, (now + latency, index, token))
                index += 1
            ticker.advance(stop - i)
            room -= stop - i
            i = stop
            if i == n:
                enqueued_at = _monotonic()
        if now >= next_sample:
            next_sample = now + 0.05
            rss = rss_bytes()
            rss_peak = max(rss_peak, rss)
            inflight = i - settlements.settled
            inflight_sum += inflight
            inflight_max = max(inflight_max, inflight)
            watched_sum += contender.watched()
            samples += 1
        if closed and i < n:
            if room > 0:
                await sleep(0)
                continue
            # Window full: sleep until a batch worth of room is free or a completion is due.
            waiter = loop.create_future()
            settlements.wake_when(i - cap + batch, waiter)
            timer = None
            if heap:
                timer = loop.call_later(
                    _timer_delay(heap[0][0] - _monotonic(), grain), _wake, waiter
                )
            await waiter
            if timer is not None:
                timer.cancel()
            continue
        # Open loop: sleep until the next arrival or completion.
        wake = heap[0][0] if heap else math.inf
        if i < n:
            assert arrivals is not None
            wake = min(wake, t0 + arrivals[i])
        await sleep(_timer_delay(wake - _monotonic(), grain))
    completions_done = _monotonic()
    async with asyncio.timeout(timeout * 10 + 60):
        await settlements.done
    settled_at = _monotonic()
    rss_peak = max(rss_peak, rss_bytes())
    return {
        "enqueue_s": enqueued_at - t0,
        "settle_s": settled_at - t0,
        "completions_s": completions_done - t0,
        "rss_start_mb": rss0 / 2**20,
        "rss_peak_mb": rss_peak / 2**20,
        "rss_growth_mb": (rss_peak - rss0) / 2**20,
        "inflight_mean": inflight_sum / samples if samples else 0.0,
        "inflight_max": inflight_max,
        "watched_mean": watched_sum / samples if samples else 0.0,
    }


def loop_granularity(loop: asyncio.AbstractEventLoop) -> float:
    """uvloop rounds timer delays to the nearest millisecond, so a shorter sleep wakes
    at once and a driver waiting for a sub-millisecond instant would spin."""
    return 0.001 if type(loop).__module__.startswith("uvloop") else 0.0


def _timer_delay(delay: float, grain: float) -> float:
    if not delay > 0.0 or delay == math.inf:
        return 0.0
    return math.ceil(delay / grain) * grain if grain else delay


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def run_contender(
    name: str,
    loop_name: str,
    params: W1Params,
    progress: Progress,
    label: str = "",
    factory: ContenderFactory | None = None,
) -> Record:
    """One measured run of one contender on a fresh loop (``factory`` makes a
    contender of another name, for benchmarks built on this driver)."""
    schedule = make_schedule(params)
    n = params.n

    async def main() -> Record:
        settlements = Settlements(n)
        contender = (factory or _FACTORIES[name])(schedule, params)
        await contender.start(settlements)
        if params.user and isinstance(contender, PurgatoryContender):
            contender.enqueue = contender.enqueue_user_ops  # type: ignore[method-assign]
        description = f"{label or params.workload} {loop_name} {name}"
        with progress.task(description, total=n) as ticker, Meter() as meter:
            figures = await drive(contender, schedule, params, settlements, ticker)
        extra = await contender.finish()
        enqueue_s = figures.pop("enqueue_s")
        return {
            "contender": name,
            "ops": n,
            "completed": settlements.completed,
            "expired": settlements.expired,
            "settled": settlements.settled,
            "wall_s": figures["settle_s"],
            "cpu_s": meter.cpu_s,
            "cpu_us_per_op": meter.cpu_s / n * 1e6,
            "enqueue_rate": n / enqueue_s if enqueue_s > 0 else None,
            "lateness": lateness_summary(settlements.lateness) if name != "harness" else None,
            **figures,
            **extra,
        }

    with quiesced():
        return run_on(loop_name, main)


# -- the outside variant --------------------------------------------------------------------
# W1 as measured from outside the project: the simplest operation class, one awaited
# try_complete_else_watch per arrival, the due completions forced every 256 arrivals,
# no window on what is outstanding and nothing frozen for the collector; net of the same
# driver with a watch that does nothing.

#: ``outside-tracked`` is ``outside`` with an operation class that opts out of being
#: untracked while pending: what untracking buys, in the same run.
OUTSIDE_CONTENDERS = ("outside-driver", "outside", "outside-tracked")


class Tally:
    __slots__ = ("settled",)

    def __init__(self) -> None:
        self.settled = 0


class OutsideOp(DelayedOperation[None]):
    """The simplest operation class: no ``__init__`` of its own, never satisfiable by a
    try, counted when it completes."""

    tally: ClassVar[Tally]

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        self.tally.settled += 1


class OutsideTrackedOp(OutsideOp):
    """The same, kept tracked by the cyclic GC while pending."""

    untrack_while_pending = False


async def _watch_nothing(op: DelayedOperation[None], keys: Any) -> bool:
    return False


async def drive_outside(schedule: Schedule, params: W1Params, name: str) -> Record:
    """One outside-variant run; CPU time is the whole run, settlement included."""
    noop = name == "outside-driver"
    make = OutsideTrackedOp if name == "outside-tracked" else OutsideOp
    tally = OutsideOp.tally = Tally()
    latencies = schedule.latencies
    keys = schedule.keys
    n = len(latencies)
    timeout = params.timeout
    async with Purgatory("bench-w1-outside") as p:
        watch = _watch_nothing if noop else p.try_complete_else_watch
        heap: list[tuple[float, int, OutsideOp]] = []
        completed = 0
        cpu0 = time.process_time()
        now = _monotonic()
        for index in range(n):
            op = make(timeout)
            await watch(op, keys[index])
            latency = latencies[index]
            if latency < timeout:
                heappush(heap, (now + latency, index, op))
            if index & 255 == 255:
                now = _monotonic()
                while heap and heap[0][0] <= now:
                    completed += heappop(heap)[2].force_complete()
                await asyncio.sleep(0)
        while heap:
            await asyncio.sleep(max(0.0, heap[0][0] - _monotonic()))
            now = _monotonic()
            while heap and heap[0][0] <= now:
                completed += heappop(heap)[2].force_complete()
        if p.num_delayed:
            await asyncio.sleep(timeout * 1.5)  # the rest expire meanwhile
        cpu = time.process_time() - cpu0
        pending = p.num_delayed
    return {
        "cpu_s": cpu,
        "cpu_us_per_op": cpu / n * 1e6,
        "settled": tally.settled,
        "completed": completed,
        "left_pending": pending,
    }


def measure_outside(loop_name: str, params: W1Params, progress: Progress) -> dict[str, Record]:
    """The outside variant's two runs (median of ``repeat``), with the net figure."""
    schedule = make_schedule(params)
    runs: dict[str, list[Record]] = {name: [] for name in OUTSIDE_CONTENDERS}
    for _ in range(params.repeat):
        for name in OUTSIDE_CONTENDERS:
            with progress.task(f"{params.workload} {loop_name} {name}"):
                gc.collect()
                runs[name].append(run_on(loop_name, partial(drive_outside, schedule, params, name)))
    best = {name: median_run(r, "cpu_s") for name, r in runs.items()}
    for name in ("outside", "outside-tracked"):
        best[name]["net_cpu_us_per_op"] = (
            best[name]["cpu_us_per_op"] - best["outside-driver"]["cpu_us_per_op"]
        )
    return best


# -- the workload ---------------------------------------------------------------------------


def _build_record(loop_name: str, params: W1Params, best: dict[str, Record]) -> Record:
    purg = best["purgatory"]
    naive = best["naive-futures"]
    harness = best["harness"]
    ratios = {
        "cpu_per_op naive/purgatory": ratio(naive["cpu_us_per_op"], purg["cpu_us_per_op"]),
        "net_cpu_per_op naive/purgatory": ratio(
            naive["net_cpu_us_per_op"], purg["net_cpu_us_per_op"]
        ),
        "enqueue_rate purgatory/naive": ratio(purg["enqueue_rate"], naive["enqueue_rate"]),
        "settle_wall naive/purgatory": ratio(naive["wall_s"], purg["wall_s"]),
        "rss_growth naive/purgatory": ratio(naive["rss_growth_mb"], purg["rss_growth_mb"]),
    }
    full = params.n >= 1_000_000 and params.rate == 0 and not params.check
    note = "" if full else "indicative: the goal is stated for 1M ops, closed loop"
    goals = []
    if params.user:
        ratios["net_cpu_per_op purgatory/kafka_java"] = ratio(
            purg["net_cpu_us_per_op"], KAFKA_JAVA_NET_US
        )
        ratios["net_cpu_per_op naive/user-code (ceiling of naive/purgatory)"] = ratio(
            naive["net_cpu_us_per_op"], best["user-code"]["net_cpu_us_per_op"]
        )
        if "api-floor" in best:
            ratios["net_cpu_per_op naive/api-floor (ceiling for any implementation)"] = ratio(
                naive["net_cpu_us_per_op"], best["api-floor"]["net_cpu_us_per_op"]
            )
        goals = _user_goals(purg, ratios, note)
    elif not params.check:
        goals = [
            goal(
                "W1 purgatory CPU/op (closed loop, 1M)",
                "<= 4 us/op",
                purg["cpu_us_per_op"],
                purg["cpu_us_per_op"] <= 4.0,
                note + (" " if note else "") + f"net of harness {purg['net_cpu_us_per_op']:.2f}",
            ),
            goal(
                "W1 naive-futures CPU / purgatory CPU",
                ">= 3x",
                ratios["cpu_per_op naive/purgatory"],
                (ratios["cpu_per_op naive/purgatory"] or 0) >= 3.0,
                note,
            ),
        ]
    if "outside" in best:
        outside = best["outside"]
        net = outside["net_cpu_us_per_op"]
        ratios["outside net_cpu_per_op purgatory/kafka_java"] = ratio(net, KAFKA_JAVA_NET_US)
        goals.append(
            goal(
                "W1 outside variant net CPU/op vs Kafka's Java purgatory (compiled)",
                f"<= {KAFKA_JAVA_NET_US} us/op",
                net,
                net <= KAFKA_JAVA_NET_US if purgatory_aio.compiled else None,
                note,
            )
        )
    late_p = purg["lateness"] or {}
    late_n = naive["lateness"] or {}
    headline = []
    if params.user:
        headline.append(
            (
                "net CPU us/op P | N | Kafka Java",
                f"{fmt(purg['net_cpu_us_per_op'])} | {fmt(naive['net_cpu_us_per_op'])} | "
                f"{fmt(KAFKA_JAVA_NET_US)} (P/Java "
                f"{fmt_ratio(ratios['net_cpu_per_op purgatory/kafka_java'])})",
            )
        )
        user_net = best["user-code"]["net_cpu_us_per_op"]
        ceiling = ratios["net_cpu_per_op naive/user-code (ceiling of naive/purgatory)"]
        headline.append(
            (
                "net CPU us/op user code alone | library (P - user code)",
                f"{fmt(user_net)} | {fmt(purg['net_cpu_us_per_op'] - user_net)} (naive/user "
                f"code {fmt_ratio(ceiling)}: the most naive/P can reach with this class)",
            )
        )
        if "api-floor" in best:
            floor_net = best["api-floor"]["net_cpu_us_per_op"]
            floor_ceiling = ratios[
                "net_cpu_per_op naive/api-floor (ceiling for any implementation)"
            ]
            headline.append(
                (
                    "net CPU us/op user code + the calls the contract requires | library beyond",
                    f"{fmt(floor_net)} | {fmt(purg['net_cpu_us_per_op'] - floor_net)} "
                    f"(naive/floor {fmt_ratio(floor_ceiling)}: the most naive/P any "
                    f"implementation of the contract can reach)",
                )
            )
    if "outside" in best:
        outside = best["outside"]
        headline.append(
            (
                "outside variant: net CPU us/op P | P kept tracked | driver alone | Kafka Java",
                f"{fmt(outside['net_cpu_us_per_op'])} | "
                f"{fmt(best['outside-tracked']['net_cpu_us_per_op'])} | "
                f"{fmt(best['outside-driver']['cpu_us_per_op'])} | {fmt(KAFKA_JAVA_NET_US)}",
            )
        )
    headline += [
        (
            "CPU us/op P | N | harness",
            f"{fmt(purg['cpu_us_per_op'])} | "
            f"{fmt(naive['cpu_us_per_op'])} | {fmt(harness['cpu_us_per_op'])}",
        ),
        (
            "CPU naive/purgatory (net)",
            f"{fmt_ratio(ratios['cpu_per_op naive/purgatory'])} "
            f"({fmt_ratio(ratios['net_cpu_per_op naive/purgatory'])})",
        ),
        ("enqueue/s P | N", f"{fmt(purg['enqueue_rate'], 0)} | {fmt(naive['enqueue_rate'], 0)}"),
        ("expiry late p99 ms P | N", f"{fmt(late_p.get('p99_ms'))} | {fmt(late_n.get('p99_ms'))}"),
        ("completed/expired P", f"{purg['completed']}/{purg['expired']}"),
    ]
    return make_record(
        params.workload,
        loop_name,
        asdict(params),
        {"contenders": best},
        ratios=ratios,
        goals=goals,
        headline=headline,
    )


def _user_goals(purg: Record, ratios: Record, note: str) -> list[Record]:
    """W1-user's goals: at most Kafka's Java net cost, and a saving over naive (3x compiled,
    1.5x pure) large enough to be worth a library."""
    net = purg["net_cpu_us_per_op"]
    saving = ratios["net_cpu_per_op naive/purgatory"] or 0.0
    wanted = 3.0 if purgatory_aio.compiled else 1.5
    build = "compiled" if purgatory_aio.compiled else "pure"
    return [
        goal(
            f"W1-user net CPU/op vs Kafka's Java purgatory ({build})",
            f"<= {KAFKA_JAVA_NET_US} us/op",
            net,
            net <= KAFKA_JAVA_NET_US if purgatory_aio.compiled else None,
            note + ("" if purgatory_aio.compiled else " (the goal is for the compiled core)"),
        ),
        goal(
            f"W1-user net CPU naive-futures / purgatory ({build})",
            f">= {wanted:g}x",
            saving,
            saving >= wanted,
            note,
        ),
    ]


def measure(
    loop_name: str,
    params: W1Params,
    progress: Progress,
    names: tuple[str, ...] | None = None,
    factories: Mapping[str, ContenderFactory] | None = None,
    label: str = "",
) -> dict[str, Record]:
    """The median run of every contender, each with its CPU net of the harness.

    ``names`` defaults to the workload's own contenders; ``factories`` makes those
    of other names, for benchmarks built on this driver.
    """
    extra = factories or {}
    runs = alternate(
        names or (USER_CONTENDERS if params.user else CONTENDERS),
        params.repeat,
        lambda name: run_contender(name, loop_name, params, progress, label, extra.get(name)),
    )
    best = {name: median_run(r, "cpu_s") for name, r in runs.items()}
    harness = best["harness"]["cpu_us_per_op"]
    for name, r in best.items():
        if r["settled"] != params.n or r["left_pending"]:
            raise RuntimeError(f"{label or params.workload} {name} left operations unsettled: {r}")
        if name != "harness":
            r["net_cpu_us_per_op"] = r["cpu_us_per_op"] - harness
    return best


def run(
    params: W1Params, loops: list[str], progress: Progress, results_dir: Path | None
) -> list[Record]:
    progress.section(
        f"{params.workload}: n={params.n:,} "
        + (
            f"rate={params.rate:,.0f}/s"
            if params.rate
            else f"closed loop, window {params.inflight:,}"
        )
    )
    with progress.task("generating schedule"):
        make_schedule(params)
    records = []
    for loop_name in loops:
        best = measure(loop_name, params, progress)
        if params.workload in ("w1", "w1-user") and params.rate == 0:
            best.update(measure_outside(loop_name, params, progress))
        records.append(
            publish(_build_record(loop_name, params, best), loop_name, progress, results_dir)
        )
    return records


def add_arguments(parser: argparse.ArgumentParser, check: bool) -> None:
    parser.add_argument("--n", type=int, default=None, help="operations (default 1M; quick 100k)")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="Poisson arrivals per second; 0 = closed loop"
    )
    parser.add_argument(
        "--inflight",
        type=int,
        default=None,
        help="closed loop: most operations outstanding (default 100k; w1-check 2000)",
    )
    parser.add_argument("--batch", type=int, default=256, help="closed loop: ops per yield")
    parser.add_argument("--timeout", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=1, help="runs per contender (median)")


def params_from_args(args: argparse.Namespace, check: bool, user: bool = False) -> W1Params:
    default_n = (
        (50_000 if args.quick else 200_000) if check else (100_000 if args.quick else 1_000_000)
    )
    base = W1Params(check=check, user=user)
    return replace(
        base,
        n=args.n or default_n,
        rate=args.rate,
        inflight=args.inflight or (2_000 if check else 100_000),
        batch=args.batch,
        timeout=args.timeout,
        seed=args.seed,
        repeat=args.repeat,
    )
