"""W5: half a million parked operations, and how long the loop stops.

The schedule (every figure a command-line parameter):

* ``parked`` operations (500,000) pending at once, each with timeout ``timeout``
  (20 s), watched under two keys: one of ``topics`` topic names (1,000) and one
  unique to it; each carries a small dict as its payload and is never completed
  early, so every one expires (the worst case for what is pending).
* Fill: the first ``parked`` operations arrive at once, with deadlines spread
  evenly over the next ``timeout`` seconds (so expirations come at a steady rate
  rather than all at once); not measured.
* Measured phase of ``duration`` seconds (40): arrivals at ``parked / timeout``
  per second (25,000/s) in batches every ``batch_interval`` (5 ms), each one
  awaited ``try_complete_else_watch``, so the pending count stays at ``parked``.
* A ticker on the same loop sleeps ``tick`` (1 ms) again and again; how late each
  wake-up is (fire time minus the time asked for) is the loop's stall.

Reported per contender: ticker lateness p50 / p99 / p99.9 / max; full (generation
2) collections during the measured phase, and their pauses, from a
``gc.callbacks`` hook; CPU % of one core; GC-tracked objects, pymalloc blocks and
RSS per pending operation, with the tracked objects broken down by type (where
each comes from); completed and expired counts.

Contenders, each in its own child process with the same seed: ``purgatory`` (a
plain subclass with its own ``__init__`` and a payload attribute, ``on_complete``
counting) and ``naive-futures`` (a future per operation in a ``dict[key, set]``,
its timeout a ``loop.call_at`` handle; see ``bench/baselines.py``). Kafka's Java
purgatory on the same schedule is printed beside them (figures of its own run on
this machine type: G1, 1 GB heap).

``--leak N`` instead runs N operations through one purgatory (a third each
completed, cancelled and expired; keys as above) under tracemalloc and reports
the memory still held after every 10 % of them: flat means nothing leaks.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Hashable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import purgatory_aio
from purgatory_aio import DelayedOperation, Purgatory

from ._common import (
    REPO_ROOT,
    Progress,
    Record,
    Settlements,
    fmt,
    fmt_ratio,
    goal,
    lateness_summary,
    make_record,
    publish,
    quiet_logs,
    ratio,
    rss_bytes,
    run_on,
)
from .baselines import NaiveFutures, NaiveWaiter

#: ``ticker-only`` runs the ticker and the arrival loop with nothing parked and nothing
#: arriving: its lateness is the floor the machine itself sets (a loaded machine
#: preempts the process), against which the others' stalls are read.
CONTENDERS = ("purgatory", "naive-futures", "ticker-only")

#: Kafka's Java purgatory on this schedule (G1, 1 GB heap, quiet 2-core machine): the
#: ticker's lateness in ms, on its own thread / on the arrival thread, and its GC.
KAFKA_JAVA = {
    "p99_ms": 9.2,
    "p999_ms": 29.9,
    "max_ms": 60.0,
    "same_thread_p99_ms": 10.8,
    "same_thread_p999_ms": 32.4,
    "same_thread_max_ms": 180.0,
    "full_gcs": 0,
    "young_pauses": 57,
    "young_pause_max_ms": 60.0,
    "bytes_per_parked_op": 523,
    "cpu_pct": 82.0,
}

#: The goals, stated for the compiled core on an idle machine at the full size.
GOAL_MAX_MS = 60.0
GOAL_P999_MS = 30.0


@dataclass(frozen=True, slots=True)
class W5Params:
    parked: int = 500_000
    timeout: float = 20.0
    topics: int = 1_000
    duration: float = 40.0
    batch_interval: float = 0.005
    tick: float = 0.001
    seed: int = 1

    @property
    def rate(self) -> float:
        return self.parked / self.timeout


QUICK = W5Params(parked=5_000, timeout=1.0, topics=100, duration=1.5)


# -- the operation and the two contenders --------------------------------------------------


class Counts:
    __slots__ = ("completed", "expired")

    def __init__(self) -> None:
        self.completed = 0
        self.expired = 0


class ParkedOp(DelayedOperation[None]):
    """A plain user-style operation: its request in a dict, counted when it settles."""

    counts: Counts

    def __init__(self, timeout: float, request: dict[str, int]) -> None:
        super().__init__(timeout)
        self.request = request

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        counts = self.counts
        if self.expired:
            counts.expired += 1
        else:
            counts.completed += 1


class ParkedWaiter(NaiveWaiter):
    """naive-futures' record, carrying the request as the purgatory's operation does."""

    __slots__ = ("request",)
    request: dict[str, int]


class _Purgatory:
    def __init__(self, counts: Counts) -> None:
        ParkedOp.counts = counts
        self.purgatory = Purgatory("bench-w5")
        self.counts = counts

    async def arrive(self, keys: tuple[Hashable, ...], seconds: float, request: Any) -> None:
        await self.purgatory.try_complete_else_watch(ParkedOp(seconds, request), keys)

    def pending(self) -> int:
        return self.purgatory.num_delayed

    def settled(self) -> tuple[int, int]:
        return self.counts.completed, self.counts.expired

    async def close(self) -> None:
        await self.purgatory.shutdown(expire_pending=False)


class _Idle:
    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    async def arrive(self, keys: tuple[Hashable, ...], seconds: float, request: Any) -> None:
        return None

    def pending(self) -> int:
        return 0

    def settled(self) -> tuple[int, int]:
        return 0, 0

    async def close(self) -> None:
        return None


class _Naive:
    def __init__(self, counts: Counts) -> None:
        self.settlements = Settlements(1 << 62)
        self.naive = NaiveFutures(self.settlements)
        self.loop = asyncio.get_running_loop()

    async def arrive(self, keys: tuple[Hashable, ...], seconds: float, request: Any) -> None:
        waiter = ParkedWaiter(self.loop.create_future(), keys, time.monotonic() + seconds)
        waiter.request = request
        self.naive.add(waiter, seconds)

    def pending(self) -> int:
        return self.naive.pending()

    def settled(self) -> tuple[int, int]:
        return self.settlements.completed, self.settlements.expired

    async def close(self) -> None:
        self.naive.cancel_all()


# -- measuring ------------------------------------------------------------------------------


class GcWatch:
    """Collections and their pauses, per generation, from a ``gc.callbacks`` hook."""

    def __init__(self) -> None:
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.full_cpu: list[float] = []  # CPU seconds of each full collection
        self._started = 0.0
        self._cpu = 0.0
        self.on = False

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._cpu = time.process_time()
            self._started = time.perf_counter()
        else:
            self.pauses[info["generation"]].append(time.perf_counter() - self._started)
            if info["generation"] == 2:
                self.full_cpu.append(time.process_time() - self._cpu)


def tracked_by_type() -> Counter[str]:
    return Counter(type(obj).__name__ for obj in gc.get_objects())


class Ticker:
    """Sleeps ``tick`` again and again; records how late each wake-up is."""

    def __init__(self, loop: asyncio.AbstractEventLoop, tick: float) -> None:
        self.loop = loop
        self.tick = tick
        self.lateness: list[float] = []
        self.handle: asyncio.TimerHandle | None = None
        self.asked = 0.0

    def start(self) -> None:
        self.asked = time.perf_counter() + self.tick
        self.handle = self.loop.call_later(self.tick, self._wake)

    def _wake(self) -> None:
        now = time.perf_counter()
        self.lateness.append(now - self.asked)
        self.asked = now + self.tick
        self.handle = self.loop.call_later(self.tick, self._wake)

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()


def _keys(rng: random.Random, topics: list[str], serial: int) -> tuple[Hashable, ...]:
    return (topics[int(rng.random() * len(topics))], serial)


async def measure(contender_name: str, params: W5Params) -> Record:
    """One contender through W5's schedule (run in a child process of its own)."""
    loop = asyncio.get_running_loop()
    counts = Counts()
    contender: _Purgatory | _Naive | _Idle = (
        _Purgatory(counts)
        if contender_name == "purgatory"
        else _Naive(counts)
        if contender_name == "naive-futures"
        else _Idle(counts)
    )
    rng = random.Random(params.seed)
    topics = [f"topic-{i}" for i in range(params.topics)]
    arrive = contender.arrive
    parked = 0 if isinstance(contender, _Idle) else params.parked
    gc.collect()
    types_before = tracked_by_type()
    blocks_before = sys.getallocatedblocks()
    rss_before = rss_bytes()
    # Fill: deadlines spread evenly over the next timeout, so that expirations (and the
    # arrivals replacing them) come at a steady rate from the start.
    fill_started = time.perf_counter()
    for serial in range(parked):
        timeout = params.timeout * (serial + 1) / parked
        await arrive(_keys(rng, topics, serial), timeout, {"partition": serial % 64})
        if serial % 4096 == 4095:
            await asyncio.sleep(0)
    fill_s = time.perf_counter() - fill_started
    pending_after_fill = contender.pending()
    per = 1 / max(pending_after_fill, 1)
    gc.collect()  # what a young collection would do: atomic tuples and dicts untracked
    types_after = tracked_by_type()
    blocks_after = sys.getallocatedblocks()
    rss_after = rss_bytes()
    delta = {
        name: (types_after[name] - types_before[name]) * per
        for name in types_after.keys() | types_before.keys()
    }
    by_type = {name: round(v, 3) for name, v in sorted(delta.items()) if abs(v) >= 0.005}
    watch = GcWatch()
    gc.callbacks.append(watch)
    ticker = Ticker(loop, params.tick)
    serial = parked
    rate = params.rate
    interval = params.batch_interval
    pending_samples: list[int] = []
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    watch.on = True
    ticker.start()
    try:
        arrived = 0
        batch = 0
        end = t0 + params.duration
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            due = int((now - t0) * rate)
            while arrived < due:
                await arrive(_keys(rng, topics, serial), params.timeout, {"partition": serial % 64})
                serial += 1
                arrived += 1
            batch += 1
            if batch % 200 == 0:
                pending_samples.append(contender.pending())
            await asyncio.sleep(max(0.0, t0 + batch * interval - time.perf_counter()))
    finally:
        watch.on = False
        ticker.stop()
        gc.callbacks.remove(watch)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    tracked_at_end = len(gc.get_objects())  # what a full collection had to traverse
    completed, expired = contender.settled()
    await contender.close()
    full = watch.pauses[2]
    young = watch.pauses[0] + watch.pauses[1]
    return {
        "contender": contender_name,
        "lateness": lateness_summary(ticker.lateness, curve_points=21),
        "ticks": len(ticker.lateness),
        "full_gcs": len(full),
        "full_gc_pauses_ms": [round(p * 1e3, 1) for p in full],
        "full_gc_max_ms": max(full) * 1e3 if full else 0.0,
        "full_gc_cpu_ms": [round(c * 1e3, 1) for c in watch.full_cpu],
        "tracked_at_end": tracked_at_end,
        "young_gcs": len(young),
        "young_gc_max_ms": max(young) * 1e3 if young else 0.0,
        "cpu_pct": 100.0 * cpu / wall,
        "wall_s": wall,
        "arrived": arrived,
        "arrival_rate": arrived / wall,
        "completed": completed,
        "expired": expired,
        "fill_s": fill_s,
        "pending_after_fill": pending_after_fill,
        "pending_min": min(pending_samples, default=pending_after_fill),
        "pending_max": max(pending_samples, default=pending_after_fill),
        "tracked_per_pending": sum(delta.values()),
        "tracked_per_pending_by_type": by_type,
        "blocks_per_pending": (blocks_after - blocks_before) * per,
        "rss_bytes_per_pending": (rss_after - rss_before) * per,
        "compiled": bool(purgatory_aio.compiled),
    }


def measure_in_child(contender: str, loop_name: str, params: W5Params) -> Record:
    cmd = [sys.executable, "-m", "bench.w5", "--child", contender, "--loop", loop_name]
    cmd += ["--params", json.dumps(asdict(params))]
    limit = 300 + 3 * (params.duration + params.timeout + params.parked / 20_000)
    out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=limit)
    if out.returncode != 0:
        raise RuntimeError(f"w5 child {contender} on {loop_name} failed:\n{out.stderr[-2000:]}")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


# -- the record -----------------------------------------------------------------------------


def build_record(loop_name: str, params: W5Params, runs: dict[str, Record]) -> Record:
    purg, naive, idle = runs["purgatory"], runs["naive-futures"], runs["ticker-only"]
    lp, ln, li = purg["lateness"], naive["lateness"], idle["lateness"]
    ratios = {
        "max_stall naive/purgatory": ratio(ln["max_ms"], lp["max_ms"]),
        "p999_stall naive/purgatory": ratio(ln["p999_ms"], lp["p999_ms"]),
        "max_stall purgatory/kafka_java": ratio(lp["max_ms"], KAFKA_JAVA["max_ms"]),
        "p999_stall purgatory/kafka_java": ratio(lp["p999_ms"], KAFKA_JAVA["p999_ms"]),
        "cpu naive/purgatory": ratio(naive["cpu_pct"], purg["cpu_pct"]),
        "rss_per_pending naive/purgatory": ratio(
            naive["rss_bytes_per_pending"], purg["rss_bytes_per_pending"]
        ),
    }
    full = params == W5Params(seed=params.seed)
    note = "" if full else "indicative: the goals are stated for the full schedule. "
    note += (
        f"The ticker alone, nothing parked, on this machine then: p99.9 "
        f"{fmt(li['p999_ms'], 1)} ms, max {fmt(li['max_ms'], 1)} ms; the purgatory's full "
        f"collections took {fmt(max(purg['full_gc_cpu_ms'], default=0.0), 1)} ms of CPU at most"
    )
    compiled = bool(purgatory_aio.compiled)
    goals = [
        goal(
            "W5 worst stall (compiled)",
            f"<= {GOAL_MAX_MS:g} ms",
            lp["max_ms"],
            lp["max_ms"] <= GOAL_MAX_MS if compiled else None,
            note,
        ),
        goal(
            "W5 stall p99.9 (compiled)",
            f"<= {GOAL_P999_MS:g} ms",
            lp["p999_ms"],
            lp["p999_ms"] <= GOAL_P999_MS if compiled else None,
            note,
        ),
        goal(
            "W5 GC-tracked objects per pending op (library + operation)",
            "0",
            purg["tracked_per_pending"],
            purg["tracked_per_pending"] < 0.01 if compiled else None,
            "the pure build keeps every object tracked",
        ),
    ]
    k = KAFKA_JAVA

    def stalls(run: Record) -> str:
        late = run["lateness"]
        return " / ".join(fmt(late[key], 1) for key in ("p50_ms", "p99_ms", "p999_ms", "max_ms"))

    def gcs(run: Record) -> str:
        cpu = max(run["full_gc_cpu_ms"], default=0.0)
        return (
            f"{run['full_gcs']} full, max {fmt(run['full_gc_max_ms'], 0)} ms ({fmt(cpu, 0)} ms CPU)"
        )

    headline = [
        ("ticker lateness ms p50 / p99 / p99.9 / max: P", stalls(purg)),
        ("ticker lateness ms p50 / p99 / p99.9 / max: N", stalls(naive)),
        ("ticker lateness ms p50 / p99 / p99.9 / max: ticker alone (floor)", stalls(idle)),
        (
            "ticker lateness ms p99 / p99.9 / max: Kafka Java (own thread; arrival thread)",
            f"{k['p99_ms']} / {k['p999_ms']} / {k['max_ms']:g}; "
            f"{k['same_thread_p99_ms']} / {k['same_thread_p999_ms']} / "
            f"{k['same_thread_max_ms']:g}",
        ),
        (
            "worst stall N/P | P/Kafka",
            f"{fmt_ratio(ratios['max_stall naive/purgatory'])} | "
            f"{fmt_ratio(ratios['max_stall purgatory/kafka_java'])}",
        ),
        (
            "GC in the measured phase P | N | Kafka",
            f"{gcs(purg)} | {gcs(naive)} | {k['full_gcs']} full, "
            f"{k['young_pauses']} young (max {k['young_pause_max_ms']:g} ms)",
        ),
        (
            "CPU % of a core P | N | Kafka",
            f"{fmt(purg['cpu_pct'], 0)} | {fmt(naive['cpu_pct'], 0)} | {k['cpu_pct']:g}",
        ),
        (
            "tracked objects / pymalloc blocks / RSS bytes per pending op: P",
            f"{fmt(purg['tracked_per_pending'])} / {fmt(purg['blocks_per_pending'], 1)} / "
            f"{fmt(purg['rss_bytes_per_pending'], 0)}",
        ),
        (
            "tracked objects / pymalloc blocks / RSS bytes per pending op: N",
            f"{fmt(naive['tracked_per_pending'])} / {fmt(naive['blocks_per_pending'], 1)} / "
            f"{fmt(naive['rss_bytes_per_pending'], 0)} (Kafka {k['bytes_per_parked_op']} B)",
        ),
        ("tracked per pending op by type: P", _types(purg)),
        ("tracked per pending op by type: N", _types(naive)),
    ]
    return make_record(
        "w5",
        loop_name,
        asdict(params),
        {"contenders": runs, "kafka_java": KAFKA_JAVA},
        ratios=ratios,
        goals=goals,
        headline=headline,
    )


def _types(run: Record) -> str:
    parts = [f"{name} {count:g}" for name, count in run["tracked_per_pending_by_type"].items()]
    return ", ".join(parts) or "none"


def run(
    params: W5Params, loops: list[str], progress: Progress, results_dir: Path | None
) -> list[Record]:
    progress.section(
        f"w5: {params.parked:,} parked, timeout {params.timeout:g} s, "
        f"{params.rate:,.0f} arrivals/s for {params.duration:g} s, {params.tick * 1e3:g} ms ticker"
    )
    records = []
    for loop_name in loops:
        runs = {}
        for name in CONTENDERS:
            with progress.task(f"w5 {loop_name} {name} (child process)"):
                runs[name] = measure_in_child(name, loop_name, params)
        records.append(
            publish(build_record(loop_name, params, runs), loop_name, progress, results_dir)
        )
    return records


# -- no leak over many operations -----------------------------------------------------------


async def leak(n: int, params: W5Params) -> Record:
    """``n`` operations through one purgatory under tracemalloc: memory held over time."""
    counts = Counts()
    ParkedOp.counts = counts
    rng = random.Random(params.seed)
    topics = [f"topic-{i}" for i in range(params.topics)]
    chunk = 10_000
    samples: list[int] = []  # bytes held after warm-up, then after every tenth of the run
    cancelled = 0
    async with Purgatory("bench-w5-leak") as p:
        watch = p.try_complete_else_watch
        # Traced from the start; the baseline is taken after two chunks of warm-up,
        # once the dicts have grown to their working size.
        tracemalloc.start()
        chunks = n // chunk
        for number in range(chunks + 2):
            start = number * chunk
            ops = [ParkedOp(0.002, {"partition": i % 64}) for i in range(chunk)]
            for i, op in enumerate(ops):
                await watch(op, _keys(rng, topics, start + i))
            for op in ops[::3]:
                op.force_complete()
            for op in ops[1::3]:
                cancelled += op.cancel()
            del ops, op
            for _ in range(1_000):  # every one has expired within a few ms
                if not p.num_delayed:
                    break
                await asyncio.sleep(0.005)
            if number >= 1 and (number - 1) % max(1, chunks // 10) == 0:
                gc.collect()
                samples.append(tracemalloc.get_traced_memory()[0])
        gc.collect()
        samples.append(tracemalloc.get_traced_memory()[0])
        tracemalloc.stop()
    return {
        "ops": n,
        "settled": counts.completed + counts.expired + cancelled,
        "traced_bytes": samples,
        "growth_bytes": samples[-1] - samples[0],
        "growth_bytes_per_op": (samples[-1] - samples[0]) / n,
    }


# -- command line ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    base = W5Params()
    parser.add_argument("--parked", type=int, default=None, help=f"default {base.parked:,}")
    parser.add_argument("--timeout", type=float, default=None, help=f"s, default {base.timeout}")
    parser.add_argument("--topics", type=int, default=None, help=f"default {base.topics}")
    parser.add_argument(
        "--duration", type=float, default=None, help=f"measured s, default {base.duration}"
    )
    parser.add_argument(
        "--batch-interval", type=float, default=None, help="s between arrival batches (0.005)"
    )
    parser.add_argument("--tick", type=float, default=None, help="ticker period, s (0.001)")
    parser.add_argument(
        "--leak", type=int, default=None, metavar="N", help="run the leak check over N ops instead"
    )


def params_from_args(args: argparse.Namespace) -> W5Params:
    base = QUICK if args.quick else W5Params()
    given = {
        "parked": args.parked,
        "timeout": args.timeout,
        "topics": args.topics,
        "duration": args.duration,
        "batch_interval": args.batch_interval,
        "tick": args.tick,
    }
    return replace(base, seed=args.seed, **{k: v for k, v in given.items() if v is not None})


def run_leak(n: int, params: W5Params, loops: list[str], progress: Progress) -> list[Record]:
    progress.section(f"w5 --leak: {n:,} operations through one purgatory, tracemalloc")
    out = []
    for loop_name in loops:
        with progress.task(f"leak {loop_name}"):
            result = run_on(loop_name, lambda: leak(n, params))
        progress.result(
            f"{loop_name:8} settled {result['settled']:,} of {n:,}; traced bytes held "
            f"{', '.join(f'{b:,}' for b in result['traced_bytes'])}; growth "
            f"{result['growth_bytes']:,} B ({result['growth_bytes_per_op']:.4f} B/op)"
        )
        out.append(result)
    return out


def _child(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench.w5")
    parser.add_argument("--child", required=True, choices=CONTENDERS)
    parser.add_argument("--loop", required=True)
    parser.add_argument("--params", required=True)
    args = parser.parse_args(argv)
    quiet_logs()
    params = W5Params(**json.loads(args.params))
    result = run_on(args.loop, lambda: measure(args.child, params))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1:])
