"""W4: expiration accuracy and idle cost, on an otherwise idle loop.

``timers`` callbacks with deadlines uniform over ``spread`` seconds (starting
``lead`` seconds out, so scheduling them all finishes first). Each callback
records ``time.monotonic() - deadline``: monotonic is the Timer's clock, and
the one the comparison is held to as well, since a caller's deadline is a real
instant whatever the loop's clock resolution.

The Timer also reports its reaper wake-ups against the number of distinct
level-0 buckets the deadlines fall in (a bucket is fired from its earliest
deadline on, so one whose deadlines outlast the first wake-up takes another),
and its wake-ups during ``idle`` seconds with nothing pending, after a batch of
timers was added and cancelled (must be 0). The comparison is ``loop.call_at``
with the same deadlines.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from purgatory_aio import Timer

from ._common import (
    Progress,
    Record,
    fmt,
    goal,
    lateness_summary,
    make_record,
    publish,
    quiesced,
    ratio,
    run_on,
)

_monotonic = time.monotonic

CONTENDERS = ("timer", "call_at")


@dataclass(frozen=True, slots=True)
class W4Params:
    timers: int = 100_000
    spread: float = 2.0
    lead: float = 0.3
    idle: float = 1.0
    tick: float = 0.001
    seed: int = 1


async def _measure(name: str, params: W4Params) -> Record:
    rng = random.Random(params.seed)
    offsets = [params.lead + params.spread * rng.random() for _ in range(params.timers)]
    n = params.timers
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    lateness: list[float] = []
    record = lateness.append

    def fire(deadline: float) -> None:
        record(_monotonic() - deadline)
        if len(lateness) == n:
            done.set_result(None)

    timer: Timer | None = None
    base = _monotonic()
    deadlines = [base + offset for offset in offsets]
    if name == "timer":
        timer = Timer(tick=params.tick)
        call_at = timer.call_at
        for deadline in deadlines:
            call_at(deadline, fire, deadline)
        wakeups0 = timer.wakeups
    else:
        # The loop's own clock; the same instant in monotonic terms is the deadline.
        shift = loop.time() - _monotonic()
        loop_call_at = loop.call_at
        for deadline in deadlines:
            loop_call_at(deadline + shift, fire, deadline)
        wakeups0 = 0
    scheduled_in = _monotonic() - base
    with _full_collections() as pauses:
        async with asyncio.timeout(params.lead + params.spread + 30):
            await done
    result: Record = {
        "timers": n,
        "fired": len(lateness),
        "schedule_s": scheduled_in,
        "lateness": lateness_summary(lateness),
        "distinct_due_buckets": len({int(d // params.tick) for d in deadlines}),
        # Full (generation 2) garbage collections while the timers fired: each one stops
        # the loop, so a lateness tail that matches one is the collector's, not the timer's.
        "gc_full_collections": len(pauses),
        "gc_full_max_pause_ms": max(pauses, default=0.0) * 1000,
    }
    if timer is not None:
        result["wakeups"] = timer.wakeups - wakeups0
        result["pending_after"] = len(timer)
        for handle in [timer.call_later(0.5, fire, 0.0) for _ in range(1000)]:
            handle.cancel()
        idle0 = timer.wakeups
        await asyncio.sleep(params.idle)
        result["idle_wakeups"] = timer.wakeups - idle0
        result["idle_s"] = params.idle
        timer.close()
    return result


@contextmanager
def _full_collections() -> Iterator[list[float]]:
    """The durations (s) of the full collections that ran inside the block."""
    pauses: list[float] = []
    started: list[float] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            pauses.append(time.perf_counter() - started.pop())

    gc.callbacks.append(watch)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(watch)


def run(
    params: W4Params, loops: list[str], progress: Progress, results_dir: Path | None
) -> list[Record]:
    progress.section(f"w4 expiration accuracy: {params.timers:,} timers over {params.spread} s")
    records = []
    for loop_name in loops:
        results = {}
        for name in CONTENDERS:
            with progress.task(f"w4 {loop_name} {name}"), quiesced():
                results[name] = run_on(loop_name, lambda name=name: _measure(name, params))  # type: ignore[misc]
            if results[name]["fired"] != params.timers:
                raise RuntimeError(f"w4 {name}: not every timer fired: {results[name]}")
        records.append(
            publish(_build_record(loop_name, params, results), loop_name, progress, results_dir)
        )
    return records


def _build_record(loop_name: str, params: W4Params, results: dict[str, Record]) -> Record:
    timer, call_at = results["timer"], results["call_at"]
    lt, lc = timer["lateness"], call_at["lateness"]
    ratios = {
        "lateness p50 timer/call_at": ratio(lt["p50_ms"], lc["p50_ms"]),
        "lateness p99 timer/call_at": ratio(lt["p99_ms"], lc["p99_ms"]),
        "wakeups/due buckets": timer["wakeups"] / timer["distinct_due_buckets"],
    }
    goals = [
        goal("W4 Timer early firings", "0", lt["early"], lt["early"] == 0),
        goal("W4 Timer lateness p99", "<= 2 ms", lt["p99_ms"], lt["p99_ms"] <= 2.0),
        goal(
            f"W4 Timer wake-ups in {params.idle:g} s idle",
            "0",
            timer["idle_wakeups"],
            timer["idle_wakeups"] == 0,
        ),
    ]
    headline = [
        (
            "late p50/p99/max ms timer",
            f"{fmt(lt['p50_ms'])}/{fmt(lt['p99_ms'])}/{fmt(lt['max_ms'])}",
        ),
        (
            "late p50/p99/max ms call_at",
            f"{fmt(lc['p50_ms'])}/{fmt(lc['p99_ms'])}/{fmt(lc['max_ms'])}",
        ),
        ("early timer | call_at", f"{lt['early']} | {lc['early']}"),
        (
            "reaper wake-ups / due buckets",
            f"{timer['wakeups']:,} / {timer['distinct_due_buckets']:,}",
        ),
        ("idle wake-ups", str(timer["idle_wakeups"])),
        (
            "full GCs while firing (max pause ms) timer | call_at",
            f"{timer['gc_full_collections']} ({fmt(timer['gc_full_max_pause_ms'])}) | "
            f"{call_at['gc_full_collections']} ({fmt(call_at['gc_full_max_pause_ms'])})",
        ),
    ]
    return make_record(
        "w4",
        loop_name,
        asdict(params),
        {"contenders": results},
        ratios=ratios,
        goals=goals,
        headline=headline,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timers", type=int, default=100_000)
    parser.add_argument("--spread", type=float, default=2.0, help="seconds the deadlines span")
    parser.add_argument("--idle", type=float, default=1.0, help="idle seconds watched")


def params_from_args(args: argparse.Namespace) -> W4Params:
    return W4Params(timers=args.timers, spread=args.spread, idle=args.idle, seed=args.seed)
