"""Fetch: long polls that return on min bytes or at max wait; delayed messages."""

from __future__ import annotations

from minikafka import RECORD_OVERHEAD, ErrorCode, FetchRequest, ProduceRequest
from mk_support import TP0, Background, MakeCluster, record

from purgatory_aio.testing import ManualClock

RECORD = 100
RECORD_BYTES = RECORD + RECORD_OVERHEAD


async def test_fetch_returns_as_soon_as_min_bytes_are_available(
    make_cluster: MakeCluster, clock: ManualClock, background: Background
) -> None:
    cluster = await make_cluster(replicas=1)
    fetch = background(
        cluster.fetch(FetchRequest({TP0: 0}, min_bytes=3 * RECORD_BYTES, max_wait=1.0))
    )
    await clock.advance(0.1)
    await cluster.produce(ProduceRequest({TP0: [record(RECORD)] * 2}, acks=1))
    await clock.advance(0)
    assert not fetch.done(), "two records are below min bytes"

    await cluster.produce(ProduceRequest({TP0: [record(RECORD)]}, acks=1))
    await clock.advance(0)
    assert fetch.done()
    assert clock.time() < 1.0
    assert len(fetch.result().partitions[TP0].records) == 3


async def test_fetch_returns_empty_handed_at_max_wait(
    make_cluster: MakeCluster, clock: ManualClock, background: Background
) -> None:
    cluster = await make_cluster(replicas=1)
    started = clock.time()
    fetch = background(cluster.fetch(FetchRequest({TP0: 0}, min_bytes=1, max_wait=0.5)))
    await clock.advance(0.499)
    assert not fetch.done()
    await clock.advance(0.002)
    assert fetch.done()
    result = fetch.result().partitions[TP0]
    assert (result.error, tuple(result.records)) == (ErrorCode.NONE, ())
    assert clock.time() - started >= 0.5


async def test_fetch_at_max_wait_returns_what_arrived_below_min_bytes(
    make_cluster: MakeCluster, clock: ManualClock, background: Background
) -> None:
    cluster = await make_cluster(replicas=1)
    fetch = background(cluster.fetch(FetchRequest({TP0: 0}, min_bytes=10_000, max_wait=0.5)))
    await clock.advance(0.1)
    await cluster.produce(ProduceRequest({TP0: [record(RECORD)]}, acks=1))
    await clock.advance(0.5)
    assert len(fetch.result().partitions[TP0].records) == 1


async def test_fetch_with_enough_data_is_answered_without_waiting(
    make_cluster: MakeCluster,
) -> None:
    cluster = await make_cluster(replicas=1)
    await cluster.produce(ProduceRequest({TP0: [record(RECORD)] * 4}, acks=1))
    response = await cluster.fetch(FetchRequest({TP0: 1}, min_bytes=RECORD_BYTES, max_wait=5.0))
    assert len(response.partitions[TP0].records) == 3
    assert cluster.purgatories["fetch"].num_delayed == 0


async def test_fetch_respects_max_bytes_but_returns_at_least_one_record(
    make_cluster: MakeCluster,
) -> None:
    cluster = await make_cluster(replicas=1)
    await cluster.produce(ProduceRequest({TP0: [record(RECORD)] * 4}, acks=1))
    two = await cluster.fetch(FetchRequest({TP0: 0}, max_wait=0.0, max_bytes=2 * RECORD_BYTES))
    assert len(two.partitions[TP0].records) == 2
    one = await cluster.fetch(FetchRequest({TP0: 0}, max_wait=0.0, max_bytes=1))
    assert len(one.partitions[TP0].records) == 1


async def test_fetch_beyond_the_log_end_is_out_of_range(make_cluster: MakeCluster) -> None:
    cluster = await make_cluster(replicas=1)
    response = await cluster.fetch(FetchRequest({TP0: 5}, max_wait=1.0))
    assert response.partitions[TP0].error is ErrorCode.OFFSET_OUT_OF_RANGE


async def test_a_delayed_message_is_invisible_before_it_is_due(
    make_cluster: MakeCluster, clock: ManualClock, background: Background
) -> None:
    cluster = await make_cluster(replicas=1)
    due = clock.time() + 5.0
    response = await cluster.produce(ProduceRequest({TP0: [record(delay=5.0)]}, acks=1))
    assert response.partitions[TP0].scheduled == 1
    assert response.partitions[TP0].base_offset == -1

    early = background(cluster.fetch(FetchRequest({TP0: 0}, max_wait=1.0)))
    await clock.advance(1.01)
    assert tuple(early.result().partitions[TP0].records) == ()
    assert cluster.partition(TP0).log_end_offset == 0

    await clock.advance_to(due - 0.1)
    waiting = background(cluster.fetch(FetchRequest({TP0: 0}, max_wait=1.0)))
    await clock.advance(0.099)
    assert not waiting.done()
    await clock.advance(0.003)  # the timer fires within one tick after the due time
    assert waiting.done()
    assert clock.time() >= due
    records = waiting.result().partitions[TP0].records
    assert [r.delay for r in records] == [5.0]


async def test_delayed_and_immediate_records_of_one_request_are_split(
    make_cluster: MakeCluster, clock: ManualClock
) -> None:
    cluster = await make_cluster(replicas=1)
    batch = [record(10), record(20, delay=2.0), record(30)]
    response = await cluster.produce(ProduceRequest({TP0: batch}, acks=1))
    assert (response.partitions[TP0].base_offset, response.partitions[TP0].scheduled) == (0, 1)
    assert [len(r.value) for r in cluster.partition(TP0).log] == [10, 30]
    await clock.advance(2.01)
    assert [len(r.value) for r in cluster.partition(TP0).log] == [10, 30, 20]
