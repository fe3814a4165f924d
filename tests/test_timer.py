"""The timer's contract: ported from the ideas of Kafka's TimerTest, plus asyncio specifics."""

from __future__ import annotations

import asyncio
import itertools
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import Recorder

from purgatory_aio import Timer
from purgatory_aio.testing import ManualClock


def bucketed(timer: Timer) -> int:
    """Entries physically held in the wheel's buckets."""
    return sum(len(b) for wheel in timer._levels for b in wheel.buckets)


async def test_already_expired_entries_run_without_time_passing() -> None:
    clock = ManualClock(start=10.0)
    timer = Timer(clock=clock)
    fired = Recorder()
    for i in range(-5, 1):
        timer.call_at(10.0 + i * 0.001, fired, i)
    await clock.advance(0)
    assert sorted(fired.calls) == list(range(-5, 1))
    assert len(timer) == 0


async def test_entries_expire_in_deadline_order() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    fired = Recorder()
    delays = [i * 0.001 for i in range(0, 500)] + [i * 0.0137 for i in range(100)]
    random.Random(7).shuffle(delays)
    for delay in delays:
        timer.call_later(delay, fired, delay)
    while len(timer):
        await clock.advance(0.0005)
    assert fired.calls == sorted(delays)


async def test_entry_never_runs_before_its_deadline() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    fired = Recorder()
    timer.call_later(0.0105, fired, "x")
    await clock.advance(0.0104)
    assert fired.calls == []
    await clock.advance(0.0001)  # at the deadline: due, fired at the next tick boundary
    await clock.advance(0.0005)
    assert fired.calls == ["x"]


async def test_entry_runs_within_one_tick_of_its_deadline() -> None:
    clock = ManualClock()
    timer = Timer(tick=0.01, clock=clock)
    seen: list[float] = []
    timer.call_later(0.123, lambda: seen.append(clock.time()))
    await clock.advance(1.0)
    assert len(seen) == 1
    assert 0.123 <= seen[0] <= 0.123 + 0.01


async def test_advancing_within_a_tick_fires_nothing_early() -> None:
    clock = ManualClock()
    timer = Timer(tick=1.0, clock=clock)
    fired = Recorder()
    timer.call_later(0.5, fired, "half")
    await clock.advance(0.4)
    assert fired.calls == []
    await clock.advance(0.7)
    assert fired.calls == ["half"]


async def test_adding_into_the_current_tick_waits_for_the_deadline() -> None:
    clock = ManualClock(start=5.0)
    timer = Timer(tick=1.0, clock=clock)
    fired = Recorder()
    await clock.advance(0.2)  # inside tick [5, 6)
    timer.call_later(0.3, fired, "current")
    await clock.advance(0.29)
    assert fired.calls == []
    await clock.advance(0.6)
    assert fired.calls == ["current"]


async def test_rescheduling_moves_an_entry() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    fired = Recorder()
    handle = timer.call_later(0.010, fired, "moved")
    handle.reschedule(0.050)
    assert len(timer) == 1
    assert bucketed(timer) == 1
    await clock.advance(0.049)
    assert fired.calls == []
    await clock.advance(0.002)
    assert fired.calls == ["moved"]
    assert len(timer) == 0


async def test_counts_exclude_cancelled_and_fired_entries() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    handles = [timer.call_later(0.001 * i, lambda: None) for i in range(100)]
    assert len(timer) == 100
    for handle in handles[::2]:
        handle.cancel()
    assert len(timer) == 50
    await clock.advance(0.050)
    assert len(timer) == 100 - 50 - 25
    await clock.advance(1)
    assert len(timer) == 0
    assert bucketed(timer) == 0


async def test_cancel_removes_the_entry_at_once() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    handle = timer.call_later(3600, lambda: None)
    assert bucketed(timer) == 1
    assert handle.cancel() is True
    assert bucketed(timer) == 0
    assert len(timer) == 0
    assert handle.cancel() is False
    assert handle.cancelled()


async def test_cancel_after_running_returns_false() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    fired = Recorder()
    handle = timer.call_later(0.001, fired, 1)
    await clock.advance(0.01)
    assert fired.calls == [1]
    assert handle.cancel() is False
    assert not handle.cancelled()


async def test_overflow_levels_are_created_only_when_needed() -> None:
    clock = ManualClock()
    timer = Timer(tick=0.001, wheel_size=20, clock=clock)
    timer.call_later(0.015, lambda: None)
    assert timer.levels == 1
    timer.call_later(0.3, lambda: None)  # beyond 20 ms: a 400 ms level
    assert timer.levels == 2
    timer.call_later(5.0, lambda: None)  # beyond 400 ms: an 8 s level
    assert timer.levels == 3
    await clock.advance(10)
    assert len(timer) == 0


async def test_far_deadlines_cascade_down_and_fire_on_time() -> None:
    clock = ManualClock()
    timer = Timer(tick=0.001, wheel_size=4, clock=clock)
    seen: list[float] = []
    timer.call_later(12345.678, lambda: seen.append(clock.time()))
    assert timer.levels >= 8  # no limit on the number of levels
    await clock.advance(12345.677)
    assert seen == []
    await clock.advance(0.002)
    assert len(seen) == 1
    assert 12345.678 <= seen[0] <= 12345.678 + 0.001 + 1e-9


async def test_an_earlier_deadline_rearms_the_reaper() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    timer.call_later(10.0, lambda: None)
    await clock.advance(0)
    first = clock.next_due()
    assert first is not None and first > 5.0
    timer.call_later(0.005, lambda: None)
    await asyncio.sleep(0)  # re-armed before the loop waits again
    earlier = clock.next_due()
    assert earlier is not None and earlier <= 0.006


async def test_a_timeout_added_and_cancelled_at_once_leaves_the_wakeup_alone() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    timer.call_later(10.0, lambda: None)
    await clock.advance(0)
    armed = timer._armed
    for _ in range(100):
        timer.call_later(0.2, lambda: None).cancel()
    await asyncio.sleep(0)
    assert timer._armed is armed
    assert len(timer) == 1


async def test_an_idle_timer_has_no_wakeups() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    timer.call_later(0.01, lambda: None)
    timer.call_later(0.5, lambda: None).cancel()
    await clock.advance(0.02)
    wakeups = timer.wakeups
    assert clock.next_due() is None
    await clock.advance(1.0)
    assert timer.wakeups == wakeups


async def test_cancelling_everything_disarms_the_reaper() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    handles = [timer.call_later(0.1 * i, lambda: None) for i in range(1, 20)]
    for handle in handles:
        handle.cancel()
    assert clock.next_due() is None
    await clock.advance(5.0)
    assert timer.wakeups == 0


async def test_wakeups_are_per_bucket_not_per_entry() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    for _ in range(1000):
        timer.call_later(0.0105, lambda: None)
    await clock.advance(0.05)
    assert timer.wakeups == 1


async def test_an_entry_fires_at_its_own_deadline_not_at_the_end_of_its_tick() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)  # 1 ms ticks: both deadlines fall in the same bucket
    fired = Recorder()
    timer.call_at(0.0108, fired, "b")
    timer.call_at(0.0102, fired, "a")
    await clock.advance_to(0.0102)
    assert fired.calls == ["a"]
    await clock.advance_to(0.01079)
    assert fired.calls == ["a"]
    await clock.advance_to(0.0108)
    assert fired.calls == ["a", "b"]
    assert timer.wakeups == 2


async def test_a_callback_re_adding_itself_with_no_delay_runs_again_on_a_later_pass() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    runs: list[float] = []

    def again() -> None:
        runs.append(clock.time())
        if len(runs) < 50:
            timer.call_later(0, again)

    timer.call_later(0.01, again)
    await clock.advance(0.02)
    # Each re-added run is due at once, yet waits for the next reaper pass (the loop runs
    # in between), as loop.call_soon would: the reaper never spins on it.
    assert len(runs) == 50 and runs[0] == 0.01
    assert timer.wakeups >= 50


async def test_callbacks_may_add_and_cancel_timers_reentrantly() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    fired = Recorder()
    victim = timer.call_later(0.0101, fired, "victim")

    def first() -> None:
        fired("first")
        victim.cancel()  # due in the same bucket, not yet run
        timer.call_later(0, fired, "added-now")
        timer.call_later(0.002, fired, "added-later")

    timer.call_later(0.0100, first)
    await clock.advance(0.011)
    assert fired.calls == ["first", "added-now"]
    await clock.advance(0.004)
    assert fired.calls == ["first", "added-now", "added-later"]
    assert len(timer) == 0


async def test_a_callback_rescheduling_itself_runs_again() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    runs: list[float] = []

    def tick() -> None:
        runs.append(clock.time())
        if len(runs) < 3:
            handle.reschedule(0.1)

    handle = timer.call_later(0.1, tick)
    await clock.advance(1)
    assert len(runs) == 3
    assert all(b - a >= 0.1 for a, b in itertools.pairwise(runs))


async def test_a_failing_callback_is_counted_and_others_still_run() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    fired = Recorder()

    def boom() -> None:
        raise ValueError("boom")

    timer.call_later(0.001, boom)
    timer.call_later(0.001, fired, "after")
    timer.call_later(0.5, fired, "later")
    await clock.advance(1)
    assert fired.calls == ["after", "later"]
    assert timer.errors == 1


@pytest.mark.parametrize(
    ("delay", "error"),
    [
        (-0.001, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        ("1", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
)
async def test_bad_delays_are_rejected_and_leave_the_timer_unchanged(
    delay: object, error: type[Exception]
) -> None:
    timer = Timer(clock=ManualClock())
    timer.call_later(1, lambda: None)
    with pytest.raises(error, match="delay"):
        timer.call_later(delay, lambda: None)  # type: ignore[arg-type]
    assert len(timer) == 1


async def test_bad_callback_and_instant_are_rejected() -> None:
    timer = Timer(clock=ManualClock())
    with pytest.raises(TypeError, match="callback must be callable, got 42"):
        timer.call_later(1, 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="when"):
        timer.call_at(math.nan, print)
    assert len(timer) == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"tick": 0}, ValueError, "tick must be > 0, got 0"),
        ({"tick": -1.0}, ValueError, "tick"),
        ({"tick": math.nan}, ValueError, "tick"),
        ({"wheel_size": 0}, ValueError, "wheel_size must be >= 2, got 0"),
        ({"wheel_size": 2.5}, TypeError, "wheel_size must be an int"),
    ],
)
def test_bad_wheel_shapes_are_rejected(kwargs: dict[str, object], error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        Timer(**kwargs)  # type: ignore[arg-type]


def test_a_timer_needs_a_running_loop_to_schedule() -> None:
    timer = Timer(clock=ManualClock())
    with pytest.raises(RuntimeError, match="running event loop"):
        timer.call_later(1, print)
    assert len(timer) == 0


async def test_close_drops_pending_entries_without_running_them() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    fired = Recorder()
    handle = timer.call_later(0.01, fired, "x")
    timer.close()
    assert len(timer) == 0
    assert handle.cancelled()
    await clock.advance(1)
    assert fired.calls == []


async def test_after_idling_new_entries_start_on_the_lowest_level() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    timer.call_later(0.001, lambda: None)
    await clock.advance(3600)
    timer.call_later(0.005, lambda: None)
    assert timer.levels == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    deadlines=st.lists(
        st.floats(min_value=0, max_value=3, allow_nan=False), min_size=1, max_size=60
    ),
    steps=st.lists(st.floats(min_value=0, max_value=0.4, allow_nan=False), min_size=1, max_size=20),
    tick=st.sampled_from([0.001, 0.004, 0.05]),
    size=st.integers(min_value=2, max_value=20),
)
def test_never_early_and_at_most_one_tick_late(
    deadlines: list[float], steps: list[float], tick: float, size: int
) -> None:
    async def scenario() -> None:
        clock = ManualClock()
        timer = Timer(tick=tick, wheel_size=size, clock=clock)
        fired: dict[int, float] = {}
        for i, deadline in enumerate(deadlines):
            timer.call_at(deadline, lambda i=i: fired.__setitem__(i, clock.time()))
        for step in steps:
            await clock.advance(step)
            for i, at in fired.items():
                assert at >= deadlines[i]
            for i, deadline in enumerate(deadlines):
                if deadline + tick < clock.time() - 1e-9:
                    assert i in fired, "late by more than a tick"
        await clock.advance(4)
        assert sorted(fired) == list(range(len(deadlines)))
        for i, at in fired.items():
            assert deadlines[i] <= at <= deadlines[i] + tick + 1e-9
        assert len(timer) == 0

    asyncio.run(scenario())


async def test_equal_deadlines_fire_in_the_order_they_were_added() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    fired = Recorder()
    for i in range(200):
        timer.call_at(0.0105, fired, i)
    await clock.advance(0.02)
    assert fired.calls == list(range(200))


def test_a_timer_refuses_a_second_event_loop() -> None:
    timer = Timer()

    async def schedule() -> None:
        timer.call_later(0, lambda: None)
        await asyncio.sleep(0.01)

    asyncio.run(schedule())
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(schedule())


async def test_advance_lets_a_chain_of_woken_tasks_finish_before_time_moves_on() -> None:
    # Eight tasks hand a token on through queues: nothing the clock can see changes
    # between the hops, yet every hop must run at t=1, before the wake-up due at t=2.
    clock = ManualClock()
    queues: list[asyncio.Queue[int]] = [asyncio.Queue() for _ in range(9)]
    seen: list[float] = []

    async def first() -> None:
        await clock.sleep(1.0)
        await queues[0].put(0)

    async def hop(i: int) -> None:
        token = await queues[i].get()
        seen.append(clock.time())
        await queues[i + 1].put(token + 1)

    async def later() -> None:
        await clock.sleep(2.0)

    tasks = [asyncio.create_task(first()), asyncio.create_task(later())]
    tasks += [asyncio.create_task(hop(i)) for i in range(8)]
    await clock.advance(3.0)
    assert seen == [1.0] * 8
    assert queues[8].get_nowait() == 8
    await asyncio.gather(*tasks)
