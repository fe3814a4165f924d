"""Helpers for the adversarial lifecycle suite: hostile operations and bounded waits.

Everything here goes through the public API only (docs/contract.md): an operation's
``is_completed``/``expired``/``result()``/``await``, the purgatory's ``num_delayed``,
``watched``, ``stats()`` and ``event_sink``. Every wait is bounded, so a test that
would hang on a broken core fails with a message instead.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any

import uvloop
from support import MockOperation

from purgatory_aio import DelayedOperation, OperationEvent

#: Both event loops, for the synchronous tests that build their own loop.
LOOP_FACTORIES: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}

#: Real seconds an awaiter is given to return once its operation should be settled.
SETTLE_WITHIN = 1.0

Hook = Callable[[Any], object]


class Hostile(BaseException):
    """A BaseException subclass that is neither KeyboardInterrupt nor SystemExit."""


def cancelled_future_result() -> object:
    """What a careless callback does: ``fut.result()`` on a cancelled future.

    Raises :class:`asyncio.CancelledError` from synchronous code, as such a callback would.
    """
    future: asyncio.Future[object] = asyncio.Future(loop=asyncio.get_running_loop())
    future.cancel()
    return future.result()


def raiser(kind: type[BaseException]) -> Hook:
    """A hook that raises ``kind`` (a cancelled future's result for CancelledError)."""

    def hook(op: object) -> object:
        if kind is asyncio.CancelledError:
            return cancelled_future_result()
        raise kind(f"raised by a callback of {getattr(op, 'name', op)!r}")

    return hook


class HostileOp(MockOperation):
    """A MockOperation whose callbacks may also run a hook (which may raise).

    ``completable`` decides ``try_complete``; ``try_hook`` runs first in it.
    ``finished`` counts the ``on_complete`` runs that got past their hook.
    """

    def __init__(
        self,
        timeout: float,
        *,
        name: str = "op",
        completable: bool = False,
        on_complete_hook: Hook | None = None,
        on_expiration_hook: Hook | None = None,
        try_hook: Hook | None = None,
        clock: Any = None,
    ) -> None:
        super().__init__(timeout, completable)
        self.name = name
        self.on_complete_hook = on_complete_hook
        self.on_expiration_hook = on_expiration_hook
        self.try_hook = try_hook
        self.clock = clock
        self.finished = 0

    def try_complete(self) -> bool:
        if self.try_hook is not None:
            self.try_hook(self)
        return super().try_complete()

    def on_complete(self) -> str:
        result = super().on_complete()
        if self.on_complete_hook is not None:
            self.on_complete_hook(self)
        self.finished += 1
        return result

    def on_expiration(self) -> None:
        super().on_expiration()
        if self.on_expiration_hook is not None:
            self.on_expiration_hook(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {super().__repr__()}>"


class AsyncHostileOp(HostileOp):
    """The same with ``async`` callbacks that yield to the loop around the sync ones."""

    async def on_complete(self) -> str:  # type: ignore[override]
        await asyncio.sleep(0)
        result = HostileOp.on_complete(self)
        await asyncio.sleep(0)
        return result

    async def on_expiration(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        HostileOp.on_expiration(self)


class ListSink:
    """An event sink that keeps every record, on the loop thread."""

    def __init__(self) -> None:
        self.events: list[OperationEvent] = []

    def emit(self, event: OperationEvent) -> None:
        self.events.append(event)


def is_settled(op: DelayedOperation[Any]) -> bool:
    """Whether ``op``'s outcome is final, read through ``result()`` as a user would."""
    try:
        op.result()  # type: ignore[attr-defined]
    except asyncio.InvalidStateError:
        return False
    except BaseException:
        return True
    return True


async def _catch(op: DelayedOperation[Any]) -> tuple[str, Any]:
    try:
        return ("result", await op)
    except asyncio.CancelledError as exc:
        return ("cancelled", exc)
    except BaseException as exc:
        return ("error", exc)


async def outcome_of(op: DelayedOperation[Any], within: float = SETTLE_WITHIN) -> tuple[str, Any]:
    """``await op`` in a task of its own, bounded: ("result"|"cancelled"|"error", value).

    Fails the test (never hangs) if the awaiter has not returned ``within`` real seconds.
    """
    task = asyncio.get_running_loop().create_task(_catch(op))
    done, _ = await asyncio.wait({task}, timeout=within)
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise AssertionError(
            f"`await op` did not return within {within}s: {op!r} is left unsettled "
            f"(is_completed={op.is_completed})"
        )
    return task.result()


def futures_held_by(root: object, depth: int = 4) -> int:
    """How many asyncio futures are reachable from ``root`` through plain containers.

    Follows instance slots and lists, tuples, dicts and sets (never types, modules or
    functions), the way an operation would hold its awaiters' futures.
    """
    seen: set[int] = {id(root)}
    count = 0
    frontier: list[object] = [root]
    for _ in range(depth):
        following: list[object] = []
        for obj in frontier:
            for ref in gc.get_referents(obj):
                if id(ref) in seen:
                    continue
                seen.add(id(ref))
                if isinstance(ref, asyncio.Future):
                    count += 1
                elif isinstance(ref, list | tuple | dict | set | frozenset):
                    following.append(ref)
        frontier = following
    return count


def call(fn: Callable[..., Any], *args: Any) -> tuple[Any, BaseException | None]:
    """``fn(*args)`` with whatever it raises caught (KeyboardInterrupt/SystemExit too).

    A CancelledError escaping into the test's own task would end the test as
    "cancelled" with no word about which call let it out; this reports it instead.
    """
    try:
        return fn(*args), None
    except BaseException as exc:
        return None, exc


def raised(what: str, exc: BaseException | None) -> str:
    return f"{what} let {type(exc).__name__}({exc}) escape to its caller"


def run_on(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], limit: float = 10.0
) -> Any:
    """Run ``coro`` on ``loop``, bounded by ``limit`` seconds; return (value, what it raised).

    The bound is ``asyncio.timeout`` inside the one task that runs ``coro``: with
    ``wait_for`` (a task of its own in 3.11) an interrupt raised in the inner task
    would be raised again by the outer one on the loop's next run.
    """

    async def bounded() -> Any:
        async with asyncio.timeout(limit):
            return await coro

    try:
        return loop.run_until_complete(bounded()), None
    except BaseException as exc:  # KeyboardInterrupt included: it must not end pytest
        return None, exc
