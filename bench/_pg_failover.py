"""PostgreSQL's primary killed and its standby promoted, under the fan-out (``bench fanout``).

A primary and a streaming standby (``pg_basebackup -R``, the tests' own helper) on
loopback, reached by one multi-host URL with ``target_session_attrs=read-write``:

* **confirmed acks lost per 10,000**: 10,000 ``advance_confirmed`` calls on distinct
  keys (128 at a time, a caller retrying any that raised), the primary SIGKILLed
  once half of them are confirmed and the standby promoted; then the new primary's
  table is read and every confirmed key missing from it counted. Asynchronous
  replication (PostgreSQL's default) against ``synchronous_standby_names = '*'``;
  the confirmed advances per second before the kill give the cost of the latter.
* **time from the primary's death to the first event delivered again**: one wait
  parked in a subscribing member, the primary SIGKILLed, the standby promoted at
  once (``pg_ctl promote``), the event published by another member as soon as
  the primary died; the time from the kill until the wait is answered (by the
  notification or by the re-read that follows the switch), p50/p99 over the
  failovers; the promotion's own time beside it.

After each failover the dead primary is rebuilt as the new standby, so every
round starts from a replicated pair.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

import asyncpg

from purgatory_aio import Purgatory
from purgatory_aio.fanout import FanoutUnavailable, PostgresFanout, ValueReached

from ._common import quantile

CONFIRMED = 10_000
CONCURRENT = 128


def _prefix() -> str:
    return f"failover_{uuid.uuid4().hex[:8]}"


async def _stored_keys(url: str, table: str) -> set[str]:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return {row[0] for row in await conn.fetch(f"SELECT key FROM {table}", timeout=30)}
    finally:
        conn.terminate()


async def _lost(pair: Any, sync: bool, total: int) -> dict[str, float]:
    """One kill under a stream of confirmed advances: confirmed, lost, and the confirmed
    advances per second before the kill."""
    await asyncio.to_thread(pair.ensure, sync)
    fanout = PostgresFanout(pair.url, subscribe=False, prefix=_prefix(), batch=64)
    confirmed: list[str] = []
    half = asyncio.Event()
    numbers = itertools.count()
    async with fanout:
        started = time.perf_counter()

        async def confirmer() -> None:
            while (i := next(numbers)) < total:
                key = f"loss:{i}"
                while True:  # a caller retries an advance that was not confirmed
                    try:
                        await fanout.advance_confirmed(key, 1, timeout=30)
                    except FanoutUnavailable:
                        continue
                    break
                confirmed.append(key)
                if len(confirmed) == total // 2:
                    half.set()

        workers = [asyncio.create_task(confirmer()) for _ in range(CONCURRENT)]
        await half.wait()
        rate = len(confirmed) / (time.perf_counter() - started)
        await asyncio.to_thread(pair.fail_over)
        await asyncio.gather(*workers)
        stored = await _stored_keys(pair.url, fanout.table)
    lost = sum(1 for key in confirmed if key not in stored)
    return {"confirmed": len(confirmed), "lost": lost, "confirmed_per_s": rate}


async def _deaf_time(pair: Any) -> dict[str, float]:
    """Seconds from the primary's death to a parked wait answered through the new primary,
    and the promotion's own seconds."""
    await asyncio.to_thread(pair.ensure, False)
    a, b = Purgatory("deaf-a"), Purgatory("deaf-b")
    prefix = _prefix()
    fa = PostgresFanout(pair.url, a, prefix=prefix)
    fb = PostgresFanout(pair.url, b, prefix=prefix, subscribe=False)
    async with a, b, fa, fb:
        waiting = ValueReached(fa, "deaf", 1, 120)
        await fa.watch_threshold(a, waiting, "deaf", 1)  # admitted when this returns
        await asyncio.sleep(0.05)  # its stored value read (none): parked for good

        async def answered() -> float:
            await waiting
            return time.perf_counter()  # as it happens, not after the promotion returns

        answer = asyncio.create_task(answered())
        killed = time.perf_counter()
        await asyncio.to_thread(pair.lose_primary)
        fb.advance("deaf", 1)  # published as soon as the primary is gone
        await asyncio.to_thread(pair.promote)
        promoted = time.perf_counter()
        delivered = await answer
    return {"deaf_s": delivered - killed, "promotion_s": promoted - killed}


async def measure(pair: Any, failovers: int, quick: bool) -> dict[str, Any]:
    """Every figure of the module docstring, on a pair made by the caller."""
    total = 2_000 if quick else CONFIRMED
    rounds = 1 if quick else 10
    loss: dict[str, dict[str, float]] = {}
    for mode, sync in (("async", False), ("sync", True)):
        runs = [await _lost(pair, sync, total) for _ in range(rounds)]
        confirmed = sum(run["confirmed"] for run in runs)
        lost = sum(run["lost"] for run in runs)
        loss[mode] = {
            "kills": rounds,
            "confirmed": confirmed,
            "lost": lost,
            "lost_per_10k": lost * 10_000 / confirmed,
            "max_lost_in_one_kill": max(run["lost"] for run in runs),
            "confirmed_per_s": sorted(run["confirmed_per_s"] for run in runs)[rounds // 2],
        }
    deaf = [await _deaf_time(pair) for _ in range(failovers)]
    times = sorted(run["deaf_s"] for run in deaf)
    promotions = sorted(run["promotion_s"] for run in deaf)
    return {
        "loss": loss,
        "failovers": failovers,
        "death_to_delivery_s": {"p50": quantile(times, 0.5), "p99": quantile(times, 0.99)},
        "promotion_s": {"p50": quantile(promotions, 0.5), "p99": quantile(promotions, 0.99)},
    }


def rows(results: dict[str, Any]) -> tuple[dict[str, float | None], list[tuple[str, str]]]:
    """Ratios and headline rows for the record."""
    loss, deaf, promotion = (
        results["loss"],
        results["death_to_delivery_s"],
        results["promotion_s"],
    )
    ratios: dict[str, float | None] = {
        "postgres_failover_sync_vs_async_confirmed_per_s": (
            loss["sync"]["confirmed_per_s"] / loss["async"]["confirmed_per_s"]
        ),
    }
    headline = [
        (
            "postgres failover: confirmed acks lost per 10k, async / sync replication",
            f"{loss['async']['lost_per_10k']:.1f} / {loss['sync']['lost_per_10k']:.1f}"
            f" (over {loss['async']['kills']} kills each)",
        ),
        (
            "postgres confirmed advances/s, async / sync replication",
            f"{loss['async']['confirmed_per_s']:.0f} / {loss['sync']['confirmed_per_s']:.0f}",
        ),
        (
            f"postgres primary death to first event delivered p50/p99 s "
            f"({results['failovers']} failovers; promotion p50/p99)",
            f"{deaf['p50']:.2f}/{deaf['p99']:.2f} ({promotion['p50']:.2f}/{promotion['p99']:.2f})",
        ),
    ]
    return ratios, headline
