"""Helpers shared by the mini Kafka tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from minikafka import Cluster, FetchRequest, FetchResponse, Record, TopicPartition

T = TypeVar("T")

TOPIC = "t"
TP0 = TopicPartition(TOPIC, 0)


class Drive(Protocol):
    """Awaits something while moving virtual time on in small steps."""

    async def __call__(
        self, awaitable: Awaitable[T], *, step: float = ..., limit: float = ...
    ) -> T: ...


class MakeCluster(Protocol):
    """Builds a cluster with topic ``t``, its leaders elected."""

    async def __call__(
        self, *, partitions: int = ..., replicas: int = ..., replicate: bool = ..., **config: Any
    ) -> Cluster: ...


def record(size: int = 100, *, delay: float = 0.0, key: bytes | None = None) -> Record:
    """A record whose value is ``size`` bytes."""
    return Record(b"x" * size, key, delay=delay)


async def follower_fetch(
    cluster: Cluster, broker: int, offset: int, tp: TopicPartition = TP0
) -> FetchResponse:
    """One fetch by follower ``broker`` at ``offset``, answered at once."""
    return await cluster.fetch(FetchRequest({tp: offset}, max_wait=0.0, replica_id=broker))


#: Starts an awaitable as a task that the test cleans up.
Background = Callable[[Awaitable[Any]], "asyncio.Task[Any]"]
