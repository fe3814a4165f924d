"""Foreign values of every kind in the store, on PostgreSQL and Redis: what someone else
wrote under the fan-out's keys. A number is a number (huge, negative, tiny); NaN and the
infinities are counted and raised past, so an acknowledged advance is never absorbed; what
is not a number at all is counted, refused where it would be overwritten, and never stops
a member."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from fanout_support import RedisServer, until
from pg_support import PostgresServer, admin, fresh, pair

from purgatory_aio import Purgatory
from purgatory_aio.fanout import FanoutUnavailable, PostgresFanout, RedisFanout

PATIENCE = 15.0

#: key -> (what someone stored, the value a wait for 1 reads at once, or None: it waits).
NUMBERS: dict[str, tuple[str, float | None]] = {
    "huge": ("1e308", 1e308),
    "max": ("1.7976931348623157e308", 1.7976931348623157e308),
    "negative": ("-5", None),
    "negative_huge": ("-1e308", None),
    "tiny": ("5e-324", None),
    "zero": ("-0", None),
}
#: Not finite: counted as foreign when read, raised past by an advance.
NON_FINITE_PG = {"nan": "NaN", "inf": "Infinity", "neg_inf": "-Infinity"}
NON_FINITE_REDIS = {
    "nan": "nan",
    "inf": "inf",
    "plus_inf": "+Infinity",
    "overflow": "1e400",
    "neg_inf": "-inf",
}
#: Not a number at all (Redis only: a float8 column cannot hold one).
TEXT_REDIS: dict[str, bytes] = {
    "text": b"not a number",
    "empty": b"",
    "hex": b"0x10",
    "binary": b"\xff\xfe",
    "spaces": b"1 2",
}


async def park(fanout: Any, purgatory: Purgatory, keys: list[str]) -> dict[str, asyncio.Task[Any]]:
    before = purgatory.num_delayed
    waits = {key: asyncio.create_task(fanout.wait_for_value(purgatory, key, 1, 60)) for key in keys}
    await until(
        lambda: purgatory.num_delayed + sum(w.done() for w in waits.values()) >= before + len(keys)
    )
    return waits


async def check_numbers_and_non_finite(
    fa: Any, fb: Any, a: Purgatory, non_finite: list[str], malformed_before: int = 0
) -> dict[str, asyncio.Task[Any]]:
    waits = await park(fa, a, [*NUMBERS, *non_finite])
    await until(lambda: fa.stats().malformed >= malformed_before + len(non_finite))
    for key, (_, at_once) in NUMBERS.items():
        if at_once is not None:
            async with asyncio.timeout(PATIENCE):
                assert await waits[key] == at_once
    await asyncio.sleep(0.1)
    pending = [key for key in waits if not waits[key].done()]
    assert sorted(pending) == sorted(
        [key for key, (_, at_once) in NUMBERS.items() if at_once is None] + non_finite
    )
    # An acknowledged advance is stored and heard over every one of them.
    for key in pending:
        await fb.advance_confirmed(key, 2)
    async with asyncio.timeout(PATIENCE):
        assert [await waits[key] for key in pending] == [2.0] * len(pending)
    return waits


async def test_every_kind_of_foreign_row_in_postgres(postgres: PostgresServer) -> None:
    a, b, fa, fb = pair(postgres, "foreign_all")
    async with a, b, fa, fb, admin(postgres) as conn:
        rows = [(key, raw) for key, (raw, _) in NUMBERS.items()] + list(NON_FINITE_PG.items())
        await conn.executemany(
            f"INSERT INTO {fa.table} (key, value) VALUES ($1, $2::text::float8)", rows
        )
        await check_numbers_and_non_finite(fa, fb, a, list(NON_FINITE_PG))
        stored = dict(await conn.fetch(f"SELECT key, value FROM {fa.table}"))
        assert stored["huge"] == 1e308 and stored["negative"] == 2.0 and stored["inf"] == 2.0
        assert fb.stats().publish_errors == 0


async def test_text_where_a_number_belongs_in_postgres(postgres: PostgresServer) -> None:
    """An operator turns the value column into text under running members and stores text:
    reads count it and go on, publishing fails event by event with the server's reason, a
    new member refuses to start in one line; turned back, everything works again."""
    a, b, fa, fb = pair(postgres, "foreign_text")
    async with a, b, fa, fb, admin(postgres) as conn:
        await conn.execute("SET lock_timeout = '5s'")
        await conn.execute(f"ALTER TABLE {fa.table} ALTER COLUMN value TYPE text")
        await conn.execute(f"INSERT INTO {fa.table} (key, value) VALUES ('text', 'not a number')")
        (waiting,) = (await park(fa, a, ["text"])).values()
        await until(lambda: fa.stats().malformed >= 1)
        with pytest.raises(FanoutUnavailable, match="refused the event on 'text'"):
            await fb.advance_confirmed("text", 1, timeout=PATIENCE)
        newcomer = PostgresFanout(postgres.url, prefix=fa.table.removesuffix("_values"))
        with pytest.raises(FanoutUnavailable, match="other column types") as caught:
            await newcomer.start()
        assert "\n" not in str(caught.value)
        await conn.execute(f"DELETE FROM {fa.table} WHERE key = 'text'")
        await conn.execute(
            f"ALTER TABLE {fa.table} ALTER COLUMN value TYPE float8 USING value::float8"
        )
        await fb.advance_confirmed("text", 1, timeout=PATIENCE)
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 1.0
        assert fa.stats().connected and fb.stats().connected


async def test_every_kind_of_foreign_value_in_redis(redis_shared: RedisServer) -> None:
    prefix = f"foreign{fresh('redis')}"
    client = aioredis.from_url(redis_shared.url)
    a, b = Purgatory("a"), Purgatory("b")
    fa = RedisFanout(redis_shared.url, a, prefix=prefix)
    fb = RedisFanout(redis_shared.url, b, prefix=prefix)
    try:
        stored = {key: raw for key, (raw, _) in NUMBERS.items()} | NON_FINITE_REDIS
        for key, raw in {**stored, **TEXT_REDIS}.items():
            await client.set(f"{prefix}:value:{key}", raw)
        async with a, b, fa, fb:
            text = await park(fa, a, list(TEXT_REDIS))
            await check_numbers_and_non_finite(
                fa, fb, a, list(NON_FINITE_REDIS), malformed_before=len(TEXT_REDIS)
            )
            # Text is someone else's: the advance is refused (never absorbed as if stored),
            # the rest goes on, and the waits end at their deadlines or with the fan-out.
            for key in TEXT_REDIS:
                with pytest.raises(FanoutUnavailable, match="not a number"):
                    await fb.advance_confirmed(key, 2)
                assert not text[key].done()
                text[key].cancel()
            assert await client.get(f"{prefix}:value:inf") == b"2.0"
    finally:
        await client.aclose()


async def test_a_caller_cannot_store_a_foreign_value_through_advance_in(
    postgres: PostgresServer,
) -> None:
    """advance_in takes finite numbers only, whatever the driver would send as a float8."""
    fanout = PostgresFanout(postgres.url, prefix=fresh("foreign_in"))
    async with admin(postgres) as conn, conn.transaction():
        for garbage in ("abc", "NaN", "1", float("nan"), float("inf"), -float("inf"), 10**400):
            with pytest.raises((TypeError, ValueError)):
                await fanout.advance_in(conn, "k", garbage)  # type: ignore[arg-type]
        assert await conn.fetchval("SELECT 1") == 1  # nothing was sent
