"""The mini Kafka broker over HTTP, served by aiohttp.

Run it with ``python -m examples.aiohttp_broker`` (add ``--help`` for options);
the cluster is configured from the ``MINIKAFKA_*`` environment variables (see
:mod:`examples.http_broker_common`). Same routes as :mod:`examples.fastapi_broker`.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Awaitable, Hashable, Iterable, Mapping

from aiohttp import web
from aiohttp.typedefs import Handler
from minikafka.broker import DelayedFetch
from minikafka.protocol import FetchResponse

from examples.http_broker_common import (
    MAX_BODY_BYTES,
    HttpBroker,
    Reply,
    Settings,
    http_error,
    method_not_allowed,
    settings_from_env_or_exit,
)
from purgatory_aio import Purgatory
from purgatory_aio.integrations.aiohttp import (
    cancel_on_disconnect,
    metrics_handler,
    request_context_middleware,
    setup_purgatories,
    watch_and_wait,
)

#: The broker an application serves.
BROKER = web.AppKey("broker", HttpBroker)


def make_app(settings: Settings | None = None) -> web.Application:
    """An aiohttp application serving a fresh broker (``app[BROKER]``)."""
    broker = HttpBroker(settings or settings_from_env_or_exit("examples.aiohttp_broker"))
    app = web.Application(
        middlewares=[request_context_middleware, json_errors], client_max_size=MAX_BODY_BYTES
    )
    app[BROKER] = broker
    setup_purgatories(app, *broker.purgatories)
    app.cleanup_ctx.append(_run_broker)
    app.router.add_post("/topics/{topic}/partitions/{partition}/records", produce)
    app.router.add_get("/topics/{topic}/partitions/{partition}/records", fetch)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_handler(broker.metrics))
    return app


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own errors (no route, method not allowed, body too large) in the
    broker's JSON error shape instead of plain text."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = None
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        if isinstance(exc, web.HTTPNotFound):
            message = f"no route {request.method} {request.path}"
        elif isinstance(exc, web.HTTPMethodNotAllowed):
            reply = method_not_allowed(request.method, request.path, exc.allowed_methods)
            return _json(reply, headers=headers)
        elif isinstance(exc, web.HTTPRequestEntityTooLarge):
            message = f"the body is larger than the {MAX_BODY_BYTES:,} bytes accepted"
        return _json(http_error(exc.status, message), headers=headers)


async def _run_broker(app: web.Application) -> AsyncIterator[None]:
    async with app[BROKER].lifespan(app):
        yield


async def produce(request: web.Request) -> web.Response:
    body = await request.read()
    return _json(
        await request.app[BROKER].produce(
            request.match_info["topic"],
            request.match_info["partition"],
            request.query.items(),
            body,
            lambda: cancel_on_disconnect(request),
        )
    )


async def fetch(request: web.Request) -> web.Response:
    def wait(
        purgatory: Purgatory, op: DelayedFetch, keys: Iterable[Hashable]
    ) -> Awaitable[FetchResponse]:
        return watch_and_wait(request, purgatory, op, keys)

    return _json(
        await request.app[BROKER].fetch(
            request.match_info["topic"],
            request.match_info["partition"],
            request.query.items(),
            wait,
        )
    )


async def healthz(request: web.Request) -> web.Response:
    return _json(request.app[BROKER].health())


def _json(reply: Reply, headers: Mapping[str, str] | None = None) -> web.Response:
    status, body = reply
    return web.json_response(body, status=status, headers=headers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    web.run_app(make_app(), host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
