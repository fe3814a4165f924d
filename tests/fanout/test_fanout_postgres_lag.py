"""A lagging PostgreSQL standby promoted when the primary dies: what the operators' page
promises, exactly.

With asynchronous replication a confirmed advance the standby had not received is lost in
the failover: the members that were notified completed their waits (once), the promoted
standby holds the older value, a wait that begins after it reads that value (and waits for
the key to be advanced again, or for its deadline). What the standby had received is kept,
even when it had not replayed it yet. With synchronous replication a confirmed advance
waits while the standby receives nothing, and none is lost.
"""

from __future__ import annotations

import asyncio

from fanout_support import until
from pg_support import ReplicatedPair
from test_fanout_postgres_standby import PATIENCE, members, parked, stored


async def test_asynchronous_replication_loses_what_the_standby_never_received(
    replicated: ReplicatedPair,
) -> None:
    a, b, fa, fb = members(replicated)
    kept = [f"kept:{i}" for i in range(20)]
    lost = [f"lost:{i}" for i in range(20)]
    async with a, b, fa, fb:
        for key in kept:
            await fb.advance_confirmed(key, 1, timeout=PATIENCE)
        await fb.advance_confirmed("raised", 1, timeout=PATIENCE)
        await asyncio.to_thread(replicated.caught_up)
        notified = await parked(fa, a, lost)
        await asyncio.to_thread(replicated.stop_receiving)
        # Confirmed by the primary alone: the standby never receives them.
        for key in lost:
            await fb.advance_confirmed(key, 1, timeout=PATIENCE)
        await fb.advance_confirmed("raised", 5, timeout=PATIENCE)
        async with asyncio.timeout(PATIENCE):  # notified before the primary died: completed
            assert await asyncio.gather(*notified) == [1.0] * len(lost)
        assert a.stats().completed == len(lost)
        await asyncio.to_thread(replicated.fail_over)
        await until(lambda: fa.stats().failovers == 1 and fb.stats().failovers == 1)
        assert await stored(replicated, fa.table) == {**dict.fromkeys(kept, 1.0), "raised": 1.0}
        # A wait that begins now reads the promoted standby: what it kept completes at once,
        # what it lost waits for its deadline, or for the key to be advanced again.
        async with asyncio.timeout(PATIENCE):
            assert await asyncio.gather(
                *(fa.wait_for_value(a, key, 1, PATIENCE) for key in kept)
            ) == [1.0] * len(kept)
            assert await fa.wait_for_value(a, "raised", 1, PATIENCE) == 1.0
            assert await fa.wait_for_value(a, "raised", 5, 0.3) is None
            assert (
                await asyncio.gather(*(fa.wait_for_value(a, key, 1, 0.3) for key in lost[:10]))
                == [None] * 10
            )
            again = await parked(fa, a, lost[10:])
            for key in lost[10:]:
                await fb.advance_confirmed(key, 2, timeout=PATIENCE)
            assert await asyncio.gather(*again) == [2.0] * 10
        stats = a.stats()
        assert (stats.completed, stats.expired, a.num_delayed) == (
            len(lost) + len(kept) + 1 + 10,
            1 + 10,
            0,
        )


async def test_what_the_standby_received_but_had_not_replayed_is_kept(
    replicated: ReplicatedPair,
) -> None:
    a, b, fa, fb = members(replicated)
    keys = [f"received:{i}" for i in range(50)]
    async with a, b, fa, fb:
        await fb.advance_confirmed("before", 1, timeout=PATIENCE)
        await asyncio.to_thread(replicated.caught_up)
        replicated.standby.sql("SELECT pg_wal_replay_pause()")
        try:
            for key in keys:
                await fb.advance_confirmed(key, 1, timeout=PATIENCE)
            # Received and flushed by the standby, not replayed: a read there misses them.
            flushed = "SELECT pg_last_wal_receive_lsn() >= '{lsn}'::pg_lsn"
            lsn = replicated.primary.sql("SELECT pg_current_wal_lsn()")
            await until(lambda: replicated.standby.sql(flushed.format(lsn=lsn)) == "t")
            unreplayed = f"SELECT count(*) FROM {fa.table} WHERE key LIKE 'received:%'"
            assert replicated.standby.sql(unreplayed) == "0"
            waits = await parked(fa, a, [f"later:{i}" for i in range(5)])
            await asyncio.to_thread(replicated.fail_over)  # promotion replays it all first
        finally:
            if replicated.standby.proc is not None and replicated.failovers == 0:
                replicated.standby.sql("SELECT pg_wal_replay_resume()")
        assert await stored(replicated, fa.table) == dict.fromkeys(["before", *keys], 1.0)
        async with asyncio.timeout(PATIENCE):
            assert await asyncio.gather(
                *(fa.wait_for_value(a, key, 1, PATIENCE) for key in keys)
            ) == [1.0] * len(keys)
            for i in range(5):
                fb.advance(f"later:{i}", 1)
            assert await asyncio.gather(*waits) == [1.0] * 5
        assert (a.stats().completed, a.num_delayed) == (len(keys) + 5, 0)


async def test_synchronous_replication_holds_a_confirmed_advance_while_the_standby_lags(
    replicated: ReplicatedPair,
) -> None:
    replicated.ensure(sync=True)
    a, b, fa, fb = members(replicated)
    async with a, b, fa, fb:
        (waiting,) = await parked(fa, a, ["held"])
        await fb.advance_confirmed("synced", 1, timeout=PATIENCE)
        await asyncio.to_thread(replicated.stop_receiving)
        confirming = asyncio.create_task(fb.advance_confirmed("held", 1, timeout=PATIENCE))
        await asyncio.sleep(0.5)
        # The primary committed locally and waits for the standby: nobody is told yet.
        assert not confirming.done() and not waiting.done()
        # The primary dies with the commit the standby never received; the member sends the
        # batch again to the promoted standby, and only then confirms.
        await asyncio.to_thread(replicated.fail_over)
        async with asyncio.timeout(PATIENCE):
            assert await confirming == 0  # b watches nothing
            assert await waiting == 1.0
        assert await stored(replicated, fa.table) == {"synced": 1.0, "held": 1.0}
        assert fb.stats().publish_failures >= 1 and fb.stats().publish_errors == 0
        assert (a.stats().completed, a.num_delayed) == (1, 0)
