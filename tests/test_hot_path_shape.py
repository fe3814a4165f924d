"""The hot path's shape: where the core keeps a hand-inlined copy of a function for speed,
the copy and the function agree on every input (force_complete's copy of transition(),
the admission's two copies of try_guarded(), one for each of its tries)."""

from __future__ import annotations

from typing import Any

import pytest
from support import MockOperation

from purgatory_aio import Purgatory
from purgatory_aio._operation import transition, try_guarded
from purgatory_aio._states import COMPLETED, SETTLED
from purgatory_aio.testing import ManualClock

#: Every state word the six bits can spell, the impossible ones included.
EVERY_STATE = range(64)


def test_force_complete_decides_as_transition_does_from_every_state_word() -> None:
    # force_complete carries transition(op, COMPLETED) inline (every satisfied operation
    # takes it): from the same state word, both must report the same winner and leave
    # the same bits (force_complete's winner then settles, which adds SETTLED).
    for state in EVERY_STATE:
        inline, reference = MockOperation(10), MockOperation(10)
        inline._state = state
        reference._state = state
        won = inline.force_complete()
        assert won is transition(reference, COMPLETED), state
        if won:
            assert inline._state | SETTLED == reference._state | SETTLED, state
            assert inline.completions == 1 and inline.done(), state
        else:
            assert inline._state == reference._state == state
            assert inline.completions == 0, state


class _Bool:
    """A try_complete answer whose truth cannot be told."""

    def __bool__(self) -> bool:
        raise ValueError("no truth")


#: What a try_complete may do, each a hostile case for the guarded try.
BEHAVIOURS = (
    "false",
    "true-without-completing",
    "complete",
    "complete-then-false",
    "raise",
    "complete-then-raise",
    "undecidable-answer",
    "stop-iteration",
    "interrupt",
    "complete-then-interrupt",
)


class _Scripted(MockOperation):
    """Returns False from try_complete until its ``at``-th call, which does ``behaviour``."""

    def __init__(self, at: int, behaviour: str) -> None:
        super().__init__(10)
        self.at = at
        self.behaviour = behaviour

    def try_complete(self) -> bool:
        self.tries += 1
        if self.tries != self.at:
            return False
        behaviour = self.behaviour
        if behaviour.startswith("complete"):
            self.force_complete()
            behaviour = behaviour.removeprefix("complete-then-")
            if behaviour == "complete":
                return True
        answers: dict[str, Any] = {"false": False, "true-without-completing": True}
        if behaviour in answers:
            return answers[behaviour]  # type: ignore[no-any-return]
        if behaviour == "undecidable-answer":
            return _Bool()  # type: ignore[return-value]
        raise {
            "raise": ValueError("try"),
            "stop-iteration": StopIteration(),
            "interrupt": KeyboardInterrupt(),
        }[behaviour]


def _after(op: _Scripted, answer: object) -> tuple[object, ...]:
    """What a try did: its answer or the exception it let through, and the operation after."""
    failure = op.exception() if op.done() and not op.cancelled else None
    return (answer, op.outcome, op.done(), op.completions, type(failure), op._busy)


@pytest.mark.parametrize("behaviour", BEHAVIOURS)
@pytest.mark.parametrize("at", [1, 2])
async def test_the_admissions_inline_tries_decide_as_try_guarded_does(
    at: int, behaviour: str, clock: ManualClock
) -> None:
    # _operation.admit carries try_guarded's body inline for its two tries (before and
    # after watching): whatever try_complete does at either, the admission answers and
    # leaves the operation as try_guarded does for one pending in the same purgatory.
    async with Purgatory("inline", clock=clock) as p:
        inline = _Scripted(at, behaviour)
        answer: object
        try:
            answer = await p.try_complete_else_watch(inline, ("k", at))
        except BaseException as exc:
            answer = type(exc)
        reference = _Scripted(3, behaviour)  # pending after its admission's two tries
        assert not await p.try_complete_else_watch(reference, ("r", at))
        reference.at = reference.tries + 1
        try:
            expected: object = try_guarded(reference)
        except BaseException as exc:
            expected = type(exc)
        assert _after(inline, answer) == _after(reference, expected)
        for op in (inline, reference):
            op.cancel()
