"""aiohttp web applications.

Needs the ``aiohttp`` extra (``pip install 'purgatory-aio[aiohttp]'``).

Example::

    app = web.Application()
    setup_purgatories(app, Purgatory("fetch"))
    FETCH = purgatory_key("fetch")

    async def poll(request: web.Request) -> web.Response:
        op = WaitForData(request.match_info["key"], 30.0)
        result = await watch_and_wait(request, request.app[FETCH], op, [op.key])
        return web.json_response(result)

By default aiohttp does not cancel a handler whose client disconnected (unless
the server runs with ``handler_cancellation=True``). :func:`watch_and_wait`
learns about the disconnection from the connection itself, so a client that
goes away leaves nothing pending either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Hashable, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final, SupportsFloat, TypeVar

try:
    import structlog
    from aiohttp import web
    from aiohttp.typedefs import Handler
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "purgatory_aio.integrations.aiohttp needs aiohttp: install purgatory-aio[aiohttp]"
    ) from exc

from .. import integrations as _common
from .._errors import PurgatoryClosed
from .._logging import get_logger
from .._operation import DelayedOperation
from .._purgatory import Purgatory
from ..fanout import Fanout
from . import OnDisconnect, Purgatories, already_disconnected, make_request_id, never_disconnected
from ._events import EVENT_STREAM_HEADERS, last_event_value, server_sent_events
from ._health import DEFAULT_QUEUE_LIMIT, check_queue_limit, readiness

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = [
    "FANOUT",
    "PURGATORIES",
    "ClientDisconnected",
    "OperationCancelled",
    "PurgatoryUnavailable",
    "cancel_on_disconnect",
    "get_fanout",
    "get_purgatory",
    "metrics_handler",
    "on_disconnect",
    "purgatory_key",
    "readiness_handler",
    "request_context_middleware",
    "setup_purgatories",
    "value_events",
    "wait_for_value",
    "watch_and_wait",
]

R = TypeVar("R")

_log = get_logger("purgatory_aio.integrations.aiohttp")


class ClientDisconnected(_common.ClientDisconnected, web.HTTPClientError):
    """The client disconnected; answered with 499, which nobody receives."""

    status_code = 499

    def __init__(self) -> None:
        web.HTTPClientError.__init__(self, reason="Client Closed Request")


class OperationCancelled(_common.OperationCancelled, web.HTTPServiceUnavailable):
    """The application withdrew the operation its client was waiting for: 503."""

    def __init__(self, detail: str = "the operation was cancelled") -> None:
        web.HTTPServiceUnavailable.__init__(self, text=detail)


class PurgatoryUnavailable(PurgatoryClosed, web.HTTPServiceUnavailable):
    """The purgatory is shut down (the server is stopping): 503."""

    def __init__(self, detail: str = "shutting down") -> None:
        web.HTTPServiceUnavailable.__init__(self, text=detail)


def _http_errors() -> contextlib.AbstractContextManager[None]:
    return _common.translate_errors(ClientDisconnected, OperationCancelled, PurgatoryUnavailable)


# -- lifecycle ---------------------------------------------------------------------------------

#: The application's :class:`~purgatory_aio.integrations.Purgatories`.
PURGATORIES: Final = web.AppKey("purgatory_aio.purgatories", Purgatories)
"""The application key of every purgatory :func:`setup_purgatories` runs."""


@functools.cache
def purgatory_key(name: str) -> web.AppKey[Purgatory]:
    """The ``AppKey`` under which :func:`setup_purgatories` stores the purgatory ``name``
    (the same key object for the same name): ``request.app[purgatory_key("fetch")]``."""
    return web.AppKey(f"purgatory_aio.purgatory.{name}", Purgatory)


#: The application's :class:`~purgatory_aio.fanout.Fanout`, when it has one.
FANOUT: Final = web.AppKey("purgatory_aio.fanout", Fanout)
"""The application key of the fan-out given to :func:`setup_purgatories`."""


def setup_purgatories(
    app: web.Application, *purgatories: Purgatory, fanout: Fanout | None = None
) -> Purgatories:
    """Run ``purgatories`` with ``app``: started on startup, shut down on shutdown.

    Each is stored under :func:`purgatory_key` of its name, all of them under
    :data:`PURGATORIES`. They are shut down in ``on_shutdown``, which aiohttp
    runs before it waits for the handlers still running: every pending
    operation is expired there, so each long-polling client is answered at once
    instead of holding the shutdown until its deadline. A ``cleanup_ctx`` entry
    starts them and makes sure they are shut down even if startup fails later.
    Call it again to add purgatories before the application starts.

    With ``fanout``, events published by other processes apply to these
    purgatories: the fan-out is started after them (a ``cleanup_ctx`` entry, so a
    Redis that cannot be reached fails the startup) and stopped before they are
    shut down, and it is stored under :data:`FANOUT`.

    Every argument is checked before anything changes: a refused call leaves
    ``app`` as it was (TypeError, ValueError; RuntimeError for an application
    already started, which can no longer take the entries that run them).
    """
    registry = app.get(PURGATORIES)
    # Checked on a copy first: registering one purgatory after another must not stop
    # half-way, with the ones before the refused one registered and published.
    Purgatories((*(registry or ()), *purgatories))
    adds_fanout = False
    if fanout is not None:
        if not isinstance(fanout, Fanout):
            raise TypeError(f"fanout must be a Fanout, got {fanout!r}")
        current = app.get(FANOUT)
        if current is not None and current is not fanout:
            raise ValueError("this application already has another fanout")
        adds_fanout = current is None
    if app.frozen and (registry is None or adds_fanout):
        raise RuntimeError("setup_purgatories must be called before the application starts")
    if registry is None:
        registry = app[PURGATORIES] = Purgatories()
        app.cleanup_ctx.append(_run_purgatories)
        app.on_shutdown.append(_shutdown_purgatories)
    for purgatory in purgatories:
        registry.add(purgatory)
        app[purgatory_key(purgatory.name)] = purgatory
    if fanout is not None and adds_fanout:
        app[FANOUT] = fanout
        app.cleanup_ctx.append(_run_fanout)
    return registry


async def _run_fanout(app: web.Application) -> AsyncIterator[None]:
    fanout = app[FANOUT]
    fanout.attach(*app[PURGATORIES])
    await fanout.start()
    try:
        yield
    finally:
        await fanout.stop()


async def _run_purgatories(app: web.Application) -> AsyncIterator[None]:
    registry = app[PURGATORIES]
    await registry.start()
    try:
        yield
    finally:
        await registry.shutdown()


async def _shutdown_purgatories(app: web.Application) -> None:
    await app[PURGATORIES].shutdown()


def get_purgatory(request: web.Request, name: str | None = None) -> Purgatory:
    """The purgatory ``name`` (the only one if ``None``) of the request's application,
    looked up through sub-applications too."""
    registry = request.config_dict.get(PURGATORIES)
    if registry is None:
        raise RuntimeError("this application has no purgatories: call setup_purgatories(app, ...)")
    return registry.only() if name is None else registry[name]


# -- waiting for operations --------------------------------------------------------------------


class _ConnectionWatch(asyncio.Protocol):
    """Sits between a connection's transport and aiohttp's protocol to hear it close.

    aiohttp offers no public disconnection callback (its own handler
    cancellation aside), but an asyncio transport lets its protocol be swapped
    (``BaseTransport.set_protocol``). This forwards every protocol call to
    aiohttp's protocol unchanged, and after ``connection_lost`` runs the
    callbacks of the requests waiting on the connection. Installed once per
    connection, on the first request that waits.
    """

    __slots__ = ("_callbacks", "_protocol")

    def __init__(self, protocol: asyncio.Protocol) -> None:
        self._protocol = protocol
        self._callbacks: set[Callable[[], None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._protocol.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._protocol.data_received(data)

    def eof_received(self) -> bool | None:
        return self._protocol.eof_received()

    def pause_writing(self) -> None:
        self._protocol.pause_writing()

    def resume_writing(self) -> None:
        self._protocol.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            callbacks, self._callbacks = self._callbacks, set()
            for callback in callbacks:
                try:
                    callback()
                except Exception:
                    _log.exception("disconnect_callback_error")

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        self._callbacks.add(callback)
        return functools.partial(self._callbacks.discard, callback)


def on_disconnect(request: web.Request) -> OnDisconnect:
    """The disconnection signal of ``request``'s connection, for the helpers of
    :mod:`purgatory_aio.integrations`. The connection is watched from the first
    subscription on; a subscription costs a set entry."""

    def subscribe(callback: Callable[[], None]) -> Callable[[], None]:
        return _connection_signal(request)(callback)

    return subscribe


def _connection_signal(request: web.Request) -> OnDisconnect:
    transport = request.transport
    if transport is None:
        return already_disconnected
    protocol = transport.get_protocol()
    if isinstance(protocol, _ConnectionWatch):
        return protocol.subscribe
    if (
        protocol is not request.protocol
        or isinstance(protocol, asyncio.BufferedProtocol)
        or not isinstance(protocol, asyncio.Protocol)
    ):
        # Not the plain protocol-per-connection arrangement this knows how to watch;
        # disconnection then only reaches us through handler cancellation.
        _log.debug("disconnect_detection_unsupported", protocol=type(protocol).__name__)
        return never_disconnected
    watch = _ConnectionWatch(protocol)
    transport.set_protocol(watch)
    return watch.subscribe


async def watch_and_wait(
    request: web.Request,
    purgatory: Purgatory,
    op: DelayedOperation[R],
    keys: Iterable[Hashable],
) -> R:
    """Watch ``op`` under ``keys`` and return its result; withdraw it if the client leaves.

    An operation that completes at once costs nothing more than
    ``try_complete_else_watch``; one that waits registers a callback on its
    connection, which cancels ``op`` (its ``on_complete`` never runs) when the
    connection is lost.

    Raises:
        ClientDisconnected: (499) the client went away first.
        OperationCancelled: (503) the application cancelled ``op``.
        PurgatoryUnavailable: (503) the purgatory is shut down.
    """
    with _http_errors():
        return await _common.watch_until_disconnected(purgatory, op, keys, on_disconnect(request))


async def wait_for_value(
    request: web.Request,
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

    ``fanout`` defaults to the one given to :func:`setup_purgatories`, ``purgatory``
    to the application's only purgatory.

    Raises:
        ClientDisconnected: (499) the client went away first.
        OperationCancelled: (503) the wait was cancelled (a fan-out ``cancel(key)``).
        PurgatoryUnavailable: (503) the purgatory is shut down.
    """
    fan = fanout if fanout is not None else get_fanout(request)
    chosen = purgatory if purgatory is not None else get_purgatory(request)
    named = label if label is not None else _route_template(request)
    with _http_errors():
        return await _common.wait_for_value_until_disconnected(
            fan, chosen, key, threshold, timeout, on_disconnect(request), named
        )


def _route_template(request: web.Request) -> str | None:
    """The template of the route that matched (``/orders/{id}/status``), or None."""
    resource = request.match_info.route.resource
    return _common.route_label(resource.canonical if resource is not None else None)


async def value_events(
    request: web.Request,
    key: str,
    *,
    timeout: float,  # noqa: ASYNC109 - the stream's own deadline, on the purgatory's clock
    purgatory: Purgatory | None = None,
    fanout: Fanout | None = None,
) -> web.StreamResponse:
    """Serve the successive values of ``key`` from any process
    (:meth:`~purgatory_aio.fanout.Fanout.stream`) as a ``text/event-stream`` response:
    one Server-Sent Event per new maximum, ``id`` and ``data`` both the value, until
    ``timeout`` seconds have passed, the key is cancelled or the server stops; then it
    returns the finished response.

    A client reconnecting with ``Last-Event-ID`` resumes after that value. A client
    that leaves, even while no value comes, ends the response at once and releases the
    stream. ``fanout`` and ``purgatory`` default as for :func:`wait_for_value`.

    Usage: ``return await value_events(request, f"job:{job}", timeout=300)``.

    Raises:
        web.HTTPBadRequest: (400) a ``Last-Event-ID`` that is not a finite number.
        PurgatoryUnavailable: (503) the purgatory is shut down.
        TypeError, ValueError: a bad ``key`` or ``timeout``, as ``Fanout.stream``.
    """
    fan = fanout if fanout is not None else get_fanout(request)
    chosen = purgatory if purgatory is not None else get_purgatory(request)
    try:
        after = last_event_value(request.headers.get("Last-Event-ID"))
    except ValueError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    if chosen.closed:
        raise PurgatoryUnavailable()
    values = fan.stream(chosen, key, timeout=timeout, after=after)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", **EVENT_STREAM_HEADERS}
    )
    try:
        await response.prepare(request)
        async with _common.cancel_on_disconnect(on_disconnect(request)):
            async for event in server_sent_events(values):
                await response.write(event.encode())
        await response.write_eof()
    except (_common.ClientDisconnected, ConnectionResetError):
        pass  # nobody is left to answer
    finally:
        await values.aclose()
    return response


def get_fanout(request: web.Request) -> Fanout:
    """The fan-out given to :func:`setup_purgatories` (looked up through sub-applications)."""
    fanout = request.config_dict.get(FANOUT)
    if fanout is None:
        raise RuntimeError("this application has no fan-out: pass fanout=... to setup_purgatories")
    return fanout


@asynccontextmanager
async def cancel_on_disconnect(request: web.Request) -> AsyncIterator[None]:
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

_REQUEST_ID_HEADER = "X-Request-ID"


@web.middleware
async def request_context_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Binds ``method``, ``path`` and ``request_id`` into structlog's contextvars per request.

    Every log line of the request then carries them (with
    ``structlog.contextvars.merge_contextvars`` in the processor chain, which the
    application configures). The id is taken from the ``X-Request-ID`` header
    when it is plain, else generated, and sent back in the response header.

    Usage: ``web.Application(middlewares=[request_context_middleware])``.
    """
    request_id = make_request_id(request.headers.get(_REQUEST_ID_HEADER))
    with structlog.contextvars.bound_contextvars(
        method=request.method, path=request.path, request_id=request_id
    ):
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            exc.headers[_REQUEST_ID_HEADER] = request_id
            raise
    if not response.prepared:
        response.headers[_REQUEST_ID_HEADER] = request_id
    return response


def metrics_handler(registry: CollectorRegistry | None = None) -> Handler:
    """A handler serving ``registry`` (the default Prometheus registry if ``None``)
    in the exposition format the scraper asks for. Needs the ``metrics`` extra.

    Usage: ``app.router.add_get("/metrics", metrics_handler(registry))``.
    """
    try:
        from prometheus_client import REGISTRY
        from prometheus_client.exposition import choose_encoder
    except ImportError as exc:
        raise ImportError(
            "metrics_handler needs prometheus-client: install purgatory-aio[metrics]"
        ) from exc
    target = REGISTRY if registry is None else registry

    async def metrics(request: web.Request) -> web.StreamResponse:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(target), headers={"Content-Type": content_type})

    return metrics


def readiness_handler(*, queue_limit: float = DEFAULT_QUEUE_LIMIT) -> Handler:
    """A handler for readiness probes: 200 when the application can serve its waits, else
    503, with a small JSON body naming each problem
    (:func:`~purgatory_aio.integrations.readiness`: :func:`setup_purgatories` has run and
    the application started, no purgatory is shut down, the fan-out given to it is
    connected and its publish queue below ``queue_limit`` of its size).

    Usage: ``app.router.add_get("/ready", readiness_handler())``.
    """
    limit = check_queue_limit(queue_limit)

    async def ready(request: web.Request) -> web.StreamResponse:
        found = readiness(
            request.config_dict.get(PURGATORIES), request.config_dict.get(FANOUT), queue_limit=limit
        )
        return web.json_response(
            found.as_dict(), status=found.status, headers={"Cache-Control": "no-store"}
        )

    return ready
