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

import types
from dataclasses import dataclass
from typing import (
    Annotated,
    Literal,
    NamedTuple,
    Protocol,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    runtime_checkable,
)

Outcome = Literal["completed", "expired", "cancelled", "shutdown"]

OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)

#: The value types a column may have, by their Parquet/Arrow names.
Kind = Literal["string", "int64", "double", "list<string>"]


class OperationEvent(NamedTuple):
    """What happened to one operation: one row of the event log.

    **The one definition of the event log's schema.** Each field's annotation gives
    its column's name, type, nullability (``| None``) and meaning; :data:`FIELDS`
    reads them, and the Parquet writer, the JSON Lines writer, the report's readers
    and the benchmarks derive their schemas from :data:`FIELDS`. A field added here
    reaches all of them.

    Times are float seconds since the Unix epoch (UTC), derived from the
    purgatory's clock, so a purgatory on a ``ManualClock`` logs virtual time.
    ``(producer, purgatory, op_id)`` identifies an operation across processes,
    restarts and copies of the same file.
    """

    purgatory: Annotated[str, "the name of the purgatory that settled it"]
    op_type: Annotated[str, "its class's op_type, or the class name"]
    op_id: Annotated[int, "a serial number, unique per purgatory in one process"]
    keys: Annotated[
        list[str],
        "the keys it was handed to the purgatory with (duplicates removed), as strings, "
        "also when its first try satisfied it before it was ever watched",
    ]
    created_at: Annotated[float, "when it was handed to the purgatory"]
    deadline: Annotated[float, "created_at plus its timeout"]
    settled_at: Annotated[float, "when it settled (completed, expired, cancelled or shut down)"]
    outcome: Annotated[Outcome, "how it settled: one of OUTCOMES"]
    error: Annotated[
        str | None, "the exception it failed with, as 'Type: message'; null unless it failed"
    ]
    producer: Annotated[
        str | None,
        "the id of the event log writer that wrote it (the core leaves it null; each "
        "writer stamps its own); null in logs written before writers stamped it",
    ] = None

    def as_dict(self) -> dict[str, object]:
        """The record as a plain dict keyed by :data:`COLUMNS`."""
        return self._asdict()


@dataclass(frozen=True, slots=True)
class EventField:
    """One column of the event log, as :class:`OperationEvent` declares it."""

    name: str
    kind: Kind
    nullable: bool
    meaning: str
    #: The values the column may hold, when it is a closed set (``outcome``).
    choices: tuple[str, ...] = ()


_KINDS: dict[object, Kind] = {
    str: "string",
    int: "int64",
    float: "double",
    list[str]: "list<string>",
}


def schema_of(record: type[tuple[object, ...]]) -> tuple[EventField, ...]:
    """The columns a ``NamedTuple`` class declares with ``Annotated[type, meaning]`` fields.

    Raises:
        TypeError: A field has no meaning, or a type the event log cannot hold.
    """
    hints = get_type_hints(record, include_extras=True)
    columns = []
    for name in record._fields:  # type: ignore[attr-defined]
        hint = hints[name]
        if get_origin(hint) is not Annotated:
            raise TypeError(f"event field {name} has no meaning: write Annotated[type, meaning]")
        base, meaning, *_ = get_args(hint)
        nullable = False
        if get_origin(base) in (Union, types.UnionType) and type(None) in get_args(base):
            (base,) = [arg for arg in get_args(base) if arg is not type(None)]
            nullable = True
        choices: tuple[str, ...] = ()
        if get_origin(base) is Literal:
            choices = get_args(base)
            base = str
        kind = _KINDS.get(base)
        if kind is None or not isinstance(meaning, str):
            raise TypeError(f"event field {name}: the event log holds no {base!r}")
        columns.append(EventField(name, kind, nullable, meaning, choices))
    return tuple(columns)


#: The event log's columns, in order, read from :class:`OperationEvent`.
FIELDS: tuple[EventField, ...] = schema_of(OperationEvent)

#: Column names of the event log, in order.
COLUMNS: tuple[str, ...] = tuple(field.name for field in FIELDS)

#: Columns every event must have a value for.
REQUIRED: tuple[str, ...] = tuple(field.name for field in FIELDS if not field.nullable)


@runtime_checkable
class EventSink(Protocol):
    """Receives settled-operation records. ``emit`` is called on the loop thread."""

    def emit(self, event: OperationEvent) -> None:
        """Take one record; must not block the loop (queue it, write elsewhere)."""
        ...
