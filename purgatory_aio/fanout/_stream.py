"""Streams: the successive values of one key, as an async iterator, in any process.

A :class:`ValueStream` yields each new maximum of a key's monotonic value once,
strictly increasing, until its deadline passes, the application cancels the key
(:meth:`Fanout.cancel <purgatory_aio.fanout.Fanout.cancel>`), its purgatory shuts
down, or the consumer closes it. It holds two operations in its purgatory: one that
keeps the key watched for the stream's whole life (so the purgatory keeps the key's
latest value between two waits, and the fan-out, which reads the stored value of a
key when it gains its first watcher, re-reads it after every outage), and a
:class:`ValueReached` waiting for a value above the last one yielded. The next one
is watched *before* a value is handed to the consumer, so whatever is advanced while
the body of the loop runs is already caught and comes out next.
"""

from __future__ import annotations

import asyncio
import math
import sys
from typing import Final, Literal, Self, SupportsFloat

from .._errors import PurgatoryClosed
from .._operation import DelayedOperation
from .._purgatory import Purgatory
from .._validation import check_positive_seconds
from ._checks import check_key, check_value
from ._fanout import Fanout
from ._value_reached import ValueReached

#: Why a stream ended (:attr:`ValueStream.ended`).
EndReason = Literal["deadline", "cancelled", "shutdown", "closed", "exhausted"]

# The threshold of a stream that yields the current value first: every finite value reaches it.
_LOWEST: Final = -sys.float_info.max


class _Presence(DelayedOperation[None]):
    """Keeps a stream's key watched from its start to its end; never completes by itself."""

    __slots__ = ()

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        return None


class ValueStream:
    """The successive maxima of ``key``'s value, as an async iterator (one consumer).

    Get one from :meth:`Fanout.stream <purgatory_aio.fanout.Fanout.stream>` and use it
    as an async context manager, so leaving the block releases what it watches::

        async with fanout.stream(purgatory, "job:7", timeout=300) as values:
            async for value in values:
                print(value)  # strictly increasing; the latest value first, if any

    Guarantees:

    * each value yielded is greater than the one before (a value the key already
      had, replayed, duplicated or reordered, never comes out twice);
    * none is missed between two iterations: a value advanced while the consumer
      is busy is yielded next (the highest one, if several came meanwhile);
    * the iteration ends (``StopAsyncIteration``, :attr:`ended` says why) at the
      deadline (``"deadline"``), when the application cancels the key
      (``"cancelled"``), when the purgatory shuts down (``"shutdown"``), when the
      value can rise no further (``"exhausted"``), or after :meth:`aclose`
      (``"closed"``);
    * cancelling the consuming task, or closing the stream, withdraws the two
      operations it holds: nothing stays pending for a consumer who is gone.

    Args:
        fanout: the fan-out the values travel through (``MemoryFanout`` in one process).
        purgatory: the purgatory that holds the stream's operations (attached to
            ``fanout``); its clock times the deadline.
        key: the key whose value is streamed.
        timeout: seconds from now, on the purgatory's clock, after which the stream ends.
        after: yield only values above this one (None: the current value first).

    Raises:
        TypeError, ValueError: a bad argument (nothing is attached or watched then).
    """

    __slots__ = (
        "_deadline",
        "_fanout",
        "_op",
        "_presence",
        "_purgatory",
        "ended",
        "key",
        "last",
    )

    def __init__(
        self,
        fanout: Fanout,
        purgatory: Purgatory,
        key: str,
        *,
        timeout: float,
        after: SupportsFloat | None = None,
    ) -> None:
        if not isinstance(fanout, Fanout):
            raise TypeError(f"fanout must be a Fanout, got {fanout!r}")
        if not isinstance(purgatory, Purgatory):
            raise TypeError(f"purgatory must be a Purgatory, got {purgatory!r}")
        self.key: str = check_key(key, fanout.backend.max_key_bytes)
        seconds = check_positive_seconds(timeout, "timeout")
        #: The last value yielded (or ``after``); None before the first.
        self.last: float | None = None if after is None else check_value(after, "after")
        #: Why the stream ended, or None while it runs.
        self.ended: EndReason | None = None
        self._fanout = fanout
        self._purgatory = purgatory
        self._deadline = purgatory.time() + seconds
        self._op: ValueReached | None = None
        self._presence: _Presence | None = None
        fanout.attach(purgatory)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> float:
        if self.ended is not None:
            raise StopAsyncIteration
        op = self._op
        if op is None:
            op = await self._arm()
            if op is None:
                raise StopAsyncIteration
        try:
            reached = await op
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if op.cancelled and not (task is not None and task.cancelling()):
                # The application cancelled the key (fanout.cancel): the stream ends.
                self._end("cancelled")
                self._close()
                raise StopAsyncIteration from None
            self._close()  # the consumer itself is cancelled: withdraw what it watched
            raise
        except BaseException:
            self._close()
            raise
        self._op = None
        if reached is None:
            self._end(self._expiry())
            self._close()
            raise StopAsyncIteration
        # Several advances may have come since the operation completed: the latest counts.
        known = self._fanout.value(self.key)
        value = reached if known is None or known < reached else known
        self.last = value
        # Watch for the next value before the consumer gets this one: an advance made while
        # the body of its loop runs completes that operation and comes out next.
        await self._arm()
        return value

    async def _arm(self) -> ValueReached | None:
        """Watch the operation for the next value; None (and ``ended`` set) if none can come."""
        purgatory = self._purgatory
        presence = self._presence
        if presence is not None and presence.done():
            # Cancelled with the key, or expired (the deadline, a shutdown) between two waits.
            self._end("cancelled" if presence.cancelled else self._expiry())
            self._close()
            return None
        remaining = self._deadline - purgatory.time()
        if remaining <= 0:
            self._end("deadline")
            self._close()
            return None
        last = self.last
        threshold = _LOWEST if last is None else math.nextafter(last, math.inf)
        if math.isinf(threshold):
            self._end("exhausted")
            self._close()
            return None
        try:
            if presence is None:
                presence = self._presence = _Presence(remaining)
                await purgatory.try_complete_else_watch(presence, (self.key,))
            op = ValueReached(self._fanout, self.key, threshold, remaining)
            await purgatory.watch_threshold(op, self.key, threshold)
        except PurgatoryClosed:
            self._end("shutdown")
            return None
        self._op = op
        return op

    def _expiry(self) -> EndReason:
        return "shutdown" if self._purgatory.closed else "deadline"

    def _end(self, reason: EndReason) -> None:
        if self.ended is None:
            self.ended = reason

    def _close(self) -> None:
        op, self._op = self._op, None
        if op is not None:
            op.cancel()
        presence, self._presence = self._presence, None
        if presence is not None:
            presence.cancel()
        self._end("closed")

    async def aclose(self) -> None:
        """End the stream and withdraw the operation it watches (idempotent)."""
        self._close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._close()

    def __repr__(self) -> str:
        state = f"ended={self.ended}" if self.ended is not None else "open"
        return f"<ValueStream {self.key!r} last={self.last} {state}>"
