"""The mini Kafka broker over HTTP, served by FastAPI.

Run it with ``python -m examples.fastapi_broker`` (add ``--help`` for options)
or ``uvicorn examples.fastapi_broker:app``; the cluster is configured from the
``MINIKAFKA_*`` environment variables (see :mod:`examples.http_broker_common`).

    curl -X POST 'localhost:8000/topics/orders/partitions/0/records?acks=all' \\
         -H 'content-type: application/json' -d '{"records": [{"key": null, "value": "hi"}]}'
    curl 'localhost:8000/topics/orders/partitions/0/records?offset=0&max_wait_ms=5000'
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Awaitable, Hashable, Iterable, Mapping

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from minikafka.broker import DelayedFetch
from minikafka.protocol import FetchResponse
from starlette.exceptions import HTTPException

from examples.http_broker_common import (
    HttpBroker,
    Reply,
    Settings,
    http_error,
    method_not_allowed,
    settings_from_env_or_exit,
)
from purgatory_aio import Purgatory
from purgatory_aio.integrations.fastapi import (
    PurgatoryLifespan,
    RequestContextMiddleware,
    Server,
    cancel_on_disconnect,
    metrics_endpoint,
    watch_and_wait,
)


def make_app(settings: Settings | None = None) -> FastAPI:
    """A FastAPI application serving a fresh broker (``app.state.broker``)."""
    broker = HttpBroker(settings or settings_from_env_or_exit("examples.fastapi_broker"))
    app = FastAPI(
        title="minikafka over HTTP",
        lifespan=PurgatoryLifespan(*broker.purgatories, lifespan=broker.lifespan),
    )
    app.state.broker = broker
    app.add_middleware(RequestContextMiddleware)
    app.add_exception_handler(HTTPException, _http_exception)

    @app.post("/topics/{topic}/partitions/{partition}/records")
    async def produce(request: Request, topic: str, partition: str) -> JSONResponse:
        body = await request.body()
        return _json(
            await broker.produce(
                topic,
                partition,
                request.query_params.multi_items(),
                body,
                lambda: cancel_on_disconnect(request),
            )
        )

    @app.get("/topics/{topic}/partitions/{partition}/records")
    async def fetch(request: Request, topic: str, partition: str) -> JSONResponse:
        def wait(
            purgatory: Purgatory, op: DelayedFetch, keys: Iterable[Hashable]
        ) -> Awaitable[FetchResponse]:
            return watch_and_wait(request, purgatory, op, keys)

        return _json(await broker.fetch(topic, partition, request.query_params.multi_items(), wait))

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return _json(broker.health())

    app.add_api_route("/metrics", metrics_endpoint(broker.metrics), include_in_schema=False)
    return app


def _json(reply: Reply, headers: Mapping[str, str] | None = None) -> JSONResponse:
    status, body = reply
    return JSONResponse(body, status_code=status, headers=headers)


async def _http_exception(request: Request, exc: Exception) -> JSONResponse:
    # Starlette's own 404 and 405 (and any HTTPException) in the broker's error shape.
    assert isinstance(exc, HTTPException)
    message = None
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
    elif exc.status_code == 405:
        # Starlette names the header "Allow": look it up whatever its case.
        allow = next((v for k, v in (exc.headers or {}).items() if k.lower() == "allow"), "")
        reply = method_not_allowed(request.method, request.url.path, allow.split(","))
        return _json(reply, headers=exc.headers)
    elif isinstance(exc.detail, str):
        message = exc.detail
    return _json(http_error(exc.status_code, message), headers=exc.headers)


app = make_app()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    # purgatory_aio's Server answers pending long polls as soon as shutdown begins.
    server = Server(uvicorn.Config(app, host=args.host, port=args.port))
    # uvicorn re-raises the Ctrl-C it shut down for.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
