"""Bits of an operation's state word, and the one guarded update of it.

One int holds the whole life of an operation, so reading any part of it is a
single attribute load, and the winning transition is one guarded update.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ._operation import DelayedOperation

COMPLETED: Final = 1  # won the transition to completed; on_complete runs (or ran)
EXPIRED: Final = 2  # ... because the deadline passed (or shutdown expired it)
CANCELLED: Final = 4  # won the transition to cancelled; no callback runs
SETTLED: Final = 8  # outcome final, awaiters released
FAILED: Final = 16  # the outcome is an exception
SHUTDOWN: Final = 32  # completed by Purgatory.shutdown
ENDED: Final = 5  # COMPLETED | CANCELLED, as a literal so compiled code inlines it
assert ENDED == COMPLETED | CANCELLED


def describe(state: int) -> str:
    """The outcome a state word stands for: the event log's ``outcome``, or pending."""
    if state & CANCELLED:
        return "cancelled"
    if state & SHUTDOWN:
        return "shutdown"
    if state & EXPIRED:
        return "expired"
    if state & COMPLETED:
        return "completed"
    return "pending"


# One lock for every state transition: held for a few bytecodes, never across a call
# into user code, so contention is negligible and no per-operation lock is allocated.
_TRANSITION: Final = threading.Lock()
# The lock's bound methods rather than ``with``: in the compiled build a with-statement
# looks __enter__ and __exit__ up on every call (measured: 0.6k instructions per op).
acquire: Final = _TRANSITION.acquire
release: Final = _TRANSITION.release


# The locked regions below read and write two native attributes of an operation and
# cannot raise, so they need no try/finally: in the compiled build that would save and
# restore the exception state on every call (measured: 0.5k instructions a region).


def transition(op: DelayedOperation[Any], bits: int) -> bool:
    """Set ``bits`` if ``op`` is still pending; True for the one caller that did."""
    acquire()
    state = op._state
    won = not state & ENDED
    if won:
        op._state = state | bits
    release()
    return won
