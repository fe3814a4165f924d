"""A key watched by one operation alone holds it directly (no dict of one): every walk,
purge and cancellation treats it exactly as a watch list of one, even while callbacks
add a second operation to that key or take the first one away."""

from __future__ import annotations

from typing import Any

from purgatory_aio import Purgatory
from purgatory_aio.testing import ManualClock
from tests.support import MockOperation


class Spawning(MockOperation):
    """Completes when asked, and its completion watches ``follower`` under the same key."""

    def __init__(self, timeout: float, purgatory: Purgatory, follower: MockOperation) -> None:
        super().__init__(timeout)
        self.purgatory = purgatory
        self.follower = follower
        self.watched_it: Any = None

    def on_complete(self) -> str:
        # A second operation under the key while the walk is on the first one.
        coro = self.purgatory.try_complete_else_watch(self.follower, ["k"])
        try:
            coro.send(None)
        except StopIteration as done:
            self.watched_it = done.value
        return super().on_complete()


async def test_a_lone_operation_is_checked_completed_and_dropped() -> None:
    async with Purgatory("lone", clock=ManualClock()) as p:
        op = MockOperation(1.0)
        assert not await p.try_complete_else_watch(op, ["only"])
        assert p.watched == 1 and p.check_and_complete("only") == 0
        op.completable = True
        assert p.check_and_complete("only") == 1
        assert p.watched == 0 and p.stats().watched_keys == 0


async def test_a_second_operation_joining_during_the_walk_stays_watched() -> None:
    async with Purgatory("lone", clock=ManualClock()) as p:
        follower = MockOperation(1.0)
        first = Spawning(1.0, p, follower)
        assert not await p.try_complete_else_watch(first, ["k"])
        first.completable = True
        assert p.check_and_complete("k") == 1
        assert first.watched_it is False and not follower.done()
        assert p.watched == 1  # the follower's entry; the first one's was dropped
        follower.completable = True
        assert p.check_and_complete("k") == 1
        assert p.watched == 0 and p.stats().watched_keys == 0


async def test_cancel_for_key_takes_a_lone_operation() -> None:
    async with Purgatory("lone", clock=ManualClock()) as p:
        alone, shared = MockOperation(1.0), MockOperation(1.0)
        assert not await p.try_complete_else_watch(alone, ["mine", "both"])
        assert not await p.try_complete_else_watch(shared, ["both"])
        assert p.cancel_for_key("mine") == [alone]
        assert alone.cancelled and not shared.done()
        assert p.check_and_complete("mine") == 0
        shared.completable = True
        assert p.check_and_complete("both") == 1


async def test_stale_lone_entries_are_purged() -> None:
    clock = ManualClock()
    async with Purgatory("lone", clock=clock, purge_interval=4) as p:
        ops = [MockOperation(1.0) for _ in range(12)]
        for index, op in enumerate(ops):
            assert not await p.try_complete_else_watch(op, [f"own-{index}", "topic"])
        for op in ops:
            op.force_complete()  # stale in both lists until a walk or a purge
        assert p.watched < 2 * len(ops)  # purges ran meanwhile
        p.check_and_complete("topic")
        for index in range(len(ops)):
            p.check_and_complete(f"own-{index}")
        assert p.watched == 0 and p.stats().watched_keys == 0


async def test_a_threshold_operation_that_declines_moves_to_a_lone_key() -> None:
    async with Purgatory("lone", clock=ManualClock()) as p:
        op = MockOperation(1.0)
        assert not await p.watch_threshold(op, "hw", 5)
        assert p.advance_key("hw", 5) == 0  # reached, but its try declines
        assert p.watched == 1 and not op.done()
        op.completable = True
        assert p.check_and_complete("hw") == 1
        assert p.watched == 0
