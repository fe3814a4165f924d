"""One level of the hierarchical timing wheel.

Level 0 has ``size`` slots one tick wide. Level k+1 is created on demand when a
deadline lies beyond level k's range; each of its slots spans the whole range
of level k. Times are integer tick indexes, so slot arithmetic is exact.
"""

from __future__ import annotations

from ._bucket import Bucket


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
