"""Bits of an operation's state word, and the one guarded update of it.

One int holds the whole life of an operation, so reading any part of it is a
single attribute load, and the winning transition is one guarded update.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import TYPE_CHECKING, Any, Final

from . import _build
from ._errors import uninitialised

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

# Where the watch store (_watches) holds an operation: the values of its ``_store``. Here
# rather than in _watches so that the operation, which the store calls, needs nothing of
# the store's module (literals, so that compiled code inlines them).
NOT_WATCHED: Final = 0
IN_WATCH_LISTS: Final = 1
IN_THRESHOLD_INDEX: Final = 2
IN_WALK: Final = 3  # taken out of its index by advance_key, held by that walk
TAKEN: Final = 4  # taken from a walk by cancel_for_key, or dropped by it: its entry is gone


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


# The library's attributes exist only once DelayedOperation.__init__ has run. A subclass
# whose __init__ forgot super().__init__(timeout) reads as unset attributes (a bare
# AttributeError about a private name, on either build): the operation's public members
# turn that into the TypeError naming the mistake, those reading the state word through
# state_of. The handler runs only on that error path: a try costs nothing in CPython
# 3.11, and in the compiled build the read's own error branch jumps to it.


def state_of(op: DelayedOperation[Any]) -> int:
    """``op``'s state word, for the public members of an operation that read it."""
    try:
        return op._state
    except AttributeError:
        raise uninitialised(op) from None


def final_state(op: DelayedOperation[Any]) -> int:
    """The state word of a settled ``op`` that was not cancelled (as ``Future.result``)."""
    state = state_of(op)
    if not state & SETTLED:
        raise asyncio.InvalidStateError("operation is not settled yet")
    if state & CANCELLED:
        raise asyncio.CancelledError("operation was cancelled")
    return state


def shown(op: DelayedOperation[Any]) -> str:
    """``repr(op)``. Never raises: logs and error messages (that one about forgetting
    super().__init__ included) are built with it."""
    name = type(op).__name__
    try:
        state, timeout = op._state, op._timeout
    except AttributeError:
        return f"<{name} uninitialised (its __init__ did not call super().__init__(timeout))>"
    return f"<{name} {describe(state)} timeout={timeout}>"


def _gil_enabled() -> bool:
    """Whether this interpreter runs threads one at a time under the GIL.

    False only on a free-threaded build (3.13t and later) running with the GIL off;
    interpreters older than ``sys._is_gil_enabled`` always have it.
    """
    probe = getattr(sys, "_is_gil_enabled", None)
    return True if probe is None else bool(probe())


def needs_lock(interpreted: bool, gil_enabled: bool) -> bool:
    """Whether a transition takes the lock, for this build on this interpreter.

    Interpreted, a thread switch can fall between the bytecodes that read the state
    word and the one that writes it back, so two threads could both see "pending" and
    both win. Compiled, the read, the test and the write are a few C statements on a
    native attribute with no call, allocation or eval-loop boundary between them: the
    GIL cannot change hands there, so under the GIL the region is atomic as it stands.
    Without the GIL nothing makes it atomic (two threads run those statements at the
    same time), so the compiled build takes the lock too. Skipping the lock under the
    GIL saves the two calls of the lock's methods (argument parsing included): 520 of
    the ~8,200 instructions a completion by advance_key costs in W2 (callgrind), 6 %.
    """
    return interpreted or not gil_enabled


#: Whether a transition takes the lock (see :func:`needs_lock`). Decided once, at import:
#: a free-threaded interpreter can turn the GIL on later (an extension module that needs
#: it), never off again, so a lock taken from the start is never wrong.
LOCKED: Final = needs_lock(not _build.COMPILED, _gil_enabled())

# One lock for every state transition (of the interpreted build): held for a few
# bytecodes, never across a call into user code, so contention is negligible and no
# per-operation lock is allocated.
_TRANSITION: Final = threading.Lock()
# The lock's bound methods rather than ``with``: in the compiled build a with-statement
# looks __enter__ and __exit__ up on every call (measured: 0.6k instructions per op).
acquire: Final = _TRANSITION.acquire
release: Final = _TRANSITION.release
