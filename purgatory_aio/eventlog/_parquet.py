"""Event log as Parquet files (needs pyarrow, the ``parquet`` extra)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, assert_never

from purgatory_aio.eventlog._base import QueuedEventWriter
from purgatory_aio.events import FIELDS, EventField, Kind, OperationEvent

PYARROW_MISSING = "ParquetWriter needs pyarrow: pip install 'purgatory-aio[parquet]'"


def arrow_type(kind: Kind) -> Any:
    """The Arrow type of a column of this kind (imports pyarrow)."""
    import pyarrow as pa

    match kind:
        case "string":
            return pa.string()
        case "int64":
            return pa.int64()
        case "double":
            return pa.float64()
        case "list<string>":
            return pa.list_(pa.string())
        case _:
            assert_never(kind)


def arrow_schema(fields: Sequence[EventField] = FIELDS) -> Any:
    """The Arrow schema of the event log, from :data:`purgatory_aio.events.FIELDS`
    (imports pyarrow)."""
    import pyarrow as pa

    return pa.schema([pa.field(f.name, arrow_type(f.kind), nullable=f.nullable) for f in fields])


class ParquetWriter(QueuedEventWriter[Any]):
    """Writes ``*.parquet`` files; each written batch becomes one row group.

    See :class:`QueuedEventWriter` for queueing, batching, rolling and drop
    counting. Choose ``batch_size`` large enough for useful row groups: a batch
    is also cut after ``flush_seconds``, so a quiet purgatory writes small ones.

    Args:
        directory: Where the files go (created if missing).
        compression: Parquet codec: ``"zstd"``, ``"snappy"``, ``"gzip"``, ``"none"``...

    The other arguments are those of :class:`QueuedEventWriter`.

    Raises:
        ImportError: pyarrow is not installed.
    """

    suffix = ".parquet"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        batch_size: int = 10_000,
        roll_bytes: int = 64 * 1024 * 1024,
        roll_seconds: float = 300.0,
        queue_size: int = 100_000,
        flush_seconds: float = 1.0,
        prefix: str = "events",
        partitioned: bool = True,
        compression: str = "zstd",
    ) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError(PYARROW_MISSING, name=exc.name) from exc
        self._pa: Any = pa
        self._pq: Any = pq
        self._schema = arrow_schema()
        self.compression = compression
        self._sink: Any = None
        self._writer: Any = None
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

    def _encode(self, events: Sequence[OperationEvent]) -> Any:
        pa = self._pa
        columns = list(zip(*events, strict=True)) if events else [()] * len(self._schema)
        arrays = [
            pa.array(values, type=field.type, from_pandas=False)
            for values, field in zip(columns, self._schema, strict=True)
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)

    def _open_file(self, path: Path) -> None:
        pa, pq = self._pa, self._pq
        self._sink = pa.OSFile(str(path), "wb")
        try:
            self._writer = pq.ParquetWriter(self._sink, self._schema, compression=self.compression)
        except Exception:
            self._sink.close()
            self._sink = None
            raise

    def _write_payload(self, payload: Any) -> None:
        self._writer.write_batch(payload)

    def _bytes_written(self) -> int:
        return int(self._sink.tell())

    def _close_file(self) -> None:
        writer, sink = self._writer, self._sink
        self._writer = self._sink = None
        try:
            if writer is not None:
                writer.close()
        finally:
            if sink is not None:
                sink.close()
