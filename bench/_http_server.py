"""The server side of the HTTP benchmark: the example apps plus the naive-handler routes.

Runs in its own process (``python -m bench.http --serve FRAMEWORK``), so the
load generator does not share its event loop. Every contender is served by the
same framework on the same broker, with the same parsing and JSON answers:

* ``/topics/...``: the example's own routes (the integration's disconnect-aware
  ``watch_and_wait``);
* ``/core/topics/...``: the core's ``Purgatory.watch_and_wait``, nothing listening
  for disconnection (what the naive handler is compared with: both only wait); on FastAPI its
  fetch route gets the purgatory as an application does, through
  ``Depends(purgatory_dependency(...))``, so the dependency's cost is in its figures;
* ``/naive/topics/...``: the naive handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import threading
import time
from collections.abc import Hashable, Iterable
from typing import Any

import uvicorn
from aiohttp import web
from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from minikafka.broker import DelayedFetch
from minikafka.protocol import FetchResponse
from minikafka.records import TopicPartition

from examples import aiohttp_broker, fastapi_broker
from examples.http_broker_common import HttpBroker, Reply, Settings
from purgatory_aio import Purgatory
from purgatory_aio.integrations.fastapi import Server, purgatory_dependency

from ._common import quiet_logs, run_on

RECORDS = "/topics/{topic}/partitions/{partition}/records"


async def core_wait(
    purgatory: Purgatory, op: DelayedFetch, keys: Iterable[Hashable]
) -> FetchResponse:
    response: FetchResponse = await purgatory.watch_and_wait(op, keys)
    return response


class NaiveWaits:
    """The naive-handler baseline's wait, in the shape of the broker's wait hook:
    a future per request in a ``dict[key, set[future]]``, awaited under
    ``asyncio.timeout``, resolved by the produce route."""

    def __init__(self, broker: HttpBroker) -> None:
        self._replicas = broker.cluster.replicas
        self.waiters: dict[Hashable, set[asyncio.Future[None]]] = {}

    async def wait(
        self, purgatory: Any, op: DelayedFetch, keys: Iterable[Hashable]
    ) -> FetchResponse:
        replicas, request = self._replicas, op.request
        if not replicas.fetch_satisfied(request):
            loop = asyncio.get_running_loop()
            waiters = self.waiters
            keys = tuple(keys)
            try:
                async with asyncio.timeout(op.timeout):
                    while not replicas.fetch_satisfied(request):
                        future = loop.create_future()
                        for key in keys:
                            waiters.setdefault(key, set()).add(future)
                        try:
                            await future
                        finally:
                            for key in keys:
                                pending = waiters.get(key)
                                if pending is not None:
                                    pending.discard(future)
                                    if not pending:
                                        del waiters[key]
            except TimeoutError:
                pass
        response: FetchResponse = replicas.read(request)
        return response

    def notify(self, key: Hashable) -> None:
        for future in self.waiters.pop(key, ()):
            if not future.done():
                future.set_result(None)

    def notify_after(self, reply: Reply, topic: str, partition: str) -> None:
        if reply[0] < 300 and partition.isdigit():
            self.notify(TopicPartition(topic, int(partition)))

    @property
    def count(self) -> int:
        return sum(len(futures) for futures in self.waiters.values())


def _settings() -> Settings:
    # One replica: the fetch purgatory then holds the clients' polls only.
    # The topics exist from the start: a fetch does not create its topic.
    topics = ("bench-integration", "bench-purgatory", "bench-naive")
    return Settings(partitions=1, replication_factor=1, brokers=1, topics=topics)


def _state(broker: HttpBroker, naive: NaiveWaits) -> dict[str, float]:
    delayed = broker.fetch_purgatory.num_delayed
    return {
        "integration": delayed,
        "purgatory": delayed,
        "naive": naive.count,
        "cpu_s": time.process_time(),
    }


def _listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


async def _serve_fastapi(stop: asyncio.Event) -> None:
    app = fastapi_broker.make_app(_settings())
    broker: HttpBroker = app.state.broker
    naive = NaiveWaits(broker)

    def add_routes(prefix: str, wait: Any, notify: bool) -> None:
        @app.post(prefix + RECORDS)
        async def produce(request: Request, topic: str, partition: str) -> JSONResponse:
            body = await request.body()
            reply = await broker.produce(
                topic, partition, request.query_params, body, contextlib.nullcontext
            )
            if notify:
                naive.notify_after(reply, topic, partition)
            return JSONResponse(reply[1], status_code=reply[0])

        # The fetch purgatory, got as a handler gets it (the broker holds the same one).
        dependencies = [Depends(purgatory_dependency(broker.fetch_purgatory.name))]

        @app.get(prefix + RECORDS, dependencies=dependencies if prefix == "/core" else None)
        async def fetch(request: Request, topic: str, partition: str) -> JSONResponse:
            reply = await broker.fetch(topic, partition, request.query_params, wait)
            return JSONResponse(reply[1], status_code=reply[0])

    add_routes("/core", core_wait, notify=False)
    add_routes("/naive", naive.wait, notify=True)

    @app.get("/bench/state")
    async def state() -> dict[str, float]:
        return _state(broker, naive)

    sock = _listening_socket()
    server = Server(
        uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", backlog=4096)
    )
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("uvicorn stopped during startup")
        await asyncio.sleep(0.01)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await stop.wait()
    server.should_exit = True
    await task


async def _serve_aiohttp(stop: asyncio.Event) -> None:
    app = aiohttp_broker.make_app(_settings())
    broker = app[aiohttp_broker.BROKER]
    naive = NaiveWaits(broker)

    def add_routes(prefix: str, wait: Any, notify: bool) -> None:
        async def produce(request: web.Request) -> web.Response:
            topic, partition = request.match_info["topic"], request.match_info["partition"]
            body = await request.read()
            reply = await broker.produce(
                topic, partition, request.query, body, contextlib.nullcontext
            )
            if notify:
                naive.notify_after(reply, topic, partition)
            return web.json_response(reply[1], status=reply[0])

        async def fetch(request: web.Request) -> web.Response:
            topic, partition = request.match_info["topic"], request.match_info["partition"]
            reply = await broker.fetch(topic, partition, request.query, wait)
            return web.json_response(reply[1], status=reply[0])

        app.router.add_post(prefix + RECORDS, produce)
        app.router.add_get(prefix + RECORDS, fetch)

    add_routes("/core", core_wait, notify=False)
    add_routes("/naive", naive.wait, notify=True)

    async def state(request: web.Request) -> web.Response:
        return web.json_response(_state(broker, naive))

    app.router.add_get("/bench/state", state)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = _listening_socket()
    await web.SockSite(runner, sock, backlog=4096).start()
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def serve(framework: str, loop_name: str) -> int:
    """Serve until stdin closes (the benchmark's way of saying stop)."""
    # This process is the application: it keeps the broker's info logs off stdout.
    quiet_logs()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def wait_for_eof() -> None:
            sys.stdin.read()
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=wait_for_eof, daemon=True).start()
        if framework == "fastapi":
            await _serve_fastapi(stop)
        else:
            await _serve_aiohttp(stop)

    run_on(loop_name, main)
    return 0
