"""Event sinks of the simulator: an outcome tally and the optional event-log writer."""

from __future__ import annotations

import os
from collections import Counter
from typing import Protocol

from purgatory_aio import EventSink, OperationEvent

from ..broker.cluster import PURGATORY_NAMES

#: Formats ``--events-format`` accepts.
EVENT_FORMATS = ("jsonl", "parquet")


class OutcomeTally:
    """Counts settled operations per purgatory and outcome, passing each event on."""

    __slots__ = ("_counts", "_forward")

    def __init__(self, forward: EventSink | None = None) -> None:
        self._forward = forward
        self._counts: Counter[tuple[str, str]] = Counter()

    def emit(self, event: OperationEvent) -> None:
        self._counts[event.purgatory, event.outcome] += 1
        if self._forward is not None:
            self._forward.emit(event)

    def table(self) -> dict[str, dict[str, int]]:
        """``{purgatory: {outcome: count}}`` for every purgatory of the cluster."""
        outcomes = ("completed", "expired", "cancelled", "shutdown")
        return {
            name: {outcome: self._counts[name, outcome] for outcome in outcomes}
            for name in PURGATORY_NAMES
        }


class ClosableSink(EventSink, Protocol):
    """An event sink with ``close()``, like the event-log writers."""

    def close(self) -> None: ...


def open_event_writer(directory: str | os.PathLike[str], fmt: str) -> ClosableSink:
    """The event-log writer of ``fmt`` writing into ``directory``.

    Raises:
        RuntimeError: the format needs an optional dependency that is missing.
        ValueError: unknown format.
    """
    if fmt not in EVENT_FORMATS:
        raise ValueError(f"events format must be one of {', '.join(EVENT_FORMATS)}, got {fmt!r}")
    from purgatory_aio.eventlog import JsonLinesWriter, ParquetWriter

    # A simulated minute settles a few hundred thousand operations within seconds: give
    # the writer room so that none are dropped while its thread catches up.
    queue_size = 2_000_000
    if fmt == "jsonl":
        return JsonLinesWriter(directory, queue_size=queue_size)
    try:
        return ParquetWriter(directory, queue_size=queue_size)
    except ImportError as exc:
        raise RuntimeError(
            "--events-format parquet needs pyarrow: pip install 'purgatory-aio[parquet]'"
        ) from exc
