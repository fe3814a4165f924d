"""Memory: bytes per pending operation (3 keys of 100 each), purgatory vs naive-futures.

The caller's keys tuples are built before measuring: they are the user's own data
(64 B each for three small ints), held by reference, not copied.

Every (loop, size, contender, method) is measured in a fresh interpreter, so no
measurement inherits another's heap: ``tracemalloc`` counts the bytes the
Python allocator hands out (exact, but tracing slows allocation), the RSS delta
counts what the process really grew by (allocator slack and page granularity
included). Both are taken after a full collection, with nothing but the
contender's own structures holding the operations.
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
from dataclasses import asdict, dataclass
from pathlib import Path

from purgatory_aio import DelayedOperation, Purgatory

from ._common import (
    REPO_ROOT,
    Progress,
    Record,
    Settlements,
    distinct_keys,
    fmt,
    fmt_ratio,
    goal,
    make_record,
    publish,
    quiet_logs,
    ratio,
    rss_bytes,
    run_on,
)
from .baselines import NaiveFutures

CONTENDERS = ("purgatory", "naive-futures")
METHODS = ("tracemalloc", "rss")
TIMEOUT = 3600.0


@dataclass(frozen=True, slots=True)
class MemoryParams:
    sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    keys_per_op: int = 3
    key_space: int = 100
    seed: int = 1


class MemOp(DelayedOperation[None]):
    __slots__ = ()

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        return None


async def _populate(contender: str, size: int, method: str, params: MemoryParams) -> Record:
    rng = random.Random(params.seed)
    kp, ks = params.keys_per_op, params.key_space
    settlements = Settlements(size)
    purgatory: Purgatory | None = None
    naive: NaiveFutures | None = None
    if contender == "purgatory":
        purgatory = Purgatory("bench-memory")
        await purgatory.__aenter__()
        # Start the reaper and create the first wheel buckets before the baseline.
        warm = MemOp(TIMEOUT)
        await purgatory.try_complete_else_watch(warm, (0,))
        warm.cancel()
    else:
        naive = NaiveFutures(settlements)
        naive.complete(naive.watch((0,), TIMEOUT))
    # The keys are the caller's own data (a request names its partitions anyway): they
    # are built before measuring, so neither contender is charged for them.
    all_keys = [distinct_keys(rng.random, kp, ks) for _ in range(size)]
    await asyncio.sleep(0)
    gc.collect()
    if method == "tracemalloc":
        tracemalloc.start()
        measure = _traced
    else:
        measure = rss_bytes
    before = measure()
    t0 = time.perf_counter()
    if purgatory is not None:
        watch = purgatory.try_complete_else_watch
        for keys in all_keys:
            await watch(MemOp(TIMEOUT), keys)
        populate_s = time.perf_counter() - t0
        pending = purgatory.num_delayed
    else:
        assert naive is not None
        naive_watch = naive.watch
        for keys in all_keys:
            naive_watch(keys, TIMEOUT)
        populate_s = time.perf_counter() - t0
        pending = naive.pending()  # outside the timed fill: it walks every watch list
    gc.collect()
    after = measure()
    if method == "tracemalloc":
        tracemalloc.stop()
    if purgatory is not None:
        await purgatory.shutdown(expire_pending=False)
        settled = purgatory.stats().cancelled - 1  # the warm-up operation was cancelled too
    else:
        assert naive is not None
        settled = naive.cancel_all()
    return {
        "contender": contender,
        "size": size,
        "method": method,
        "pending": pending,
        "settled": settled,
        "delta_bytes": after - before,
        "bytes_per_op": (after - before) / size,
        "populate_s": populate_s,
    }


def _traced() -> int:
    return tracemalloc.get_traced_memory()[0]


def _child(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench.memory")
    parser.add_argument("--contender", required=True, choices=CONTENDERS)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--method", required=True, choices=METHODS)
    parser.add_argument("--loop", required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    quiet_logs()
    params = MemoryParams(seed=args.seed)
    result = run_on(args.loop, lambda: _populate(args.contender, args.size, args.method, params))
    print(json.dumps(result), flush=True)


def measure_in_subprocess(
    contender: str, size: int, method: str, loop_name: str, seed: int
) -> Record:
    cmd = [
        sys.executable,
        "-m",
        "bench.memory",
        "--contender",
        contender,
        "--size",
        str(size),
        "--method",
        method,
        "--loop",
        loop_name,
        "--seed",
        str(seed),
    ]
    out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"memory child failed ({' '.join(cmd[3:])}):\n{out.stderr[-2000:]}")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def run(
    params: MemoryParams, loops: list[str], progress: Progress, results_dir: Path | None
) -> list[Record]:
    progress.section(f"memory: bytes per pending op at {', '.join(f'{s:,}' for s in params.sizes)}")
    records = []
    for loop_name in loops:
        table: dict[str, dict[str, Record]] = {c: {} for c in CONTENDERS}
        for size in params.sizes:
            for contender in CONTENDERS:
                row: Record = {}
                for method in METHODS:
                    with progress.task(f"memory {loop_name} {contender} {size:,} {method}"):
                        result = measure_in_subprocess(
                            contender, size, method, loop_name, params.seed
                        )
                    if result["pending"] != size or result["settled"] != size:
                        raise RuntimeError(
                            f"memory {contender}: not all ops pending/settled: {result}"
                        )
                    row[f"{method}_bytes_per_op"] = result["bytes_per_op"]
                    row["settled"] = result["settled"]
                table[contender][str(size)] = row
        records.append(
            publish(_build_record(loop_name, params, table), loop_name, progress, results_dir)
        )
    return records


def _build_record(
    loop_name: str, params: MemoryParams, table: dict[str, dict[str, Record]]
) -> Record:
    purg, naive = table["purgatory"], table["naive-futures"]
    ratios: dict[str, float | None] = {}
    for size in map(str, params.sizes):
        for method in METHODS:
            key = f"{method}_bytes_per_op"
            ratios[f"{method} N={size} naive/purgatory"] = ratio(naive[size][key], purg[size][key])
    large = str(max(params.sizes))
    value = purg[large]["tracemalloc_bytes_per_op"]
    note = f"RSS delta {purg[large]['rss_bytes_per_op']:.0f} B/op"
    if large != "1000000":
        note += f"; indicative: largest size run is {int(large):,}"
    goals = [
        goal(f"Memory per pending op (3 keys) at N={large}", "<= 350 B", value, value <= 350, note)
    ]
    headline = [
        (
            f"B/op N={large} tracemalloc P | N",
            f"{fmt(value, 0)} | {fmt(naive[large]['tracemalloc_bytes_per_op'], 0)}",
        ),
        (
            f"B/op N={large} RSS P | N",
            f"{fmt(purg[large]['rss_bytes_per_op'], 0)} | "
            f"{fmt(naive[large]['rss_bytes_per_op'], 0)}",
        ),
        (
            "naive/purgatory (tracemalloc)",
            fmt_ratio(ratios[f"tracemalloc N={large} naive/purgatory"]),
        ),
    ]
    return make_record(
        "memory",
        loop_name,
        asdict(params),
        {"contenders": table},
        ratios=ratios,
        goals=goals,
        headline=headline,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=str, default=None, help="pending counts, comma separated")


def params_from_args(args: argparse.Namespace) -> MemoryParams:
    if args.sizes:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    else:
        sizes = (20_000,) if args.quick else MemoryParams().sizes
    return MemoryParams(sizes=sizes, seed=args.seed)


if __name__ == "__main__":
    _child(sys.argv[1:])
