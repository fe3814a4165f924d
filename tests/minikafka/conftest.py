"""Fixtures of the mini Kafka tests: everything runs on a ManualClock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import pytest
from minikafka import BrokerConfig, Cluster, CreateTopicsRequest, ErrorCode, TopicSpec
from mk_support import TOPIC, Background, Drive, MakeCluster

from purgatory_aio.testing import ManualClock

T = TypeVar("T")


@pytest.fixture
def drive(clock: ManualClock) -> Drive:
    async def run(awaitable: Awaitable[T], *, step: float = 0.01, limit: float = 120.0) -> T:
        task = asyncio.ensure_future(awaitable)
        deadline = clock.time() + limit
        while not task.done():
            assert clock.time() < deadline, "still not done after the virtual time limit"
            await clock.advance(step)
        return task.result()

    return run


@pytest.fixture
async def make_cluster(clock: ManualClock, drive: Drive) -> AsyncIterator[MakeCluster]:
    clusters: list[Cluster] = []

    async def make(
        *, partitions: int = 1, replicas: int = 3, replicate: bool = True, **config: Any
    ) -> Cluster:
        settings: dict[str, Any] = {"brokers": 3, "min_insync_replicas": min(2, replicas), **config}
        cluster = Cluster(BrokerConfig(**settings), clock=clock, replicate=replicate)
        clusters.append(cluster)
        created = await drive(
            cluster.create_topics(CreateTopicsRequest({TOPIC: TopicSpec(partitions, replicas)}))
        )
        assert created.errors[TOPIC] is ErrorCode.NONE
        return cluster

    yield make
    for cluster in clusters:
        await cluster.close()


@pytest.fixture
async def background() -> AsyncIterator[Background]:
    """Starts awaitables as tasks; those still running are cancelled after the test."""
    tasks: list[asyncio.Task[Any]] = []

    def start(awaitable: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(awaitable)
        tasks.append(task)
        return task

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
