"""Readiness for probes: the neutral check, the FastAPI route and the aiohttp handler, each
answering 200 only while the purgatories run and the fan-out is connected with room in its
queue, and 503 with a body naming each problem otherwise."""

from __future__ import annotations

from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from fastapi import FastAPI
from http_support import serve_aiohttp, serve_asgi

from purgatory_aio import Purgatory
from purgatory_aio.fanout import Fanout, MemoryFanout, MemoryHub
from purgatory_aio.fanout._memory import MemoryBackend
from purgatory_aio.integrations import Readiness, readiness
from purgatory_aio.integrations.aiohttp import readiness_handler, setup_purgatories
from purgatory_aio.integrations.fastapi import PurgatoryLifespan, readiness_endpoint


def unstarted_fanout(queue_size: int = 4) -> Fanout:
    return Fanout(MemoryBackend(MemoryHub()), queue_size=queue_size)


async def test_running_purgatories_and_a_connected_fanout_are_ready() -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, MemoryFanout(None, a, b) as fanout:
        found = readiness([a, b], fanout)
        assert found == Readiness(
            True,
            (),
            {"a": "running", "b": "running"},
            {"connected": True, "queued": 0, "queue_size": 65536},
        )
        assert found.status == 200
        assert found.as_dict()["problems"] == []


async def test_each_problem_is_named() -> None:
    a = Purgatory("a")
    async with a:
        pass  # shut down
    fanout = unstarted_fanout(queue_size=4)
    for value in range(4):
        fanout.advance("k", value)  # queued, nobody to publish them yet
    found = readiness([a], fanout)
    assert not found.ready and found.status == 503
    assert found.problems == (
        "purgatory 'a' is shut down",
        "the fan-out's engine is not connected",
        "the fan-out's publish queue holds 4 of 4 events (the limit is 90%)",
    )
    assert found.purgatories == {"a": "shut down"}
    assert readiness(None).problems == (
        "the purgatories have not started (the application's startup has not run)",
    )
    assert readiness([]).problems == ("the application has no purgatories",)
    await fanout.stop()


async def test_the_queue_limit_is_a_share_of_the_queue() -> None:
    fanout = unstarted_fanout(queue_size=10)
    for value in range(5):
        fanout.advance("k", value)
    assert len(readiness([], fanout, queue_limit=0.6).problems) == 3 - 1
    assert len(readiness([], fanout, queue_limit=0.5).problems) == 3
    for bad in (0, 1.5, -1, True, "0.5", float("nan")):
        with pytest.raises(ValueError, match="queue_limit"):
            readiness([], fanout, queue_limit=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="queue_limit"):
            readiness_endpoint(queue_limit=bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="queue_limit"):
            readiness_handler(queue_limit=bad)  # type: ignore[arg-type]
    await fanout.stop()


async def test_the_fastapi_route_follows_the_lifespan() -> None:
    purgatory = Purgatory("acks")
    fanout = MemoryFanout()
    app = FastAPI(lifespan=PurgatoryLifespan(purgatory, fanout=fanout))
    app.add_api_route("/ready", readiness_endpoint(), include_in_schema=False)
    # No lifespan has run: not ready, and it says why.
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        early = await client.get("/ready")
    assert early.status_code == 503
    assert "have not started" in early.json()["problems"][0]
    async with serve_asgi(app) as served, httpx.AsyncClient(base_url=served.url) as client:
        ready = await client.get("/ready")
        assert ready.status_code == 200, ready.text
        assert ready.json() == {
            "ready": True,
            "problems": [],
            "purgatories": {"acks": "running"},
            "fanout": {"connected": True, "queued": 0, "queue_size": 65536},
        }
        assert ready.headers["cache-control"] == "no-store"
        await purgatory.shutdown()
        gone = await client.get("/ready")
        assert gone.status_code == 503
        assert gone.json()["problems"] == ["purgatory 'acks' is shut down"]


async def test_the_aiohttp_handler_follows_the_application() -> None:
    purgatory = Purgatory("acks")
    fanout = MemoryFanout()
    app = web.Application()
    setup_purgatories(app, purgatory, fanout=fanout)
    app.router.add_get("/ready", readiness_handler())
    async with serve_aiohttp(app) as served, aiohttp.ClientSession(served.url) as session:
        async with session.get("/ready") as ready:
            body: dict[str, Any] = await ready.json()
            assert ready.status == 200, body
        assert body["ready"] is True and body["fanout"]["connected"] is True
        await fanout.stop()
        async with session.get("/ready") as stopped:
            assert stopped.status == 503
            assert (await stopped.json())["problems"] == ["the fan-out's engine is not connected"]
    bare = web.Application()
    bare.router.add_get("/ready", readiness_handler())
    async with (
        serve_aiohttp(bare) as served,
        aiohttp.ClientSession(served.url) as session,
        session.get("/ready") as never,
    ):
        assert never.status == 503
        assert "have not started" in (await never.json())["problems"][0]
