"""Stale watch entries: dropping them from a list, and the purge of a watch store.

An entry is stale once its operation has ended (completed or cancelled). Entries are
removed lazily, as in Kafka: a walk over a key compacts that key's list, and the
purge, run by :meth:`~._watches.WatchStore.retire` once more than ``purge_interval``
entries are stale, compacts the rest. Kafka's purge sweeps every list; that costs a
visit per entry watched, so it is done only while what is watched is at most
:data:`SWEEP_RATIO` times what is stale. Beyond (a million parked operations, a
thousand stale) the purge compacts only the lists of the keys of the operations
waiting for it, a lookup per key.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Final

from ._states import ENDED, IN_THRESHOLD_INDEX

if TYPE_CHECKING:
    from ._operation import DelayedOperation
    from ._watches import WatchStore

__all__ = ["SWEEP_RATIO", "drop_ended", "purge"]

#: A purge sweeps every list while what is watched is at most this many times what is
#: stale: a few visits per stale entry (about 20 instructions each, compiled), against a
#: dict lookup and a compaction per key of the operations purged otherwise.
SWEEP_RATIO: Final = 8


def drop_ended(watch_list: list[DelayedOperation[Any]]) -> int:
    """Drop the operations that have ended from ``watch_list``, in place (it stays the
    one object its key holds) and keeping the order; how many were dropped.

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


def purge(store: WatchStore) -> None:
    """Remove the stale entries of ``store``: of the operations retired since the last
    purge, and of any other that ended meanwhile."""
    indexes = store.indexes
    dirty, store.dirty = store.dirty, []
    stale = max(store.watched - store.live, len(dirty))
    touched: dict[Hashable, None] | None = None if store.watched <= SWEEP_RATIO * stale else {}
    for op in dirty:
        keys = op._keys
        if op._store == IN_THRESHOLD_INDEX:
            index = indexes.get(keys[0])
            if index is not None:
                index.stale += 1
        elif touched is not None:
            for key in keys:
                touched[key] = None
    removed = 0
    if touched is None:
        removed = _sweep(store)
    else:
        for key in touched:
            removed += store.compact(key)
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


def _sweep(store: WatchStore) -> int:
    """Compact every watch list of ``store``; how many entries were dropped. W1-cost: the
    purge's 1.7k instructions per operation (a lookup, a test and a delete per stale
    entry) become a few hundred (callgrind, compiled, asyncio)."""
    lists = store.lists
    dropped = 0
    changed: list[tuple[Hashable, list[DelayedOperation[Any]]]] = []
    for key, held in lists.items():
        if type(held) is list:
            watch_list: list[DelayedOperation[Any]] = held
            gone = drop_ended(watch_list)
            if gone:
                dropped += gone
                if len(watch_list) < 2:
                    changed.append((key, watch_list))
        elif held._state & ENDED:  # type: ignore[union-attr]
            dropped += 1
            changed.append((key, []))
    store.watched -= dropped
    # The dict changes size only after the pass over it.
    for key, left in changed:
        store.shrunk(key, left)
    return dropped
