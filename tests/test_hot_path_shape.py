"""The hot path's shape: where the core keeps a hand-inlined copy of a function for speed,
the copy and the function agree on every input."""

from __future__ import annotations

from support import MockOperation

from purgatory_aio._states import COMPLETED, SETTLED, transition

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
