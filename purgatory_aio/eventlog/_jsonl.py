"""Event log as JSON Lines: one object per settled operation."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from purgatory_aio.eventlog._base import QueuedEventWriter
from purgatory_aio.events import OperationEvent

# allow_nan=False: NaN is not JSON, and Spark would read the whole line as corrupt.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class JsonLinesWriter(QueuedEventWriter[bytes]):
    """Writes ``*.jsonl`` files, one JSON object per line keyed by the event columns.

    Needs nothing beyond the standard library. See :class:`QueuedEventWriter`
    for queueing, batching, rolling and drop counting.

    Examples:
        >>> with JsonLinesWriter("events/") as sink:          # doctest: +SKIP
        ...     async with Purgatory("fetch", event_sink=sink) as p:
        ...         ...
    """

    suffix = ".jsonl"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        batch_size: int = 1_000,
        roll_bytes: int = 64 * 1024 * 1024,
        roll_seconds: float = 300.0,
        queue_size: int = 100_000,
        flush_seconds: float = 1.0,
        prefix: str = "events",
        partitioned: bool = True,
    ) -> None:
        self._file: IO[bytes] | None = None
        super().__init__(
            directory,
            batch_size=batch_size,
            roll_bytes=roll_bytes,
            roll_seconds=roll_seconds,
            queue_size=queue_size,
            flush_seconds=flush_seconds,
            prefix=prefix,
            partitioned=partitioned,
        )

    def _encode(self, events: Sequence[OperationEvent]) -> bytes:
        dumps = _ENCODER.encode
        lines = [dumps(event.as_dict()) for event in events]
        lines.append("")
        return "\n".join(lines).encode("utf-8")

    def _open_file(self, path: Path) -> None:
        self._file = path.open("wb")

    def _write_payload(self, payload: bytes) -> None:
        assert self._file is not None
        self._file.write(payload)

    def _bytes_written(self) -> int:
        assert self._file is not None
        return self._file.tell()

    def _close_file(self) -> None:
        file, self._file = self._file, None
        if file is not None:
            file.close()
