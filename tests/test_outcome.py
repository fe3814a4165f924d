"""``op.outcome``: how an operation settled, in the words of the event log and ``stats()``.

Each way an operation can settle, with ``outcome``, ``expired``, the event record and the
purgatory's counters checked to agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support import FailingOperation, MockOperation

from purgatory_aio import DelayedOperation, OperationEvent, Purgatory
from purgatory_aio.events import OUTCOMES
from purgatory_aio.testing import ManualClock


class Recorder:
    def __init__(self) -> None:
        self.events: list[OperationEvent] = []

    def emit(self, event: OperationEvent) -> None:
        self.events.append(event)


class RaisingTry(MockOperation):
    def try_complete(self) -> bool:
        raise ValueError("the condition cannot be checked")


class ThresholdOp(MockOperation):
    def try_complete(self) -> bool:
        return self.force_complete() if self.completable else False


#: What follows the admission of an operation: how it then settles.
Then = Callable[[Purgatory, ManualClock, MockOperation], Awaitable[None]]


async def admit(p: Purgatory, op: MockOperation) -> None:
    if isinstance(op, ThresholdOp):
        await p.watch_threshold(op, "k", 5)
    else:
        await p.try_complete_else_watch(op, ["k"])


async def nothing(p: Purgatory, clock: ManualClock, op: MockOperation) -> None:
    return None


async def satisfied_by_key(p: Purgatory, clock: ManualClock, op: MockOperation) -> None:
    op.completable = True
    p.check_and_complete("k")


async def satisfied_by_threshold(p: Purgatory, clock: ManualClock, op: MockOperation) -> None:
    op.completable = True
    p.advance_key("k", 5)


async def forced(p: Purgatory, clock: ManualClock, op: MockOperation) -> None:
    op.force_complete()


async def deadline(p: Purgatory, clock: ManualClock, op: MockOperation) -> None:
    await clock.advance(1.0)


async def cancelled(p: Purgatory, clock: ManualClock, op: MockOperation) -> None:
    op.cancel()


async def cancelled_by_key(p: Purgatory, clock: ManualClock, op: MockOperation) -> None:
    p.cancel_for_key("k")


async def shut_down(p: Purgatory, clock: ManualClock, op: MockOperation) -> None:
    await p.shutdown()


async def shut_down_cancelling(p: Purgatory, clock: ManualClock, op: MockOperation) -> None:
    await p.shutdown(expire_pending=False)


#: way of settling -> (the operation, what follows its admission, its outcome, expired,
#: failed, the stats() counter it adds to)
WAYS: dict[str, tuple[type[MockOperation], bool, Then, str, bool, bool, str]] = {
    "satisfied by check_and_complete": (
        MockOperation,
        False,
        satisfied_by_key,
        "completed",
        False,
        False,
        "completed",
    ),
    "satisfied at its first try": (
        MockOperation,
        True,
        nothing,
        "completed",
        False,
        False,
        "completed",
    ),
    "satisfied by advance_key": (
        ThresholdOp,
        False,
        satisfied_by_threshold,
        "completed",
        False,
        False,
        "completed",
    ),
    "force_complete": (MockOperation, False, forced, "completed", False, False, "completed"),
    "try_complete raised": (RaisingTry, False, nothing, "completed", False, True, "completed"),
    "on_complete raised": (FailingOperation, False, forced, "completed", False, True, "completed"),
    "deadline": (MockOperation, False, deadline, "expired", True, False, "expired"),
    "deadline, on_complete raised": (
        FailingOperation,
        False,
        deadline,
        "expired",
        True,
        True,
        "expired",
    ),
    "cancel": (MockOperation, False, cancelled, "cancelled", False, False, "cancelled"),
    "cancel_for_key": (
        MockOperation,
        False,
        cancelled_by_key,
        "cancelled",
        False,
        False,
        "cancelled",
    ),
    "shutdown": (MockOperation, False, shut_down, "shutdown", True, False, "shutdown"),
    "shutdown(expire_pending=False)": (
        MockOperation,
        False,
        shut_down_cancelling,
        "cancelled",
        False,
        False,
        "cancelled",
    ),
}


@pytest.mark.parametrize(
    ("kind", "completable", "then", "outcome", "expired", "failed", "counter"),
    WAYS.values(),
    ids=WAYS.keys(),
)
async def test_each_way_of_settling_has_its_outcome(
    clock: ManualClock,
    kind: type[MockOperation],
    completable: bool,
    then: Then,
    outcome: str,
    expired: bool,
    failed: bool,
    counter: str,
) -> None:
    sink = Recorder()
    p = Purgatory("p", clock=clock, event_sink=sink)
    async with p:
        op = kind(1.0, completable=completable)
        await admit(p, op)
        await then(p, clock, op)
        await clock.advance(0)
        assert op.done()
        stats = p.stats()
    assert op.outcome == outcome
    assert outcome in OUTCOMES
    assert op.expired is expired  # its documented meaning: the deadline, or shutdown
    assert op.cancelled is (outcome == "cancelled")
    assert op.is_completed is (outcome != "cancelled")
    if not op.cancelled:
        assert (op.exception() is not None) is failed
    (event,) = sink.events
    assert event.outcome == op.outcome
    assert (event.error is not None) is failed
    assert {name: stats[name] for name in OUTCOMES} == {
        name: int(name == counter) for name in OUTCOMES
    }


async def test_a_pending_operation_has_no_outcome_yet(clock: ManualClock) -> None:
    op = MockOperation(1.0)
    assert op.outcome is None
    async with Purgatory("p", clock=clock) as p:
        await p.try_complete_else_watch(op, ["k"])
        assert op.outcome is None
        await clock.advance(0.5)
        assert op.outcome is None
    assert op.outcome == "shutdown"


def test_operations_no_purgatory_holds_settle_with_an_outcome_too() -> None:
    completed = MockOperation(1.0)
    completed.force_complete()
    cancelled = MockOperation(1.0)
    cancelled.cancel()
    assert (completed.outcome, cancelled.outcome) == ("completed", "cancelled")


async def test_a_handler_tells_a_timeout_from_a_server_going_away(clock: ManualClock) -> None:
    answers: list[str] = []

    async def handler(p: Purgatory) -> None:
        op = MockOperation(1.0)
        await p.watch_and_wait(op, ["k"])
        answers.append({"expired": "timed out", "shutdown": "server going away"}[op.outcome or ""])

    async with Purgatory("p", clock=clock) as p:
        timing_out = asyncio.ensure_future(handler(p))
        await asyncio.sleep(0)
        await clock.advance(1.0)
        await timing_out
        going_away = asyncio.ensure_future(handler(p))
        await asyncio.sleep(0)
    await going_away
    assert answers == ["timed out", "server going away"]


def test_the_outcome_of_an_uninitialised_operation_names_the_mistake() -> None:
    class Forgot(DelayedOperation[Any]):
        def __init__(self) -> None:
            pass

        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> None:
            return None

    with pytest.raises(TypeError, match=r"must call super\(\)\.__init__\(timeout\)"):
        _ = Forgot().outcome


async def test_a_cancelled_watch_and_wait_cancels_its_operation(clock: ManualClock) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = MockOperation(1.0)
        task = asyncio.ensure_future(p.watch_and_wait(op, ["k"]))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert op.outcome == "cancelled" and not op.expired
        assert p.stats().cancelled == 1
