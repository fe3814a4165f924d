"""DelayedOperation: completes when its condition holds, or at its deadline at the latest.

An operation owns exactly one thing: its state word. Each transition out of
*pending* — completed (satisfied, expired or shut down) or cancelled — is one
guarded update of that word, taken under one lock, so exactly one of any number
of concurrent ``force_complete``/expiration/``cancel``/shutdown calls wins, from
whichever thread. The winner hands the operation to its owner
(:class:`~purgatory_aio._lifecycle.Lifecycle`), which does everything that
follows — timer and watch bookkeeping, callbacks, settlement, awaiters, counters
and events — in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from abc import ABCMeta, abstractmethod
from collections.abc import Awaitable, Generator, Hashable
from typing import Any, ClassVar, Generic, SupportsFloat, TypeVar, final

from ._lifecycle import DETACHED, Lifecycle
from ._native import mypyc_attr
from ._states import (
    CANCELLED,
    COMPLETED,
    ENDED,
    EXPIRED,
    FAILED,
    LOCKED,
    SETTLED,
    acquire,
    describe,
    release,
    transition,
)
from ._timer import TimerEntry
from ._validation import INF, check_seconds
from ._watches import NOT_WATCHED

__all__ = ["DelayedOperation"]

R = TypeVar("R")


@mypyc_attr(allow_interpreted_subclasses=True)
class DelayedOperation(TimerEntry, Generic[R], metaclass=ABCMeta):
    """An operation that completes when a condition holds, or at its deadline.

    Subclass it, implement :meth:`try_complete` (cheap, synchronous: check the
    condition and ``return self.force_complete()`` if it holds) and
    :meth:`on_complete` (sync or ``async``; builds the result, runs exactly once
    whether the operation was satisfied or expired). Optionally override
    :meth:`on_expiration`.

    Class attributes:
        op_type: name used in the event log (the class name by default).
        offload_callbacks: run synchronous callbacks in a worker thread
            (anyio, bounded by the purgatory's limiter) instead of on the loop.

    Example:
        >>> class WaitForOffset(DelayedOperation[int]):
        ...     def __init__(self, log, offset, timeout):
        ...         super().__init__(timeout)
        ...         self.log, self.offset = log, offset
        ...     def try_complete(self):
        ...         return self.log.end >= self.offset and self.force_complete()
        ...     def on_complete(self):
        ...         return self.log.end
    """

    __slots__ = ("_busy", "_keys", "_outcome", "_owner", "_state", "_store", "_timeout", "_waiter")

    op_type: ClassVar[str | None] = None
    offload_callbacks: ClassVar[bool] = False
    _async_complete: ClassVar[bool] = False
    _async_expire: ClassVar[bool] = False
    # Whether the callbacks of a satisfied / an expired operation can run inline on the
    # loop: decided once per class so the completion path reads one attribute.
    _inline_complete: ClassVar[bool] = True
    _inline_expire: ClassVar[bool] = True
    # Abstract methods a class leaves unimplemented. ABCMeta refuses to instantiate such
    # a class, but the compiled build's classes do not go through ABCMeta, so __init__
    # checks this too (one class-attribute read).
    _unimplemented: ClassVar[tuple[str, ...]] = ("on_complete", "try_complete")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._unimplemented = tuple(
            name for name in ("on_complete", "try_complete") if _is_abstract(cls, name)
        )
        cls._async_complete = inspect.iscoroutinefunction(cls.on_complete)
        cls._async_expire = inspect.iscoroutinefunction(cls.on_expiration)
        cls._inline_complete = not (cls._async_complete or cls.offload_callbacks)
        cls._inline_expire = cls._inline_complete and not cls._async_expire

    def __init__(self, timeout: SupportsFloat) -> None:
        if self._unimplemented:
            missing = ", ".join(self._unimplemented)
            raise TypeError(
                f"Can't instantiate abstract class {type(self).__name__} "
                f"without an implementation for abstract method(s) {missing}"
            )
        # Typed as a protocol so that the compiled build leaves bad input to this check.
        # Exactly float: a subclass may override its comparisons (or __float__), so it
        # goes through check_seconds, which tests the float it converts it to.
        seconds: float
        if type(timeout) is float and 0.0 <= timeout < INF:
            seconds = timeout
        else:
            seconds = check_seconds(timeout, "timeout")
        self._timeout = seconds
        self._state = 0
        self._busy = False
        self._bucket = None
        self._owner: Lifecycle = DETACHED
        self._keys: tuple[Hashable, ...] = ()
        self._store = NOT_WATCHED  # see _watches
        self._waiter: asyncio.Future[None] | list[asyncio.Future[None]] | None = None
        self._outcome: Any = None

    # -- to implement ------------------------------------------------------------------------

    @abstractmethod
    def try_complete(self) -> bool:
        """Check the condition; if it holds ``return self.force_complete()``, else False."""

    @abstractmethod
    def on_complete(self) -> R | Awaitable[R]:
        """Build the result. Runs exactly once, satisfied or expired; may be ``async``."""

    def on_expiration(self) -> Awaitable[None] | None:
        """Runs after :meth:`on_complete`, only when the operation expired."""
        return None

    # -- state -------------------------------------------------------------------------------
    # Methods marked @final are not meant to be overridden.

    @property
    @final
    def timeout(self) -> float:
        return self._timeout

    @property
    @final
    def deadline(self) -> float | None:
        """Clock time at which it expires, once handed to a purgatory."""
        return self._deadline if self._owner is not DETACHED else None

    @property
    @final
    def keys(self) -> tuple[Hashable, ...]:
        """The keys it was handed to a purgatory with; empty before that."""
        return self._keys

    @property
    @final
    def is_completed(self) -> bool:
        """True once completed: satisfied, expired, or by shutdown (not when cancelled)."""
        return bool(self._state & COMPLETED)

    @property
    @final
    def expired(self) -> bool:
        """True if it was completed by its deadline passing (or by shutdown)."""
        return bool(self._state & EXPIRED)

    @property
    @final
    def cancelled(self) -> bool:
        return bool(self._state & CANCELLED)

    @final
    def done(self) -> bool:
        """True once settled: the result, exception or cancellation is final."""
        return bool(self._state & SETTLED)

    @final
    def result(self) -> R:
        """The result of a settled operation (like ``Future.result``)."""
        state = self._state
        if not state & SETTLED:
            raise asyncio.InvalidStateError("operation is not settled yet")
        if state & CANCELLED:
            raise asyncio.CancelledError("operation was cancelled")
        if state & FAILED:
            raise self._outcome
        return self._outcome  # type: ignore[no-any-return]

    @final
    def exception(self) -> BaseException | None:
        """The exception of a settled, failed operation, else None."""
        state = self._state
        if not state & SETTLED:
            raise asyncio.InvalidStateError("operation is not settled yet")
        if state & CANCELLED:
            raise asyncio.CancelledError("operation was cancelled")
        return self._outcome if state & FAILED else None

    # -- transitions: flip the state word, report who won, hand the winner to the owner ------

    def force_complete(self) -> bool:
        """Complete now; True only for the one call that completed it.

        Removes it from the timer and runs :meth:`on_complete`. Safe from any
        thread: off the purgatory's loop thread the rest is handed to the loop.
        """
        if self._owner is DETACHED:
            DETACHED.check_can_complete(self)  # refuses before anything changes
        # transition(), inlined: this is every satisfied operation's path.
        if LOCKED:
            acquire()
        state = self._state
        owner = self._owner
        if state & ENDED:
            if LOCKED:
                release()
            return False
        self._state = state | COMPLETED
        if LOCKED:
            release()
        owner.completed(self, None)
        return True

    def cancel(self) -> bool:
        """Withdraw a pending operation: ``on_complete`` never runs, awaiters get
        :class:`asyncio.CancelledError`. True if this call withdrew it."""
        if not transition(self, CANCELLED):
            return False
        self._owner.cancelled(self)
        return True

    @final
    def _fire(self) -> None:
        """The timer says the deadline has passed (always on the loop thread)."""
        if transition(self, COMPLETED | EXPIRED):
            self._owner.expired(self)

    # -- awaiting ----------------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, R]:
        if not self._state & SETTLED:
            # One future per awaiting task: a task that is cancelled cancels only its own,
            # and the common single awaiter costs one future, no shield around a shared one.
            future = asyncio.get_running_loop().create_future()
            waiter = self._waiter
            if waiter is None:
                self._waiter = future
            elif isinstance(waiter, list):
                waiter.append(future)
            else:
                self._waiter = [waiter, future]
            # Settlement may have happened on another thread between the check above
            # and publishing the future; it then found nothing to wake.
            if self._state & SETTLED:
                future.set_result(None)
            try:
                yield from future
            finally:
                # An awaiter that gives up (a timeout, a cancelled handler) lets go of its
                # future at once, as asyncio.Event.wait does, rather than at settlement.
                if not future.done() or future.cancelled():
                    _forget(self, future)
        return self.result()

    def __repr__(self) -> str:
        status = describe(self._state)
        return f"<{type(self).__name__} {status} timeout={self._timeout}>"


def _forget(op: DelayedOperation[Any], future: asyncio.Future[None]) -> None:
    waiter = op._waiter
    if waiter is future:
        op._waiter = None
    elif isinstance(waiter, list):
        with contextlib.suppress(ValueError):
            waiter.remove(future)


def _is_abstract(cls: type, name: str) -> bool:
    """Whether ``cls`` leaves method ``name`` abstract (compiled methods carry no marker)."""
    owner = next(klass for klass in cls.__mro__ if name in klass.__dict__)
    return owner is DelayedOperation or bool(
        getattr(owner.__dict__[name], "__isabstractmethod__", False)
    )
