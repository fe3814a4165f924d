"""Timer batches, event loops and shutdown from odd places: what each must still guarantee.

Each test names one guarantee, checked through the public API (docs/contract.md): a purgatory's
``num_delayed``, a timer's ``len()``, an operation's state and ``await``, a
ManualClock's ``time()`` and ``next_due()``. Every wait is bounded, and nothing sleeps
in real time beyond a few loop passes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

import pytest
from lc_support import (
    LOOP_FACTORIES,
    AsyncHostileOp,
    HostileOp,
    is_settled,
    outcome_of,
    run_on,
)
from support import MockOperation, settled_once

from purgatory_aio import Purgatory, PurgatoryClosed, Timer
from purgatory_aio.testing import ManualClock

#: Real seconds any one step is given before the test fails instead of hanging.
LIMIT = 2.0

loops = pytest.mark.parametrize("loop_name", list(LOOP_FACTORIES))


def run_on_bounded(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any]) -> Any:
    """``run_on`` with this file's bound."""
    return run_on(loop, coro, LIMIT)


def cancel_current_task(op: object) -> None:
    """What a careless synchronous callback does: cancel the task it happens to run in."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()


# -- a timer batch: entries taken out by an earlier callback of the same bucket --------------
# With tick=1.0, deadlines 0.2 and 0.7 share a bucket: the reaper wakes at 0.2 and
# visits the whole bucket, firing what is due and putting back what is not.


async def test_an_operation_cancelled_by_an_earlier_callback_of_its_bucket_is_gone(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock, tick=1.0) as p:
        second = HostileOp(0.7, name="second")
        first = HostileOp(0.2, name="first", on_complete_hook=lambda op: second.cancel())
        await p.try_complete_else_watch(first, ["a"])
        await p.try_complete_else_watch(second, ["b"])
        await clock.advance(0.3)
        assert first.expired and second.cancelled
        assert settled_once(first) and settled_once(second)
        assert p.num_delayed == 0
        assert clock.next_due() is None  # no wake-up left for the withdrawn deadline


async def test_an_operation_force_completed_by_an_earlier_callback_of_its_bucket_is_gone(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock, tick=1.0) as p:
        second = HostileOp(0.7, name="second")
        first = HostileOp(0.2, name="first", on_complete_hook=lambda op: second.force_complete())
        await p.try_complete_else_watch(first, ["a"])
        await p.try_complete_else_watch(second, ["b"])
        await clock.advance(0.3)
        assert first.expired and second.is_completed and not second.expired
        assert settled_once(first) and settled_once(second)
        assert p.num_delayed == 0
        assert clock.next_due() is None


async def test_a_timer_handle_cancelled_by_an_earlier_callback_of_its_bucket_is_not_counted(
    clock: ManualClock,
) -> None:
    timer = Timer(tick=1.0, clock=clock)
    ran: list[str] = []
    later = timer.call_at(0.7, ran.append, "later")
    timer.call_at(0.2, later.cancel)
    await clock.advance(0.3)
    assert later.cancelled() and ran == []
    assert len(timer) == 0
    assert clock.next_due() is None
    timer.close()


async def test_the_count_drops_as_soon_as_a_callback_cancels_a_later_entry_of_its_bucket(
    clock: ManualClock,
) -> None:
    timer = Timer(tick=1.0, clock=clock)
    seen: list[int] = []

    def cancel_the_later_one() -> None:
        seen.append(len(timer))  # this one has left the timer to run
        later.cancel()
        seen.append(len(timer))

    timer.call_at(0.2, cancel_the_later_one)
    later = timer.call_at(0.7, print)
    timer.call_at(0.8, print)
    await clock.advance(0.3)
    assert seen == [2, 1]
    assert len(timer) == 1
    timer.close()


async def test_a_handle_rescheduled_by_an_earlier_callback_of_its_bucket_runs_once_at_its_new_time(
    clock: ManualClock,
) -> None:
    timer = Timer(tick=1.0, clock=clock)
    ran: list[float] = []
    later = timer.call_at(0.7, lambda: ran.append(clock.time()))
    timer.call_at(0.2, later.reschedule, 2.0)  # from 0.2: due at 2.2
    await clock.advance(0.3)
    assert len(timer) == 1 and ran == []
    await clock.advance(2.0)
    assert ran == [2.2] and len(timer) == 0
    timer.close()


async def test_close_from_a_callback_drops_the_rest_of_its_bucket_and_counts_nothing(
    clock: ManualClock,
) -> None:
    timer = Timer(tick=1.0, clock=clock)
    ran: list[str] = []
    timer.call_at(0.2, timer.close)
    dropped = timer.call_at(0.2, ran.append, "dropped")
    await clock.advance(0.3)
    assert ran == [] and dropped.cancelled() and len(timer) == 0
    assert dropped.cancel() is False  # already out: it cannot be taken out twice
    assert len(timer) == 0
    timer.call_later(1.0, ran.append, "after")  # the timer is usable again
    assert len(timer) == 1
    await clock.advance(1.0)
    assert ran == ["after"] and len(timer) == 0
    timer.close()


async def test_a_close_from_a_callback_withdraws_the_rest_of_its_bucket_at_once(
    clock: ManualClock,
) -> None:
    timer = Timer(tick=1.0, clock=clock)
    seen: list[object] = []

    def close_then_cancel() -> None:
        timer.close()
        seen.extend([later.cancelled(), later.cancel(), len(timer)])

    timer.call_at(0.2, close_then_cancel)
    later = timer.call_at(0.7, print)
    await clock.advance(0.3)
    assert seen == [True, False, 0]  # withdrawn by the close, and counted out once
    timer.call_later(1.0, print)
    assert len(timer) == 1
    timer.close()


@loops
def test_an_interrupt_mid_bucket_puts_back_only_the_entries_still_pending(loop_name: str) -> None:
    loop = LOOP_FACTORIES[loop_name]()
    try:
        clock = ManualClock()
        timer = Timer(tick=1.0, clock=clock)
        ran: list[str] = []

        def interrupt() -> None:
            raise KeyboardInterrupt

        async def schedule() -> None:
            timer.call_at(0.2, lambda: cancelled.cancel())
            timer.call_at(0.25, interrupt)
            cancelled = timer.call_at(0.7, ran.append, "cancelled")
            timer.call_at(0.8, ran.append, "pending")

        assert run_on_bounded(loop, schedule()) == (None, None)
        _, exc = run_on_bounded(loop, clock.advance(0.3))
        assert isinstance(exc, KeyboardInterrupt)
        assert len(timer) == 1  # the cancelled one is neither put back nor counted
        _, exc = run_on_bounded(loop, clock.advance(1.0))
        assert exc is None
        assert ran == ["pending"] and len(timer) == 0
        timer.close()
    finally:
        loop.close()


# -- a callback that cancels the task it runs in: the reaper's ------------------------------


async def test_a_callback_cancelling_its_task_does_not_stop_later_expirations(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        rogue = HostileOp(1, name="rogue", on_complete_hook=cancel_current_task)
        await p.try_complete_else_watch(rogue, ["k"])
        await clock.advance(2)
        assert rogue.expired and settled_once(rogue)
        later = HostileOp(1, name="later")
        await p.try_complete_else_watch(later, ["k"])
        await clock.advance(2)
        assert later.expired, later


async def test_a_callback_cancelling_its_task_does_not_stop_the_rest_of_its_bucket(
    clock: ManualClock,
) -> None:
    timer = Timer(tick=1.0, clock=clock)
    ran: list[str] = []
    timer.call_at(0.2, cancel_current_task, None)
    timer.call_at(0.25, ran.append, "same pass")
    timer.call_at(0.7, ran.append, "next pass")
    await clock.advance(1.0)
    assert ran == ["same pass", "next pass"] and len(timer) == 0
    timer.close()


async def test_a_callback_that_cancels_its_task_and_takes_it_back_does_not_stop_the_reaper(
    clock: ManualClock,
) -> None:
    def cancel_and_uncancel() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        task.uncancel()  # Python 3.11 still delivers the cancellation at the next await

    timer = Timer(clock=clock)
    ran: list[str] = []
    timer.call_later(1.0, cancel_and_uncancel)
    await clock.advance(1.0)
    timer.call_later(1.0, ran.append, "later")
    await clock.advance(1.0)
    assert ran == ["later"]
    timer.close()


@loops
def test_the_loop_teardown_still_stops_a_reaper_a_callback_once_cancelled(loop_name: str) -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)

    async def main() -> None:
        timer.call_later(1.0, cancel_current_task, None)
        await clock.advance(1.0)
        timer.call_later(5.0, print)  # pending: the reaper waits when the loop ends

    # asyncio.Runner cancels every task left and waits for them: a reaper that ignored
    # that cancellation would hang it, so it runs in a thread the test can give up on.
    finished = threading.Event()

    def run() -> None:
        with asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner:
            runner.run(main())
        finished.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(LIMIT)
    assert finished.is_set(), "the loop's teardown hung on the reaper"


# -- a timer or purgatory with pending entries, used from a second loop -----------------------


def schedule_on(loop_name: str, timer: Timer, delay: float, ran: list[float]) -> None:
    async def schedule() -> None:
        timer.call_later(delay, ran.append, delay)

    with asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner:
        runner.run(schedule())


@loops
@pytest.mark.parametrize("second_delay", [5.0, 0.5])  # later / sooner than the pending one
def test_a_timer_with_pending_entries_refuses_a_second_loop_unchanged(
    loop_name: str, second_delay: float
) -> None:
    timer = Timer(clock=ManualClock())
    ran: list[float] = []
    schedule_on(loop_name, timer, 5.0, ran)  # stays pending when this loop ends
    assert len(timer) == 1
    with pytest.raises(RuntimeError, match="another event loop"):
        schedule_on(loop_name, timer, second_delay, ran)
    assert len(timer) == 1


@loops
def test_a_timer_refuses_a_reschedule_from_a_second_loop_unchanged(loop_name: str) -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    handles = []

    async def schedule() -> None:
        handles.append(timer.call_later(5.0, print))

    async def reschedule() -> None:
        handles[0].reschedule(1.0)

    with asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner:
        runner.run(schedule())
    with (
        pytest.raises(RuntimeError, match="another event loop"),
        asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner,
    ):
        runner.run(reschedule())
    assert len(timer) == 1 and handles[0].pending() and handles[0].when() == 5.0


def test_a_timer_with_pending_entries_refuses_a_caller_outside_its_loop() -> None:
    timer = Timer(clock=ManualClock())
    schedule_on("asyncio", timer, 5.0, [])
    with pytest.raises(RuntimeError, match="another event loop"):
        timer.call_later(1.0, print)  # no loop running at all
    assert len(timer) == 1


@loops
def test_a_purgatory_with_pending_operations_refuses_a_second_loop_unchanged(
    loop_name: str,
) -> None:
    p = Purgatory("p", clock=ManualClock())
    first, second = HostileOp(5.0, name="first"), HostileOp(0.5, name="second")

    async def watch(op: HostileOp) -> None:
        await p.try_complete_else_watch(op, ["k"])

    with asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner:
        runner.run(watch(first))
    with (
        pytest.raises(RuntimeError, match="another event loop"),
        asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner,
    ):
        runner.run(watch(second))
    assert (p.num_delayed, p.watched) == (1, 1)
    assert second.keys == () and not second.is_completed  # usable elsewhere


# -- the purgatory's loop has ended ------------------------------------------------------------


def started_and_left(loop_name: str, p: Purgatory, *ops: HostileOp) -> None:
    """Watch ``ops`` on a loop that then closes, without shutting ``p`` down."""

    async def watch() -> None:
        for op in ops:
            await p.try_complete_else_watch(op, ["k"])

    with asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner:
        runner.run(watch())


@loops
def test_force_complete_after_the_loop_closed_settles_an_async_operation_with_purgatory_closed(
    loop_name: str,
) -> None:
    p = Purgatory("p", clock=ManualClock())
    op = AsyncHostileOp(10, name="async")
    started_and_left(loop_name, p, op)
    assert op.force_complete() is True
    assert op.done() and isinstance(op.exception(), PurgatoryClosed)
    assert op.completions == 0  # its on_complete had no loop to run on
    assert p.num_delayed == 0


@loops
def test_shutdown_after_the_loop_closed_settles_every_operation_from_the_new_loop(
    loop_name: str,
) -> None:
    p = Purgatory("p", clock=ManualClock())
    sync_op, async_op = HostileOp(10, name="sync"), AsyncHostileOp(10, name="async")
    started_and_left(loop_name, p, sync_op, async_op)

    async def shut_down() -> None:
        async with asyncio.timeout(LIMIT):
            await p.shutdown()

    with asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner:
        runner.run(shut_down())
    assert p.closed and p.num_delayed == 0
    assert sync_op.expired and sync_op.result() == "expired" and settled_once(sync_op)
    assert async_op.expired and isinstance(async_op.exception(), PurgatoryClosed)


@loops
def test_shutdown_from_a_second_loop_while_the_first_lives_is_refused_unchanged(
    loop_name: str,
) -> None:
    p = Purgatory("p", clock=ManualClock())
    ops = [HostileOp(10, name="sync"), AsyncHostileOp(10, name="async")]
    first = LOOP_FACTORIES[loop_name]()
    try:
        assert run_on_bounded(first, _watch_all(p, ops)) == (None, None)
        with (
            pytest.raises(RuntimeError, match="another event loop"),
            asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner,
        ):
            runner.run(p.shutdown())
        assert not p.closed and p.num_delayed == 2
        assert not any(op.is_completed for op in ops)
        # Its own loop still shuts it down, and settles everything.
        assert run_on_bounded(first, p.shutdown()) == (None, None)
        assert all(op.expired and is_settled(op) and op.completions == 1 for op in ops)
    finally:
        first.close()


async def _watch_all(p: Purgatory, ops: list[HostileOp]) -> None:
    for op in ops:
        await p.try_complete_else_watch(op, ["k"])


# -- shutdown awaited by an async callback of the purgatory's own operations ------------------


class ShutsDown(MockOperation):
    """Its async on_complete shuts its purgatory down (once ``gate`` opens, if given)."""

    def __init__(
        self, timeout: float, purgatory: Purgatory, gate: asyncio.Event | None = None
    ) -> None:
        super().__init__(timeout)
        self.purgatory = purgatory
        self.gate = gate
        self.seen_after_shutdown: list[tuple[bool, int]] = []

    async def on_complete(self) -> str:  # type: ignore[override]
        if self.gate is not None:
            await self.gate.wait()
        await self.purgatory.shutdown()
        self.seen_after_shutdown.append((self.purgatory.closed, self.purgatory.num_delayed))
        return MockOperation.on_complete(self)


async def test_shutdown_awaited_in_an_async_on_complete_returns_once_the_rest_settled() -> None:
    clock = ManualClock(stall_timeout=0.05)
    p = Purgatory("p", clock=clock)
    closer, other = ShutsDown(1, p), MockOperation(5)
    await p.try_complete_else_watch(closer, ["k"])
    await p.try_complete_else_watch(other, ["k"])
    async with asyncio.timeout(LIMIT):
        await clock.advance(2)  # closer expires; its on_complete shuts the purgatory down
    assert closer.seen_after_shutdown == [(True, 0)]
    assert other.expired and settled_once(other)
    assert await outcome_of(closer) == ("result", "expired")
    assert settled_once(closer)


async def test_a_callback_awaiting_a_shutdown_already_in_progress_does_not_deadlock_it() -> None:
    clock = ManualClock(stall_timeout=0.05)
    p = Purgatory("p", clock=clock)
    gate = asyncio.Event()
    closer = ShutsDown(1, p, gate)
    await p.try_complete_else_watch(closer, ["k"])
    await clock.advance(2)  # closer's on_complete now waits for the gate
    shutting = asyncio.create_task(p.shutdown())  # waits for that callback
    for _ in range(5):
        await asyncio.sleep(0)
    assert not shutting.done()
    gate.set()  # the callback now awaits the shutdown that waits for it
    async with asyncio.timeout(LIMIT):
        await shutting
    assert closer.seen_after_shutdown == [(True, 0)]


async def test_shutdown_from_outside_returns_only_once_a_callback_awaiting_it_settled() -> None:
    clock = ManualClock(stall_timeout=0.05)
    p = Purgatory("p", clock=clock)
    gate = asyncio.Event()
    closer = ShutsDown(1, p, gate)
    await p.try_complete_else_watch(closer, ["k"])
    await clock.advance(2)
    shutting = asyncio.create_task(p.shutdown())
    await asyncio.sleep(0)
    gate.set()
    async with asyncio.timeout(LIMIT):
        await shutting
    assert closer.done() and closer.result() == "expired" and settled_once(closer)


# -- ManualClock: advances from several tasks at once ------------------------------------------


async def test_concurrent_advances_never_move_the_clock_back(clock: ManualClock) -> None:
    long = asyncio.create_task(clock.advance(10))
    await asyncio.sleep(0)
    short = asyncio.create_task(clock.advance(1))
    async with asyncio.timeout(LIMIT):
        await asyncio.gather(long, short)
    assert clock.time() == 11.0  # they take turns, and add up


async def test_concurrent_advances_fire_each_deadline_at_its_own_instant(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        ops = [MockOperation(t) for t in (0.5, 5.0, 10.5)]
        for op in ops:
            op.clock = clock
            await p.try_complete_else_watch(op, ["k"])
        long = asyncio.create_task(clock.advance(10))
        await asyncio.sleep(0)
        short = asyncio.create_task(clock.advance(1))
        async with asyncio.timeout(LIMIT):
            await asyncio.gather(long, short)
        assert [op.completed_at for op in ops] == [0.5, 5.0, 10.5]


async def test_an_advance_to_an_instant_another_advance_passed_leaves_the_clock_alone(
    clock: ManualClock,
) -> None:
    long = asyncio.create_task(clock.advance_to(10))
    await asyncio.sleep(0)
    passed = asyncio.create_task(clock.advance_to(4))
    async with asyncio.timeout(LIMIT):
        await asyncio.gather(long, passed)
    assert clock.time() == 10.0
