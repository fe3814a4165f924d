"""Delayed messages: records held back by the broker until their delivery time."""

from __future__ import annotations

from collections.abc import Callable

from purgatory_aio import Clock, Timer

from ..records import Record, TopicPartition


class DelayedDelivery:
    """Holds records with a delivery delay on the timing wheel and appends them when due.

    A delayed record is not in the log at all until it is due, so no consumer can
    see it early, whatever offset it reads from. Each record is one timer entry
    (O(1) to add), with no task or loop timer of its own.

    Args:
        timer: the broker's timer.
        clock: the clock the timer runs on.
        deliver: appends a due record to its partition.
    """

    __slots__ = (
        "_clock",
        "_deliver",
        "_timer",
        "delivered",
        "max_lateness",
        "pending",
        "scheduled",
    )

    def __init__(
        self, timer: Timer, clock: Clock, deliver: Callable[[TopicPartition, Record], None]
    ) -> None:
        self._timer = timer
        self._clock = clock
        self._deliver = deliver
        #: Records accepted for delayed delivery so far.
        self.scheduled = 0
        #: Records delivered to their partition so far.
        self.delivered = 0
        #: Records waiting for their delivery time.
        self.pending = 0
        #: Largest delay between a record's delivery time and its append, in seconds.
        self.max_lateness = 0.0

    def schedule(self, tp: TopicPartition, record: Record, due: float) -> None:
        self._timer.call_at(due, self._on_due, tp, record, due)
        self.scheduled += 1
        self.pending += 1

    def _on_due(self, tp: TopicPartition, record: Record, due: float) -> None:
        self.pending -= 1
        self.delivered += 1
        lateness = self._clock.time() - due
        if lateness > self.max_lateness:
            self.max_lateness = lateness
        self._deliver(tp, record)
