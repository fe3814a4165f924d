"""The owner of an operation: the interface an operation calls once it has won a transition.

Two owners implement it, as peers: a purgatory's :class:`~._lifecycle.Lifecycle`,
and the detached owner (:mod:`._detached`) of every operation no purgatory holds.
What both do the same way lives here: the callbacks that follow a completion,
inline or in a task, and the settlement that ends every operation's life.

:class:`Owner` is a plain base class, not a ``typing.Protocol``: in the compiled
build it is a native class, so an operation's calls through ``op._owner`` stay
direct vtable calls (a call through a protocol goes through Python attribute
lookup there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from . import _gc
from ._errors import FATAL
from ._states import EXPIRED, FAILED, SETTLED
from ._waiters import not_a_result, release_waiters

if TYPE_CHECKING:
    import anyio

    from ._operation import DelayedOperation

__all__ = ["Owner"]

# Statics in the compiled build (see _gc), so each is one C call; None in the pure build.
_track: Final = _gc.track


class Owner:
    """What an operation calls on its owner, and nothing else of it.

    :meth:`completed` (satisfied, expired or shut down), :meth:`cancelled`,
    :meth:`callback_failed` and :meth:`check_can_complete`; the callback tasks
    (see ``_shell.run_callbacks``) call :meth:`settle`, :meth:`callback_raised`,
    :meth:`callback_failed` and :meth:`limiter`.
    """

    def __init__(self, name: str, *, detached: bool, observed: bool, offload: bool) -> None:
        self.name = name
        #: Whether this owner holds the operations no purgatory holds (see _detached).
        self.detached = detached
        # Whether a settlement is recorded anywhere (an event sink, the debug log).
        self._observed = observed
        # Whether every callback runs in a worker thread, whatever its class says.
        self._offload = offload

    # -- what each owner does its own way ------------------------------------------------------

    def completed(self, op: DelayedOperation[Any], failure: BaseException | None) -> None:
        """``op`` won *completed* (satisfied, expired or shut down), or ``try_complete``
        raised ``failure``: everything that follows, up to its settlement."""
        raise NotImplementedError

    def cancelled(self, op: DelayedOperation[Any]) -> None:
        """``op`` won *cancelled*: no callback runs, awaiters get CancelledError."""
        raise NotImplementedError

    def callback_failed(self, op: DelayedOperation[Any], exc: BaseException, stage: str) -> None:
        """A callback of ``op`` raised ``exc``: log it (it becomes the outcome)."""
        raise NotImplementedError

    def check_can_complete(self, op: DelayedOperation[Any]) -> None:
        """Refuse, before anything changes, a completion that could not run its callbacks."""

    def limiter(self) -> anyio.CapacityLimiter | None:
        """The limiter of offloaded callbacks (None: anyio's default one)."""
        return None

    def _spawn(self, op: DelayedOperation[Any], offload: bool) -> None:
        """Run ``op``'s callbacks in a task on the loop (they settle it when done)."""
        raise NotImplementedError

    def _observe(self, op: DelayedOperation[Any]) -> None:
        """Record the settlement of ``op`` (called only when ``_observed``)."""

    # -- what both do the same way -------------------------------------------------------------

    def run_callbacks(self, op: DelayedOperation[Any], failure: BaseException | None) -> None:
        """After a completion's bookkeeping: ``on_complete`` (then ``on_expiration``
        if it expired) inline, or in a task, then settle; at once with ``failure``."""
        if failure is not None:
            self.settle(op, failure, True)
            return
        cls = type(op)
        expired = op._state & EXPIRED
        inline = cls._inline_expire if expired else cls._inline_complete
        if inline and not self._offload:
            stage = "on_complete"
            try:
                result = op.on_complete()
                if expired:
                    stage = "on_expiration"
                    op.on_expiration()
            except BaseException as exc:
                self.callback_raised(op, exc, stage)
            else:
                self.settle(op, result, False)
            return
        self._spawn(op, cls.offload_callbacks or self._offload)

    def callback_raised(self, op: DelayedOperation[Any], exc: BaseException, stage: str) -> None:
        """A callback of ``op`` raised ``exc`` at ``stage``: log and count it, settle ``op``
        with it, and raise it again if it must stop the program (KeyboardInterrupt,
        SystemExit)."""
        self.callback_failed(op, exc, stage)
        self.settle(op, exc, True)
        if isinstance(exc, FATAL):
            raise exc

    def settle(self, op: DelayedOperation[Any], outcome: Any, failed: bool) -> None:
        """Record the outcome, release awaiters, emit the event (once per operation)."""
        if _track is not None:
            # Every settlement ends here: the operation (untracked while pending, see
            # Lifecycle.watch) and its dict are the collector's again.
            _track(op)
        if failed:  # a branch the state bits needed anyway: success costs nothing more
            if isinstance(outcome, StopIteration):
                outcome = not_a_result(outcome)
            op._outcome = outcome
            op._state |= SETTLED | FAILED
        else:
            op._outcome = outcome
            op._state |= SETTLED
        if op._waiter is not None:
            release_waiters(op)
        if self._observed:
            self._observe(op)
