"""Creating topics: DelayedCreateTopics waits until every partition has a leader."""

from __future__ import annotations

from minikafka import BrokerConfig, Cluster, CreateTopicsRequest, ErrorCode, TopicSpec
from mk_support import Background

from purgatory_aio.testing import ManualClock


async def test_create_topics_waits_until_every_partition_has_a_leader(
    clock: ManualClock, background: Background
) -> None:
    async with Cluster(BrokerConfig(leader_election_delay=0.1), clock=clock) as cluster:
        create = background(cluster.create_topics(CreateTopicsRequest({"a": TopicSpec(3, 3)})))
        await clock.advance(0.25)
        assert not create.done()
        assert [p.leader for p in cluster.replicas.topic_partitions("a")] == [0, 1, None]
        await clock.advance(0.06)
        assert create.done()
        assert create.result().errors == {"a": ErrorCode.NONE}


async def test_create_topics_times_out_while_leaders_are_missing(
    clock: ManualClock, background: Background
) -> None:
    async with Cluster(BrokerConfig(leader_election_delay=0.1), clock=clock) as cluster:
        request = CreateTopicsRequest({"a": TopicSpec(3, 3)}, timeout=0.15)
        create = background(cluster.create_topics(request))
        await clock.advance(0.16)
        assert create.result().errors == {"a": ErrorCode.REQUEST_TIMED_OUT}
        await clock.advance(0.2)
        assert all(p.leader is not None for p in cluster.replicas.topic_partitions("a"))


async def test_invalid_topics_are_refused_at_once(clock: ManualClock) -> None:
    async with Cluster(BrokerConfig(brokers=2), clock=clock) as cluster:
        response = await cluster.create_topics(
            CreateTopicsRequest({"wide": TopicSpec(1, 3), "none": TopicSpec(0, 1)})
        )
        assert response.errors == {
            "wide": ErrorCode.INVALID_REPLICATION_FACTOR,
            "none": ErrorCode.INVALID_PARTITIONS,
        }


async def test_creating_an_existing_topic_fails(clock: ManualClock, background: Background) -> None:
    async with Cluster(clock=clock) as cluster:
        first = background(cluster.create_topics(CreateTopicsRequest({"a": TopicSpec(1, 1)})))
        await clock.advance(0.1)
        assert first.result().errors == {"a": ErrorCode.NONE}
        again = await cluster.create_topics(CreateTopicsRequest({"a": TopicSpec(1, 1)}))
        assert again.errors == {"a": ErrorCode.TOPIC_ALREADY_EXISTS}


async def test_replicas_are_spread_round_robin_with_the_preferred_leader_first(
    clock: ManualClock, background: Background
) -> None:
    async with Cluster(BrokerConfig(brokers=3), clock=clock) as cluster:
        create = background(cluster.create_topics(CreateTopicsRequest({"a": TopicSpec(3, 2)})))
        await clock.advance(0.1)
        assert create.done()
        metadata = cluster.metadata("a")
        assert metadata is not None
        assert [(p.leader, p.replicas) for p in metadata.partitions] == [
            (0, (0, 1)),
            (1, (1, 2)),
            (2, (2, 0)),
        ]
