"""Produce: acks=0, 1 and all, and when acks=all is refused."""

from __future__ import annotations

from minikafka import ACKS_ALL, ErrorCode, ProduceRequest
from mk_support import TP0, Background, MakeCluster, follower_fetch, record

from purgatory_aio.testing import ManualClock


async def test_acks_all_completes_only_after_every_in_sync_follower_fetched_past_the_offset(
    make_cluster: MakeCluster, clock: ManualClock, background: Background
) -> None:
    cluster = await make_cluster(replicate=False)
    produce = background(cluster.produce(ProduceRequest({TP0: [record()]}, acks=ACKS_ALL)))
    await clock.advance(0)
    assert not produce.done()

    # Follower 1 copies the record; the leader learns it has it from its next fetch offset.
    copied = await follower_fetch(cluster, broker=1, offset=0)
    assert len(copied.partitions[TP0].records) == 1
    await clock.advance(0)
    assert not produce.done()
    await follower_fetch(cluster, broker=1, offset=1)
    await clock.advance(0)
    assert not produce.done(), "follower 2 is in the ISR and has not fetched yet"

    await follower_fetch(cluster, broker=2, offset=1)
    await clock.advance(0)
    assert produce.done()
    result = produce.result().partitions[TP0]
    assert (result.error, result.base_offset) == (ErrorCode.NONE, 0)
    assert cluster.partition(TP0).high_watermark == 1


async def test_acks_1_completes_at_once_before_any_follower_has_the_record(
    make_cluster: MakeCluster,
) -> None:
    cluster = await make_cluster(replicate=False)
    response = await cluster.produce(ProduceRequest({TP0: [record(), record()]}, acks=1))
    assert response.partitions[TP0].error is ErrorCode.NONE
    assert response.partitions[TP0].base_offset == 0
    assert cluster.partition(TP0).high_watermark == 0
    assert cluster.purgatories["produce"].num_delayed == 0


async def test_acks_0_submit_never_responds(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(replicate=False)
    responses: list[object] = []
    await cluster.submit_produce(ProduceRequest({TP0: [record()]}, acks=0), responses.append)
    assert responses == []
    assert cluster.partition(TP0).log_end_offset == 1


async def test_acks_all_times_out_with_request_timed_out_while_a_follower_lags(
    make_cluster: MakeCluster, clock: ManualClock, background: Background
) -> None:
    cluster = await make_cluster(replicate=False)
    produce = background(
        cluster.produce(ProduceRequest({TP0: [record()]}, acks=ACKS_ALL, timeout=2.0))
    )
    await clock.advance(1.99)
    assert not produce.done()
    await clock.advance(0.02)
    result = produce.result().partitions[TP0]
    assert result.error is ErrorCode.REQUEST_TIMED_OUT
    assert result.base_offset == 0, "the record stays in the leader log"


async def test_acks_all_is_refused_with_not_enough_replicas_when_the_isr_is_below_min(
    make_cluster: MakeCluster,
) -> None:
    cluster = await make_cluster(replicate=False, min_insync_replicas=2)
    cluster.partition(TP0).isr = (0,)
    response = await cluster.produce(ProduceRequest({TP0: [record()]}, acks=ACKS_ALL))
    assert response.partitions[TP0].error is ErrorCode.NOT_ENOUGH_REPLICAS
    assert cluster.partition(TP0).log_end_offset == 0, "nothing is appended"


async def test_unknown_partition_and_bad_acks_are_reported_per_partition(
    make_cluster: MakeCluster,
) -> None:
    cluster = await make_cluster(replicate=False)
    missing = TP0._replace(partition=7)
    response = await cluster.produce(ProduceRequest({missing: [record()]}, acks=1))
    assert response.partitions[missing].error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    response = await cluster.produce(ProduceRequest({TP0: [record()]}, acks=2))
    assert response.partitions[TP0].error is ErrorCode.INVALID_REQUIRED_ACKS
