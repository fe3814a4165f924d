"""The C prototype of the timer core (``bench/proto/cwheel.c``) behaves as a timer.

Its figures in ``python -m bench proto-timer`` mean something only if it does the
same work as ``purgatory_aio.Timer``: these drive it directly with a fake clock
(no event loop) and check the properties the library's timer guarantees. Then a
tiny run of the bench on each loop checks that every timer fired. They compile the
prototype, so they run under ``make bench-proto`` only, not in the default test run.
"""

from __future__ import annotations

import gc
import random
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest

from bench import proto_timer
from bench._common import Progress, uvloop_version

#: Compiles bench/proto/cwheel.c: run by `make bench-proto`, left out of `make test`.
pytestmark = pytest.mark.proto

LOOPS = ["asyncio"] + (["uvloop"] if uvloop_version() else [])


@pytest.fixture(scope="module")
def cwheel(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return proto_timer.load(tmp_path_factory.mktemp("proto"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sooner: list[float] = []

    def __call__(self) -> float:
        return self.now


def make(cwheel: Any, **kwargs: Any) -> tuple[Any, Clock]:
    clock = Clock()
    core = cwheel.Core(clock, clock.sooner.append, **kwargs)
    return core, clock


def run_until(core: Any, clock: Clock, end: float) -> None:
    """Advance as a reaper would: wake at each next due time up to ``end``."""
    for _ in range(1_000_000):
        when = core.next_due()
        if when > end:
            break
        clock.now = max(clock.now, when)
        core.advance(clock.now)
    clock.now = end
    core.advance(end)


def test_fires_in_deadline_order_never_early_at_every_level(cwheel: Any) -> None:
    core, clock = make(cwheel)
    rng = random.Random(7)
    fired: list[tuple[float, float]] = []
    delays = [
        rng.choice([0.0, 0.0005, 0.003, 0.5, 9.0, 700.0]) * rng.random() for _ in range(5_000)
    ]
    for delay in delays:
        deadline = clock.now + delay
        core.call_later(delay, lambda d=deadline: fired.append((d, clock.now)))
    assert len(core) == 5_000
    run_until(core, clock, clock.now + 800)
    assert len(fired) == 5_000 and len(core) == 0
    assert all(now >= deadline for deadline, now in fired), "nothing fires early"
    assert [d for d, _ in fired] == sorted(d for d, _ in fired), "deadline order"
    assert core.levels >= 4


def test_equal_deadlines_fire_in_insertion_order_with_args(cwheel: Any) -> None:
    core, clock = make(cwheel)
    fired: list[int] = []
    for i in range(100):
        core.call_later(0.25, fired.append, i)
    run_until(core, clock, clock.now + 1)
    assert fired == list(range(100))


def test_cancel_withdraws_once_and_stale_handles_do_nothing(cwheel: Any) -> None:
    core, clock = make(cwheel)
    fired: list[int] = []
    handles = [core.call_later(1.0 + i / 100, fired.append, i) for i in range(50)]
    assert handles[3].cancel() is True
    assert handles[3].cancel() is False
    assert handles[3].pending() is False
    # The cancelled slot is reused by the next add: the old handle must not reach it.
    reused = core.call_later(1.0, fired.append, 99)
    assert handles[3].cancel() is False and reused.pending()
    assert len(core) == 50
    run_until(core, clock, clock.now + 5)
    assert sorted(fired) == [0, 1, 2, *range(4, 50), 99]
    assert all(not h.pending() and h.cancel() is False for h in handles)


def test_a_callback_may_cancel_later_entries_of_its_own_batch(cwheel: Any) -> None:
    core, clock = make(cwheel)
    fired: list[str] = []
    later: list[Any] = []

    def first() -> None:
        fired.append("first")
        assert later[0].cancel() is True
        core.call_later(0.0, fired.append, "added")  # reuses the cancelled slot

    core.call_later(0.1, first)
    later.append(core.call_later(0.1, fired.append, "cancelled"))
    run_until(core, clock, clock.now + 1)
    assert fired == ["first", "added"]
    assert len(core) == 0


def test_a_callback_re_adding_itself_with_no_delay_waits_for_the_next_pass(cwheel: Any) -> None:
    core, clock = make(cwheel)
    runs = 0

    def again() -> None:
        nonlocal runs
        runs += 1
        core.call_later(0.0, again)

    core.call_later(0.01, again)
    clock.now += 0.02
    # Each pass fires each level-0 bucket at most once, so it ends: as with
    # loop.call_soon, the re-added callback runs again on a later pass.
    first = core.advance(clock.now)
    second = core.advance(clock.now)
    assert 1 <= first <= 20 and 1 <= second <= 20
    assert runs == first + second and len(core) == 1
    core.close()


def test_a_raising_callback_is_counted_and_the_pass_goes_on(
    cwheel: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    core, clock = make(cwheel)
    fired: list[int] = []
    reported: list[type[BaseException] | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_type))
    core.call_later(0.1, lambda: 1 / 0)
    core.call_later(0.1, fired.append, 1)
    run_until(core, clock, clock.now + 1)
    assert fired == [1] and core.errors == 1 and reported == [ZeroDivisionError]


def test_bad_input_is_refused_and_changes_nothing(cwheel: Any) -> None:
    core, _ = make(cwheel)
    for delay in (-1.0, float("nan"), float("inf"), 1e300):
        with pytest.raises(ValueError):
            core.call_later(delay, print)
    with pytest.raises(TypeError):
        core.call_later("1", print)
    with pytest.raises(TypeError):
        core.call_later(1.0, "not callable")
    assert len(core) == 0 and core.next_due() == float("inf")


def test_the_earliest_new_bucket_is_reported_sooner(cwheel: Any) -> None:
    core, clock = make(cwheel)
    core.call_later(5.0, print)
    # Due when its bucket cascades, at the start of its level-2 slot (400 ticks).
    assert clock.sooner == [pytest.approx(1004.8)]
    core.armed_when = clock.sooner[-1]
    core.call_later(10.0, print)  # later than armed: nothing to do
    assert len(clock.sooner) == 1
    core.call_later(1.0, print)
    assert clock.sooner[-1] == pytest.approx(1000.8)
    core.close()


def test_close_drops_everything_and_a_cycle_through_a_handle_is_collected(cwheel: Any) -> None:
    core, _ = make(cwheel)

    class Request:
        handle: Any = None

        def expire(self) -> None:  # pragma: no cover - never due
            raise AssertionError

    request = Request()
    request.handle = core.call_later(100.0, request.expire)
    probe = weakref.ref(request)
    del request
    gc.collect()
    assert probe() is not None, "the core owns the callback while it is pending"
    core.close()
    gc.collect()
    assert probe() is None and len(core) == 0
    # A core that is itself garbage, with a pending callback that refers back to it.
    core2, _ = make(cwheel)
    holder = Request()
    holder.handle = core2.call_later(100.0, holder.expire)
    holder.core = core2  # type: ignore[attr-defined]
    probe2 = weakref.ref(holder)
    del holder, core2
    gc.collect()
    assert probe2() is None


@pytest.mark.parametrize("loop_name", LOOPS)
def test_bench_every_contender_fires_every_timer(
    loop_name: str, cwheel: Any, tmp_path: Path
) -> None:
    from bench import w3

    params = w3.W3Params(sizes=(200, 2_000), pairs=2_000, chunk=256, expire_spread=0.05)
    table = w3.measure(loop_name, params, Progress(quiet=True), proto_timer.adders(cwheel))
    assert set(table) == {"harness", "timer", "proto", "call_later"}
    for name in ("timer", "proto", "call_later"):
        for size, row in table[name].items():
            assert row["fired"] == int(size)
            assert row["pending"] == int(size)
    record = proto_timer.build_record(loop_name, params, table)
    assert record["workload"] == "proto-timer" and record["headline"]


def test_handles_outlive_their_core_and_their_own_firing(cwheel: Any) -> None:
    core, clock = make(cwheel)
    results: list[bool] = []
    own: list[Any] = []
    own.append(core.call_later(0.1, lambda: results.append(own[0].cancel())))
    run_until(core, clock, clock.now + 1)
    assert results == [False], "a fired handle cancels nothing, even from its own callback"
    pending = core.call_later(50.0, print)
    del core
    gc.collect()
    assert pending.pending() is False and pending.cancel() is False
