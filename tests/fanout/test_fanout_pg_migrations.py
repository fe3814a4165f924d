"""An operator's migrations on the fan-out's table while members publish and read, each
statement under a lock timeout that must not fire: ALTER, TRUNCATE and DROP go through, the
members carry on (re-creating the table, or, with ``create=False``, waiting for the
migration that re-creates it) and no acknowledged advance is lost."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from fanout_support import until
from pg_support import PostgresServer, admin, fresh

from purgatory_aio import Purgatory
from purgatory_aio.fanout import FanoutUnavailable, PostgresFanout
from purgatory_aio.fanout.postgres_schema import schema_ddl

PATIENCE = 15.0


async def busy(fa: PostgresFanout, fb: PostgresFanout, a: Purgatory, stop: asyncio.Event) -> int:
    """fb publishes advances and fa reads stored values (a short wait on a fresh key each
    time) until ``stop``; how many rounds."""
    for n in itertools.count():
        if stop.is_set():
            return n
        fb.advance(f"storm:{n}", 1)
        await fa.wait_for_value(a, f"read:{n}", 1, 0.01)


async def heard(fa: PostgresFanout, fb: PostgresFanout, a: Purgatory, key: str) -> None:
    wait = asyncio.create_task(fa.wait_for_value(a, key, 1, 60))
    await until(lambda: a.num_delayed >= 1)
    await fb.advance_confirmed(key, 1, timeout=PATIENCE)
    async with asyncio.timeout(PATIENCE):
        assert await wait == 1.0


async def test_alter_truncate_and_drop_go_through_while_members_publish_and_read(
    postgres: PostgresServer,
) -> None:
    prefix = fresh("migrate")
    a, b = Purgatory("a"), Purgatory("b")
    fa = PostgresFanout(postgres.url, a, prefix=prefix)
    fb = PostgresFanout(postgres.url, b, prefix=prefix)
    async with a, b, fa, fb, admin(postgres) as conn:
        await conn.execute("SET lock_timeout = '3s'")
        stop = asyncio.Event()
        load = asyncio.create_task(busy(fa, fb, a, stop))
        for statement in (
            f"ALTER TABLE {fa.table} ADD COLUMN note text",
            f"ALTER TABLE {fa.table} ALTER COLUMN note SET DEFAULT 'x'",
            f"ALTER TABLE {fa.table} DROP COLUMN note",
            f"TRUNCATE {fa.table}",
            f"DROP TABLE {fa.table}",  # the publisher makes it again
        ):
            await asyncio.sleep(0.1)  # in the middle of the load
            await conn.execute(statement)  # LockNotAvailableError if the lock timeout fired
        await asyncio.sleep(0.1)
        stop.set()
        async with asyncio.timeout(PATIENCE):
            assert await load > 0
        await heard(fa, fb, a, "after")
        assert await conn.fetchval(f"SELECT value FROM {fa.table} WHERE key = 'after'") == 1.0
        assert fb.stats().publish_errors == 0 and fa.stats().connected


async def test_a_table_dropped_under_create_false_members_waits_for_the_migration(
    postgres: PostgresServer,
) -> None:
    prefix = fresh("migrate_nc")
    async with admin(postgres) as conn:
        await conn.execute(schema_ddl(prefix=prefix))
    a, b = Purgatory("a"), Purgatory("b")
    options: dict[str, Any] = {"prefix": prefix, "create": False}
    fa = PostgresFanout(postgres.url, a, **options)
    fb = PostgresFanout(postgres.url, b, **options)
    async with a, b, fa, fb, admin(postgres) as conn:
        await conn.execute("SET lock_timeout = '3s'")
        await heard(fa, fb, a, "before")
        await conn.execute(f"DROP TABLE {fa.table}")
        # Nothing is created at run time: the acknowledgement is refused, not faked.
        with pytest.raises(FanoutUnavailable, match="not stored"):
            await fb.advance_confirmed("meanwhile", 1, timeout=0.5)
        assert await conn.fetchval("SELECT to_regclass($1)", fa.table) is None
        await conn.execute(schema_ddl(prefix=prefix))  # the migration runs again
        await heard(fa, fb, a, "after")
        assert fb.stats().connected
