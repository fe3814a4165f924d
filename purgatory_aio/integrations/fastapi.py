"""FastAPI (and any Starlette application) served by uvicorn.

Needs the ``fastapi`` extra (``pip install 'purgatory-aio[fastapi]'``).

Example::

    fetch = Purgatory("fetch")
    app = FastAPI(lifespan=PurgatoryLifespan(fetch, lifespan=my_lifespan))
    FetchPurgatory = Annotated[Purgatory, Depends(purgatory_dependency("fetch"))]

    @app.get("/poll/{key}")
    async def poll(request: Request, key: str, purgatory: FetchPurgatory) -> dict:
        return await watch_and_wait(request, purgatory, WaitForData(key, 30.0), [key])

uvicorn does not cancel a handler whose client disconnected;
:func:`watch_and_wait` and :func:`cancel_on_disconnect` listen for the ASGI
``http.disconnect`` message themselves, so a client that goes away leaves
nothing pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, SupportsFloat, TypeVar

try:
    import structlog
    import uvicorn  # noqa: F401 - the server (in _uvicorn) needs it: checked here with the rest
    from fastapi import HTTPException, Request
    from starlette.applications import Starlette
    from starlette.datastructures import MutableHeaders
    from starlette.requests import HTTPConnection
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "purgatory_aio.integrations.fastapi needs FastAPI and uvicorn: "
        "install purgatory-aio[fastapi]"
    ) from exc

from .. import integrations as _common
from .._errors import PurgatoryClosed
from .._logging import get_logger
from .._operation import DelayedOperation
from .._purgatory import Purgatory
from ..fanout import Fanout, FanoutUnavailable
from . import OnDisconnect, Purgatories, make_request_id
from ._events import EVENT_STREAM_HEADERS, last_event_value, server_sent_events
from ._health import DEFAULT_QUEUE_LIMIT, check_queue_limit, readiness
from ._uvicorn import Server, SettleOnSignal

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = [
    "ClientDisconnected",
    "OneLineStartupErrors",
    "OperationCancelled",
    "PurgatoryLifespan",
    "PurgatoryUnavailable",
    "RequestContextMiddleware",
    "Server",
    "cancel_on_disconnect",
    "get_fanout",
    "get_purgatories",
    "metrics_endpoint",
    "on_disconnect",
    "purgatory_dependency",
    "readiness_endpoint",
    "value_events",
    "wait_for_value",
    "watch_and_wait",
]

R = TypeVar("R")

_log = get_logger("purgatory_aio.integrations.fastapi")


class ClientDisconnected(_common.ClientDisconnected, HTTPException):
    """The client disconnected; answered with 499, which nobody receives."""

    def __init__(self) -> None:
        HTTPException.__init__(self, 499, "client closed request")


class OperationCancelled(_common.OperationCancelled, HTTPException):
    """The application withdrew the operation its client was waiting for: 503."""

    def __init__(self, detail: str = "the operation was cancelled") -> None:
        HTTPException.__init__(self, 503, detail)


class PurgatoryUnavailable(PurgatoryClosed, HTTPException):
    """The purgatory is shut down (the server is stopping): 503."""

    def __init__(self, detail: str = "shutting down") -> None:
        HTTPException.__init__(self, 503, detail)


def _http_errors() -> contextlib.AbstractContextManager[None]:
    return _common.translate_errors(ClientDisconnected, OperationCancelled, PurgatoryUnavailable)


# -- lifecycle ---------------------------------------------------------------------------------


class PurgatoryLifespan:
    """A lifespan that starts the application's purgatories and shuts them down.

    Pass it as ``FastAPI(lifespan=PurgatoryLifespan(p1, p2, lifespan=yours))``:
    the purgatories start before your lifespan and are shut down after it, every
    pending operation expired so each waiting client gets its answer. Your
    lifespan's state, if any, is passed through. With ``fanout=`` (a
    :class:`~purgatory_aio.fanout.Fanout`), events published by other worker
    processes apply to these purgatories; it starts after them, stops before
    them, and is published as ``app.state.fanout``.

    The purgatories are published as ``app.state.purgatories`` (a
    :class:`~purgatory_aio.integrations.Purgatories`) for the dependencies.

    uvicorn runs the lifespan shutdown only after the requests in flight have
    finished, which a pending long poll would hold up until its own deadline.
    So while the application runs in the main thread, the lifespan also hooks
    SIGINT and SIGTERM: the signal starts the purgatories' shutdown at once
    (every pending operation expired, each client answered) and is passed on to
    the handler the server installed, which stops the server as before. This
    works under plain ``uvicorn``, ``uvicorn --workers N`` and gunicorn's
    uvicorn workers, which all stop a worker with one of those signals. Pass
    ``settle_on_signal=False`` to let pending operations run to their deadlines.
    """

    def __init__(
        self,
        *purgatories: Purgatory,
        lifespan: Callable[[Any], AbstractAsyncContextManager[Any]] | None = None,
        settle_on_signal: bool = True,
        fanout: Fanout | None = None,
    ) -> None:
        # Everything is checked here, before the application is touched.
        if fanout is not None and not isinstance(fanout, Fanout):
            raise TypeError(f"fanout must be a Fanout, got {fanout!r}")
        self.purgatories = Purgatories(purgatories)
        self._lifespan = lifespan
        self._settle_on_signal = settle_on_signal
        self.fanout = fanout

    def __call__(self, app: Starlette) -> AbstractAsyncContextManager[Any]:
        return self._run(app)

    @asynccontextmanager
    async def _run(self, app: Starlette) -> AsyncIterator[Any]:
        app.state.purgatories = self.purgatories
        settle = SettleOnSignal(self.purgatories, enabled=self._settle_on_signal)
        async with self.purgatories, self._fanout_running(app), settle:
            if self._lifespan is None:
                yield None
            else:
                async with self._lifespan(app) as state:
                    yield state

    @asynccontextmanager
    async def _fanout_running(self, app: Starlette) -> AsyncIterator[None]:
        # Started after the purgatories and stopped before them; published as app.state.fanout.
        fanout = self.fanout
        if fanout is None:
            yield
            return
        fanout.attach(*self.purgatories)
        app.state.fanout = fanout
        async with fanout:
            yield


#: The signals servers stop on: Ctrl-C, and what process managers (uvicorn's
#: --workers supervisor, gunicorn, systemd, Kubernetes) send. SIGQUIT is what gunicorn's
#: arbiter sends its workers on a quick shutdown (the arbiter's own SIGINT or SIGQUIT);
#: like the others it is wrapped only where the server installed a handler for it.


async def get_purgatories(request: HTTPConnection) -> Purgatories:
    """Dependency: the application's :class:`~purgatory_aio.integrations.Purgatories`
    (in HTTP and WebSocket routes alike: ``request`` is either connection).

    A coroutine function, as every dependency here: FastAPI runs a plain ``def``
    dependency in its thread pool, a thread hop per request for a dictionary lookup.
    """
    return _registry(request)


def _registry(request: HTTPConnection) -> Purgatories:
    registry = getattr(request.app.state, "purgatories", None)
    if isinstance(registry, Purgatories):
        return registry
    if _has_purgatory_lifespan(request.app):
        raise RuntimeError(
            "the purgatories of this application have not started: its lifespan "
            "(PurgatoryLifespan) has not run. A server such as uvicorn runs it; in tests, "
            "use Starlette's TestClient as a context manager (`with TestClient(app) as "
            "client:`) or wrap the application in asgi-lifespan's LifespanManager "
            "(`async with LifespanManager(app) as manager:` then "
            "`httpx.ASGITransport(app=manager.app)`): httpx.ASGITransport alone never "
            "runs a lifespan"
        )
    raise RuntimeError(
        "this application has no purgatories: pass lifespan=PurgatoryLifespan(...) to "
        "FastAPI() (and, in tests, run that lifespan: TestClient as a context manager, "
        "or asgi-lifespan's LifespanManager around httpx.ASGITransport)"
    )


def _has_purgatory_lifespan(app: object) -> bool:
    """Whether ``app`` (a request's application) was given a :class:`PurgatoryLifespan`."""
    router = getattr(app, "router", None)
    return isinstance(getattr(router, "lifespan_context", None), PurgatoryLifespan)


@functools.cache
def purgatory_dependency(
    name: str | None = None,
) -> Callable[[HTTPConnection], Awaitable[Purgatory]]:
    """Dependency on the purgatory called ``name`` (the only one if ``None``), in HTTP and
    WebSocket routes alike.

    A coroutine function, so FastAPI calls it on the event loop (no thread pool).
    The same callable is returned for the same name, so tests can replace it:
    ``app.dependency_overrides[purgatory_dependency("fetch")] = lambda: test_purgatory``.
    """

    async def dependency(request: HTTPConnection) -> Purgatory:
        registry = _registry(request)
        return registry.only() if name is None else registry[name]

    dependency.__name__ = f"purgatory_{name or 'only'}"
    return dependency


# -- waiting for operations --------------------------------------------------------------------


def on_disconnect(request: Request) -> OnDisconnect:
    """The disconnection signal of ``request``, for the helpers of
    :mod:`purgatory_aio.integrations`.

    Each subscription is one task awaiting the ASGI ``receive`` channel, which
    yields ``http.disconnect`` when the client goes away; it is cancelled when
    the subscription ends. Subscribe after the request body has been read (the
    task drains what is left of it) and one at a time per request.
    """
    receive = request.receive

    def subscribe(callback: Callable[[], None]) -> Callable[[], None]:
        task = asyncio.get_running_loop().create_task(_await_disconnect(receive, callback))

        def unsubscribe() -> None:
            task.cancel()

        return unsubscribe

    return subscribe


async def _await_disconnect(receive: Receive, callback: Callable[[], None]) -> None:
    body_read = False
    while True:
        try:
            message = await receive()
        except Exception as exc:
            # A receive channel that fails cannot report disconnection; the wait
            # itself carries on, bounded by the operation's deadline.
            _log.debug("disconnect_detection_failed", error=repr(exc))
            return
        kind = message["type"]
        if kind == "http.disconnect":
            callback()
            return
        if kind != "http.request":
            continue
        if body_read:
            # A server that answers receive() at once instead of holding it until the
            # client leaves cannot tell us about disconnection; stop listening.
            _log.debug("disconnect_detection_unsupported", server_message=kind)
            return
        body_read = not message.get("more_body", False)


async def watch_and_wait(
    request: Request,
    purgatory: Purgatory,
    op: DelayedOperation[R],
    keys: Iterable[Hashable],
) -> R:
    """Watch ``op`` under ``keys`` and return its result; withdraw it if the client leaves.

    An operation that completes at once costs nothing more than
    ``try_complete_else_watch``; one that waits has a task listening for the
    client's disconnection, which cancels ``op`` (its ``on_complete`` never runs).

    Raises:
        ClientDisconnected: (499) the client went away first.
        OperationCancelled: (503) the application cancelled ``op``.
        PurgatoryUnavailable: (503) the purgatory is shut down.
    """
    with _http_errors():
        return await _common.watch_until_disconnected(purgatory, op, keys, on_disconnect(request))


async def wait_for_value(
    request: Request,
    key: str,
    threshold: SupportsFloat,
    timeout: float,  # noqa: ASYNC109 - the operation's own deadline, enforced by the purgatory
    *,
    purgatory: Purgatory | None = None,
    fanout: Fanout | None = None,
    label: str | None = None,
) -> float | None:
    """Wait until ``key``'s value reaches ``threshold`` in any process (the fan-out's
    :meth:`~purgatory_aio.fanout.Fanout.wait_for_value`); withdraw the wait if the client
    leaves. Returns the value, or None once ``timeout`` passed.

    ``label`` names the wait in the event log and the report (its ``op_type``); by
    default the template of the route that matched (``/orders/{id}/status``), so two
    routes that wait on values are told apart.

    ``fanout`` defaults to the one given to :class:`PurgatoryLifespan`, ``purgatory``
    to the application's only purgatory.

    Raises:
        ClientDisconnected: (499) the client went away first.
        OperationCancelled: (503) the wait was cancelled (a fan-out ``cancel(key)``).
        PurgatoryUnavailable: (503) the purgatory is shut down.
    """
    fan = fanout if fanout is not None else get_fanout(request)
    chosen = purgatory if purgatory is not None else (await get_purgatories(request)).only()
    named = label if label is not None else _route_template(request)
    with _http_errors():
        return await _common.wait_for_value_until_disconnected(
            fan, chosen, key, threshold, timeout, on_disconnect(request), named
        )


def _route_template(request: Request) -> str | None:
    """The template of the route that matched (``/orders/{id}/status``), or None."""
    route = request.scope.get("route")
    return _common.route_label(getattr(route, "path_format", None) or getattr(route, "path", None))


async def value_events(
    request: Request,
    key: str,
    *,
    timeout: float,  # noqa: ASYNC109 - the stream's own deadline, on the purgatory's clock
    purgatory: Purgatory | None = None,
    fanout: Fanout | None = None,
) -> StreamingResponse:
    """The successive values of ``key`` from any process
    (:meth:`~purgatory_aio.fanout.Fanout.stream`) as a ``text/event-stream`` response:
    one Server-Sent Event per new maximum, ``id`` and ``data`` both the value, until
    ``timeout`` seconds have passed, the key is cancelled or the server stops.

    A client reconnecting with ``Last-Event-ID`` resumes after that value. When the
    client leaves, Starlette cancels the response (uvicorn reports the disconnection),
    which releases the stream. ``fanout`` and ``purgatory`` default as for
    :func:`wait_for_value`.

    Usage: ``return await value_events(request, f"job:{job}", timeout=300)``.

    Raises:
        HTTPException: (400) a ``Last-Event-ID`` that is not a finite number.
        PurgatoryUnavailable: (503) the purgatory is shut down.
        TypeError, ValueError: a bad ``key`` or ``timeout``, as ``Fanout.stream``.
    """
    fan = fanout if fanout is not None else get_fanout(request)
    chosen = purgatory if purgatory is not None else (await get_purgatories(request)).only()
    try:
        after = last_event_value(request.headers.get("last-event-id"))
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    if chosen.closed:
        raise PurgatoryUnavailable()
    values = fan.stream(chosen, key, timeout=timeout, after=after)
    return StreamingResponse(
        server_sent_events(values), media_type="text/event-stream", headers=EVENT_STREAM_HEADERS
    )


def get_fanout(request: HTTPConnection) -> Fanout:
    """The fan-out given to the application's :class:`PurgatoryLifespan` (``request``: an
    HTTP request or a WebSocket)."""
    fanout = getattr(request.app.state, "fanout", None)
    if not isinstance(fanout, Fanout):
        raise RuntimeError(
            "this application has no fan-out: pass fanout=... to PurgatoryLifespan(...)"
        )
    return fanout


@asynccontextmanager
async def cancel_on_disconnect(request: Request) -> AsyncIterator[None]:
    """Cancel the enclosed block when the client disconnects (then raise
    :class:`ClientDisconnected`), for awaits other than one operation, such as a
    service call that waits on a purgatory with ``Purgatory.watch_and_wait``.

    A :class:`~purgatory_aio.PurgatoryClosed` from the block becomes
    :class:`PurgatoryUnavailable` (503).
    """
    with _http_errors():
        async with _common.cancel_on_disconnect(on_disconnect(request)):
            yield


# -- observability -----------------------------------------------------------------------------


class RequestContextMiddleware:
    """Binds ``method``, ``path`` and ``request_id`` into structlog's contextvars per request.

    Every log line of the request then carries them (with
    ``structlog.contextvars.merge_contextvars`` in the processor chain, which the
    application configures). The id is taken from the ``X-Request-ID`` header
    when it is plain, else generated, and sent back in the response header.

    Usage: ``app.add_middleware(RequestContextMiddleware)``.
    """

    def __init__(self, app: ASGIApp, *, header: str = "x-request-id") -> None:
        self.app = app
        self._header = header.lower()
        self._header_bytes = self._header.encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        supplied = None
        name = self._header_bytes
        for key, value in scope["headers"]:
            if key == name:
                supplied = value.decode("latin-1")
                break
        request_id = make_request_id(supplied)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[self._header] = request_id
            await send(message)

        with structlog.contextvars.bound_contextvars(
            method=scope["method"], path=scope["path"], request_id=request_id
        ):
            await self.app(scope, receive, send_with_id)


class OneLineStartupErrors:
    """Reports a lifespan that cannot start because the fan-out's engine is unavailable in
    one line, not a traceback.

    Starlette answers a failed lifespan startup with the whole traceback, which
    uvicorn prints for each worker. A :class:`~purgatory_aio.fanout.FanoutUnavailable`
    already says all there is to say (the engine's address, password masked, and
    the cause), so this middleware reports ``FanoutUnavailable: <message>`` instead;
    uvicorn prints that line and "Application startup failed. Exiting." and ends
    the worker as before. Any other startup failure keeps its traceback.

    Usage: ``app.add_middleware(OneLineStartupErrors)``.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []  # the failure report, until we know what failed

        async def hold_failure(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)
            else:
                await send(message)

        try:
            await self.app(scope, receive, hold_failure)
        except FanoutUnavailable as exc:
            if held:  # reported; the server ends the worker, as for any failed startup
                line = f"{type(exc).__name__}: {exc}"
                await send({"type": "lifespan.startup.failed", "message": line})
                return
            raise
        except BaseException:
            for failure in held:
                await send(failure)
            raise
        for failure in held:
            await send(failure)


def metrics_endpoint(
    registry: CollectorRegistry | None = None,
) -> Callable[[Request], Awaitable[Response]]:
    """A route serving ``registry`` (the default Prometheus registry if ``None``)
    in the exposition format the scraper asks for. Needs the ``metrics`` extra.

    Usage: ``app.add_api_route("/metrics", metrics_endpoint(registry), include_in_schema=False)``.
    """
    try:
        from prometheus_client import REGISTRY
        from prometheus_client.exposition import choose_encoder
    except ImportError as exc:
        raise ImportError(
            "metrics_endpoint needs prometheus-client: install purgatory-aio[metrics]"
        ) from exc
    target = REGISTRY if registry is None else registry

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(target), headers={"content-type": content_type})

    return metrics


def readiness_endpoint(
    *, queue_limit: float = DEFAULT_QUEUE_LIMIT
) -> Callable[[Request], Awaitable[JSONResponse]]:
    """A route for readiness probes: 200 when the application can serve its waits, else
    503, with a small JSON body naming each problem
    (:func:`~purgatory_aio.integrations.readiness`: the lifespan has run, no purgatory is
    shut down, the fan-out given to :class:`PurgatoryLifespan` is connected and its
    publish queue below ``queue_limit`` of its size).

    Usage: ``app.add_api_route("/ready", readiness_endpoint(), include_in_schema=False)``.
    """
    limit = check_queue_limit(queue_limit)

    async def ready(request: Request) -> JSONResponse:
        state = request.app.state
        registry = getattr(state, "purgatories", None)
        fanout = getattr(state, "fanout", None)
        found = readiness(
            registry if isinstance(registry, Purgatories) else None,
            fanout if isinstance(fanout, Fanout) else None,
            queue_limit=limit,
        )
        return JSONResponse(
            found.as_dict(), status_code=found.status, headers={"cache-control": "no-store"}
        )

    return ready
