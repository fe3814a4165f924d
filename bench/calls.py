"""``python -m bench calls``: the calls one operation's hot path makes, counted.

Instruction counts (``bench w1-cost``) say how much a path costs; this says what
shape it has: how many functions one admission and one completion go through, and
in how many files. Each leg is traced with :func:`sys.setprofile` on the pure build
(the compiled build's functions call one another in C, invisible to a profiler):

* ``admission``: ``await p.try_complete_else_watch(op, keys)`` of an operation whose
  condition does not hold yet, under three fresh keys (W1's shape);
* ``completion``: ``p.check_and_complete(key)`` when the condition of the one
  operation watched under ``key`` has come to hold: the user's ``try_complete``
  calls ``force_complete``, the operation settles and ``on_complete`` runs inline.

Both run on the loop's clock with another operation pending throughout (the timer
is never idle), after a first round that warms lazy paths up. A *call* is a Python
function entered (the leg's own entry point included, the user's ``try_complete``
and ``on_complete`` too); *files* are the library's files those calls are in (the
user's own file not counted). The built-in functions and methods called (``len``,
``dict.get``, a lock's ``acquire``) are counted apart, as *C calls*. ``--list``
prints every call, in order, with its file and depth.

Run it on the pure source (the compiled build's calls are invisible here)::

    PURGATORY_AIO_NO_EXTENSIONS=1 python -m bench calls
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from purgatory_aio import DelayedOperation, Purgatory


class _Offset(DelayedOperation[int]):
    """Completes once ``log[0]`` reaches ``offset``: a typical user class."""

    def __init__(self, log: list[int], offset: int) -> None:
        super().__init__(30.0)
        self.log = log
        self.offset = offset

    def try_complete(self) -> bool:
        return self.log[0] >= self.offset and self.force_complete()

    def on_complete(self) -> int:
        return self.log[0]


@dataclass
class Trace:
    """What one traced leg called: Python functions (file, name, depth) and C calls."""

    calls: list[tuple[str, str, int]] = field(default_factory=list)
    c_calls: list[tuple[str, int]] = field(default_factory=list)

    @property
    def library_files(self) -> list[str]:
        return sorted({file for file, _, _ in self.calls if file.startswith("purgatory_aio/")})


def trace(fn: Callable[..., Any], *args: Any) -> tuple[Any, Trace]:
    """Run ``fn(*args)`` under a profiler; return its result and what it called
    (``fn`` itself first)."""
    found = Trace()
    depth = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal depth
        if event == "call":
            code = frame.f_code
            found.calls.append((_short(code.co_filename), code.co_qualname, depth))
            depth += 1
        elif event == "return":
            depth -= 1
        elif event == "c_call":
            found.c_calls.append((getattr(arg, "__qualname__", repr(arg)), depth))

    sys.setprofile(profile)
    try:
        result = fn(*args)
    finally:
        sys.setprofile(None)
    found.c_calls = [call for call in found.c_calls if call[0] != "setprofile"]
    return result, found


def _short(filename: str) -> str:
    """``purgatory_aio/_lifecycle.py`` rather than the installed path."""
    parts = filename.replace(os.sep, "/").split("/")
    for anchor in ("purgatory_aio", "bench"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) :])
    return parts[-1]


async def _legs() -> dict[str, Trace]:
    """Trace one admission and one completion in steady state: another operation
    stays pending throughout (the timer is never idle), and a first round warms up."""
    log = [0]
    legs: dict[str, Trace] = {}
    async with Purgatory("calls") as p:
        await p.try_complete_else_watch(_Offset([0], 1), ("elsewhere",))
        for round_ in range(2):
            base = round_ * 10
            op = _Offset(log, base + 1)
            keys = (f"a{round_}", f"b{round_}", f"c{round_}")
            # The call does the work; the awaitable only reports the answer.
            awaitable, legs["admission"] = trace(p.try_complete_else_watch, op, keys)
            if await awaitable:
                raise RuntimeError("the traced admission completed its operation")
            log[0] = base + 1
            count, legs["completion"] = trace(p.check_and_complete, keys[0])
            if count != 1 or op.result() != base + 1:
                raise RuntimeError("the traced completion did not complete its operation")
            for key in keys[1:]:  # the other two keys' entries, stale now
                p.check_and_complete(key)
    return legs


def count_calls() -> dict[str, Trace]:
    """The traces of one admission and one completion (pure build only)."""
    import purgatory_aio

    if purgatory_aio.compiled:
        raise RuntimeError(
            "bench calls traces the pure build: run it with PURGATORY_AIO_NO_EXTENSIONS=1"
        )
    return asyncio.run(_legs())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench calls", description=__doc__)
    parser.add_argument("--list", action="store_true", help="print every call of each leg")
    args = parser.parse_args(argv)
    try:
        legs = count_calls()
    except RuntimeError as exc:
        print(f"python -m bench calls: {exc}", file=sys.stderr)
        return 2
    print("== calls per operation (sys.setprofile, pure build)")
    for name, found in legs.items():
        print(
            f"> {name:<10} {len(found.calls):>3} calls in {len(found.library_files)} files "
            f"of the library, {len(found.c_calls)} C calls"
        )
        if args.list:
            for file, name_, depth in found.calls:
                print(f">   {'  ' * depth}{name_}  ({file})")
            for c_name, depth in found.c_calls:
                print(f">   C {'  ' * depth}{c_name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
