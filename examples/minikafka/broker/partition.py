"""A partition on its leader: the log, the followers, the ISR and the high watermark."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..errors import ErrorCode
from ..records import Record, TopicPartition
from .log import Log
from .producer_state import ProducerBatchInfo, ProducerStateManager, SequenceCheck, last_sequence
from .replica import FollowerState


class Partition:
    """Leader-side state of one partition.

    The high watermark is the smallest log end offset among the in-sync replicas
    (the leader included): every record below it is held by all of them, and
    only those records are visible to consumers. It never moves backwards.

    Args:
        tp: the partition.
        replicas: broker ids holding a copy, the preferred leader first.
        max_message_bytes: the largest record batch a producer may append.
    """

    __slots__ = (
        "_followers",
        "high_watermark",
        "isr",
        "leader",
        "log",
        "max_message_bytes",
        "producers",
        "replicas",
        "tp",
    )

    def __init__(
        self, tp: TopicPartition, replicas: tuple[int, ...], max_message_bytes: int = 2**31 - 1
    ) -> None:
        self.tp = tp
        self.replicas = replicas
        self.leader: int | None = None
        self.log = Log()
        self.isr: tuple[int, ...] = ()
        self.high_watermark = 0
        self.max_message_bytes = max_message_bytes
        #: Idempotent producers' latest batches, as the leader's log holds them.
        self.producers = ProducerStateManager()
        self._followers: dict[int, FollowerState] = {}

    @property
    def log_end_offset(self) -> int:
        return self.log.end_offset

    @property
    def followers(self) -> Iterable[FollowerState]:
        return self._followers.values()

    def follower(self, broker_id: int) -> FollowerState | None:
        return self._followers.get(broker_id)

    def become_leader(self, broker_id: int, now: float) -> None:
        """Make ``broker_id`` the leader with every replica in sync (a fresh partition)."""
        self.leader = broker_id
        self._followers = {b: FollowerState(b, now) for b in self.replicas if b != broker_id}
        self.isr = self.replicas
        self._advance_high_watermark()

    def fail_over(self, broker_id: int, now: float) -> None:
        """Make the in-sync follower ``broker_id`` the leader.

        Its copy becomes the log: records beyond what it had fetched are gone (they were
        never committed, as it was in the ISR), and the producer state is rebuilt from
        the idempotent batches of that copy, as a Kafka follower builds it while copying.
        """
        follower = self._followers.get(broker_id)
        if follower is None or broker_id not in self.isr:
            raise ValueError(f"broker {broker_id} is not an in-sync follower of {self.tp}")
        end = follower.log_end
        self.log.truncate(end)
        self.producers.rebuild(self.log.producer_batches())
        old = self.leader
        self.leader = broker_id
        followers = {b: FollowerState(b, now) for b in self.replicas if b != broker_id}
        for b, state in followers.items():
            previous = self._followers.get(b)
            state.log_end = end if b == old or previous is None else min(end, previous.log_end)
        self._followers = followers
        self.high_watermark = min(self.high_watermark, end)
        self._advance_high_watermark()

    def append(self, records: Iterable[Record]) -> tuple[int, bool]:
        """Append to the leader log: (offset of the first record, whether the HW moved)."""
        base = self.log.append(records)
        return base, self._advance_high_watermark()

    def check_sequence(
        self, producer_id: int, epoch: int, first_sequence: int, count: int
    ) -> SequenceCheck:
        """Judge an idempotent batch of ``count`` records before it is appended."""
        return self.producers.check(
            producer_id, epoch, first_sequence, last_sequence(first_sequence, count)
        )

    def append_batch(
        self,
        records: Sequence[Record],
        producer_id: int,
        epoch: int,
        first_sequence: int,
        count: int,
    ) -> tuple[int, bool]:
        """Append an idempotent batch that :meth:`check_sequence` passed.

        ``count`` numbers the whole batch; ``records`` may be fewer (the rest held back
        for delayed delivery). A batch with nothing to append now is remembered by the
        producer state only.
        """
        info = ProducerBatchInfo(
            producer_id, epoch, first_sequence, last_sequence(first_sequence, count), -1, -1
        )
        if not records:
            self.producers.update(info)
            return -1, False
        base = self.log.append_batch(records, info)
        self.producers.update(self.log.producer_batches()[-1])
        return base, self._advance_high_watermark()

    def on_follower_fetch(
        self, broker_id: int, fetch_offset: int, now: float, lag_max: float
    ) -> tuple[bool, bool]:
        """Record a follower fetch.

        Returns whether the high watermark moved and whether the follower rejoined the ISR.
        """
        state = self._followers[broker_id]
        state.on_fetch(fetch_offset, self.log.end_offset, now)
        rejoined = False
        if (
            broker_id not in self.isr
            and fetch_offset >= self.high_watermark
            and state.lag_time(now) <= lag_max
        ):
            # Keep the ISR in replica order so that its rendering is stable.
            self.isr = tuple(b for b in self.replicas if b in self.isr or b == broker_id)
            rejoined = True
        return self._advance_high_watermark(), rejoined

    def shrink_isr(self, now: float, lag_max: float) -> tuple[tuple[int, ...], bool]:
        """Drop followers that have not caught up for ``lag_max``.

        Returns the dropped brokers and whether the high watermark moved.
        """
        dropped = tuple(
            b for b in self.isr if b != self.leader and self._followers[b].lag_time(now) > lag_max
        )
        if not dropped:
            return (), False
        self.isr = tuple(b for b in self.isr if b not in dropped)
        return dropped, self._advance_high_watermark()

    def replication_status(self, required_offset: int, min_insync: int) -> ErrorCode | None:
        """Whether an ``acks=all`` write ending at ``required_offset`` is settled.

        None while in-sync replicas still lack it; ``NONE`` once all have it;
        ``NOT_ENOUGH_REPLICAS_AFTER_APPEND`` when they have it but the ISR has
        shrunk below ``min_insync`` meanwhile.
        """
        if self.leader is None:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        if self.high_watermark < required_offset:
            return None
        if len(self.isr) < min_insync:
            return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        return ErrorCode.NONE

    def _advance_high_watermark(self) -> bool:
        end = self.log.end_offset
        for b in self.isr:
            if b != self.leader:
                end = min(end, self._followers[b].log_end)
        if end > self.high_watermark:
            self.high_watermark = end
            return True
        return False

    def __repr__(self) -> str:
        return (
            f"Partition({self.tp}, leader={self.leader}, isr={self.isr}, "
            f"hw={self.high_watermark}, leo={self.log.end_offset})"
        )
