"""A seeded random script of public API calls, and everything it observes, as JSON.

Run in a child process per build (``python -m differential_script SEEDS LOOP OUT``):
one process can hold only one build of the core, so the differential test runs this
once with each build's wheel first on ``sys.path`` and compares the outputs. Every
value recorded is deterministic for a seed: results and errors of each call (type
and message), the counts after each step (``num_delayed``, ``watched``, ``stats()``,
``len(timer)``, the clock), every event record and each operation's final outcome.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import sys
from collections.abc import Callable
from typing import Any

import structlog

import purgatory_aio
from purgatory_aio import DelayedOperation, OperationEvent, Purgatory, Timer
from purgatory_aio.testing import ManualClock

STEPS = 120


class ScriptOp(DelayedOperation[str]):
    """An operation the script satisfies by flipping ``ready``."""

    def __init__(self, n: int, timeout: Any) -> None:
        super().__init__(timeout)
        self.n = n
        self.ready = False
        self.fail_try = False

    def try_complete(self) -> bool:
        if self.fail_try:
            raise ValueError(f"op{self.n} try_complete failed")
        return self.ready and self.force_complete()

    def on_complete(self) -> str:
        return f"op{self.n} done"

    def __repr__(self) -> str:
        return f"<op{self.n}>"


class BadHashKey:
    def __hash__(self) -> int:
        raise ValueError("no hash today")

    def __repr__(self) -> str:
        return "<BadHashKey>"


class BadEqKey:
    """Hashes like 1, then refuses to be compared."""

    def __hash__(self) -> int:
        return 1

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparison today")

    def __repr__(self) -> str:
        return "<BadEqKey>"


class Sink:
    def __init__(self) -> None:
        self.events: list[OperationEvent] = []

    def emit(self, event: OperationEvent) -> None:
        self.events.append(event)


GOOD_KEYS: list[Any] = ["a", "b", "c", 1, (2, 3)]
TIMEOUTS: list[Any] = [0, 0.0, 0.001, 0.0015, 0.002, 0.01, 0.5, 1.0, 1e7]
BAD_TIMEOUTS: list[Any] = [-1, math.nan, math.inf, "1", True, None, 1e300]
DELTAS: list[Any] = [0, 0.0005, 0.001, 0.002, 0.005, 0.0333, 0.5]


def shown(value: object) -> object:
    """A JSON-safe rendering of a result."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, list | tuple):
        return [shown(item) for item in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return repr(value)


def outcome_of(op: ScriptOp) -> list[object]:
    try:
        result: object = op.result()
    except asyncio.InvalidStateError:
        result = "pending"
    except BaseException as exc:
        result = f"{type(exc).__name__}: {exc}"
    return [op.n, op.is_completed, op.expired, op.cancelled, shown(result), shown(op.keys)]


class Script:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        rng = self.rng
        self.clock = ManualClock(start=rng.choice([0.0, -1.0, -0.0015, 12_345.678, -3.5e6]))
        self.sink = Sink()
        self.p = Purgatory(
            "diff",
            clock=self.clock,
            tick=rng.choice([0.001, 0.005]),
            wheel_size=rng.choice([4, 20]),
            purge_interval=rng.choice([1, 3, 100]),
            event_sink=self.sink,
        )
        self.timer = Timer(tick=0.001, wheel_size=8, clock=self.clock)
        self.ops: list[ScriptOp] = []
        self.handles: list[Any] = []
        self.fired: list[int] = []
        self.log: list[object] = []

    def key(self) -> Any:
        draw = self.rng.random()
        if draw < 0.04:
            return BadHashKey()
        if draw < 0.08:
            return BadEqKey()
        if draw < 0.10:
            return ["unhashable"]
        return self.rng.choice(GOOD_KEYS)

    def some_op(self) -> ScriptOp | None:
        return self.rng.choice(self.ops) if self.ops else None

    async def call(self, name: str, fn: Callable[[], Any]) -> None:
        try:
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
        except Exception as exc:
            self.log.append([name, "raised", type(exc).__name__, str(exc)])
            return
        self.log.append([name, "returned", shown(result)])

    def new_op(self) -> ScriptOp | None:
        rng = self.rng
        timeout = rng.choice(BAD_TIMEOUTS) if rng.random() < 0.08 else rng.choice(TIMEOUTS)
        try:
            op = ScriptOp(len(self.ops), timeout)
        except Exception as exc:
            self.log.append(["new_op", shown(timeout), type(exc).__name__, str(exc)])
            return None
        op.ready = rng.random() < 0.3
        op.fail_try = rng.random() < 0.05
        self.ops.append(op)
        return op

    async def step(self) -> None:
        rng = self.rng
        p = self.p
        action = rng.choice(
            [
                "watch",
                "watch",
                "watch_threshold",
                "advance_key",
                "check",
                "cancel_key",
                "ready",
                "force",
                "cancel",
                "advance",
                "advance",
                "timer_later",
                "timer_at",
                "timer_cancel",
            ]
        )
        if action == "watch":
            op = self.new_op()
            if op is not None:
                keys = [self.key() for _ in range(rng.randint(0, 3))]
                await self.call("watch", lambda: p.try_complete_else_watch(op, keys))
        elif action == "watch_threshold":
            op = self.new_op()
            if op is not None:
                threshold = rng.choice([0, 1, 2.5, 7, math.nan, "3"])
                key = self.key()
                await self.call("watch_threshold", lambda: p.watch_threshold(op, key, threshold))
        elif action == "advance_key":
            key, value = self.key(), rng.choice([0, 1, 3, 8, 2.5, math.inf, "x"])
            await self.call("advance_key", lambda: p.advance_key(key, value))
        elif action == "check":
            key = self.key()
            await self.call("check_and_complete", lambda: p.check_and_complete(key))
        elif action == "cancel_key":
            key = self.key()
            await self.call("cancel_for_key", lambda: p.cancel_for_key(key))
        elif action == "ready":
            op = self.some_op()
            if op is not None:
                op.ready = True
        elif action in ("force", "cancel"):
            op = self.some_op()
            if op is not None:
                method = op.force_complete if action == "force" else op.cancel
                await self.call(action, method)
        elif action == "advance":
            delta = rng.choice([-1.0, math.nan]) if rng.random() < 0.05 else rng.choice(DELTAS)
            await self.call("advance", lambda: self.clock.advance(delta))
        elif action == "timer_later":
            delay = rng.choice([0.0, 0.001, 0.0042, 0.02, -0.5])
            n = len(self.handles)
            await self.call(
                "call_later",
                lambda: self.handles.append(self.timer.call_later(delay, self.fire, n)),
            )
        elif action == "timer_at":
            when = self.clock.time() + rng.choice([-1.0, 0.0, 0.003, 0.05])
            if rng.random() < 0.1:
                when = rng.choice([-1e306, -sys.float_info.max, math.inf, 1e300])
            n = len(self.handles)
            await self.call(
                "call_at", lambda: self.handles.append(self.timer.call_at(when, self.fire, n))
            )
        elif action == "timer_cancel" and self.handles:
            handle = rng.choice(self.handles)
            await self.call("handle_cancel", handle.cancel)
        await self.clock.advance(0)
        stats = p.stats()
        self.log.append(
            [
                "counts",
                p.num_delayed,
                p.watched,
                [stats.completed, stats.expired, stats.cancelled, stats.shutdown, stats.pending],
                len(self.timer),
                self.fired[:],
                self.clock.time(),
            ]
        )

    def fire(self, n: int) -> None:
        self.fired.append(n)

    async def run(self) -> list[object]:
        async with self.p:
            for _ in range(STEPS):
                await self.step()
        self.timer.close()
        self.log.append(["outcomes", [outcome_of(op) for op in self.ops]])
        self.log.append(
            [
                "events",
                [
                    [e.op_id, e.outcome, e.keys, e.error, e.created_at, e.deadline, e.settled_at]
                    for e in self.sink.events
                ],
            ]
        )
        return self.log


def main(seeds: int, loop: str, out: str) -> None:
    # The script is the application: it keeps the library's logs (callback errors are
    # part of the script) out of the way.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
        cache_logger_on_first_use=False,
    )
    if loop == "uvloop":
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    else:
        factory = asyncio.new_event_loop
    results = []
    for seed in range(seeds):
        with asyncio.Runner(loop_factory=factory) as runner:
            results.append(runner.run(Script(seed).run()))
    with open(out, "w", encoding="utf-8") as file:
        json.dump({"compiled": purgatory_aio.compiled, "runs": results}, file)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
