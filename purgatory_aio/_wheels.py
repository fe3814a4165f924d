"""The wheels of a timer: its levels, the queue of due buckets, where an entry goes, and
the reaper's passes over what is due.

:class:`Wheels` knows nothing of event loops: :class:`~purgatory_aio._timer.Timer`
builds on it, binds it to a loop, arms the wake-ups it asks for
(:meth:`Wheels._sooner`) and runs a pass (:meth:`Wheels._advance`) on each one.
"""

from __future__ import annotations

import heapq
import math
from operator import attrgetter
from typing import TYPE_CHECKING, Final

from ._bucket import BATCH_LEVEL, CARRY_LEVEL, NOT_QUEUED, Bucket
from ._errors import FATAL
from ._logging import get_logger
from ._wheel import Wheel

if TYPE_CHECKING:
    from ._entry import TimerEntry

__all__ = ["CASCADE_CHUNK", "MAX_TICKS", "Wheels", "by_deadline"]

_log: Final = get_logger("purgatory_aio.timer")

_INF: Final = math.inf
#: Deadlines are placed at whole ticks up to this many; floats count them exactly, and
#: at most about log(MAX_TICKS) / log(wheel_size) levels exist (12 at the default shape).
MAX_TICKS: Final = 2**53
#: Entries a cascade re-places per loop iteration at most (see Wheels._cascade_urgent).
CASCADE_CHUNK: Final = 1024
by_deadline: Final = attrgetter("_deadline")
_heappush: Final = heapq.heappush
_heappop: Final = heapq.heappop


class Wheels:
    """Levels of wheels over one tick, and the queue of the buckets due next."""

    __slots__ = (
        "_batch",
        "_carries",
        "_count",
        "_due_tick",
        "_epoch",
        "_firing",
        "_heap",
        "_level0",
        "_levels",
        "_per_tick",
        "_reaping",
        "_tick",
        "errors",
        "horizon",
    )

    def __init__(self, tick: float, size: int, now: float) -> None:
        #: Deadlines (clock time) at or beyond this cannot be placed: refused.
        self.horizon = MAX_TICKS * tick
        self._tick = tick
        self._per_tick = 1.0 / tick
        self._level0 = Wheel(0, 1, size, int(now // tick))
        self._levels = [self._level0]
        self._heap: list[tuple[int, int, int, Bucket]] = []
        self._carries: set[Bucket] = set()  # cascades still being placed
        # Holds the entries of the level-0 bucket being fired until each is visited; the
        # batch itself is _firing, for a close() from one of its callbacks.
        self._batch = Bucket(BATCH_LEVEL)
        self._firing: list[TimerEntry] | None = None
        self._count = 0
        self._due_tick = 0  # the tick of the bucket a pass is flushing
        self._epoch = 0  # counts drains, so a pass notices close() from a callback
        self._reaping = False
        #: Callbacks that raised (each is logged, none stops the timer).
        self.errors = 0

    def _sooner(self, when: float) -> None:
        """Something is now due at ``when``: the timer wakes earlier if need be."""
        raise NotImplementedError

    def _tick_of(self, now: float) -> int:
        """The tick ``now`` falls in, for a clock that may have run past the horizon
        (1e308 // 1 ms is inf): such a reading stands at the last tick counted."""
        if now < self.horizon:
            return int(now // self._tick)
        return MAX_TICKS

    def _place(self, entry: TimerEntry, not_before: int) -> None:
        """Place an entry already counted, at tick ``not_before`` at the earliest: the
        one placement, of an added entry (at the wheel's current tick) and of one moved
        down by a cascade or put back by a firing pass.

        The level's search and the bucket's queueing are in line here rather than in
        helpers of their own: one call instead of three under an admission (the
        level-0 case was inlined into the add by hand before, a second copy).
        """
        # ceil(deadline / tick), the first tick not before the deadline, with a
        # multiplication and a truncation rather than float division and math.ceil.
        # Rounding can put an entry in a bucket a hair early; the deadline check at
        # firing then re-places it, so nothing fires early.
        deadline = entry._deadline
        scaled = deadline * self._per_tick
        tick_index = int(scaled)
        if tick_index < scaled:
            tick_index += 1
        if tick_index < not_before:
            tick_index = not_before
        wheel = self._level0
        if tick_index < wheel.current + wheel.size:
            bucket = wheel.buckets[tick_index % wheel.size]
            expiration = tick_index
        else:
            levels = self._levels
            i = 1
            while True:
                if i == len(levels):
                    below = levels[-1]
                    levels.append(Wheel(i, below.interval, below.size, below.current))
                wheel = levels[i]
                if tick_index < wheel.current + wheel.interval:
                    slot = tick_index // wheel.tick
                    bucket = wheel.buckets[slot % wheel.size]
                    expiration = slot * wheel.tick
                    break
                i += 1
        bucket.append(entry)
        if bucket.expiration != expiration:
            bucket.first = deadline  # a new rotation of this slot
            self._queue(bucket, expiration)
        elif deadline < bucket.first:
            bucket.first = deadline
            self._sooner(deadline)

    def _queue(self, bucket: Bucket, expiration: int) -> None:
        bucket.expiration = expiration
        # At equal due ticks higher levels go first, so that entries they cascade into
        # level 0 join that tick's bucket before it is flushed (deadline order holds).
        _heappush(self._heap, (expiration, -bucket.level, id(bucket), bucket))
        when = expiration * self._tick
        self._sooner(bucket.first if bucket.first < when else when)

    def _advance(self, now: float) -> None:
        """One pass: flush every bucket due by ``now``, then catch the wheels up."""
        carried: list[Bucket] = []
        epoch = self._epoch
        self._reaping = True
        try:
            fired: set[int] = set()  # level-0 buckets fired in this pass
            while self._epoch == epoch:
                bucket = self._next_due(now, fired)
                if bucket is None:
                    self._catch_up(now)
                    break
                level = bucket.level
                if level == CARRY_LEVEL:
                    self._feed_carry(bucket, carried)
                elif level:
                    self._cascade(bucket, now, carried)
                else:
                    fired.add(id(bucket))
                    self._fire_bucket(bucket, now)
        finally:
            self._reaping = False
            if self._epoch == epoch:
                # Unfinished cascades continue on the next loop iteration, after whatever
                # else the loop has to run (also after a fatal error, if it runs on).
                now_tick = self._level0.current
                for carry in carried:
                    carry.first = _INF
                    self._queue(carry, now_tick)

    def _next_due(self, now: float, fired: set[int]) -> Bucket | None:
        """Take the earliest queued bucket if it is due by ``now``; None once none is."""
        heap = self._heap
        tick = self._tick
        while heap:
            expiration, _, key, bucket = heap[0]
            # Due at the bucket's end, or from its earliest deadline on: the entries
            # already due are fired and the rest stay for the next wake-up.
            if expiration * tick > now and bucket.first > now:
                return None
            if key in fired and bucket.expiration == expiration:
                # A callback of this pass added an entry that is due already (a zero
                # delay, say). It runs on the next loop iteration, as loop.call_soon
                # would: a callback that keeps re-adding itself cannot hold the loop.
                return None
            _heappop(heap)
            if bucket.expiration != expiration:
                continue  # queued for a rotation that was reset meanwhile
            bucket.expiration = NOT_QUEUED
            if bucket.level != CARRY_LEVEL:
                for wheel in self._levels:
                    wheel.advance(expiration)
                if not bucket.size:
                    continue
            self._due_tick = expiration
            return bucket
        return None

    def _catch_up(self, now: float) -> None:
        """Everything due is flushed: the wheels move on to the clock's tick."""
        now_tick = self._tick_of(now)
        heap = self._heap
        if not heap or heap[0][0] > now_tick:
            for wheel in self._levels:
                wheel.advance(now_tick)

    def _fire_bucket(self, bucket: Bucket, now: float) -> None:
        """Fire a due level-0 bucket's entries whose deadline has passed, in deadline order."""
        expiration = self._due_tick
        # Detach the batch first: a callback may cancel or re-add any entry of it. Until
        # visited, each stays in the timer and counted, held by self._batch: an earlier
        # callback that cancels, completes or re-adds one takes it out (and uncounts it)
        # through remove_entry, as from any bucket.
        held = self._batch
        batch = bucket.detach(held)
        if len(batch) > 1:
            batch.sort(key=by_deadline)
        self._firing = batch
        epoch = self._epoch
        tick = self._tick
        for position, entry in enumerate(batch):
            if entry._bucket is not held:
                continue  # taken out by a callback: gone, or re-added where it stands now
            if entry._deadline <= now:
                # Out of the timer before it runs. This store is what holding the batch
                # costs the firing path: 10 instructions per fired entry in here, about
                # what detach() saves over take() (callgrind, compiled: ~15,650 per
                # operation watched and expired before and after, within +-50 noise).
                entry._bucket = None
                self._count -= 1
                try:
                    entry._fire()
                except FATAL:
                    self._put_back(batch, position + 1, expiration)
                    raise
                except BaseException:
                    # Any other exception, CancelledError included: counted and logged,
                    # and the pass goes on.
                    self.errors += 1
                    _log.exception("timer_callback_error", entry=repr(entry))
                if self._epoch != epoch:
                    return  # close() from the callback: it took the rest of the batch
            elif expiration * tick > now:
                self._place(entry, expiration)  # later in this tick: stays
            else:
                # Float rounding put it a hair before its deadline: next tick.
                self._place(entry, expiration + 1)
        self._firing = None

    def _put_back(self, batch: list[TimerEntry], start: int, expiration: int) -> None:
        """Return the entries of a batch not yet visited, still held, to the wheel."""
        self._firing = None
        held = self._batch
        for entry in batch[start:]:
            if entry._bucket is held:
                self._place(entry, expiration)

    def _cascade(self, bucket: Bucket, now: float, carried: list[Bucket]) -> None:
        """Move a due higher-level bucket's entries down to the levels that now cover them."""
        expiration = self._due_tick
        if bucket.size > CASCADE_CHUNK:
            self._cascade_urgent(bucket, now, expiration, carried)
            return
        for entry in bucket.take():
            self._place(entry, expiration)

    def _cascade_urgent(
        self, bucket: Bucket, now: float, expiration: int, carried: list[Bucket]
    ) -> None:
        """Cascade a large bucket: place at once only the entries due soon.

        A high-level bucket can hold a large share of everything pending (one
        level-2 slot spans 400 ms at the default shape). Re-placing all of it in one
        go would stall the loop and make every timer due meanwhile late. Instead its
        bucket itself becomes a *carry* (level ``CARRY_LEVEL``) and a fresh bucket
        takes its slot, so no entry is touched to move it: the entries due soon are
        placed now, the rest a chunk per loop iteration, well before any is due.
        """
        wheel = self._levels[bucket.level]
        wheel.buckets[(expiration // wheel.tick) % wheel.size] = Bucket(bucket.level)
        # Its entries still point to it (through their _bucket), so a cancel during
        # the cascade finds them where they are.
        bucket.level = CARRY_LEVEL
        # Enough lead for the chunks to finish first, at a chunk per millisecond or so.
        lead = max(2 * self._levels[wheel.level - 1].tick * self._tick, bucket.size / 500_000)
        horizon = now + lead
        for entry in bucket.entries():
            if entry._deadline < horizon:
                bucket.remove(entry)
                self._place(entry, expiration)
        if bucket.size:
            self._carries.add(bucket)
            carried.append(bucket)

    def _feed_carry(self, carry: Bucket, carried: list[Bucket]) -> None:
        """Place the next chunk of a carried cascade."""
        floor = self._level0.current
        for entry in carry.take(CASCADE_CHUNK):
            self._place(entry, floor)
        if carry.size:
            carried.append(carry)
        else:
            self._carries.discard(carry)
