"""DelayedFetch: a long-poll read waiting for enough bytes to return."""

from __future__ import annotations

from typing import TYPE_CHECKING

from purgatory_aio import DelayedOperation

from ..protocol import FetchRequest, FetchResponse

if TYPE_CHECKING:
    from .replica_manager import ReplicaManager


class DelayedFetch(DelayedOperation[FetchResponse]):
    """Completes once ``min_bytes`` can be returned, or with what there is at ``max_wait``.

    Watched under every partition of the request. The broker checks the fetch
    purgatory on a partition when its log grows (followers read up to the log
    end) and when its high watermark moves (consumers read up to it). The data
    is read in :meth:`on_complete`, so an expired fetch still returns whatever
    arrived, possibly nothing.
    """

    __slots__ = ("_replicas", "_request")

    def __init__(self, request: FetchRequest, replicas: ReplicaManager) -> None:
        super().__init__(request.max_wait)
        self._request = request
        self._replicas = replicas

    @property
    def request(self) -> FetchRequest:
        return self._request

    def try_complete(self) -> bool:
        return self._replicas.fetch_satisfied(self._request) and self.force_complete()

    def on_complete(self) -> FetchResponse:
        return self._replicas.read(self._request)
