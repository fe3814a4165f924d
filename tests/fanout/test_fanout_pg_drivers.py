"""advance_in on the caller's own psycopg 3 connection and SQLAlchemy asyncio connection or
session (on asyncpg and on psycopg), against the real server: the same semantics as on
asyncpg (commit, rollback, a failure between the two writes, a process that dies before
COMMIT, bad input before anything is sent)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from pg_support import PostgresServer, admin, fresh, pair, parked
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from purgatory_aio.fanout import FanoutUnavailable, PostgresFanout

PATIENCE = 15.0


@dataclass
class Session:
    """One of the caller's connections, as each driver spells it."""

    conn: Any  # what advance_in takes
    transaction: Callable[[], AbstractAsyncContextManager[Any]]
    execute: Callable[[str], Awaitable[Any]]
    pid: int


@asynccontextmanager
async def psycopg_session(url: str) -> AsyncIterator[Session]:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        pid = conn.info.backend_pid
        yield Session(conn, conn.transaction, conn.execute, pid)
    finally:
        await conn.close()


def sqlalchemy_session(driver: str, kind: str) -> Callable[[str], Any]:
    @asynccontextmanager
    async def opened(url: str) -> AsyncIterator[Session]:
        engine = create_async_engine(url.replace("postgresql://", f"postgresql+{driver}://", 1))
        try:
            async with engine.connect() as connection:
                target: Any = connection
                if kind == "session":
                    target = AsyncSession(bind=connection)

                async def execute(sql: str) -> Any:
                    return await target.execute(text(sql))

                # Each transaction() block commits at its end, or rolls back on an exception.
                pid = (await connection.execute(text("SELECT pg_backend_pid()"))).scalar_one()
                await connection.commit()
                yield Session(target, target.begin, execute, pid)
        finally:
            await engine.dispose()

    return opened


SESSIONS = {
    "psycopg": psycopg_session,
    "sqlalchemy-asyncpg-connection": sqlalchemy_session("asyncpg", "connection"),
    "sqlalchemy-psycopg-session": sqlalchemy_session("psycopg", "session"),
}


@pytest.fixture(params=list(SESSIONS))
def session(request: pytest.FixtureRequest) -> Callable[[str], Any]:
    return SESSIONS[request.param]  # type: ignore[no-any-return]


async def test_commit_rollback_and_a_failure_between_the_two_writes(
    postgres: PostgresServer, session: Callable[[str], Any]
) -> None:
    a, b, fa, fb = pair(postgres, "drivers")
    orders = fresh("orders")
    async with a, b, fa, fb, admin(postgres) as conn, session(postgres.url) as mine:
        await conn.execute(f"CREATE TABLE {orders} (id text PRIMARY KEY, version bigint)")
        await conn.execute(f"INSERT INTO {orders} VALUES ('o1', 0)")
        here, there = await parked(fa, a, "o1"), await parked(fb, b, "o1")
        # Rolled back by an exception in the handler, and by a failing statement after it.
        with pytest.raises(RuntimeError, match="handler failed"):
            async with mine.transaction():
                await mine.execute(f"UPDATE {orders} SET version = 1")
                await fa.advance_in(mine.conn, "o1", 1)
                raise RuntimeError("the handler failed after the advance")
        with pytest.raises(Exception, match="duplicate key"):
            async with mine.transaction():
                await fa.advance_in(mine.conn, "o1", 1)
                await mine.execute(f"INSERT INTO {orders} VALUES ('o1', 5)")
        await asyncio.sleep(0.2)
        assert not here.done() and not there.done()
        assert await conn.fetchval(f"SELECT count(*) FROM {fa.table}") == 0
        # Committed: heard by every member, this one included, only once it commits.
        async with mine.transaction():
            await mine.execute(f"UPDATE {orders} SET version = 1")
            await fa.advance_in(mine.conn, "o1", 1)
            await asyncio.sleep(0.2)
            assert not here.done() and not there.done()
        async with asyncio.timeout(PATIENCE):
            assert await here == 1.0 and await there == 1.0
        assert await conn.fetchval(f"SELECT version FROM {orders}") == 1


async def test_a_process_that_dies_before_commit_leaves_nothing_to_hear(
    postgres: PostgresServer, session: Callable[[str], Any]
) -> None:
    a, b, fa, fb = pair(postgres, "drivers_crash")
    async with a, b, fa, fb, admin(postgres) as conn:
        wait = await parked(fb, b, "o1")
        with pytest.raises(Exception):  # noqa: B017 - each driver says it its own way
            async with session(postgres.url) as mine, mine.transaction():
                await fa.advance_in(mine.conn, "o1", 1)
                assert await conn.fetchval("SELECT pg_terminate_backend($1)", mine.pid)
        await asyncio.sleep(0.2)
        assert not wait.done()
        assert await conn.fetchval(f"SELECT count(*) FROM {fa.table}") == 0
        wait.cancel()
        assert fa.stats().connected and fb.stats().connected


async def test_bad_input_and_a_missing_table_leave_the_transaction_usable(
    postgres: PostgresServer, session: Callable[[str], Any]
) -> None:
    fanout = PostgresFanout(postgres.url, prefix=fresh("drivers_bad"))  # never started
    async with session(postgres.url) as mine:
        async with mine.transaction():
            for key, value in [("", 1), ("k\x00", 1), ("k", float("nan")), ("k", "1")]:
                with pytest.raises((TypeError, ValueError)):
                    await fanout.advance_in(mine.conn, key, value)  # type: ignore[arg-type]
            await mine.execute("SELECT 1")  # nothing was sent: still usable
        with pytest.raises(FanoutUnavailable, match="does not exist"):
            async with mine.transaction():
                await fanout.advance_in(mine.conn, "k", 1)


async def test_connections_advance_in_cannot_use_are_refused(postgres: PostgresServer) -> None:
    fanout = PostgresFanout(postgres.url, prefix=fresh("drivers_type"))
    with (
        psycopg.connect(postgres.url) as blocking,  # not an AsyncConnection
        pytest.raises(TypeError, match="psycopg AsyncConnection"),
    ):
        await fanout.advance_in(blocking, "k", 1)
    for wrong in (object(), postgres.url, None):
        with pytest.raises(TypeError, match="conn must be"):
            await fanout.advance_in(wrong, "k", 1)
