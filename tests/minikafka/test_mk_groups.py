"""Consumer groups: the join barrier (DelayedJoin) and session expiry (DelayedHeartbeat)."""

from __future__ import annotations

from typing import Any

from minikafka import Cluster, Consumer, ConsumerConfig, ErrorCode
from minikafka.broker import GroupState
from mk_support import TOPIC, Background, Drive, MakeCluster

from purgatory_aio.testing import ManualClock

GROUP = "g"


async def join(
    cluster: Cluster,
    member_id: str = "",
    *,
    session_timeout: float = 10.0,
    rebalance_timeout: float = 30.0,
) -> str:
    """Join and return the member id (for a group where the barrier completes at once)."""
    response = await cluster.join_group(
        GROUP,
        member_id,
        topics=[TOPIC],
        session_timeout=session_timeout,
        rebalance_timeout=rebalance_timeout,
    )
    assert response.error is ErrorCode.NONE
    member: str = response.member_id
    return member


async def test_first_member_passes_the_join_barrier_alone(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(partitions=2)
    response = await cluster.join_group(GROUP, topics=[TOPIC])
    assert response.error is ErrorCode.NONE
    assert response.generation == 1
    assert response.leader_id == response.member_id
    assert len(response.assignment) == 2


async def test_join_barrier_completes_early_when_every_member_rejoins(
    make_cluster: MakeCluster, clock: ManualClock, background: Background
) -> None:
    cluster = await make_cluster(partitions=2)
    first = await join(cluster)
    newcomer = background(cluster.join_group(GROUP, topics=[TOPIC], rebalance_timeout=30.0))
    await clock.advance(0)
    assert not newcomer.done(), "the barrier waits for the existing member to rejoin"

    rejoined = await cluster.join_group(GROUP, first, topics=[TOPIC], rebalance_timeout=30.0)
    await clock.advance(0)
    assert newcomer.done()
    assert rejoined.generation == newcomer.result().generation == 2
    assert set(rejoined.members) == {first, newcomer.result().member_id}
    assert {*rejoined.assignment, *newcomer.result().assignment} == {
        p.tp for p in cluster.replicas.topic_partitions(TOPIC)
    }
    assert cluster.coordinator.joins_at_timeout == 0


async def test_join_barrier_completes_at_the_rebalance_timeout_dropping_missing_members(
    make_cluster: MakeCluster, clock: ManualClock, background: Background
) -> None:
    cluster = await make_cluster(partitions=2)
    timeouts: dict[str, Any] = {"session_timeout": 30.0, "rebalance_timeout": 5.0}
    first = await join(cluster, session_timeout=30.0, rebalance_timeout=5.0)
    newcomer = background(cluster.join_group(GROUP, topics=[TOPIC], **timeouts))
    await clock.advance(0)
    rejoined = await cluster.join_group(GROUP, first, topics=[TOPIC], **timeouts)
    await clock.advance(0)
    second = newcomer.result().member_id
    assert rejoined.generation == 2

    # A third member starts a rebalance; the second one never rejoins.
    started = clock.time()
    third = background(cluster.join_group(GROUP, topics=[TOPIC], **timeouts))
    rejoin = background(cluster.join_group(GROUP, first, topics=[TOPIC], **timeouts))
    await clock.advance(4.9)
    assert not third.done() and not rejoin.done()
    await clock.advance(0.2)
    assert third.done() and rejoin.done()
    assert clock.time() - started >= 5.0
    assert set(third.result().members) == {first, third.result().member_id}
    assert cluster.coordinator.joins_at_timeout == 1
    dropped = [e for e in cluster.coordinator.events if e.kind == "member_dropped"]
    assert [e.member_id for e in dropped] == [second]


async def test_heartbeats_keep_a_member_in_the_group(
    make_cluster: MakeCluster, clock: ManualClock
) -> None:
    cluster = await make_cluster()
    member = await join(cluster, session_timeout=3.0)
    for _ in range(10):
        await clock.advance(1.0)
        assert (await cluster.heartbeat(GROUP, member, 1)).error is ErrorCode.NONE
    group = cluster.coordinator.group(GROUP)
    assert group is not None and list(group.members) == [member]


async def test_a_member_that_stops_heartbeating_is_expelled_and_the_group_rebalances(
    make_cluster: MakeCluster, clock: ManualClock
) -> None:
    cluster = await make_cluster(partitions=2)
    member = await join(cluster, session_timeout=3.0, rebalance_timeout=10.0)
    await clock.advance(2.9)
    assert cluster.coordinator.group(GROUP) is not None
    await clock.advance(0.2)
    kinds = [e.kind for e in cluster.coordinator.events]
    assert kinds[-3:] == ["member_expired", "rebalance_started", "rebalance_completed"]
    assert (await cluster.heartbeat(GROUP, member, 1)).error is ErrorCode.UNKNOWN_MEMBER_ID


async def test_members_learn_of_a_rebalance_from_their_heartbeat(
    make_cluster: MakeCluster, clock: ManualClock, background: Background
) -> None:
    cluster = await make_cluster()
    member = await join(cluster)
    background(cluster.join_group(GROUP, topics=[TOPIC]))
    await clock.advance(0)
    response = await cluster.heartbeat(GROUP, member, 1)
    assert response.error is ErrorCode.REBALANCE_IN_PROGRESS


def consumer_config(name: str) -> ConsumerConfig:
    return ConsumerConfig(
        group_id=GROUP,
        topics=(TOPIC,),
        session_timeout=3.0,
        heartbeat_interval=1.0,
        rebalance_timeout=5.0,
        fetch_max_wait=0.5,
        client_id=name,
    )


async def test_a_silent_consumer_is_expelled_and_its_partitions_move_to_the_others(
    make_cluster: MakeCluster, clock: ManualClock, background: Background
) -> None:
    cluster = await make_cluster(partitions=4)
    steady = Consumer(cluster, consumer_config("steady"))
    silent = Consumer(cluster, consumer_config("silent"))
    polling = {"silent": True}

    async def poll_steady() -> None:
        while True:
            await steady.poll()

    async def poll_silent() -> None:
        while polling["silent"]:
            await silent.poll()

    background(poll_steady())
    silent_task = background(poll_silent())
    await clock.advance(3.0)
    assert len(steady.assignment) == len(silent.assignment) == 2
    generation = steady.generation

    polling["silent"] = False
    await clock.advance(1.0)
    assert silent_task.done(), "the silent consumer no longer polls (nor heartbeats)"
    await clock.advance(5.0)

    expired = [e for e in cluster.coordinator.events if e.kind == "member_expired"]
    assert [e.member_id for e in expired] == [silent.member_id]
    assert steady.generation > generation
    assert len(steady.assignment) == 4
    group = cluster.coordinator.group(GROUP)
    assert group is not None and group.state is GroupState.STABLE
    assert list(group.members) == [steady.member_id]


async def test_consumers_share_the_partitions_and_read_every_record(
    make_cluster: MakeCluster, drive: Drive, clock: ManualClock, background: Background
) -> None:
    from minikafka import Producer, ProducerConfig

    cluster = await make_cluster(partitions=4)
    producer = Producer(cluster, ProducerConfig(acks=1, linger=0.0))
    for i in range(40):
        producer.send(TOPIC, b"v%d" % i, key=b"k%d" % i)
    await drive(producer.flush())
    consumers = [Consumer(cluster, consumer_config(f"c{i}")) for i in range(2)]
    seen: list[bytes] = []

    async def consume(consumer: Consumer) -> None:
        while True:
            seen.extend(r.record.value for r in await consumer.poll())

    for consumer in consumers:
        background(consume(consumer))
    await clock.advance(5.0)
    assert sorted(seen) == sorted(b"v%d" % i for i in range(40))
    await producer.close()
