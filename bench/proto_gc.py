"""``python -m bench proto-gc``: what taking pending operations out of the garbage
collector would save on W1-user, measured before the library commits to it.

W1-user's ``user-code`` contender shows that about 1.1 µs of the purgatory's net
cost per operation is the user's class, and a profile puts a good part of it in
CPython's cyclic collector: a pending operation lives long enough to reach the
oldest generation, so every full collection traverses it again (and its instance
dict, a separate object for subclasses of the compiled core). This command
compiles ``bench/proto/gcuntrack.c`` (two C functions: untrack and track an
object) into ``build/proto/`` and runs, in one process on W1-user's schedule:

* ``harness``, the driver alone;
* ``purgatory``, W1-user as ``python -m bench w1-user`` runs it;
* ``purgatory-untracked``, the same, except that each operation still pending
  after ``try_complete_else_watch`` is untracked (with its dict on the compiled
  build) and tracked again when it settles, from its ``on_complete``.

The prototype's calls are made from Python, so its figure includes their cost.
The library does not do this: an operation left untracked is invisible to the
collector, so a purgatory dropped without ``shutdown()`` would keep its pending
operations, and everything they reference, alive for good.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import purgatory_aio

from . import proto_timer, w1
from ._common import (
    RESULTS_DIR,
    Progress,
    Record,
    fmt,
    fmt_ratio,
    goal,
    make_record,
    mark_quick,
    publish,
    quiet_logs,
    ratio,
    resolve_loops,
)

SOURCE = Path(__file__).resolve().parent / "proto" / "gcuntrack.c"
NAMES = ("harness", "purgatory", "purgatory-untracked")


def contender_class(gcuntrack: ModuleType) -> type[w1.PurgatoryContender]:
    """W1-user's purgatory contender, untracking the operations it leaves pending."""
    untrack, track = gcuntrack.untrack, gcuntrack.track
    with_dict = bool(purgatory_aio.compiled)  # the pure build's instances keep no dict object

    settle = w1.W1UserOp.on_complete  # called unbound: cheaper than super() per operation

    class UntrackedOp(w1.W1UserOp):
        def on_complete(self) -> None:
            track(self)
            if with_dict:
                track(self.__dict__)
            settle(self)

    class UntrackingContender(w1.PurgatoryContender):
        name = "purgatory-untracked"

        async def enqueue_user_ops(self, start: int, stop: int) -> list[Any]:
            # W1-user's own loop plus the untracking: a copy, so that the loop it is
            # compared with carries no hook for it.
            settlements = self._settlements
            assert settlements is not None
            watch = self._purgatory.try_complete_else_watch
            keys = self._keys
            timeout = self._timeout
            ops: list[Any] = []
            for index in range(start, stop):
                op = UntrackedOp(timeout, index, settlements)
                if not await watch(op, keys[index]):
                    untrack(op)
                    if with_dict:
                        untrack(op.__dict__)
                ops.append(op)
            return ops

    return UntrackingContender


def measure(
    loop_name: str, params: w1.W1Params, progress: Progress, gcuntrack: ModuleType
) -> dict[str, Record]:
    factories = {"purgatory-untracked": contender_class(gcuntrack)}
    return w1.measure(loop_name, params, progress, NAMES, factories, label="proto-gc")


def build_record(loop_name: str, params: w1.W1Params, best: dict[str, Record]) -> Record:
    plain = best["purgatory"]["net_cpu_us_per_op"]
    untracked = best["purgatory-untracked"]["net_cpu_us_per_op"]
    saved = plain - untracked
    ratios = {"net_cpu_per_op untracked/purgatory": ratio(untracked, plain)}
    full = params.n >= 1_000_000
    note = "" if full else "indicative: the goal is stated for 1M ops"
    goals = [
        goal(
            "W1-user net CPU/op with pending operations untracked (prototype)",
            f"<= {w1.KAFKA_JAVA_NET_US} us/op",
            untracked,
            untracked <= w1.KAFKA_JAVA_NET_US if purgatory_aio.compiled else None,
            note,
        )
    ]
    headline = [
        (
            "W1-user net CPU us/op: purgatory | untracked while pending | Kafka Java",
            f"{fmt(plain)} | {fmt(untracked)} | {fmt(w1.KAFKA_JAVA_NET_US)}",
        ),
        (
            "saved per op by untracking (prototype calls included)",
            f"{fmt(saved)} us ({fmt_ratio(ratios['net_cpu_per_op untracked/purgatory'])})",
        ),
    ]
    return make_record(
        "proto-gc",
        loop_name,
        asdict(params),
        {"contenders": best},
        ratios=ratios,
        goals=goals,
        headline=headline,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench proto-gc",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="100k operations")
    parser.add_argument("--n", type=int, default=None, help="operations (default 1M)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per contender (median)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--plain", action="store_true", help="plain progress lines, no rich")
    args = parser.parse_args(argv)
    quiet_logs()
    mark_quick(args.quick)
    try:
        gcuntrack = proto_timer.load(source=SOURCE)
    except proto_timer.BuildError as exc:
        print(f"python -m bench proto-gc: {exc}", file=sys.stderr)
        return 2
    n = args.n or (100_000 if args.quick else 1_000_000)
    params = replace(w1.W1Params(user=True), n=n, seed=args.seed, repeat=args.repeat)
    progress = Progress(plain=args.plain)
    progress.section("proto-gc: W1-user with pending operations out of the garbage collector")
    for loop_name in resolve_loops(args.loop, progress):
        best = measure(loop_name, params, progress, gcuntrack)
        publish(build_record(loop_name, params, best), loop_name, progress, args.results_dir)
    return 0
