"""Production engines, the corners: a member that only publishes through a failover (Sentinel,
Cluster), libpq's query form of several hosts (``?host=h1,h2&port=p1,p2``) with a frozen first
host, and replica acknowledgements on plain Redis replication (no Sentinel).

Every server is the session's (see conftest.py); each test uses a prefix of its own."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
import structlog
from cluster_support import Cluster
from fanout_support import until
from pg_support import ReplicatedPair
from sentinel_support import Sentinels

from purgatory_aio import Purgatory
from purgatory_aio.fanout import FanoutUnavailable, PostgresFanout, RedisFanout, fanout_from_url
from purgatory_aio.fanout._postgres import url_hosts

PATIENCE = 30.0


@pytest.fixture
def switches() -> Iterator[structlog.testing.LogCapture]:
    """The library's warnings, captured (``fanout_engine_switched`` among them)."""
    saved = structlog.get_config()
    captured = structlog.testing.LogCapture()
    structlog.configure(
        processors=[captured], wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING)
    )
    try:
        yield captured
    finally:
        structlog.configure(**saved)


def switched(captured: structlog.testing.LogCapture) -> list[dict[str, object]]:
    return [e for e in captured.entries if e["event"] == "fanout_engine_switched"]


# -- a member that only publishes, through a failover ------------------------------------------


async def test_a_publish_only_member_logs_and_counts_a_sentinel_master_killed(
    sentinels: Sentinels, switches: structlog.testing.LogCapture
) -> None:
    name = f"p{uuid.uuid4().hex[:10]}"
    a = Purgatory("a")
    waiter = RedisFanout(sentinels.url, a, prefix=name, connect_timeout=1.0)
    sender = RedisFanout(sentinels.url, prefix=name, connect_timeout=1.0, subscribe=False)
    async with a, waiter, sender:
        await sender.advance_confirmed("before", 1, timeout=5)
        assert sender.stats().failovers == 0
        waiting = asyncio.create_task(waiter.wait_for_value(a, "after", 1, PATIENCE))
        await until(lambda: a.num_delayed == 1)
        old = await asyncio.to_thread(sentinels.master)
        old.kill()
        new = await asyncio.to_thread(sentinels.wait_new_master, old)
        # Sent again until the new master takes it: then the publisher knows it moved.
        await sender.advance_confirmed("after", 1, timeout=PATIENCE)
        await until(lambda: sender.stats().failovers == 1)
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 1.0
        for _ in range(3):  # later batches on the same master are no new switch
            await sender.advance_confirmed("after", 2, timeout=5)
        assert sender.stats().failovers == 1
        await until(lambda: waiter.stats().failovers == 1)
    mine = [e for e in switched(switches) if e["current"] == f"127.0.0.1:{new.port}"]
    # One from each member: the subscriber's and the publish-only one's, never twice.
    assert len(mine) == 2
    assert all(
        e["previous"] == f"127.0.0.1:{old.port}" and e["log_level"] == "warning" for e in mine
    )


async def test_a_publish_only_member_logs_and_counts_a_cluster_master_killed(
    cluster: Cluster, switches: structlog.testing.LogCapture
) -> None:
    name, key = f"c{uuid.uuid4().hex[:10]}", "job:cluster"
    victim = await asyncio.to_thread(cluster.master_of, f"{name}:value:{key}")
    a = Purgatory("a")
    waiter = RedisFanout(cluster.url(), a, prefix=name, connect_timeout=1.0)
    sender = RedisFanout(cluster.url(), prefix=name, connect_timeout=1.0, subscribe=False)
    async with a, waiter, sender:
        await sender.advance_confirmed(key, 1, timeout=5)
        waiting = asyncio.create_task(waiter.wait_for_value(a, key, 2, PATIENCE))
        await until(lambda: a.num_delayed == 1)
        victim.kill()
        new = await asyncio.to_thread(cluster.wait_promoted, victim, f"{name}:value:{key}")
        await sender.advance_confirmed(key, 2, timeout=PATIENCE)
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 2.0
        await until(lambda: sender.stats().failovers == 1)
        for _ in range(3):
            await sender.advance_confirmed(key, 3, timeout=5)
        assert sender.stats().failovers == 1
    moved = (f"127.0.0.1:{victim.port}", f"127.0.0.1:{new.port}")
    assert moved in [(e["previous"], e["current"]) for e in switched(switches)]


# -- libpq's query form of several hosts -------------------------------------------------------


def test_the_query_form_of_several_hosts_is_read_as_the_address_form() -> None:
    address = "postgresql://u:secret@db1:5432,db2:6543/app"
    query = "postgresql://u:secret@/app?host=db1,db2&port=5432,6543"
    assert url_hosts(query) == url_hosts(address) == [("db1", 5432), ("db2", 6543)]
    assert url_hosts("postgresql:///app?host=db1,db2&port=7000") == [("db1", 7000), ("db2", 7000)]
    assert url_hosts("postgresql:///app?host=db1,::1") == [("db1", None), ("::1", None)]
    assert url_hosts("postgresql:///app?host=/run/postgresql") == []  # a socket directory
    assert PostgresFanout(query).url == query
    assert isinstance(fanout_from_url(query), PostgresFanout)
    for bad, problem in (
        ("postgresql://u:secret@/app?host=db1,,db3", "empty host"),
        ("postgresql://u:secret@/app?host=db1,db2&port=1,2,3", "3 ports"),
        ("postgresql://u:secret@/app?host=db1,db2&port=5432,x", "not a number"),
        ("postgresql://u:secret@/app?host=db1,db2&port=5432,70000", "not a number"),
        ("postgresql://u:secret@/app?host=db1,db2&port=0", "port 0"),
        ("postgresql://u:secret@/app?host=db1&host=db2", "twice"),
        ("postgresql://u:secret@db0/app?host=db1,db2", "both in its address and in host="),
        ("postgresql://u:secret@/app?host=db1,db2&target_session_attrs=standby",
         "only a primary"),
    ):  # fmt: skip
        for make in (PostgresFanout, fanout_from_url):
            with pytest.raises(ValueError, match=problem) as caught:
                make(bad)
            assert "secret" not in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("form", ["address", "query"])
async def test_a_frozen_first_host_costs_one_connect_timeout_on_both_url_forms(
    replicated: ReplicatedPair, form: str
) -> None:
    frozen, primary = replicated.standby, replicated.primary
    parts = urlsplit(replicated.url)
    credentials = parts.netloc.rpartition("@")[0]
    if form == "address":
        url = (
            f"postgresql://{credentials}@127.0.0.1:{frozen.port},127.0.0.1:{primary.port}/postgres"
        )
    else:
        url = (
            f"postgresql://{credentials}@/postgres?host=127.0.0.1,127.0.0.1"
            f"&port={frozen.port},{primary.port}"
        )
    timeout = 1.0
    prefix = f"gaps_{uuid.uuid4().hex[:8]}"
    a = Purgatory("a")
    fanout = PostgresFanout(url, a, prefix=prefix, connect_timeout=timeout, health_interval=0.5)
    frozen.freeze()
    try:
        # The start opens its connections in turn, each trying the frozen host first until
        # one has answered elsewhere: a few timeouts, never asyncpg's one shared bound spent.
        async with asyncio.timeout(PATIENCE):
            await fanout.start()
        try:
            waiting = asyncio.create_task(fanout.wait_for_value(a, "k", 1, PATIENCE))
            await until(lambda: a.num_delayed == 1)
            await fanout.advance_confirmed("k", 1, timeout=PATIENCE)
            async with asyncio.timeout(PATIENCE):
                assert await waiting == 1.0
        finally:
            async with asyncio.timeout(5):
                await fanout.stop()
    finally:
        frozen.thaw()
    assert fanout.stats().failovers == 0


async def test_frozen_hosts_alone_are_one_bounded_line_on_the_query_form(
    replicated: ReplicatedPair,
) -> None:
    standby = replicated.standby  # both hosts of the URL are this one, frozen
    credentials = urlsplit(replicated.url).netloc.rpartition("@")[0]
    url = f"postgresql://{credentials}@/postgres?host=127.0.0.1,127.0.0.1&port={standby.port}"
    standby.freeze()
    try:
        fanout = PostgresFanout(url, connect_timeout=0.5)
        async with asyncio.timeout(PATIENCE):
            with pytest.raises(FanoutUnavailable) as caught:
                await fanout.start()
    finally:
        standby.thaw()
    message = str(caught.value)
    assert "\n" not in message and replicated.primary.password not in message
    # Two hosts of 0.5 s each meet the start's own bound (twice the connect timeout).
    assert message.startswith("cannot reach PostgreSQL at") and "no answer within 1 s" in message
    assert not fanout.stats().connected


# -- replicas on plain Redis replication ------------------------------------------------------


async def test_plain_replication_a_frozen_replica_fails_confirmations_until_it_returns(
    sentinels: Sentinels,
) -> None:
    master = await asyncio.to_thread(sentinels.master)
    replica = await asyncio.to_thread(sentinels.replica)
    url = f"redis://127.0.0.1:{master.port}/0"  # the master itself: no sentinel involved
    name = f"r{uuid.uuid4().hex[:10]}"
    a = Purgatory("a")
    waiter = RedisFanout(url, a, prefix=name, connect_timeout=1.0)
    sender = RedisFanout(url, prefix=name, min_replicas=1, replica_timeout=0.3, subscribe=False)
    async with a, waiter, sender:
        await sender.advance_confirmed("k", 1, timeout=5)  # the replica is there: confirmed
        waiting = asyncio.create_task(waiter.wait_for_value(a, "k", 2, PATIENCE))
        await until(lambda: a.num_delayed == 1)
        sentinels.freeze(replica)
        try:
            with pytest.raises(FanoutUnavailable) as caught:
                await sender.advance_confirmed("k", 2, timeout=5)
            message = str(caught.value)
            assert "\n" not in message
            assert re.search(r"0 of the 1 replicas asked for acknowledged it within 0.3 s", message)
            # Stored on the master and published all the same: the wait completes.
            async with asyncio.timeout(PATIENCE):
                assert await waiting == 2.0
            admin = aioredis.Redis(host="127.0.0.1", port=master.port)
            try:
                assert await admin.get(f"{name}:value:k") == b"2.0"
            finally:
                await admin.aclose()
        finally:
            sentinels.thaw(replica)

        async def confirmed() -> bool:
            try:
                await sender.advance_confirmed("k", 3, timeout=5)
            except FanoutUnavailable:
                return False
            return True

        # The replica thawed catches up, and confirmations succeed again.
        for _ in range(100):  # bounded: about 20 s at most
            if await confirmed():
                break
            await asyncio.sleep(0.2)
        else:
            pytest.fail("confirmations still fail after the replica came back")
        stats = sender.stats()
        assert stats.publish_errors >= 1 and stats.failovers == 0
