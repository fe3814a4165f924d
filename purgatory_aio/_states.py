"""Bits of an operation's state word.

One int holds the whole life of an operation, so reading any part of it is a
single attribute load, and the winning transition is one guarded update.
"""

from typing import Final

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
