"""Running an operation's callbacks: inline, as a task, or in a worker thread.

Synchronous ``on_complete``/``on_expiration`` run inline on the loop — no task,
no allocation beyond the result. ``async`` callbacks, and synchronous ones that
ask to be offloaded, run in one task per operation that needs it, tracked by
the purgatory so that shutdown (and ``ManualClock.advance``) can wait for it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

import anyio.to_thread
import structlog

from ._states import EXPIRED, FAILED, SETTLED

if TYPE_CHECKING:
    from ._operation import DelayedOperation
    from ._purgatory import Purgatory

_log: Final = structlog.get_logger("purgatory_aio.operation")

# Tasks of operations used without a purgatory: kept here so they are not collected.
_orphan_tasks: set[asyncio.Task[None]] = set()


def run_callbacks(op: DelayedOperation[Any], purgatory: Purgatory | None) -> None:
    """Run ``on_complete`` (then ``on_expiration`` if expired) and settle ``op``."""
    cls = type(op)
    expired = op._state & EXPIRED
    inline = cls._inline_expire if expired else cls._inline_complete
    if inline and (purgatory is None or not purgatory._offload):
        stage = "on_complete"
        try:
            result = op.on_complete()
            if expired:
                stage = "on_expiration"
                op.on_expiration()
        except Exception as exc:
            _failed(op, purgatory, exc, stage)
            settle(op, exc, True)
        else:
            settle(op, result, False)
        return
    offload = cls.offload_callbacks or (purgatory is not None and purgatory._offload)
    coro = _run_async(op, purgatory, offload)
    if purgatory is not None:
        purgatory._spawn(coro)
    else:
        task = asyncio.get_running_loop().create_task(coro)
        _orphan_tasks.add(task)
        task.add_done_callback(_orphan_tasks.discard)


async def _call(fn: Any, is_async: bool, offload: bool, purgatory: Purgatory | None) -> Any:
    if is_async:
        return await fn()
    if offload:
        limiter = purgatory._limiter() if purgatory is not None else None
        return await anyio.to_thread.run_sync(fn, limiter=limiter)
    return fn()


async def _run_async(op: DelayedOperation[Any], purgatory: Purgatory | None, offload: bool) -> None:
    cls = type(op)
    stage = "on_complete"
    try:
        result = await _call(op.on_complete, cls._async_complete, offload, purgatory)
        if op.expired:
            stage = "on_expiration"
            await _call(op.on_expiration, cls._async_expire, offload, purgatory)
    except asyncio.CancelledError as exc:
        # The callback task itself was cancelled (loop teardown): settle anyway so no
        # awaiter hangs, then let the cancellation proceed.
        settle(op, exc, True)
        raise
    except Exception as exc:
        _failed(op, purgatory, exc, stage)
        settle(op, exc, True)
    else:
        settle(op, result, False)


def _failed(
    op: DelayedOperation[Any], purgatory: Purgatory | None, exc: Exception, stage: str
) -> None:
    if purgatory is not None:
        purgatory._callback_failed(op, exc, stage)
    else:
        _log.error("callback_error", op=repr(op), stage=stage, exc_info=exc)


def settle(op: DelayedOperation[Any], outcome: Any, failed: bool) -> None:
    """Record the outcome and release awaiters (called once, by the winner)."""
    op._outcome = outcome
    op._state |= SETTLED | FAILED if failed else SETTLED
    if op._waiter is not None:
        op._release()
    purgatory = op._purgatory
    if purgatory is not None and purgatory._observed:
        purgatory._on_settled(op)
