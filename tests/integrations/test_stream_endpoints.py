"""Streams served to real clients: Server-Sent Events from FastAPI under uvicorn (read with
httpx's streaming client) and WebSockets from aiohttp (read with aiohttp's client). Clients
that leave, idle or not, release what their stream watched; a server that stops ends every
open stream at once; many clients each get every maximum once, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import httpx
import pytest
from aiohttp import web
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import StreamingResponse
from http_support import HANG_GUARD, serve_aiohttp, serve_asgi, wait_until
from starlette.requests import HTTPConnection
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from purgatory_aio import Purgatory
from purgatory_aio.fanout import Fanout, MemoryFanout, ValueStream
from purgatory_aio.integrations.aiohttp import get_fanout as aiohttp_fanout
from purgatory_aio.integrations.aiohttp import get_purgatory, setup_purgatories
from purgatory_aio.integrations.fastapi import PurgatoryLifespan, get_fanout, get_purgatories


async def push_until_closed(
    values: ValueStream,
    send: Callable[[float], Awaitable[object]],
    close: Callable[[], Awaitable[object]],
    until_closed: Callable[[], Awaitable[object]],
) -> None:
    """The WebSocket handlers' shape: push the stream's values while reading the client
    until it closes; whichever ends first ends the other (and releases the stream)."""

    async def push() -> None:
        async with values:
            async for value in values:
                await send(value)
        await close()

    pushing = asyncio.create_task(push())
    try:
        await until_closed()
    finally:
        pushing.cancel()
        await asyncio.gather(pushing, return_exceptions=True)


def fastapi_app(purgatory: Purgatory, fanout: Fanout) -> FastAPI:
    """Server-Sent Events at ``/progress/{key}``, a WebSocket at ``/ws/{key}``."""
    app = FastAPI(lifespan=PurgatoryLifespan(purgatory, fanout=fanout))

    async def stream_of(connection: HTTPConnection, key: str) -> ValueStream:
        purgatory = (await get_purgatories(connection)).only()
        return get_fanout(connection).stream(purgatory, key, timeout=HANG_GUARD)

    @app.get("/progress/{key}")
    async def progress(request: Request, key: str) -> StreamingResponse:
        values = await stream_of(request, key)

        async def events() -> AsyncIterator[str]:
            async with values:
                async for value in values:
                    yield f"data: {value:g}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.websocket("/ws/{key}")
    async def progress_ws(websocket: WebSocket, key: str) -> None:
        values = await stream_of(websocket, key)
        await websocket.accept()

        async def until_closed() -> None:
            while (await websocket.receive())["type"] != "websocket.disconnect":
                pass

        await push_until_closed(values, websocket.send_json, websocket.close, until_closed)

    return app


def ws_app(purgatory: Purgatory, fanout: Fanout) -> web.Application:
    async def progress(request: web.Request) -> web.WebSocketResponse:
        values = aiohttp_fanout(request).stream(
            get_purgatory(request), request.match_info["key"], timeout=HANG_GUARD
        )
        ws = web.WebSocketResponse()
        await ws.prepare(request)

        async def until_closed() -> None:
            async for _message in ws:
                pass

        await push_until_closed(values, ws.send_json, ws.close, until_closed)
        return ws

    app = web.Application()
    setup_purgatories(app, purgatory, fanout=fanout)
    app.router.add_get("/progress/{key}", progress)
    return app


async def read_events(response: httpx.Response, into: list[float], last: float) -> None:
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            into.append(float(line.removeprefix("data: ")))
            if into[-1] == last:
                return


async def test_sse_clients_each_get_every_maximum_once_in_order() -> None:
    purgatory, fanout = Purgatory("progress"), MemoryFanout()
    async with (
        serve_asgi(fastapi_app(purgatory, fanout)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        seen: list[list[float]] = [[] for _ in range(10)]

        async def listen(into: list[float]) -> None:
            async with client.stream("GET", "/progress/job") as response:
                await read_events(response, into, 30.0)

        listeners = [asyncio.create_task(listen(into)) for into in seen]
        await wait_until(lambda: purgatory.num_delayed == 20, "every stream to wait")
        for value in range(1, 31):
            fanout.advance("job", value)
            fanout.advance("job", value - 0.5)  # lower: never sent
            if value % 4 == 0:
                await asyncio.sleep(0.001)
        async with asyncio.timeout(HANG_GUARD):
            await asyncio.gather(*listeners)
        for into in seen:
            assert into == sorted(set(into)) and into[-1] == 30.0
        await wait_until(lambda: purgatory.num_delayed == 0, "the streams to be released")


async def test_an_sse_client_leaving_an_idle_stream_releases_it() -> None:
    purgatory, fanout = Purgatory("progress"), MemoryFanout()
    async with (
        serve_asgi(fastapi_app(purgatory, fanout)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        async with client.stream("GET", "/progress/idle") as response:
            assert response.status_code == 200
            await wait_until(lambda: purgatory.num_delayed == 2, "the stream to wait")
        # Gone before any value came: uvicorn reports the disconnection, Starlette cancels.
        await wait_until(lambda: purgatory.num_delayed == 0, "the stream to be released")
        assert purgatory.stats().completed == 0


async def test_stopping_the_server_ends_every_open_sse_stream() -> None:
    purgatory, fanout = Purgatory("progress"), MemoryFanout()
    async with (
        serve_asgi(fastapi_app(purgatory, fanout)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        ended = asyncio.Event()

        async def listen() -> list[float]:
            into: list[float] = []
            async with client.stream("GET", "/progress/job") as response:
                await read_events(response, into, float("inf"))  # until the server ends it
            ended.set()
            return into

        listening = asyncio.create_task(listen())
        await wait_until(lambda: purgatory.num_delayed == 2, "the stream to wait")
        fanout.advance("job", 1)
        await served.stop()  # settles the purgatories first: the stream ends
        async with asyncio.timeout(HANG_GUARD):
            assert await listening == [1.0]
        assert ended.is_set() and purgatory.closed
        assert purgatory.stats().shutdown == 2


async def test_websocket_clients_get_values_and_leaving_abruptly_releases_the_stream() -> None:
    purgatory, fanout = Purgatory("progress"), MemoryFanout()
    async with serve_aiohttp(ws_app(purgatory, fanout)) as served:
        session = aiohttp.ClientSession(served.url)
        ws = await session.ws_connect("/progress/job")
        await wait_until(lambda: purgatory.num_delayed == 2, "the stream to wait")
        fanout.advance("job", 1)
        fanout.advance("job", 1)
        fanout.advance("job", 2)
        async with asyncio.timeout(HANG_GUARD):
            got = [await ws.receive_json()]
            if got[-1] != 2.0:
                got.append(await ws.receive_json())
        assert got in ([1.0, 2.0], [2.0])
        # The client goes without a closing handshake: its connections are just closed.
        await session.close()
        await wait_until(lambda: purgatory.num_delayed == 0, "the stream to be released")


async def test_stopping_the_aiohttp_server_closes_every_open_websocket() -> None:
    purgatory, fanout = Purgatory("progress"), MemoryFanout()
    async with (
        serve_aiohttp(ws_app(purgatory, fanout)) as served,
        aiohttp.ClientSession(served.url) as session,
    ):
        sockets = [await session.ws_connect("/progress/job") for _ in range(3)]
        await wait_until(lambda: purgatory.num_delayed == 6, "the streams to wait")
        await served.stop()
        async with asyncio.timeout(HANG_GUARD):
            for ws in sockets:
                message = await ws.receive()
                assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert purgatory.closed and purgatory.num_delayed == 0


async def test_fastapi_websockets_end_with_the_server_and_release_clients_that_leave() -> None:
    purgatory, fanout = Purgatory("progress"), MemoryFanout()
    async with serve_asgi(fastapi_app(purgatory, fanout)) as served:
        base = served.url.replace("http://", "ws://")
        leaving = await connect(f"{base}/ws/job")
        await wait_until(lambda: purgatory.num_delayed == 2, "the stream to wait")
        fanout.advance("job", 3)
        async with asyncio.timeout(HANG_GUARD):
            assert await leaving.recv() == "3.0"
        await leaving.close()
        await wait_until(lambda: purgatory.num_delayed == 0, "the stream to be released")
        staying = [await connect(f"{base}/ws/job") for _ in range(3)]
        await wait_until(lambda: purgatory.num_delayed == 6, "the streams to wait")
        await served.stop()
        async with asyncio.timeout(HANG_GUARD):
            for ws in staying:
                with pytest.raises(ConnectionClosed):
                    while True:
                        await ws.recv()  # the current value first, then the close
        assert purgatory.closed and purgatory.num_delayed == 0
