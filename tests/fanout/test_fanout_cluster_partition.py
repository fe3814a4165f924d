"""A Redis Cluster master partitioned away (frozen with SIGSTOP, its connections left open)
rather than killed: the cluster promotes its replica, the fan-out leaves the silent node for
the new master without a hang, and the thawed node rejoins as a replica."""

from __future__ import annotations

import asyncio
import uuid

from cluster_support import Cluster
from fanout_support import until
from test_fanout_cluster import stored

from purgatory_aio import Purgatory
from purgatory_aio.fanout import RedisFanout

PATIENCE = 30.0
#: What a confirmed advance may take here: the cluster's own failover (a second to judge the
#: node failed, then the election), and one command timeout (``connect_timeout``, 1 s) on
#: the frozen node before the batch goes to the new master, with room to spare.
CONFIRM_WITHIN = 10.0


async def test_a_frozen_master_is_left_for_its_promoted_replica(cluster: Cluster) -> None:
    name, key = f"c{uuid.uuid4().hex[:10]}", "job:frozen"
    victim = await asyncio.to_thread(cluster.master_of, f"{name}:value:{key}")
    a, b = Purgatory("a"), Purgatory("b")
    # Both name the node about to freeze first: ``a`` subscribes there (and probes its idle
    # subscription often), ``b`` asks it about the slots first.
    fa = RedisFanout(cluster.url(victim), a, prefix=name, connect_timeout=1.0, resync_interval=3)
    fb = RedisFanout(cluster.url(victim), b, prefix=name, connect_timeout=1.0)
    async with a, b, fa, fb:
        waiting = asyncio.create_task(fa.wait_for_value(a, key, 1, PATIENCE * 2))
        expiring = asyncio.create_task(fa.wait_for_value(a, "job:never", 1, 1.0))
        await until(lambda: a.num_delayed == 2)
        cluster.freeze(victim)
        try:
            # Sent to the frozen master: no answer; the command times out, the slots are read
            # again (the frozen node named first: its question times out too), and the batch
            # goes to the new master once the cluster has promoted the replica.
            confirming = asyncio.create_task(fb.advance_confirmed(key, 1, timeout=CONFIRM_WITHIN))
            new = await asyncio.to_thread(cluster.wait_promoted, victim, f"{name}:value:{key}")
            assert new is not victim
            async with asyncio.timeout(PATIENCE):
                await confirming
                assert await expiring is None  # its deadline held while the node was silent
                assert await waiting == 1.0
            assert await stored(cluster, name, key) == 1.0
            await until(lambda: fa.stats().failovers >= 1)  # the subscription left the node
        finally:
            cluster.thaw(victim)
        # Thawed, the old master learns it was replaced and follows the new one: what it
        # held is not written back over the value confirmed meanwhile.
        await asyncio.to_thread(cluster.wait_healthy)
        assert await stored(cluster, name, key) == 1.0
        assert (a.stats().completed, a.stats().expired, a.num_delayed) == (1, 1, 0)
