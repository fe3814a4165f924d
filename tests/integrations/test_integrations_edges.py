"""The integrations at their edges: what a wait reports, subscriptions that fail or fire
at once, and setting up an application with arguments it refuses."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web
from support import MockOperation

from purgatory_aio import Purgatory
from purgatory_aio.fanout import MemoryFanout
from purgatory_aio.integrations import (
    ClientDisconnected,
    already_disconnected,
    cancel_on_disconnect,
    never_disconnected,
    watch_until_disconnected,
)
from purgatory_aio.integrations.aiohttp import (
    FANOUT,
    PURGATORIES,
    purgatory_key,
    setup_purgatories,
)
from purgatory_aio.integrations.fastapi import PurgatoryLifespan
from purgatory_aio.testing import ManualClock


def broken_signal(callback: Callable[[], None]) -> Callable[[], None]:
    """An OnDisconnect whose subscription fails (a transport already torn down)."""
    raise ConnectionResetError("transport is gone")


def fires_then_fails(callback: Callable[[], None]) -> Callable[[], None]:
    """An OnDisconnect that reports the disconnection, then fails to subscribe."""
    callback()
    raise ConnectionResetError("transport is gone")


# -- watch_until_disconnected: what the waiter is told ------------------------------------------


class CancelledInOnComplete(MockOperation):
    async def on_complete(self) -> str:  # type: ignore[override]
        raise asyncio.CancelledError("raised by on_complete")


async def test_an_on_complete_raising_cancelled_error_is_not_reported_as_a_cancellation(
    clock: ManualClock,
) -> None:
    # OperationCancelled (503) means the application cancelled op. This op completed and
    # its on_complete failed: the waiter gets that failure, as it is.
    async with Purgatory("p", clock=clock) as p:
        op = CancelledInOnComplete(5.0)
        asyncio.get_running_loop().call_soon(op.force_complete)
        with pytest.raises(asyncio.CancelledError, match="raised by on_complete"):
            await watch_until_disconnected(p, op, ["k"], never_disconnected)
        assert op.is_completed and not op.cancelled


async def test_a_failing_disconnection_subscription_withdraws_the_operation(
    clock: ManualClock,
) -> None:
    # Nobody would hear the client leave: the operation must not wait for its deadline.
    async with Purgatory("p", clock=clock) as p:
        op = MockOperation(30.0)
        with pytest.raises(ConnectionResetError):
            await watch_until_disconnected(p, op, ["k"], broken_signal)
        assert op.cancelled and p.num_delayed == 0 and op.completions == 0


async def test_a_client_gone_before_the_wait_is_reported_as_disconnected(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = MockOperation(30.0)
        with pytest.raises(ClientDisconnected):
            await watch_until_disconnected(p, op, ["k"], already_disconnected)
        assert op.cancelled and p.num_delayed == 0


# -- cancel_on_disconnect: the cancellation ends with the block ---------------------------------


async def test_cancel_on_disconnect_does_not_leak_a_cancellation_past_its_block() -> None:
    # With a client already gone (already_disconnected, which the aiohttp module uses for a
    # request whose transport is gone) and a block that finishes without suspending (an
    # operation completing at once), the block finishes, as under an expired
    # asyncio.timeout, and nothing cancels what the task awaits after it.
    async def handler() -> str:
        async with cancel_on_disconnect(already_disconnected):
            pass
        await asyncio.sleep(0)
        return "answered"

    assert await asyncio.create_task(handler()) == "answered"


async def test_a_client_gone_before_the_block_cancels_it_at_its_first_suspension() -> None:
    reached: list[str] = []

    async def handler() -> int:
        with pytest.raises(ClientDisconnected):
            async with cancel_on_disconnect(already_disconnected):
                reached.append("block")
                await asyncio.Event().wait()
                reached.append("after the await")
        await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert await asyncio.create_task(handler()) == 0
    assert reached == ["block"]


async def test_a_block_that_swallows_the_disconnection_leaves_its_task_uncancelled() -> None:
    callbacks: list[Callable[[], None]] = []

    def signal(callback: Callable[[], None]) -> Callable[[], None]:
        callbacks.append(callback)
        return callbacks.clear

    async def handler() -> int:
        async with cancel_on_disconnect(signal):
            with contextlib.suppress(asyncio.CancelledError):  # the block's own business
                await asyncio.Event().wait()
        await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    task = asyncio.create_task(handler())
    await asyncio.sleep(0)
    callbacks[0]()
    assert await task == 0


async def test_a_failing_subscription_of_the_block_leaves_its_task_uncancelled() -> None:
    async def handler() -> str:
        with pytest.raises(ConnectionResetError):
            async with cancel_on_disconnect(fires_then_fails):
                pass
        await asyncio.sleep(0)
        return "answered"

    assert await asyncio.create_task(handler()) == "answered"


async def test_an_outside_cancellation_of_a_block_whose_client_is_gone_stays_one() -> None:
    started = asyncio.Event()

    async def handler() -> None:
        async with cancel_on_disconnect(already_disconnected):
            started.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(handler())
    await asyncio.sleep(0)
    assert started.is_set()
    task.cancel()  # before the loop delivers the disconnection the block was told of
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


# -- setting up an application: refused arguments change nothing --------------------------------


def snapshot(app: web.Application) -> tuple[Any, ...]:
    registry = app.get(PURGATORIES)
    return (
        dict(app),
        None if registry is None else registry.names,
        list(app.cleanup_ctx),
        list(app.on_shutdown),
    )


#: (purgatories the app has, the arguments refused, the error): refused after the ones before.
REFUSED: dict[str, tuple[tuple[str, ...], Callable[[], tuple[Any, ...]], type[Exception]]] = {
    "a name already registered": (("b",), lambda: (Purgatory("a"), Purgatory("b")), ValueError),
    "one name twice": (("b",), lambda: (Purgatory("a"), Purgatory("a")), ValueError),
    "not a purgatory": (("b",), lambda: (Purgatory("a"), "b"), TypeError),
    "one name twice, fresh app": ((), lambda: (Purgatory("a"), Purgatory("a")), ValueError),
    "not a purgatory, fresh app": ((), lambda: (Purgatory("a"), "b"), TypeError),
}


@pytest.mark.parametrize("registered,arguments,error", REFUSED.values(), ids=REFUSED.keys())
def test_setup_purgatories_refusing_an_argument_changes_nothing(
    registered: tuple[str, ...], arguments: Callable[[], tuple[Any, ...]], error: type[Exception]
) -> None:
    app = web.Application()
    if registered:
        setup_purgatories(app, *map(Purgatory, registered))
    before = snapshot(app)
    with pytest.raises(error):
        setup_purgatories(app, *arguments())
    assert snapshot(app) == before
    assert purgatory_key("a") not in app


def test_setup_purgatories_refusing_a_second_fanout_changes_nothing() -> None:
    app = web.Application()
    setup_purgatories(app, Purgatory("b"), fanout=MemoryFanout())
    before = snapshot(app)
    with pytest.raises(ValueError, match="another fanout"):
        setup_purgatories(app, Purgatory("a"), fanout=MemoryFanout())
    assert snapshot(app) == before


def test_setup_purgatories_refuses_a_fanout_that_is_not_one() -> None:
    app = web.Application()
    with pytest.raises(TypeError, match="Fanout"):
        setup_purgatories(app, Purgatory("a"), fanout="redis://")  # type: ignore[arg-type]
    assert snapshot(app) == snapshot(web.Application())


def test_setup_purgatories_on_a_started_application_changes_nothing() -> None:
    app = web.Application()
    app.freeze()
    with pytest.raises(RuntimeError, match="before the application starts"):
        setup_purgatories(app, Purgatory("a"))
    assert PURGATORIES not in app and FANOUT not in app


def test_setup_purgatories_accepts_the_same_purgatory_again() -> None:
    fetch = Purgatory("fetch")
    app = web.Application()
    setup_purgatories(app, fetch)
    registry = setup_purgatories(app, fetch, fetch)
    assert registry.names == ("fetch",) and app[purgatory_key("fetch")] is fetch


LIFESPAN_REFUSALS: dict[str, tuple[Callable[[], object], type[Exception]]] = {
    "one name twice": (lambda: PurgatoryLifespan(Purgatory("a"), Purgatory("a")), ValueError),
    "not a purgatory": (lambda: PurgatoryLifespan(Purgatory("a"), "b"), TypeError),  # type: ignore[arg-type]
    "not a fanout": (lambda: PurgatoryLifespan(fanout="redis://"), TypeError),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("build,error", LIFESPAN_REFUSALS.values(), ids=LIFESPAN_REFUSALS.keys())
def test_the_fastapi_lifespan_refuses_bad_arguments_when_built(
    build: Callable[[], object], error: type[Exception]
) -> None:
    # Refused before any application is touched, not once the server starts it.
    with pytest.raises(error):
        build()
