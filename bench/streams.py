"""``python -m bench streams``: what a value stream costs per delivered value.

``Fanout.stream`` against the loop a user writes without it (``wait_for_value`` for a
value above the last one, again and again), on the same schedule in the same process:
``--consumers`` consumers follow one key of a ``MemoryFanout`` while a producer advances
it ``--values`` times, yielding to the loop after each advance, so every consumer sees
every value. Reported: CPU microseconds per delivered value (medians of ``--repeat``
runs, the two contenders alternating) and their ratio, on each loop.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from pathlib import Path
from typing import Any

from purgatory_aio import Purgatory
from purgatory_aio.fanout import MemoryFanout

from ._common import (
    RESULTS_DIR,
    Progress,
    Record,
    alternate,
    make_record,
    mark_quick,
    median_run,
    publish,
    quiet_logs,
    resolve_loops,
    run_on,
)

KEY = "progress"


async def _stream(fanout: MemoryFanout, purgatory: Purgatory, last: int, seen: list[int]) -> None:
    async with fanout.stream(purgatory, KEY, timeout=600) as values:
        async for value in values:
            seen[0] += 1
            if value >= last:
                return


async def _loop_of_waits(
    fanout: MemoryFanout, purgatory: Purgatory, last: int, seen: list[int]
) -> None:
    reached = 0.0
    while reached < last:
        value = await fanout.wait_for_value(purgatory, KEY, reached + 1, 600)
        if value is None:
            raise RuntimeError("a wait expired")
        seen[0] += 1
        reached = value


CONTENDERS = {"stream": _stream, "loop of wait_for_value": _loop_of_waits}


async def _run(contender: str, consumers: int, values: int) -> float:
    """CPU µs per value delivered to a consumer."""
    follow = CONTENDERS[contender]
    seen = [0]
    async with Purgatory("bench-streams") as purgatory, MemoryFanout(None, purgatory) as fanout:
        fanout.advance(KEY, 0)
        gc.collect()
        started = time.process_time()
        tasks = [
            asyncio.create_task(follow(fanout, purgatory, values, seen)) for _ in range(consumers)
        ]
        await asyncio.sleep(0)
        for value in range(1, values + 1):
            fanout.advance(KEY, value)
            await asyncio.sleep(0)  # the consumers take it before the next one
        await asyncio.gather(*tasks)
        elapsed = time.process_time() - started
    if seen[0] < consumers * values:
        raise RuntimeError(f"{contender}: {seen[0]} of {consumers * values} values delivered")
    return elapsed / seen[0] * 1e6


def measure(loop_name: str, consumers: int, values: int, repeat: int, progress: Progress) -> Record:
    with progress.task(f"streams {loop_name}", total=repeat * len(CONTENDERS)) as ticker:

        def run_one(name: str) -> Record:
            cost = run_on(loop_name, lambda: _run(name, consumers, values))
            ticker.advance(1)
            return {"us_per_value": cost}

        runs = alternate(list(CONTENDERS), repeat, run_one)
    return {
        "us_per_value": {
            name: median_run(found, "us_per_value")["us_per_value"] for name, found in runs.items()
        }
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench streams", description=__doc__)
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument("--consumers", type=int, default=1000, help="consumers of the key")
    parser.add_argument("--values", type=int, default=200, help="values advanced")
    parser.add_argument("--repeat", type=int, default=5, help="runs per contender (median)")
    parser.add_argument("--quick", action="store_true", help="100 consumers, 50 values, 1 run")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--plain", action="store_true", help="plain progress lines, no rich")
    args = parser.parse_args(argv)
    quiet_logs()
    mark_quick(args.quick)
    consumers, values, repeat = (
        (100, 50, 1) if args.quick else (args.consumers, args.values, args.repeat)
    )
    progress = Progress(plain=args.plain)
    progress.section("streams: CPU per delivered value, Fanout.stream vs a loop of waits")
    for loop_name in resolve_loops(args.loop, progress):
        results = measure(loop_name, consumers, values, repeat, progress)
        cost: dict[str, Any] = results["us_per_value"]
        ratio = cost["stream"] / cost["loop of wait_for_value"]
        headline = [
            ("us/value " + " | ".join(cost), " | ".join(f"{v:.2f}" for v in cost.values())),
            ("stream / loop of waits", f"{ratio:.2f}x"),
        ]
        record = make_record(
            "streams",
            loop_name,
            {"consumers": consumers, "values": values, "repeat": repeat},
            results,
            ratios={"stream / loop of waits": ratio},
            headline=headline,
        )
        publish(record, loop_name, progress, args.results_dir)
    return 0
