"""Serving a FastAPI application under uvicorn: the purgatories settle on a stop signal, and
:class:`~purgatory_aio.integrations.fastapi.Server` shuts them down with the server.

Needs the ``fastapi`` extra, as :mod:`purgatory_aio.integrations.fastapi` does.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from .._logging import get_logger
from . import Purgatories

_log = get_logger("purgatory_aio.integrations.fastapi")


_STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGQUIT") if hasattr(signal, name)
)

_SignalHandler = Callable[[int, FrameType | None], Any]


class SettleOnSignal:
    """Starts shutting the purgatories down when the process is told to stop.

    The server's own handler (uvicorn's ``Server.handle_exit``) is installed
    before the lifespan starts; this wraps it, so the server still stops as it
    would, and restores it when the lifespan ends. Only a callable handler is
    wrapped: with ``SIG_DFL`` or ``SIG_IGN`` nobody is shutting down gracefully
    on that signal. Signal handlers can only be set from the main thread, so an
    application run elsewhere (a test client's portal thread) is left alone.
    """

    def __init__(self, registry: Purgatories, *, enabled: bool) -> None:
        self._registry = registry
        self._enabled = enabled
        self._previous: dict[int, _SignalHandler] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Task[None] | None = None

    async def __aenter__(self) -> None:
        if not self._enabled or threading.current_thread() is not threading.main_thread():
            return
        self._loop = asyncio.get_running_loop()
        for sig in _STOP_SIGNALS:
            current = signal.getsignal(sig)
            if callable(current):
                self._previous[sig] = current
                signal.signal(sig, self._handle)

    async def __aexit__(self, *exc_info: object) -> None:
        for sig, previous in self._previous.items():
            # Someone who replaced our handler since owns the signal now.
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous.clear()
        if self._shutdown is not None:
            await self._shutdown

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # A Python signal handler runs between two bytecodes of the main thread,
            # possibly inside the loop's own code: schedule, never run, from here.
            loop.call_soon_threadsafe(self._start_shutdown, signum)
        previous = self._previous.get(signum)
        if previous is not None:
            previous(signum, frame)

    def _start_shutdown(self, signum: int) -> None:
        if self._shutdown is None:
            _log.info("purgatories_settling_on_signal", signal=signal.Signals(signum).name)
            self._shutdown = asyncio.get_running_loop().create_task(self._registry.shutdown())


class Server(uvicorn.Server):
    """A ``uvicorn.Server`` that shuts the purgatories down as soon as it starts stopping.

    uvicorn waits for requests in flight before the lifespan shutdown, so a
    long poll would hold the shutdown until its own deadline. This server
    expires every pending operation first: each client gets its answer at once,
    however the server was told to stop (a signal, or ``should_exit`` set by
    code, which :class:`PurgatoryLifespan`'s signal hook does not see).

    Args:
        config: the uvicorn config.
        purgatories: what to shut down; by default the ones a
            :class:`PurgatoryLifespan` published on the served application.
    """

    def __init__(self, config: uvicorn.Config, purgatories: Purgatories | None = None) -> None:
        super().__init__(config)
        self._purgatories = purgatories

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Shut the application's purgatories down (every client answered), then the server."""
        registry = self._purgatories
        if registry is None and self.config.loaded:
            registry = _find_purgatories(self.config.loaded_app)
        if registry is not None:
            await registry.shutdown()
        await super().shutdown(sockets)


def _find_purgatories(app: object) -> Purgatories | None:
    # Middleware wraps the application; each wrapper keeps the next one as `.app`.
    for _ in range(64):
        registry = getattr(getattr(app, "state", None), "purgatories", None)
        if isinstance(registry, Purgatories):
            return registry
        app = getattr(app, "app", None)
        if app is None:
            break
    return None


# -- dependencies ------------------------------------------------------------------------------


__all__ = ["Server", "SettleOnSignal"]
