"""An operation's awaiters: the futures of ``await op``, released once it settles.

Each awaiting task holds a future of its own (a task that gives up cancels only its
own); the operation keeps one future, or a list of them, and settlement wakes them
all, from whichever thread it runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Final, TypeVar

from . import _shell
from ._detached import DETACHED
from ._errors import never_handed_over
from ._states import ENDED, SETTLED

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = ["add_waiter", "forget", "not_a_result", "release_waiters", "wait", "wake"]

R = TypeVar("R")

_running_loop: Final = asyncio._get_running_loop


def wait(op: DelayedOperation[R], state: int) -> Generator[Any, None, R]:
    """``await op`` (its state word ``state``): a plain function handing the wait to an
    interpreted generator (see _shell: a compiled generator passes a cancellation on with
    the deprecated three-argument throw())."""
    if state & SETTLED:
        return _shell.settled(op)
    if not state & ENDED and op._owner is DETACHED:
        # Pending and in no purgatory: nothing would ever complete or expire it.
        raise never_handed_over(op)
    # One future per awaiting task: a task that is cancelled cancels only its own, and
    # the common single awaiter costs one future, no shield around a shared one.
    future = asyncio.get_running_loop().create_future()
    add_waiter(op, future)
    # Settlement may have happened on another thread between the check above and
    # publishing the future; it then found nothing to wake.
    if op._state & SETTLED:
        future.set_result(None)
    return _shell.awaiting(op, future, forget)


def add_waiter(op: DelayedOperation[Any], future: asyncio.Future[None]) -> None:
    """Publish ``future``, set once ``op`` settles, among its awaiters."""
    waiter = op._waiter
    if waiter is None:
        op._waiter = future
    elif isinstance(waiter, list):
        waiter.append(future)
    else:
        op._waiter = [waiter, future]


def release_waiters(op: DelayedOperation[Any]) -> None:
    """Wake the awaiters of ``op``, which has just settled (the caller saw some)."""
    waiter = op._waiter
    op._waiter = None
    if waiter is None:
        return  # an awaiter on another thread gave up meanwhile
    if isinstance(waiter, list):
        for future in waiter:
            _release_one(future)
    else:
        _release_one(waiter)


def _release_one(future: asyncio.Future[None]) -> None:
    if future.done():
        return
    loop = future.get_loop()
    if _running_loop() is loop:
        future.set_result(None)
    else:
        # RuntimeError: that loop is closed, so nobody is left to wake.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(wake, future)


def wake(future: asyncio.Future[None]) -> None:
    """Resolve ``future`` unless something else already did (a thread-safe wake-up)."""
    if not future.done():
        future.set_result(None)


def forget(op: DelayedOperation[Any], future: asyncio.Future[None]) -> None:
    """An awaiter of ``op`` gave up: let go of its ``future`` at once."""
    waiter = op._waiter
    if waiter is future:
        op._waiter = None
    elif isinstance(waiter, list):
        with contextlib.suppress(ValueError):
            waiter.remove(future)


def not_a_result(exc: StopIteration) -> RuntimeError:
    """What a failure with ``exc`` becomes, as in asyncio.Future.set_exception.

    Raised out of ``await op`` (a generator), a StopIteration would end it as a
    return: the compiled build would hand its value out as the result, the pure one
    raise a bare "generator raised StopIteration".
    """
    error = RuntimeError(
        f"{exc!r} was raised as an operation's outcome; StopIteration interacts badly "
        "with generators and cannot be raised out of await"
    )
    error.__cause__ = exc
    error.__context__ = exc
    return error
