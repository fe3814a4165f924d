"""Admission happens at the call: a forgotten ``await`` loses the answer, never the operation;
awaiting a pending operation that no purgatory holds is refused rather than waiting for ever."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from support import AsyncOperation, MockOperation, awaiting

from purgatory_aio import Purgatory, PurgatoryClosed
from purgatory_aio.testing import ManualClock

#: Upper bound on a wait that only a bug makes long: a hang guard, never a timing claim.
HANG_GUARD = 10.0

NEVER_HANDED = r"was never handed to a purgatory, so nothing would ever complete or expire it"

Admit = Callable[[Purgatory, MockOperation], Awaitable[Any]]

ADMISSIONS: dict[str, Admit] = {
    "try_complete_else_watch": lambda p, op: p.try_complete_else_watch(op, ["k"]),
    "watch_threshold": lambda p, op: p.watch_threshold(op, "k", 5),
    "watch_and_wait": lambda p, op: p.watch_and_wait(op, ["k"]),
}


@pytest.mark.parametrize("admit", ADMISSIONS.values(), ids=ADMISSIONS.keys())
async def test_a_forgotten_await_still_admits_the_operation_which_then_expires(
    clock: ManualClock, admit: Admit
) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = MockOperation(1.0)
        answer = admit(p, op)  # no await
        assert p.num_delayed == 1 and op.keys == ("k",) and op.deadline == 1.0
        # Whoever waits for the operation gets its answer at the deadline, not never.
        waiter = asyncio.ensure_future(awaiting(op))
        await clock.advance(1.0)
        assert await asyncio.wait_for(waiter, HANG_GUARD) == "expired"
        assert op.outcome == "expired" and p.stats().expired == 1
        if asyncio.iscoroutine(answer):
            answer.close()  # watch_and_wait's wait, which nobody awaited


@pytest.mark.parametrize("admit", ADMISSIONS.values(), ids=ADMISSIONS.keys())
async def test_a_forgotten_await_completes_as_any_other(clock: ManualClock, admit: Admit) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = MockOperation(1.0)
        answer = admit(p, op)
        assert op.force_complete()
        await clock.advance(0)
        assert op.result() == "completed" and p.num_delayed == 0
        if asyncio.iscoroutine(answer):
            answer.close()


@pytest.mark.parametrize("name", ["try_complete_else_watch", "watch_threshold"])
async def test_the_answer_is_no_coroutine_so_nothing_warns_or_is_lost(
    clock: ManualClock, name: str
) -> None:
    async with Purgatory("p", clock=clock) as p:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ADMISSIONS[name](p, MockOperation(1.0))
            gc.collect()
        assert [str(w.message) for w in caught] == []
        assert p.num_delayed == 1


async def test_the_answer_reports_the_admission_and_may_be_awaited_again(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        waiting = p.try_complete_else_watch(MockOperation(1.0), ["k"])
        done = p.try_complete_else_watch(MockOperation(1.0, completable=True), ["k"])
        assert (await waiting, await waiting) == (False, False)
        assert (await done, await done) == (True, True)
        assert await asyncio.ensure_future(p.watch_threshold(MockOperation(1.0), "t", 1)) is False
        assert await asyncio.gather(waiting, done) == [False, True]
        assert "watched" in repr(waiting) and "completed at once" in repr(done)


async def test_the_answer_is_taken_wherever_a_coroutine_is(clock: ManualClock) -> None:
    # Servers start admissions as tasks: asyncio.create_task and anyio's task groups
    # take only coroutines, so the answer must pass their checks and report through them.
    async with Purgatory("p", clock=clock) as p:
        waiting = asyncio.create_task(p.try_complete_else_watch(MockOperation(1.0), ["k"]))
        done = asyncio.create_task(
            p.try_complete_else_watch(MockOperation(1.0, completable=True), ["k"])
        )
        threshold = asyncio.create_task(p.watch_threshold(MockOperation(1.0), "t", 1))
        assert await asyncio.gather(waiting, done, threshold) == [False, True, False]
        assert p.num_delayed == 2
        async with anyio.create_task_group() as tg:
            tg.start_soon(p.try_complete_else_watch, MockOperation(1.0), ["k"])
        assert p.num_delayed == 3
        answer = p.try_complete_else_watch(MockOperation(1.0, completable=True), ["k"])
        with pytest.raises(StopIteration) as stop:
            answer.send(None)  # type: ignore[attr-defined]
        assert stop.value.value is True
        with pytest.raises(KeyError):
            answer.throw(KeyError("thrown in"))  # type: ignore[attr-defined]


async def test_refusals_are_raised_by_the_call_itself(clock: ManualClock) -> None:
    p = Purgatory("p", clock=clock)
    async with p:
        op = MockOperation(1.0)
        with pytest.raises(TypeError, match="not the single key"):
            p.try_complete_else_watch(op, "k")  # not awaited: raised all the same
        with pytest.raises(ValueError, match="threshold"):
            p.watch_threshold(op, "k", float("nan"))
        assert p.num_delayed == 0 and op.outcome is None
        p.try_complete_else_watch(op, ["k"])
        with pytest.raises(ValueError, match="already handed to purgatory 'p'"):
            p.watch_and_wait(op, ["k"])
    with pytest.raises(PurgatoryClosed):
        p.try_complete_else_watch(MockOperation(1.0), ["k"])
    assert op.outcome == "shutdown"


async def test_awaiting_an_operation_never_handed_over_is_an_error_not_a_hang(
    clock: ManualClock,
) -> None:
    op = MockOperation(1.0)
    with pytest.raises(RuntimeError, match=NEVER_HANDED):
        await asyncio.wait_for(awaiting(op), HANG_GUARD)
    # The refusal changed nothing: the operation can still be handed over and awaited.
    assert op.outcome is None and not op.done()
    async with Purgatory("p", clock=clock) as p:
        watching = asyncio.ensure_future(p.watch_and_wait(op, ["k"]))
        await clock.advance(1.0)
        assert await asyncio.wait_for(watching, HANG_GUARD) == "expired"


async def test_awaiting_before_admission_fails_at_once_even_if_admitted_later(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = MockOperation(1.0)
        early = asyncio.ensure_future(awaiting(op))
        await asyncio.sleep(0)  # it awaits now, while no purgatory holds op
        with pytest.raises(RuntimeError, match=NEVER_HANDED):
            await asyncio.wait_for(early, HANG_GUARD)
        await p.try_complete_else_watch(op, ["k"])
        op.completable = True
        p.check_and_complete("k")
        assert await asyncio.wait_for(awaiting(op), HANG_GUARD) == "completed"


async def test_an_operation_refused_at_admission_cannot_be_awaited_either() -> None:
    async with Purgatory("p") as p:
        op = MockOperation(1.0)
        with pytest.raises(TypeError):
            p.try_complete_else_watch(op, [["unhashable"]])
        with pytest.raises(RuntimeError, match=NEVER_HANDED):
            await op


async def test_an_operation_settled_without_a_purgatory_can_be_awaited() -> None:
    # Completed or cancelled, it has its answer (or is getting it): no error.
    completed = AsyncOperation(1.0)
    completed.force_complete()  # its async on_complete runs as a task
    assert await asyncio.wait_for(awaiting(completed), HANG_GUARD) == "completed"
    cancelled = MockOperation(1.0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled


class _OwnIsRunning(asyncio.SelectorEventLoop):
    """A loop whose class answers is_running itself (the admission must ask it)."""

    def is_running(self) -> bool:
        return super().is_running()


def _uvloop() -> asyncio.AbstractEventLoop:
    uvloop = pytest.importorskip("uvloop")
    return uvloop.new_event_loop()  # type: ignore[no-any-return]


#: Loops whose running the admission tells apart differently on Python 3.11: asyncio's
#: own (an attribute read), one overriding is_running (asked), uvloop's (asked, in C).
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "own-is-running": _OwnIsRunning,
    "uvloop": _uvloop,
}


@pytest.mark.parametrize("new_loop", LOOPS.values(), ids=LOOPS.keys())
def test_called_with_no_loop_running_it_admits_once_run_in_the_loop(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    # As asyncio.run(...) and loop.run_until_complete(...) use it: the call returns a
    # coroutine, and the operation is admitted (or refused) when that runs in the loop.
    clock = ManualClock()
    p = Purgatory("p", clock=clock)
    op, at_once, waited = MockOperation(1.0), MockOperation(1.0, completable=True), MockOperation(1)
    loop = new_loop()
    try:
        assert loop.run_until_complete(p.try_complete_else_watch(op, ["k"])) is False
        assert loop.run_until_complete(p.watch_threshold(at_once, "t", 1)) is True
        assert p.num_delayed == 1 and op.deadline == 1.0
        waited.completable = True
        assert loop.run_until_complete(p.watch_and_wait(waited, ["k"])) == "completed"
        unrun = p.try_complete_else_watch(MockOperation(1.0), ["k"])
        assert asyncio.iscoroutine(unrun)
        unrun.close()  # never run: nothing was admitted
        assert p.num_delayed == 1
        loop.run_until_complete(p.shutdown())
    finally:
        loop.close()
    assert op.outcome == "shutdown" and at_once.outcome == waited.outcome == "completed"
