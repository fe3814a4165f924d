"""Exceptions raised by purgatory_aio."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ._operation import DelayedOperation

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


def uninitialised(op: DelayedOperation[Any]) -> TypeError:
    """What using an operation whose ``__init__`` skipped ``DelayedOperation.__init__`` raises."""
    name = type(op).__name__
    return TypeError(
        f"{name} is not initialised: {name}.__init__ must call super().__init__(timeout)"
    )


def unimplemented(op: DelayedOperation[Any], missing: tuple[str, ...]) -> TypeError:
    """What constructing an operation whose class leaves ``missing`` abstract raises."""
    return TypeError(
        f"Can't instantiate abstract class {type(op).__name__} "
        f"without an implementation for abstract method(s) {', '.join(missing)}"
    )


def never_handed_over(op: DelayedOperation[Any]) -> RuntimeError:
    """What awaiting a pending operation that no purgatory holds raises."""
    return RuntimeError(
        f"{op!r} was never handed to a purgatory, so nothing would ever complete or expire "
        "it and awaiting it would wait for ever: hand it over first "
        "(purgatory.try_complete_else_watch(op, keys) or purgatory.watch_and_wait(op, keys)), "
        "or complete or cancel it"
    )
