"""The operation event log: one record per settled operation.

A purgatory given an ``event_sink`` hands every operation it settles to
``sink.emit(event)`` on the event-loop thread. Sinks must not block: the
writers in :mod:`purgatory_aio.eventlog` queue records and write on a worker
thread. With no sink the purgatory builds no record at all.

Examples:
    >>> from purgatory_aio.eventlog import JsonLinesWriter
    >>> sink = JsonLinesWriter("events/")           # doctest: +SKIP
    >>> Purgatory("fetch", event_sink=sink)          # doctest: +SKIP
"""

from __future__ import annotations

from typing import Literal, NamedTuple, Protocol, runtime_checkable

Outcome = Literal["completed", "expired", "cancelled", "shutdown"]

OUTCOMES: tuple[Outcome, ...] = ("completed", "expired", "cancelled", "shutdown")

#: Column names of the event log, in order; every writer and reader uses these.
COLUMNS: tuple[str, ...] = (
    "purgatory",
    "op_type",
    "op_id",
    "keys",
    "created_at",
    "deadline",
    "settled_at",
    "outcome",
    "error",
    "producer",
)


class OperationEvent(NamedTuple):
    """What happened to one operation.

    Times are float seconds since the Unix epoch (UTC), derived from the
    purgatory's clock, so a purgatory on a ``ManualClock`` logs virtual time.
    ``created_at`` is when the operation was handed to the purgatory and
    ``deadline`` that instant plus its timeout. ``keys`` are the keys it was
    handed to the purgatory with (duplicates removed), as strings, whether or not
    it was ever watched: one satisfied at its first try was still asked for under
    them, and the report's hot keys count it there.

    ``producer`` names the event log writer (or process) that wrote the record:
    the core leaves it ``None`` and each writer stamps its own instance id, so
    ``(producer, purgatory, op_id)`` identifies an operation across processes,
    restarts and copies of the same file.
    """

    purgatory: str
    op_type: str
    op_id: int
    keys: list[str]
    created_at: float
    deadline: float
    settled_at: float
    outcome: Outcome
    error: str | None
    producer: str | None = None

    def as_dict(self) -> dict[str, object]:
        """The record as a plain dict keyed by :data:`COLUMNS`."""
        return self._asdict()


@runtime_checkable
class EventSink(Protocol):
    """Receives settled-operation records. ``emit`` is called on the loop thread."""

    def emit(self, event: OperationEvent) -> None:
        """Take one record; must not block the loop (queue it, write elsewhere)."""
        ...
