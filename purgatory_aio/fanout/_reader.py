"""The fan-out's reader of the engine's store: the stored values of newly watched keys,
read in coalesced round trips, and the resyncs that re-read every watched key."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Final

from .._logging import get_logger
from ._base import say
from ._part import FanoutPart

if TYPE_CHECKING:
    from .._relay import Receiver

_log = get_logger("purgatory_aio.fanout")

#: Keys read from the engine per round trip.
READ_CHUNK: Final = 1000


class StoreReader(FanoutPart):
    """The store reading and resyncing tasks of :class:`~purgatory_aio.fanout.Fanout` (a part
    of it)."""

    # The fan-out's state this part reads and writes (set by Fanout.__init__).
    _receiver: Receiver
    _to_read: dict[str, None]
    _reader: asyncio.Task[None] | None
    _resync_task: asyncio.Task[None] | None
    _resync_again: bool
    _loop: asyncio.AbstractEventLoop | None
    _timeout: float
    _resync_interval: float
    _subscribe: bool
    _started: bool

    if TYPE_CHECKING:  # defined by Fanout

        async def resync(self) -> int: ...

    def _key_listener(self, key: Hashable, held: bool) -> None:
        # Called in the middle of a purgatory's bookkeeping: record, schedule, nothing more.
        if not isinstance(key, str):
            return
        if held:
            if self._started and not self._stopped and self._subscribe:
                self._to_read[key] = None
                self._start_reader()
        else:
            self._to_read.pop(key, None)

    def _want(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            if isinstance(key, str) and key:
                self._to_read[key] = None
        self._start_reader()

    def _start_reader(self) -> None:
        loop = self._loop
        if loop is None or self._stopped or not self._to_read:
            return
        if self._reader is None or self._reader.done():
            self._reader = loop.create_task(self._read_stored())

    async def _read_stored(self) -> None:
        """Read the stored values of newly watched keys, in coalesced round trips, and apply
        them. Failures are retried after a pause; the operations meanwhile wait for their
        deadlines, never for this."""
        await asyncio.sleep(0)  # let the watches of this loop iteration join
        backoff = 0.05
        to_read = self._to_read
        while to_read and not self._stopped:
            keys = list(itertools.islice(to_read, READ_CHUNK))
            for key in keys:
                del to_read[key]
            values = await self._read(keys)
            if values is None:
                for key in keys:
                    to_read.setdefault(key, None)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            self._apply_values(values)

    async def _read(self, keys: list[str]) -> dict[str, float] | None:
        try:
            async with asyncio.timeout(self._timeout):
                values = await self.backend.read(keys, self)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._stats.refresh_failures += 1
            if isinstance(exc, self.backend.network_errors):
                self.down(exc)
            else:
                _log.warning("fanout_read_failed", address=self.address, error=say(exc))
            return None
        self._up()
        return values

    def _apply_values(self, values: dict[str, float]) -> int:
        completed = 0
        for key, value in values.items():
            try:
                completed += self._receiver.apply_advance(key, value)
            except Exception as exc:
                self._receiver.apply_failed(key, exc)
        return completed

    def _schedule_resync(self) -> None:
        if self._stopped:
            return
        if self._resync_task is not None and not self._resync_task.done():
            self._resync_again = True
            return
        if self._loop is not None:
            self._resync_task = self._loop.create_task(self._resync_loop())

    async def _resync_loop(self) -> None:
        backoff = 0.05
        while True:
            self._resync_again = False
            failures = self._stats.refresh_failures
            try:
                await self.resync()
            except Exception as exc:  # never let the safety net take the subscriber down
                _log.warning("fanout_resync_failed", error=repr(exc))
            if self._stats.refresh_failures != failures and not self._stopped:
                # The re-read failed (a connection still held by a server that has just
                # failed over, an engine down again): nothing else may trigger another
                # before the safety net, so try again, as the reader of new keys does.
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if not self._resync_again:
                return

    async def _subscriber(self) -> None:
        backoff = 0.05
        while not self._stopped:
            try:
                await self.backend.subscribe(self)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the backend gave up or failed: subscribe again
                self._receiver.apply_errors += 1
                self.down(exc)
                _log.error("fanout_subscriber_failed", address=self.address, error=say(exc))
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _safety_net(self) -> None:
        while True:
            await asyncio.sleep(self._resync_interval)
            self._schedule_resync()


__all__ = ["READ_CHUNK", "StoreReader"]
