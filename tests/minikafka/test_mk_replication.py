"""Replication: the high watermark, the ISR, and what a dead follower does to acks=all."""

from __future__ import annotations

from minikafka import ACKS_ALL, Cluster, ErrorCode, FetchRequest, ProduceRequest
from mk_support import TP0, Background, Drive, MakeCluster, follower_fetch, record

from purgatory_aio.testing import ManualClock

LAG_MAX = 10.0


def stall_broker(cluster: Cluster, broker: int) -> None:
    for fetcher in cluster.fetchers:
        if fetcher.broker_id == broker:
            fetcher.stall()


def resume_broker(cluster: Cluster, broker: int) -> None:
    for fetcher in cluster.fetchers:
        if fetcher.broker_id == broker:
            fetcher.resume()


async def produce_all(cluster: Cluster, wait: float = 2.0) -> ErrorCode:
    request = ProduceRequest({TP0: [record()]}, acks=ACKS_ALL, timeout=wait)
    return (await cluster.produce(request)).partitions[TP0].error


async def test_high_watermark_is_the_smallest_log_end_among_the_isr(
    make_cluster: MakeCluster,
) -> None:
    cluster = await make_cluster(replicate=False)
    await cluster.produce(ProduceRequest({TP0: [record(), record(), record()]}, acks=1))
    await follower_fetch(cluster, broker=1, offset=3)
    await follower_fetch(cluster, broker=2, offset=1)
    assert cluster.partition(TP0).high_watermark == 1


async def test_consumers_read_only_up_to_the_high_watermark(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(replicate=False)
    await cluster.produce(ProduceRequest({TP0: [record(), record()]}, acks=1))
    await follower_fetch(cluster, broker=1, offset=2)
    await follower_fetch(cluster, broker=2, offset=1)
    response = await cluster.fetch(FetchRequest({TP0: 0}, max_wait=0.0))
    assert len(response.partitions[TP0].records) == 1
    assert response.partitions[TP0].high_watermark == 1


async def test_followers_replicate_by_themselves_and_acks_all_succeeds(
    make_cluster: MakeCluster, drive: Drive
) -> None:
    cluster = await make_cluster()
    assert await drive(produce_all(cluster)) is ErrorCode.NONE
    assert cluster.partition(TP0).isr == (0, 1, 2)


async def test_dead_follower_times_out_acks_all_until_it_leaves_the_isr(
    make_cluster: MakeCluster, clock: ManualClock, drive: Drive
) -> None:
    cluster = await make_cluster(replica_lag_time_max=LAG_MAX, min_insync_replicas=2)
    stall_broker(cluster, 2)
    assert await drive(produce_all(cluster)) is ErrorCode.REQUEST_TIMED_OUT
    assert 2 in cluster.partition(TP0).isr

    # The periodic ISR check (every LAG_MAX / 2) drops it once it has lagged LAG_MAX.
    await clock.advance(1.5 * LAG_MAX)
    assert cluster.partition(TP0).isr == (0, 1)
    shrinks = [c for c in cluster.replicas.isr_changes if c.kind == "shrink"]
    assert [(c.tp, c.broker) for c in shrinks] == [(TP0, 2)]

    assert await drive(produce_all(cluster)) is ErrorCode.NONE


async def test_waiting_acks_all_completes_as_soon_as_the_lagging_follower_is_dropped(
    make_cluster: MakeCluster, clock: ManualClock, background: Background
) -> None:
    cluster = await make_cluster(replica_lag_time_max=LAG_MAX, min_insync_replicas=2)
    stall_broker(cluster, 2)
    produce = background(produce_all(cluster, wait=3 * LAG_MAX))
    await clock.advance(LAG_MAX / 2)
    assert not produce.done()
    await clock.advance(LAG_MAX)
    assert produce.done()
    assert produce.result() is ErrorCode.NONE


async def test_below_min_insync_acks_all_gets_not_enough_replicas(
    make_cluster: MakeCluster, clock: ManualClock, drive: Drive
) -> None:
    cluster = await make_cluster(replica_lag_time_max=LAG_MAX, min_insync_replicas=2)
    stall_broker(cluster, 1)
    stall_broker(cluster, 2)
    await clock.advance(1.5 * LAG_MAX)
    assert cluster.partition(TP0).isr == (0,)
    assert await drive(produce_all(cluster)) is ErrorCode.NOT_ENOUGH_REPLICAS
    response = await cluster.produce(ProduceRequest({TP0: [record()]}, acks=1))
    assert response.partitions[TP0].error is ErrorCode.NONE, "acks=1 does not need the ISR"


async def test_a_follower_that_catches_up_rejoins_the_isr(
    make_cluster: MakeCluster, clock: ManualClock, drive: Drive
) -> None:
    cluster = await make_cluster(replica_lag_time_max=LAG_MAX)
    stall_broker(cluster, 2)
    await cluster.produce(ProduceRequest({TP0: [record()] * 5}, acks=1))
    await clock.advance(1.5 * LAG_MAX)
    assert 2 not in cluster.partition(TP0).isr

    resume_broker(cluster, 2)
    await clock.advance(1.0)
    assert cluster.partition(TP0).isr == (0, 1, 2)
    assert [c.kind for c in cluster.replicas.isr_changes] == ["shrink", "expand"]
    assert await drive(produce_all(cluster)) is ErrorCode.NONE
