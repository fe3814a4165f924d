"""The Redis backend against a real redis-server: delivery, catch-up, outages, bad input."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from fanout_support import Flag, RedisServer, free_port, until

from purgatory_aio import Purgatory
from purgatory_aio.fanout import FanoutUnavailable, RedisFanout, ValueReached


async def parked(fa: RedisFanout, a: Purgatory, key: str) -> asyncio.Task[float | None]:
    """A wait in ``a`` for ``key`` to reach 1, returned once its operation is pending."""
    before = a.num_delayed
    task = asyncio.create_task(fa.wait_for_value(a, key, 1, 30))
    await until(lambda: a.num_delayed == before + 1)
    return task


async def test_advance_in_one_process_completes_a_wait_in_another(
    redis_server: RedisServer,
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b) as fb:
        waiting = await parked(fa, a, "job:1")
        fb.advance("job:1", 1)
        async with asyncio.timeout(5):  # far below the 30 s deadline
            assert await waiting == 1.0


async def test_check_and_cancel_reach_the_other_process(redis_server: RedisServer) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b) as fb:
        reached = ValueReached(fa, "j", 5, 30)
        await fa.watch_threshold(a, reached, "j", 5)
        a.advance_key("j", 4)  # below the threshold: recorded, nothing completes
        assert not reached.done()
        a.advance_key("j", 5)  # the condition holds here now, without a message
        await until(reached.done)
        declined = Flag(flags := set(), "j2", 30)
        await fa.watch(a, declined, ["j2"])
        flags.add("j2")  # the application's truth changed; a check tells every process
        fb.check("j2")
        await until(declined.done)
        other = ValueReached(fa, "x", 1, 30)
        await fa.watch_threshold(a, other, "x", 1)
        fb.cancel("x")
        await until(other.done)
        assert other.cancelled


async def test_advances_out_of_order_and_duplicated(redis_server: RedisServer) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b) as fb:
        ops = [ValueReached(fa, "hw", mark, 30) for mark in range(1, 21)]
        for op in ops:
            await fa.watch_threshold(a, op, "hw", op.threshold)
        for value in (5, 2, 5, 9, 1, 9, 3, 12, 12, 7):
            fb.advance("hw", value)
        await until(lambda: fa.value("hw") == 12.0)
        await asyncio.sleep(0.05)  # any late duplicate has arrived too
        assert [op.done() for op in ops] == [True] * 12 + [False] * 8
        fb.advance("hw", 20)
        await until(lambda: all(op.done() for op in ops))
        assert a.stats().completed == 20


async def test_a_message_lost_while_unsubscribed_is_caught_up(redis_server: RedisServer) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b):
        waiting = await parked(fa, a, "job:gap")
        admin = aioredis.from_url(redis_server.url)
        try:
            await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            # Published while a's subscription is cut: the message itself reaches nobody.
            await admin.eval(
                "redis.call('SET', KEYS[1], ARGV[1]) return 1", 1, "purgatory_aio:value:job:gap", 1
            )
        finally:
            await admin.aclose()
        async with asyncio.timeout(10):
            assert await waiting == 1.0
        assert fa.stats().resubscribes >= 1


async def test_redis_killed_mid_wait_operations_expire_at_their_deadlines(
    redis_server: RedisServer,
) -> None:
    a = Purgatory("a")
    async with a, RedisFanout(redis_server.url, a) as fa:
        waits = [asyncio.create_task(fa.wait_for_value(a, f"k{i}", 1, 0.3)) for i in range(5)]
        await until(lambda: a.num_delayed == 5)
        redis_server.kill()
        async with asyncio.timeout(5):
            assert await asyncio.gather(*waits) == [None] * 5
        fa.advance("k0", 1)  # publishing while down neither blocks nor raises
        await until(lambda: fa.stats().outages == 1)
        assert fa.stats().connected is False
        async with asyncio.timeout(5):
            await fa.stop()


async def test_an_ack_sent_while_redis_is_down_is_delivered_after_it_comes_back(
    redis_server: RedisServer,
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b) as fb:
        waiting = await parked(fa, a, "job:7")
        redis_server.kill()
        fb.advance("job:7", 1)
        await until(lambda: fb.stats().publish_failures >= 1)
        assert not waiting.done()
        redis_server.start()  # same port, empty: the queued ack is published on reconnection
        async with asyncio.timeout(15):
            assert await waiting == 1.0
        stats = fa.stats()
        assert stats.outages >= 1 and stats.recoveries >= 1 and stats.resubscribes >= 1
        # and the restarted Redis keeps working for new waits
        again = await parked(fa, a, "job:8")
        fb.advance("job:8", 1)
        async with asyncio.timeout(5):
            assert await again == 1.0


async def test_a_malformed_message_is_logged_and_skipped(redis_server: RedisServer) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b) as fb:
        admin = aioredis.from_url(redis_server.url)
        try:
            for junk in (b"hello", b"a|x|not-a-number|k", b"\xff\xfe", b"q|x||k"):
                await admin.publish(fa.channel, junk)
        finally:
            await admin.aclose()
        await until(lambda: fa.stats().malformed == 4)
        waiting = await parked(fa, a, "after")
        fb.advance("after", 1)
        async with asyncio.timeout(5):
            assert await waiting == 1.0


async def test_an_unreachable_url_is_one_clear_error_at_start() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    fanout = RedisFanout(url, connect_timeout=1)
    with pytest.raises(FanoutUnavailable, match=f"cannot reach Redis at {url}"):
        await fanout.start()
    assert fanout.stats().connected is False


async def test_bad_credentials_are_one_clear_error_without_the_password() -> None:
    with RedisServer(password="s3cret") as server:
        wrong = f"redis://:wrong@127.0.0.1:{server.port}/0"
        with pytest.raises(FanoutUnavailable, match="refused the user name or password") as caught:
            await RedisFanout(wrong).start()
        assert "wrong" not in str(caught.value)
        async with RedisFanout(server.url) as fanout:  # the right password works
            assert fanout.stats().connected


def test_url_comes_from_the_argument_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PURGATORY_AIO_REDIS_URL", raising=False)
    with pytest.raises(ValueError, match="PURGATORY_AIO_REDIS_URL"):
        RedisFanout()
    with pytest.raises(ValueError, match="not a Redis URL"):
        RedisFanout("http://127.0.0.1:6379")
    monkeypatch.setenv("PURGATORY_AIO_REDIS_URL", "redis://127.0.0.1:1/3")
    assert RedisFanout().url == "redis://127.0.0.1:1/3"
    with pytest.raises(ValueError, match="queue_size"):
        RedisFanout("redis://x", queue_size=0)


async def test_a_slow_periodic_resync_runs_as_the_safety_net(redis_server: RedisServer) -> None:
    a = Purgatory("a")
    async with a, RedisFanout(redis_server.url, a, resync_interval=0.05) as fa:
        await until(lambda: fa.stats().resyncs >= 3)


async def test_a_full_publish_queue_drops_and_counts_instead_of_blocking(
    redis_server: RedisServer,
) -> None:
    async with RedisFanout(redis_server.url, queue_size=2, subscribe=False) as fanout:
        redis_server.kill()
        fanout.advance("warm", 1)  # the publisher takes it and fails on the dead connection
        await until(lambda: fanout.stats().publish_failures >= 1)
        for i in range(5):
            fanout.check(f"k{i}")
        stats = fanout.stats()
        assert stats.publish_dropped == 3 and stats.queued == 3  # 2 queued + 1 being retried
        async with asyncio.timeout(5):
            await fanout.stop()
