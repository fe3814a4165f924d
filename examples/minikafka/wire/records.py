"""Record batches (magic 2) between the wire and the example's :class:`Record`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka.record.default_records import (  # type: ignore[import-untyped]
    DefaultRecordBatch,
    DefaultRecordBatchBuilder,
)

from ..records import Record

#: Offset of the batch length field; a batch is 12 bytes of offset and length, then the body.
_BATCH_HEADER = 12


class CorruptRecordBatch(ValueError):
    """A produced batch is truncated, not magic 2, or fails its CRC."""


@dataclass(frozen=True, slots=True)
class ProducedBatch:
    """The one record batch of a partition in a produce request (v3+ allow exactly one)."""

    records: list[Record]
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    size: int


def decode_produced(data: bytes) -> ProducedBatch:
    """The batch of one partition of a produce request.

    Raises :class:`CorruptRecordBatch` for anything but exactly one valid batch.
    """
    view = memoryview(data)
    if len(data) < _BATCH_HEADER:
        raise CorruptRecordBatch("truncated record batch header")
    length = int.from_bytes(view[8:12], "big", signed=True)
    if _BATCH_HEADER + length != len(data):
        raise CorruptRecordBatch("a produce request must carry exactly one record batch")
    records = decode_batches(data)
    batch = DefaultRecordBatch(data)
    return ProducedBatch(
        records,
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
        bool(batch.is_transactional),
        len(data),
    )


def decode_batches(data: bytes) -> list[Record]:
    """Every record of the batches in ``data``, CRC checked (compressed batches included).

    Null keys, values and header values stay None.
    """
    records: list[Record] = []
    pos = 0
    view = memoryview(data)
    while pos < len(data):
        if len(data) - pos < _BATCH_HEADER:
            raise CorruptRecordBatch("truncated record batch header")
        length = int.from_bytes(view[pos + 8 : pos + 12], "big", signed=True)
        end = pos + _BATCH_HEADER + length
        if length < 49 or end > len(data):
            raise CorruptRecordBatch(f"record batch length {length} does not fit the request")
        if data[pos + 16] != 2:
            raise CorruptRecordBatch(f"record batch magic {data[pos + 16]} is not 2")
        batch = DefaultRecordBatch(bytes(view[pos:end]))
        if not batch.validate_crc():
            raise CorruptRecordBatch("record batch CRC mismatch")
        producer_id = batch.producer_id
        base_sequence = batch.base_sequence
        for index, rec in enumerate(batch):
            records.append(
                Record(
                    value=rec.value,
                    key=rec.key,
                    timestamp=rec.timestamp / 1000.0,
                    producer_id=producer_id,
                    sequence=base_sequence + index if base_sequence >= 0 else -1,
                    headers=tuple(rec.headers),
                )
            )
        pos = end
    return records


def encode_batch(base_offset: int, records: Sequence[Record]) -> bytes:
    """One uncompressed batch holding ``records`` at consecutive offsets from ``base_offset``."""
    if not records:
        return b""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=2**31 - 1,
    )
    for delta, record in enumerate(records):
        builder.append(
            delta,
            timestamp=int(record.timestamp * 1000),
            key=record.key,
            value=record.value,
            headers=list(record.headers),
        )
    batch = builder.build()
    batch[0:8] = base_offset.to_bytes(8, "big", signed=True)
    return bytes(batch)
