"""Streams served to real clients: Server-Sent Events (``value_events``) from FastAPI under
uvicorn, read with httpx's streaming client, and from aiohttp, read with aiohttp's client;
WebSockets from both, read with the websockets client and aiohttp's. Clients that leave,
idle or not, release what their stream watched; a server that stops ends every open stream
at once; many clients each get every maximum once, in order; a reconnecting client resumes
after its Last-Event-ID."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
import pytest
from aiohttp import web
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import StreamingResponse
from http_support import HANG_GUARD, serve_aiohttp, serve_asgi, wait_until
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from purgatory_aio import Purgatory
from purgatory_aio.fanout import Fanout, MemoryFanout, ValueStream
from purgatory_aio.integrations.aiohttp import get_fanout as aiohttp_fanout
from purgatory_aio.integrations.aiohttp import get_purgatory, setup_purgatories
from purgatory_aio.integrations.aiohttp import value_events as aiohttp_value_events
from purgatory_aio.integrations.fastapi import (
    PurgatoryLifespan,
    get_fanout,
    get_purgatories,
    value_events,
)


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

    @app.get("/progress/{key}")
    async def progress(request: Request, key: str) -> StreamingResponse:
        return await value_events(request, key, timeout=HANG_GUARD)

    @app.websocket("/ws/{key}")
    async def progress_ws(websocket: WebSocket, key: str) -> None:
        purgatory = (await get_purgatories(websocket)).only()
        values = get_fanout(websocket).stream(purgatory, key, timeout=HANG_GUARD)
        await websocket.accept()

        async def until_closed() -> None:
            while (await websocket.receive())["type"] != "websocket.disconnect":
                pass

        await push_until_closed(values, websocket.send_json, websocket.close, until_closed)

    return app


def aiohttp_app(purgatory: Purgatory, fanout: Fanout) -> web.Application:
    """Server-Sent Events at ``/events/{key}``, a WebSocket at ``/progress/{key}``."""

    async def events(request: web.Request) -> web.StreamResponse:
        return await aiohttp_value_events(request, request.match_info["key"], timeout=HANG_GUARD)

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
    app.router.add_get("/events/{key}", events)
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
    async with serve_aiohttp(aiohttp_app(purgatory, fanout)) as served:
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


async def test_aiohttp_events_resume_after_the_last_id_and_end_for_clients_that_leave() -> None:
    purgatory, fanout = Purgatory("progress"), MemoryFanout()
    async with (
        serve_aiohttp(aiohttp_app(purgatory, fanout)) as served,
        aiohttp.ClientSession(served.url) as session,
    ):
        fanout.advance("job", 1)
        async with session.get("/events/job", headers={"Last-Event-ID": "1.0"}) as response:
            assert response.headers["Content-Type"] == "text/event-stream"
            assert response.headers["Cache-Control"] == "no-cache"
            await wait_until(lambda: purgatory.num_delayed == 2, "the stream to wait")
            fanout.advance("job", 2.5)
            async with asyncio.timeout(HANG_GUARD):
                event = [(await response.content.readline()).decode() for _ in range(3)]
            assert event == ["id: 2.5\n", "data: 2.5\n", "\n"]
        # The client left while the stream waited for a value: released at once.
        await wait_until(lambda: purgatory.num_delayed == 0, "the stream to be released")
        for bad in ("one", "nan", "inf"):
            async with session.get("/events/job", headers={"Last-Event-ID": bad}) as refused:
                assert refused.status == 400
                assert "Last-Event-ID" in await refused.text()
        assert purgatory.num_delayed == 0
        await purgatory.shutdown()
        async with session.get("/events/job") as closed:
            assert closed.status == 503


async def test_stopping_the_aiohttp_server_ends_every_open_stream() -> None:
    purgatory, fanout = Purgatory("progress"), MemoryFanout()
    async with (
        serve_aiohttp(aiohttp_app(purgatory, fanout)) as served,
        aiohttp.ClientSession(served.url) as session,
    ):
        sockets = [await session.ws_connect("/progress/job") for _ in range(3)]
        responses = [await session.get("/events/job") for _ in range(3)]
        await wait_until(lambda: purgatory.num_delayed == 12, "the streams to wait")
        await served.stop()
        async with asyncio.timeout(HANG_GUARD):
            for ws in sockets:
                message = await ws.receive()
                assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            for response in responses:
                assert await response.read() == b""  # ended, with nothing to send
                response.release()
        assert purgatory.closed and purgatory.num_delayed == 0


async def test_fastapi_events_refuse_a_bad_last_id_and_a_stopped_purgatory() -> None:
    purgatory, fanout = Purgatory("progress"), MemoryFanout()
    async with (
        serve_asgi(fastapi_app(purgatory, fanout)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        refused = await client.get("/progress/job", headers={"last-event-id": "nan"})
        assert refused.status_code == 400 and "Last-Event-ID" in refused.text
        assert purgatory.num_delayed == 0
        fanout.advance("job", 4)
        async with client.stream("GET", "/progress/job", headers={"last-event-id": "3"}) as events:
            assert events.headers["x-accel-buffering"] == "no"
            lines = events.aiter_lines()
            assert [await anext(lines) for _ in range(2)] == ["id: 4.0", "data: 4.0"]
        await purgatory.shutdown()
        assert (await client.get("/progress/job")).status_code == 503
