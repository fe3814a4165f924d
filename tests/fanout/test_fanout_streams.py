"""Streams of a key's values (``Fanout.stream``): each new maximum once, none missed, and
every way a stream ends releasing what it watched; under every engine, through an engine
killed and restarted while values flow, and through each production topology failing over
(a Sentinel master, a Cluster master, a PostgreSQL primary)."""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis
from cluster_support import Cluster
from engines import (
    Engine,
    cluster_engine,
    postgres_engine,
    redis_engine,
    sentinel_engine,
    standby_engine,
)
from fanout_support import RedisServer, until
from pg_support import PostgresServer, ReplicatedPair
from sentinel_support import Sentinels

from purgatory_aio import Purgatory
from purgatory_aio.fanout import Fanout, FanoutUnavailable, MemoryFanout, MemoryHub, ValueStream
from purgatory_aio.testing import ManualClock

# Far above any delivery here: a wait that needs it has hung.
PATIENCE = 10.0


def streaming(purgatory: Purgatory, streams: int = 1) -> bool:
    """Each stream holds two operations while it waits: one keeping its key watched for its
    whole life, one waiting for the next value."""
    return purgatory.num_delayed == 2 * streams


def released(purgatory: Purgatory) -> bool:
    """Nothing of a stream is left: no operation pending in the purgatory."""
    return purgatory.num_delayed == 0 and purgatory.stats().pending == 0


async def collect(stream: ValueStream, into: list[float]) -> None:
    async with stream as values:
        async for value in values:
            into.append(value)


async def test_each_new_maximum_comes_out_once_in_order() -> None:
    hub = MemoryHub()
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, MemoryFanout(hub, a) as fa, MemoryFanout(hub, b) as fb:
        await fb.advance_confirmed("job", 1)
        seen: list[float] = []
        consumer = asyncio.create_task(collect(fa.stream(a, "job", timeout=60), seen))
        await until(lambda: seen == [1.0])  # the current value first
        for value in (1, 0.5, 2, 2, 1.5, 3):  # replays, duplicates and lower values
            fb.advance("job", value)
        await until(lambda: seen[-1] == 3.0)
        assert seen == sorted(set(seen)) and seen[0] == 1.0 and 3.0 in seen
        assert set(seen) <= {1.0, 2.0, 3.0}
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        assert released(a)


async def test_a_value_advanced_while_the_consumer_is_busy_comes_out_next() -> None:
    a = Purgatory("a")
    async with a, MemoryFanout(None, a) as fanout:
        fanout.advance("k", 1)
        seen: list[float] = []
        async with fanout.stream(a, "k", timeout=60, after=0) as values:
            async for value in values:
                seen.append(value)
                if value == 1:
                    # The body is slow: several advances land before the next iteration.
                    fanout.advance("k", 2)
                    fanout.advance("k", 5)
                    await asyncio.sleep(0)
                    fanout.advance("k", 4)
                    continue
                break
        assert seen == [1.0, 5.0]
        assert values.ended == "closed" and released(a)


async def test_after_skips_the_values_already_seen() -> None:
    a = Purgatory("a")
    async with a, MemoryFanout(None, a) as fanout:
        fanout.advance("k", 7)
        async with fanout.stream(a, "k", timeout=60, after=7) as values:
            first = asyncio.create_task(anext(values))
            await until(lambda: streaming(a))
            assert not first.done()
            fanout.advance("k", 7.5)
            async with asyncio.timeout(PATIENCE):
                assert await first == 7.5
            assert values.last == 7.5


async def test_the_deadline_ends_the_stream_in_virtual_time() -> None:
    clock = ManualClock()
    a = Purgatory("a", clock=clock)
    async with a, MemoryFanout(None, a) as fanout:
        seen: list[float] = []
        stream = fanout.stream(a, "k", timeout=30)
        consumer = asyncio.create_task(collect(stream, seen))
        await until(lambda: streaming(a))
        fanout.advance("k", 1)
        await until(lambda: seen == [1.0])
        await clock.advance(29.999)
        assert not consumer.done()
        fanout.advance("k", 2)  # still before the deadline
        await until(lambda: seen == [1.0, 2.0])
        await clock.advance(0.002)
        async with asyncio.timeout(PATIENCE):
            await consumer
        assert stream.ended == "deadline" and seen == [1.0, 2.0]
        assert released(a)
        # Ended, it stays ended.
        with pytest.raises(StopAsyncIteration):
            await anext(stream)


async def test_cancelling_the_key_ends_the_stream() -> None:
    hub = MemoryHub()
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, MemoryFanout(hub, a) as fa, MemoryFanout(hub, b) as fb:
        seen: list[float] = []
        stream = fa.stream(a, "k", timeout=60)
        consumer = asyncio.create_task(collect(stream, seen))
        await until(lambda: streaming(a))
        fb.cancel("k")  # from another member
        async with asyncio.timeout(PATIENCE):
            await consumer
        assert stream.ended == "cancelled" and seen == [] and released(a)


async def test_a_shutdown_ends_the_stream() -> None:
    a = Purgatory("a")
    async with MemoryFanout(None, a) as fanout:
        await a.__aenter__()
        stream = fanout.stream(a, "k", timeout=60)
        consumer = asyncio.create_task(collect(stream, []))
        await until(lambda: streaming(a))
        await a.shutdown()
        async with asyncio.timeout(PATIENCE):
            await consumer
        assert stream.ended == "shutdown"
        # A stream started on a purgatory already shut down ends at once.
        late = fanout.stream(a, "k", timeout=60)
        with pytest.raises(StopAsyncIteration):
            await anext(late)
        assert late.ended == "shutdown"


async def test_cancelling_the_consumer_withdraws_its_operation() -> None:
    a = Purgatory("a")
    async with a, MemoryFanout(None, a) as fanout:
        stream = fanout.stream(a, "k", timeout=60)
        consumer = asyncio.create_task(collect(stream, []))
        await until(lambda: streaming(a))
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        assert released(a) and stream.ended == "closed"
        assert a.stats().completed == 0


async def test_closing_between_iterations_releases_the_operation_watched_ahead() -> None:
    a = Purgatory("a")
    async with a, MemoryFanout(None, a) as fanout:
        fanout.advance("k", 1)
        stream = fanout.stream(a, "k", timeout=60)
        assert await anext(stream) == 1.0
        assert streaming(a)  # the next value is already watched for
        await stream.aclose()
        await stream.aclose()  # idempotent
        assert released(a) and stream.ended == "closed"
        with pytest.raises(StopAsyncIteration):
            await anext(stream)
        # An async generator around it, left by the client, releases it the same way.

        async def events() -> Any:
            async with fanout.stream(a, "k", timeout=60) as values:
                async for value in values:
                    yield value

        generator = events()
        assert await anext(generator) == 1.0
        await generator.aclose()
        assert released(a)


async def test_many_streams_of_one_key_each_see_every_maximum() -> None:
    hub = MemoryHub()
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, MemoryFanout(hub, a) as fa, MemoryFanout(hub, b) as fb:
        seen: list[list[float]] = [[] for _ in range(20)]
        consumers = [
            asyncio.create_task(collect(fa.stream(a, "k", timeout=60), into)) for into in seen
        ]
        await until(lambda: streaming(a, 20))
        for value in range(1, 51):
            fb.advance("k", value)
            if value % 7 == 0:
                await asyncio.sleep(0)
        await until(lambda: all(into and into[-1] == 50.0 for into in seen))
        for into in seen:
            assert into == sorted(set(into))
        for consumer in consumers:
            consumer.cancel()
        await asyncio.gather(*consumers, return_exceptions=True)
        assert released(a)


@pytest.mark.parametrize(
    ("arguments", "error", "says"),
    [
        ({"key": "", "timeout": 1}, TypeError, "non-empty str"),
        ({"key": 7, "timeout": 1}, TypeError, "non-empty str"),
        ({"key": "k", "timeout": 0}, ValueError, "timeout"),
        ({"key": "k", "timeout": float("nan")}, ValueError, "timeout"),
        ({"key": "k", "timeout": True}, TypeError, "timeout"),
        ({"key": "k", "timeout": 1, "after": float("inf")}, ValueError, "after"),
        ({"key": "k", "timeout": 1, "after": "1"}, TypeError, "after"),
    ],
)
async def test_bad_input_is_refused_before_anything_is_attached(
    arguments: dict[str, Any], error: type[Exception], says: str
) -> None:
    a = Purgatory("a")
    fanout = MemoryFanout()
    with pytest.raises(error, match=says):
        fanout.stream(a, **arguments)
    assert fanout.purgatories == ()
    with pytest.raises(TypeError, match="Purgatory"):
        fanout.stream("a", "k", timeout=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Fanout"):
        ValueStream(object(), a, "k", timeout=1)  # type: ignore[arg-type]


async def test_a_value_that_cannot_rise_further_ends_the_stream() -> None:
    a = Purgatory("a")
    async with a, MemoryFanout(None, a) as fanout:
        fanout.advance("k", sys.float_info.max)
        async with fanout.stream(a, "k", timeout=60) as values:
            assert [value async for value in values] == [sys.float_info.max]
        assert values.ended == "exhausted" and released(a)


async def test_streams_run_on_every_engine(engine: Engine) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, engine.make(a) as fa, engine.make(b) as fb:
        await fb.advance_confirmed("s", 1, timeout=PATIENCE)
        seen: list[float] = []
        consumer = asyncio.create_task(collect(fa.stream(a, "s", timeout=60), seen))
        await until(lambda: seen == [1.0])  # read from the engine's store
        for value in range(2, 21):
            fb.advance("s", value)
        await until(lambda: bool(seen) and seen[-1] == 20.0)
        assert seen == sorted(set(seen))
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        assert released(a)


# -- the engine killed and restarted while values flow -------------------------------------------


async def stream_through_faults(
    engine: Engine,
    faults: dict[int, Callable[[], Awaitable[object]]],
    *,
    down: range = range(0),
    key: str = "progress",
) -> None:
    """One member streams ``key`` while another advances it 1, 2, ..., 40 (each stored
    before the next); ``faults[v]`` hits the engine just before value ``v``, and advances
    may fail only while it is ``down``. What the stream yields is strictly increasing, and
    it ends on the highest value the engine stored."""
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, engine.make(a) as fa, engine.make(b) as fb:
        seen: list[float] = []
        stream = fa.stream(a, key, timeout=120)
        consumer = asyncio.create_task(collect(stream, seen))
        await until(lambda: streaming(a))
        stored = 0
        for value in range(1, 41):
            fault = faults.get(value)
            if fault is not None:
                await until(lambda mark=stored: bool(seen) and seen[-1] == mark)  # mid-stream
                await fault()
            try:
                await fb.advance_confirmed(key, value, timeout=0.3 if value in down else 10)
            except FanoutUnavailable:
                assert value in down  # only while the engine is down
                continue
            stored = value
            if value % 5 == 0:
                await asyncio.sleep(0.01)  # a slow producer, now and then
        assert stored == 40
        assert await engine.stored(key) == 40.0
        async with asyncio.timeout(PATIENCE):
            await until(lambda: bool(seen) and seen[-1] == 40.0)
        assert seen == sorted(set(seen)), "a value came out twice or out of order"
        assert stream.ended is None
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        assert released(a)
        assert fa.stats().outages + fa.stats().resubscribes >= 1


def run(action: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    async def run_it() -> object:
        return action()

    return run_it


async def test_a_stream_survives_redis_killed_and_restarted(redis_server: RedisServer) -> None:
    faults = {15: run(redis_server.kill), 18: run(redis_server.start)}
    await stream_through_faults(redis_engine(redis_server), faults, down=range(15, 18))


async def test_a_stream_survives_postgres_killed_and_restarted(postgres: PostgresServer) -> None:
    faults = {15: run(postgres.kill), 18: run(postgres.start)}
    await stream_through_faults(postgres_engine(postgres), faults, down=range(15, 18))


async def test_a_stream_survives_its_redis_connections_cut(redis_server: RedisServer) -> None:
    async def cut() -> None:
        admin = aioredis.from_url(redis_server.url)
        try:
            for kind in ("pubsub", "normal"):
                await admin.execute_command("CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes")
        finally:
            await admin.aclose()

    await stream_through_faults(redis_engine(redis_server), {10: cut, 20: cut, 30: cut})


async def test_a_stream_survives_its_postgres_connections_cut(postgres: PostgresServer) -> None:
    async def cut() -> None:
        admin = await asyncpg.connect(postgres.url, timeout=10)
        try:
            await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
        finally:
            await admin.close()

    await stream_through_faults(postgres_engine(postgres), {10: cut, 20: cut, 30: cut})


# -- a production topology failing over while values flow ----------------------------------------


def in_thread(action: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    async def run_it() -> object:
        return await asyncio.to_thread(action)

    return run_it


async def test_a_stream_survives_a_sentinel_failover(sentinels: Sentinels) -> None:
    """The master killed: the sentinels promote its replica, the stream goes on there."""
    master = sentinels.master()
    faults = {
        15: run(master.kill),
        18: in_thread(lambda: sentinels.wait_new_master(master)),
    }
    await stream_through_faults(sentinel_engine(sentinels), faults, down=range(15, 18))


async def test_a_stream_survives_its_cluster_master_killed(cluster: Cluster) -> None:
    """The master that holds the key, and the subscription, killed: its replica takes over
    the key's slot, the subscription moves to another node, the stream goes on."""
    key = "{stream}progress"  # a hash tag: the slot is the same whatever the prefix
    master = cluster.master_of(key)
    faults = {15: run(master.kill), 18: in_thread(lambda: cluster.wait_promoted(master, key))}
    engine = cluster_engine(cluster, first=master)
    await stream_through_faults(engine, faults, down=range(15, 18), key=key)


async def test_a_stream_survives_a_standby_promoted(replicated: ReplicatedPair) -> None:
    """The primary killed once the standby has every value so far, then the standby promoted
    (what asynchronous replication may lose is tested in test_fanout_postgres_lag.py)."""

    def lose_primary() -> None:
        replicated.caught_up()
        replicated.lose_primary()

    faults = {15: in_thread(lose_primary), 18: in_thread(replicated.promote)}
    await stream_through_faults(standby_engine(replicated), faults, down=range(15, 18))


def test_fanout_stream_is_a_value_stream() -> None:
    fanout: Fanout = MemoryFanout()
    stream = fanout.stream(Purgatory("a"), "k", timeout=1)
    assert isinstance(stream, ValueStream) and stream.ended is None and stream.last is None
    assert "open" in repr(stream)


async def test_a_cancel_or_a_shutdown_while_the_consumer_is_busy_ends_the_stream_next() -> None:
    a = Purgatory("a")
    async with a, MemoryFanout(None, a) as fanout:
        fanout.advance("k", 1)
        async with fanout.stream(a, "k", timeout=60) as values:
            async for _value in values:
                fanout.cancel("k")  # while the body runs: the next iteration stops
        assert values.ended == "cancelled" and released(a)
        async with fanout.stream(a, "k", timeout=60, after=0) as values:
            fanout.advance("k", 2)
            async for _value in values:
                await a.shutdown()
        assert values.ended == "shutdown" and released(a)


async def test_closed_streams_leave_no_more_than_the_purgatory_purges() -> None:
    # A closed stream's two operations are withdrawn at once; their watch entries go the
    # purgatory's lazy way (the next walk of the key, or a purge), bounded by purge_interval.
    a = Purgatory("a", purge_interval=10)
    async with a, MemoryFanout(None, a) as fanout:
        most = 0
        for i in range(200):
            key = f"k{i % 7}"
            async with fanout.stream(a, key, timeout=60) as values:
                fanout.advance(key, i + 1)
                assert await anext(values) == i + 1
            assert released(a)
            most = max(most, a.watched)
        assert most <= 10 and a.stats().purged > 0
        assert a.stats().cancelled == 400 and a.stats().completed == 200


@pytest.mark.parametrize("seed", range(8))
async def test_random_schedules_yield_each_maximum_once_in_order(seed: int) -> None:
    """Advances from both members, repeated, lower, in bursts; a consumer whose body takes a
    varying number of loop passes: what comes out only rises, and ends on the maximum."""
    rng = random.Random(seed)
    hub = MemoryHub()
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, MemoryFanout(hub, a) as fa, MemoryFanout(hub, b) as fb:
        sent = [float(rng.randrange(60)) for _ in range(80)]
        top = max(sent)
        seen: list[float] = []

        async def consume() -> None:
            async with fa.stream(a, "k", timeout=60) as values:
                async for value in values:
                    seen.append(value)
                    for _ in range(rng.randrange(4)):
                        await asyncio.sleep(0)  # a slow body, now and then
                    if value >= top:
                        return

        consumer = asyncio.create_task(consume())
        await until(lambda: streaming(a))
        for value in sent:
            rng.choice((fa, fb)).advance("k", value)
            if rng.random() < 0.3:
                await asyncio.sleep(0)
        async with asyncio.timeout(PATIENCE):
            await consumer
        assert seen == sorted(set(seen)) and seen[-1] == top
        assert set(seen) <= set(sent)
        assert released(a)
