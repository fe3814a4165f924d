"""An append-only partition log held in memory."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence

from ..records import Record, record_size


class Log:
    """Records addressed by offset, with the byte position of every offset.

    Byte positions make "how many bytes lie between two offsets" an O(1)
    subtraction, which is what a waiting fetch asks on every append.
    """

    __slots__ = ("_positions", "_records")

    def __init__(self) -> None:
        self._records: list[Record] = []
        # _positions[i] is the number of bytes before offset i; one more entry than records.
        self._positions: list[int] = [0]

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
        for record in records:
            total += record_size(record)
            self._records.append(record)
            positions.append(total)
        return base

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
