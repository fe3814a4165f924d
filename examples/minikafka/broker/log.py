"""An append-only partition log held in memory."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from ..records import Record, record_size
from .producer_state import ProducerBatchInfo

#: Bytes after which the log starts a new segment (Kafka's ``segment.bytes``, scaled down).
SEGMENT_BYTES = 1024 * 1024


@dataclass(slots=True)
class Segment:
    """A stretch of the log from ``base_offset``, with the largest record timestamp in it.

    Time lookups skip every segment whose ``max_timestamp`` is before the time asked
    for, as Kafka's time index does, instead of reading every record.
    """

    base_offset: int
    max_timestamp: float


class Log:
    """Records addressed by offset, with the byte position of every offset.

    Byte positions make "how many bytes lie between two offsets" an O(1)
    subtraction, which is what a waiting fetch asks on every append. The log
    also keeps its segments (for time lookups) and the idempotent batches it
    holds (the producer state a new leader rebuilds from its copy).
    """

    __slots__ = ("_batches", "_positions", "_records", "_segment_bytes", "_segments")

    def __init__(self, segment_bytes: int = SEGMENT_BYTES) -> None:
        self._records: list[Record] = []
        # _positions[i] is the number of bytes before offset i; one more entry than records.
        self._positions: list[int] = [0]
        self._segment_bytes = segment_bytes
        self._segments: list[Segment] = []
        self._batches: list[ProducerBatchInfo] = []

    @property
    def end_offset(self) -> int:
        """The offset the next record will get (Kafka's log end offset)."""
        return len(self._records)

    @property
    def size(self) -> int:
        """Total bytes in the log."""
        return self._positions[-1]

    def append(self, records: Iterable[Record]) -> int:
        """Append in order; returns the offset of the first one appended."""
        base = len(self._records)
        positions = self._positions
        total = positions[-1]
        segments = self._segments
        segment = segments[-1] if segments else None
        for record in records:
            offset = len(self._records)
            if segment is None or total - positions[segment.base_offset] >= self._segment_bytes:
                segment = Segment(offset, record.timestamp)
                segments.append(segment)
            elif record.timestamp > segment.max_timestamp:
                segment.max_timestamp = record.timestamp
            total += record_size(record)
            self._records.append(record)
            positions.append(total)
        return base

    def append_batch(self, records: Sequence[Record], batch: ProducerBatchInfo) -> int:
        """Append an idempotent producer's batch; returns its base offset."""
        base = self.append(records)
        self._batches.append(batch._replace(base_offset=base, last_offset=base + len(records) - 1))
        return base

    def producer_batches(self) -> Sequence[ProducerBatchInfo]:
        """The idempotent batches in the log, in offset order."""
        return self._batches

    def truncate(self, end: int) -> None:
        """Drop every record from offset ``end`` on (a new leader's log ends where its copy
        did)."""
        if end >= len(self._records):
            return
        del self._records[end:]
        del self._positions[end + 1 :]
        while self._batches and self._batches[-1].last_offset >= end:
            self._batches.pop()
        while self._segments and self._segments[-1].base_offset >= end:
            self._segments.pop()
        if self._segments:
            segment = self._segments[-1]
            segment.max_timestamp = max(r.timestamp for r in self._records[segment.base_offset :])

    def offset_for_time(self, timestamp: float, end: int) -> tuple[int, float] | None:
        """The first offset below ``end`` whose record timestamp is at least ``timestamp``,
        with that timestamp; None when there is none."""
        segments = self._segments
        records = self._records
        for index, segment in enumerate(segments):
            if segment.base_offset >= end:
                break
            if segment.max_timestamp < timestamp:
                continue
            stop = segments[index + 1].base_offset if index + 1 < len(segments) else end
            for offset in range(segment.base_offset, min(stop, end)):
                if records[offset].timestamp >= timestamp:
                    return offset, records[offset].timestamp
        return None

    def bytes_between(self, start: int, end: int) -> int:
        """Bytes of the records in ``[start, end)``; 0 when the range is empty."""
        if start >= end:
            return 0
        return self._positions[end] - self._positions[start]

    def read(self, start: int, end: int, max_bytes: int) -> Sequence[Record]:
        """Records from ``start`` up to ``end`` (exclusive) within ``max_bytes``.

        The first record is returned even if it alone exceeds ``max_bytes``.
        """
        end = min(end, len(self._records))
        if start >= end:
            return ()
        positions = self._positions
        stop = bisect_right(positions, positions[start] + max_bytes, start + 1, end + 1) - 1
        return self._records[start : max(stop, start + 1)]

    def __getitem__(self, offset: int) -> Record:
        return self._records[offset]

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[Record]:
        return iter(self._records)
