"""Rate sweep: the highest W1 arrival rate each contender sustains.

A rate is sustained when, over a W1 open-loop run of ``duration`` seconds of
Poisson arrivals, expiration lateness p99 stays under ``p99_limit_ms`` and the
driver kept up with the arrivals (achieved enqueue rate at least
``min_achieved`` of the target). The search doubles the rate from
``start_rate`` until a rate fails (or ``max_rate``), then bisects geometrically
``refine`` times; it stops early once ``budget_s`` seconds are spent per
contender and loop. A failing rate is tried twice before it counts as failed.
Every trial replays the same seeded schedule for both contenders.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ._common import Progress, Record, fmt, fmt_ratio, make_record, publish, ratio
from .w1 import W1Params, run_contender

CONTENDERS = ("purgatory", "naive-futures")


@dataclass(frozen=True, slots=True)
class SweepParams:
    start_rate: float = 10_000.0
    max_rate: float = 640_000.0
    duration: float = 2.0
    p99_limit_ms: float = 5.0
    min_achieved: float = 0.9
    refine: int = 3
    budget_s: float = 90.0
    seed: int = 1


def _trial(
    name: str, loop_name: str, rate: float, params: SweepParams, progress: Progress
) -> Record:
    """A rate fails only if two attempts fail: on a shared machine one bad trial is
    more often a neighbour's burst than the contender's limit."""
    first = _attempt(name, loop_name, rate, params, progress)
    if first["sustained"]:
        return first
    second = _attempt(name, loop_name, rate, params, progress)
    second["retried"] = True
    second["first_p99_ms"] = first["p99_ms"]
    return second


def _attempt(
    name: str, loop_name: str, rate: float, params: SweepParams, progress: Progress
) -> Record:
    n = max(2_000, int(rate * params.duration))
    w1 = W1Params(n=n, rate=rate, seed=params.seed)
    result = run_contender(name, loop_name, w1, progress, label=f"sweep {rate:,.0f}/s")
    lateness = result["lateness"] or {}
    p99 = lateness.get("p99_ms")
    achieved = (result["enqueue_rate"] or 0.0) / rate
    ok = (
        result["settled"] == n
        and p99 is not None
        and p99 < params.p99_limit_ms
        and achieved >= params.min_achieved
    )
    return {
        "rate": rate,
        "ops": n,
        "p99_ms": p99,
        "achieved": achieved,
        "cpu_us_per_op": result["cpu_us_per_op"],
        "sustained": ok,
    }


def _search(name: str, loop_name: str, params: SweepParams, progress: Progress) -> Record:
    started = time.monotonic()
    trials: list[Record] = []
    best: float | None = None
    failed: float | None = None
    rate = params.start_rate

    def out_of_time() -> bool:
        return time.monotonic() - started > params.budget_s

    while rate <= params.max_rate and not out_of_time():
        trial = _trial(name, loop_name, rate, params, progress)
        trials.append(trial)
        if trial["sustained"]:
            best = rate
            rate *= 2
        else:
            failed = rate
            break
    if best is None and failed is not None:
        # Even the starting rate fails: search downwards instead.
        rate = failed / 2
        while rate >= params.start_rate / 64 and not out_of_time():
            trial = _trial(name, loop_name, rate, params, progress)
            trials.append(trial)
            if trial["sustained"]:
                best = rate
                break
            failed = rate
            rate /= 2
    for _ in range(params.refine):
        if best is None or failed is None or out_of_time():
            break
        rate = math.sqrt(best * failed)
        trial = _trial(name, loop_name, rate, params, progress)
        trials.append(trial)
        if trial["sustained"]:
            best = rate
        else:
            failed = rate
    return {
        "sustained_rate": best,
        "first_failed_rate": failed,
        "capped": failed is None,
        "trials": trials,
        "seconds": time.monotonic() - started,
    }


def run(
    params: SweepParams, loops: list[str], progress: Progress, results_dir: Path | None
) -> list[Record]:
    progress.section(
        f"sweep: highest rate with expiry p99 < {params.p99_limit_ms:g} ms "
        f"({params.duration:g} s trials)"
    )
    records = []
    for loop_name in loops:
        results = {name: _search(name, loop_name, params, progress) for name in CONTENDERS}
        purg, naive = results["purgatory"], results["naive-futures"]
        ratios = {
            "sustained rate purgatory/naive": ratio(purg["sustained_rate"], naive["sustained_rate"])
        }
        headline = [
            (
                "sustained ops/s P | N",
                f"{fmt(purg['sustained_rate'], 0)} | {fmt(naive['sustained_rate'], 0)}",
            ),
            ("purgatory/naive", fmt_ratio(ratios["sustained rate purgatory/naive"])),
        ]
        record = make_record(
            "sweep",
            loop_name,
            asdict(params),
            {"contenders": results},
            ratios=ratios,
            headline=headline,
        )
        records.append(publish(record, loop_name, progress, results_dir))
    return records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=None, help="seconds of arrivals a trial")
    parser.add_argument("--start-rate", type=float, default=10_000.0)
    parser.add_argument("--max-rate", type=float, default=640_000.0)
    parser.add_argument("--budget", type=float, default=None, help="seconds per contender and loop")


def params_from_args(args: argparse.Namespace) -> SweepParams:
    return SweepParams(
        start_rate=args.start_rate,
        max_rate=args.max_rate,
        duration=args.duration or (0.5 if args.quick else 2.0),
        refine=2 if args.quick else 3,
        budget_s=args.budget or (12.0 if args.quick else 90.0),
        seed=args.seed,
    )
