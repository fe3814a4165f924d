"""DelayedOperation: completes when its condition holds, or at its deadline at the latest.

The life of an operation is one guarded transition out of *pending* — to
completed (satisfied, expired or shut down) or to cancelled — followed, for a
completion, by its callbacks and then its *settlement*, when awaiters are
released. The transition is taken under one lock, so exactly one of any number
of concurrent ``force_complete``/expiration/``cancel``/shutdown calls wins, from
whichever thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from abc import ABCMeta, abstractmethod
from collections.abc import Awaitable, Generator, Hashable
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, SupportsFloat, TypeVar, final

from ._callbacks import run_callbacks, settle
from ._native import mypyc_attr
from ._states import CANCELLED, COMPLETED, ENDED, EXPIRED, FAILED, SETTLED, SHUTDOWN, describe
from ._timer import TimerEntry
from ._validation import INF, check_seconds

if TYPE_CHECKING:
    from ._purgatory import Purgatory

__all__ = ["DelayedOperation", "try_guarded"]

R = TypeVar("R")

# One lock for every state transition: held for a few bytecodes, never across a call
# into user code, so contention is negligible and no per-operation lock is allocated.
_TRANSITION: Final = threading.Lock()
_acquire: Final = _TRANSITION.acquire
_release_lock: Final = _TRANSITION.release
_get_ident: Final = threading.get_ident
_running_loop: Final = asyncio._get_running_loop


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

    __slots__ = ("_busy", "_keys", "_outcome", "_purgatory", "_state", "_timeout", "_waiter")

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
        seconds: float
        if isinstance(timeout, float) and 0.0 <= timeout < INF:
            seconds = timeout
        else:
            seconds = check_seconds(timeout, "timeout")
        self._timeout = seconds
        self._state = 0
        self._busy = False
        self._bucket = None
        self._purgatory: Purgatory | None = None
        self._keys: tuple[Hashable, ...] | None = None
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
    # Methods marked @final are not meant to be overridden. The two internal steps every
    # operation goes through, try_guarded() and settle(), are module functions: the
    # compiled build calls those directly, where a method call on a subclass defined in
    # Python code would look the method up by name first.

    @property
    @final
    def timeout(self) -> float:
        return self._timeout

    @property
    @final
    def deadline(self) -> float | None:
        """Clock time at which it expires, once handed to a purgatory."""
        return self._deadline if self._purgatory is not None else None

    @property
    @final
    def keys(self) -> tuple[Hashable, ...]:
        """The keys it is (or was) watched under; empty if never watched."""
        return self._keys or ()

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

    # -- transitions -------------------------------------------------------------------------

    def force_complete(self) -> bool:
        """Complete now; True only for the one call that completed it.

        Removes it from the timer and runs :meth:`on_complete`. Safe from any
        thread: off the purgatory's loop thread the bookkeeping and callbacks are
        handed to the loop.
        """
        # The lock's bound methods rather than ``with``: in the compiled build a
        # with-statement looks __enter__ and __exit__ up on every call.
        _acquire()
        try:
            state = self._state
            if state & ENDED:
                return False
            self._state = state | COMPLETED
        finally:
            _release_lock()
        purgatory = self._purgatory
        if purgatory is None:
            run_callbacks(self, None)
        elif purgatory._thread_id == _get_ident():
            purgatory._completed(self, None)
        else:
            purgatory._on_loop(purgatory._completed, self, None)
        return True

    def cancel(self) -> bool:
        """Withdraw a pending operation: ``on_complete`` never runs, awaiters get
        :class:`asyncio.CancelledError`. True if this call withdrew it."""
        with _TRANSITION:
            if self._state & ENDED:
                return False
            self._state |= CANCELLED | SETTLED
        purgatory = self._purgatory
        if purgatory is not None:
            purgatory._on_loop(purgatory._cancelled, self)
        self._release()
        return True

    @final
    def _fire(self) -> None:
        """The timer says the deadline has passed."""
        _acquire()
        try:
            state = self._state
            if state & ENDED:
                return
            self._state = state | COMPLETED | EXPIRED
        finally:
            _release_lock()
        purgatory = self._purgatory
        assert purgatory is not None
        purgatory._on_expired(self)

    @final
    def _expire_for_shutdown(self) -> bool:
        with _TRANSITION:
            if self._state & ENDED:
                return False
            self._state |= COMPLETED | EXPIRED | SHUTDOWN
        return True

    @final
    def _fail_from_try_complete(self, exc: Exception) -> bool:
        with _TRANSITION:
            if self._state & ENDED:
                won = False
            else:
                self._state |= COMPLETED
                won = True
        purgatory = self._purgatory
        if purgatory is not None:
            purgatory._callback_failed(self, exc, "try_complete")
        if not won:
            return False
        if purgatory is not None:
            purgatory._on_loop(purgatory._completed, self, exc)
        else:
            settle(self, exc, True)
        return True

    # -- settlement and awaiting -------------------------------------------------------------

    @final
    def _release(self) -> None:
        waiter = self._waiter
        if waiter is None:
            return
        if isinstance(waiter, list):
            for future in waiter:
                _release_one(future)
        else:
            _release_one(waiter)

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
            yield from future
        return self.result()

    def __repr__(self) -> str:
        status = describe(self._state)
        return f"<{type(self).__name__} {status} timeout={self._timeout}>"


def try_guarded(op: DelayedOperation[Any]) -> bool:
    """``op.try_complete()`` guarded against re-entrant calls; True only for a real completion.

    An exception from ``try_complete`` settles the operation with that exception
    (it could otherwise be left pending with a condition that can never be checked).
    """
    if op._busy or op._state & ENDED:
        return False
    op._busy = True
    try:
        if op.try_complete():
            return op._state & COMPLETED != 0
        return False
    except Exception as exc:
        return op._fail_from_try_complete(exc)
    finally:
        op._busy = False


def _is_abstract(cls: type, name: str) -> bool:
    """Whether ``cls`` leaves method ``name`` abstract (compiled methods carry no marker)."""
    owner = next(klass for klass in cls.__mro__ if name in klass.__dict__)
    return owner is DelayedOperation or bool(
        getattr(owner.__dict__[name], "__isabstractmethod__", False)
    )


def _release_one(future: asyncio.Future[None]) -> None:
    if future.done():
        return
    loop = future.get_loop()
    if _running_loop() is loop:
        future.set_result(None)
    else:
        # RuntimeError: that loop is closed, so nobody is left to wake.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_wake, future)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
