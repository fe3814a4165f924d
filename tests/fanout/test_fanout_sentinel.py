"""The Redis backend behind Sentinel: URLs, failovers at every phase, a frozen master, replicas.

One master, one replica and three sentinels run for the session (``sentinels``); each test
uses a prefix of its own and leaves the topology to be settled by the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from fanout_support import Storm, assert_refused, assert_unavailable, free_port, until
from sentinel_support import SERVICE, Sentinels

from purgatory_aio import Purgatory
from purgatory_aio.fanout import FanoutUnavailable, RedisFanout, fanout_from_url
from purgatory_aio.fanout._redis import SentinelBackend, parse_sentinel_url


@contextlib.asynccontextmanager
async def members(
    sentinels: Sentinels, **b_options: Any
) -> AsyncIterator[tuple[Purgatory, RedisFanout, RedisFanout, str]]:
    """Two processes on the Sentinel URL under a fresh prefix: ``a`` waits, ``b`` publishes
    (with ``b_options``); yields a's purgatory, both fan-outs and the prefix."""
    name = f"s{uuid.uuid4().hex[:10]}"
    a, b = Purgatory("a"), Purgatory("b")
    fa = RedisFanout(sentinels.url, a, prefix=name, connect_timeout=1.0)
    fb = RedisFanout(sentinels.url, b, prefix=name, connect_timeout=1.0, **b_options)
    async with a, b, fa, fb:
        yield a, fa, fb, name


async def parked(
    fa: RedisFanout, a: Purgatory, key: str, deadline: float = 30
) -> asyncio.Task[Any]:
    """A wait in ``a`` for ``key`` to reach 1, returned once its operation is pending."""
    before = a.num_delayed
    task = asyncio.create_task(fa.wait_for_value(a, key, 1, deadline))
    await until(lambda: a.num_delayed == before + 1)
    return task


async def stored(sentinels: Sentinels, prefix: str, key: str) -> float | None:
    """The value the current master holds for ``key``."""
    port = (await asyncio.to_thread(sentinels.master)).port
    client = aioredis.Redis(host="127.0.0.1", port=port)
    try:
        raw = await client.get(f"{prefix}:value:{key}")
    finally:
        await client.aclose()
    return None if raw is None else float(raw)


# -- the URL ----------------------------------------------------------------------------------


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_options(tmp_path: Path) -> None:
    target = parse_sentinel_url(
        "redis+sentinel://:pw@127.0.0.1:26379,[::1]:26380,sentinel-c/svc?db=3&sentinel_password=spw"
    )
    assert target.sentinels == (("127.0.0.1", 26379), ("::1", 26380), ("sentinel-c", 26379))
    assert target.service == "svc"
    assert target.master == {"db": 3, "password": "pw"}
    assert target.sentinel == {"password": "spw"}
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    tls = parse_sentinel_url(
        f"rediss+sentinel://h:1/svc?ssl_ca_certs={ca}&ssl_check_hostname=false"
    )
    assert (
        tls.master
        == tls.sentinel
        == {
            "ssl": True,
            "ssl_ca_certs": str(ca),
            "ssl_check_hostname": False,
        }
    )
    fanout = fanout_from_url("redis+sentinel://127.0.0.1:26379/svc")
    assert isinstance(fanout, RedisFanout) and isinstance(fanout.backend, SentinelBackend)
    assert "svc" in fanout.address


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel:h:1/svc", "expected redis+sentinel://"),
        ("redis+sentinel:///svc", "names no sentinel"),
        ("redis+sentinel://h:1", "must name one service"),
        ("redis+sentinel://h:1/", "must name one service"),
        ("redis+sentinel://h:1/a/b", "must name one service"),
        ("redis+sentinel://h:1,,h:2/svc", "empty sentinel address"),
        ("redis+sentinel://h:port/svc", "invalid port in 'h:port'"),
        ("redis+sentinel://h:0/svc", "invalid port"),
        ("redis+sentinel://h:70000/svc", "invalid port"),
        ("redis+sentinel://h:1/svc?db=x", "invalid database 'x'"),
        ("redis+sentinel://h:1/svc?dbb=1", "unknown option 'dbb'"),
        ("redis+sentinel://h:1/svc?ssl_ca_certs=/ca", "need rediss+sentinel://"),
        ("rediss+sentinel://h:1/svc?ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of"),
        ("rediss+sentinel://h:1/svc?ssl_check_hostname=perhaps", "must be true or false"),
        (
            "rediss+sentinel://h:1/svc?ssl_ca_certs=/no/ca.pem",
            "ssl_ca_certs='/no/ca.pem' is not a file",
        ),
        ("rediss://h:1/0?ssl_certfile=/no/cert.pem", "ssl_certfile='/no/cert.pem' is not a file"),
    ],
)
def test_a_bad_sentinel_url_is_refused_before_anything_connects(url: str, says: str) -> None:
    assert_refused(url, says)


def test_a_sentinel_password_never_shows() -> None:
    with pytest.raises(ValueError) as caught:
        RedisFanout("redis+sentinel://:secret@h:1/svc?sentinel_password=hidden&db=x")
    assert "secret" not in str(caught.value) and "hidden" not in str(caught.value)


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"min_replicas": -1}, ValueError, "min_replicas must be >= 0"),
        ({"min_replicas": 1.5}, TypeError, "min_replicas must be an int"),
        ({"min_replicas": True}, TypeError, "min_replicas must be an int"),
        ({"replica_timeout": 0}, ValueError, "replica_timeout must be > 0"),
        ({"replica_timeout": "1"}, TypeError, "replica_timeout"),
        ({"replica_timeout": float("inf")}, ValueError, "replica_timeout"),
    ],
)
def test_bad_replica_options_are_refused(
    options: dict[str, Any], error: type[Exception], says: str
) -> None:
    # The core's rule for counts and seconds, as for every other option.
    with pytest.raises(error, match=says):
        RedisFanout("redis://127.0.0.1:6379/0", **options)


async def test_no_sentinel_listening_is_one_clear_line() -> None:
    url = f"redis+sentinel://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/{SERVICE}"
    await assert_unavailable(url, "no sentinel answered")


async def test_an_unknown_service_is_one_clear_line(sentinels: Sentinels) -> None:
    url = sentinels.url.replace(f"/{SERVICE}", "/no-such-service")
    fanout = RedisFanout(url, connect_timeout=0.5)
    with pytest.raises(FanoutUnavailable, match="no sentinel knows a master of that service"):
        await fanout.start()
    await fanout.stop()


# -- failovers ----------------------------------------------------------------------------------


async def test_failover_while_idle_moves_the_subscription_and_catches_up(
    sentinels: Sentinels,
) -> None:
    async with members(sentinels) as (a, fa, fb, name):
        long_wait = await parked(fa, a, "job:1")
        short_wait = await parked(fa, a, "job:short", deadline=0.5)
        old = await asyncio.to_thread(sentinels.master)
        new = await asyncio.to_thread(sentinels.failover)
        assert new is not old
        async with asyncio.timeout(10):
            assert await short_wait is None  # its deadline held through the failover
        # Both members have moved: until the publisher has, its writes may still land on
        # the old master, which SENTINEL FAILOVER leaves writable for a while (the
        # operators' guide says so), and the subscriber on the new one would never see them.
        await until(lambda: fa.stats().failovers == 1 and fb.stats().failovers == 1)
        fb.advance("job:1", 1)
        async with asyncio.timeout(10):
            assert await long_wait == 1.0
        assert await stored(sentinels, name, "job:1") == 1.0
        stats = fa.stats()
        assert stats.failovers == 1 and stats.resubscribes >= 1 and stats.connected


async def test_master_killed_mid_storm_keeps_every_replica_confirmed_advance(
    sentinels: Sentinels,
) -> None:
    keys = [f"k{i}" for i in range(40)]
    rounds = 15
    async with members(sentinels, min_replicas=1, replica_timeout=0.5) as (a, fa, fb, name):
        waits = [asyncio.create_task(fa.wait_for_value(a, key, rounds, 60)) for key in keys]
        await until(lambda: a.num_delayed == len(keys))
        storm = Storm(fb, keys, rounds)
        await asyncio.sleep(0.05)  # the storm is under way
        old = await asyncio.to_thread(sentinels.master)
        old.kill()
        await asyncio.to_thread(sentinels.wait_new_master, old)
        await storm.check(lambda key: stored(sentinels, name, key), waits, a)
        await until(lambda: fa.stats().failovers == 1)  # its subscription moved too, once


async def test_failover_while_waits_are_admitted(sentinels: Sentinels) -> None:
    async with members(sentinels, min_replicas=1) as (a, fa, fb, _name):
        # Stored (and replicated) before the failover, on keys whose waits are admitted
        # during it: each wait reads the stored value once admitted, from whichever master
        # holds it. The master is killed: SENTINEL FAILOVER would leave it writable for a
        # while (see the operators' guide).
        for i in range(100):
            await fb.advance_confirmed(f"early{i}", 1, timeout=5)
        old = await asyncio.to_thread(sentinels.master)
        old.kill()
        failover = asyncio.create_task(asyncio.to_thread(sentinels.wait_new_master, old))
        waits = []
        while not failover.done():
            i = len(waits)
            waits.append(asyncio.create_task(fa.wait_for_value(a, f"early{i % 100}", 1, 30)))
            waits.append(asyncio.create_task(fa.wait_for_value(a, f"late{i}", 1, 30)))
            await asyncio.sleep(0.01)
        await failover
        for i in range(len(waits) // 2):
            fb.advance(f"late{i * 2}", 1)
        async with asyncio.timeout(20):
            assert set(await asyncio.gather(*waits)) == {1.0}
        assert a.num_delayed == 0
        await until(lambda: fa.stats().failovers == 1)  # the subscription moved, once


async def test_frozen_master_a_confirmed_advance_waits_and_lands_on_the_new_master(
    sentinels: Sentinels,
) -> None:
    async with members(sentinels) as (a, fa, fb, name):
        waiting = await parked(fa, a, "job:frozen")
        old = await asyncio.to_thread(sentinels.master)
        sentinels.freeze(old)
        try:
            # Sent to the frozen master: no answer until the sentinels promote the replica,
            # then the publisher's command times out and it sends the batch there.
            confirm = asyncio.create_task(fb.advance_confirmed("job:frozen", 1, timeout=20))
            await asyncio.to_thread(sentinels.wait_new_master, old)
            async with asyncio.timeout(20):
                await confirm
                assert await waiting == 1.0
            assert await stored(sentinels, name, "job:frozen") == 1.0
        finally:
            sentinels.thaw(old)
        # The thawed master is demoted; whatever it accepted meanwhile is gone, not this.
        await asyncio.to_thread(sentinels.wait_healthy)
        assert await stored(sentinels, name, "job:frozen") == 1.0
        await until(lambda: fa.stats().failovers == 1)


async def test_too_few_replicas_fail_the_confirmation_with_one_clear_line(
    sentinels: Sentinels,
) -> None:
    async with members(sentinels, min_replicas=2, replica_timeout=0.2) as (a, fa, fb, _name):
        waiting = await parked(fa, a, "job:2")
        with pytest.raises(FanoutUnavailable) as caught:
            await fb.advance_confirmed("job:2", 1, timeout=5)
        message = str(caught.value)
        assert re.search(r"[01] of the 2 replicas asked for", message) and "\n" not in message
        # Stored on the master and published all the same: the other process completes.
        async with asyncio.timeout(10):
            assert await waiting == 1.0
        fb.advance("job:3", 1)  # fire-and-forget advances never wait for the replicas
        await until(lambda: fb.stats().published == 1)
        assert fb.stats().publish_errors == 1  # the confirmation the replicas did not back


async def test_one_replica_acknowledges_a_confirmed_advance(sentinels: Sentinels) -> None:
    async with members(sentinels, min_replicas=1) as (_, _, fb, name):
        await fb.advance_confirmed("job:r", 7, timeout=5)
        replica = await asyncio.to_thread(sentinels.replica)
        client = aioredis.Redis(host="127.0.0.1", port=replica.port)
        try:
            assert await client.get(f"{name}:value:job:r") == b"7.0"
        finally:
            await client.aclose()
        assert fb.stats().publish_errors == 0


async def test_a_lagging_replica_refuses_replica_confirmations_and_the_others_can_be_lost(
    sentinels: Sentinels,
) -> None:
    async with members(sentinels, min_replicas=1, replica_timeout=0.2) as (a, _fa, fb, name):
        plain = RedisFanout(sentinels.url, a, prefix=name, connect_timeout=1.0, subscribe=False)
        async with plain:
            replica = await asyncio.to_thread(sentinels.replica)
            old = await asyncio.to_thread(sentinels.master)
            # The replica frozen, and its link cut by the master: it takes nothing more.
            sentinels.freeze(replica)
            admin = aioredis.Redis(host="127.0.0.1", port=old.port)
            try:
                await admin.execute_command("CLIENT", "KILL", "TYPE", "replica")
            finally:
                await admin.aclose()
            try:
                with pytest.raises(FanoutUnavailable, match="0 of the 1 replicas"):
                    await fb.advance_confirmed("job:safe", 1, timeout=5)
                await plain.advance_confirmed("job:unsafe", 1, timeout=5)  # the master alone
                old.kill()
            finally:
                sentinels.thaw(replica)
            await asyncio.to_thread(sentinels.wait_new_master, old)
        # The promoted replica never received either value: the one confirmed without the
        # replica option is lost, as the operators' guide says; the other was never confirmed.
        assert await stored(sentinels, name, "job:unsafe") is None
        assert await stored(sentinels, name, "job:safe") is None
