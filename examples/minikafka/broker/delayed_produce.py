"""DelayedProduce: an ``acks=all`` write waiting for the in-sync replicas."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from purgatory_aio import DelayedOperation

from ..errors import ErrorCode
from ..protocol import PartitionProduceResult, ProduceResponse
from ..records import TopicPartition

if TYPE_CHECKING:
    from .replica_manager import ReplicaManager


class DelayedProduce(DelayedOperation[ProduceResponse]):
    """Completes once every partition of the request is replicated to its whole ISR.

    Watched under each partition still waiting. The broker calls
    ``check_and_complete(partition)`` whenever that partition's high watermark
    moves, so a check costs one comparison per waiting partition. At the deadline
    the partitions still waiting answer ``REQUEST_TIMED_OUT`` (the records stay
    in the leader log: the producer cannot tell whether they will survive).

    Args:
        timeout: the request's timeout.
        replicas: the replica manager that knows each partition's high watermark.
        results: the outcome of the append per partition (errors are final).
        waiting: the offset every in-sync replica must reach, per partition.
        respond: called once with the response, satisfied or expired.
    """

    __slots__ = ("_replicas", "_respond", "_results", "_waiting")

    def __init__(
        self,
        timeout: float,
        replicas: ReplicaManager,
        results: dict[TopicPartition, PartitionProduceResult],
        waiting: dict[TopicPartition, int],
        respond: Callable[[ProduceResponse], None] | None = None,
    ) -> None:
        super().__init__(timeout)
        self._replicas = replicas
        self._results = results
        self._waiting = waiting
        self._respond = respond

    @property
    def waiting(self) -> tuple[TopicPartition, ...]:
        """Partitions whose replication is not settled yet."""
        return tuple(self._waiting)

    def try_complete(self) -> bool:
        waiting = self._waiting
        settled: list[tuple[TopicPartition, ErrorCode]] = []
        for tp, required in waiting.items():
            status = self._replicas.replication_status(tp, required)
            if status is not None:
                settled.append((tp, status))
        for tp, status in settled:
            del waiting[tp]
            if status is not ErrorCode.NONE:
                self._results[tp] = replace(self._results[tp], error=status)
        return not waiting and self.force_complete()

    def on_complete(self) -> ProduceResponse:
        results = self._results
        for tp in self._waiting:
            results[tp] = replace(results[tp], error=ErrorCode.REQUEST_TIMED_OUT)
        response = ProduceResponse(results)
        if self._respond is not None:
            self._respond(response)
        return response
