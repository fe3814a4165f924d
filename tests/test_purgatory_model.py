"""A stateful property test: the purgatory against a small reference model."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)
from support import MockOperation

from purgatory_aio import Purgatory, PurgatoryClosed
from purgatory_aio.testing import ManualClock

KEYS = st.sampled_from(["a", "b", "c", 1, 2])
TICK = 0.001
PURGE = 8


class PurgatoryModel(RuleBasedStateMachine):
    """Random watch / check / force_complete / cancel / advance / shutdown.

    The model tracks which operations must still be pending; the purgatory must
    agree, settle every operation exactly once and never expire one early.
    """

    ops = Bundle("ops")

    @initialize()
    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.p = Purgatory("model", clock=self.clock, tick=TICK, purge_interval=PURGE)
        self.all: list[MockOperation] = []
        self.pending: set[int] = set()
        self.closed = False
        self.unwatched: set[int] = set()

    def teardown(self) -> None:
        if hasattr(self, "loop"):
            self.run(self.p.shutdown())
            for op in self.all:
                assert op.done(), op
                assert op.completions == (0 if op.cancelled else 1)
                assert op.expirations == (1 if op.expired else 0)
            self.loop.close()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    @rule(
        target=ops,
        timeout=st.floats(min_value=0, max_value=0.05),
        keys=st.lists(KEYS, min_size=1, max_size=3),
        completable=st.booleans(),
    )
    def watch(self, timeout: float, keys: list[Any], completable: bool) -> MockOperation:
        op = MockOperation(timeout, completable=completable)
        op.clock = self.clock
        try:
            done = self.run(self.p.try_complete_else_watch(op, keys))
        except PurgatoryClosed:
            assert self.closed
            self.unwatched.add(id(op))  # refused: still free to complete or cancel by hand
            return op
        self.all.append(op)
        assert done == completable
        if not done:
            self.pending.add(id(op))
        return op

    @rule(op=ops)
    def make_completable(self, op: MockOperation) -> None:
        op.completable = True

    @rule(key=KEYS)
    def check(self, key: Any) -> None:
        before = {id(op) for op in self.all if id(op) in self.pending and op.completable}
        completed = self.p.check_and_complete(key)
        satisfied = {
            id(op) for op in self.all if id(op) in before and key in op.keys and op.is_completed
        }
        assert completed == len(satisfied)
        self.pending -= satisfied

    @rule(op=ops)
    def force(self, op: MockOperation) -> None:
        free = id(op) in self.pending or id(op) in self.unwatched
        assert op.force_complete() == free
        self.pending.discard(id(op))
        self.unwatched.discard(id(op))

    @rule(op=consumes(ops))
    def cancel(self, op: MockOperation) -> None:
        free = id(op) in self.pending or id(op) in self.unwatched
        assert op.cancel() == free
        self.pending.discard(id(op))
        self.unwatched.discard(id(op))

    @rule(key=KEYS)
    def cancel_key(self, key: Any) -> None:
        cancelled = self.p.cancel_for_key(key)
        for op in cancelled:
            assert id(op) in self.pending
            self.pending.discard(id(op))

    @rule(dt=st.floats(min_value=0, max_value=0.03))
    def advance(self, dt: float) -> None:
        self.run(self.clock.advance(dt))
        now = self.clock.time()
        for op in self.all:
            if id(op) in self.pending and op.expired:
                assert op.completed_at is not None
                assert op.completed_at >= op.deadline, "expired early"  # type: ignore[operator]
                assert op.completed_at <= op.deadline + TICK + 1e-9  # type: ignore[operator]
                self.pending.discard(id(op))
            elif id(op) in self.pending:
                assert op.deadline is not None and now < op.deadline + TICK + 1e-9

    @precondition(lambda self: not self.closed)
    @rule()
    def shutdown(self) -> None:
        self.run(self.p.shutdown())
        self.closed = True
        for op in self.all:
            if id(op) in self.pending:
                assert op.expired
        self.pending.clear()

    @invariant()
    def delayed_matches_the_model(self) -> None:
        if hasattr(self, "p"):
            assert self.p.num_delayed == len(self.pending)

    @invariant()
    def watched_stays_bounded(self) -> None:
        if hasattr(self, "p"):
            live = sum(len(op.keys) for op in self.all if id(op) in self.pending)
            assert live <= self.p.watched <= live + 3 * (PURGE + 1)

    @invariant()
    def settled_at_most_once(self) -> None:
        if hasattr(self, "all"):
            for op in self.all:
                assert op.completions <= 1 and op.expirations <= 1


PurgatoryModel.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestPurgatoryModel = PurgatoryModel.TestCase
