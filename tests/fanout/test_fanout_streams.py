"""Streams of a key's values (``Fanout.stream``): each new maximum once, none missed, and
every way a stream ends releasing what it watched; under every engine, and through an
engine killed and restarted while values flow."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from engines import Engine, postgres_engine, redis_engine
from fanout_support import RedisServer, until
from pg_support import PostgresServer

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
        ({"key": "k", "timeout": True}, ValueError, "timeout"),
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


async def stream_through_an_outage(
    engine: Engine, kill: Any, restart: Any, key: str = "progress"
) -> None:
    """One member streams ``key`` while another advances it 1, 2, ...; the engine is killed
    and restarted in the middle. What the stream yields is strictly increasing, and it ends
    on the highest value the engine stored."""
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, engine.make(a) as fa, engine.make(b) as fb:
        seen: list[float] = []
        stream = fa.stream(a, key, timeout=120)
        consumer = asyncio.create_task(collect(stream, seen))
        await until(lambda: streaming(a))
        stored = 0
        for value in range(1, 41):
            if value == 15:
                await until(lambda: bool(seen) and seen[-1] == 14.0)  # mid-stream
                kill()
            if value == 18:
                restart()
            try:
                await fb.advance_confirmed(key, value, timeout=0.3 if 15 <= value < 18 else 10)
            except FanoutUnavailable:
                assert 15 <= value < 18  # only while the engine is down
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
        assert fa.stats().outages >= 1 and fa.stats().recoveries >= 1


async def test_a_stream_survives_redis_killed_and_restarted(redis_server: RedisServer) -> None:
    await stream_through_an_outage(
        redis_engine(redis_server), redis_server.kill, redis_server.start
    )


async def test_a_stream_survives_postgres_killed_and_restarted(postgres: PostgresServer) -> None:
    await stream_through_an_outage(postgres_engine(postgres), postgres.kill, postgres.start)


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
