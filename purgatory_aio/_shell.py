"""The core's coroutines: interpreted on both builds.

The compiled build compiles the synchronous core (admission, completion, expiry, the
timer) and keeps every coroutine here, as ordinary Python. Two reasons, both measured:

* A compiled coroutine that is cancelled while it awaits passes the cancellation on
  with the three-argument ``throw(type, value, traceback)``, which CPython 3.12 and
  later deprecate: every cancelled reaper, wait or shutdown warned once (an exception
  under ``-W error``). An interpreted coroutine passes it on as the interpreter does.
* None of these is on a hot path but a wait's one suspension, and that costs little:
  a ``watch_and_wait`` awaited in a task of its own and completed by ``force_complete``
  took 9.0 against 8.7 µs per operation on 3.11 and 8.2 against 8.0 µs on 3.13
  (compiled core, best of five runs of 100,000, the two builds alternated). A compiled
  coroutine function can carry neither a docstring nor a signature either.

Each function here is the body of one coroutine method of :class:`Timer` or
:class:`Purgatory`, or a step of a callback task or of the shutdown; the class keeps
the method (a plain method returning this coroutine) and every state change stays
with its owner (the lifecycle, the shutdown of :mod:`._shutdown`), through methods of
its own.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Coroutine, Generator, Hashable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio.to_thread

from ._errors import FATAL
from ._logging import get_logger

if TYPE_CHECKING:
    from ._lifecycle import Lifecycle
    from ._operation import DelayedOperation
    from ._owner import Owner
    from ._purgatory import Purgatory
    from ._shutdown import Shutdown
    from ._timer import Timer

_log = get_logger("purgatory_aio.purgatory")

R = TypeVar("R")
T = TypeVar("T")


# -- coroutine methods ---------------------------------------------------------------------


def coroutine_methods(cls: type, *names: str) -> None:
    """Make each plain method ``names`` of ``cls`` (one that returns a coroutine of this
    module) an ``async def`` method with its docstring and signature, as the pure source
    reads: ``inspect.iscoroutinefunction`` is then true of it on both builds, as
    frameworks that inspect handlers expect. Applying it twice changes nothing."""
    for name in names:
        method = cls.__dict__[name]
        if inspect.iscoroutinefunction(method):
            continue
        coroutine = _coroutine_method(method)
        coroutine.__module__ = cls.__module__
        setattr(cls, name, coroutine)


def _coroutine_method(method: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., Any]:
    async def coroutine(*args: Any, **kwargs: Any) -> T:
        return await method(*args, **kwargs)

    signature = inspect.signature(method)
    params = list(signature.parameters.values())
    if params and params[0].name == "self":  # a compiled method's is positional-only
        params[0] = params[0].replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
    coroutine.__name__ = method.__name__
    coroutine.__qualname__ = method.__qualname__
    coroutine.__doc__ = method.__doc__
    coroutine.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return coroutine


# -- the timer -------------------------------------------------------------------------------


async def reap(timer: Timer) -> None:
    """The reaper task: wait for the earliest bucket's deadline, run one pass, repeat."""
    me = asyncio.current_task()
    assert me is not None
    # Cancellations of this task asked for by the callbacks of the last pass: they run
    # inline here, so asyncio.current_task() is the reaper to them. Not its to obey.
    stray = 0
    # A reaper replaced meanwhile (close() from a callback, then new timers) stops here.
    while timer.reaper_is(me):
        try:
            await timer.next_wake()
        except asyncio.CancelledError:
            # Such a request arrives at the first await after the pass (even one the
            # callback withdrew with uncancel(): Python 3.11 still delivers it). Any
            # other cancellation (the loop's teardown; closing replaces the reaper
            # first) stops the reaper.
            if not timer.reaper_is(me) or me.cancelling() > stray:
                raise
            while stray > 0:
                me.uncancel()
                stray -= 1
            continue
        asked = me.cancelling()
        timer.reap_once()
        stray = me.cancelling() - asked


async def returning(value: T) -> T:
    """``value``, as a coroutine (``__aenter__`` of a context manager that is ready)."""
    return value


async def called(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` once the coroutine runs (a call made before its loop was running)."""
    return fn(*args)


# -- the purgatory ---------------------------------------------------------------------------


async def enter(purgatory: Purgatory, life: Lifecycle) -> Purgatory:
    """``async with purgatory``: bind it to the running loop."""
    life.enter()
    return purgatory


async def shutdown(orchestra: Shutdown, expire_pending: object) -> None:
    """``Purgatory.shutdown``: start the shutdown once, then wait for it to finish."""
    await join_shutdown(orchestra, orchestra.task(expire_pending))


async def join_shutdown(orchestra: Shutdown, shutdown: asyncio.Task[None]) -> None:
    """Wait for ``shutdown`` (the purgatory's shutdown task) to finish its work.

    From one of the purgatory's own callback tasks (an async ``on_complete`` shutting
    the purgatory down), the shutdown must not wait for its caller, which waits for it:
    it settles everything else, and the caller settles its own operation once it
    returns. From anywhere else, the wait also covers those callbacks, so that every
    operation has settled when it returns.
    """
    task = asyncio.current_task()
    if task is not None and orchestra.join(task):
        try:
            await asyncio.shield(shutdown)
        finally:
            orchestra.leave(task)
        return
    await asyncio.shield(shutdown)
    # The shutdown's work is done; what is left are the callbacks that awaited it
    # (on the purgatory's loop: after its loop closed, a shutdown runs elsewhere).
    while tasks := orchestra.callbacks_to_join():
        await asyncio.gather(*[asyncio.shield(task) for task in tasks], return_exceptions=True)


async def settle_all(orchestra: Shutdown, expire_pending: bool) -> None:
    """The shutdown task: settle every pending operation, then wait for those still
    settling."""
    found, settling = orchestra.settle_pending(expire_pending)
    # Every operation completed before or during shutdown is settling: in a callback
    # task, or (if another thread completed or cancelled it) in a hand-over to this
    # loop. Wait until each has settled.
    while True:
        if await callbacks_finished(orchestra):
            continue
        settling = [op for op in settling if not op.done()]
        if not settling:
            break
        # A thread's hand-over is on its way to this loop: its settlement wakes this
        # wait (through the operation's own awaiter), no polling.
        await settlement(settling[0])
    orchestra.finish()
    _log.info(
        "purgatory_shutdown",
        purgatory=orchestra.name,
        settled=found,
        expired_pending=expire_pending,
    )


async def settlement(op: DelayedOperation[Any]) -> None:
    """Return once ``op`` (completed or cancelled already) has settled, whatever its
    outcome; a cancellation of the waiting task itself goes through."""
    try:
        await op
    except BaseException:
        task = asyncio.current_task()
        if not op.done() or (task is not None and task.cancelling()):
            raise


async def callbacks_finished(orchestra: Shutdown) -> bool:
    """Wait for the callback tasks, except those awaiting the shutdown; False if none.

    A task that starts awaiting the shutdown meanwhile wakes the wait, which then leaves
    it out too. A closed loop's tasks are never waited for: none can run.
    """
    busy = orchestra.callbacks_to_wait_for()
    if not busy:
        return False
    joined = orchestra.watch_joins()
    # Each task shielded: giving up the wait (a task joined) must not cancel them.
    every = asyncio.gather(*[asyncio.shield(task) for task in busy], return_exceptions=True)
    try:
        await asyncio.wait((every, joined), return_when=asyncio.FIRST_COMPLETED)
    finally:
        orchestra.unwatch_joins()
        every.cancel()
    return True


# -- callbacks -------------------------------------------------------------------------------


async def run_callbacks(life: Owner, op: DelayedOperation[Any], offload: bool) -> None:
    """A callback task: ``on_complete`` (then ``on_expiration`` if expired), then settle."""
    # Imported here: _operation imports this module (a callback task is never a hot path).
    from ._operation import settle

    cls = type(op)
    stage = "on_complete"
    try:
        result = await _call(life, op.on_complete, cls._async_complete, offload)
        if op.expired:
            stage = "on_expiration"
            await _call(life, op.on_expiration, cls._async_expire, offload)
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # This task was cancelled (loop teardown): settle so that no awaiter hangs,
            # then let the cancellation proceed.
            settle(op, exc, True)
            raise
        life.callback_failed(op, exc, stage)  # the callback itself raised it
        settle(op, exc, True)
    except BaseException as exc:
        callback_raised(op, exc, stage)
    else:
        settle(op, result, False)


def callback_raised(op: DelayedOperation[Any], exc: BaseException, stage: str) -> None:
    """A callback of ``op`` raised ``exc`` at ``stage``: logged and counted by its owner,
    ``op`` settled with it, raised again if it must stop the program."""
    from ._operation import settle  # _operation imports this module

    op._owner.callback_failed(op, exc, stage)
    settle(op, exc, True)
    if isinstance(exc, FATAL):
        raise exc


async def _call(life: Owner, fn: Callable[[], Any], is_async: bool, offload: bool) -> Any:
    if is_async:
        return await fn()
    if offload:
        return await anyio.to_thread.run_sync(fn, limiter=life.limiter())
    return fn()


# -- waiting ---------------------------------------------------------------------------------


def awaiting(
    op: DelayedOperation[R],
    future: asyncio.Future[None],
    forget: Callable[[DelayedOperation[R], asyncio.Future[None]], None],
) -> Generator[Any, None, R]:
    """``await op`` of a pending operation: wait for ``future``, set when it settles."""
    try:
        yield from future
    finally:
        # An awaiter that gives up (a timeout, a cancelled handler) lets go of its future
        # at once, as asyncio.Event.wait does, rather than at settlement.
        if not future.done() or future.cancelled():
            forget(op, future)
    return op.result()


def answered(value: bool) -> Generator[None, None, bool]:
    """An admission's answer, awaited (Python 3.12 and later: see ``_purgatory._Admitted``)."""
    return value
    yield  # never reached: it makes this a generator, which the await then runs


def settled(op: DelayedOperation[R]) -> Generator[Any, None, R]:
    """``await op`` of a settled operation: its result at once."""
    return op.result()
    yield  # never reached: it makes this a generator, which the await then runs


async def await_or_cancel(op: DelayedOperation[R]) -> R:
    """The result of an admitted ``op``; cancelling the wait cancels ``op`` too."""
    try:
        return await op
    except asyncio.CancelledError:
        op.cancel()
        raise


async def watch_then_wait(
    admit: Callable[[Lifecycle, DelayedOperation[R], Iterable[Hashable], None], object],
    life: Lifecycle,
    op: DelayedOperation[R],
    keys: Iterable[Hashable],
) -> R:
    """``watch_and_wait`` called before its loop ran: admit ``op`` there, then wait."""
    admit(life, op, keys, None)
    return await await_or_cancel(op)
