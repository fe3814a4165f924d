"""The FastAPI lifespan and aiohttp's cleanup_ctx run the fan-out with the purgatories."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from aiohttp import web
from fanout_support import HANG_GUARD, until
from fastapi import FastAPI, Request
from http_support import serve_aiohttp, serve_asgi

from purgatory_aio import Purgatory
from purgatory_aio.fanout import FanoutUnavailable, MemoryFanout, MemoryHub
from purgatory_aio.integrations.aiohttp import FANOUT, setup_purgatories
from purgatory_aio.integrations.aiohttp import wait_for_value as aiohttp_wait_for_value
from purgatory_aio.integrations.fastapi import OneLineStartupErrors, PurgatoryLifespan
from purgatory_aio.integrations.fastapi import wait_for_value as fastapi_wait_for_value


async def test_fastapi_lifespan_runs_the_fanout_inside_the_purgatories() -> None:
    hub = MemoryHub()
    purgatory, fanout = Purgatory("acks"), MemoryFanout(hub)
    app = FastAPI()
    async with MemoryFanout(hub) as other, PurgatoryLifespan(purgatory, fanout=fanout)(app):
        assert app.state.fanout is fanout and fanout.stats().connected
        assert fanout.purgatories == (purgatory,)
        wait = asyncio.create_task(fanout.wait_for_value(purgatory, "job:1", 1, 30))
        await asyncio.sleep(0)
        other.advance("job:1", 1)
        assert await wait == 1.0
    assert not fanout.stats().connected and purgatory.closed


async def test_aiohttp_cleanup_ctx_runs_the_fanout_inside_the_purgatories() -> None:
    purgatory, fanout = Purgatory("acks"), MemoryFanout()
    app = web.Application()
    setup_purgatories(app, purgatory, fanout=fanout)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        assert app[FANOUT] is fanout and fanout.stats().connected
        assert fanout.purgatories == (purgatory,)
    finally:
        await runner.cleanup()
    assert not fanout.stats().connected and purgatory.closed


# -- the fan-out's waits in request handlers: withdrawn when the client goes away ----------------


def fastapi_app(purgatory: Purgatory, fanout: MemoryFanout) -> FastAPI:
    app = FastAPI(lifespan=PurgatoryLifespan(purgatory, fanout=fanout))

    @app.get("/wait/{job}")
    async def wait(request: Request, job: str) -> float | None:
        return await fastapi_wait_for_value(request, job, 1, 30)

    return app


def aiohttp_app(purgatory: Purgatory, fanout: MemoryFanout) -> web.Application:
    app = web.Application()
    setup_purgatories(app, purgatory, fanout=fanout)

    async def wait(request: web.Request) -> web.Response:
        value = await aiohttp_wait_for_value(request, request.match_info["job"], 1, 30)
        return web.json_response(value)

    app.router.add_get("/wait/{job}", wait)
    return app


async def assert_withdrawn_then_answered(
    purgatory: Purgatory, fanout: MemoryFanout, base: str
) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD) as client:
        poll = asyncio.ensure_future(client.get("/wait/gone"))
        await until(lambda: purgatory.num_delayed == 1)
        poll.cancel()  # the client goes away
        await until(lambda: purgatory.num_delayed == 0)
        assert purgatory.stats().cancelled == 1 and purgatory.stats().completed == 0
        answered = asyncio.ensure_future(client.get("/wait/there"))
        await until(lambda: purgatory.num_delayed == 1)
        fanout.advance("there", 3)
        assert (await answered).json() == 3.0


async def test_a_fanout_wait_in_fastapi_is_withdrawn_when_the_client_disconnects() -> None:
    purgatory, fanout = Purgatory("acks"), MemoryFanout()
    async with serve_asgi(fastapi_app(purgatory, fanout)) as served:
        await assert_withdrawn_then_answered(purgatory, fanout, served.url)


async def test_a_fanout_wait_in_aiohttp_is_withdrawn_when_the_client_disconnects() -> None:
    purgatory, fanout = Purgatory("acks"), MemoryFanout()
    async with serve_aiohttp(aiohttp_app(purgatory, fanout)) as served:
        await assert_withdrawn_then_answered(purgatory, fanout, served.url)


async def startup_report(failure: BaseException | None) -> list[dict[str, Any]]:
    """What a FastAPI app with OneLineStartupErrors sends the server at start-up, when its
    lifespan raises ``failure`` (None: it starts)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if failure is not None:
            raise failure
        yield

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(OneLineStartupErrors)
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: Any) -> None:
        sent.append(dict(message))

    with contextlib.suppress(Exception):
        await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    return sent


async def test_a_fanout_that_cannot_start_is_reported_to_the_server_in_one_line() -> None:
    unavailable = FanoutUnavailable("Redis at redis://:***@127.0.0.1:1/0 refused the connection")
    assert await startup_report(unavailable) == [
        {"type": "lifespan.startup.failed", "message": f"FanoutUnavailable: {unavailable}"}
    ]
    # Anything else keeps its traceback; a start is untouched.
    (other,) = await startup_report(RuntimeError("a bug"))
    assert other["type"] == "lifespan.startup.failed"
    assert "Traceback" in other["message"] and "RuntimeError: a bug" in other["message"]
    assert [m["type"] for m in await startup_report(None)] == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
    ]
