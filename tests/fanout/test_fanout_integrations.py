"""The FastAPI lifespan and aiohttp's cleanup_ctx run the fan-out with the purgatories."""

from __future__ import annotations

import asyncio

from aiohttp import web
from fastapi import FastAPI

from purgatory_aio import Purgatory
from purgatory_aio.fanout import MemoryFanout, MemoryHub
from purgatory_aio.integrations.aiohttp import FANOUT, setup_purgatories
from purgatory_aio.integrations.fastapi import PurgatoryLifespan


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
