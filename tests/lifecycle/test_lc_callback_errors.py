"""A callback that raises anything short of KeyboardInterrupt/SystemExit stops nothing.

``asyncio.CancelledError`` is the easy one to raise by accident (``fut.result()`` on a
cancelled future, in a synchronous callback); a custom ``BaseException`` subclass and
``GeneratorExit`` are the other hostile cases; ``RuntimeError`` is the control. Whatever
a callback raises: the call that ran it returns normally, the operation is settled
(its awaiters return), the walk or the reaper carries on with the next operation, and
operations added afterwards still expire.
"""

from __future__ import annotations

import asyncio

import pytest
from lc_support import (
    AsyncHostileOp,
    Hostile,
    HostileOp,
    call,
    is_settled,
    outcome_of,
    raised,
    raiser,
)

from purgatory_aio import Purgatory, Timer
from purgatory_aio.testing import ManualClock

KINDS = [asyncio.CancelledError, Hostile, GeneratorExit, RuntimeError]
KIND_IDS = ["CancelledError", "BaseException-subclass", "GeneratorExit", "RuntimeError"]
LIMIT = 10.0  # real seconds any one test may take before it fails instead of hanging

kinds = pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)


async def expect_later_ops_expire(p: Purgatory, clock: ManualClock) -> None:
    """The reaper still works: an operation added now expires at its deadline."""
    later = HostileOp(0.01, name="later", clock=clock)
    await p.try_complete_else_watch(later, ["later"])
    await clock.advance(0.02)
    assert later.expired, (
        "an operation added after the failing callback did not expire 10 ms past its "
        "deadline: the reaper has stopped"
    )
    assert await outcome_of(later) == ("result", "expired")


@kinds
async def test_on_complete_raising_in_check_and_complete_settles_and_walk_goes_on(
    kind: type[BaseException], clock: ManualClock
) -> None:
    async with asyncio.timeout(LIMIT), Purgatory("lc", clock=clock) as p:
        bad = HostileOp(1.0, name="bad", on_complete_hook=raiser(kind))
        good = HostileOp(1.0, name="good")
        await p.try_complete_else_watch(bad, ["k"])
        await p.try_complete_else_watch(good, ["k"])
        bad.completable = good.completable = True
        count, exc = call(p.check_and_complete, "k")
        assert exc is None, raised("check_and_complete", exc)
        assert count == 2, f"check_and_complete returned {count}, expected 2 completions"
        assert bad.is_completed and is_settled(bad), (
            f"{bad!r}: completed but never settled after on_complete raised {kind.__name__}"
        )
        kind_seen, value = await outcome_of(bad)
        assert kind_seen in ("error", "cancelled"), (kind_seen, value)
        assert isinstance(value, kind), f"awaiter got {value!r}, not the {kind.__name__} raised"
        assert good.completions == 1, "the walk stopped at the failing operation"
        assert await outcome_of(good) == ("result", "completed")
        stats = p.stats()
        assert (stats.completed, stats.callback_errors) == (2, 1), stats
        assert p.num_delayed == 0
        await expect_later_ops_expire(p, clock)


@kinds
async def test_on_complete_raising_in_force_complete_returns_true_and_settles(
    kind: type[BaseException], clock: ManualClock
) -> None:
    async with asyncio.timeout(LIMIT), Purgatory("lc", clock=clock) as p:
        op = HostileOp(1.0, on_complete_hook=raiser(kind))
        await p.try_complete_else_watch(op, ["k"])
        won, exc = call(op.force_complete)
        assert exc is None, raised("force_complete", exc)
        assert won is True
        assert is_settled(op), f"{op!r} completed but not settled"
        assert p.num_delayed == 0
        assert p.stats().callback_errors == 1
        await expect_later_ops_expire(p, clock)


@kinds
@pytest.mark.parametrize("op_class", [HostileOp, AsyncHostileOp], ids=["sync", "async"])
@pytest.mark.parametrize("stage", ["on_complete", "on_expiration"])
async def test_callback_raising_at_expiry_keeps_the_reaper_running(
    kind: type[BaseException], op_class: type[HostileOp], stage: str, clock: ManualClock
) -> None:
    async with asyncio.timeout(LIMIT), Purgatory("lc", clock=clock) as p:
        hook = {f"{stage}_hook": raiser(kind)}
        bad = op_class(0.01, name="bad", clock=clock, **hook)  # type: ignore[arg-type]
        same_tick = op_class(0.0101, name="same-tick", clock=clock)
        after = op_class(0.02, name="after", clock=clock)
        for op in (bad, same_tick, after):
            await p.try_complete_else_watch(op, ["k"])
        await clock.advance(0.015)
        assert bad.expired and bad.completions == 1
        kind_seen, value = await outcome_of(bad)
        assert isinstance(value, kind), f"awaiter of the failing op got {kind_seen} {value!r}"
        assert same_tick.expired, "the operation due right after the failing one never expired"
        await clock.advance(0.01)
        assert after.expired, "an operation due after the failing callback never expired"
        assert await outcome_of(after) == ("result", "expired")
        assert p.num_delayed == 0
        stats = p.stats()
        assert stats.expired == 3, stats
        assert stats.callback_errors == 1, (
            f"stats().callback_errors is {stats.callback_errors} after one callback raised "
            f"{kind.__name__}: {stats}"
        )
        await expect_later_ops_expire(p, clock)


@kinds
async def test_try_complete_raising_in_check_and_complete_settles_and_walk_goes_on(
    kind: type[BaseException], clock: ManualClock
) -> None:
    async with asyncio.timeout(LIMIT), Purgatory("lc", clock=clock) as p:
        bad = HostileOp(1.0, name="bad")
        good = HostileOp(1.0, name="good")
        await p.try_complete_else_watch(bad, ["k"])
        await p.try_complete_else_watch(good, ["k"])
        bad.try_hook = raiser(kind)
        good.completable = True
        count, exc = call(p.check_and_complete, "k")
        assert exc is None, raised("check_and_complete", exc)
        assert good.completions == 1, "the walk stopped at the operation whose try_complete raised"
        assert is_settled(bad), f"{bad!r} left pending with a condition that raises"
        assert bad.completions == 0, "on_complete ran for an operation whose try_complete raised"
        assert count == 2, f"check_and_complete returned {count}: both operations left pending"
        assert p.num_delayed == 0
        assert p.stats().callback_errors == 1
        await expect_later_ops_expire(p, clock)


@kinds
async def test_try_complete_raising_in_try_complete_else_watch_leaves_no_half_state(
    kind: type[BaseException], clock: ManualClock
) -> None:
    """Either the watch settles the operation with the error, or it raises it and the
    purgatory is untouched; never a counted, unwatched or unsettled operation."""
    async with asyncio.timeout(LIMIT), Purgatory("lc", clock=clock) as p:
        before = (p.num_delayed, p.watched)
        op = HostileOp(1.0, try_hook=raiser(kind))
        exc: BaseException | None = None
        try:
            done = await p.try_complete_else_watch(op, ["k"])
        except BaseException as error:  # what the watch let out, CancelledError included
            done, exc = None, error
        if exc is None:
            assert done is True and is_settled(op), f"{op!r}: watch returned {done}"
            assert (p.num_delayed, op.completions) == (0, 0)
        else:
            assert isinstance(exc, kind), exc
            assert not op.is_completed or is_settled(op), f"{op!r} completed but not settled"
            assert (p.num_delayed, p.watched) == before, "state changed by a refused watch"
        await expect_later_ops_expire(p, clock)


@kinds
async def test_on_complete_raising_at_shutdown_settles_every_operation(
    kind: type[BaseException], clock: ManualClock
) -> None:
    async with asyncio.timeout(LIMIT):
        p = Purgatory("lc", clock=clock)
        bad = HostileOp(5.0, name="bad", on_complete_hook=raiser(kind))
        good = HostileOp(5.0, name="good")
        await p.try_complete_else_watch(bad, ["k"])
        await p.try_complete_else_watch(good, ["k"])
        try:
            await p.shutdown()
        except BaseException as exc:
            raise AssertionError(raised("shutdown", exc)) from None
        assert good.expired and good.completions == 1, "shutdown stopped at the failing op"
        assert is_settled(bad) and is_settled(good)
        assert await outcome_of(good) == ("result", "expired")


@kinds
async def test_timer_callback_raising_keeps_the_timer_firing(
    kind: type[BaseException], clock: ManualClock
) -> None:
    async with asyncio.timeout(LIMIT):
        timer = Timer(tick=0.001, clock=clock)
        fired: list[str] = []

        def bad() -> None:
            fired.append("bad")
            raiser(kind)(None)

        timer.call_later(0.01, bad)
        timer.call_later(0.0101, fired.append, "same-tick")
        timer.call_later(0.02, fired.append, "after")
        await clock.advance(0.03)
        assert fired == ["bad", "same-tick", "after"], (
            f"timer callbacks run after one raised {kind.__name__}: {fired}"
        )
        assert len(timer) == 0
        timer.call_later(0.01, fired.append, "added-later")
        await clock.advance(0.02)
        assert fired[-1] == "added-later", "a timer added after the failing callback never fired"
        timer.close()
