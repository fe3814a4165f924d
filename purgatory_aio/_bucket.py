"""A timer bucket: the entries of one wheel slot for one rotation.

Entries are chained through their own ``_prev``/``_next`` fields (an intrusive
doubly linked list, Kafka's shape), so adding one writes the bucket's tail and
removing one writes its two neighbours: O(1) with no hashing. It replaced an
insertion-ordered dict used as a set. Measured by ``python -m bench w3`` on the
compiled build, a timer of a random long delay added and cancelled at once among
1M pending cost 137-356 ns net with the dicts, depending on how full they happened
to be (a probe into a dict of 250k entries is a cache miss, and dead slots
lengthen the probes), and costs 94-99 ns with the lists, the same as among 1k;
cancelling a random one of 1M pending (W3's churn) went from 1.0-1.4 us to
0.6-0.8 us, two neighbours' cache lines instead of a probe sequence. On the pure
build linking is interpreted attribute writes and costs more than a dict insert
(W1-user +0.1 us per operation, W3 add+expire +0.4 us per timer); the compiled
build is what users get by default. The order matters: entries with equal
deadlines fire in the order they were added, which keeps runs on a ManualClock
deterministic.

Only this module links and unlinks entries; the timer owns everything else.
"""

from __future__ import annotations

from math import inf as INF
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ._entry import TimerEntry

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
        self.size = 0
        self.expiration = NOT_QUEUED
        # The earliest deadline placed in it this rotation (entries cancelled since may
        # leave it too early, never too late): the reaper wakes for it, not for the
        # bucket's end, so an entry is not held back by the rest of its tick.
        self.first = INF
        self.level = level

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"<Bucket level={self.level} expiration={self.expiration} size={self.size}>"

    def append(self, entry: TimerEntry) -> None:
        """Link ``entry`` (in no bucket) at the end."""
        tail = self.tail
        entry._prev = tail
        entry._next = None
        if tail is None:
            self.head = entry
        else:
            tail._next = entry
        self.tail = entry
        entry._bucket = self
        self.size += 1

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
