"""What every fan-out engine does, run against each: memory, Redis, PostgreSQL, and the
topologies production runs: Redis behind Sentinel, a Redis Cluster, a PostgreSQL primary
with a streaming standby (each reached by its URL alone; see ``engines.py``).

Members made by one engine share its bus and store, as worker processes do. The
invariants are the core's: every operation settles exactly once, nothing
confirmed is lost, bad input is refused at the call and changes nothing, a
stopped or failing engine never holds an answer past its deadline.
"""

from __future__ import annotations

import asyncio
import gc
import math
import tracemalloc

import pytest
from engines import Engine
from fanout_support import Flag, until

from purgatory_aio import Purgatory
from purgatory_aio.fanout import Fanout, FanoutUnavailable, ValueReached

# Far above any delivery here: a wait that needs it has hung.
PATIENCE = 10.0


async def parked(
    fanout: Fanout, purgatory: Purgatory, key: str, mark: float = 1
) -> asyncio.Task[float | None]:
    """A wait for ``key`` to reach ``mark``, returned once its operation is pending."""
    before = purgatory.num_delayed
    task = asyncio.create_task(fanout.wait_for_value(purgatory, key, mark, 60))
    await until(lambda: purgatory.num_delayed == before + 1)
    return task


async def test_an_advance_in_one_member_completes_a_wait_in_another(engine: Engine) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, engine.make(a) as fa, engine.make(b) as fb:
        waiting = await parked(fa, a, "job:1")
        assert fb.advance("job:1", 1) == 0
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 1.0
        assert a.stats().completed == 1


async def test_checks_and_cancels_reach_the_other_member(engine: Engine) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    flags: set[str] = set()
    async with a, b, engine.make(a) as fa, engine.make(b) as fb:
        flag, doomed = Flag(flags, "ready", 60), Flag(flags, "doomed", 60)
        assert not await fa.watch(a, flag, ["ready"])
        assert not await fa.watch(a, doomed, ["doomed"])
        flags.add("ready")
        fb.check("ready")
        fb.cancel("doomed")
        async with asyncio.timeout(PATIENCE):
            assert await flag is True
            await until(doomed.done)
        assert doomed.cancelled
        assert a.num_delayed == 0


async def test_advances_reordered_and_duplicated_complete_each_threshold_once(
    engine: Engine,
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, engine.make(a) as fa, engine.make(b) as fb:
        ops = [ValueReached(fa, "hw", mark, 60) for mark in range(1, 21)]
        for op in ops:
            assert not await fa.watch_threshold(a, op, "hw", op.threshold)
        for value in (5, 2, 5, 9, 1, 9, 3, 12, 12, 7):
            fb.advance("hw", value)
        await fb.advance_confirmed("hw", 12)  # after the others: every earlier one is stored
        await until(lambda: sum(op.done() for op in ops) == 12)
        assert [op.done() for op in ops] == [True] * 12 + [False] * 8
        assert all(op.threshold <= op.result() <= 12.0 for op in ops[:12])  # type: ignore[operator]
        fb.advance("hw", 20)
        async with asyncio.timeout(PATIENCE):
            await asyncio.gather(*ops)
        assert a.stats().completed == 20 and await engine.stored("hw") == 20.0


async def test_a_wait_that_begins_after_the_advance_reads_the_stored_value(
    engine: Engine,
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, engine.make(b) as fb:
        await fb.advance_confirmed("job:early", 3)
        assert await engine.stored("job:early") == 3.0
        async with engine.make(a) as fa:  # a member that was not there when it was published
            async with asyncio.timeout(PATIENCE):
                assert await fa.wait_for_value(a, "job:early", 2, 60) == 3.0


async def test_operations_watched_on_the_purgatory_directly_receive_events_and_values(
    engine: Engine,
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, engine.make(a) as fa, engine.make(b) as fb:
        await fb.advance_confirmed("stored", 4)
        direct = ValueReached(fa, "direct", 1, 60)
        before = ValueReached(fa, "stored", 4, 60)
        await a.watch_threshold(direct, "direct", 1)  # not through the fan-out
        await a.watch_threshold(before, "stored", 4)
        fb.advance("direct", 1)
        async with asyncio.timeout(PATIENCE):
            assert await direct == 1.0
            assert await before == 4.0


async def test_bad_input_is_refused_at_the_call_as_the_core_refuses_it(engine: Engine) -> None:
    a = Purgatory("a")
    async with a, engine.make(a) as fa:
        op = ValueReached(fa, "k", 1, 60)
        for keys in ("job:42", b"job:42", 42, None):
            with pytest.raises(TypeError):
                await a.try_complete_else_watch(op, keys)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                await fa.watch(a, op, keys)  # type: ignore[arg-type]
        for key in ("", 42, None, b"k"):
            for publish in (fa.check, fa.cancel):
                with pytest.raises(TypeError):
                    publish(key)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                fa.advance(key, 1)  # type: ignore[arg-type]
        for key in ("\udc80", "nul\x00inside"):
            with pytest.raises(ValueError):
                fa.advance(key, 1)
            with pytest.raises(ValueError):
                await fa.watch(a, op, [key])
        for value, error in (
            (10**400, ValueError),
            (math.nan, ValueError),
            (math.inf, ValueError),
            (True, TypeError),
            ("1", TypeError),
        ):
            with pytest.raises(error):
                a.advance_key("k", value)  # type: ignore[arg-type]
            with pytest.raises(error):
                fa.advance("k", value)  # type: ignore[arg-type]
            with pytest.raises(error):
                await fa.advance_confirmed("k", value)  # type: ignore[arg-type]
        stats = fa.stats()
        assert (stats.published, stats.queued, stats.publish_dropped) == (0, 0, 0)
        assert a.num_delayed == 0 and not op.done()
        assert await engine.stored("k") is None


async def test_a_publish_only_member_publishes_and_applies_nothing_from_others(
    engine: Engine,
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, engine.make(a) as fa, engine.make(b, subscribe=False) as fb:
        waiting = await parked(fa, a, "job:p")
        await fb.advance_confirmed("job:p", 1)
        fa.advance("job:q", 1)
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 1.0
        await fa.advance_confirmed("job:r", 1)
        assert fb.stats().received == 0


async def test_every_parked_wait_is_answered_exactly_once(engine: Engine) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    n = 400
    async with a, b, engine.make(a) as fa, engine.make(b) as fb:
        waits = [asyncio.create_task(fa.wait_for_value(a, f"many:{i}", 1, 60)) for i in range(n)]
        await until(lambda: a.num_delayed == n)
        for i in range(n):
            fb.advance(f"many:{i}", 1 + i % 3)
        async with asyncio.timeout(PATIENCE * 3):
            results = await asyncio.gather(*waits)
        assert results == [1.0 + i % 3 for i in range(n)]
        stats = a.stats()
        assert (stats.completed, stats.expired, a.num_delayed) == (n, 0, 0)
        await until(lambda: fb.stats().published == n)


async def test_a_wait_nobody_answers_expires_at_its_deadline(engine: Engine) -> None:
    a = Purgatory("a")
    async with a, engine.make(a) as fa:
        async with asyncio.timeout(PATIENCE):
            results = await asyncio.gather(
                *(fa.wait_for_value(a, f"never:{i}", 1, 0.1) for i in range(20))
            )
        assert results == [None] * 20 and a.stats().expired == 20


async def test_stop_with_a_publish_storm_in_flight_accounts_for_every_event(
    engine: Engine,
) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    n = 3000
    async with a, b, engine.make(a) as fa:
        fb = engine.make(b, batch=64)
        await fb.start()
        confirmed = asyncio.create_task(fb.advance_confirmed("storm:confirmed", 1, timeout=30))
        for i in range(n):
            fb.advance(f"storm:{i}", 1)
        await asyncio.sleep(0)
        async with asyncio.timeout(PATIENCE):
            await fb.stop(flush_timeout=0.05)
        stats = fb.stats()
        assert stats.published + stats.undelivered == n + 1 and stats.queued == 0
        try:
            await confirmed
        except FanoutUnavailable:
            assert stats.undelivered >= 1
        else:
            assert await engine.stored("storm:confirmed") == 1.0
        fb.advance("after:stop", 1)  # dropped and counted, never raised or queued
        assert fb.stats().publish_dropped == 1
        # what was published is there for anyone who reads it
        async with asyncio.timeout(PATIENCE):
            for i in (0, stats.published - 2):
                if i >= 0:
                    assert await fa.wait_for_value(a, f"storm:{i}", 1, 30) == 1.0


async def test_a_malformed_message_on_the_channel_is_counted_and_skipped(engine: Engine) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, engine.make(a) as fa, engine.make(b) as fb:
        for junk in ("hello", "a|x|not-a-number|k", "a|x|nan|k", "q|x||k", "c|x||"):
            await engine.publish_raw(junk)
        await until(lambda: fa.stats().malformed == 5)
        waiting = await parked(fa, a, "after")
        fb.advance("after", 1)
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 1.0


async def test_a_foreign_value_in_the_store_is_counted_and_a_raise_replaces_it(
    engine: Engine,
) -> None:
    if engine.store_foreign is None:
        pytest.skip("the memory hub holds numbers only")
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, engine.make(a) as fa, engine.make(b) as fb:
        await fb.advance_confirmed("other", 1)  # the store exists
        await engine.store_foreign("foreign")
        waiting = await parked(fa, a, "foreign")
        await until(lambda: fa.stats().malformed >= 1)
        assert not waiting.done()
        try:
            await fb.advance_confirmed("foreign", 2)
        except FanoutUnavailable:
            # An engine may refuse to raise a value that is not its own: counted, and the
            # publisher goes on with the next event.
            assert fb.stats().publish_errors == 1
            fb.advance("next", 1)
            await until(lambda: fb.stats().published == 2)
            waiting.cancel()
        else:
            async with asyncio.timeout(PATIENCE):
                assert await waiting == 2.0


async def test_a_member_that_only_publishes_keeps_nothing_per_key(engine: Engine) -> None:
    """Memory follows the watches: publishing over many keys leaves nothing behind."""
    if engine.name == "memory":
        pytest.skip("the memory hub is the store, and lives in this process")
    n = 10_000
    b = Purgatory("b")
    async with b, engine.make(b, subscribe=False) as fb:
        await fb.advance_confirmed("warm", 1)  # connections, statements and caches are made
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(n):
                fb.advance(f"publish-only:{i}", 1)
                if i % 1000 == 999:
                    await fb.advance_confirmed(f"publish-only:{i}", 2)  # drained so far
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        stats = fb.stats()
        assert (stats.published, stats.queued, stats.watched_keys) == (n + 1 + n // 1000, 0, 0)
        assert fb.value("publish-only:0") is None and b.watched_keys() == []
        # About 200 bytes a key if each one were kept; far less than that is noise.
        assert grown < n * 50, f"{grown} bytes kept after publishing {n} keys"
