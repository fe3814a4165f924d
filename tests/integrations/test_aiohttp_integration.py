"""purgatory_aio.integrations.aiohttp against a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from http_support import (
    HANG_GUARD,
    Box,
    WaitForValue,
    assert_disconnect_withdraws,
    serve_aiohttp,
    wait_until,
)
from prometheus_client import CollectorRegistry

from purgatory_aio import Purgatory
from purgatory_aio.integrations.aiohttp import (
    PURGATORIES,
    cancel_on_disconnect,
    get_purgatory,
    metrics_handler,
    on_disconnect,
    purgatory_key,
    request_context_middleware,
    setup_purgatories,
    watch_and_wait,
)
from purgatory_aio.metrics import register_purgatories

FETCH = purgatory_key("fetch")


def make_app(purgatory: Purgatory, box: Box) -> web.Application:
    app = web.Application(middlewares=[request_context_middleware])
    setup_purgatories(app, purgatory)

    async def wait(request: web.Request) -> web.Response:
        timeout = float(request.query.get("timeout", "10"))
        op = WaitForValue(box, timeout)
        return web.json_response(await watch_and_wait(request, request.app[FETCH], op, ["k"]))

    async def wait_after_body(request: web.Request) -> web.Response:
        await request.json()
        op = WaitForValue(box, 10.0)
        return web.json_response(await watch_and_wait(request, get_purgatory(request), op, ["k"]))

    async def scoped(request: web.Request) -> web.Response:
        async with cancel_on_disconnect(request):
            result = await request.app[FETCH].watch_and_wait(WaitForValue(box, 10.0), ["k"])
        return web.json_response(result)

    app.router.add_get("/wait", wait)
    app.router.add_post("/wait", wait_after_body)
    app.router.add_get("/scoped", scoped)
    return app


@pytest.fixture
def box() -> Box:
    return Box()


async def get_json(session: aiohttp.ClientSession, url: str, **kwargs: Any) -> Any:
    async with session.get(url, **kwargs) as response:
        return response.status, await response.json()


def test_setup_publishes_each_purgatory_under_its_app_key() -> None:
    fetch, produce = Purgatory("fetch"), Purgatory("produce")
    app = web.Application()
    registry = setup_purgatories(app, fetch)
    setup_purgatories(app, produce)
    assert app[FETCH] is fetch and app[purgatory_key("produce")] is produce
    assert app[PURGATORIES] is registry and list(registry) == [fetch, produce]
    assert len(app.cleanup_ctx) == 1 and len(app.on_shutdown) == 1


async def test_the_application_starts_and_shuts_down_the_purgatories(box: Box) -> None:
    purgatory = Purgatory("fetch")
    async with (
        serve_aiohttp(make_app(purgatory, box)) as served,
        aiohttp.ClientSession(served.url) as session,
    ):
        assert await get_json(session, "/wait?timeout=0") == (200, "timeout")
        assert not purgatory.closed
    assert purgatory.closed


async def test_a_long_poll_answers_when_the_value_arrives(box: Box) -> None:
    purgatory = Purgatory("fetch")
    async with (
        serve_aiohttp(make_app(purgatory, box)) as served,
        aiohttp.ClientSession(served.url) as session,
    ):
        poll = asyncio.ensure_future(get_json(session, "/wait"))
        await wait_until(lambda: purgatory.num_delayed == 1)
        box.value = "data"
        purgatory.check_and_complete("k")
        assert await poll == (200, "data")


@pytest.mark.parametrize("handler_cancellation", [False, True])
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_client_disconnecting_mid_poll_leaves_nothing_pending(
    box: Box, method: str, handler_cancellation: bool
) -> None:
    purgatory = Purgatory("fetch")
    app = make_app(purgatory, box)
    async with (
        serve_aiohttp(app, handler_cancellation=handler_cancellation) as served,
        aiohttp.ClientSession(served.url) as session,
    ):
        await assert_disconnect_withdraws(
            purgatory, box, session.request(method, "/wait", json={"a": 1})
        )


async def test_a_kept_alive_connection_serves_polls_after_a_withdrawn_one(box: Box) -> None:
    purgatory = Purgatory("fetch")
    async with serve_aiohttp(make_app(purgatory, box)) as served:
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(served.url, connector=connector) as session:
            for value in ("one", "two"):
                poll = asyncio.ensure_future(get_json(session, "/wait"))
                await wait_until(lambda: purgatory.num_delayed == 1)
                box.value = value
                purgatory.check_and_complete("k")
                assert await poll == (200, value)
                box.value = None
        assert purgatory.stats().cancelled == 0


async def test_cancel_on_disconnect_withdraws_an_operation_awaited_inside(box: Box) -> None:
    purgatory = Purgatory("fetch")
    async with (
        serve_aiohttp(make_app(purgatory, box)) as served,
        aiohttp.ClientSession(served.url) as session,
    ):
        await assert_disconnect_withdraws(purgatory, box, session.get("/scoped"))


async def test_server_shutdown_answers_every_pending_poll_at_once(box: Box) -> None:
    purgatory = Purgatory("fetch")
    async with (
        serve_aiohttp(make_app(purgatory, box)) as served,
        aiohttp.ClientSession(served.url) as session,
    ):
        # Deadlines far beyond the hang guard: only shutdown can answer in time.
        polls = [asyncio.ensure_future(get_json(session, "/wait?timeout=3600")) for _ in range(20)]
        await wait_until(lambda: purgatory.num_delayed == 20)
        await served.stop()
        answers = await asyncio.wait_for(asyncio.gather(*polls), HANG_GUARD)
    assert answers == [(200, "timeout")] * 20


async def test_a_shut_down_purgatory_answers_503(box: Box) -> None:
    purgatory = Purgatory("fetch")
    async with serve_aiohttp(make_app(purgatory, box)) as served:
        await purgatory.shutdown()
        async with (
            aiohttp.ClientSession(served.url) as session,
            session.get("/wait") as response,
        ):
            assert response.status == 503


async def test_request_context_is_bound_for_the_handler_and_echoed(box: Box) -> None:
    seen: list[dict[str, Any]] = []
    app = make_app(Purgatory("fetch"), box)

    async def context(request: web.Request) -> web.Response:
        seen.append(structlog.contextvars.get_contextvars())
        return web.Response()

    async def missing(request: web.Request) -> web.Response:
        raise web.HTTPNotFound()

    app.router.add_get("/context", context)
    app.router.add_get("/missing", missing)
    async with (
        serve_aiohttp(app) as served,
        aiohttp.ClientSession(served.url) as session,
        session.get("/context", headers={"X-Request-ID": "abc-1"}) as supplied,
    ):
        assert supplied.headers["X-Request-ID"] == "abc-1"
        async with session.get("/missing") as failed:
            assert failed.status == 404 and len(failed.headers["X-Request-ID"]) == 32
    assert seen == [{"method": "GET", "path": "/context", "request_id": "abc-1"}]


async def test_the_metrics_handler_serves_purgatory_gauges(box: Box) -> None:
    purgatory = Purgatory("fetch")
    registry = CollectorRegistry()
    register_purgatories([purgatory], registry)
    app = make_app(purgatory, box)
    app.router.add_get("/metrics", metrics_handler(registry))
    async with serve_aiohttp(app) as served, aiohttp.ClientSession(served.url) as session:
        poll = asyncio.ensure_future(session.get("/wait"))
        await wait_until(lambda: purgatory.num_delayed == 1)
        async with session.get("/metrics") as response:
            text = await response.text()
            assert response.headers["Content-Type"].startswith("text/plain")
        poll.cancel()
    assert 'purgatory_delayed_operations{purgatory="fetch"} 1.0' in text
    assert 'purgatory_watch_keys{purgatory="fetch"} 1.0' in text


class GoneRequest:
    """A request whose connection was already lost (aiohttp clears the transport)."""

    transport = None


def test_a_request_whose_connection_is_gone_reports_disconnection_at_once() -> None:
    calls: list[str] = []
    unsubscribe = on_disconnect(GoneRequest())(lambda: calls.append("gone"))  # type: ignore[arg-type]
    unsubscribe()
    assert calls == ["gone"]
