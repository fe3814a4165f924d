"""Where pending operations are watched: per-key watch lists and threshold indexes.

Watch lists are insertion-ordered dicts (one per key), so adding and removing an
operation is O(1) and a walk visits operations oldest first. A key watched by one
operation alone (a request id) holds that operation itself instead of a dict of
one: a dict of one entry is two allocations and ~280 bytes that a key of its own
would cost every operation (W5: 10 -> 8 allocations per pending operation). They are keyed by a
serial number the store gives an operation when it first enters one
(``op._ident``), never by the operation itself: an operation class may define
``__eq__`` and ``__hash__`` by value (two requests for the same offset compare
equal) or be unhashable (a ``@dataclass``), and each operation is still watched on
its own. Operations whose condition is "this key's monotonic value has reached my
threshold" go into a per-key index ordered by threshold instead (a sorted run plus
a heap of recent arrivals), so advancing the value takes exactly the operations it
can satisfy: O(log n + k) for k of them, where a watch list would try all n.

As in Kafka, an operation settled other than by a walk over one of its keys stays
in its other watch lists until a walk meets it or a purge removes it; ``watched``
counts every entry actually held, stale or not, and is never estimated. A purge
runs once more than ``purge_interval`` entries are stale (or that many
operations are waiting to be purged) and visits only those operations.

Every method is for the loop thread and safe to call re-entrantly from inside
the callbacks a walk runs: walks work on snapshots, and each entry is removed
(and counted) by whoever actually removes it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_right
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Final

from . import _gc
from ._states import COMPLETED, ENDED

if TYPE_CHECKING:
    from ._operation import DelayedOperation

# Values of an operation's ``_store`` (the same constants as in _operation, which
# imports this module's users; kept literal so that compiled code inlines them).
NOT_WATCHED: Final = 0
IN_WATCH_LISTS: Final = 1
IN_THRESHOLD_INDEX: Final = 2
IN_WALK: Final = 3  # taken out of its index by advance_key, held by that walk
TAKEN: Final = 4  # taken from a walk by cancel_for_key: its one entry is gone already

_order = itertools.count()

# Statics in the compiled build (a C call each, no lookup); None in the pure build.
# The containers holding pending operations are kept out of the cyclic GC as well (see
# _gc): a full collection traversing them would read the header of every operation they
# hold, tracked or not, a cache miss each. A dict tracks itself again whenever an
# operation (a container) is put in it, so each insertion is followed by an untrack.
_untrack_container: Final = _gc.untrack_container
_untrack_items: Final = _gc.untrack_items


#: An index entry: (threshold, arrival number, operation). The arrival number is
#: unique, so entries compare without ever comparing operations, and equal
#: thresholds stay first-in first-out.
Entry = tuple[float, int, "DelayedOperation[Any]"]

#: What a consumed slot of a sorted run holds until the slots before ``start`` are
#: dropped: no operation, so a taken operation is not kept alive by the index.
_CONSUMED: Final[tuple[float, int, Any]] = (-math.inf, -1, None)

#: The fresh heap is merged into the sorted run once it holds more than this many
#: entries and more than an eighth of the run (amortized O(1) per push).
MERGE_MIN: Final = 64


class ThresholdIndex:
    """The operations on one key, ordered by the value each waits for.

    Two parts, both ordered by (threshold, arrival):

    * ``run``, a sorted list read from ``start`` on. Reaching a value takes a
      slice off its front: one bisection, then a sequential copy. Popping the
      same entries off a heap of 100k sifts each through 17 levels of tuples
      scattered in memory, a cache miss per level; in W2 at P=100k that was more
      than half of ``advance_key`` (perf, cpu-clock), and this halves the cost
      per completed operation there.
    * ``fresh``, a heap of the entries pushed since the run was last rebuilt. An
      entry at or above the run's end joins the run directly (thresholds that
      rise with the key's value, the common case); others wait here and are
      merged into the run once the heap outgrows an eighth of the run.

    Consumed slots before ``start`` are overwritten at once (they hold no
    operation) and dropped once they make up half of the list.
    """

    __slots__ = ("fresh", "run", "stale", "start")

    def __init__(self) -> None:
        self.run: list[Entry] = _untracked([])
        self.start = 0
        self.fresh: list[Entry] = _untracked([])
        self.stale = 0  # settled operations still held

    def __len__(self) -> int:
        return len(self.run) - self.start + len(self.fresh)

    def push(self, threshold: float, op: DelayedOperation[Any]) -> None:
        entry: Entry = (threshold, next(_order), op)
        run = self.run
        fresh = self.fresh
        if not fresh and (self.start == len(run) or threshold >= run[-1][0]):
            run.append(entry)  # still sorted: no live entry of the run is above it
            if _untrack_items is not None:
                # The entry exists for this operation alone: out of the cyclic GC with
                # it (see _gc). Those waiting in the fresh heap are when it is merged.
                _untrack_items(run, len(run) - 1)
            return
        heapq.heappush(fresh, entry)
        if len(fresh) > MERGE_MIN and len(fresh) > (len(run) - self.start) >> 3:
            self._merge()

    def _merge(self) -> None:
        """Fold the fresh heap into the sorted run.

        Only the part of the run above the smallest fresh entry is re-sorted with
        the heap's entries: with thresholds that mostly rise, that part is short,
        and a merge costs O(k log k) for k fresh entries rather than a pass over
        the whole run (whose entries are scattered in memory).
        """
        run = self.run
        if self.start:
            del run[: self.start]
            self.start = 0
        fresh = self.fresh
        self.fresh = _untracked([])
        fresh.sort()
        if run and fresh[0] < run[-1]:
            cut = bisect_right(run, fresh[0])
            tail = run[cut:]
            del run[cut:]
            tail.extend(fresh)
            tail.sort()
            run.extend(tail)
        else:
            cut = len(run)
            run.extend(fresh)
        if _untrack_items is not None:
            _untrack_items(run, cut)

    def _live_run(self) -> list[Entry]:
        return self.run[self.start :]

    def pop_reached(self, value: float) -> list[DelayedOperation[Any]]:
        """Remove and return every entry whose threshold is <= value, lowest first."""
        taken: list[Entry] = []
        run = self.run
        start = self.start
        size = len(run)
        if start < size and run[start][0] <= value:
            end = bisect_right(run, value, start, size, key=_threshold)
            taken = run[start:end]
            if end == size:
                run.clear()
                end = 0
            elif end > size >> 1:
                del run[:end]
                end = 0
            else:
                run[start:end] = [_CONSUMED] * (end - start)
            self.start = end
        fresh = self.fresh
        if fresh and fresh[0][0] <= value:
            from_heap = []
            while fresh and fresh[0][0] <= value:
                from_heap.append(heapq.heappop(fresh))
            if taken:
                taken.extend(from_heap)
                taken.sort()  # both parts are sorted: one merge pass
            else:
                taken = from_heap
        return [entry[2] for entry in taken]

    def compact(self) -> int:
        """Drop settled operations; return how many entries were removed."""
        before = len(self)
        self.run = _untracked([e for e in self._live_run() if not e[2]._state & ENDED])
        self.start = 0
        self.fresh = _untracked([entry for entry in self.fresh if not entry[2]._state & ENDED])
        heapq.heapify(self.fresh)
        self.stale = 0
        return before - len(self)

    def clear(self) -> None:
        self.run = _untracked([])
        self.start = 0
        self.fresh = _untracked([])

    def operations(self) -> list[DelayedOperation[Any]]:
        """Every operation in the index, lowest threshold first."""
        entries = self._live_run()
        entries.extend(self.fresh)
        entries.sort()
        return [entry[2] for entry in entries]


def _threshold(entry: Entry) -> float:
    return entry[0]


def _untracked(entries: list[Entry]) -> list[Entry]:
    """``entries``, a list an index holds its entries in, out of the cyclic GC. A list
    stays untracked whatever is appended (it never tracks itself again)."""
    if _untrack_container is not None:
        _untrack_container(entries)
    return entries


#: A watch list of two or more operations, by their ``_ident``.
WatchList = dict[object, "DelayedOperation[Any]"]


class WatchStore:
    """The watch lists and threshold indexes of one purgatory, with exact entry counts."""

    __slots__ = (
        "dirty",
        "indexes",
        "limit",
        "lists",
        "live",
        "purged",
        "serial",
        "walks",
        "watched",
    )

    def __init__(self, purge_interval: int) -> None:
        # key -> {op._ident: op}
        # key -> the operation alone under it, or {op._ident: op} for two or more
        self.lists: dict[Hashable, WatchList | DelayedOperation[Any]] = {}
        self.indexes: dict[Hashable, ThresholdIndex] = {}
        # The walks of advance_key under way, per key (nested ones when a callback
        # advances the same key again): the operations each took out of the index.
        self.walks: dict[Hashable, list[list[DelayedOperation[Any]]]] = {}
        self.limit = purge_interval
        self.watched = 0  # entries held, in lists and indexes
        self.live = 0  # entries of operations not yet retired
        self.dirty: list[DelayedOperation[Any]] = []  # retired, maybe still held
        self.purged = 0
        self.serial = 0  # the last _ident given

    def _next_ident(self) -> object:
        """A serial number, unique among the operations this store holds.

        Boxed once, here, so that every dict operation on it hashes the same int
        object: 28 bytes per watched operation. Not ``id(op)``: addresses are multiples
        of 16 and an int hashes to itself, so ids pile up in a sixteenth of a dict's
        slots (W1 cost 1.6k more instructions per operation with them, callgrind);
        consecutive serials fill the slots evenly.
        """
        serial = self.serial + 1
        self.serial = serial
        return serial

    def key_count(self) -> int:
        try:
            return len(self.lists.keys() | self.indexes.keys())
        except Exception:
            # A watched key whose __eq__ raises, met by one of an equal hash in the other
            # mapping (it was accepted while nothing else shared its hash): stats() must
            # still answer, so the keys are told apart by identity.
            return len({id(key) for key in self.lists} | {id(key) for key in self.indexes})

    def holds(self, key: Hashable) -> bool:
        """Whether anything is watched under ``key`` (TypeError if it is unhashable)."""
        return key in self.lists or key in self.indexes or key in self.walks

    # -- adding ------------------------------------------------------------------------------

    def watch(self, op: DelayedOperation[Any], keys: tuple[Hashable, ...]) -> None:
        """Put ``op`` in the watch list of every key (keys validated and distinct)."""
        lists = self.lists
        ident = op._ident = self._next_ident()
        grew = False
        for key in keys:
            held = lists.get(key)
            if held is None:
                lists[key] = op
                grew = True
            elif type(held) is dict:
                held[ident] = op
                if _untrack_container is not None:
                    _untrack_container(held)
            else:
                self._second(key, held, ident, op)  # type: ignore[arg-type]
                grew = True
        if grew and _untrack_container is not None:
            _untrack_container(lists)
        op._store = IN_WATCH_LISTS
        entries = len(keys)
        self.watched += entries
        self.live += entries

    def _second(
        self, key: Hashable, alone: DelayedOperation[Any], ident: object, op: DelayedOperation[Any]
    ) -> None:
        """A second operation under a key that held one alone: the key gets a dict."""
        watch_list = self.lists[key] = {alone._ident: alone, ident: op}
        if _untrack_container is not None:
            _untrack_container(watch_list)

    def _drop(self, key: Hashable, op: DelayedOperation[Any]) -> bool:
        """Remove ``op``'s entry under ``key`` if it is there (True if it was)."""
        lists = self.lists
        held = lists.get(key)
        if held is op:
            del lists[key]
            return True
        if type(held) is not dict:
            return False
        watch_list: WatchList = held
        ident = op._ident
        if ident not in watch_list:
            return False
        del watch_list[ident]
        if not watch_list:
            del lists[key]
        return True

    def unwatch(self, op: DelayedOperation[Any], keys: tuple[Hashable, ...]) -> None:
        """Undo a :meth:`watch` that raised part-way: take ``op`` out of every list it got
        into (nothing was counted yet)."""
        if getattr(op, "_ident", None) is None:
            return  # it failed before its first entry
        for key in keys:
            try:
                self._drop(key, op)
            except Exception:  # the lookup that failed in watch: nothing is held under it
                continue

    def watch_threshold(self, op: DelayedOperation[Any], key: Hashable, threshold: float) -> None:
        index = self.indexes.get(key)
        if index is None:
            index = self.indexes[key] = ThresholdIndex()
        index.push(threshold, op)
        op._store = IN_THRESHOLD_INDEX
        self.watched += 1
        self.live += 1

    # -- walks -------------------------------------------------------------------------------

    def check(self, key: Hashable, attempt: Any) -> int:
        """Try every pending operation watched under ``key``; return how many completed.

        ``attempt(op)`` is the guarded ``try_complete``. The walk works on a
        snapshot: callbacks it runs may watch, complete, cancel or purge on this
        very key; an entry is removed only if it is still there.
        """
        completed = 0
        held = self.lists.get(key)
        if held is not None and type(held) is not dict:
            op: DelayedOperation[Any] = held  # type: ignore[assignment]
            if op._state & ENDED:
                if self._drop(key, op):
                    self.watched -= 1
            elif not op._busy and attempt(op):
                completed += 1
                if self._drop(key, op):  # a callback may have made it a dict meanwhile
                    self.watched -= 1
        elif held is not None:
            watch_list: WatchList = held
            for op in tuple(watch_list.values()):
                if op._state & ENDED:
                    ident = op._ident
                    if ident in watch_list:
                        del watch_list[ident]
                        self.watched -= 1
                    continue
                if op._busy:
                    continue
                if attempt(op):
                    completed += 1
                    ident = op._ident
                    if ident in watch_list:
                        del watch_list[ident]
                        self.watched -= 1
            if not watch_list and self.lists.get(key) is watch_list:
                del self.lists[key]
        index = self.indexes.get(key)
        if index is not None:
            for op in index.operations():
                if not op._state & ENDED and attempt(op):
                    completed += 1
        walks = self.walks.get(key)
        if walks is not None:
            # Called from a callback of an advance_key walk on this key: the operations
            # that walk has yet to try are watched under the key too.
            for walk in tuple(walks):
                for op in walk:
                    live = op._store == IN_WALK and not op._state & ENDED and not op._busy
                    if live and attempt(op):
                        completed += 1
        return completed

    def advance(self, key: Hashable, value: float, attempt: Any) -> int:
        """``key``'s value reached ``value``: try the operations whose threshold it meets.

        They leave the index for a walk registered under the key *before* any is
        tried, so whatever the callbacks do meanwhile finds every one of them
        (``cancel_for_key(key)`` takes them, ``check_and_complete(key)`` tries
        them). One that declines, or is left untried because the walk was
        interrupted, ends in the key's plain watch list.

        A walk rather than a move into the plain watch list before the tries: a
        completed operation then costs no dict insert, lookup and delete, and no
        visit by the purge (its entry is dropped here). In W2 at P = 100k that is
        1.3k of the 7.5k instructions per completed operation (callgrind).
        """
        index = self.indexes.get(key)
        if index is None:
            return 0
        reached = index.pop_reached(value)
        if not len(index) and self.indexes.get(key) is index:
            del self.indexes[key]
        if not reached:
            return 0
        for op in reached:
            if op._state & ENDED:
                self.watched -= 1  # a stale index entry, dropped
            else:
                op._store = IN_WALK  # index entry -> walk entry: counts unchanged
        walks = self.walks.get(key)
        if walks is None:
            walks = self.walks[key] = []
        walks.append(reached)
        completed = 0
        try:
            for op in reached:
                if op._store != IN_WALK or op._state & ENDED or op._busy:
                    continue
                if attempt(op) and op._state & COMPLETED:
                    completed += 1
        finally:
            self._end_walk(key, reached)
        return completed

    def _end_walk(self, key: Hashable, reached: list[DelayedOperation[Any]]) -> None:
        """Drop the walk's entries of settled operations; the others become plain watchers."""
        walks = self.walks.get(key)
        if walks is not None:
            for i in range(len(walks) - 1, -1, -1):
                if walks[i] is reached:
                    del walks[i]
                    break
            if not walks:
                del self.walks[key]
        lists = self.lists
        for op in reached:
            if op._store != IN_WALK:
                continue  # a stale entry (dropped above) or taken by cancel_for_key
            if op._state & ENDED:
                # Dropped here; its retirement (now or, for a transition won on another
                # thread, when it is handed over) counts it out of ``live``.
                self.watched -= 1
                continue
            # walk entry -> list entry: counts unchanged
            ident = op._ident = self._next_ident()
            held = lists.get(key)
            if held is None:
                lists[key] = op
            elif type(held) is dict:
                held[ident] = op
                if _untrack_container is not None:
                    _untrack_container(held)
            else:
                self._second(key, held, ident, op)  # type: ignore[arg-type]
            if _untrack_container is not None:
                _untrack_container(lists)
            op._store = IN_WATCH_LISTS

    def take(self, key: Hashable) -> list[DelayedOperation[Any]]:
        """Remove and return every operation held under ``key`` (for cancel_for_key).

        The entries are gone before the caller cancels anything, and a walk still
        holding the key's list sees them gone too.
        """
        ops: list[DelayedOperation[Any]] = []
        held = self.lists.pop(key, None)
        if type(held) is dict:
            watch_list: WatchList = held
            ops.extend(watch_list.values())
            self.watched -= len(watch_list)
            watch_list.clear()
        elif held is not None:
            ops.append(held)  # type: ignore[arg-type]
            self.watched -= 1
        index = self.indexes.pop(key, None)
        if index is not None:
            ops.extend(index.operations())
            self.watched -= len(index)
            index.clear()
        walks = self.walks.get(key)
        if walks is not None:
            for walk in walks:
                for op in walk:
                    if op._store == IN_WALK and not op._state & ENDED:
                        op._store = TAKEN  # the walk skips it
                        self.watched -= 1
                        ops.append(op)
        return ops

    # -- retiring and purging ----------------------------------------------------------------
    # ``live`` counts, for every operation not yet retired, the entries it was watched with.
    # Entries removed before their operation retires (a walk meeting an operation another
    # thread completed, cancel_for_key) make ``watched - live`` briefly too small, never
    # too large, and retiring sets it right: the stale count that triggers a purge is exact
    # whenever no transition is in flight.

    def retire(self, op: DelayedOperation[Any]) -> None:
        """``op`` is no longer pending: its remaining entries become stale."""
        store = op._store
        if store == NOT_WATCHED:
            return
        if store >= IN_WALK:  # IN_WALK or TAKEN
            self.live -= 1  # its one entry is dropped by the walk, or was by take()
            return
        self.live -= len(op._keys) if store == IN_WATCH_LISTS else 1
        dirty = self.dirty
        dirty.append(op)
        limit = self.limit
        if len(dirty) > limit or self.watched - self.live > limit:
            self.purge()

    def purge(self) -> None:
        """Remove the entries of retired operations."""
        indexes = self.indexes
        removed = 0
        dirty, self.dirty = self.dirty, []
        for op in dirty:
            keys = op._keys
            if op._store == IN_THRESHOLD_INDEX:
                index = indexes.get(keys[0])
                if index is not None:
                    index.stale += 1
                continue
            for key in keys:
                if self._drop(key, op):
                    removed += 1
        self.watched -= removed
        self.purged += removed
        if self.watched - self.live > self.limit:
            # Stale threshold entries are what is left: compact the indexes holding them.
            for key, index in list(indexes.items()):
                if index.stale:
                    dropped = index.compact()
                    self.watched -= dropped
                    self.purged += dropped
                    if not len(index):
                        del indexes[key]

    def containers(self) -> list[object]:
        """The containers holding watched operations: watch lists and index entries."""
        held: list[object] = [self.lists]
        held.extend(entry for entry in self.lists.values() if type(entry) is dict)
        for index in self.indexes.values():
            held += (index.run, index.fresh)
            held.extend(index.run[index.start :])
            held.extend(index.fresh)
        return held

    def clear(self) -> None:
        self.lists.clear()
        self.indexes.clear()
        self.walks.clear()
        self.dirty.clear()
        self.watched = self.live = 0
