"""Threshold watches: advancing a key's value visits only the operations it satisfies."""

from __future__ import annotations

import math

import pytest

from purgatory_aio import DelayedOperation, Purgatory
from purgatory_aio.testing import ManualClock


class Counter:
    def __init__(self) -> None:
        self.value = 0
        self.extra_ok = True


class WaitFor(DelayedOperation[int]):
    def __init__(self, counter: Counter, target: int, timeout: float = 10) -> None:
        super().__init__(timeout)
        self.counter = counter
        self.target = target
        self.tries = 0

    def try_complete(self) -> bool:
        self.tries += 1
        if self.counter.value >= self.target and self.counter.extra_ok:
            return self.force_complete()
        return False

    def on_complete(self) -> int:
        return self.counter.value


async def test_advance_completes_exactly_the_reached_thresholds() -> None:
    counter = Counter()
    async with Purgatory("hw", clock=ManualClock()) as p:
        ops = [WaitFor(counter, t) for t in range(1, 101)]
        for op in ops:
            assert await p.watch_threshold(op, "tp-0", op.target) is False
        assert p.watched == 100 and p.num_delayed == 100
        counter.value = 10
        assert p.advance_key("tp-0", 10) == 10
        assert [op.is_completed for op in ops[:11]] == [True] * 10 + [False]
        assert all(op.tries == 2 for op in ops[10:])  # the rest were never visited again
        assert p.watched == 90
        counter.value = 100
        assert p.advance_key("tp-0", 100) == 90
        assert p.watched == 0 and p.num_delayed == 0
        assert await ops[-1] == 100


async def test_an_operation_satisfied_at_once_is_not_indexed() -> None:
    counter = Counter()
    counter.value = 5
    async with Purgatory("hw", clock=ManualClock()) as p:
        op = WaitFor(counter, 3)
        assert await p.watch_threshold(op, "k", 3) is True
        assert p.watched == 0


async def test_a_declining_operation_moves_to_the_plain_watch_list() -> None:
    counter = Counter()
    counter.extra_ok = False
    async with Purgatory("hw", clock=ManualClock()) as p:
        op = WaitFor(counter, 2)
        await p.watch_threshold(op, "k", 2)
        counter.value = 2
        assert p.advance_key("k", 2) == 0
        assert not op.is_completed and p.watched == 1
        counter.extra_ok = True
        assert p.check_and_complete("k") == 1
        assert await op == 2


async def test_threshold_operations_expire_at_their_deadline() -> None:
    clock = ManualClock()
    counter = Counter()
    async with Purgatory("hw", clock=clock) as p:
        op = WaitFor(counter, 5, timeout=0.5)
        await p.watch_threshold(op, "k", 5)
        await clock.advance(0.6)
        assert op.expired and await op == 0
        assert p.advance_key("k", 10) == 0


async def test_settled_operations_are_compacted_out_of_the_index() -> None:
    counter = Counter()
    async with Purgatory("hw", clock=ManualClock(), purge_interval=10) as p:
        ops = [WaitFor(counter, 1000 + i) for i in range(200)]
        for op in ops:
            await p.watch_threshold(op, "k", op.target)
        for op in ops:
            op.force_complete()
        assert p.num_delayed == 0
        assert p.watched <= 10


async def test_check_and_complete_also_tries_threshold_operations() -> None:
    counter = Counter()
    async with Purgatory("hw", clock=ManualClock()) as p:
        op = WaitFor(counter, 3)
        await p.watch_threshold(op, "k", 3)
        counter.value = 3
        assert p.check_and_complete("k") == 1


async def test_cancel_for_key_covers_threshold_operations() -> None:
    counter = Counter()
    async with Purgatory("hw", clock=ManualClock()) as p:
        a, b = WaitFor(counter, 3), WaitFor(counter, 4)
        await p.watch_threshold(a, "k", 3)
        await p.try_complete_else_watch(b, ["k"])
        assert set(p.cancel_for_key("k")) == {a, b}
        assert p.watched == 0 and p.num_delayed == 0


@pytest.mark.parametrize(
    ("threshold", "error"), [(math.nan, ValueError), ("3", TypeError), (math.inf, ValueError)]
)
async def test_bad_thresholds_are_rejected(threshold: object, error: type[Exception]) -> None:
    async with Purgatory("hw", clock=ManualClock()) as p:
        op = WaitFor(Counter(), 1)
        with pytest.raises(error, match="threshold"):
            await p.watch_threshold(op, "k", threshold)  # type: ignore[arg-type]
        assert p.watched == 0 and op.deadline is None
