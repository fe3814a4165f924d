"""Real servers on loopback for the integration tests, and the operations they serve."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from aiohttp import web

from purgatory_aio import DelayedOperation, Purgatory
from purgatory_aio.integrations.fastapi import Server

#: Upper bound on any single wait in these tests: a hang guard, never a timing claim.
HANG_GUARD = 30.0


async def wait_until(condition: Callable[[], bool], what: str = "condition") -> None:
    """Wait for ``condition`` to hold, failing after :data:`HANG_GUARD` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANG_GUARD
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


@dataclass
class Box:
    """A value requests wait for; ``on_complete`` calls are recorded per operation."""

    value: str | None = None
    completed: list[WaitForValue] = field(default_factory=list)


class WaitForValue(DelayedOperation[str]):
    """Completes once its box holds a value; answers the value or ``"timeout"``."""

    def __init__(self, box: Box, timeout: float) -> None:
        super().__init__(timeout)
        self.box = box

    def try_complete(self) -> bool:
        return self.box.value is not None and self.force_complete()

    def on_complete(self) -> str:
        self.box.completed.append(self)
        return "timeout" if self.box.value is None else self.box.value


@dataclass
class Served:
    """A server running in this process: its base URL and how to stop it."""

    url: str
    stop: Callable[[], Any]


def _loopback_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@asynccontextmanager
async def serve_asgi(
    app: Any, server_class: type[uvicorn.Server] = Server, **config: Any
) -> AsyncIterator[Served]:
    """Serve an ASGI app with uvicorn (purgatory_aio's ``Server`` unless told otherwise)
    on a free loopback port."""
    sock = _loopback_socket()
    port = sock.getsockname()[1]
    server = server_class(
        uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", **config)
    )
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))

    async def stop() -> None:
        server.should_exit = True
        await asyncio.wait_for(asyncio.shield(task), HANG_GUARD)

    try:
        await wait_until(lambda: server.started or task.done(), "uvicorn to start")
        if task.done():
            task.result()
            raise AssertionError("uvicorn stopped during startup")
        yield Served(f"http://127.0.0.1:{port}", stop)
    finally:
        if not task.done():
            await stop()
        sock.close()


@asynccontextmanager
async def serve_aiohttp(app: web.Application, **runner: Any) -> AsyncIterator[Served]:
    """Serve an aiohttp app with ``AppRunner``/``TCPSite`` on a free loopback port."""
    app_runner = web.AppRunner(app, access_log=None, **runner)
    await app_runner.setup()
    stopping: asyncio.Task[None] | None = None

    async def stop() -> None:
        nonlocal stopping
        if stopping is None:
            stopping = asyncio.get_running_loop().create_task(app_runner.cleanup())
        await asyncio.wait_for(asyncio.shield(stopping), HANG_GUARD)

    try:
        site = web.TCPSite(app_runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        port = app_runner.addresses[0][1]
        yield Served(f"http://127.0.0.1:{port}", stop)
    finally:
        await stop()


async def assert_disconnect_withdraws(
    purgatory: Purgatory, box: Box, request: Awaitable[Any]
) -> None:
    """A client that goes away mid-poll withdraws its operation: cancelled, never completed."""
    poll = asyncio.ensure_future(request)
    await wait_until(lambda: purgatory.num_delayed == 1, "the poll to wait")
    poll.cancel()
    await wait_until(lambda: purgatory.num_delayed == 0, "the poll to be withdrawn")
    assert purgatory.stats().cancelled == 1
    assert box.completed == []
