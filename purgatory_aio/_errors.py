"""Exceptions raised by purgatory_aio."""

from __future__ import annotations

from typing import Final

#: Exceptions that may leave a callback's frame (after its operation has settled);
#: every other exception a callback raises is caught, logged and counted.
FATAL: Final = (KeyboardInterrupt, SystemExit)


class PurgatoryClosed(RuntimeError):
    """The purgatory has been shut down and accepts no new operations."""


class OutsideLoop(RuntimeError):
    """A purgatory was used with no event loop running (``start`` says so)."""


def not_copyable(obj: object, why: str) -> TypeError:
    """The error ``copy.copy``, ``copy.deepcopy`` and ``pickle`` raise for a live object.

    A purgatory, a timer, a timer handle or a clock holds state that only makes
    sense once (pending operations, a reaper task, an event loop): a copy would be
    a second, silently diverging claim on the same things.
    """
    return TypeError(f"cannot copy or pickle {obj!r}: {why}")
