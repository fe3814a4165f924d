"""A threshold index: the operations on one key, ordered by the value each waits for.

:meth:`Purgatory.watch_threshold` puts an operation here; :meth:`Purgatory.advance_key`
takes exactly those whose threshold the key's new value reaches, lowest first, in
O(log n + k) for k of them. The watch store (:mod:`._watches`) holds one index per
key and keeps the books (counts, walks, purges); this module only orders.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from bisect import bisect_right
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Final

from . import _gc
from ._states import ENDED

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = ["MERGE_MIN", "ThresholdIndex"]

_order = itertools.count()

# A static in the compiled build (a C call, no lookup); None in the pure build (see _gc).
_untrack_container: Final = _gc.untrack_container


#: An entry of an index's fresh heap: (threshold, arrival number, operation). The
#: arrival number is unique, so entries compare without ever comparing operations, and
#: equal thresholds stay first-in first-out.
Entry = tuple[float, int, "DelayedOperation[Any]"]

#: The fresh heap is merged into the sorted run once it holds more than this many
#: entries and more than an eighth of the run (amortized O(1) per push).
MERGE_MIN: Final = 64


class ThresholdIndex:
    """The operations on one key, ordered by the value each waits for.

    Two parts, both ordered by (threshold, arrival):

    * the run, a sorted sequence read from ``start`` on, kept as two parallel
      columns: ``thresholds`` (an ``array('d')``: plain doubles, no object per
      entry) and ``ops``. Reaching a value takes a slice off the front of ``ops``:
      one bisection of ``thresholds``, then a sequential copy of pointers.
      Popping the same entries off a heap of 100k sifts each through 17 levels of
      tuples scattered in memory, a cache miss per level; in W2 at P=100k that was
      more than half of ``advance_key`` (perf, cpu-clock), and a run halved the
      cost per completed operation there. The columns (rather than a list of
      ``(threshold, arrival, operation)`` tuples) mean an advance touches no
      tuple, float or int per operation: three objects allocated when it was
      watched, scattered in memory by the time it is reached, one cache miss and
      one deallocation each. W2 at P=100k in steady state, per reached operation
      (callgrind, compiled, asyncio): taking it off the index and freeing its
      entry cost 720 instructions and 6.2 misses of a 1 MB cache, now 100
      instructions, and the whole advance_key 5.68k -> 4.99k instructions and
      14.8 -> 8.3 misses, with the changes to the walk below.
    * ``fresh``, a heap of the entries pushed since the run was last rebuilt. An
      entry at or above the run's end joins the run directly (thresholds that
      rise with the key's value, the common case); others wait here and are
      merged into the run once the heap outgrows an eighth of the run.

    Every entry of the run is older than every entry of the heap (an entry joins
    the run directly only while the heap is empty), so ties between the two parts
    go to the run. Consumed slots of ``ops`` before ``start`` are cleared at once
    (they hold no operation) and dropped once they make up half of the run.

    ``keys`` is the ``(key,)`` of the index's first operation, shared by later
    operations watched under the very same key object as their ``keys``: a tuple
    less to hold per pending operation (48 bytes) and to free when it settles (W2
    as above: 100 instructions and 0.5 misses per reached operation).
    """

    __slots__ = ("fresh", "keys", "ops", "stale", "start", "thresholds")

    def __init__(self, keys: tuple[Hashable, ...]) -> None:
        self.thresholds: array[float] = array("d")
        self.ops: list[DelayedOperation[Any] | None] = _untracked([])
        self.start = 0
        self.fresh: list[Entry] = _untracked([])
        self.stale = 0  # settled operations still held
        self.keys = keys

    def __len__(self) -> int:
        return len(self.ops) - self.start + len(self.fresh)

    def push(self, threshold: float, op: DelayedOperation[Any]) -> None:
        fresh = self.fresh
        if not fresh:
            thresholds = self.thresholds
            size = len(thresholds)
            if self.start == size:
                if size:  # every slot consumed: start the run afresh
                    del thresholds[:]
                    self.ops.clear()
                    self.start = 0
                thresholds.append(threshold)
                self.ops.append(op)
                return
            if threshold >= thresholds[size - 1]:
                thresholds.append(threshold)  # still sorted: no live entry is above it
                self.ops.append(op)
                return
        entry: Any = (threshold, next(_order), op)
        if _untrack_container is not None:
            # The entry exists for this operation alone: out of the cyclic GC with it
            # (see _gc). Boxed once, as ``Any``, so that it is the tuple the heap holds.
            _untrack_container(entry)
        heapq.heappush(fresh, entry)
        if len(fresh) > MERGE_MIN and len(fresh) > (len(self.ops) - self.start) >> 3:
            self._merge()

    def _merge(self) -> None:
        """Fold the fresh heap into the sorted run.

        Only the part of the run above the smallest fresh threshold is re-sorted with
        the heap's entries: with thresholds that mostly rise, that part is short,
        and a merge costs O(k log k) for k fresh entries rather than a pass over
        the whole run (whose operations are scattered in memory).
        """
        thresholds = self.thresholds
        ops = self.ops
        if self.start:
            del thresholds[: self.start]
            del ops[: self.start]
            self.start = 0
        fresh = self.fresh
        self.fresh = _untracked([])
        fresh.sort()
        low = fresh[0][0]
        if thresholds and low < thresholds[-1]:
            cut = bisect_right(thresholds, low)
            # The run's entries first: on equal thresholds they are the older ones, and
            # the sort is stable (two sorted runs: one merge pass).
            pairs = list(zip(thresholds[cut:], ops[cut:], strict=True))
            del thresholds[cut:]
            del ops[cut:]
            pairs.extend([(entry[0], entry[2]) for entry in fresh])
            pairs.sort(key=_first)
            thresholds.extend([pair[0] for pair in pairs])
            ops.extend([pair[1] for pair in pairs])
        else:
            thresholds.extend([entry[0] for entry in fresh])
            ops.extend([entry[2] for entry in fresh])

    def _live_run(self) -> list[tuple[float, DelayedOperation[Any] | None]]:
        start = self.start
        return list(zip(self.thresholds[start:], self.ops[start:], strict=True))

    def pop_reached(self, value: float) -> list[DelayedOperation[Any]]:
        """Remove and return every entry whose threshold is <= value, lowest first."""
        taken: list[DelayedOperation[Any] | None] = []
        thresholds = self.thresholds
        start = self.start
        size = len(thresholds)
        fresh = self.fresh
        from_heap = bool(fresh) and fresh[0][0] <= value
        reached_run: list[float] | None = None
        if start < size and thresholds[start] <= value:
            end = bisect_right(thresholds, value, start, size)
            ops = self.ops
            taken = ops[start:end]
            if from_heap:
                reached_run = thresholds[start:end].tolist()
            if end == size:
                del thresholds[:]
                ops.clear()
                end = 0
            elif end > size >> 1:
                del thresholds[:end]
                del ops[:end]
                end = 0
            else:
                ops[start:end] = [None] * (end - start)
            self.start = end
        if from_heap:
            entries: list[Entry] = []
            while fresh and fresh[0][0] <= value:
                entries.append(heapq.heappop(fresh))
            if reached_run is None:
                taken = [entry[2] for entry in entries]
            else:
                # Both parts are sorted: one merge pass, the run's entries first on equal
                # thresholds (they are the older).
                merged: list[DelayedOperation[Any] | None] = []
                i = 0
                count = len(taken)
                for entry in entries:
                    threshold = entry[0]
                    while i < count and reached_run[i] <= threshold:
                        merged.append(taken[i])
                        i += 1
                    merged.append(entry[2])
                merged.extend(taken[i:])
                taken = merged
        return taken  # type: ignore[return-value]  # slots from ``start`` on hold operations

    def compact(self) -> int:
        """Drop settled operations; return how many entries were removed."""
        before = len(self)
        thresholds: array[float] = array("d")
        ops: list[DelayedOperation[Any] | None] = _untracked([])
        for threshold, op in self._live_run():
            if op is not None and not op._state & ENDED:
                thresholds.append(threshold)
                ops.append(op)
        self.thresholds = thresholds
        self.ops = ops
        self.start = 0
        self.fresh = _untracked([entry for entry in self.fresh if not entry[2]._state & ENDED])
        heapq.heapify(self.fresh)
        self.stale = 0
        return before - len(self)

    def clear(self) -> None:
        self.thresholds = array("d")
        self.ops = _untracked([])
        self.start = 0
        self.fresh = _untracked([])

    def operations(self) -> list[DelayedOperation[Any]]:
        """Every operation in the index, lowest threshold first (ties: oldest first)."""
        pairs = self._live_run()
        fresh = sorted(self.fresh)
        pairs.extend([(entry[0], entry[2]) for entry in fresh])
        pairs.sort(key=_first)  # stable: the run's entries are the older ones
        return [pair[1] for pair in pairs if pair[1] is not None]


def _first(pair: tuple[float, DelayedOperation[Any] | None]) -> float:
    return pair[0]


def _untracked(entries: list[Any]) -> list[Any]:
    """``entries``, a list an index holds its entries in, out of the cyclic GC. A list
    stays untracked whatever is appended (it never tracks itself again)."""
    if _untrack_container is not None:
        _untrack_container(entries)
    return entries
