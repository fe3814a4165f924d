"""Server-Sent Events of a value stream, framework-neutral.

The framework modules serve them (``value_events`` for FastAPI and for aiohttp). Each
event carries the value as its ``data`` and as its ``id``, so a browser's
``EventSource`` that reconnects sends the last value it saw back as ``Last-Event-ID``,
which :func:`last_event_value` reads, and the new stream resumes after it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from .._validation import check_finite
from ..fanout import ValueStream

#: The response headers of an event stream: never cached, never buffered by a proxy
#: (nginx holds a response back unless told not to, which would delay every event).
EVENT_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def format_event(value: float) -> str:
    """One event: ``id`` and ``data`` both the value (``repr``: it reads back exactly)."""
    text = repr(value)
    return f"id: {text}\ndata: {text}\n\n"


async def server_sent_events(values: ValueStream) -> AsyncIterator[str]:
    """Each value of ``values`` as one event, until the stream ends; closing this
    generator (the client left) closes the stream, which releases what it watched."""
    async with values:
        async for value in values:
            yield format_event(value)


def last_event_value(header: str | None) -> float | None:
    """The value a reconnecting client saw last (its ``Last-Event-ID`` header), or None.

    Raises:
        ValueError: the header is not a finite number (the framework answers 400).
    """
    if header is None or not header.strip():
        return None
    try:
        number = float(header)
    except ValueError:
        raise ValueError(
            f"Last-Event-ID must be a value this stream sent, got {header!r}"
        ) from None
    return check_finite(number, "Last-Event-ID")
