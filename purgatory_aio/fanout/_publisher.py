"""The fan-out's publisher: the task that hands the queued events to the engine in batches,
sends a batch again after a network error, and settles each event with the engine's answer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._logging import get_logger
from ._base import Event, FanoutUnavailable, say
from ._part import FanoutPart

if TYPE_CHECKING:
    from collections import deque


_log = get_logger("purgatory_aio.fanout")


class Publisher(FanoutPart):
    """The publishing task of :class:`~purgatory_aio.fanout.Fanout` (a part of it)."""

    # The fan-out's state this part reads and writes (set by Fanout.__init__).
    _queue: deque[Event]
    _inflight: list[Event]
    _wakeup: asyncio.Event
    _drained: asyncio.Event
    _batch: int
    _closing: bool
    _subscribe: bool

    async def _publisher(self) -> None:
        queue = self._queue
        backoff = 0.05
        while not self._closing:
            if not queue:
                self._drained.set()
                self._wakeup.clear()
                if self._stopped:
                    return
                await self._wakeup.wait()
                continue
            batch = self._inflight = [queue.popleft() for _ in range(min(self._batch, len(queue)))]
            while True:
                try:
                    results = await self.backend.store_and_publish(batch)
                except self.backend.network_errors as exc:
                    if self._closing:
                        return
                    self._stats.publish_failures += 1
                    self.down(exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
                except Exception as exc:  # the backend's bug: never wedge the publisher
                    results = [exc] * len(batch)
                break
            if self._closing:
                return  # stop() counted the batch as undelivered: it could not wait for it
            self._inflight = []
            backoff = 0.05
            self._up()
            if not self._subscribe:
                # No subscription to notice a failover by: the engine says where it wrote.
                switch = self.backend.take_switch()
                if switch is not None:
                    self.switched(*switch)
            self._settle_batch(batch, results)

    def _settle_batch(self, batch: list[Event], results: Sequence[BaseException | None]) -> None:
        stats = self._stats
        for event, error in zip(batch, results, strict=False):
            if error is None:
                stats.published += 1
                event.settle(None)
                continue
            stats.publish_errors += 1
            if stats.publish_errors % 1000 == 1:
                _log.error(
                    "fanout_event_refused",
                    address=self.address,
                    key=event.key,
                    error=say(error),
                    total=stats.publish_errors,
                )
            if isinstance(error, FanoutUnavailable):  # the engine's own words, address included
                event.settle(error)
                continue
            refused = f"{self.address} refused the event on {event.key!r}: {say(error)}"
            event.settle(FanoutUnavailable(refused))


__all__ = ["Publisher"]
