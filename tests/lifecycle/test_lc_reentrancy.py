"""Re-entrant calls during a walk, a timer closed from its own callback, what is held.

A walk (``check_and_complete``, ``advance_key``, the reaper) runs user callbacks;
whatever they call back into must leave the books exact: ``watched`` never below
the live entries nor more than ``purge_interval`` above them, and no operation
pending under a key once ``cancel_for_key`` has run for it.
"""

from __future__ import annotations

import asyncio
import gc

import pytest
from lc_support import HostileOp, futures_held_by, is_settled, outcome_of

from purgatory_aio import Purgatory, Timer
from purgatory_aio.testing import ManualClock

LIMIT = 10.0


def check_books(p: Purgatory, pending: list[HostileOp], purge_interval: int) -> None:
    """``watched`` lies between the live entries and that plus ``purge_interval``."""
    live = sum(len(op.keys) for op in pending if not op.is_completed and is_pending(op))
    assert p.watched >= 0, f"watched went negative: {p.watched}"
    assert live <= p.watched <= live + purge_interval, (
        f"watched={p.watched} with {live} live entries (purge_interval={purge_interval})"
    )
    assert p.stats().watched == p.watched


def cancelling_key_on_complete(p: Purgatory, cancelled: list[list[object]]) -> HostileOp:
    """An operation whose on_complete calls ``p.cancel_for_key("k")`` and keeps the result."""
    return HostileOp(
        1.0, name="first", on_complete_hook=lambda op: cancelled.append(p.cancel_for_key("k"))
    )


def is_pending(op: HostileOp) -> bool:
    return not is_settled(op) and not op.is_completed


async def test_cancel_for_key_from_on_complete_during_check_and_complete_keeps_books(
    clock: ManualClock,
) -> None:
    async with asyncio.timeout(LIMIT), Purgatory("lc", clock=clock, purge_interval=2) as p:
        cancelled: list[list[object]] = []
        first = cancelling_key_on_complete(p, cancelled)
        others = [HostileOp(1.0, name=f"other{i}") for i in range(3)]
        for op in (first, *others):
            await p.try_complete_else_watch(op, ["k"])
        first.completable = True
        assert p.watched == 4
        assert p.check_and_complete("k") == 1
        assert p.watched >= 0, f"watched went negative ({p.watched}) after the walk"
        assert cancelled == [others], f"cancel_for_key from on_complete returned {cancelled}"
        assert all(is_settled(op) for op in others)
        check_books(p, [first, *others], purge_interval=2)
        assert (p.num_delayed, p.stats().cancelled, p.stats().completed) == (0, 3, 1)
        # the key works normally afterwards, and the count with it
        again = HostileOp(1.0, name="again")
        await p.try_complete_else_watch(again, ["k"])
        check_books(p, [again], purge_interval=2)
        assert p.cancel_for_key("k") == [again]
        assert p.watched >= 0


async def test_cancel_for_key_from_on_complete_during_advance_key_misses_nothing(
    clock: ManualClock,
) -> None:
    async with asyncio.timeout(LIMIT), Purgatory("lc", clock=clock, purge_interval=2) as p:
        cancelled: list[list[object]] = []
        first = cancelling_key_on_complete(p, cancelled)
        # Their thresholds are reached too, but their own condition does not hold yet.
        others = [HostileOp(1.0, name=f"other{i}") for i in range(3)]
        await p.watch_threshold(first, "k", 1)
        for i, op in enumerate(others):
            await p.watch_threshold(op, "k", 2 + i)
        first.completable = True
        assert p.advance_key("k", 10) == 1
        withdrawn = sorted(getattr(op, "name", "?") for op in cancelled[0]) if cancelled else None
        assert withdrawn == ["other0", "other1", "other2"], (
            f"cancel_for_key('k') from inside advance_key('k') withdrew {withdrawn}, "
            "not the three other operations still pending under 'k'"
        )
        assert all(is_settled(op) and op.completions == 0 for op in others), others
        assert p.num_delayed == 0, f"{p.num_delayed} operations left pending under 'k'"
        check_books(p, [first, *others], purge_interval=2)


@pytest.mark.parametrize("other_at", [0.0101, 0.0102], ids=["same-deadline", "same-bucket"])
async def test_timer_closed_from_its_own_callback_drops_the_rest_and_works_again(
    other_at: float, clock: ManualClock
) -> None:
    async with asyncio.timeout(LIMIT):
        timer = Timer(tick=0.001, clock=clock)
        fired: list[str] = []

        def close_it() -> None:
            fired.append("closer")
            timer.close()

        # 10.1 and 10.2 ticks: one bucket, fired in one batch
        timer.call_later(0.0101, close_it)
        same_bucket = timer.call_later(other_at, fired.append, "same-bucket")
        later = timer.call_later(0.5, fired.append, "later")
        await clock.advance(1.0)
        assert fired == ["closer"], f"callbacks close() dropped still ran: {fired}"
        assert len(timer) == 0, f"len(timer) is {len(timer)} after close() from a callback"
        for handle in (same_bucket, later):
            assert handle.cancelled() and not handle.pending(), (
                f"a handle close() dropped is neither run nor cancelled: {handle!r}"
            )
        # Closing does not end the timer (as outside a callback): it fires again.
        timer.call_later(0.01, fired.append, "reused")
        assert len(timer) == 1
        await clock.advance(0.02)
        assert fired == ["closer", "reused"], f"the timer never fired again: {fired}"
        assert len(timer) == 0
        timer.close()


async def test_timer_closed_outside_callbacks_works_again(clock: ManualClock) -> None:
    """The reference behaviour the previous test holds a callback's close() to."""
    timer = Timer(tick=0.001, clock=clock)
    fired: list[str] = []
    timer.call_later(0.01, fired.append, "dropped")
    timer.close()
    timer.call_later(0.01, fired.append, "reused")
    await clock.advance(0.02)
    assert (fired, len(timer)) == (["reused"], 0)
    timer.close()


ABANDONED = 2000


async def _abandon_awaits(awaitable_factory: object, n: int) -> None:
    """Start ``n`` tasks awaiting, let each block, then cancel them all (clients gone)."""
    tasks = [asyncio.ensure_future(awaitable_factory()) for _ in range(n)]  # type: ignore[operator]
    await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_cancelled_awaiters_release_their_futures_at_once(clock: ManualClock) -> None:
    async with asyncio.timeout(LIMIT), Purgatory("lc", clock=clock) as p:
        op = HostileOp(60.0)
        await p.try_complete_else_watch(op, ["k"])

        async def wait_op() -> object:
            return await op

        await _abandon_awaits(wait_op, ABANDONED)
        gc.collect()
        held = futures_held_by(op)
        assert held == 0, (
            f"after {ABANDONED} awaiting tasks were cancelled, the pending operation still "
            f"holds {held} of their futures (asyncio.Event.wait releases its own at once)"
        )
        # A fresh awaiter still gets the result.
        waiter = asyncio.ensure_future(outcome_of(op))
        await asyncio.sleep(0)
        op.completable = True
        p.check_and_complete("k")
        assert await waiter == ("result", "completed")


async def test_event_wait_releases_cancelled_awaiters_reference(clock: ManualClock) -> None:
    """The yardstick of the previous test, checked the same way."""
    event = asyncio.Event()
    await _abandon_awaits(event.wait, ABANDONED)
    gc.collect()
    assert futures_held_by(event) == 0


async def test_wait_for_timeouts_release_their_futures_at_once(clock: ManualClock) -> None:
    async with asyncio.timeout(LIMIT), Purgatory("lc", clock=clock) as p:
        op = HostileOp(60.0)
        await p.try_complete_else_watch(op, ["k"])
        for _ in range(20):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(op, 0.001)
        gc.collect()
        held = futures_held_by(op)
        assert held == 0, f"20 timed-out wait_for(op) left {held} futures held by the operation"
        assert not op.is_completed and p.num_delayed == 1


@pytest.mark.parametrize("settle_by", ["force_complete", "cancel", "expiry", "advance_key"])
@pytest.mark.parametrize("keys", [1, 7], ids=["one-key", "seven-keys"])
async def test_settled_threshold_watches_are_purged_within_purge_interval(
    settle_by: str, keys: int, clock: ManualClock
) -> None:
    purge_interval = 10
    async with (
        asyncio.timeout(LIMIT),
        Purgatory("lc", clock=clock, purge_interval=purge_interval) as p,
    ):
        # Many live watches share the keys of the settled ones: purging must not wait
        # for the settled ones to make up half of a key's index.
        kept = [HostileOp(60.0, name=f"kept{i}") for i in range(300)]
        for i, op in enumerate(kept):
            await p.watch_threshold(op, f"k{i % keys}", 10**6)
        ops = [HostileOp(1.0, name=str(i)) for i in range(100)]
        for i, op in enumerate(ops):
            await p.watch_threshold(op, f"k{i % keys}", i)
        for op in ops:
            op.completable = True
        if settle_by == "force_complete":
            for op in ops:
                op.force_complete()
        elif settle_by == "cancel":
            for op in ops:
                op.cancel()
        elif settle_by == "expiry":
            await clock.advance(2.0)
        else:
            for key in range(keys):
                p.advance_key(f"k{key}", 1000)
        await clock.advance(0)
        assert all(is_settled(op) for op in ops)
        assert p.num_delayed == len(kept)
        assert p.watched <= p.num_delayed + purge_interval, (
            f"watched={p.watched} after 100 threshold watches settled by {settle_by} "
            f"with {p.num_delayed} pending: more than purge_interval={purge_interval} "
            "stale entries linger"
        )
        assert p.watched >= len(kept)
