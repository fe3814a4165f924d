"""purgatory_aio.integrations.fastapi against a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import httpx
import pytest
import structlog
import uvicorn
from fastapi import Depends, FastAPI, Request
from http_support import (
    HANG_GUARD,
    Box,
    WaitForValue,
    assert_disconnect_withdraws,
    serve_asgi,
    wait_until,
)
from prometheus_client import CollectorRegistry

from purgatory_aio import Purgatory
from purgatory_aio.integrations.fastapi import (
    PurgatoryLifespan,
    RequestContextMiddleware,
    cancel_on_disconnect,
    metrics_endpoint,
    purgatory_dependency,
    watch_and_wait,
)
from purgatory_aio.metrics import register_purgatories

FetchPurgatory = Annotated[Purgatory, Depends(purgatory_dependency("fetch"))]


def make_app(purgatory: Purgatory, box: Box, **lifespan: Any) -> FastAPI:
    app = FastAPI(lifespan=PurgatoryLifespan(purgatory, **lifespan))

    @app.get("/wait")
    async def wait(request: Request, purgatory: FetchPurgatory, seconds: float = 10.0) -> str:
        return await watch_and_wait(request, purgatory, WaitForValue(box, seconds), ["k"])

    @app.post("/wait")
    async def wait_after_body(request: Request, purgatory: FetchPurgatory) -> str:
        await request.json()
        return await watch_and_wait(request, purgatory, WaitForValue(box, 10.0), ["k"])

    @app.get("/scoped")
    async def scoped(request: Request, purgatory: FetchPurgatory) -> str:
        async with cancel_on_disconnect(request):
            return await purgatory.watch_and_wait(WaitForValue(box, 10.0), ["k"])

    return app


@pytest.fixture
def box() -> Box:
    return Box()


async def test_the_lifespan_starts_and_shuts_down_the_purgatories(box: Box) -> None:
    purgatory = Purgatory("fetch")
    async with (
        serve_asgi(make_app(purgatory, box)) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        assert (await client.get("/wait", params={"seconds": 0})).json() == "timeout"
        assert not purgatory.closed
    assert purgatory.closed


async def test_the_lifespan_wraps_the_applications_own_lifespan(box: Box) -> None:
    purgatory = Purgatory("fetch")
    events: list[str] = []

    @asynccontextmanager
    async def own(app: FastAPI) -> AsyncIterator[dict[str, str]]:
        events.append(f"start, purgatory closed={purgatory.closed}")
        yield {"greeting": "hello"}
        events.append(f"stop, purgatory closed={purgatory.closed}")

    app = make_app(purgatory, box, lifespan=own)

    @app.get("/greeting")
    async def greeting(request: Request) -> str:
        return str(request.state.greeting)

    # Plain uvicorn: purgatory_aio's Server would settle the purgatories before the lifespan ends.
    async with (
        serve_asgi(app, uvicorn.Server) as served,
        httpx.AsyncClient(base_url=served.url) as client,
    ):
        assert (await client.get("/greeting")).json() == "hello"
    assert events == ["start, purgatory closed=False", "stop, purgatory closed=False"]
    assert purgatory.closed


async def test_a_long_poll_answers_when_the_value_arrives(box: Box) -> None:
    purgatory = Purgatory("fetch")
    async with (
        serve_asgi(make_app(purgatory, box)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        poll = asyncio.ensure_future(client.get("/wait"))
        await wait_until(lambda: purgatory.num_delayed == 1)
        box.value = "data"
        purgatory.check_and_complete("k")
        assert (await poll).json() == "data"


async def test_the_purgatory_dependency_can_be_overridden(box: Box) -> None:
    app = make_app(Purgatory("fetch"), box)
    replacement = Purgatory("replacement")
    app.dependency_overrides[purgatory_dependency("fetch")] = lambda: replacement
    async with (
        serve_asgi(app) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        poll = asyncio.ensure_future(client.get("/wait"))
        await wait_until(lambda: replacement.num_delayed == 1)
        box.value = "via override"
        replacement.check_and_complete("k")
        assert (await poll).json() == "via override"
    await replacement.shutdown()


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_client_disconnecting_mid_poll_leaves_nothing_pending(
    box: Box, method: str
) -> None:
    purgatory = Purgatory("fetch")
    async with (
        serve_asgi(make_app(purgatory, box)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        await assert_disconnect_withdraws(
            purgatory, box, client.request(method, "/wait", json={"a": 1})
        )


async def test_cancel_on_disconnect_withdraws_an_operation_awaited_inside(box: Box) -> None:
    purgatory = Purgatory("fetch")
    async with (
        serve_asgi(make_app(purgatory, box)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        await assert_disconnect_withdraws(purgatory, box, client.get("/scoped"))


async def test_server_shutdown_answers_every_pending_poll_at_once(box: Box) -> None:
    purgatory = Purgatory("fetch")
    async with (
        serve_asgi(make_app(purgatory, box)) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        # Deadlines far beyond the hang guard: only shutdown can answer in time.
        polls = [
            asyncio.ensure_future(client.get("/wait", params={"seconds": 3600})) for _ in range(20)
        ]
        await wait_until(lambda: purgatory.num_delayed == 20)
        await served.stop()
        answers = await asyncio.gather(*polls)
    assert [(r.status_code, r.json()) for r in answers] == [(200, "timeout")] * 20


async def test_a_shut_down_purgatory_answers_503(box: Box) -> None:
    purgatory = Purgatory("fetch")
    async with serve_asgi(make_app(purgatory, box)) as served:
        await purgatory.shutdown()
        async with httpx.AsyncClient(base_url=served.url) as client:
            response = await client.get("/wait")
    assert response.status_code == 503


async def test_request_context_is_bound_for_the_handler_and_echoed(box: Box) -> None:
    seen: list[dict[str, Any]] = []
    app = make_app(Purgatory("fetch"), box)
    app.add_middleware(RequestContextMiddleware)

    @app.get("/context")
    async def context() -> None:
        seen.append(structlog.contextvars.get_contextvars())

    async with serve_asgi(app) as served, httpx.AsyncClient(base_url=served.url) as client:
        supplied = await client.get("/context", headers={"X-Request-ID": "abc-1"})
        generated = await client.get("/context")
    assert seen[0] == {"method": "GET", "path": "/context", "request_id": "abc-1"}
    assert supplied.headers["x-request-id"] == "abc-1"
    assert generated.headers["x-request-id"] == seen[1]["request_id"]
    assert structlog.contextvars.get_contextvars() == {}


async def test_the_metrics_endpoint_serves_purgatory_gauges(box: Box) -> None:
    purgatory = Purgatory("fetch")
    registry = CollectorRegistry()
    register_purgatories([purgatory], registry)
    app = make_app(purgatory, box)
    app.add_api_route("/metrics", metrics_endpoint(registry))
    async with (
        serve_asgi(app) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        poll = asyncio.ensure_future(client.get("/wait"))
        await wait_until(lambda: purgatory.num_delayed == 1)
        text = (await client.get("/metrics")).text
        poll.cancel()
    assert 'purgatory_delayed_operations{purgatory="fetch"} 1.0' in text
    assert 'purgatory_size{purgatory="fetch"} 1.0' in text
