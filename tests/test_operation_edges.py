"""DelayedOperation at its edges: a subclass that skipped super().__init__, and the event
record of an operation completed before it was ever watched."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from support import MockOperation

from purgatory_aio import DelayedOperation, Purgatory
from purgatory_aio.events import OperationEvent
from purgatory_aio.testing import ManualClock

#: Upper bound on a wait that only a bug makes long: a hang guard, never a timing claim.
HANG_GUARD = 10.0

NAMES_THE_MISTAKE = r"ForgotSuperInit\.__init__ must call super\(\)\.__init__\(timeout\)"

# -- an operation whose __init__ forgot super().__init__ ----------------------------------------


class ForgotSuperInit(DelayedOperation[int]):
    def __init__(self, timeout: float) -> None:  # never calls super().__init__(timeout)
        self.wanted = timeout

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> int:
        return 1


def test_repr_of_an_operation_whose_init_forgot_super_init_says_so() -> None:
    # repr is what logs and error messages are built with: it never raises.
    text = repr(ForgotSuperInit(1.0))
    assert "ForgotSuperInit" in text and "super().__init__(timeout)" in text


@pytest.mark.parametrize("method", ["force_complete", "cancel"])
def test_completing_or_cancelling_an_operation_whose_init_forgot_super_names_the_problem(
    method: str,
) -> None:
    op = ForgotSuperInit(1.0)
    with pytest.raises(TypeError, match=NAMES_THE_MISTAKE):
        getattr(op, method)()


@pytest.mark.parametrize("method", ["force_complete", "cancel"])
def test_a_refused_operation_leaves_every_other_operation_usable(method: str) -> None:
    # The interpreted build takes a lock around each transition: a refusal must not
    # leave it held (every later transition, in any thread, would block for good).
    with pytest.raises(TypeError):
        getattr(ForgotSuperInit(1.0), method)()
    ops = [MockOperation(1.0), MockOperation(1.0)]
    finished = threading.Event()

    def transitions() -> None:
        ops[0].force_complete()
        ops[1].cancel()
        finished.set()

    threading.Thread(target=transitions, daemon=True).start()
    assert finished.wait(HANG_GUARD), "a transition blocked after the refused one"
    assert ops[0].is_completed and ops[1].cancelled


READERS: dict[str, Callable[[DelayedOperation[Any]], object]] = {
    "done()": lambda op: op.done(),
    "result()": lambda op: op.result(),
    "exception()": lambda op: op.exception(),
    "is_completed": lambda op: op.is_completed,
    "expired": lambda op: op.expired,
    "cancelled": lambda op: op.cancelled,
    "timeout": lambda op: op.timeout,
    "deadline": lambda op: op.deadline,
    "keys": lambda op: op.keys,
}


@pytest.mark.parametrize("read", READERS.values(), ids=READERS.keys())
def test_reading_an_operation_whose_init_forgot_super_names_the_problem(
    read: Callable[[DelayedOperation[Any]], object],
) -> None:
    with pytest.raises(TypeError, match=NAMES_THE_MISTAKE):
        read(ForgotSuperInit(1.0))


async def test_awaiting_an_operation_whose_init_forgot_super_names_the_problem() -> None:
    with pytest.raises(TypeError, match=NAMES_THE_MISTAKE):
        await ForgotSuperInit(1.0)


# -- the event record: the keys an operation was watched under ----------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[OperationEvent] = []

    def emit(self, event: OperationEvent) -> None:
        self.events.append(event)


class CompletesAtSecondTry(MockOperation):
    """Pending at the first try, satisfied at the second (made once it is watched)."""

    def try_complete(self) -> bool:
        self.tries += 1
        return self.tries >= 2 and self.force_complete()


async def test_an_operation_completed_at_its_first_try_has_the_keys_it_was_asked_for_under(
    clock: ManualClock,
) -> None:
    # OperationEvent: keys are those the operation was handed to the purgatory with,
    # watched or not (the report's hot keys count such operations under them).
    sink = Recorder()
    async with Purgatory("p", clock=clock, event_sink=sink) as p:
        op = MockOperation(1.0, completable=True)
        assert await p.try_complete_else_watch(op, ["a", ("b", 1), "a"]) is True
        assert (p.num_delayed, p.watched) == (0, 0)
    (event,) = sink.events
    assert (event.outcome, event.keys) == ("completed", ["a", str(("b", 1))])
    assert op.keys == ("a", ("b", 1))


async def test_an_operation_completed_at_its_second_try_has_the_keys_it_was_watched_under(
    clock: ManualClock,
) -> None:
    sink = Recorder()
    async with Purgatory("p", clock=clock, event_sink=sink) as p:
        op = CompletesAtSecondTry(1.0)
        assert await p.try_complete_else_watch(op, ["a", ("b", 1)]) is True
    (event,) = sink.events
    assert (event.outcome, event.keys) == ("completed", ["a", str(("b", 1))])


async def test_an_operation_cancelled_while_watched_has_the_keys_it_was_watched_under(
    clock: ManualClock,
) -> None:
    sink = Recorder()
    async with Purgatory("p", clock=clock, event_sink=sink) as p:
        op = MockOperation(1.0)
        assert await p.try_complete_else_watch(op, ["a"]) is False
        assert op.cancel()
    (event,) = sink.events
    assert (event.outcome, event.keys) == ("cancelled", ["a"])
