"""The Redis backend on a Redis Cluster: URLs, keys over every master, a master killed.

Three masters with a replica each run for the session (``cluster``); each test uses a prefix
of its own, and the next test starts a killed node again (it rejoins as a replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from cluster_support import Cluster, command
from fanout_support import (
    RedisServer,
    Storm,
    assert_refused,
    assert_unavailable,
    free_port,
    until,
)

from purgatory_aio import Purgatory
from purgatory_aio.fanout import RedisFanout, fanout_from_url
from purgatory_aio.fanout._redis import ClusterBackend, parse_cluster_url


@contextlib.asynccontextmanager
async def members(
    cluster: Cluster, first: RedisServer | None = None, name: str = "", **b_options: Any
) -> AsyncIterator[tuple[Purgatory, RedisFanout, RedisFanout, str]]:
    """Two processes on the cluster under prefix ``name`` (else a fresh one): ``a`` waits
    (subscribed on ``first``), ``b`` publishes (with ``b_options``); yields a's purgatory,
    both fan-outs and the prefix."""
    name = name or fresh()
    a, b = Purgatory("a"), Purgatory("b")
    fa = RedisFanout(cluster.url(first), a, prefix=name, connect_timeout=1.0)
    fb = RedisFanout(cluster.url(), b, prefix=name, connect_timeout=1.0, **b_options)
    async with a, b, fa, fb:
        yield a, fa, fb, name


def fresh() -> str:
    return f"c{uuid.uuid4().hex[:10]}"


async def stored(cluster: Cluster, prefix: str, key: str) -> float | None:
    """The value the master of ``key`` holds now."""
    full = f"{prefix}:value:{key}"
    node = await asyncio.to_thread(cluster.master_of, full)
    raw = await asyncio.to_thread(command, node.port, "GET", full)
    return None if raw is None else float(raw)


# -- the URL ----------------------------------------------------------------------------------


def test_a_cluster_url_names_some_nodes_and_the_options() -> None:
    target = parse_cluster_url("redis+cluster://:pw@127.0.0.1:7000,[::1]:7001,node-c/")
    assert target.nodes == (("127.0.0.1", 7000), ("::1", 7001), ("node-c", 6379))
    assert target.options == {"password": "pw"}
    tls = parse_cluster_url("rediss+cluster://h:1?ssl_check_hostname=false&ssl_cert_reqs=none")
    assert tls.options == {"ssl": True, "ssl_check_hostname": False, "ssl_cert_reqs": "none"}
    fanout = fanout_from_url("redis+cluster://127.0.0.1:7000")
    assert isinstance(fanout, RedisFanout) and isinstance(fanout.backend, ClusterBackend)
    assert "Redis Cluster" in fanout.address


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster:h:1", "expected redis+cluster://"),
        ("redis+cluster://", "names no node"),
        ("redis+cluster://:pw@/", "names no node"),
        ("redis+cluster://h:1,,h:2", "empty node address"),
        ("redis+cluster://h:port", "invalid port in 'h:port'"),
        ("redis+cluster://h:0", "invalid port"),
        ("redis+cluster://:secret@h:1/3", "a Redis Cluster has only database 0"),
        ("redis+cluster://h:1?db=0", "unknown option 'db'"),
        ("redis+cluster://h:1?ssl_ca_certs=/ca", "need rediss+cluster://"),
        ("rediss+cluster://h:1?ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of"),
        ("rediss+cluster://h:1?ssl_ca_certs=/no/ca.pem", "'/no/ca.pem' is not a file"),
    ],
)
def test_a_bad_cluster_url_is_refused_before_anything_connects(url: str, says: str) -> None:
    assert_refused(url, says)


async def test_no_node_listening_is_one_clear_line() -> None:
    await assert_unavailable(f"redis+cluster://127.0.0.1:{free_port()}", "Redis Cluster at")


# -- keys over every master ---------------------------------------------------------------------


async def test_waits_complete_across_members_on_keys_of_every_master(cluster: Cluster) -> None:
    keys = [f"job:{i}" for i in range(30)]
    async with members(cluster, min_replicas=1) as (a, fa, fb, name):
        masters = {
            (await asyncio.to_thread(cluster.master_of, f"{name}:value:{key}")).port for key in keys
        }
        assert len(masters) == 3  # the keys lie in slots of every master
        fb.advance("job:0", 5)  # stored before the wait: its admission reads it
        await until(lambda: fb.stats().published == 1)
        waits = [asyncio.create_task(fa.wait_for_value(a, key, 1, 30)) for key in keys]
        await until(lambda: a.num_delayed == len(keys) - 1)
        # One batch for keys of three masters, each confirmed by that master's replica.
        await asyncio.gather(*(fb.advance_confirmed(key, 1, timeout=5) for key in keys[1:]))
        async with asyncio.timeout(10):
            assert await asyncio.gather(*waits) == [5.0] + [1.0] * (len(keys) - 1)
        assert [await stored(cluster, name, key) for key in keys[:3]] == [5.0, 1.0, 1.0]
        assert fb.stats().publish_errors == 0 and fa.stats().failovers == 0


# -- a master killed ----------------------------------------------------------------------------


async def test_master_killed_while_idle_moves_the_subscription_and_catches_up(
    cluster: Cluster,
) -> None:
    name, key = fresh(), "job:idle"
    victim = await asyncio.to_thread(cluster.master_of, f"{name}:value:{key}")
    # ``a`` subscribes on the master about to die.
    async with members(cluster, first=victim, name=name) as (a, fa, fb, _):
        long_wait = asyncio.create_task(fa.wait_for_value(a, key, 1, 30))
        short_wait = asyncio.create_task(fa.wait_for_value(a, "job:short", 1, 0.5))
        others = [k for k in (f"job:o{i}" for i in range(20)) if k != key]
        other_waits = [asyncio.create_task(fa.wait_for_value(a, k, 1, 30)) for k in others]
        await until(lambda: a.num_delayed == 2 + len(others))
        victim.kill()
        # Published while a's subscription is moving: caught up by its re-read.
        for other in others:
            fb.advance(other, 1)
        new = await asyncio.to_thread(cluster.wait_promoted, victim, f"{name}:value:{key}")
        assert new is not victim
        async with asyncio.timeout(10):
            assert await short_wait is None  # its deadline held through the failover
        await fb.advance_confirmed(key, 1, timeout=20)
        async with asyncio.timeout(20):
            assert await long_wait == 1.0
            assert set(await asyncio.gather(*other_waits)) == {1.0}
        assert await stored(cluster, name, key) == 1.0
        await until(lambda: fa.stats().failovers == 1)  # its subscription moved, once
        stats = fa.stats()
        assert stats.resubscribes >= 1 and stats.connected and a.num_delayed == 0


async def test_master_killed_mid_storm_keeps_every_replica_confirmed_advance(
    cluster: Cluster,
) -> None:
    keys = [f"k{i}" for i in range(30)]
    rounds = 10
    async with members(cluster, min_replicas=1, replica_timeout=0.5) as (a, fa, fb, name):
        waits = [asyncio.create_task(fa.wait_for_value(a, key, rounds, 60)) for key in keys]
        await until(lambda: a.num_delayed == len(keys))
        victim = await asyncio.to_thread(cluster.master_of, f"{name}:value:{keys[0]}")
        storm = Storm(fb, keys, rounds)
        await until(lambda: len(storm.confirmed) >= len(keys) // 2)  # the storm is under way
        victim.kill()
        await asyncio.to_thread(cluster.wait_promoted, victim, f"{name}:value:{keys[0]}")
        await storm.check(lambda key: stored(cluster, name, key), waits, a)
