"""Where pending operations are watched: per-key watch lists and threshold indexes.

Watch lists are lists (one per key, oldest first), so watching is an append: no
hashing of the operation and nothing for the collector to untrack again (a dict
tracks itself again on every insert, a list does not). A key watched by one
operation alone (a request id) holds it instead of a list of one. Entries go by
identity, never by ``__eq__``/``__hash__``: an operation class may compare by value
or be unhashable (a ``@dataclass``). Operations waiting for a key's monotonic value to
reach their threshold go into a per-key index ordered by threshold instead, so
advancing the value takes exactly those it satisfies: O(log n + k).

As in Kafka, entries are removed lazily: an operation settled other than by a walk
over one of its keys stays in its other lists until a walk over the key or a purge
(see _stale) drops it; ``watched`` counts every entry actually held, never estimated.
A list that a purge finds long is held as a dict by serial number from then on.

Every method is for the loop thread and safe to call re-entrantly from inside
the callbacks a walk runs: walks work on snapshots, and each entry is removed
(and counted) by whoever actually removes it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Final, cast

from . import _gc, _threads
from ._index import ThresholdIndex
from ._keys import bad_key, looked_up
from ._logging import get_logger
from ._native import i64
from ._operation import try_guarded
from ._stale import drop_ended, drop_ended_by_identity, purge
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

_get_ident: Final = _threads.get_ident  # threading.get_ident, see _threads

_log: Final = get_logger("purgatory_aio.purgatory")

#: Told ``(key, True)`` when a key gains its first watch entry and ``(key, False)``
#: when it loses its last one (see :meth:`WatchStore.add_listener`).
KeyListener = Callable[[Hashable, bool], object]

# A static in the compiled build, None in the pure one. The containers holding pending
# operations are kept out of the cyclic GC (see _gc): a full collection would read the
# header of every operation they hold, a cache miss each.
_untrack_container: Final = _gc.untrack_container


#: A key's watch list: two or more operations (one, for a moment, after an undone watch),
#: oldest first, stale entries included until a walk or a purge compacts it.
WatchList = list["DelayedOperation[Any]"]
#: A long watch list, once a purge has found it long (see _stale): the same operations,
#: oldest first, by the serial number the store gives each (``op._ident``), so that the
#: purge drops an entry in O(1).
WatchDict = dict[object, "DelayedOperation[Any]"]


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
        # key -> the operation alone under it, or a list of two or more, oldest first
        self.lists: dict[Hashable, WatchList | WatchDict | DelayedOperation[Any]] = {}
        self.indexes: dict[Hashable, ThresholdIndex] = {}
        # The walks of advance_key under way, per key (nested ones when a callback
        # advances the same key again): the operations each took out of the index.
        self.walks: dict[Hashable, list[list[DelayedOperation[Any]]]] = {}
        # More entries than sys.maxsize cannot exist: a larger interval is the same one.
        self.limit: i64 = min(purge_interval, sys.maxsize)
        self.watched: i64 = 0  # entries held, in lists and indexes
        self.live: i64 = 0  # entries of operations not yet retired
        self.dirty: list[DelayedOperation[Any]] = []  # retired, maybe still held
        self.purged: i64 = 0
        # The last serial number given to an operation entering a long list (see ident).
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

    def release(self, key: Hashable) -> None:
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
        grew = False
        gained: list[Hashable] | None = None
        for key in keys:
            # Any, then one checked cast where it is a list: the union's checks of each
            # value cost the compiled build 16 instructions per operation (three keys;
            # W1-cost, callgrind, asyncio).
            held: Any = lists.get(key)
            if held is None:
                lists[key] = op
                grew = True
                if self.listeners:
                    if gained is None:
                        gained = []
                    gained.append(key)
            elif type(held) is list:
                # An append: no hashing, and a list does not track itself again when an
                # operation goes in (a dict does), so no untrack follows.
                cast("WatchList", held).append(op)
            else:  # a second operation (the key gets a list), or a long list's dict
                self.place(key, op)
        if grew and _untrack_container is not None:
            _untrack_container(lists)
        op._store = IN_WATCH_LISTS
        entries = len(keys)
        self.watched += entries
        self.live += entries
        if gained is not None:
            for key in gained:
                self._gained(key, True)

    def place(self, key: Hashable, op: DelayedOperation[Any]) -> None:
        """Add ``op`` to ``key``'s list, uncounted (:meth:`watch` does it in line)."""
        lists = self.lists
        held = lists.get(key)
        if held is None:
            lists[key] = op
        elif type(held) is list:
            held.append(op)
            return
        elif type(held) is dict:
            held[self.ident(op)] = op
            if _untrack_container is not None:
                _untrack_container(held)
            return
        else:  # a second operation: the key gets a list
            watch_list = [held, op]
            if _untrack_container is not None:
                _untrack_container(watch_list)
            lists[key] = watch_list  # type: ignore[assignment]
        if _untrack_container is not None:
            _untrack_container(lists)

    def ident(self, op: DelayedOperation[Any]) -> object:
        """``op``'s key in long watch lists (dicts): a serial number, given once. Not
        ``id(op)``: a fresh int compares by value with the one stored (the boxed serial
        is the very object), and addresses, multiples of 16, crowd a dict's slots."""
        ident = op._ident
        if ident is None:
            serial = self.serial + 1
            self.serial = serial
            ident = serial
            op._ident = ident
        return ident

    def hold_by_identity(self, key: Hashable, watch_list: WatchList) -> None:
        """``key``'s list is long: hold it as a dict by serial number, oldest first."""
        by_identity: WatchDict = {self.ident(op): op for op in watch_list}
        if _untrack_container is not None:
            _untrack_container(by_identity)
        self.lists[key] = by_identity

    def compact(self, key: Hashable) -> int:
        """Drop the entries under ``key`` of operations that have ended (completed or
        cancelled), uncounted; how many were dropped. A list left with one operation
        becomes that operation alone again."""
        lists = self.lists
        held = lists.get(key)
        if held is None:
            return 0
        if type(held) is list:
            dropped = drop_ended(held)
        elif type(held) is dict:
            dropped = drop_ended_by_identity(held)
        else:
            if not held._state & ENDED:  # type: ignore[union-attr]
                return 0
            # shrunk(key, ()) in line: completing a lone operation by check_and_complete
            # stays at 12 calls (tests/test_bench_smoke.py).
            del lists[key]
            self.watched -= 1
            if self.values or self.listeners:
                self.release(key)
            return 1
        if dropped:
            self.watched -= dropped
            if len(held) < 2:
                self.shrunk(key, held)
        return dropped

    def shrunk(self, key: Hashable, left: WatchList | WatchDict | tuple[()]) -> None:
        """``key``'s list was compacted to one operation or none (its entries uncounted
        already): the operation is held alone again, or the key is forgotten."""
        if left:
            self.lists[key] = next(iter(left.values())) if type(left) is dict else left[0]
            if _untrack_container is not None:
                _untrack_container(self.lists)  # a tracked value tracks the dict again
            return
        del self.lists[key]
        if self.values or self.listeners:
            self.release(key)

    def unwatch(self, op: DelayedOperation[Any], keys: tuple[Hashable, ...]) -> None:
        """Undo a :meth:`watch` that raised part-way: take ``op`` out of every list it got
        into (nothing was counted yet). It went in last, so each list is searched from
        its end, by identity."""
        lists = self.lists
        for key in keys:
            try:
                held = lists.get(key)
            except Exception:  # the lookup that failed in watch: nothing is held under it
                continue
            if held is op:
                del lists[key]
            elif type(held) is list:
                watch_list: WatchList = held
                for i in range(len(watch_list) - 1, -1, -1):
                    if watch_list[i] is op:
                        del watch_list[i]
                        break
                if not watch_list:
                    del lists[key]
            elif type(held) is dict:
                by_identity: WatchDict = held
                ident = op._ident
                if ident in by_identity:
                    del by_identity[ident]
                if not by_identity:
                    del lists[key]

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
            ops: tuple[DelayedOperation[Any], ...]
            if type(held) is list:
                ops = tuple(held)
            elif type(held) is dict:
                ops = tuple(held.values())
            else:
                ops = (held,)  # type: ignore[assignment]
            stale = False
            for op in ops:
                if op._state & ENDED:
                    stale = True
                elif try_guarded(op):
                    completed += 1
            if completed or stale:
                # One pass drops the entries of whatever ended meanwhile (these tries,
                # or the callbacks they ran), rather than one delete per operation.
                self.compact(key)
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
        left: list[DelayedOperation[Any]] = []  # still watched after their try: usually none
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
        meets out of the index (lowest first) into a walk registered under the key
        before any is tried, so that callbacks find them all (``cancel_for_key``
        takes them, ``check_and_complete`` tries them); None if there are none. The
        caller reports each found ended after its try (:meth:`walked`) and ends the
        walk with the rest (:meth:`end_walk`). Moving them into the watch list instead
        cost 1.3k of W2's 7.5k instructions per completed operation (callgrind).
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
                self.release(key)
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
        (its retirement counts it out of ``live``), as it is tried: a pass of its own
        at the end cost 68 instructions and 2.6 L1 misses per completed operation (W2
        at P = 100k, callgrind)."""
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
        placed = False
        for op in left:
            if op._store != IN_WALK:
                continue  # a stale entry (dropped already) or taken by cancel_for_key
            if op._state & ENDED:
                self.walked(op)
                continue
            self.place(key, op)  # walk entry -> list entry: counts unchanged
            op._store = IN_WATCH_LISTS
            placed = True
        if not placed and (self.values or self.listeners):
            self.release(key)

    def take(self, key: Hashable) -> list[DelayedOperation[Any]]:
        """Remove and return every operation held under ``key`` (for cancel_for_key).

        The entries are gone before the caller cancels anything, and a walk still
        holding the key's list sees them gone too.
        """
        ops: list[DelayedOperation[Any]] = []
        held = self.lists.pop(key, None)
        if type(held) is list:
            watch_list: WatchList = held
            ops.extend(watch_list)
            self.watched -= len(watch_list)
            watch_list.clear()
        elif type(held) is dict:
            by_identity: WatchDict = held
            ops.extend(by_identity.values())
            self.watched -= len(by_identity)
            by_identity.clear()
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
            self.release(key)
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
            purge(self)

    def stop_purging(self) -> None:
        """No purge from now on: a shutdown settles every operation, then clears the store
        (purging meanwhile only drops the entries one by one)."""
        self.limit = sys.maxsize

    def containers(self) -> list[object]:
        """The containers holding watched operations: watch lists and index entries."""
        held: list[object] = [self.lists]
        held.extend(entry for entry in self.lists.values() if type(entry) in (list, dict))
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
