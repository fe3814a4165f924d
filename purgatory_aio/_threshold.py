"""Threshold watches: operations waiting for a per-key monotonic value to reach their own mark.

A plain watch list makes every ``check_and_complete`` try every operation on
the key — O(n) per check, which hurts when thousands of produce requests wait
on one partition's high watermark. Operations whose condition is "this key's
value has reached my threshold" are kept in a min-heap by threshold instead,
so advancing the value pops exactly the operations it can satisfy:
O(k log n) for k of them.

Settled operations are not searched for in the heap; they are skipped when
popped, and the heap is compacted once they make up half of it.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._operation import DelayedOperation

_order = itertools.count()


class ThresholdKeys(tuple):  # type: ignore[type-arg]
    """The keys of an operation held in a threshold index rather than a watch list."""

    __slots__ = ()


class ThresholdIndex:
    """The operations on one key, ordered by the value each waits for."""

    __slots__ = ("heap", "stale")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, DelayedOperation[Any]]] = []
        self.stale = 0  # settled operations still in the heap

    def __len__(self) -> int:
        return len(self.heap)

    def push(self, threshold: float, op: DelayedOperation[Any]) -> None:
        # The counter keeps equal thresholds first-in first-out and never compares ops.
        heapq.heappush(self.heap, (threshold, next(_order), op))

    def pop_reached(self, value: float) -> list[DelayedOperation[Any]]:
        """Remove and return every entry whose threshold is <= value, lowest first."""
        heap = self.heap
        reached = []
        while heap and heap[0][0] <= value:
            reached.append(heapq.heappop(heap)[2])
        return reached

    def compact(self, is_settled: Any) -> int:
        """Drop settled operations; return how many entries were removed."""
        before = len(self.heap)
        self.heap = [entry for entry in self.heap if not is_settled(entry[2])]
        heapq.heapify(self.heap)
        self.stale = 0
        return before - len(self.heap)

    def operations(self) -> list[DelayedOperation[Any]]:
        """Every operation in the index, lowest threshold first."""
        return [entry[2] for entry in sorted(self.heap)]
