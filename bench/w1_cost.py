"""``python -m bench w1-cost``: where W1-user's instructions go, counted by callgrind.

Timings on a shared machine move by tens of percent from one run to the next;
instruction counts do not. Each scenario below runs in a child process under
``valgrind --tool=callgrind`` at two sizes, and the difference of the two totals
divided by the difference of the sizes is its cost per operation, with start-up,
imports and the schedule's generation cancelled out. Every scenario replays
W1-user's operation class (``W1UserOp``) and keys, so the scenarios subtract from
one another:

* ``driver``: the loop that drives the others, with no operation at all;
* ``class``: it constructs each operation and drops it (the user's ``__init__``,
  with ``DelayedOperation.__init__`` through ``super()``);
* ``plain-class``: the same class on a plain Python base of the same shape
  (the library's attributes set in a Python ``__init__``): what constructing
  through the compiled base costs, against the interpreter's own way;
* ``user-code``: ``class`` plus ``on_complete`` for each, as W1-user's
  ``user-code`` contender;
* ``api-floor``: ``user-code`` plus the calls the contract makes (an awaited
  coroutine that tries the operation twice), as W1-user's ``api-floor`` contender;
* ``purgatory``: each operation constructed, ``await
  try_complete_else_watch(op, keys)`` under its three keys, and completed by
  ``force_complete()`` 256 arrivals later (first in, first out: the same work as
  W1-user's, without its timing; W1's timeout of 0.2 s on a clock whose wake-ups never
  fire, so that none expires however slow the run, and whose time moves at W1-user's
  pace per operation rather than callgrind's, so that the same number of operations
  share a timer bucket as in a real run, and the counts repeat exactly).

On the compiled build it also splits ``purgatory`` by the library's functions
(inclusive: each with what it calls). Needs valgrind (Debian: ``apt-get install
valgrind``); the sizes are small (a run takes a minute or two).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from purgatory_aio import LoopClock, Purgatory

from ._common import Settlements, run_on
from .w1 import W1Params, W1UserOp, _two_tries, make_schedule

SCENARIOS = ("driver", "class", "plain-class", "user-code", "api-floor", "purgatory")
#: Operations completed this many arrivals after their own (first in, first out).
WINDOW = 256
TIMEOUT = 0.2

#: The library's functions the purgatory scenario is split by, as mypyc names them
#: (``CPyDef_<module>___<Class>___<method>``), with the label printed.
LIBRARY_FUNCTIONS = (
    ("_purgatory___Purgatory___try_complete_else_watch", "try_complete_else_watch"),
    ("_operation___admit", "  admit (admission; 2 tries inline)"),
    ("_keys___check_keys", "    check_keys (validation)"),
    ("_watches___WatchStore___watch", "    WatchStore.watch (3 keys)"),
    ("_wheels___Wheels___add_entry", "    Wheels.add_entry"),
    ("_operation___DelayedOperation___force_complete", "force_complete"),
    ("_operation___completed", "  completed (aftermath; user's on_complete inside)"),
    ("_wheels___Wheels___remove_entry", "    Wheels.remove_entry"),
    ("_watches___WatchStore___retire", "    WatchStore.retire (purges: drops, frees ops)"),
    ("_stale___purge", "      purge (sweeps or compacts the lists)"),
    ("_operation___settle", "    settle"),
    ("_operation___DelayedOperation_____init__", "DelayedOperation.__init__ (in class)"),
)


class _Never:
    def cancel(self) -> None:
        pass


#: What the scenario's clock moves by at each reading: the admission reads it once per
#: operation, and W1-user's runs take about 3 us per operation (docs/benchmarks.md).
STEP = 3e-6


class NoWakeClock(LoopClock):
    """W1-user's pace of time, whose wake-ups never come: each reading is :data:`STEP`
    after the one before, so the timer places the operations into buckets as a real run
    does, however slowly the run goes under callgrind (real time there passes about 50
    times slower per operation, spreading the same arrivals over that many more ticks);
    and no operation can expire."""

    __slots__ = ("time",)

    def __init__(self) -> None:
        super().__init__()
        # A C callable, as LoopClock's own time.monotonic is: no Python frame per reading.
        self.time = functools.partial(next, itertools.count(1000.0, STEP))

    def call_at(self, when: float, callback: Callable[[], object]) -> _Never:
        return _Never()


class PlainBase:
    """DelayedOperation's instance layout on a plain Python base: its 13 attributes
    (``__dict__`` and ``__weakref__`` as the compiled class has them)."""

    __slots__ = (
        "__dict__",
        "__weakref__",
        "_bucket",
        "_busy",
        "_deadline",
        "_ident",
        "_keys",
        "_next",
        "_outcome",
        "_owner",
        "_prev",
        "_state",
        "_store",
        "_timeout",
        "_waiter",
    )

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._state = 0
        self._busy = False
        self._bucket = None
        self._owner = None
        self._keys = ()
        self._store = 0
        self._ident = None
        self._waiter = None
        self._outcome = None


class PlainUserOp(PlainBase):
    """W1UserOp's own part, on the plain base."""

    def __init__(self, timeout: float, index: int, settlements: Settlements) -> None:
        super().__init__(timeout)
        self.index = index
        self.settlements = settlements


async def _scenario(name: str, n: int) -> None:
    keys = make_schedule(W1Params(n=n)).keys
    settlements = Settlements(n + 1)  # never "done": nothing here waits for it
    held: deque[Any] = deque()
    async with Purgatory("w1-cost", clock=NoWakeClock()) as p:
        watch = p.try_complete_else_watch
        for index in range(n):
            if name == "driver":
                op: Any = index
            elif name == "plain-class":
                op = PlainUserOp(TIMEOUT, index, settlements)
            else:
                op = W1UserOp(TIMEOUT, index, settlements)
                if name == "api-floor":
                    await _two_tries(op)
                elif name == "purgatory":
                    await watch(op, keys[index])
            held.append(op)
            if len(held) > WINDOW:
                _finish(name, held.popleft())
            if index & 255 == 255:
                await asyncio.sleep(0)
        while held:
            _finish(name, held.popleft())
    if name in ("user-code", "api-floor", "purgatory") and settlements.completed != n:
        raise RuntimeError(f"{name}: {settlements.completed} of {n} operations completed")


def _finish(name: str, op: Any) -> None:
    if name == "purgatory":
        op.force_complete()
    elif name in ("user-code", "api-floor"):
        op.on_complete()


def _total(out: Path) -> int:
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no instruction total in {out}")


def _functions(out: Path) -> dict[str, int]:
    """Inclusive instructions of each compiled function of the library (``CPyDef_...``)."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return parse_functions(text)


def parse_functions(text: str) -> dict[str, int]:
    """The compiled functions' inclusive counts in ``callgrind_annotate`` output, by
    their mypyc name less ``CPyDef_`` (the first line of each: recursion adds more)."""
    found: dict[str, int] = {}
    for match in re.finditer(r"^\s*([\d,]+) \(.*?\)\s+\?\?\?:CPyDef_(\w+)(?=\s|$)", text, re.M):
        found.setdefault(match.group(2), int(match.group(1).replace(",", "")))
    return found


def measure(
    name: str, loop: str, sizes: tuple[int, int], tmp: Path
) -> tuple[float, dict[str, float]]:
    """Instructions per operation of scenario ``name``, and of the library's functions."""
    totals = []
    functions = []
    for n in sizes:
        out = tmp / f"{name}.{n}.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--dump-instr=no",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "bench.w1_cost",
                "--child",
                name,
                str(n),
                loop,
            ],
            check=True,
            capture_output=True,
            # One string hash for every run: the dicts' layouts, hence their probes, repeat.
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        totals.append(_total(out))
        functions.append(_functions(out) if name == "purgatory" else {})
    extra = sizes[1] - sizes[0]
    split = {fn: (functions[1].get(fn, 0) - functions[0].get(fn, 0)) / extra for fn in functions[1]}
    return (totals[1] - totals[0]) / extra, split


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench w1-cost", description=__doc__)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--n", type=int, default=10_000, help="the smaller size (the other: 3x)")
    parser.add_argument(
        "--child", nargs=3, metavar=("SCENARIO", "N", "LOOP"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        name, n, loop = args.child
        run_on(loop, lambda: _scenario(name, int(n)))
        return 0
    if shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None:
        print("python -m bench w1-cost needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    import purgatory_aio

    build = "compiled" if purgatory_aio.compiled else "pure"
    sizes = (args.n, 3 * args.n)
    print(
        f"== w1-cost: instructions per operation (callgrind, {build}, {args.loop}, "
        f"n = {sizes[0]:,} and {sizes[1]:,})",
        flush=True,
    )
    per_op: dict[str, float] = {}
    split: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="w1-cost-") as tmp:
        for name in SCENARIOS:
            per_op[name], found = measure(name, args.loop, sizes, Path(tmp))
            split.update(found)
            cost = per_op[name] - per_op["driver"] if name != "driver" else per_op[name]
            print(
                f"> {name:<12} {cost:>9,.0f}" + ("" if name == "driver" else "  (net of driver)"),
                flush=True,
            )
    net = {name: per_op[name] - per_op["driver"] for name in SCENARIOS}
    print(
        f"> construction through the compiled base vs a plain Python one: "
        f"{net['class'] - net['plain-class']:+,.0f}"
    )
    print(
        f"> library beyond the api-floor: {net['purgatory'] - net['api-floor']:,.0f} "
        f"({(net['purgatory'] - net['api-floor']) / net['purgatory']:.0%} of the purgatory's)"
    )
    if split:
        print("> the purgatory scenario by the library's functions (inclusive, per operation):")
        for fn, label in LIBRARY_FUNCTIONS:
            print(f">   {label:<52} {split.get(fn, 0.0):>8,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
