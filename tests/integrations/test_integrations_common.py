"""The framework-neutral pieces: the purgatory registry and the disconnect-aware waits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from http_support import Box, WaitForValue, wait_until

from purgatory_aio import Purgatory, PurgatoryClosed
from purgatory_aio.integrations import (
    ClientDisconnected,
    OperationCancelled,
    Purgatories,
    cancel_on_disconnect,
    make_request_id,
    watch_until_disconnected,
)


class FakeConnection:
    """An OnDisconnect whose disconnection the test triggers."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []
        self.subscriptions = 0

    def __call__(self, callback: Callable[[], None]) -> Callable[[], None]:
        self.subscriptions += 1
        self.callbacks.append(callback)
        return lambda: self.callbacks.remove(callback)

    def disconnect(self) -> None:
        for callback in list(self.callbacks):
            callback()


# -- Purgatories -------------------------------------------------------------------------------


def test_registry_finds_purgatories_by_name() -> None:
    fetch, produce = Purgatory("fetch"), Purgatory("produce")
    registry = Purgatories([fetch, produce])
    assert registry["fetch"] is fetch
    assert list(registry) == [fetch, produce]
    assert registry.names == ("fetch", "produce")
    assert "produce" in registry


def test_registry_rejects_two_purgatories_with_one_name() -> None:
    registry = Purgatories([Purgatory("fetch")])
    with pytest.raises(ValueError, match="fetch"):
        registry.add(Purgatory("fetch"))


def test_registry_names_the_known_purgatories_on_a_miss() -> None:
    with pytest.raises(KeyError, match="'fetch'"):
        Purgatories([Purgatory("fetch")])["produce"]


def test_only_requires_exactly_one_purgatory() -> None:
    fetch = Purgatory("fetch")
    assert Purgatories([fetch]).only() is fetch
    with pytest.raises(LookupError):
        Purgatories([fetch, Purgatory("produce")]).only()


async def test_registry_shutdown_answers_every_pending_operation() -> None:
    box = Box()
    registry = Purgatories([Purgatory("a"), Purgatory("b")])
    async with registry:
        ops = [WaitForValue(box, 60.0) for _ in range(4)]
        for i, op in enumerate(ops):
            await registry["ab"[i % 2]].try_complete_else_watch(op, ["k"])
    assert [op.result() for op in ops] == ["timeout"] * 4
    assert all(p.closed for p in registry)


# -- watch_until_disconnected -------------------------------------------------------------------


async def test_an_operation_completing_at_once_never_listens_for_disconnection() -> None:
    connection = FakeConnection()
    async with Purgatory("p") as purgatory:
        result = await watch_until_disconnected(
            purgatory, WaitForValue(Box("ready"), 10.0), ["k"], connection
        )
    assert result == "ready"
    assert connection.subscriptions == 0


async def test_the_waiter_gets_the_result_and_stops_listening() -> None:
    box, connection = Box(), FakeConnection()
    async with Purgatory("p") as purgatory:
        waiter = asyncio.ensure_future(
            watch_until_disconnected(purgatory, WaitForValue(box, 10.0), ["k"], connection)
        )
        await wait_until(lambda: purgatory.num_delayed == 1)
        box.value = "data"
        purgatory.check_and_complete("k")
        assert await waiter == "data"
    assert connection.callbacks == []


async def test_disconnection_withdraws_the_operation_without_completing_it() -> None:
    box, connection = Box(), FakeConnection()
    op = WaitForValue(box, 10.0)
    async with Purgatory("p") as purgatory:
        waiter = asyncio.ensure_future(watch_until_disconnected(purgatory, op, ["k"], connection))
        await wait_until(lambda: purgatory.num_delayed == 1)
        connection.disconnect()
        with pytest.raises(ClientDisconnected):
            await waiter
        assert purgatory.num_delayed == 0
        assert op.cancelled
    assert box.completed == []


async def test_cancelling_the_waiting_task_withdraws_the_operation() -> None:
    box, connection = Box(), FakeConnection()
    op = WaitForValue(box, 10.0)
    async with Purgatory("p") as purgatory:
        waiter = asyncio.ensure_future(watch_until_disconnected(purgatory, op, ["k"], connection))
        await wait_until(lambda: purgatory.num_delayed == 1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert op.cancelled and purgatory.num_delayed == 0
    assert box.completed == []


async def test_an_operation_cancelled_by_the_application_is_reported_as_such() -> None:
    connection = FakeConnection()
    async with Purgatory("p") as purgatory:
        waiter = asyncio.ensure_future(
            watch_until_disconnected(purgatory, WaitForValue(Box(), 10.0), ["k"], connection)
        )
        await wait_until(lambda: purgatory.num_delayed == 1)
        purgatory.cancel_for_key("k")
        with pytest.raises(OperationCancelled):
            await waiter


async def test_a_closed_purgatory_refuses_the_wait() -> None:
    purgatory = Purgatory("p")
    await purgatory.shutdown()
    with pytest.raises(PurgatoryClosed):
        await watch_until_disconnected(purgatory, WaitForValue(Box(), 1.0), ["k"], FakeConnection())


# -- cancel_on_disconnect ------------------------------------------------------------------------


async def test_disconnection_cancels_the_block_and_raises_client_disconnected() -> None:
    connection = FakeConnection()
    reached_end = False

    async def handler() -> None:
        nonlocal reached_end
        async with cancel_on_disconnect(connection):
            await asyncio.Event().wait()
        reached_end = True

    task = asyncio.ensure_future(handler())
    await wait_until(lambda: connection.subscriptions == 1)
    connection.disconnect()
    with pytest.raises(ClientDisconnected):
        await task
    assert not reached_end
    assert connection.callbacks == []


async def test_an_outside_cancellation_passes_through_the_block() -> None:
    connection = FakeConnection()

    async def handler() -> None:
        async with cancel_on_disconnect(connection):
            await asyncio.Event().wait()

    task = asyncio.ensure_future(handler())
    await wait_until(lambda: connection.subscriptions == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_block_that_finishes_stops_listening() -> None:
    connection = FakeConnection()
    async with cancel_on_disconnect(connection):
        await asyncio.sleep(0)
    assert connection.callbacks == []


async def test_purgatory_watch_and_wait_inside_the_block_withdraws_its_operation() -> None:
    box, connection = Box(), FakeConnection()
    op = WaitForValue(box, 10.0)
    async with Purgatory("p") as purgatory:

        async def handler() -> str:
            async with cancel_on_disconnect(connection):
                return await purgatory.watch_and_wait(op, ["k"])

        task = asyncio.ensure_future(handler())
        await wait_until(lambda: purgatory.num_delayed == 1)
        connection.disconnect()
        with pytest.raises(ClientDisconnected):
            await task
        assert op.cancelled and purgatory.num_delayed == 0
    assert box.completed == []


# -- request ids -----------------------------------------------------------------------------


def test_a_plain_client_request_id_is_kept() -> None:
    assert make_request_id("req-42.a:b") == "req-42.a:b"


@pytest.mark.parametrize("supplied", [None, "", "x" * 129, "two words", "line\nbreak", "ü"])
def test_an_unusable_client_request_id_is_replaced(supplied: str | None) -> None:
    generated = make_request_id(supplied)
    assert generated != supplied and len(generated) == 32
