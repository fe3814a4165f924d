"""Edges of the lifecycle: interrupts, threads, shutdown races, values the timer cannot place.

Each test names one guarantee. Where the contract leaves a choice (a huge but finite
timeout may be refused or treated as "effectively never"), the test accepts either
consistent behaviour and nothing else: never an OverflowError, never a hang, never a
counted operation that nothing will settle.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from lc_support import (
    LOOP_FACTORIES,
    AsyncHostileOp,
    HostileOp,
    is_settled,
    outcome_of,
    raised,
    raiser,
    run_on,
)

import purgatory_aio
from purgatory_aio import DelayedOperation, Purgatory, Timer
from purgatory_aio.testing import ManualClock

LIMIT = 10.0

loops = pytest.mark.parametrize("loop_name", list(LOOP_FACTORIES))


# -- KeyboardInterrupt / SystemExit: may propagate, leave nothing half-settled ---------------


@loops
@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("path", ["check_and_complete", "expiry"])
def test_interrupt_from_on_complete_may_propagate_but_leaves_nothing_half_settled(
    loop_name: str, kind: type[BaseException], path: str
) -> None:
    loop = LOOP_FACTORIES[loop_name]()
    try:
        clock = ManualClock()
        p = Purgatory("lc", clock=clock)
        bad = HostileOp(0.01, name="bad", on_complete_hook=raiser(kind))
        good = HostileOp(0.02, name="good")

        async def watch() -> None:
            await p.try_complete_else_watch(bad, ["k"])
            await p.try_complete_else_watch(good, ["k"])

        async def drive() -> None:
            if path == "check_and_complete":
                bad.completable = True
                p.check_and_complete("k")
            else:
                await clock.advance(0.015)

        assert run_on(loop, watch()) == (None, None)
        _, exc = run_on(loop, drive())
        assert exc is None or isinstance(exc, kind), raised(path, exc)
        assert bad.completions == 1
        assert is_settled(bad), (
            f"{kind.__name__} from on_complete left {bad!r} completed but never settled"
        )
        _, exc = run_on(loop, p.shutdown())
        assert exc is None, raised("shutdown after the interrupt", exc)
        assert is_settled(good) and good.completions == 1, f"{good!r} not settled by shutdown"
    finally:
        loop.close()


# -- shutdown waits for what another thread completed --------------------------------------


class SlowAsyncOp(DelayedOperation[str]):
    """Its async on_complete takes a few real milliseconds and notes that it finished."""

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.started = 0
        self.finished = 0

    def try_complete(self) -> bool:
        return False

    async def on_complete(self) -> str:
        self.started += 1
        for _ in range(3):
            await asyncio.sleep(0.005)
        self.finished += 1
        return "done"


@loops
def test_shutdown_under_asyncio_run_waits_for_on_complete_of_ops_a_thread_completed(
    loop_name: str,
) -> None:
    ops = [SlowAsyncOp(30.0) for _ in range(5)]
    won: list[bool] = []

    async def main() -> list[int]:
        async with Purgatory("lc") as p:
            for i, op in enumerate(ops):
                await p.try_complete_else_watch(op, [i])
            thread = threading.Thread(target=lambda: won.extend(op.force_complete() for op in ops))
            thread.start()
            thread.join()
        # shutdown has returned: every on_complete begun before it must have ended
        return [op.finished for op in ops]

    with asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner:
        finished_at_shutdown = runner.run(asyncio.wait_for(main(), LIMIT))
    assert won == [True] * 5
    assert finished_at_shutdown == [1] * 5, (
        f"shutdown() returned while on_complete of operations a thread completed before it "
        f"was still running (finished: {finished_at_shutdown})"
    )
    assert all(op.result() == "done" for op in ops)


@loops
def test_shutdown_awaits_a_threads_hand_over_without_polling(
    loop_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The shutdown expires the first operation; its on_complete has another thread
    # complete one operation and cancel another while the loop is busy, so both are
    # ended but their hand-overs are still queued when the shutdown reaches them. It
    # must return once the hand-overs have settled them, woken by those settlements,
    # not by a timer of its own.
    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    def watching_sleep(delay: float, *args: Any, **kwargs: Any) -> Any:
        sleeps.append(delay)
        return real_sleep(delay, *args, **kwargs)

    completed, cancelled = HostileOp(30, name="completed"), HostileOp(30, name="cancelled")

    def other_thread() -> None:
        assert completed.force_complete() and cancelled.cancel()

    def end_the_others_from_a_thread(op: Any) -> None:
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()  # the loop is blocked meanwhile: both hand-overs are queued

    first = HostileOp(10, name="first", on_complete_hook=end_the_others_from_a_thread)

    async def main() -> None:
        p = Purgatory("lc", clock=ManualClock())
        for i, op in enumerate((first, completed, cancelled)):
            await p.try_complete_else_watch(op, [i])
        monkeypatch.setattr(asyncio, "sleep", watching_sleep)
        try:
            await p.shutdown()
        finally:
            monkeypatch.undo()
        assert completed.done() and cancelled.done()
        assert p.num_delayed == 0

    with asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner:
        runner.run(asyncio.wait_for(main(), LIMIT))
    assert first.outcome == "shutdown" and first.finished == 1
    assert completed.outcome == "completed" and completed.finished == 1
    assert cancelled.cancelled and cancelled.finished == 0
    assert [delay for delay in sleeps if delay > 0] == []


@loops
def test_shutdown_racing_a_completing_thread_leaves_no_callback_unfinished(
    loop_name: str,
) -> None:
    ops = [SlowAsyncOp(30.0) for _ in range(200)]
    by_thread: list[SlowAsyncOp] = []
    go = threading.Event()

    def complete_all() -> None:
        go.wait(LIMIT)
        for op in ops:
            if op.force_complete():
                by_thread.append(op)

    async def main() -> tuple[list[SlowAsyncOp], list[SlowAsyncOp]]:
        p = Purgatory("lc")
        for i, op in enumerate(ops):
            await p.try_complete_else_watch(op, [i])
        thread = threading.Thread(target=complete_all)
        thread.start()
        go.set()
        await asyncio.sleep(0.002)
        await p.shutdown()
        before_return = list(by_thread)
        unfinished = [op for op in ops if op.started and not op.finished]
        await asyncio.get_running_loop().run_in_executor(None, thread.join)
        return before_return, unfinished

    with asyncio.Runner(loop_factory=LOOP_FACTORIES[loop_name]) as runner:
        before_return, unfinished = runner.run(asyncio.wait_for(main(), LIMIT))
        for op in ops:
            runner.run(asyncio.wait_for(_settled(op), LIMIT))
    late = [op for op in before_return if not op.finished]
    assert not unfinished and not late, (
        f"shutdown() returned with {len(unfinished)} on_complete still running and "
        f"{len(late)} thread-completed operations unsettled"
    )


async def _settled(op: DelayedOperation[Any]) -> None:
    await outcome_of(op)


# -- values the timer cannot place ---------------------------------------------------------

HUGE_TIMEOUTS = [1e306, sys.float_info.max, 10**400]
HUGE_IDS = ["1e306", "float_max", "10**400"]


def show(value: float) -> str:
    """A number for a failure message: 10**400 as such, not as 401 digits."""
    if isinstance(value, int) and abs(value) > 10**20:
        return f"10**{len(str(abs(value))) - 1}"
    return repr(value)


@pytest.mark.parametrize("seconds", HUGE_TIMEOUTS, ids=HUGE_IDS)
async def test_enormous_timeout_is_refused_unchanged_or_pending_until_shutdown(
    seconds: float, clock: ManualClock
) -> None:
    async with asyncio.timeout(LIMIT):
        p = Purgatory("lc", clock=clock)
        other = HostileOp(1.0, name="other")
        await p.try_complete_else_watch(other, ["other"])
        before = (p.num_delayed, p.watched, p.stats())
        try:
            op = HostileOp(seconds, name="huge")
            await p.try_complete_else_watch(op, ["k"])
        except (ValueError, TypeError) as exc:
            assert (p.num_delayed, p.watched, p.stats()) == before, (
                f"refusing timeout={show(seconds)} ({exc}) changed the purgatory"
            )
            if "op" in locals():  # refused by the watch: the operation is still free
                assert op.force_complete() is True and op.completions == 1
        except BaseException as exc:
            raise AssertionError(
                f"timeout={show(seconds)} raised {type(exc).__name__}({exc}), "
                "not the documented ValueError/TypeError"
            ) from None
        else:
            # "effectively never": pending, counted, and settled by shutdown
            assert (p.num_delayed, p.watched) == (2, 2), (p.num_delayed, p.watched)
            await clock.advance(1e6)
            assert other.expired and not op.is_completed, f"{op!r} expired long before"
            assert p.num_delayed == 1
        await asyncio.wait_for(p.shutdown(), LIMIT)
        if "op" in locals():
            assert is_settled(op), f"shutdown left {op!r} unsettled"
            assert op.completions == 1
        assert is_settled(other)


@pytest.mark.parametrize("delay", HUGE_TIMEOUTS, ids=HUGE_IDS)
@pytest.mark.parametrize("method", ["call_later", "call_at"])
async def test_enormous_timer_delay_is_refused_unchanged_or_pending_until_close(
    delay: float, method: str, clock: ManualClock
) -> None:
    timer = Timer(tick=0.001, clock=clock)
    fired: list[str] = []
    timer.call_later(0.01, fired.append, "normal")
    try:
        handle = getattr(timer, method)(delay, fired.append, "huge")
    except (ValueError, TypeError):
        assert len(timer) == 1, f"a refused {method} changed len(timer) to {len(timer)}"
    except BaseException as exc:
        raise AssertionError(
            f"{method}({show(delay)}) raised {type(exc).__name__}({exc}), not ValueError/TypeError"
        ) from None
    else:
        assert len(timer) == 2
        await clock.advance(1e6)
        assert fired == ["normal"] and len(timer) == 1
        assert handle.cancel() is True and len(timer) == 0
    await clock.advance(0.02)
    assert fired == ["normal"], "the timer stopped after an enormous delay was offered"
    timer.close()
    assert len(timer) == 0


BAD_TICKS = [5e-324, 1e-310, sys.float_info.max, 1e300]
BAD_TICK_IDS = ["5e-324", "subnormal-1e-310", "float_max", "1e300"]


async def _works_or_refused(make: Callable[[], Any], what: str) -> Any:
    try:
        return make()
    except ValueError:
        return None
    except BaseException as exc:
        raise AssertionError(f"{what} raised {type(exc).__name__}({exc}), not ValueError") from None


@pytest.mark.parametrize("tick", BAD_TICKS, ids=BAD_TICK_IDS)
@pytest.mark.parametrize("virtual", [True, False], ids=["ManualClock", "loop-clock"])
async def test_unplaceable_tick_is_refused_or_the_purgatory_still_expires_on_time(
    tick: float, virtual: bool
) -> None:
    async with asyncio.timeout(LIMIT):
        clock = ManualClock() if virtual else None
        p = await _works_or_refused(
            lambda: Purgatory("lc", tick=tick, clock=clock), f"Purgatory(tick={tick!r})"
        )
        if p is None:
            return
        op = HostileOp(0.05, clock=p.clock)
        try:
            await p.try_complete_else_watch(op, ["k"])
        except BaseException as exc:
            raise AssertionError(
                f"Purgatory(tick={tick!r}) was accepted but watching failed: "
                f"{type(exc).__name__}({exc}); refuse the tick with ValueError instead"
            ) from None
        if clock is not None:
            await clock.advance(0.049)
            assert not op.is_completed, "expired early"
            await clock.advance(0.002)
        assert await outcome_of(op) == ("result", "expired")
        if clock is not None:
            assert op.completed_at is not None and op.completed_at >= 0.05, "expired early"
        await p.shutdown()


@pytest.mark.parametrize("tick", BAD_TICKS, ids=BAD_TICK_IDS)
@pytest.mark.parametrize("virtual", [True, False], ids=["ManualClock", "loop-clock"])
async def test_unplaceable_tick_is_refused_or_the_timer_still_fires_on_time(
    tick: float, virtual: bool
) -> None:
    async with asyncio.timeout(LIMIT):
        clock = ManualClock() if virtual else None
        timer = await _works_or_refused(
            lambda: Timer(tick=tick, clock=clock), f"Timer(tick={tick!r})"
        )
        if timer is None:
            return
        fired = asyncio.Event()
        try:
            timer.call_later(0.05, fired.set)
        except BaseException as exc:
            raise AssertionError(
                f"Timer(tick={tick!r}) was accepted but call_later failed: "
                f"{type(exc).__name__}({exc}); refuse the tick with ValueError instead"
            ) from None
        if clock is not None:
            await clock.advance(0.049)
            assert not fired.is_set(), "fired early"
            await clock.advance(0.002)
            assert fired.is_set(), f"Timer(tick={tick!r}) did not fire at its deadline"
        else:
            await asyncio.wait_for(fired.wait(), 2.0)
        timer.close()


# -- the same inputs refused on both builds --------------------------------------------------

BOOL_ARGS: list[tuple[str, Callable[[], object]]] = [
    ("Purgatory tick", lambda: Purgatory("lc", tick=True)),
    ("Purgatory wheel_size", lambda: Purgatory("lc", wheel_size=True)),
    ("Purgatory purge_interval", lambda: Purgatory("lc", purge_interval=True)),
    ("Purgatory offload_threads", lambda: Purgatory("lc", offload_threads=True)),
    ("Timer tick", lambda: Timer(tick=True)),
    ("Timer wheel_size", lambda: Timer(wheel_size=True)),
    ("DelayedOperation timeout", lambda: HostileOp(True)),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("what", "make"), BOOL_ARGS, ids=[what for what, _ in BOOL_ARGS])
def test_bool_where_a_number_is_expected_is_refused_with_type_error(
    what: str, make: Callable[[], object]
) -> None:
    """True is an int to Python; as a tick or a count it is a mistake, on both builds."""
    try:
        make()
    except TypeError:
        return
    except BaseException as exc:
        raise AssertionError(
            f"{what}=True raised {type(exc).__name__}({exc}), not TypeError"
        ) from None
    raise AssertionError(f"{what}=True was accepted; a bool must be refused with TypeError")


@pytest.mark.parametrize("method", ["call_later", "call_at"])
async def test_bool_timer_delay_is_refused_with_type_error(method: str) -> None:
    timer = Timer()
    with pytest.raises(TypeError):
        getattr(timer, method)(True, print)
    assert len(timer) == 0


async def test_bool_threshold_is_refused_with_type_error(clock: ManualClock) -> None:
    async with Purgatory("lc", clock=clock) as p:
        with pytest.raises(TypeError):
            await p.watch_threshold(HostileOp(1.0), "k", True)
        assert (p.num_delayed, p.watched) == (0, 0)


# -- Purgatory and Timer are final on both builds; no weak references ------------------


@pytest.mark.parametrize("base", [Purgatory, Timer], ids=["Purgatory", "Timer"])
def test_purgatory_and_timer_are_final_on_both_builds(base: type) -> None:
    with pytest.raises(TypeError):
        type("Sub", (base,), {})


def test_the_pure_classes_say_why_a_subclass_is_refused() -> None:
    if purgatory_aio.compiled:
        pytest.skip("the compiled classes refuse subclasses with CPython's own message")
    with pytest.raises(TypeError, match="Purgatory is final and cannot be subclassed"):

        class NamedPurgatory(Purgatory):  # type: ignore[misc]
            pass


def test_the_base_classes_take_no_weak_references_on_either_build() -> None:
    # The compiled classes have no slot for them, so the pure ones declare none either:
    # the two builds accept the same things.
    for obj in (Purgatory("lc"), Timer()):
        with pytest.raises(TypeError, match="weak reference"):
            weakref.ref(obj)


# -- an operation no purgatory holds, completed from a thread with no loop ------------------


async def test_force_complete_from_thread_without_loop_settles_or_refuses_before_marking() -> None:
    op = AsyncHostileOp(1.0)
    result: list[object] = []

    def complete() -> None:
        try:
            result.append(op.force_complete())
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=complete)
    thread.start()
    await asyncio.get_running_loop().run_in_executor(None, thread.join)
    (outcome,) = result
    if isinstance(outcome, BaseException):
        assert not op.is_completed, (
            f"force_complete() raised {type(outcome).__name__}({outcome}) after marking "
            f"{op!r} completed: it will never settle"
        )
        assert op.cancel() is True, "a refused force_complete left the operation unusable"
    else:
        assert outcome is True
        assert await outcome_of(op) == ("result", "completed")
        assert op.completions == 1
