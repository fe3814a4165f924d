"""The PostgreSQL fan-out on a primary with a streaming standby: the primary killed (or frozen)
and the standby promoted, at every phase of the fan-out's work, reached by one multi-host URL.

Invariants: every operation settles once (completed, or expired at its deadline), nothing
hangs, counts are exact; with synchronous replication every confirmed advance survives."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest
import structlog
from fanout_support import free_port, until
from pg_support import ReplicatedPair

from purgatory_aio import Purgatory
from purgatory_aio.fanout import (
    BackendHost,
    Fanout,
    FanoutUnavailable,
    MemoryHub,
    PostgresFanout,
    fanout_from_url,
)
from purgatory_aio.fanout._memory import MemoryBackend
from purgatory_aio.fanout._postgres import url_hosts

PATIENCE = 30.0
# Small bounds so that a frozen primary is given up quickly (the defaults suit production).
QUICK = {"connect_timeout": 0.5, "command_timeout": 1.0, "health_interval": 0.5}


def members(
    pair: ReplicatedPair, **options: Any
) -> tuple[Purgatory, Purgatory, PostgresFanout, PostgresFanout]:
    """Two members on the pair's multi-host URL, under a prefix of their own."""
    a, b = Purgatory("a"), Purgatory("b")
    prefix = f"standby_{uuid.uuid4().hex[:8]}"
    settings = {**QUICK, **options}
    return (
        a,
        b,
        PostgresFanout(pair.url, a, prefix=prefix, **settings),
        PostgresFanout(pair.url, b, prefix=prefix, **settings),
    )


async def stored(pair: ReplicatedPair, table: str) -> dict[str, float]:
    """Every value stored in ``table`` on the pair's primary."""
    conn = await asyncpg.connect(pair.url, timeout=10)
    try:
        rows = await conn.fetch(f"SELECT key, value FROM {table}", timeout=10)
    finally:
        conn.terminate()
    return {key: value for key, value in rows}


async def parked(fanout: PostgresFanout, purgatory: Purgatory, keys: list[str]) -> list[Any]:
    before = purgatory.num_delayed
    tasks = [
        asyncio.create_task(fanout.wait_for_value(purgatory, key, 1, PATIENCE * 2)) for key in keys
    ]
    await until(lambda: purgatory.num_delayed == before + len(keys))
    return tasks


async def test_an_idle_failover_moves_the_listen_connection_and_re_reads_every_key(
    replicated: ReplicatedPair, restore_structlog: None
) -> None:
    captured = structlog.testing.LogCapture()
    structlog.configure(
        processors=[captured], wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING)
    )
    # No safety-net resync during the test: only the re-read after the switch can complete.
    a, b, fa, fb = members(replicated, resync_interval=3600)
    async with a, b, fa, fb:
        keys = [f"idle:{i}" for i in range(20)]
        waits = await parked(fa, a, keys)
        # Their first reads are done once a read queued behind them is (one read at a time).
        await until(lambda: fa.stats().reads_pending == 0)
        assert await fa.refresh(keys) == 0
        # Stored without a notification, as a write the hint was lost for: replicated, but
        # nothing tells the members.
        conn = await asyncpg.connect(replicated.url, timeout=10)
        try:
            await conn.executemany(
                f"INSERT INTO {fa.table} (key, value) VALUES ($1, 1)", [(k,) for k in keys]
            )
        finally:
            conn.terminate()
        await asyncio.to_thread(replicated.caught_up)
        await asyncio.sleep(0.2)
        assert not any(wait.done() for wait in waits)
        old = replicated.primary.port
        await asyncio.to_thread(replicated.fail_over)
        async with asyncio.timeout(PATIENCE):
            assert await asyncio.gather(*waits) == [1.0] * len(keys)
        await until(lambda: fa.stats().failovers == 1 and fb.stats().failovers == 1)
        stats = fa.stats()
        assert stats.completed == len(keys) and stats.outages >= 1 and stats.recoveries >= 1
        assert stats.connected
    switches = [e for e in captured.entries if e["event"] == "fanout_engine_switched"]
    assert len(switches) == 2
    assert all(e["log_level"] == "warning" for e in switches)
    assert all(
        e["previous"] == f"127.0.0.1:{old}"
        and e["current"] == f"127.0.0.1:{replicated.primary.port}"
        for e in switches
    )
    levels = {e["log_level"] for e in captured.entries if e["event"].startswith("fanout_engine")}
    assert levels == {"warning"}


async def test_a_failover_mid_storm_completes_every_wait_once(replicated: ReplicatedPair) -> None:
    replicated.ensure(sync=True)  # what was committed on the old primary is on the standby
    a, b, fa, fb = members(replicated, batch=50)
    n = 1000
    async with a, b, fa, fb:
        waits = await parked(fa, a, [f"storm:{i}" for i in range(n)])
        failover: asyncio.Task[None] | None = None
        for i in range(n):
            fb.advance(f"storm:{i}", 1)
            if i == n // 3:
                await asyncio.sleep(0.01)  # let some batches go before the primary dies
                failover = asyncio.create_task(asyncio.to_thread(replicated.fail_over))
            if i % 50 == 0:
                await asyncio.sleep(0)
        assert failover is not None
        await failover
        async with asyncio.timeout(PATIENCE):
            assert await asyncio.gather(*waits) == [1.0] * n
        assert a.stats().completed == n and a.num_delayed == 0
        assert fb.stats().publish_errors == 0 and fb.stats().publish_dropped == 0
        await until(lambda: fb.stats().queued == 0)
        values = await stored(replicated, fa.table)
        assert values == {f"storm:{i}": 1.0 for i in range(n)}


async def test_a_confirmed_advance_waiting_through_a_failover_is_stored_on_the_new_primary(
    replicated: ReplicatedPair,
) -> None:
    a, b, fa, fb = members(replicated)
    async with a, b, fa, fb:
        (wait,) = await parked(fa, a, ["confirm"])
        await asyncio.to_thread(replicated.lose_primary)
        confirming = asyncio.create_task(fb.advance_confirmed("confirm", 1, timeout=PATIENCE))
        await asyncio.sleep(0.3)
        assert not confirming.done()  # no primary: it waits, it does not fail
        await asyncio.to_thread(replicated.promote)
        async with asyncio.timeout(PATIENCE):
            assert await confirming == 0  # b watches nothing
            assert await wait == 1.0
        assert (await stored(replicated, fa.table))["confirm"] == 1.0
        assert fb.stats().publish_failures >= 1 and fb.stats().publish_errors == 0


async def test_a_wait_admitted_while_there_is_no_primary_reads_its_value_after_promotion(
    replicated: ReplicatedPair,
) -> None:
    a, b, fa, fb = members(replicated)
    async with a, b, fa, fb:
        await fb.advance_confirmed("admitted", 1, timeout=PATIENCE)
        await asyncio.to_thread(replicated.caught_up)  # on the standby before the kill
        await asyncio.to_thread(replicated.lose_primary)
        # The value is stored, but the read of it fails while there is no primary.
        waiting = asyncio.create_task(fa.wait_for_value(a, "admitted", 1, PATIENCE * 2))
        await until(lambda: fa.stats().refresh_failures >= 1)
        assert not waiting.done()
        await asyncio.to_thread(replicated.promote)
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 1.0
        # A wait for a value nobody advances still ends at its deadline.
        assert await fa.wait_for_value(a, "never", 1, 0.2) is None
        assert a.num_delayed == 0


async def test_a_frozen_primary_is_left_for_the_promoted_standby_without_a_hang(
    replicated: ReplicatedPair,
) -> None:
    a, b, fa, fb = members(replicated)
    async with a, b:
        await fa.start()
        await fb.start()
        waits = await parked(fa, a, [f"frozen:{i}" for i in range(10)])
        expiring = asyncio.create_task(fa.wait_for_value(a, "frozen:never", 1, 1.0))
        await asyncio.to_thread(replicated.fail_over, True)  # SIGSTOP, then promote
        async with asyncio.timeout(PATIENCE):
            for i in range(10):
                await fb.advance_confirmed(f"frozen:{i}", 1, timeout=PATIENCE)
            assert await asyncio.gather(*waits) == [1.0] * 10
            assert await expiring is None
        await until(lambda: fa.stats().failovers == 1)
        assert fa.stats().completed == 10
        async with asyncio.timeout(5):  # the frozen server holds no connection of ours now
            await fa.stop()
            await fb.stop()
    assert replicated.standby.frozen  # the old primary, still frozen: ensure() kills it


async def test_synchronous_replication_keeps_every_confirmed_advance_through_a_kill(
    replicated: ReplicatedPair,
) -> None:
    replicated.ensure(sync=True)
    a, b, fa, fb = members(replicated)
    n = 300
    async with a, b, fa, fb:
        await asyncio.gather(
            *(fb.advance_confirmed(f"sync:{i}", i + 1, timeout=PATIENCE) for i in range(n))
        )
        await asyncio.to_thread(replicated.fail_over)
        async with asyncio.timeout(PATIENCE):
            values = await stored(replicated, fa.table)
        assert values == {f"sync:{i}": float(i + 1) for i in range(n)}


async def test_a_standby_alone_is_one_clear_line_naming_each_host(
    replicated: ReplicatedPair,
) -> None:
    await asyncio.to_thread(replicated.lose_primary)
    fanout = PostgresFanout(replicated.url, connect_timeout=0.5)
    with pytest.raises(FanoutUnavailable) as caught:
        await fanout.start()
    message = str(caught.value)
    assert "\n" not in message and replicated.primary.password not in message
    assert f"127.0.0.1:{replicated.primary.port}: nothing listens there" in message
    assert f"127.0.0.1:{replicated.standby.port}: a standby (read-only)" in message
    assert caught.value.__cause__ is None
    # The same line through the factory.
    with pytest.raises(FanoutUnavailable, match="a standby"):
        await fanout_from_url(replicated.url, connect_timeout=0.5).start()


def test_multi_host_urls_are_parsed_and_unusable_ones_refused() -> None:
    url = "postgresql://u:secret@db1:5432,[::1]:6543,db3/app"
    assert url_hosts(url) == [("db1", 5432), ("::1", 6543), ("db3", None)]
    assert PostgresFanout(url).url == url
    assert isinstance(fanout_from_url(url), PostgresFanout)
    for bad, problem in (
        ("postgresql://u:secret@db1:5432,:5433/app", "empty host"),
        ("postgresql://u:secret@db1:5432,db2:x/app", "not a number"),
        ("postgresql://u:secret@db1:5432,db2:70000/app", "not a number"),
        ("postgresql://u:secret@db1,db2:0/app", "port 0"),
        ("postgresql://u:secret@db1,db2/app?target_session_attrs=standby", "only a primary"),
        ("postgresql://u:secret@db1/app?target_session_attrs=read-only", "only a primary"),
        ("postgresql://u:secret@db1/app?sslmode=verify-everything", "sslmode"),
        ("postgresql://u:secret@db1/app?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
         "not a readable file"),
    ):  # fmt: skip
        for make in (PostgresFanout, fanout_from_url):
            with pytest.raises(ValueError, match=problem) as caught:
                make(bad)
            assert "secret" not in str(caught.value)


async def test_no_host_answering_is_one_bounded_line() -> None:
    url = f"postgresql://u:secret@127.0.0.1:{free_port()},127.0.0.1:{free_port()}/db"
    fanout = PostgresFanout(url, connect_timeout=0.5)
    async with asyncio.timeout(PATIENCE):
        with pytest.raises(
            FanoutUnavailable, match=r"connection refused.*connection refused"
        ) as caught:
            await fanout.start()
    assert "secret" not in str(caught.value) and "\n" not in str(caught.value)
    assert not fanout.stats().connected


class FirstReadsFail(MemoryBackend):
    """A hub whose next ``failing`` reads fail, as reads on a connection still held by a
    primary that has just failed over do."""

    def __init__(self, hub: MemoryHub) -> None:
        super().__init__(hub)
        self.failing = 0

    async def read(self, keys: Sequence[str], host: BackendHost) -> dict[str, float]:
        if self.failing:
            self.failing -= 1
            raise ConnectionResetError("the old primary's connection")
        return await super().read(keys, host)


async def test_a_re_read_that_fails_after_resubscribing_is_retried_before_the_safety_net() -> None:
    hub = MemoryHub()
    backend = FirstReadsFail(hub)
    async with Purgatory("a") as a, Fanout(backend, a, resync_interval=3600) as fanout:
        waiting = asyncio.create_task(fanout.wait_for_value(a, "k", 1, PATIENCE))
        await until(lambda: a.num_delayed == 1 and fanout.stats().reads_pending == 0)
        assert await fanout.refresh(["k"]) == 0
        hub.values["k"] = 1.0  # stored while this member was deaf: only a re-read finds it
        backend.failing = 2
        fanout.subscribed()  # what a backend reports once it listens again
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 1.0
        stats = fanout.stats()
        assert stats.refresh_failures == 2 and stats.completed == 1 and stats.resyncs >= 4
