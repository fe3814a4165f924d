"""The fan-out under attack, against a real redis-server: what a caller or Redis throws at it.

Invariants, as in the core: bad input is refused at the call and changes nothing;
nothing a caller publishes kills or wedges the publisher or the subscriber; every
wait ends by its own deadline whatever Redis does; stop() returns within its
bound; what could not be delivered is counted; nothing confirmed is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis
from fanout_support import Flag, RedisServer, until

from purgatory_aio import Purgatory
from purgatory_aio.fanout import (
    ABANDON_AFTER,
    BackendHost,
    Event,
    Fanout,
    FanoutUnavailable,
    MemoryFanout,
    MemoryHub,
    RedisFanout,
    ValueReached,
    fanout_from_url,
)
from purgatory_aio.fanout._memory import MemoryBackend

PREFIX = "purgatory_aio:value:"


@pytest.fixture
async def admin(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def frozen(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The server, to be frozen with ``freeze()``; thawed at the end whatever happens."""
    yield redis_server
    thaw(redis_server)


def freeze(server: RedisServer) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)


def thaw(server: RedisServer) -> None:
    if server.proc is not None and server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)


# -- refused at the call, nothing changed --------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda f, p: f.advance("\udc80", 1), ValueError),
        (lambda f, p: f.check("job\ud800"), ValueError),
        (lambda f, p: f.cancel("\udfff"), ValueError),
        (lambda f, p: f.advance("k", 10**400), ValueError),
        (lambda f, p: f.advance("k", float("inf")), ValueError),
        (lambda f, p: f.advance("k", "1"), TypeError),
        (lambda f, p: f.advance(b"k", 1), TypeError),
        (lambda f, p: ValueReached(f, "\udc80", 1, 5), ValueError),
        (lambda f, p: ValueReached(f, "k", 10**400, 5), ValueError),
    ],
)
async def test_what_cannot_travel_is_refused_before_anything_changes(
    redis_server: RedisServer, call: Any, error: type[Exception]
) -> None:
    async with Purgatory("a") as a, RedisFanout(redis_server.url, a) as fanout:
        op = ValueReached(fanout, "k", 1, 30)
        await fanout.watch_threshold(a, op, "k", 1)
        with pytest.raises(error):
            call(fanout, a)
        stats = fanout.stats()
        assert stats.queued == 0 and stats.publish_dropped == 0 and not op.done()
        fanout.advance("k", 1)  # and the fan-out works on
        await until(lambda: fanout.stats().published == 1)
        assert op.result() == 1.0


async def test_a_str_where_keys_are_expected_is_refused_as_the_purgatory_refuses_it() -> None:
    async with Purgatory("a") as a, MemoryFanout(None, a) as fanout:
        op = Flag(set(), "job:42", 5)
        with pytest.raises(TypeError, match="not the single key 'job:42'"):
            await fanout.watch(a, op, "job:42")
        with pytest.raises(ValueError, match="not valid text"):
            await fanout.watch(a, op, ["ok", "\udc80"])
        assert a.watched_keys() == [] and a.num_delayed == 0
        assert not await fanout.watch(a, op, ["job:42"])  # the same operation, still usable


async def test_a_confirmed_advance_with_bad_input_raises_before_anything_is_queued(
    redis_server: RedisServer,
) -> None:
    async with RedisFanout(redis_server.url, subscribe=False) as fanout:
        with pytest.raises(ValueError):
            await fanout.advance_confirmed("\udc80", 1)
        with pytest.raises(ValueError):
            await fanout.advance_confirmed("k", 10**400)
        with pytest.raises(ValueError, match="timeout"):
            await fanout.advance_confirmed("k", 1, timeout=0)
        assert fanout.stats().queued == 0 and fanout.stats().published == 0


# -- what only Redis can refuse: logged, counted, the publisher goes on --------------------------


async def test_foreign_values_under_the_prefix_fail_their_events_alone(
    redis_server: RedisServer, admin: aioredis.Redis
) -> None:
    await admin.set(PREFIX + "text", "not a number")
    await admin.hset(PREFIX + "hash", "field", "1")
    await admin.rpush(PREFIX + "list", "1")
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b) as fb:
        waiting = asyncio.create_task(fa.wait_for_value(a, "ok", 1, 30))
        await until(lambda: a.num_delayed == 1)
        for key in ("text", "hash", "list", "ok"):
            fb.advance(key, 1)
        async with asyncio.timeout(5):
            assert await waiting == 1.0
        await until(lambda: fb.stats().publish_errors == 3)
        assert fb.stats().published == 1
        with pytest.raises(FanoutUnavailable, match="refused the event on 'hash'"):
            await fb.advance_confirmed("hash", 2)
        await fb.advance_confirmed("ok", 2)  # the publisher is alive
        assert float(await admin.get(PREFIX + "ok")) == 2.0


async def test_a_foreign_stored_value_is_counted_and_the_wait_ends_at_its_deadline(
    redis_server: RedisServer, admin: aioredis.Redis
) -> None:
    await admin.set(PREFIX + "junk", "nan")
    await admin.set(PREFIX + "text", "hello")
    async with Purgatory("a") as a, RedisFanout(redis_server.url, a) as fa:
        results = await asyncio.gather(
            fa.wait_for_value(a, "junk", 1, 0.2), fa.wait_for_value(a, "text", 1, 0.2)
        )
        assert results == [None, None]
        assert fa.stats().malformed >= 2  # once per read of each


async def test_a_subscriber_survives_whatever_is_published_on_its_channel(
    redis_server: RedisServer, admin: aioredis.Redis
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b) as fb:
        junk = [
            b"",
            b"a|x|1e999|k",
            b"a|x|1|",
            b"x|x||\xff",
            b"c" * 100_000,
            "a|x|1|\u2603".encode(),
        ]
        for message in junk:
            await admin.publish(fa.channel, message)
        await until(lambda: fa.stats().received >= len(junk))
        waiting = asyncio.create_task(fa.wait_for_value(a, "after", 1, 30))
        await until(lambda: a.num_delayed == 1)
        fb.advance("after", 1)
        async with asyncio.timeout(5):
            assert await waiting == 1.0


# -- stop() within its bound ---------------------------------------------------------------------


async def test_stop_returns_within_its_bound_while_a_batch_is_in_flight(
    redis_server: RedisServer, loop_errors: list[dict[str, Any]]
) -> None:
    fanout = RedisFanout(redis_server.url, subscribe=False)
    await fanout.start()
    for i in range(100):
        fanout.advance(f"k{i}", i)
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(5):  # the hang guard; the bound is checked below
        await fanout.stop(flush_timeout=0.5)
    assert loop.time() - started < 0.5 + 2 * ABANDON_AFTER + 0.5
    stats = fanout.stats()
    assert stats.published + stats.undelivered == 100
    fanout.advance("after", 1)  # dropped and counted, never queued
    assert fanout.stats().publish_dropped == 1 and fanout.stats().queued == 0
    await asyncio.sleep(0.05)
    assert loop_errors == []


async def test_a_publish_storm_across_stop_loses_nothing_uncounted(
    redis_server: RedisServer, admin: aioredis.Redis, loop_errors: list[dict[str, Any]]
) -> None:
    fanout = RedisFanout(redis_server.url, subscribe=False, batch=64)
    await fanout.start()
    sent = 0
    confirmed: list[asyncio.Task[int]] = []

    async def storm() -> None:
        nonlocal sent
        for i in range(20_000):
            fanout.advance(f"storm:{i % 500}", i)
            sent += 1
            if i % 1000 == 0:
                confirmed.append(asyncio.create_task(fanout.advance_confirmed(f"c{i}", 1)))
            if i % 200 == 0:
                await asyncio.sleep(0)

    task = asyncio.create_task(storm())
    await asyncio.sleep(0.01)
    async with asyncio.timeout(5):
        await fanout.stop(flush_timeout=0.2)
        await task
    stats = fanout.stats()
    assert stats.published + stats.undelivered + stats.publish_dropped == sent + len(confirmed)
    outcomes = await asyncio.gather(*confirmed, return_exceptions=True)
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, BaseException):
            assert isinstance(outcome, FanoutUnavailable)
        else:  # confirmed: it is in Redis
            assert await admin.get(f"{PREFIX}c{i * 1000}") == b"1.0"
    await asyncio.sleep(0.05)
    assert loop_errors == []


# -- a frozen Redis (SIGSTOP) --------------------------------------------------------------------


async def test_waits_keep_their_deadlines_while_redis_is_frozen(
    frozen: RedisServer, loop_errors: list[dict[str, Any]]
) -> None:
    a = Purgatory("a")
    async with a, RedisFanout(frozen.url, a, connect_timeout=2) as fa:
        freeze(frozen)
        loop = asyncio.get_running_loop()
        started = loop.time()
        results = await asyncio.gather(*(fa.wait_for_value(a, f"f{i}", 1, 0.2) for i in range(50)))
        elapsed = loop.time() - started
        assert results == [None] * 50
        assert elapsed < 1.0  # the 0.2 s deadline, not the 2 s connect timeout
        with pytest.raises(FanoutUnavailable, match="not stored"):
            await fa.advance_confirmed("f0", 1, timeout=0.2)
        thaw(frozen)
        # after the thaw everything flows again, the unconfirmed advance included
        waiting = asyncio.create_task(fa.wait_for_value(a, "f0", 1, 10))
        async with asyncio.timeout(8):
            assert await waiting == 1.0
    await asyncio.sleep(0.05)
    assert loop_errors == []


async def test_stop_returns_within_its_bound_while_redis_is_frozen(
    frozen: RedisServer, loop_errors: list[dict[str, Any]]
) -> None:
    a = Purgatory("a")
    async with a:
        fa = RedisFanout(frozen.url, a, connect_timeout=5)
        await fa.start()
        waiting = asyncio.create_task(fa.wait_for_value(a, "k", 1, 30))
        await until(lambda: a.num_delayed == 1)
        freeze(frozen)
        for i in range(100):
            fa.advance(f"k{i}", 1)
        pending = asyncio.create_task(fa.advance_confirmed("c", 1, timeout=30))
        await asyncio.sleep(0.05)
        loop = asyncio.get_running_loop()
        started = loop.time()
        async with asyncio.timeout(5):
            await fa.stop(flush_timeout=0.3)
        assert loop.time() - started < 0.3 + 2 * ABANDON_AFTER + 0.5
        with pytest.raises(FanoutUnavailable):
            await pending
        assert fa.stats().undelivered >= 1
        assert not waiting.done()
        waiting.cancel()
    await asyncio.sleep(0.05)
    assert loop_errors == []


# -- connections cut, Redis killed ---------------------------------------------------------------


@pytest.mark.parametrize("victims", ["normal", "pubsub"])
async def test_client_kill_during_a_storm_loses_no_confirmed_event(
    redis_server: RedisServer, admin: aioredis.Redis, victims: str
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b) as fb:
        waits = [asyncio.create_task(fa.wait_for_value(a, f"w{i}", 1, 30)) for i in range(200)]
        await until(lambda: a.num_delayed == 200)
        confirms = []
        for i in range(200):
            confirms.append(asyncio.create_task(fb.advance_confirmed(f"w{i}", 1, timeout=10)))
            if i in (0, 50, 150):
                await admin.execute_command("CLIENT", "KILL", "TYPE", victims, "SKIPME", "yes")
            await asyncio.sleep(0)
        async with asyncio.timeout(15):
            await asyncio.gather(*confirms)
            assert await asyncio.gather(*waits) == [1.0] * 200


async def test_redis_killed_and_restarted_with_waits_parked_completes_them(
    redis_server: RedisServer,
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b) as fb:
        waits = [asyncio.create_task(fa.wait_for_value(a, f"r{i}", 1, 30)) for i in range(20)]
        await until(lambda: a.num_delayed == 20)
        redis_server.kill()
        with pytest.raises(FanoutUnavailable):
            await fb.advance_confirmed("r0", 1, timeout=0.2)
        redis_server.start()
        for i in range(20):
            await fb.advance_confirmed(f"r{i}", 1, timeout=10)
        async with asyncio.timeout(10):
            assert await asyncio.gather(*waits) == [1.0] * 20


# -- wrong service, credentials, malformed URLs ---------------------------------------------------


async def test_a_url_pointing_at_another_service_is_one_clear_line() -> None:
    async def http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(http, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        fanout = RedisFanout(f"redis://:hunter2@127.0.0.1:{port}/0", connect_timeout=1)
        with pytest.raises(FanoutUnavailable) as caught:
            await fanout.start()
    finally:
        server.close()
        await server.wait_closed()
    message = str(caught.value)
    assert "\n" not in message and "hunter2" not in message
    assert f"127.0.0.1:{port}" in message and "another service" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


async def test_a_missing_password_is_named_as_such() -> None:
    with RedisServer(password="s3cret") as server:
        with pytest.raises(FanoutUnavailable, match="requires a password") as caught:
            await RedisFanout(f"redis://127.0.0.1:{server.port}/0").start()
        assert "\n" not in str(caught.value) and "HELLO" not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis:/127.0.0.1:16391/0", "two slashes"),
        ("redis:127.0.0.1:16391", "two slashes"),
        ("redis://:6379/0", "no host"),
        ("redis://127.0.0.1:99999/0", "invalid port"),
        ("redis://127.0.0.1:abc/0", "invalid port"),
        ("redis://127.0.0.1:0/0", "invalid port"),
        ("redis://127.0.0.1:6379/zero", "invalid database"),
        ("http://127.0.0.1:6379/0", "scheme"),
        ("unix://", "socket path"),
    ],
)
def test_a_malformed_redis_url_is_refused_before_connecting(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        RedisFanout(url)


def test_a_malformed_url_never_shows_its_password() -> None:
    with pytest.raises(ValueError, match="invalid port") as caught:
        RedisFanout("redis://user:topsecret@127.0.0.1:99999/0")
    assert "topsecret" not in str(caught.value)


# -- memory ---------------------------------------------------------------------------------------


@pytest.mark.one_loop  # 100k events through Redis: once is enough
async def test_a_publish_only_member_keeps_nothing_per_key(redis_server: RedisServer) -> None:
    import gc

    async with RedisFanout(redis_server.url, subscribe=False) as fanout:
        await fanout.advance_confirmed("warm", 1)
        gc.collect()
        before = len(gc.get_objects())
        for i in range(100_000):
            fanout.advance(f"job:{i}", 1)
            if i % 5000 == 4999:
                await until(lambda: fanout.stats().queued == 0)
        await until(lambda: fanout.stats().queued == 0)
        gc.collect()
        grown = len(gc.get_objects()) - before
        assert fanout.stats().published == 100_001
        assert grown < 5_000, f"{grown} more objects after 100k keys"


async def test_a_relaying_member_keeps_values_only_for_watched_keys(
    redis_server: RedisServer,
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b) as fb:
        for i in range(5000):
            fb.advance(f"x{i}", 1)
        await until(lambda: fa.stats().received >= 5000)
        assert fa.value("x1") is None and a.watched_keys() == []


# -- one index: the purgatory's ------------------------------------------------------------------


async def test_operations_watched_on_the_purgatory_directly_are_caught_up(
    redis_server: RedisServer, admin: aioredis.Redis
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, RedisFanout(redis_server.url, a) as fa, RedisFanout(redis_server.url, b) as fb:
        await fb.advance_confirmed("early", 1)
        early = ValueReached(fa, "early", 1, 30)
        await a.watch_threshold(early, "early", 1)  # not through the fan-out
        await until(early.done)
        assert early.result() == 1.0
        late = ValueReached(fa, "gap", 1, 30)
        await a.watch_threshold(late, "gap", 1)
        await until(lambda: fa.stats().reads_pending == 0)
        await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        # Stored while the subscription is cut, never published: only a resync finds it.
        await admin.set(PREFIX + "gap", "1")
        await until(late.done)
        assert late.result() == 1.0 and fa.stats().resubscribes >= 1


class Stubborn(MemoryBackend):
    """A backend whose waits swallow cancellation, as redis-py's wait_for does on 3.11."""

    async def subscribe(self, host: BackendHost) -> None:
        host.subscribed()
        while host.listening:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    async def store_and_publish(self, events: Sequence[Event]) -> list[BaseException | None]:
        try:
            await asyncio.sleep(0.3)
        except asyncio.CancelledError:
            await asyncio.sleep(0.3)
        return await super().store_and_publish(events)


async def test_stop_is_bounded_and_leaves_no_task_behind_when_cancellation_is_swallowed(
    loop_errors: list[dict[str, Any]],
) -> None:
    async with Purgatory("a") as a:
        fanout = Fanout(Stubborn(MemoryHub()), a)
        await fanout.start()
        for i in range(100):
            fanout.advance(f"k{i}", i)
        await asyncio.sleep(0.01)  # a batch is in flight
        loop = asyncio.get_running_loop()
        started = loop.time()
        await fanout.stop(flush_timeout=0.1)
        assert loop.time() - started < 0.1 + 2 * ABANDON_AFTER + 0.3
        assert fanout.stats().undelivered == 100
        await until(
            lambda: (
                not [
                    t
                    for t in asyncio.all_tasks()
                    if t.get_name().startswith("purgatory_aio.fanout") and not t.done()
                ]
            )
        )
    assert loop_errors == []


#: Every shape of a malformed engine URL, each with the password it must never show.
MALFORMED_URLS = [
    "",
    "postgresql:/user:hunter2@127.0.0.1:5432/app",  # one slash
    "postgresql:user:hunter2@127.0.0.1/app",  # none
    "postgresql//user:hunter2@127.0.0.1/app",  # no colon
    " postgresql://user:hunter2@127.0.0.1/app",  # a space before the scheme
    "postgresql:///app",  # no host
    "postgresql://user:hunter2@127.0.0.1:notaport/app",
    "postgresql://user:hunter2@127.0.0.1:0/app",
    "postgresql://user:hunter2@127.0.0.1:-1/app",
    "postgresql://user:hunter2@127.0.0.1:70000/app",
    "postgresql://user:hunter2@[::1/app",  # an unclosed IPv6 address
    "postgresql://user:hunter2@127.0.0.1/app?schema=x%3Bdrop",
    "postgresql://user:hunter2@127.0.0.1/app?schema=Public",
    "postgresql://user:hunter2@127.0.0.1/app?schema=",
    "postgresql://user:hunter2@127.0.0.1/app?schema=a&schema=b",
    "postgresql://user:hunter2@127.0.0.1/app?create=maybe",
    "redis:/127.0.0.1:6379",
    "rediss:/127.0.0.1",
    "redis:///0",
    "redis://:hunter2@127.0.0.1:notaport/0",
    "redis://:hunter2@127.0.0.1:99999/0",
    "redis://:hunter2@[::1/0",
    "redis://:hunter2@127.0.0.1/notadb",
    "unix://",
    "mysql://user:hunter2@127.0.0.1/app",
    "http://user:hunter2@127.0.0.1/",
    "memory://host",
    "memory:///x",
    "127.0.0.1:5432",
]


@pytest.mark.parametrize("url", MALFORMED_URLS, ids=repr)
def test_a_malformed_url_is_one_line_naming_the_problem_before_anything_connects(url: str) -> None:
    """What the webhook example turns into one FanoutUnavailable line per worker (its uvicorn
    test runs a few of these shapes under two workers)."""
    with pytest.raises(ValueError) as caught:
        fanout_from_url(url)
    message = str(caught.value)
    assert message and "\n" not in message and "hunter2" not in message


def test_a_url_that_is_not_a_str_is_a_type_error() -> None:
    for url in (b"redis://127.0.0.1:6379/0", 6379, ["postgresql://127.0.0.1/app"]):
        with pytest.raises(TypeError, match="must be a str"):
            fanout_from_url(url)  # type: ignore[arg-type]
