"""Clock readings below zero and at the ends of the float range, and keys that raise.

* Negative clock readings are legal: a deadline whose tick index is -1 (or any other
  negative one) fires like any other, in a Timer and in a Purgatory.
* ``Timer.call_at`` with a deadline further back than the timer counts ticks
  (``-1e306``, ``-sys.float_info.max``) runs at once, counted exactly.
* ``ManualClock.advance`` refuses to move time out of the finite range, unchanged.
* A key whose ``__hash__`` or ``__eq__`` raises anything (not only TypeError) is refused
  with a TypeError naming it, by every call that takes a key, with nothing changed.
* The event record of an operation satisfied at its first try carries its keys.
"""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from lc_support import HostileOp, ListSink, outcome_of
from support import MockOperation

from purgatory_aio import Purgatory, Timer
from purgatory_aio.testing import ManualClock

# -- negative clock readings -------------------------------------------------------------------


async def test_a_deadline_at_tick_index_minus_one_fires() -> None:
    clock = ManualClock(start=-1.0)
    fired: list[float] = []
    timer = Timer(tick=0.001, clock=clock)
    handle = timer.call_at(-0.001, lambda: fired.append(clock.time()))
    assert len(timer) == 1
    await clock.advance(0.998)
    assert fired == []  # not yet: the clock reads -0.002
    await clock.advance_to(-0.001)
    assert fired == [-0.001] and not handle.pending() and len(timer) == 0
    timer.close()


async def test_an_operation_expiring_at_tick_index_minus_one_expires_and_its_awaiter_returns() -> (
    None
):
    clock = ManualClock(start=-1.0)
    async with Purgatory("neg", clock=clock) as p:
        op = HostileOp(0.999)
        assert await p.try_complete_else_watch(op, ["k"]) is False
        await clock.advance(0.998)
        assert not op.is_completed
        await clock.advance(0.002)
        assert op.expired and p.num_delayed == 0
        assert await outcome_of(op) == ("result", "expired")


async def test_a_zero_timeout_at_a_negative_half_tick_expires() -> None:
    clock = ManualClock(start=-0.0015)
    async with Purgatory("neg", clock=clock) as p:
        op = HostileOp(0.0)
        assert await p.try_complete_else_watch(op, ["k"]) is False
        await clock.advance(0.0)
        assert op.expired
        assert await outcome_of(op) == ("result", "expired")


STARTS = [-1.0, -0.0015, -0.001, -0.0005, -0.02, -5.0, -1e6 - 0.0005, -4e9]
TIMEOUTS = [0.0, 0.0005, 0.001, 0.0015, 0.019, 0.999, 1.0, 5.0]


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("tick", [0.001, 0.005])
async def test_operations_expire_at_their_deadline_on_a_clock_below_zero(
    start: float, tick: float
) -> None:
    clock = ManualClock(start=start)
    async with Purgatory("neg", clock=clock, tick=tick) as p:
        ops = [HostileOp(timeout, name=f"t={timeout}", clock=clock) for timeout in TIMEOUTS]
        for op in ops:
            assert await p.try_complete_else_watch(op, ["k", op.name]) is False
        for _ in range(800):
            await clock.advance(0.01)
            now = clock.time()
            for op in ops:
                deadline = op.deadline
                assert deadline is not None
                if op.expired:
                    assert op.completed_at is None or op.completed_at >= deadline
                else:
                    assert now < deadline, f"{op!r} still pending at {now}, deadline {deadline}"
            if all(op.expired for op in ops):
                break
        assert all(op.expired for op in ops) and p.num_delayed == 0


# -- Timer.call_at far in the past -------------------------------------------------------------


@pytest.mark.parametrize("when", [-1e306, -sys.float_info.max, -1e300, "-horizon"])
async def test_call_at_far_in_the_past_runs_at_once_counted_exactly(when: Any) -> None:
    clock = ManualClock(start=-2.0)
    timer = Timer(tick=0.001, clock=clock)
    instant = -timer.horizon if when == "-horizon" else when
    fired: list[str] = []
    handle = timer.call_at(instant, fired.append, "ran")
    assert len(timer) == 1
    assert handle.when() == max(instant, -timer.horizon)
    await clock.advance(0)
    assert fired == ["ran"] and len(timer) == 0
    # And the timer is as usable as before.
    timer.call_later(0.002, fired.append, "later")
    await clock.advance(0.002)
    assert fired == ["ran", "later"] and len(timer) == 0
    timer.close()


async def test_call_at_far_in_the_past_cancelled_before_it_runs_leaves_nothing() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    fired: list[int] = []
    handle = timer.call_at(-sys.float_info.max, fired.append, 1)
    assert handle.cancel() and len(timer) == 0
    await clock.advance(1)
    assert fired == [] and len(timer) == 0


@pytest.mark.parametrize("when", [-math.inf, math.nan, math.inf, 1e306])
async def test_call_at_refuses_a_time_it_cannot_place_before_counting_it(when: float) -> None:
    timer = Timer(clock=ManualClock())
    with pytest.raises(ValueError):
        timer.call_at(when, print)
    assert len(timer) == 0


# -- ManualClock at the end of the finite range ------------------------------------------------


async def test_manual_clock_refuses_to_advance_to_infinity() -> None:
    clock = ManualClock()
    await clock.advance(1e308)
    with pytest.raises(ValueError, match="finite range"):
        await clock.advance(1e308)
    assert clock.time() == 1e308
    with pytest.raises(ValueError, match="finite"):
        await clock.advance_to(math.inf)
    assert clock.time() == 1e308
    await clock.advance(1.0)  # still moves within the range
    assert clock.time() == 1e308


async def test_an_advance_refused_at_the_end_of_the_range_changes_nothing_for_a_purgatory() -> None:
    with pytest.raises(ValueError, match="too fine for this clock"):
        Timer(clock=ManualClock(start=1e308))  # too far out to be counted in ticks at all
    clock = ManualClock()
    async with Purgatory("far", clock=clock) as p:
        op = HostileOp(1.0)
        await p.try_complete_else_watch(op, ["k"])
        await clock.advance(1e308)  # far beyond the timer's horizon: everything expires
        assert op.expired and p.num_delayed == 0
        with pytest.raises(ValueError, match="finite range"):
            await clock.advance(1e308)
        # The purgatory refuses deadlines it cannot place, by name, and keeps its books.
        before = (p.stats(), p.num_delayed, p.watched)
        late = HostileOp(1.0)
        with pytest.raises(ValueError, match="beyond what the timer"):
            await p.try_complete_else_watch(late, ["k"])
        assert (p.stats(), p.num_delayed, p.watched) == before
        assert not late.is_completed and late.keys == ()


async def test_a_timer_whose_clock_runs_past_its_horizon_fires_everything_and_keeps_going() -> None:
    clock = ManualClock()
    timer = Timer(tick=0.001, clock=clock)
    fired: list[int] = []
    for n in range(5):
        timer.call_later(n * 0.4, fired.append, n)
    await clock.advance(1e300)
    assert fired == [0, 1, 2, 3, 4] and len(timer) == 0
    assert timer.errors == 0
    timer.close()


# -- keys whose __hash__ or __eq__ raise anything ----------------------------------------------


class HashRaises:
    def __init__(self, error: type[Exception]) -> None:
        self.error = error

    def __hash__(self) -> int:
        raise self.error("hash refused")

    def __repr__(self) -> str:
        return f"<HashRaises {self.error.__name__}>"


class EqRaises:
    """Hashes like 7 (a watched key), then refuses to be compared."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        raise self.error("comparison refused")

    def __repr__(self) -> str:
        return f"<EqRaises {self.error.__name__}>"


class CustomError(Exception):
    pass


ERRORS = [ValueError, RuntimeError, KeyError, ZeroDivisionError, CustomError]
KEY_KINDS = {"hash": (HashRaises, "cannot be hashed"), "eq": (EqRaises, "cannot be compared")}

CALLS: dict[str, Callable[[Purgatory, Any], Awaitable[Any] | Any]] = {
    "try_complete_else_watch": lambda p, key: p.try_complete_else_watch(
        MockOperation(1), ["a", key]
    ),
    "watch_and_wait": lambda p, key: p.watch_and_wait(MockOperation(1), [key]),
    "watch_threshold": lambda p, key: p.watch_threshold(MockOperation(1), key, 3),
    "advance_key": lambda p, key: p.advance_key(key, 5),
    "check_and_complete": lambda p, key: p.check_and_complete(key),
    "cancel_for_key": lambda p, key: p.cancel_for_key(key),
}
#: Hashing is all it does before handing the key to the loop (see the test after).
HASHING_CALLS = {
    "check_and_complete_threadsafe": lambda p, key: p.check_and_complete_threadsafe(key),
}
CASES = [(call, kind) for call in CALLS for kind in KEY_KINDS] + [
    (call, "hash") for call in HASHING_CALLS
]


@pytest.mark.parametrize("error", ERRORS)
@pytest.mark.parametrize(("call", "kind"), CASES)
async def test_a_key_raising_anything_is_refused_with_a_type_error_naming_it(
    clock: ManualClock, call: str, kind: str, error: type[Exception]
) -> None:
    make, text = KEY_KINDS[kind]
    key = make(error)
    async with Purgatory("keys", clock=clock) as p:
        held = MockOperation(5)
        await p.try_complete_else_watch(held, [7, "a"])  # 7: the bad key's hash
        await p.watch_threshold(MockOperation(5), 7, 1.0)
        before = (p.stats(), p.num_delayed, p.watched)
        with pytest.raises(TypeError, match=rf"{type(key).__name__} {error.__name__}.*{text}"):
            result = {**CALLS, **HASHING_CALLS}[call](p, key)
            if asyncio.iscoroutine(result):
                await result
        assert (p.stats(), p.num_delayed, p.watched) == before
        assert not held.is_completed and not held.cancelled
        assert p.cancel_for_key("a") == [held]  # still watched, as before


async def test_a_key_raising_is_refused_by_the_threadsafe_check_on_the_loop(
    clock: ManualClock,
) -> None:
    async with Purgatory("keys", clock=clock) as p:
        await p.try_complete_else_watch(MockOperation(5), [7])
        future = p.check_and_complete_threadsafe(EqRaises(ValueError))
        with pytest.raises(TypeError, match=r"EqRaises ValueError.*cannot be compared"):
            await asyncio.wrap_future(future)
        assert p.num_delayed == 1


# -- the event record of an operation satisfied at its first try --------------------------------


@pytest.mark.parametrize("threshold", [None, 2.0])
async def test_event_of_an_operation_satisfied_at_its_first_try_has_its_keys(
    clock: ManualClock, threshold: float | None
) -> None:
    sink = ListSink()
    async with Purgatory("lc", clock=clock, event_sink=sink) as p:
        op = HostileOp(1.0, completable=True)
        if threshold is None:
            assert await p.try_complete_else_watch(op, ["a", ("b", 1)]) is True
            keys = ["a", str(("b", 1))]
        else:
            assert await p.watch_threshold(op, "hw", threshold) is True
            keys = ["hw"]
        (event,) = sink.events
        assert (event.outcome, event.keys) == ("completed", keys)
        assert (p.num_delayed, p.watched) == (0, 0)


async def test_stats_answer_with_a_watched_key_that_raises_when_compared(
    clock: ManualClock,
) -> None:
    async with Purgatory("keys", clock=clock) as p:
        # Accepted: nothing watched shares its hash yet, so nothing compares it.
        await p.try_complete_else_watch(MockOperation(5), [EqRaises(ValueError)])
        await p.watch_threshold(MockOperation(5), 7, 1.0)  # 7: its hash
        stats = p.stats()
        assert (stats.watched_keys, stats.pending) == (2, 1 + 1)
