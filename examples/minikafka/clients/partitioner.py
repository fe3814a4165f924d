"""Choosing a record's partition: key hash, or sticky round robin without a key."""

from __future__ import annotations

import zlib


class Partitioner:
    """Kafka's default partitioning.

    A keyed record goes to ``hash(key) % partitions``, so one key always lands
    in one partition (and keeps its order). The hash is CRC-32: stable across
    processes, unlike Python's salted ``hash``.

    Records without a key stick to one partition until its batch is closed, then
    move on to the next partition: whole batches rotate over the partitions,
    instead of single records, which keeps batches full.
    """

    __slots__ = ("_sticky",)

    def __init__(self) -> None:
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, key: bytes | None, partitions: int) -> int:
        if key is not None:
            return zlib.crc32(key) % partitions
        sticky = self._sticky.get(topic)
        if sticky is None or sticky >= partitions:
            sticky = self._sticky[topic] = 0
        return sticky

    def next_sticky(self, topic: str, partitions: int) -> int:
        """The sticky partition's batch is closed: move to the next partition."""
        sticky = (self._sticky.get(topic, -1) + 1) % partitions
        self._sticky[topic] = sticky
        return sticky
