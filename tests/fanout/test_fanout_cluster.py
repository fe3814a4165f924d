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
import structlog
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
from purgatory_aio.fanout import FanoutUnavailable, RedisFanout, fanout_from_url
from purgatory_aio.fanout._redis import ClusterBackend, parse_cluster_url


@contextlib.asynccontextmanager
async def members(
    cluster: Cluster,
    first: RedisServer | None = None,
    name: str = "",
    a_options: dict[str, Any] | None = None,
    **b_options: Any,
) -> AsyncIterator[tuple[Purgatory, RedisFanout, RedisFanout, str]]:
    """Two processes on the cluster under prefix ``name`` (else a fresh one): ``a`` waits
    (subscribed on ``first``, with ``a_options``), ``b`` publishes (with ``b_options``);
    yields a's purgatory, both fan-outs and the prefix."""
    name = name or fresh()
    a, b = Purgatory("a"), Purgatory("b")
    fa = RedisFanout(cluster.url(first), a, prefix=name, connect_timeout=1.0, **(a_options or {}))
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


# -- live resharding ----------------------------------------------------------------------------


async def test_live_resharding_takes_the_ask_and_moved_paths_and_loses_nothing(
    cluster: Cluster, warnings_logged: structlog.testing.LogCapture
) -> None:
    keys = [f"r{i}" for i in range(12)]
    async with members(cluster, min_replicas=1) as (a, fa, fb, name):
        full = {key: f"{name}:value:{key}" for key in keys}
        slots = {key: await asyncio.to_thread(cluster.slot_of, full[key]) for key in keys}
        asked, moved = keys[0], next(key for key in keys if slots[key] != slots[keys[0]])
        await asyncio.gather(*(fb.advance_confirmed(key, 1, timeout=5) for key in keys))
        waits = [asyncio.create_task(fa.wait_for_value(a, key, 3, 60)) for key in keys]
        await until(lambda: a.num_delayed == len(keys) and fa.stats().reads_pending == 0)

        # ASK: the slot is migrating and its keys are on the target already. The source
        # answers ASK for them until the move is finished; the confirmation waits for it.
        source = await asyncio.to_thread(cluster.master_of, full[asked])
        target = next(
            node for node in await asyncio.to_thread(cluster.masters) if node is not source
        )
        failures = fb.stats().publish_failures
        await asyncio.to_thread(cluster.begin_move, slots[asked], target)
        try:
            confirming = asyncio.create_task(fb.advance_confirmed(asked, 2, timeout=30))
            await until(lambda: fb.stats().publish_failures > failures)
            # A wait admitted meanwhile reads the value where it is now (redis-py asks there).
            assert await fa.wait_for_value(a, asked, 1, 5) == 1.0
        finally:
            await asyncio.to_thread(cluster.finish_move, slots[asked], target)
        async with asyncio.timeout(10):
            await confirming

        # MOVED: another slot moved at once; both members still place it on its old master.
        source = await asyncio.to_thread(cluster.master_of, full[moved])
        target = next(
            node for node in await asyncio.to_thread(cluster.masters) if node is not source
        )
        await asyncio.to_thread(cluster.move, slots[moved], target)
        assert await fa.wait_for_value(a, moved, 1, 5) == 1.0  # the read follows MOVED
        failures = fb.stats().publish_failures
        await fb.advance_confirmed(moved, 2, timeout=10)
        assert fb.stats().publish_failures > failures  # the batch met MOVED and was sent again

        # Every wait completes once, with the last value; every confirmed value is held.
        await asyncio.gather(*(fb.advance_confirmed(key, 3, timeout=10) for key in keys))
        async with asyncio.timeout(10):
            assert await asyncio.gather(*waits) == [3.0] * len(keys)
        assert [await stored(cluster, name, key) for key in keys] == [3.0] * len(keys)
        assert a.stats().completed == len(keys) + 2 and a.num_delayed == 0
        assert fa.stats().failovers == 0  # the subscription has no slot: it never moved
    said = " ".join(
        e["error"] for e in warnings_logged.entries if e["event"] == "fanout_engine_down"
    )
    assert "the cluster is changing: ASK" in said and "the cluster is changing: MOVED" in said


async def test_slots_moved_back_and_forth_mid_storm_keep_every_confirmed_advance(
    cluster: Cluster,
) -> None:
    keys = [f"m{i}" for i in range(20)]
    rounds = 100  # long enough to run through every move
    async with members(cluster, min_replicas=1, replica_timeout=1.0) as (a, fa, fb, name):
        waits = [asyncio.create_task(fa.wait_for_value(a, key, rounds, 60)) for key in keys]
        await until(lambda: a.num_delayed == len(keys))
        slots = sorted(
            {await asyncio.to_thread(cluster.slot_of, f"{name}:value:{k}") for k in keys}
        )
        masters = await asyncio.to_thread(cluster.masters)
        storm = Storm(fb, keys, rounds)
        await until(lambda: len(storm.confirmed) >= len(keys) // 3)
        # Whether a batch meets a move depends on the machine's pace (the storm may be done
        # first): the resharding test above asserts ASK and MOVED themselves; this one holds
        # the invariants through many moves.
        for _ in range(2):  # eight slots of storm keys to another master, and on again
            for slot in slots[:8]:
                owner = await asyncio.to_thread(cluster.owner, slot)
                target = next(master for master in masters if master is not owner)
                await asyncio.to_thread(cluster.move, slot, target)
        await storm.check(lambda key: stored(cluster, name, key), waits, a)
        assert fa.stats().failovers == 0


# -- frozen nodes ---------------------------------------------------------------------------------


async def keys_of(
    cluster: Cluster, prefix: str, node: RedisServer, count: int, own: bool
) -> list[str]:
    """``count`` keys whose master is ``node`` (``own``) or is another node."""
    found: list[str] = []
    for i in range(1000):
        key = f"f{i}"
        master = await asyncio.to_thread(cluster.master_of, f"{prefix}:value:{key}")
        if (master is node) == own:
            found.append(key)
            if len(found) == count:
                return found
    raise AssertionError("no such keys")


async def test_a_frozen_subscription_node_is_left_and_events_flow_again(
    cluster: Cluster, warnings_logged: structlog.testing.LogCapture
) -> None:
    """The subscription's node frozen: unanswered probes move the subscription within
    about ``connect_timeout`` (one second here), and the re-read catches up; the frozen
    master's own keys follow once its replica is promoted."""
    name = fresh()
    victim = (await asyncio.to_thread(cluster.masters))[0]
    elsewhere = await keys_of(cluster, name, victim, 5, own=False)
    (on_victim,) = await keys_of(cluster, name, victim, 1, own=True)
    # No safety-net resync within the test: only the subscription moving delivers.
    quiet = {"resync_interval": 3600.0}
    async with members(cluster, first=victim, name=name, a_options=quiet) as (a, fa, fb, _):
        waits = [asyncio.create_task(fa.wait_for_value(a, key, 1, 60)) for key in elsewhere]
        victim_wait = asyncio.create_task(fa.wait_for_value(a, on_victim, 1, 60))
        short = asyncio.create_task(fa.wait_for_value(a, "short", 1, 1.0))
        await until(lambda: a.num_delayed == len(elsewhere) + 2)
        await until(lambda: fa.stats().reads_pending == 0)
        await asyncio.to_thread(cluster.freeze, victim)
        try:
            # Stored on live masters and published while a's node is frozen.
            await asyncio.gather(*(fb.advance_confirmed(key, 1, timeout=5) for key in elsewhere))
            async with asyncio.timeout(15):
                assert await asyncio.gather(*waits) == [1.0] * len(elsewhere)
                assert await short is None  # its deadline held
            await asyncio.to_thread(cluster.wait_promoted, victim, f"{name}:value:{on_victim}")
            await fb.advance_confirmed(on_victim, 1, timeout=20)
            async with asyncio.timeout(15):
                assert await victim_wait == 1.0
            assert fa.stats().failovers == 1 and a.num_delayed == 0
        finally:
            await asyncio.to_thread(cluster.thaw, victim)
    unanswered = [
        e for e in warnings_logged.entries if e["event"] == "fanout_subscription_unanswered"
    ]
    # Logged by each member subscribed there (``b`` may be too), and only about that node.
    assert {e["node"] for e in unanswered} == {f"127.0.0.1:{victim.port}"}


async def test_a_frozen_master_mid_storm_keeps_every_replica_confirmed_advance(
    cluster: Cluster,
) -> None:
    name, rounds = fresh(), 10
    keys = [f"k{i}" for i in range(30)]
    victim = await asyncio.to_thread(cluster.master_of, f"{name}:value:{keys[0]}")
    listener = next(n for n in await asyncio.to_thread(cluster.masters) if n is not victim)
    options = {"min_replicas": 1, "replica_timeout": 0.5}
    async with members(cluster, first=listener, name=name, **options) as (a, fa, fb, _):
        waits = [asyncio.create_task(fa.wait_for_value(a, key, rounds, 60)) for key in keys]
        short = asyncio.create_task(fa.wait_for_value(a, "short", 1, 1.0))
        await until(lambda: a.num_delayed == len(keys) + 1)
        storm = Storm(fb, keys, rounds)
        await until(lambda: len(storm.confirmed) >= len(keys) // 2)
        await asyncio.to_thread(cluster.freeze, victim)
        try:
            await asyncio.to_thread(cluster.wait_promoted, victim, f"{name}:value:{keys[0]}")
            async with asyncio.timeout(10):
                assert await short is None
            await storm.check(lambda key: stored(cluster, name, key), waits, a)
        finally:
            await asyncio.to_thread(cluster.thaw, victim)


# -- several nodes at once, and a failover during admissions ---------------------------------------


async def test_two_masters_killed_at_once_wait_for_the_operator_and_lose_nothing_confirmed(
    cluster: Cluster,
) -> None:
    """Two masters of three dead: no majority is left to elect their replicas, so their slots
    stay unavailable (a clear FanoutUnavailable, deadlines kept) until an operator promotes the
    replicas (CLUSTER FAILOVER TAKEOVER); then every replica-confirmed advance is there."""
    name, rounds = fresh(), 10
    keys = [f"k{i}" for i in range(30)]
    victims = (await asyncio.to_thread(cluster.masters))[:2]
    replicas = [await asyncio.to_thread(cluster.replica_of, victim) for victim in victims]
    (doomed,) = await keys_of(cluster, name, victims[1], 1, own=True)
    async with members(cluster, first=victims[0], name=name, min_replicas=1) as (a, fa, fb, _):
        waits = [asyncio.create_task(fa.wait_for_value(a, key, rounds, 60)) for key in keys]
        short = asyncio.create_task(fa.wait_for_value(a, "short", 1, 1.0))
        await until(lambda: a.num_delayed == len(keys) + 1)
        storm = Storm(fb, keys, rounds)
        await until(lambda: len(storm.confirmed) >= len(keys) // 2)
        for victim in victims:  # the subscription's node among them
            victim.kill()
        with pytest.raises(FanoutUnavailable) as caught:
            await fb.advance_confirmed(doomed, rounds + 1, timeout=3)
        assert "\n" not in str(caught.value)
        async with asyncio.timeout(10):
            assert await short is None  # its deadline held
        for replica in replicas:
            await asyncio.to_thread(command, replica.port, "CLUSTER", "FAILOVER", "TAKEOVER")
        await asyncio.to_thread(cluster.wait_serving)
        await storm.check(lambda key: stored(cluster, name, key), waits, a)
        await until(lambda: fa.stats().failovers == 1)


async def test_a_slot_range_with_no_node_left_is_unavailable_not_a_hang(cluster: Cluster) -> None:
    name = fresh()
    victim = (await asyncio.to_thread(cluster.masters))[1]
    replica = await asyncio.to_thread(cluster.replica_of, victim)
    (doomed,) = await keys_of(cluster, name, victim, 1, own=True)
    (alive,) = await keys_of(cluster, name, victim, 1, own=False)
    listener = next(n for n in await asyncio.to_thread(cluster.masters) if n is not victim)
    async with members(cluster, first=listener, name=name, min_replicas=1) as (a, fa, fb, _):
        await fb.advance_confirmed(alive, 1, timeout=5)
        long_wait = asyncio.create_task(fa.wait_for_value(a, doomed, 2, 60))
        short = asyncio.create_task(fa.wait_for_value(a, alive, 2, 1.0))
        await until(lambda: a.num_delayed == 2 and fa.stats().reads_pending == 0)
        replica.kill()
        victim.kill()
        # Its slots have no node: the whole cluster is down (full coverage) and every
        # confirmation fails, on that range first, then on another master's.
        for key in (doomed, alive):
            with pytest.raises(FanoutUnavailable) as caught:
                await fb.advance_confirmed(key, 2, timeout=3)
            assert "\n" not in str(caught.value)
        async with asyncio.timeout(10):
            assert await short is None  # deadlines hold throughout
        assert not long_wait.done()
        # Both nodes back (empty: no persistence): the range serves again, the wait completes.
        await asyncio.to_thread(cluster.wait_healthy)
        await fb.advance_confirmed(doomed, 2, timeout=20)
        async with asyncio.timeout(20):
            assert await long_wait == 2.0
        assert a.num_delayed == 0


async def test_a_master_killed_while_waits_are_admitted_reads_every_value(cluster: Cluster) -> None:
    keys = [f"adm{i}" for i in range(200)]
    async with members(cluster, min_replicas=1, replica_timeout=2.0) as (a, fa, fb, name):
        await asyncio.gather(*(fb.advance_confirmed(key, 5, timeout=5) for key in keys))
        victim = await asyncio.to_thread(cluster.master_of, f"{name}:value:{keys[0]}")
        # Each admission reads its key's stored value: half of them as the master dies.
        waits = [asyncio.create_task(fa.wait_for_value(a, key, 5, 60)) for key in keys[:100]]
        await asyncio.sleep(0)
        victim.kill()
        waits += [asyncio.create_task(fa.wait_for_value(a, key, 5, 60)) for key in keys[100:]]
        async with asyncio.timeout(30):
            assert await asyncio.gather(*waits) == [5.0] * len(keys)
        assert a.num_delayed == 0
