"""The FastAPI dependencies run on the event loop, and say how to run the lifespan in tests."""

from __future__ import annotations

import inspect
import threading
from typing import Annotated

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient
from http_support import HANG_GUARD, serve_asgi

from purgatory_aio import Purgatory
from purgatory_aio.integrations import Purgatories
from purgatory_aio.integrations.fastapi import (
    PurgatoryLifespan,
    get_purgatories,
    purgatory_dependency,
)

FetchPurgatory = Annotated[Purgatory, Depends(purgatory_dependency("fetch"))]
OnlyPurgatory = Annotated[Purgatory, Depends(purgatory_dependency())]
Registry = Annotated[Purgatories, Depends(get_purgatories)]


class ThreadRecording(Purgatories):
    """The application's registry, noting the thread each lookup runs on."""

    __slots__ = ("threads",)

    def __init__(self, purgatories: Purgatories) -> None:
        super().__init__(purgatories)
        self.threads: list[int] = []

    def __getitem__(self, name: str) -> Purgatory:
        self.threads.append(threading.get_ident())
        return super().__getitem__(name)

    def only(self) -> Purgatory:
        self.threads.append(threading.get_ident())
        return super().only()


def make_app(lifespan: PurgatoryLifespan | None) -> FastAPI:
    app = FastAPI(lifespan=lifespan)

    @app.get("/name")
    async def name(purgatory: FetchPurgatory) -> str:
        return purgatory.name

    @app.get("/only")
    async def only(purgatory: OnlyPurgatory) -> str:
        return purgatory.name

    @app.get("/names")
    async def names(registry: Registry) -> list[str]:
        return list(registry.names)

    @app.get("/thread")
    async def thread() -> int:
        return threading.get_ident()

    return app


def test_every_dependency_is_a_coroutine_function() -> None:
    # FastAPI runs a plain `def` dependency in its thread pool: one thread hop per request.
    assert inspect.iscoroutinefunction(get_purgatories)
    for name in (None, "fetch"):
        assert inspect.iscoroutinefunction(purgatory_dependency(name))
        assert purgatory_dependency(name) is purgatory_dependency(name)  # overridable


async def test_the_purgatory_dependency_runs_on_the_loop_thread() -> None:
    app = make_app(PurgatoryLifespan(Purgatory("fetch")))
    async with (
        serve_asgi(app) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        recording = app.state.purgatories = ThreadRecording(app.state.purgatories)
        loop_thread = (await client.get("/thread")).json()
        assert loop_thread == threading.get_ident()  # uvicorn serves on this test's loop
        assert (await client.get("/name")).json() == "fetch"
        assert (await client.get("/only")).json() == "fetch"
        assert (await client.get("/names")).json() == ["fetch"]
    assert recording.threads == [loop_thread, loop_thread]


async def test_without_the_lifespan_run_the_error_says_how_to_run_it_in_tests() -> None:
    # httpx.ASGITransport sends no lifespan events: the application was given its
    # PurgatoryLifespan, which never ran.
    app = make_app(PurgatoryLifespan(Purgatory("fetch")))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for path in ("/name", "/only", "/names"):
            with pytest.raises(RuntimeError) as raised:
                await client.get(path)
            message = str(raised.value)
            assert "lifespan (PurgatoryLifespan) has not run" in message
            assert "with TestClient(app) as client:" in message
            assert "LifespanManager" in message
            assert "pass lifespan=" not in message


async def test_without_a_purgatory_lifespan_the_error_says_to_pass_one() -> None:
    transport = httpx.ASGITransport(app=make_app(None))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        with pytest.raises(RuntimeError, match=r"pass lifespan=PurgatoryLifespan\(\.\.\.\)"):
            await client.get("/name")


async def test_asgi_lifespan_runs_it_around_an_asgi_transport() -> None:
    purgatory = Purgatory("fetch")
    app = make_app(PurgatoryLifespan(purgatory))
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.get("/name")).json() == "fetch"
        assert not purgatory.closed
    assert purgatory.closed


def test_a_test_client_used_as_a_context_manager_runs_it() -> None:
    purgatory = Purgatory("fetch")
    with TestClient(make_app(PurgatoryLifespan(purgatory))) as client:
        assert client.get("/name").json() == "fetch"
    assert purgatory.closed
