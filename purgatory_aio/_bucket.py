"""A timer bucket: the entries of one wheel slot for one rotation.

Entries live in an insertion-ordered dict used as a set, so adding and
removing one is O(1) and the bucket needs no linked list of its own. The order
matters: entries with equal deadlines fire in the order they were added, which
keeps runs on a ManualClock deterministic (a set would order them by address).
"""

from __future__ import annotations

from math import inf as INF
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._timer import TimerEntry


class Bucket:
    """One slot of one wheel level.

    ``expiration`` is the tick index at which the bucket comes due at the latest,
    or -1 while it is not queued; it is processed from ``first`` on. A bucket
    enters the timer's queue of due times only when its expiration changes, i.e.
    at most once per rotation of its wheel.
    """

    __slots__ = ("entries", "expiration", "first", "level")

    def __init__(self, level: int) -> None:
        self.entries: dict[TimerEntry, None] = {}
        self.expiration = -1
        # The earliest deadline placed in it this rotation (entries cancelled since may
        # leave it too early, never too late): the reaper wakes for it, not for the
        # bucket's end, so an entry is not held back by the rest of its tick.
        self.first = INF
        self.level = level

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"<Bucket level={self.level} expiration={self.expiration} size={len(self.entries)}>"


class Carry(Bucket):
    """A cascade in progress: entries of a large higher-level bucket still to be placed.

    It is queued like a bucket (a carry ranks after level 0 at equal due ticks) and
    each reaper pass places the next chunk of its entries, so a bucket holding a
    large share of everything pending never stalls the loop in one go.
    """

    __slots__ = ()

    def __init__(self, entries: dict[TimerEntry, None]) -> None:
        super().__init__(CARRY_LEVEL)
        self.entries = entries


#: The level a carry is queued at: after every wheel level at an equal due tick.
CARRY_LEVEL = -1
