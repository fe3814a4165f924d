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

import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Final

from . import _gc
from ._index import ThresholdIndex
from ._keys import bad_key, looked_up
from ._logging import get_logger
from ._operation import try_guarded
from ._states import (
    COMPLETED,
    ENDED,
    IN_THRESHOLD_INDEX,
    IN_WALK,
    IN_WATCH_LISTS,
    NOT_WATCHED,
    TAKEN,
)

if TYPE_CHECKING:
    from ._lifecycle import Lifecycle
    from ._operation import DelayedOperation

__all__ = [
    "IN_THRESHOLD_INDEX",
    "IN_WALK",
    "IN_WATCH_LISTS",
    "NOT_WATCHED",
    "TAKEN",
    "KeyListener",
    "WatchStore",
]

_get_ident: Final = threading.get_ident

_log: Final = get_logger("purgatory_aio.purgatory")

#: Told ``(key, True)`` when a key gains its first watch entry and ``(key, False)``
#: when it loses its last one (see :meth:`WatchStore.add_listener`).
KeyListener = Callable[[Hashable, bool], object]

# Statics in the compiled build (a C call each, no lookup); None in the pure build.
# The containers holding pending operations are kept out of the cyclic GC as well (see
# _gc): a full collection traversing them would read the header of every operation they
# hold, tracked or not, a cache miss each. A dict tracks itself again whenever an
# operation (a container) is put in it, so each insertion is followed by an untrack.
_untrack_container: Final = _gc.untrack_container


#: A watch list of two or more operations, by their ``_ident``.
WatchList = dict[object, "DelayedOperation[Any]"]


class WatchStore:
    """The watch lists and threshold indexes of one purgatory, with exact entry counts."""

    __slots__ = (
        "dirty",
        "indexes",
        "limit",
        "listeners",
        "lists",
        "live",
        "purged",
        "serial",
        "values",
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
        # The last ``_ident`` given: a serial number, unique among the operations this
        # store holds, given where an operation enters its first list (in line there:
        # the admission's one call less). Boxed once, as ``object``, so that every dict
        # operation on it hashes the same int object: 28 bytes per watched operation.
        # Not ``id(op)``: addresses are multiples of 16 and an int hashes to itself, so
        # ids pile up in a sixteenth of a dict's slots (W1 cost 1.6k more instructions
        # per operation with them, callgrind); consecutive serials fill the slots evenly.
        self.serial = 0
        # key -> the highest value advance() was given while the key held entries; dropped
        # with the key's last entry, so it costs memory only for keys that are watched.
        self.values: dict[Hashable, float] = {}
        self.listeners: tuple[KeyListener, ...] = ()

    def key_count(self) -> int:
        try:
            return len(self.lists.keys() | self.indexes.keys())
        except Exception:
            # A watched key whose __eq__ raises, met by one of an equal hash in the other
            # mapping (it was accepted while nothing else shared its hash): stats() must
            # still answer, so the keys are told apart by identity.
            return len({id(key) for key in self.lists} | {id(key) for key in self.indexes})

    def keys(self) -> list[Hashable]:
        """Every key holding an entry (a list, an index or a walk under way)."""
        return list(self.lists.keys() | self.indexes.keys() | self.walks.keys())

    # -- the keys' observers -------------------------------------------------------------------
    # A key is held from its first entry (in a list, an index or a walk) to its last. The
    # listeners hear of both moments; what they may do is schedule work, never call back into
    # the purgatory, since they run in the middle of this store's bookkeeping.

    def add_listener(self, listener: KeyListener) -> None:
        if all(known is not listener for known in self.listeners):
            self.listeners = (*self.listeners, listener)

    def remove_listener(self, listener: KeyListener) -> None:
        self.listeners = tuple(known for known in self.listeners if known is not listener)

    def _notify(self, key: Hashable, held: bool) -> None:
        for listener in self.listeners:
            try:
                listener(key, held)
            except Exception as exc:  # a listener's bug must not corrupt the watch lists
                _log.error("purgatory_key_listener_failed", key=repr(key), error=repr(exc))

    def _gained(self, key: Hashable, lists: bool) -> None:
        """``key`` got a new list (``lists``) or index: tell the listeners if it is new."""
        if lists:
            if key in self.indexes or key in self.walks:
                return
        elif key in self.lists or key in self.walks:
            return
        self._notify(key, True)

    def _release(self, key: Hashable) -> None:
        """A list, index or walk of ``key`` is gone: forget the key if that was its last.

        Callers skip the call when no value is recorded and nobody listens: a W1-style
        watch-and-check under fresh keys then pays two attribute tests, not three dict
        lookups and a call (pure build: 4.79 -> 4.6 us per operation).
        """
        if key in self.indexes or key in self.lists or key in self.walks:
            return
        values = self.values
        if key in values:
            del values[key]
        if self.listeners:
            self._notify(key, False)

    def holds(self, key: Hashable) -> bool:
        """Whether anything is watched under ``key`` (TypeError if it is unhashable)."""
        return key in self.lists or key in self.indexes or key in self.walks

    # -- adding ------------------------------------------------------------------------------

    def watch(self, op: DelayedOperation[Any], keys: tuple[Hashable, ...]) -> None:
        """Put ``op`` in the watch list of every key (keys validated and distinct)."""
        lists = self.lists
        serial = self.serial + 1
        self.serial = serial
        ident: object = serial
        op._ident = ident
        grew = False
        gained: list[Hashable] | None = None
        for key in keys:
            held = lists.get(key)
            if held is None:
                lists[key] = op
                grew = True
                if self.listeners:
                    if gained is None:
                        gained = []
                    gained.append(key)
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
        if gained is not None:
            for key in gained:
                self._gained(key, True)

    def _second(
        self, key: Hashable, alone: DelayedOperation[Any], ident: object, op: DelayedOperation[Any]
    ) -> None:
        """A second operation under a key that held one alone: the key gets a dict."""
        watch_list = self.lists[key] = {alone._ident: alone, ident: op}
        if _untrack_container is not None:
            _untrack_container(watch_list)

    def discard(self, key: Hashable, op: DelayedOperation[Any]) -> bool:
        """Remove ``op``'s entry under ``key`` if it is there, and uncount it (True if
        it was there): for the walks, which drop the entries of the operations they
        find settled, and for the purge."""
        lists = self.lists
        held = lists.get(key)
        if held is op:
            del lists[key]
            self.watched -= 1
            if self.values or self.listeners:
                self._release(key)
            return True
        if type(held) is not dict:
            return False
        watch_list: WatchList = held
        ident = op._ident
        if ident not in watch_list:
            return False
        del watch_list[ident]
        self.watched -= 1
        if not watch_list:
            del lists[key]
            if self.values or self.listeners:
                self._release(key)
        return True

    def unwatch(self, op: DelayedOperation[Any], keys: tuple[Hashable, ...]) -> None:
        """Undo a :meth:`watch` that raised part-way: take ``op`` out of every list it got
        into (nothing was counted yet)."""
        if getattr(op, "_ident", None) is None:
            return  # it failed before its first entry
        for key in keys:
            try:
                if self.discard(key, op):
                    self.watched += 1  # never counted: watch raised before it counted
            except Exception:  # the lookup that failed in watch: nothing is held under it
                continue

    def watch_threshold(
        self, op: DelayedOperation[Any], key: Hashable, threshold: float
    ) -> tuple[Hashable, ...]:
        """Put ``op``, whose ``_keys`` is ``(key,)``, in ``key``'s threshold index; return
        the ``(key,)`` for it to keep: the index's own, shared by every operation
        watched under the very same key object (see ThresholdIndex)."""
        index = self.indexes.get(key)
        gained = index is None
        keys = op._keys
        if index is None:
            index = self.indexes[key] = ThresholdIndex(keys)
        elif index.keys[0] is key:
            keys = index.keys
        index.push(threshold, op)
        op._store = IN_THRESHOLD_INDEX
        self.watched += 1
        self.live += 1
        if gained and self.listeners:
            self._gained(key, False)
        return keys

    # -- walks -------------------------------------------------------------------------------
    # Both walks over a key (check_and_complete and advance_key) are here, with one protocol:
    # each works on a snapshot taken before the first try, tries each operation with
    # try_guarded (called natively: handed over as a callable, each try went through its
    # Python-level wrapper, 72 instructions per reached operation in W2 at P = 100k,
    # callgrind), and drops an entry only if it is still there once its operation has
    # ended. Callbacks they run may watch, complete, cancel or purge on this very key.

    def check(self, key: Hashable, owner: Lifecycle) -> int:
        """check_and_complete: try every pending operation watched under ``key``, on
        ``owner``'s loop thread; how many completed."""
        try:
            # The key's lookups, refused by name when its __hash__ or __eq__ raises
            # (a StopIteration from them must not end a calling coroutine). The index
            # and walk dicts are looked into only when they hold anything.
            held = self.lists.get(key)
            index = self.indexes.get(key) if self.indexes else None
            walks = self.walks.get(key) if self.walks else None
        except Exception as exc:
            raise bad_key(key, exc) from exc
        if held is None and index is None and walks is None:
            return 0
        if owner.thread_id != _get_ident():
            raise owner.off_loop_thread("check_and_complete", "; use check_and_complete_threadsafe")
        completed = 0
        if held is not None:
            # The key's one operation, or a snapshot of its list of two or more.
            ops: tuple[DelayedOperation[Any], ...] = (
                tuple(held.values()) if type(held) is dict else (held,)  # type: ignore[assignment]
            )
            for op in ops:
                if op._state & ENDED:
                    self.discard(key, op)  # a stale entry
                elif try_guarded(op):
                    completed += 1
                    self.discard(key, op)
        if index is not None or walks is not None:
            completed += _try_indexed(index, walks)
        return completed

    def advance(self, key: Hashable, value: float, owner: Lifecycle) -> int:
        """advance_key: try the threshold operations on ``key`` that ``value`` reaches,
        lowest threshold first, on ``owner``'s loop thread; how many completed."""
        if not looked_up(self, key, True):
            return 0
        if owner.thread_id != _get_ident():
            raise owner.off_loop_thread("advance_key", "")
        reached = self.begin_walk(key, value)
        if reached is None:
            return 0
        completed = 0
        visited = 0
        # The ones still watched after their try: usually none.
        left: list[DelayedOperation[Any]] = []
        try:
            for op in reached:
                if op._store == IN_WALK:  # not a stale entry, nor taken by cancel_for_key
                    if try_guarded(op) and op._state & COMPLETED:
                        completed += 1
                    if op._state & ENDED:
                        self.walked(op)
                    else:
                        left.append(op)
                visited += 1
        finally:
            if visited < len(reached):  # interrupted: the rest were never tried
                left.extend(reached[visited:])
            self.end_walk(key, reached, left)
        return completed

    def begin_walk(self, key: Hashable, value: float) -> list[DelayedOperation[Any]] | None:
        """``key``'s value reached ``value``: take the operations whose threshold it
        meets out of the index, for the caller to try (lowest threshold first), or
        None if there are none.

        They leave the index for a walk registered under the key *before* any is
        tried, so whatever the callbacks do meanwhile finds every one of them
        (``cancel_for_key(key)`` takes them, ``check_and_complete(key)`` tries
        them). The caller reports each one it finds ended after its try
        (:meth:`walked`) and ends the walk with those left (:meth:`end_walk`).

        A walk rather than a move into the plain watch list before the tries: a
        completed operation then costs no dict insert, lookup and delete, and no
        visit by the purge (its entry is dropped by the walk). In W2 at P = 100k
        that is 1.3k of the 7.5k instructions per completed operation (callgrind).
        """
        values = self.values
        known = values.get(key)
        if known is None or value > known:
            values[key] = value
        index = self.indexes.get(key)
        if index is None:
            return None
        reached = index.pop_reached(value)
        if not reached:
            if not len(index) and self.indexes.get(key) is index:
                del self.indexes[key]
                self._release(key)
            return None
        if not len(index) and self.indexes.get(key) is index:
            del self.indexes[key]  # the walk registered below holds the key meanwhile
        # This pass also brings every operation into the cache before the first try:
        # the misses overlap here instead of each stalling a try.
        for op in reached:
            if op._state & ENDED:
                self.watched -= 1  # a stale index entry, dropped
            else:
                op._store = IN_WALK  # index entry -> walk entry: counts unchanged
        walks = self.walks.get(key)
        if walks is None:
            walks = self.walks[key] = []
        walks.append(reached)
        return reached

    def walked(self, op: DelayedOperation[Any]) -> None:
        """``op``, still in a walk, was found ended after its try: its entry is dropped
        (its retirement, now or at the hand-over of a transition won on another thread,
        counts it out of ``live``). Dropped as it is tried rather than in a pass of
        its own at the end: that pass met every operation again, out of the L1 cache
        by then (W2 at P = 100k: 68 instructions and 2.6 L1 misses per completed
        operation, callgrind)."""
        op._store = TAKEN
        self.watched -= 1

    def end_walk(
        self,
        key: Hashable,
        reached: list[DelayedOperation[Any]],
        left: list[DelayedOperation[Any]],
    ) -> None:
        """End the walk of ``reached``: of the operations ``left`` in it (declined, or
        never tried because the walk was interrupted), drop those settled meanwhile;
        the others become plain watchers of ``key``."""
        walks = self.walks.get(key)
        if walks is not None:
            for i in range(len(walks) - 1, -1, -1):
                if walks[i] is reached:
                    del walks[i]
                    break
            if not walks:
                del self.walks[key]
        lists = self.lists
        placed = False
        for op in left:
            if op._store != IN_WALK:
                continue  # a stale entry (dropped already) or taken by cancel_for_key
            if op._state & ENDED:
                self.walked(op)
                continue
            # walk entry -> list entry: counts unchanged
            serial = self.serial + 1
            self.serial = serial
            ident: object = serial
            op._ident = ident
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
            placed = True
        if not placed and (self.values or self.listeners):
            self._release(key)

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
        if (held is not None or index is not None) and (self.values or self.listeners):
            self._release(key)
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
                if self.discard(key, op):
                    removed += 1
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
                        if self.values or self.listeners:
                            self._release(key)

    def containers(self) -> list[object]:
        """The containers holding watched operations: watch lists and index entries."""
        held: list[object] = [self.lists]
        held.extend(entry for entry in self.lists.values() if type(entry) is dict)
        for index in self.indexes.values():
            held += (index.ops, index.fresh)
            held.extend(index.fresh)
        return held

    def clear(self) -> None:
        keys = self.keys() if self.listeners else []
        self.lists.clear()
        self.indexes.clear()
        self.walks.clear()
        self.dirty.clear()
        self.values.clear()
        self.watched = self.live = 0
        for key in keys:
            self._notify(key, False)


def _try_indexed(
    index: ThresholdIndex | None, walks: list[list[DelayedOperation[Any]]] | None
) -> int:
    """The rest of check_and_complete's walk over a key: the operations in its threshold
    index, and those an advance_key walk on it has yet to try (check_and_complete
    called from one of that walk's callbacks). How many completed."""
    completed = 0
    if index is not None:
        for op in index.operations():
            if try_guarded(op):
                completed += 1
    if walks is not None:
        for walk in tuple(walks):
            for op in walk:
                if op._store == IN_WALK and try_guarded(op):
                    completed += 1
    return completed
