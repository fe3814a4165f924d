"""Stale watch entries: dropping them from a watch list, and the purge of a watch store.

An entry is stale once its operation has ended (completed or cancelled). Entries are
removed lazily, as in Kafka: a walk over a key compacts that key's list, and the
purge, run by :meth:`~._watches.WatchStore.retire` once more than ``purge_interval``
entries are stale, removes the rest. Kafka's purge sweeps every list; that costs a
visit per entry watched, so it is done only while what is watched is at most
:data:`SWEEP_RATIO` times what is stale. Beyond (a large purgatory), the purge visits
the keys of the operations waiting for it: a lone operation is dropped, a short list
compacted, and a list longer than :data:`SHORT` becomes a dict of the same operations
by serial number, from which each stale entry is then deleted in O(1).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from . import _build
from ._states import ENDED, IN_THRESHOLD_INDEX

if TYPE_CHECKING:
    from ._operation import DelayedOperation
    from ._watches import WatchStore

__all__ = [
    "SHORT",
    "SWEEP_RATIO",
    "drop_ended",
    "drop_ended_by_identity",
    "drop_ended_in_python",
    "purge",
    "sweep_lists",
    "sweep_lists_in_python",
]

#: A purge sweeps every list while what is watched is at most this many times what is
#: stale: a few visits per stale entry (about 20 instructions each, compiled), against a
#: dict lookup and a compaction per key of the operations purged otherwise.
SWEEP_RATIO: Final = 8

#: The longest list a purge by keys compacts: compacting visits every entry, so a stale
#: entry costs up to this many visits (about 20 instructions each); a longer list
#: becomes a dict by serial number, where dropping an entry is a delete (about 300). Lists
#: compacted at every purge cost a hot key of 100,000 operations (under it and one key
#: of their own each) 2.6 us per force_complete, against 1.6 us with deletes from a dict
#: (20,000 of them forced, compiled, asyncio).
SHORT: Final = 32


def drop_ended_in_python(watch_list: list[DelayedOperation[Any]]) -> int:
    """Drop the operations that have ended from ``watch_list``, in place (it stays the
    one object its key holds) and keeping the order; how many were dropped. The pure
    build's :data:`drop_ended`, and what the compiled build's is tested against.

    One pass over the list writing every kept operation back: deleting the ended front
    in one slice first and indexing the rest cost more (W1-cost: +63 instructions per
    operation, callgrind, compiled, asyncio)."""
    kept = 0
    for op in watch_list:
        if not op._state & ENDED:
            watch_list[kept] = op
            kept += 1
    dropped = len(watch_list) - kept
    if dropped:
        del watch_list[kept:]
    return dropped


#: :func:`drop_ended_in_python`, or on the compiled build its equal in C (``_compact.c``):
#: a visit of the purge's sweep there is a class comparison, a read of the state and a
#: swap, against about 76 instructions compiled by mypyc (W1-cost: see docs/benchmarks.md).
drop_ended: Final[Callable[[list[DelayedOperation[Any]]], int]] = _build.native(
    "_compact", "drop_ended", drop_ended_in_python
)


def drop_ended_by_identity(by_identity: dict[object, DelayedOperation[Any]]) -> int:
    """Drop the operations that have ended from a watch list held as a dict; how many."""
    ended = [ident for ident, op in by_identity.items() if op._state & ENDED]
    for ident in ended:
        del by_identity[ident]
    return len(ended)


def purge(store: WatchStore) -> None:
    """Remove the stale entries of ``store``: of the operations retired since the last
    purge, and of any other that ended meanwhile."""
    indexes = store.indexes
    lists = store.lists
    dirty, store.dirty = store.dirty, []
    sweep = store.watched <= SWEEP_RATIO * max(store.watched - store.live, len(dirty))
    removed = 0
    touched: dict[Hashable, None] = {}  # keys of short lists
    if sweep and not indexes:
        # The sweep finds every stale entry itself; the operations retired are visited
        # only for the threshold indexes' stale counts, and there is no index.
        dirty = []
    for op in dirty:
        keys = op._keys
        if op._store == IN_THRESHOLD_INDEX:
            index = indexes.get(keys[0])
            if index is not None:
                index.stale += 1
            continue
        if sweep:
            continue
        for key in keys:
            held = lists.get(key)
            if type(held) is dict:
                by_identity: dict[object, DelayedOperation[Any]] = held
                ident = op._ident
                if ident in by_identity:
                    del by_identity[ident]
                    removed += 1
                    store.watched -= 1
                    if len(by_identity) < 2:
                        store.shrunk(key, by_identity)
            elif held is op:  # alone under its key
                removed += 1
                store.watched -= 1
                store.shrunk(key, ())
            elif type(held) is list:
                touched[key] = None
    if sweep:
        removed = _sweep(store)
    else:
        for key in touched:
            removed += store.compact(key)
            held = lists.get(key)
            if type(held) is list and len(held) > SHORT:
                store.hold_by_identity(key, held)
    store.purged += removed
    if store.watched - store.live > store.limit:
        # Stale threshold entries are what is left: compact the indexes holding them.
        for key, index in list(indexes.items()):
            if index.stale:
                dropped = index.compact()
                store.watched -= dropped
                store.purged += dropped
                if not len(index):
                    del indexes[key]
                    if store.values or store.listeners:
                        store.release(key)


#: What :func:`sweep_lists` answers: entries dropped, the ``(key, value)`` pairs to shrink
#: (lists left with fewer than two operations, lone operations that ended) and the long
#: lists held as dicts, each None when there are none.
Swept: TypeAlias = tuple[int, list[tuple[Hashable, Any]] | None, list[tuple[Hashable, Any]] | None]


def sweep_lists_in_python(lists: dict[Hashable, Any]) -> Swept:
    """The sweep's pass over a store's lists: every list compacted, every lone operation
    tested; the long lists held as dicts are left to the caller. The pure build's
    :data:`sweep_lists`, and what the compiled build's is tested against. It walks a copy
    of the items, as the C one walks the dict in a way that code run by a release (a
    finaliser) cannot break."""
    dropped = 0
    changed: list[tuple[Hashable, Any]] | None = None
    dicts: list[tuple[Hashable, Any]] | None = None
    for key, held in list(lists.items()):
        if type(held) is list:
            gone = drop_ended_in_python(held)
            dropped += gone
            if gone and len(held) < 2:
                changed = _noted(changed, key, held)
        elif type(held) is dict:
            dicts = _noted(dicts, key, held)
        elif held._state & ENDED:  # counted where it is dropped (_sweep)
            changed = _noted(changed, key, held)
    return dropped, changed, dicts


def _noted(
    pairs: list[tuple[Hashable, Any]] | None, key: Hashable, held: Any
) -> list[tuple[Hashable, Any]]:
    """``pairs`` with ``(key, held)`` added, made on first use (as the C one's)."""
    if pairs is None:
        return [(key, held)]
    pairs.append((key, held))
    return pairs


#: :func:`sweep_lists_in_python`, or on the compiled build its equal in C (``_compact.c``):
#: the pass over the store's dict and the lists' compaction without a call per list
#: (W1-cost: see docs/benchmarks.md).
sweep_lists: Final[Callable[[dict[Hashable, Any]], Swept]] = _build.native(
    "_compact", "sweep_lists", sweep_lists_in_python
)


def _sweep(store: WatchStore) -> int:
    """Compact every watch list of ``store``; how many entries were dropped. W1-cost: the
    purge's 1.7k instructions per operation (a lookup, a test and a delete per stale
    entry) become a few hundred (callgrind, compiled, asyncio)."""
    lists = store.lists
    dropped, changed, dicts = sweep_lists(lists)
    if dicts is not None:
        for key, by_identity in dicts:
            gone = drop_ended_by_identity(by_identity)
            dropped += gone
            if gone and len(by_identity) < 2:
                changed = _noted(changed, key, by_identity)
    # The dict changes size only after the pass over it. A value that code run by a
    # release (a finaliser admitting another operation) replaced meanwhile is left as it
    # is now: its stale entries stay counted until a later purge finds them.
    store.watched -= dropped
    if changed is not None:
        for key, held in changed:
            if lists.get(key) is not held:
                continue
            if type(held) is list or type(held) is dict:
                if len(held) < 2:
                    store.shrunk(key, held)
            else:  # a lone operation that ended
                dropped += 1
                store.watched -= 1
                store.shrunk(key, ())
    return dropped
