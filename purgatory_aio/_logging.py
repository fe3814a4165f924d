"""How the library logs: through structlog, silent below warning unless the application asks.

A library must not decide what an application prints. structlog's defaults,
left unconfigured, print every level to standard output, so the library's
loggers pass debug and info events on only once the application has configured
structlog (``structlog.configure(...)``; then its own level filter decides).
Warnings and errors always go through, as the standard library's last-resort
handler would show them.

To see the library's debug and info events, configure structlog, e.g.::

    import logging, structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
"""

from __future__ import annotations

from typing import Any

import structlog

__all__ = ["get_logger"]


class LibraryLogger:
    """A structlog logger whose debug and info wait for the application's configuration."""

    __slots__ = ("_logger",)

    def __init__(self, name: str) -> None:
        self._logger: Any = structlog.get_logger(name)

    def debug(self, event: str, **fields: Any) -> None:
        if structlog.is_configured():
            self._logger.debug(event, **fields)

    def info(self, event: str, **fields: Any) -> None:
        if structlog.is_configured():
            self._logger.info(event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._logger.warning(event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._logger.error(event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._logger.exception(event, **fields)


def get_logger(name: str) -> LibraryLogger:
    """The library's logger for module ``name``."""
    return LibraryLogger(name)
