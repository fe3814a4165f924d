"""Smoke tests on the real clock, on asyncio and uvloop: behaviour only, no timing asserts."""

from __future__ import annotations

import asyncio
import random
import time

from support import MockOperation, awaiting

from purgatory_aio import Purgatory, Timer


async def test_real_timers_fire_never_early_and_all_fire() -> None:
    timer = Timer()
    rng = random.Random(3)
    early: list[float] = []
    fired = 0
    done = asyncio.Event()
    total = 300

    def on_due(deadline: float) -> None:
        nonlocal fired
        fired += 1
        if time.monotonic() < deadline:
            early.append(deadline - time.monotonic())
        if fired == total:
            done.set()

    for _ in range(total):
        deadline = time.monotonic() + rng.uniform(0, 0.15)
        timer.call_at(deadline, on_due, deadline)
    await asyncio.wait_for(done.wait(), 10)
    assert early == []
    assert len(timer) == 0
    timer.close()


async def test_real_purgatory_expires_and_completes() -> None:
    async with Purgatory("real") as p:
        slow, fast = MockOperation(0.05), MockOperation(5)
        slow.clock = p.clock  # on_complete records when it ran, in the purgatory's clock
        start = p.clock.time()
        await p.try_complete_else_watch(slow, ["k"])
        await p.try_complete_else_watch(fast, ["k"])
        fast.completable = True
        assert p.check_and_complete("k") == 1
        assert await asyncio.wait_for(awaiting(slow), 5) == "expired"
        assert slow.completed_at is not None and slow.completed_at - start >= 0.05
        assert await fast == "completed"
