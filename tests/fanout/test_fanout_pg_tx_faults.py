"""The advance in the caller's transaction under faults, against the real server: the server
crashing before COMMIT, the advance's own statement failing inside the transaction, two
transactions racing on one key. The rule each time: waiters hear of exactly what committed."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from fanout_support import until
from pg_support import PostgresServer, admin, fresh, pair, parked

from purgatory_aio.fanout import FanoutUnavailable

PATIENCE = 15.0


async def test_a_server_crash_before_commit_is_never_heard_and_the_members_recover(
    postgres: PostgresServer,
) -> None:
    a, b, fa, fb = pair(postgres, "tx_server_crash")
    async with a, b, fa, fb:
        wait = await parked(fb, b, "o1")
        conn = await asyncpg.connect(postgres.url, timeout=10)
        try:
            transaction = conn.transaction()
            await transaction.start()
            await fa.advance_in(conn, "o1", 1)
            postgres.kill()  # between the advance and COMMIT
            with pytest.raises((OSError, asyncpg.PostgresError, asyncpg.InterfaceError)):
                await transaction.commit()
        finally:
            conn.terminate()
        postgres.start()
        await until(lambda: fb.stats().connected and fb.stats().resubscribes >= 1)
        await asyncio.sleep(0.2)
        assert not wait.done()  # nothing committed, nothing heard
        async with admin(postgres) as check:
            assert await check.fetchval(f"SELECT count(*) FROM {fa.table}") == 0
        await fa.advance_confirmed("o1", 1, timeout=PATIENCE)
        async with asyncio.timeout(PATIENCE):
            assert await wait == 1.0


async def test_an_advance_that_fails_in_the_transaction_takes_the_callers_write_with_it(
    postgres: PostgresServer,
) -> None:
    """The fan-out's table dropped under a running transaction's feet: advance_in raises
    FanoutUnavailable and the transaction is aborted, so the caller's write rolls back too;
    the connection is usable after the rollback."""
    a, b, fa, fb = pair(postgres, "tx_fails")
    orders = fresh("orders")
    async with a, b, fa, fb, admin(postgres) as conn:
        await conn.execute(f"CREATE TABLE {orders} (id text PRIMARY KEY, version bigint)")
        await conn.execute(f"INSERT INTO {orders} VALUES ('o1', 0)")
        await conn.execute(f"DROP TABLE {fa.table}")
        with pytest.raises(FanoutUnavailable, match="does not exist"):
            async with conn.transaction():
                await conn.execute(f"UPDATE {orders} SET version = 1")
                await fa.advance_in(conn, "o1", 1)
        assert await conn.fetchval(f"SELECT version FROM {orders}") == 0
        # The members make the table again at their next publish: the next advance works.
        wait = await parked(fb, b, "o1")
        await fa.advance_confirmed("o1", 1, timeout=PATIENCE)
        async with conn.transaction():
            await conn.execute(f"UPDATE {orders} SET version = 2")
            await fa.advance_in(conn, "o1", 2)
        async with asyncio.timeout(PATIENCE):
            assert await wait == 1.0
        assert await conn.fetchval(f"SELECT value FROM {fa.table} WHERE key = 'o1'") == 2.0


async def test_racing_transactions_on_one_key_are_heard_only_as_they_commit(
    postgres: PostgresServer,
) -> None:
    """Two handlers advance one key in transactions of their own: the one that rolls back is
    never heard; the lower one committed after the higher one is absorbed (merge by max)."""
    a, b, fa, fb = pair(postgres, "tx_race")
    async with a, b, fa, fb, admin(postgres) as one, admin(postgres) as two:
        low = asyncio.create_task(fb.wait_for_value(b, "k", 3, 60))
        high = asyncio.create_task(fb.wait_for_value(b, "k", 5, 60))
        await until(lambda: b.num_delayed == 2)
        first, second = one.transaction(), two.transaction()
        await first.start()
        await second.start()
        await fa.advance_in(one, "k", 9)
        advancing = asyncio.create_task(fa.advance_in(two, "k", 4))  # waits for one's row lock
        await asyncio.sleep(0.2)
        assert not advancing.done()
        await first.rollback()  # 9 never happened
        await advancing
        await second.commit()
        async with asyncio.timeout(PATIENCE):
            assert await low == 4.0
        assert not high.done()
        await fa.advance_in(one, "k", 2)  # lower than the stored 4, outside a transaction
        await asyncio.sleep(0.2)
        assert await one.fetchval(f"SELECT value FROM {fa.table} WHERE key = 'k'") == 4.0
        assert not high.done()
        high.cancel()
