"""The timer's entries and wheels: buckets (intrusive lists of entries), the wheel levels
holding them, the queue of due buckets, the timer's entry API (placing an entry and
removing it) and the reaper's passes over what is due.

:class:`Wheels` knows nothing of event loops: :class:`~purgatory_aio._timer.Timer`
builds on it, binds it to a loop, arms the wake-ups it asks for
(:meth:`Wheels._sooner`) and runs a pass (:meth:`Wheels._advance`) on each one.

Buckets: entries are chained through their own ``_prev``/``_next`` fields (an
intrusive doubly linked list, Kafka's shape), so adding one writes the bucket's tail
and removing one writes its two neighbours: O(1) with no hashing. It replaced an
insertion-ordered dict used as a set. Measured by ``python -m bench w3`` on the
compiled build, a timer of a random long delay added and cancelled at once among 1M
pending cost 137-356 ns net with the dicts, depending on how full they happened to be
(a probe into a dict of 250k entries is a cache miss, and dead slots lengthen the
probes), and costs 94-99 ns with the lists, the same as among 1k; cancelling a random
one of 1M pending (W3's churn) went from 1.0-1.4 us to 0.6-0.8 us, two neighbours'
cache lines instead of a probe sequence. On the pure build linking is interpreted
attribute writes and costs more than a dict insert (W1-user +0.1 us per operation, W3
add+expire +0.4 us per timer); the compiled build is what users get by default. The
order matters: entries with equal deadlines fire in the order they were added, which
keeps runs on a ManualClock deterministic. Only this module links and unlinks entries.

Wheel levels: level 0 has ``size`` slots one tick wide. Level k+1 is created on
demand when a deadline lies beyond level k's range; each of its slots spans the whole
range of level k. Times are integer tick indexes, so slot arithmetic is exact.
"""

from __future__ import annotations

import heapq
import math
from operator import attrgetter
from typing import TYPE_CHECKING, Final

from ._errors import FATAL
from ._logging import get_logger
from ._native import i64

if TYPE_CHECKING:
    from ._entry import TimerEntry

__all__ = [
    "BATCH_LEVEL",
    "CARRY_LEVEL",
    "CASCADE_CHUNK",
    "MAX_TICKS",
    "NOT_QUEUED",
    "Bucket",
    "Wheel",
    "Wheels",
    "by_deadline",
]

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
#: The ``not_before`` of :meth:`Wheels.add_entry` for an entry being added (not re-placed).
NEW: Final = -(2**61)


#: The level of a carry: a large higher-level bucket whose cascade is in progress
#: (see Timer._cascade_urgent). It is queued after every wheel level at an equal due tick.
CARRY_LEVEL: Final = -1
#: The level of the bucket that holds a batch being fired (see :meth:`Bucket.detach`).
#: It is never queued.
BATCH_LEVEL: Final = -2
#: The ``expiration`` of a bucket that is not queued. Tick indexes are negative on a
#: clock that reads below zero (a ManualClock may start anywhere), so the marker lies
#: outside every index a timer can produce: a timer refuses a clock reading or a
#: deadline beyond MAX_TICKS (2**53) ticks either way and clamps past deadlines to its
#: current tick, so a level-0 index lies within +-2**53, and a higher level's
#: expiration (a multiple of its slot width, at most 2**55 ticks wide) within +-2**56.
#: Still a small int for the compiled build (mypyc's unboxed range is +-2**62).
NOT_QUEUED: Final = -(2**60)


class Bucket:
    """One slot of one wheel level, or a carry (``level == CARRY_LEVEL``).

    ``expiration`` is the tick index at which the bucket comes due at the latest,
    or :data:`NOT_QUEUED` while it is not queued; it is processed from ``first`` on.
    A bucket enters the timer's queue of due times only when its expiration changes, i.e.
    at most once per rotation of its wheel.
    """

    __slots__ = ("expiration", "first", "head", "level", "size", "tail")

    def __init__(self, level: int) -> None:
        self.head: TimerEntry | None = None
        self.tail: TimerEntry | None = None
        self.size: i64 = 0
        self.expiration = NOT_QUEUED
        # The earliest deadline placed in it this rotation (entries cancelled since may
        # leave it too early, never too late): the reaper wakes for it, not for the
        # bucket's end, so an entry is not held back by the rest of its tick.
        self.first = _INF
        self.level = level

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"<Bucket level={self.level} expiration={self.expiration} size={self.size}>"

    def remove(self, entry: TimerEntry) -> None:
        """Unlink ``entry``, which is in this bucket."""
        prev = entry._prev
        after = entry._next
        if prev is None:
            self.head = after
        else:
            prev._next = after
            entry._prev = None
        if after is None:
            self.tail = prev
        else:
            after._prev = prev
            entry._next = None
        entry._bucket = None
        self.size -= 1

    def entries(self) -> list[TimerEntry]:
        """The entries, oldest first, left in place."""
        out: list[TimerEntry] = []
        entry = self.head
        while entry is not None:
            out.append(entry)
            entry = entry._next
        return out

    def detach(self, holder: Bucket) -> list[TimerEntry]:
        """Unlink and return every entry, oldest first, each now held by ``holder``.

        A holder does not chain its entries (its ``head`` and ``tail`` stay None);
        it only marks them as still in the timer, so that :meth:`remove` takes one
        out like any other entry (unchained, it touches no neighbour). Its ``size``
        is the entries handed to it less those removed since.
        """
        out: list[TimerEntry] = []
        entry = self.head
        while entry is not None:
            after = entry._next
            entry._prev = entry._next = None
            entry._bucket = holder
            out.append(entry)
            entry = after
        self.head = self.tail = None
        holder.size = len(out)
        self.size = 0
        return out

    def take(self, limit: int = -1) -> list[TimerEntry]:
        """Unlink and return the oldest ``limit`` entries (all if negative), oldest first.

        Each comes back in no bucket, so the caller may fire, drop or re-place it.
        """
        out: list[TimerEntry] = []
        entry = self.head
        while entry is not None and limit != 0:
            after = entry._next
            entry._prev = entry._next = None
            entry._bucket = None
            out.append(entry)
            entry = after
            limit -= 1
        self.head = entry
        if entry is None:
            self.tail = None
        else:
            entry._prev = None
        self.size -= len(out)
        return out


class Wheel:
    """A ring of buckets ``tick`` base ticks wide, covering ``interval`` ticks.

    ``current`` is the start of the slot that is due now, always a multiple of
    ``tick``; slots for ``[current, current + interval)`` are valid. It only
    moves forward, and only once every bucket due by then has been flushed.
    """

    __slots__ = ("buckets", "current", "interval", "level", "size", "tick")

    def __init__(self, level: int, tick: int, size: int, start: int) -> None:
        self.level = level
        self.tick = tick
        self.size = size
        self.interval = tick * size
        self.current = start - start % tick
        self.buckets = [Bucket(level) for _ in range(size)]

    def advance(self, to: int) -> None:
        if to >= self.current + self.tick:
            self.current = to - to % self.tick

    def __repr__(self) -> str:
        return f"<Wheel level={self.level} tick={self.tick} current={self.current}>"


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
        self._count: i64 = 0
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

    def _leave_idle(self) -> None:
        """The first entry after an idle spell (or ever): the timer starts and catches up."""
        raise NotImplementedError

    def _disarm(self) -> None:
        """Nothing is pending any more: the timer withdraws its wake-up."""
        raise NotImplementedError

    # -- the entry API: the package's way in (a purgatory's admission and withdrawal) ------
    # Public within the package, named so: TimerHandle and an operation's owner call these
    # and no other method of the timer's internals.

    def add_entry(self, entry: TimerEntry, deadline: float, not_before: int = NEW) -> None:
        """Place ``entry`` due at ``deadline`` (its ``_deadline``, which the caller set:
        the wheels never write it); the caller has validated it and checked that it runs
        on this timer's loop (or on a loop, for the first add ever).

        The one placement: of an added entry (``not_before`` left as :data:`NEW`: it is
        counted and placed from the wheel's current tick on), and, by the timer's own
        passes, of one moved down by a cascade or put back by a firing pass (counted
        already, ``deadline`` its own, placed at tick ``not_before`` at the earliest).
        The level's search, the bucket's link and its queueing are in line here rather
        than in helpers of their own: an admission's add is one call (it was three:
        add_entry, _place, Bucket.append).
        """
        if not_before == NEW:
            if not self._count:
                self._leave_idle()
            self._count += 1
            not_before = self._level0.current
        # ceil(deadline / tick), the first tick not before the deadline, with a
        # multiplication and a truncation rather than float division and math.ceil.
        # Rounding can put an entry in a bucket a hair early; the deadline check at
        # firing then re-places it, so nothing fires early.
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
        # Linked at the bucket's tail (the only place an entry is linked).
        tail = bucket.tail
        entry._prev = tail
        entry._next = None
        if tail is None:
            bucket.head = entry
        else:
            tail._next = entry
        bucket.tail = entry
        entry._bucket = bucket
        bucket.size += 1
        if bucket.expiration != expiration:
            bucket.first = deadline  # a new rotation of this slot
            self._queue(bucket, expiration)
        elif deadline < bucket.first:
            bucket.first = deadline
            self._sooner(deadline)

    def remove_entry(self, entry: TimerEntry) -> None:
        """Take a pending entry out of its bucket (the caller checked ``_bucket``)."""
        bucket: Bucket = entry._bucket  # type: ignore[assignment]
        bucket.remove(entry)
        self._count -= 1
        # An emptied bucket stays queued: at worst the reaper wakes for it once and
        # finds nothing. Only when nothing at all is pending is the wake-up withdrawn.
        if not self._count and not self._reaping:
            self._disarm()

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
                self.add_entry(entry, entry._deadline, expiration)  # later in this tick: stays
            else:
                # Float rounding put it a hair before its deadline: next tick.
                self.add_entry(entry, entry._deadline, expiration + 1)
        self._firing = None

    def _put_back(self, batch: list[TimerEntry], start: int, expiration: int) -> None:
        """Return the entries of a batch not yet visited, still held, to the wheel."""
        self._firing = None
        held = self._batch
        for entry in batch[start:]:
            if entry._bucket is held:
                self.add_entry(entry, entry._deadline, expiration)

    def _cascade(self, bucket: Bucket, now: float, carried: list[Bucket]) -> None:
        """Move a due higher-level bucket's entries down to the levels that now cover them."""
        expiration = self._due_tick
        if bucket.size > CASCADE_CHUNK:
            self._cascade_urgent(bucket, now, expiration, carried)
            return
        for entry in bucket.take():
            self.add_entry(entry, entry._deadline, expiration)

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
                self.add_entry(entry, entry._deadline, expiration)
        if bucket.size:
            self._carries.add(bucket)
            carried.append(bucket)

    def _feed_carry(self, carry: Bucket, carried: list[Bucket]) -> None:
        """Place the next chunk of a carried cascade."""
        floor = self._level0.current
        for entry in carry.take(CASCADE_CHUNK):
            self.add_entry(entry, entry._deadline, floor)
        if carry.size:
            carried.append(carry)
        else:
            self._carries.discard(carry)
