"""A purgatory's counters as a snapshot: attributes, a read-only mapping, and a JSON-ready dict."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields

__all__ = ["PurgatoryStats"]


@dataclass(frozen=True, slots=True)
class PurgatoryStats(Mapping[str, "str | int"]):
    """A snapshot of a purgatory's counters (cumulative since it was created).

    Read it as attributes (``stats.pending``), as a mapping (``dict(stats)``,
    ``{**stats}``, ``stats["expired"]``), or as a plain JSON-ready dict
    (``stats.as_dict()``; ``json.dumps(stats.as_dict())``).

    Attributes:
        name: the purgatory's name.
        pending: operations in the timer (``num_delayed``).
        watched: entries across all watch lists and threshold indexes (Kafka's ``watched``).
        watched_keys: keys with at least one such entry.
        completed: operations satisfied (``force_complete``, including from ``try_complete``).
        expired: operations whose deadline passed.
        cancelled: operations withdrawn.
        shutdown: operations settled by shutdown.
        purged: stale watch entries removed by purges.
        callback_errors: callbacks (``try_complete``, ``on_complete``, ``on_expiration``)
            that raised.
        events_failed: event records the event sink refused.
    """

    name: str
    pending: int
    watched: int
    watched_keys: int
    completed: int
    expired: int
    cancelled: int
    shutdown: int
    purged: int
    callback_errors: int
    events_failed: int

    def __getitem__(self, field: str) -> str | int:
        if field not in _FIELDS:
            raise KeyError(field)
        value: str | int = getattr(self, field)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)

    def as_dict(self) -> dict[str, str | int]:
        """A plain dict of every counter, ready for ``json.dumps``."""
        return asdict(self)


_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(PurgatoryStats))
