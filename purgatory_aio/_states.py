"""Bits of an operation's state word.

One int holds the whole life of an operation, so reading any part of it is a
single attribute load, and the winning transition is one guarded update.
"""

COMPLETED = 1  # won the transition to completed; on_complete runs (or ran)
EXPIRED = 2  # ... because the deadline passed (or shutdown expired it)
CANCELLED = 4  # won the transition to cancelled; no callback runs
SETTLED = 8  # outcome final, awaiters released
FAILED = 16  # the outcome is an exception
SHUTDOWN = 32  # completed by Purgatory.shutdown
ENDED = COMPLETED | CANCELLED


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
