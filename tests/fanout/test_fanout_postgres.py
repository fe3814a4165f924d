"""The PostgreSQL backend under attack, against a real server: cut connections, a frozen and
a crashed server, foreign rows and tables, wrong credentials and wrong services."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
import pytest
from fanout_support import RedisServer, free_port, until
from pg_support import PostgresServer, admin, fresh, pair, parked

from purgatory_aio import Purgatory
from purgatory_aio.fanout import FanoutUnavailable, PostgresFanout, fanout_from_url
from purgatory_aio.fanout._base import ABANDON_AFTER
from purgatory_aio.fanout._postgres import (
    LISTEN_APPLICATION,
    MAX_KEY_BYTES,
    READ_APPLICATION,
    WRITE_APPLICATION,
)

PATIENCE = 15.0


async def terminate(server: PostgresServer, application: str) -> int:
    """pg_terminate_backend every fan-out connection of ``application``; how many."""
    async with admin(server) as conn:
        killed: int = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = $1",
            application,
        )
    return killed


async def test_a_terminated_listen_connection_is_re_established_and_caught_up(
    postgres: PostgresServer, loop_errors: list[dict[str, Any]]
) -> None:
    a, b, fa, fb = pair(postgres, "term_listen")
    async with a, b, fa, fb:
        for round_ in range(3):
            waiting = await parked(fa, a, f"gap:{round_}")
            assert await terminate(postgres, LISTEN_APPLICATION) == 2
            # Stored while a's LISTEN connection may be down: the hint can be lost, the
            # value cannot, and the resync after reconnecting reads it.
            await fb.advance_confirmed(f"gap:{round_}", 1, timeout=PATIENCE)
            async with asyncio.timeout(PATIENCE):
                assert await waiting == 1.0
        await until(lambda: fa.stats().resubscribes >= 3 and fa.stats().connected)
        stats = fa.stats()
        assert stats.outages >= 3 and stats.recoveries >= 3
    assert loop_errors == []


async def test_terminating_the_write_connection_mid_storm_loses_no_event(
    postgres: PostgresServer, loop_errors: list[dict[str, Any]]
) -> None:
    a, b, fa, fb = pair(postgres, "term_write", batch=50)
    n = 1500
    async with a, b, fa, fb:
        waits = [asyncio.create_task(fa.wait_for_value(a, f"s:{i}", 1, 60)) for i in range(n)]
        await until(lambda: a.num_delayed == n)
        for i in range(n):
            fb.advance(f"s:{i}", 1)
            if i % 300 == 150:
                await asyncio.sleep(0.005)  # let some batches go
                await terminate(postgres, WRITE_APPLICATION)
        async with asyncio.timeout(PATIENCE * 2):
            assert await asyncio.gather(*waits) == [1.0] * n
        assert a.stats().completed == n
        assert fb.stats().publish_failures >= 1 and fb.stats().publish_errors == 0
    assert loop_errors == []


async def test_a_frozen_server_delays_no_answer_and_no_stop(postgres: PostgresServer) -> None:
    a, b, fa, fb = pair(postgres, "frozen", connect_timeout=0.5)
    async with a, b:
        await fa.start()
        await fb.start()
        later = await parked(fa, a, "after:thaw")
        postgres.freeze()
        try:
            # Admitted at once, expired at its own deadline: the engine is not waited for.
            async with asyncio.timeout(2.0):
                assert await fa.wait_for_value(a, "while:frozen", 1, 0.2) is None
            with pytest.raises(FanoutUnavailable, match=r"within 0\.3 s"):
                async with asyncio.timeout(2.0):
                    await fb.advance_confirmed("never", 1, timeout=0.3)
            fb.advance("after:thaw", 1)  # queued: published once the server answers
        finally:
            postgres.thaw()
        async with asyncio.timeout(PATIENCE):
            assert await later == 1.0
        postgres.freeze()
        try:
            stopping = [fa.stop(flush_timeout=0.2), fb.stop(flush_timeout=0.2)]
            fb.advance("lost:to:the:freeze", 1)
            async with asyncio.timeout(0.2 + 2 * ABANDON_AFTER + 1.0):
                await asyncio.gather(*stopping)
        finally:
            postgres.thaw()
        assert fb.stats().undelivered + fb.stats().publish_dropped >= 1


async def test_a_crashed_server_is_reconnected_to_once_it_restarts(
    postgres: PostgresServer, loop_errors: list[dict[str, Any]]
) -> None:
    a, b, fa, fb = pair(postgres, "crash")
    async with a, b, fa, fb:
        waiting = await parked(fa, a, "job:crash")
        postgres.kill()
        fb.advance("job:crash", 1)
        async with asyncio.timeout(PATIENCE):
            expired = await fa.wait_for_value(a, "job:other", 1, 0.2)
        assert expired is None
        await until(lambda: fb.stats().publish_failures >= 1 and not fa.stats().connected)
        assert not waiting.done()
        postgres.start()
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 1.0
        await until(lambda: fa.stats().connected and fb.stats().connected)
        again = await parked(fa, a, "job:again")
        await fb.advance_confirmed("job:again", 1, timeout=PATIENCE)
        async with asyncio.timeout(PATIENCE):
            assert await again == 1.0
        assert fa.stats().outages >= 1 and fa.stats().recoveries >= 1
    assert loop_errors == []


async def test_every_confirmed_advance_survives_a_crash_in_the_middle_of_a_storm(
    postgres: PostgresServer, loop_errors: list[dict[str, Any]]
) -> None:
    prefix = fresh("confirmed")
    n = 600
    fanout = PostgresFanout(postgres.url, prefix=prefix, subscribe=False, batch=32)
    async with fanout:

        async def confirm(i: int) -> bool:
            try:
                await fanout.advance_confirmed(f"c:{i}", i + 1, timeout=0.5)
            except FanoutUnavailable:
                return False
            return True

        storm = [asyncio.create_task(confirm(i)) for i in range(n)]
        await until(lambda: fanout.stats().published >= n // 4)
        postgres.kill()
        outcomes = await asyncio.gather(*storm)
        postgres.start()
    confirmed = {f"c:{i}": float(i + 1) for i, ok in enumerate(outcomes) if ok}
    assert n // 4 <= len(confirmed) < n
    async with admin(postgres) as conn:
        rows = await conn.fetch(f"SELECT key, value FROM {prefix}_values")
    stored = {row["key"]: row["value"] for row in rows}
    assert {key: stored.get(key) for key in confirmed} == confirmed
    assert loop_errors == []


async def test_starting_against_a_frozen_server_is_one_bounded_error(
    postgres: PostgresServer, loop_errors: list[dict[str, Any]]
) -> None:
    postgres.freeze()
    try:
        fanout = PostgresFanout(postgres.url, connect_timeout=0.3)
        async with asyncio.timeout(0.3 * 2 + 2 * ABANDON_AFTER + 1.0):
            with pytest.raises(FanoutUnavailable, match="no PostgreSQL answer") as caught:
                await fanout.start()
        assert "\n" not in str(caught.value) and postgres.password not in str(caught.value)
    finally:
        postgres.thaw()
    assert loop_errors == []


async def test_a_listen_connection_that_stops_answering_is_replaced(
    postgres: PostgresServer, loop_errors: list[dict[str, Any]]
) -> None:
    a, b, fa, fb = pair(postgres, "probe", health_interval=0.1, command_timeout=0.3)
    async with a, b, fa, fb:
        waiting = await parked(fa, a, "after:probe")
        postgres.freeze()  # the connection stays open; nothing answers the probe
        try:
            # Long enough for a probe (every 0.1 s) to go unanswered (0.3 s) several times;
            # a read in flight may report the outage first, which costs the LISTEN nothing.
            await asyncio.sleep(1.5)
            assert fa.stats().outages >= 1
        finally:
            postgres.thaw()
        await until(lambda: fa.stats().resubscribes >= 1 and fa.stats().connected)
        await fb.advance_confirmed("after:probe", 1, timeout=PATIENCE)
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 1.0
    assert loop_errors == []


async def test_foreign_rows_are_counted_and_raised_past(postgres: PostgresServer) -> None:
    a, b, fa, fb = pair(postgres, "foreign_rows")
    async with a, b, fa, fb:
        async with admin(postgres) as conn:
            await conn.execute(
                f"INSERT INTO {fa.table} (key, value) VALUES "
                "('inf', 'Infinity'), ('neg', '-Infinity'), ('nan', 'NaN')"
            )
        waits = {key: await parked(fa, a, key) for key in ("inf", "neg", "nan")}
        await until(lambda: fa.stats().malformed == 3)
        # Each foreign value is raised past, +Infinity too: an acknowledged advance is
        # stored, and the waits complete.
        for key in ("inf", "neg", "nan"):
            await fb.advance_confirmed(key, 1)
            async with asyncio.timeout(PATIENCE):
                assert await waits[key] == 1.0
        async with admin(postgres) as conn:
            stored = await conn.fetch(f"SELECT key, value FROM {fa.table} ORDER BY key")
        assert {row["key"]: row["value"] for row in stored} == {"inf": 1, "nan": 1, "neg": 1}
        assert fb.stats().publish_errors == 0


async def test_an_event_the_server_refuses_is_counted_and_the_rest_go_on(
    postgres: PostgresServer,
) -> None:
    a, b, fa, fb = pair(postgres, "refusing", batch=64)
    async with a, b, fa, fb:
        async with admin(postgres) as conn:
            await conn.execute(
                f"""CREATE FUNCTION {fa.table}_poison() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.key = 'poison' THEN RAISE EXCEPTION 'not this key'; END IF;
                    RETURN NEW;
                END $$;
                CREATE TRIGGER poison BEFORE INSERT OR UPDATE ON {fa.table}
                FOR EACH ROW EXECUTE FUNCTION {fa.table}_poison();"""
            )
        waits = [await parked(fa, a, f"ok:{i}") for i in range(20)]
        refused = asyncio.create_task(fb.advance_confirmed("poison", 1))
        for i in range(20):
            fb.advance(f"ok:{i}", 1)
        with pytest.raises(FanoutUnavailable, match="not this key"):
            await refused
        async with asyncio.timeout(PATIENCE):
            assert await asyncio.gather(*waits) == [1.0] * 20
        stats = fb.stats()
        assert (stats.publish_errors, stats.published) == (1, 20)


async def test_a_table_of_another_shape_under_the_prefix_is_one_clear_error(
    postgres: PostgresServer,
) -> None:
    prefix = fresh("taken")
    async with admin(postgres) as conn:
        await conn.execute(f"CREATE TABLE {prefix}_values (key text PRIMARY KEY, value text)")
    fanout = PostgresFanout(postgres.url, prefix=prefix)
    with pytest.raises(FanoutUnavailable, match=f"{prefix}_values exists") as caught:
        await fanout.start()
    assert "\n" not in str(caught.value) and postgres.password not in str(caught.value)


async def test_members_starting_together_create_the_table_once(postgres: PostgresServer) -> None:
    prefix = fresh("together")
    members = [PostgresFanout(postgres.url, prefix=prefix) for _ in range(6)]
    try:
        await asyncio.gather(*(member.start() for member in members))
    finally:
        await asyncio.gather(*(member.stop() for member in members))


async def test_wrong_credentials_are_one_line_without_the_password(
    postgres: PostgresServer,
) -> None:
    wrong = postgres.url_as("Wr0ngSecret")
    fanout = PostgresFanout(wrong, connect_timeout=2)
    with pytest.raises(FanoutUnavailable, match="refused the credentials") as caught:
        await fanout.start()
    message = str(caught.value)
    assert "Wr0ngSecret" not in message and "postgres:***@127.0.0.1" in message
    assert "\n" not in message and caught.value.__cause__ is None
    assert not fanout.stats().connected
    via_query = f"postgresql://postgres@127.0.0.1:{postgres.port}/postgres?password=Wr0ngSecret"
    with pytest.raises(FanoutUnavailable) as caught:
        await PostgresFanout(via_query).start()
    assert "Wr0ngSecret" not in str(caught.value)


@contextmanager
def http_lookalike() -> Iterator[int]:
    """A port that answers every connection as an HTTP server would."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    conn.recv(1024)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


async def test_a_url_of_another_service_is_one_clear_line(postgres: PostgresServer) -> None:
    with RedisServer() as redis_server, http_lookalike() as http_port:
        cases = {
            f"postgresql://u:pw@127.0.0.1:{redis_server.port}/db": "is that a PostgreSQL server",
            f"postgresql://u:pw@127.0.0.1:{http_port}/db": "does not answer as PostgreSQL does",
            f"postgresql://u:pw@127.0.0.1:{free_port()}/db": "connection refused",
            f"{postgres.url.rsplit('/', 1)[0]}/nodb": "does not exist",
        }
        for url, cause in cases.items():
            fanout = PostgresFanout(url, connect_timeout=0.5)
            async with asyncio.timeout(0.5 * 2 + 2 * ABANDON_AFTER + 1.0):
                with pytest.raises(FanoutUnavailable, match=cause) as caught:
                    await fanout.start()
            message = str(caught.value)
            assert "\n" not in message and ":pw@" not in message, message
            assert "PostgreSQL at postgresql://" in message


def test_urls_are_checked_before_anything_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PURGATORY_AIO_POSTGRES_URL", raising=False)
    monkeypatch.delenv("PURGATORY_AIO_FANOUT_URL", raising=False)
    with pytest.raises(ValueError, match="PURGATORY_AIO_POSTGRES_URL"):
        PostgresFanout()
    for url, problem in (
        ("http://u:secret@127.0.0.1:5432/db", "not a PostgreSQL URL"),
        ("postgresql://u:secret@127.0.0.1:99999/db", "usable"),
        ("postgresql://u:secret@127.0.0.1:0/db", "port 0"),
        ("postgresql:///db", "names no host"),
        ("postgresql:u:secret@127.0.0.1/db", "not a PostgreSQL URL"),
    ):
        with pytest.raises(ValueError, match=problem) as caught:
            PostgresFanout(url)
        assert "secret" not in str(caught.value)
    for prefix in ("", "Upper", "1st", "semi;colon", "x" * 41, 7):
        with pytest.raises(ValueError, match="prefix"):
            PostgresFanout("postgresql://127.0.0.1/db", prefix=prefix)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="command_timeout"):
        PostgresFanout("postgresql://127.0.0.1/db", command_timeout=0)
    monkeypatch.setenv("PURGATORY_AIO_POSTGRES_URL", "postgres://127.0.0.1:5/x")
    assert PostgresFanout().url == "postgres://127.0.0.1:5/x"


def test_one_factory_picks_the_engine_by_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from purgatory_aio.fanout import RedisFanout
    from purgatory_aio.fanout._memory import MemoryBackend

    monkeypatch.delenv("PURGATORY_AIO_FANOUT_URL", raising=False)
    assert isinstance(fanout_from_url("postgresql://127.0.0.1/db"), PostgresFanout)
    assert isinstance(fanout_from_url("postgres://127.0.0.1/db", prefix="x"), PostgresFanout)
    assert isinstance(fanout_from_url("redis://127.0.0.1:6379/0"), RedisFanout)
    memory = fanout_from_url("memory://")
    assert isinstance(memory.backend, MemoryBackend)
    with pytest.raises(ValueError, match="PURGATORY_AIO_FANOUT_URL"):
        fanout_from_url()
    for url in ("http://u:secret@host/", "mysql://u:secret@host/db", "127.0.0.1:5432"):
        with pytest.raises(ValueError, match="not a fan-out URL") as caught:
            fanout_from_url(url)
        assert "secret" not in str(caught.value)
    with pytest.raises(ValueError, match=r"not a Redis URL|names no host"):
        fanout_from_url("redis:///0")
    monkeypatch.setenv("PURGATORY_AIO_FANOUT_URL", "postgresql://127.0.0.1/db")
    assert isinstance(fanout_from_url(), PostgresFanout)


async def test_keys_postgres_cannot_carry_are_refused_and_the_longest_works(
    postgres: PostgresServer,
) -> None:
    a, b, fa, fb = pair(postgres, "long_keys")
    async with a, b, fa, fb:
        longest = "é" * (MAX_KEY_BYTES // 2)  # two bytes each
        for too_long in (longest + "x", "x" * (MAX_KEY_BYTES + 1)):
            with pytest.raises(ValueError, match="bytes"):
                fb.advance(too_long, 1)
            with pytest.raises(ValueError, match="bytes"):
                await fa.wait_for_value(a, too_long, 1, 1)
        waiting = await parked(fa, a, longest)
        await fb.advance_confirmed(longest, 1)
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 1.0
        assert fb.stats().publish_errors == 0


async def test_values_not_raised_for_value_ttl_are_deleted_by_a_publisher(
    postgres: PostgresServer,
) -> None:
    async with PostgresFanout(postgres.url, prefix=fresh("expiring"), value_ttl=0.2) as fanout:
        await fanout.advance_confirmed("old", 1)
        await asyncio.sleep(0.4)
        await fanout.advance_confirmed("new", 1)
        async with admin(postgres) as conn:
            keys = await conn.fetch(f"SELECT key FROM {fanout.table} ORDER BY key")
        assert [row["key"] for row in keys] == ["new"]


@pytest.mark.one_loop  # 100k events through PostgreSQL: once is enough
async def test_a_publish_only_member_keeps_nothing_per_key_over_100k_keys(
    postgres: PostgresServer,
) -> None:
    n = 100_000
    async with PostgresFanout(postgres.url, subscribe=False, prefix=fresh("publish_only")) as fb:
        await fb.advance_confirmed("warm", 1)  # connections, statements and caches are made
        gc.collect()
        before = len(gc.get_objects())
        for i in range(n):
            fb.advance(f"job:{i}", 1)
            if i % 5000 == 4999:
                await until(lambda: fb.stats().queued == 0)  # never more than the queue holds
        await until(lambda: fb.stats().queued == 0)
        gc.collect()
        grown = len(gc.get_objects()) - before
        stats = fb.stats()
        assert (stats.published, stats.publish_dropped, stats.watched_keys) == (n + 1, 0, 0)
        assert fb.value("job:0") is None
        # Each key kept would be an object or more: 100k keys would show as 100k objects.
        assert grown < 5_000, f"{grown} more objects after publishing {n} keys"
        async with admin(postgres) as conn:
            assert await conn.fetchval(f"SELECT count(*) FROM {fb.table}") == n + 1


async def test_idle_members_hold_no_lock_an_operators_migration_waits_for(
    postgres: PostgresServer,
) -> None:
    """Members connected and idle, publishing, and reading: ALTER, TRUNCATE and DROP on the
    fan-out's table each finish within a lock timeout that must not fire."""
    a, b, fa, fb = pair(postgres, "migrations")
    async with a, b, fa, fb, admin(postgres) as conn:
        await conn.execute("SET lock_timeout = '3s'")
        # Idle: both members started, neither has published or read.
        await conn.execute(f"ALTER TABLE {fa.table} ADD COLUMN note text")
        await conn.execute(f"ALTER TABLE {fa.table} DROP COLUMN note")
        wait = await parked(fa, a, "k")  # fa has read the key
        await fb.advance_confirmed("k", 1)  # fb has published
        async with asyncio.timeout(PATIENCE):
            assert await wait == 1.0
        await conn.execute(f"TRUNCATE {fa.table}")
        # None lingers: a statement of a member's still in flight (a read the wait's
        # notification overtook) holds its lock for that statement only.
        for _ in range(100):
            locks = await conn.fetchval(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s USING (pid) "
                "WHERE s.application_name = ANY($1) AND l.relation = to_regclass($2)",
                [WRITE_APPLICATION, LISTEN_APPLICATION, READ_APPLICATION],
                fa.table,
            )
            if locks == 0:
                break
            await asyncio.sleep(0.05)
        assert locks == 0
        await conn.execute(f"DROP TABLE {fa.table}")


async def test_a_stopped_fanout_refuses_to_start_again(postgres: PostgresServer) -> None:
    """A FastAPI app whose lifespan runs twice would otherwise get a member that never
    connects and whose every wait times out."""
    fanout = PostgresFanout(postgres.url, prefix=fresh("restart"))
    await fanout.start()
    await fanout.stop()
    with pytest.raises(RuntimeError, match="stopped fan-out cannot be started again"):
        await fanout.start()
    never_started = PostgresFanout(postgres.url, prefix=fresh("restart"))
    await never_started.stop()
    with pytest.raises(RuntimeError, match="stopped fan-out cannot be started again"):
        await never_started.start()


async def _orders(conn: Any, table: str) -> None:
    await conn.execute(f"CREATE TABLE {table} (id text PRIMARY KEY, version bigint NOT NULL)")
    await conn.execute(f"INSERT INTO {table} VALUES ('o1', 0)")


async def test_an_advance_in_the_callers_transaction_is_heard_once_it_commits(
    postgres: PostgresServer,
) -> None:
    a, b, fa, fb = pair(postgres, "tx_commit")
    orders = fresh("orders")
    async with a, b, fa, fb, admin(postgres) as conn:
        await _orders(conn, orders)
        here, there = await parked(fa, a, "o1"), await parked(fb, b, "o1")
        async with conn.transaction():
            await conn.execute(f"UPDATE {orders} SET version = 1 WHERE id = 'o1'")
            await fa.advance_in(conn, "o1", 1)
            await asyncio.sleep(0.2)  # uncommitted: nobody hears of it, not even this member
            assert not here.done() and not there.done()
            async with admin(postgres) as other:
                assert await other.fetchval(f"SELECT count(*) FROM {fa.table}") == 0
        async with asyncio.timeout(PATIENCE):
            assert await here == 1.0 and await there == 1.0
        assert await conn.fetchval(f"SELECT value FROM {fa.table} WHERE key = 'o1'") == 1.0


async def test_an_advance_rolled_back_with_the_callers_write_is_never_heard(
    postgres: PostgresServer,
) -> None:
    a, b, fa, fb = pair(postgres, "tx_rollback")
    orders = fresh("orders")
    async with a, b, fa, fb, admin(postgres) as conn:
        await _orders(conn, orders)
        wait = await parked(fb, b, "o1")
        with pytest.raises(RuntimeError, match="the handler failed"):
            async with conn.transaction():
                await conn.execute(f"UPDATE {orders} SET version = 1 WHERE id = 'o1'")
                await fa.advance_in(conn, "o1", 1)
                raise RuntimeError("the handler failed after the advance")
        # A statement of the caller's failing after the advance rolls it back too.
        with pytest.raises(asyncpg.UniqueViolationError):
            async with conn.transaction():
                await fa.advance_in(conn, "o1", 2)
                await conn.execute(f"INSERT INTO {orders} VALUES ('o1', 5)")
        await asyncio.sleep(0.3)
        assert not wait.done()
        assert await conn.fetchval(f"SELECT count(*) FROM {fa.table}") == 0
        assert await conn.fetchval(f"SELECT version FROM {orders}") == 0
        # The member is unharmed: the next advance is heard.
        await fa.advance_confirmed("o1", 3)
        async with asyncio.timeout(PATIENCE):
            assert await wait == 3.0


async def test_a_process_that_dies_mid_transaction_leaves_nothing_to_hear(
    postgres: PostgresServer,
) -> None:
    a, b, fa, fb = pair(postgres, "tx_crash")
    async with a, b, fa, fb:
        wait = await parked(fb, b, "o1")
        victim = await asyncpg.connect(postgres.url, timeout=10)
        transaction = victim.transaction()
        await transaction.start()
        await fa.advance_in(victim, "o1", 1)
        pid = victim.get_server_pid()
        async with admin(postgres) as conn:  # the server loses the client before COMMIT
            assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
            await asyncio.sleep(0.3)
            assert await conn.fetchval(f"SELECT count(*) FROM {fa.table}") == 0
        victim.terminate()
        assert not wait.done()
        wait.cancel()
        assert fb.stats().connected and fa.stats().connected


async def test_a_bad_advance_in_a_transaction_is_refused_before_anything_is_sent(
    postgres: PostgresServer,
) -> None:
    a, fa = Purgatory("a"), PostgresFanout(postgres.url, prefix=fresh("tx_bad"))
    fa.attach(a)
    async with a, fa, admin(postgres) as conn, conn.transaction():
        for key, value, error in [
            ("", 1, TypeError),
            ("k\x00", 1, ValueError),
            ("k" * (MAX_KEY_BYTES + 1), 1, ValueError),
            ("k", float("nan"), ValueError),
            ("k", "1", TypeError),
        ]:
            with pytest.raises(error):
                await fa.advance_in(conn, key, value)
        # The caller's transaction is still usable: nothing was sent.
        assert await conn.fetchval("SELECT 1") == 1
    with pytest.raises(TypeError, match="asyncpg connection"):
        await fa.advance_in(object(), "k", 1)


async def test_advancing_in_a_database_without_the_table_says_what_to_do(
    postgres: PostgresServer,
) -> None:
    fanout = PostgresFanout(postgres.url, prefix=fresh("tx_no_table"))  # never started
    async with admin(postgres) as conn:
        with pytest.raises(FanoutUnavailable, match="start a fan-out with this prefix once"):
            await fanout.advance_in(conn, "k", 1)
