"""``python -m bench opshape``: what the shape of a user's operation class costs.

W1-user (a plain subclass with its own ``__init__`` and an instance ``__dict__``) costs
more than W1 (a slotted subclass) on the same schedule. This isolates the class shape:
per operation, construct it, await ``try_complete_else_watch`` under three keys, then
``force_complete()`` it, for four shapes of the same operation, net of a harness that
runs the same loop with no operation. Medians of ``--repeat`` runs on each loop.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from purgatory_aio import DelayedOperation, Purgatory

from ._common import (
    RESULTS_DIR,
    Progress,
    Record,
    make_record,
    mark_quick,
    publish,
    quiet_logs,
    resolve_loops,
    run_on,
)


class Sink:
    settled = 0


class Slotted(DelayedOperation[None]):
    """W1's shape: no per-instance dict, no ``__init__`` of its own."""

    __slots__ = ()
    sink = Sink()

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        self.sink.settled += 1


class User(DelayedOperation[None]):
    """W1-user's shape: its own fields, set in its own ``__init__``."""

    def __init__(self, timeout: float, index: int, sink: Sink) -> None:
        super().__init__(timeout)
        self.index = index
        self.sink = sink

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        self.sink.settled += 1


class UserSlots(DelayedOperation[None]):
    """W1-user's shape with ``__slots__`` for its fields."""

    __slots__ = ("index", "sink")

    def __init__(self, timeout: float, index: int, sink: Sink) -> None:
        super().__init__(timeout)
        self.index = index
        self.sink = sink

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        self.sink.settled += 1


class UserNoInit(DelayedOperation[None]):
    """A ``__dict__`` but no ``__init__`` of its own: fields set after construction."""

    sink: Sink
    index: int

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        self.sink.settled += 1


def _user(i: int, sink: Sink) -> DelayedOperation[None]:
    return User(0.2, i, sink)


def _user_slots(i: int, sink: Sink) -> DelayedOperation[None]:
    return UserSlots(0.2, i, sink)


def _user_no_init(i: int, sink: Sink) -> DelayedOperation[None]:
    op = UserNoInit(0.2)
    op.index = i
    op.sink = sink
    return op


SHAPES: dict[str, Callable[[int, Sink], DelayedOperation[None]] | None] = {
    "harness": None,
    "slotted": lambda i, sink: Slotted(0.2),
    "user": _user,
    "user+slots": _user_slots,
    "user, no __init__": _user_no_init,
}


async def _run(make: Callable[[int, Sink], DelayedOperation[None]] | None, n: int) -> float:
    """CPU µs per operation of one shape."""
    keys = [(f"k{i % 100}", f"k{(i + 7) % 100}", f"k{(i + 13) % 100}") for i in range(n)]
    sink = Slotted.sink = Sink()  # the slotted shape reaches its sink through its class
    async with Purgatory("bench-opshape") as purgatory:
        watch = purgatory.try_complete_else_watch
        gc.collect()
        started = time.process_time()
        for i in range(n):
            if make is None:
                continue
            op = make(i, sink)
            await watch(op, keys[i])
            op.force_complete()
        elapsed = time.process_time() - started
    if make is not None and sink.settled != n:
        raise RuntimeError(f"{sink.settled} of {n} operations settled")
    return elapsed / n * 1e6


def measure(loop_name: str, n: int, repeat: int, progress: Progress) -> Record:
    runs: dict[str, list[float]] = {name: [] for name in SHAPES}
    with progress.task(f"opshape {loop_name}", total=repeat * len(SHAPES)) as ticker:
        for _ in range(repeat):  # the shapes alternate, so drift hits them alike
            for name, make in SHAPES.items():
                runs[name].append(run_on(loop_name, lambda make=make: _run(make, n)))  # type: ignore[misc]
                ticker.advance(1)
    medians = {name: sorted(values)[len(values) // 2] for name, values in runs.items()}
    harness = medians.pop("harness")
    return {"net_us_per_op": {name: value - harness for name, value in medians.items()}}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench opshape", description=__doc__)
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument("--n", type=int, default=200_000, help="operations per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per shape (median)")
    parser.add_argument("--quick", action="store_true", help="20,000 operations, one run")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--plain", action="store_true", help="plain progress lines, no rich")
    args = parser.parse_args(argv)
    quiet_logs()
    mark_quick(args.quick)
    n, repeat = (20_000, 1) if args.quick else (args.n, args.repeat)
    progress = Progress(plain=args.plain)
    progress.section("opshape: the cost of an operation class's shape (construct, watch, complete)")
    for loop_name in resolve_loops(args.loop, progress):
        results = measure(loop_name, n, repeat, progress)
        net: dict[str, Any] = results["net_us_per_op"]
        ratios = {f"{name} / slotted": net[name] / net["slotted"] for name in net}
        headline = [
            ("net us/op " + " | ".join(net), " | ".join(f"{v:.2f}" for v in net.values())),
            ("vs slotted " + " | ".join(net), " | ".join(f"{v:.2f}x" for v in ratios.values())),
        ]
        record = make_record(
            "opshape",
            loop_name,
            {"n": n, "repeat": repeat},
            results,
            ratios=ratios,
            headline=headline,
        )
        publish(record, loop_name, progress, args.results_dir)
    return 0
