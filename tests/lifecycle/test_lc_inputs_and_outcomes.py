"""Hostile inputs and outcomes: keys, numbers and exceptions that say one thing and are another.

Each test names one guarantee, through the public API only (docs/contract.md):

* keys are told apart exactly as the watch lists' dicts tell them apart (a NaN given
  twice is one key), so ``watched`` counts what is held;
* a key that cannot be hashed or compared is refused with a TypeError naming it, the
  purgatory unchanged; a StopIteration out of a key never reaches a coroutine;
* a number is validated as the value the library goes on to use (an int subclass is
  used as its ``float()``, so that float is what gets checked);
* a ``try_complete`` that completes its operation and then raises still reports the
  completion (its own, not one another thread won meanwhile);
* an operation's outcome is never a StopIteration: ``await op`` would end as a return
  (the compiled build handed its value out as the result).

ManualClock everywhere; every await of an outcome is bounded (``outcome_of``).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from lc_support import outcome_of
from support import MockOperation

from purgatory_aio import DelayedOperation, Purgatory, Timer
from purgatory_aio.testing import ManualClock

# -- keys: told apart as the watch lists' dicts tell them apart ------------------------------


async def test_a_key_unequal_to_itself_given_twice_is_one_watch_entry(clock: ManualClock) -> None:
    nan = float("nan")  # one object: nan != nan, but a dict finds it by identity
    async with Purgatory("p", clock=clock) as p:
        for count in (2, 3, 5):
            op = MockOperation(100)
            await p.try_complete_else_watch(op, [nan] * count)
            assert len(op.keys) == 1 and op.keys[0] is nan
        assert p.watched == 3


async def test_watched_returns_to_bound_for_a_key_unequal_to_itself(clock: ManualClock) -> None:
    nan = float("nan")
    async with Purgatory("p", clock=clock, purge_interval=10) as p:
        ops = [MockOperation(100) for _ in range(50)]
        for op in ops:
            await p.try_complete_else_watch(op, [nan, nan])
        for op in ops:
            assert op.force_complete()
        assert p.num_delayed == 0
        # The contract: after traffic stops, watched is at most purge_interval above
        # num_delayed (purging keeps the watch lists bounded).
        assert p.watched <= 10, p.stats()


async def test_distinct_keys_with_equal_hashes_are_both_watched(clock: ManualClock) -> None:
    assert hash(-1) == hash(-2)  # CPython: -1 is reserved, so both hash to -2
    async with Purgatory("p", clock=clock) as p:
        for keys in ([-1, -2], [-1, -2, "k"], ["k", -1, -2]):
            op = MockOperation(100)
            await p.try_complete_else_watch(op, keys)
            assert op.keys == tuple(keys)
        assert p.watched == 8
        assert len(p.cancel_for_key(-2)) == 3  # found under its own key


# -- keys that cannot be hashed or compared: refused with TypeError, nothing changed ---------


class _IncomparableKey:
    """Hashable, but comparing it with anything of an equal hash raises ``error``."""

    def __init__(self, hash_value: int = 1, error: type[Exception] = TypeError) -> None:
        self.hash_value = hash_value
        self.error = error

    def __hash__(self) -> int:
        return self.hash_value

    def __eq__(self, other: object) -> bool:
        raise self.error("incomparable key")

    def __repr__(self) -> str:
        return f"<IncomparableKey {self.error.__name__}>"


class _StopHashKey:
    """A key whose __hash__ raises StopIteration (it would end a coroutine as a return)."""

    def __hash__(self) -> int:
        raise StopIteration("out of hashes")

    def __repr__(self) -> str:
        return "<StopHashKey>"


@pytest.mark.parametrize("error", [TypeError, StopIteration])
@pytest.mark.parametrize("count", [2, 3, 4])
async def test_keys_that_cannot_be_compared_with_each_other_are_refused_unchanged(
    clock: ManualClock, count: int, error: type[Exception]
) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = MockOperation(1)
        keys = [_IncomparableKey(error=error) for _ in range(count)]
        with pytest.raises(TypeError, match=r"IncomparableKey.* cannot be compared"):
            await p.try_complete_else_watch(op, keys)
        assert p.num_delayed == 0 and p.watched == 0
        assert await p.try_complete_else_watch(op, ["fine"]) is False  # still usable


WATCH_CALLS: dict[str, Callable[[Purgatory, DelayedOperation[Any], Any], Awaitable[Any]]] = {
    "try_complete_else_watch": lambda p, op, key: p.try_complete_else_watch(op, ["a", key]),
    "watch_and_wait": lambda p, op, key: p.watch_and_wait(op, [key, "a"]),
    "watch_threshold": lambda p, op, key: p.watch_threshold(op, key, 1.0),
}


@pytest.mark.parametrize("call", list(WATCH_CALLS))
async def test_a_key_whose_hash_raises_stop_iteration_is_refused_with_type_error(
    clock: ManualClock, call: str
) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = MockOperation(1)
        with pytest.raises(TypeError, match=r"StopHashKey.* cannot be hashed"):
            await WATCH_CALLS[call](p, op, _StopHashKey())
        assert p.num_delayed == 0 and p.watched == 0
        assert await p.try_complete_else_watch(op, ["fine"]) is False


@pytest.mark.parametrize("error", [TypeError, StopIteration])
async def test_a_key_that_cannot_be_compared_with_a_watched_key_is_refused_unchanged(
    clock: ManualClock, error: type[Exception]
) -> None:
    async with Purgatory("p", clock=clock) as p:
        await p.try_complete_else_watch(MockOperation(5), [7, "x"])  # 7: the same hash
        before = p.stats()
        op = MockOperation(1)
        with pytest.raises(TypeError, match=r"IncomparableKey.* cannot be compared"):
            await p.try_complete_else_watch(op, ["y", "z", _IncomparableKey(7, error)])
        assert p.stats() == before
        assert op.deadline is None and op.keys == ()  # untouched, still usable
        assert await p.try_complete_else_watch(op, ["y"]) is False


class _Unhashable(MockOperation):
    __hash__ = None  # type: ignore[assignment]  # what a dataclass with eq=True does


async def test_an_unhashable_operation_is_watched_by_identity(clock: ManualClock) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = _Unhashable(1)
        assert await p.try_complete_else_watch(op, ["a", "b"]) is False
        assert (p.num_delayed, p.watched) == (1, 2)
        op.completable = True
        assert p.check_and_complete("b") == 1
        assert op.is_completed and p.num_delayed == 0


WALKS: dict[str, Callable[[Purgatory, Any], object]] = {
    "check_and_complete": lambda p, key: p.check_and_complete(key),
    "advance_key": lambda p, key: p.advance_key(key, 1.0),
    "cancel_for_key": lambda p, key: p.cancel_for_key(key),
}


BAD_KEYS: dict[str, tuple[Callable[[], object], str]] = {
    "comparison raises TypeError": (lambda: _IncomparableKey(7), "cannot be compared"),
    "comparison raises StopIteration": (
        lambda: _IncomparableKey(7, StopIteration),
        "cannot be compared",
    ),
    "hash raises StopIteration": (_StopHashKey, "cannot be hashed"),
}


@pytest.mark.parametrize("bad", list(BAD_KEYS))
@pytest.mark.parametrize("walk", list(WALKS))
async def test_a_walk_over_a_key_that_cannot_be_looked_up_raises_type_error(
    clock: ManualClock, walk: str, bad: str
) -> None:
    make_key, text = BAD_KEYS[bad]
    async with Purgatory("p", clock=clock) as p:
        await p.try_complete_else_watch(MockOperation(5), [7])  # 7: the same hash
        await p.watch_threshold(MockOperation(5), 7, 5.0)
        before = p.stats()
        with pytest.raises(TypeError, match=text):
            WALKS[walk](p, make_key())
        assert p.stats() == before


async def test_check_and_complete_threadsafe_refuses_a_key_whose_hash_raises_stop_iteration(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        with pytest.raises(TypeError, match=r"StopHashKey.* cannot be hashed"):
            p.check_and_complete_threadsafe(_StopHashKey())


# -- numbers: validated as the value the library uses -----------------------------------------


class _SneakyInt(int):
    """An int that reads as ``value`` but converts to ``as_float``."""

    as_float: float

    def __new__(cls, value: int, as_float: float) -> _SneakyInt:
        self = super().__new__(cls, value)
        self.as_float = as_float
        return self

    def __float__(self) -> float:
        return self.as_float


class _LyingFloat(float):
    """A float that claims to lie in every range."""

    def __lt__(self, other: object) -> bool:
        return True

    __le__ = __gt__ = __ge__ = __lt__


class _LyingInt(int):
    """An int that claims to be at least anything."""

    def __lt__(self, other: object) -> bool:
        return False

    __le__ = __lt__


@pytest.mark.parametrize("as_float", [math.nan, -5.0, math.inf])
def test_timeout_is_validated_as_the_float_it_becomes(as_float: float) -> None:
    with pytest.raises(ValueError, match=r"timeout must be finite and >= 0, got 5 \(as a float"):
        MockOperation(_SneakyInt(5, as_float))


def test_an_int_subclass_timeout_is_the_float_it_converts_to() -> None:
    op = MockOperation(_SneakyInt(5, 2.5))
    assert op.timeout == 2.5 and type(op.timeout) is float


@pytest.mark.parametrize("value", [math.nan, -1.0, math.inf])
def test_a_float_subclass_cannot_talk_a_bad_timeout_into_range(value: float) -> None:
    with pytest.raises(ValueError, match="timeout must be finite"):
        MockOperation(_LyingFloat(value))


async def test_a_refused_int_subclass_timeout_leaves_no_half_watched_operation(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        with pytest.raises(ValueError):
            await p.try_complete_else_watch(MockOperation(_SneakyInt(5, math.nan)), ["k"])
        assert (p.num_delayed, p.watched) == (0, 0)


NAN_AS_FIVE = _SneakyInt(5, math.nan)

NUMBER_ARGS: dict[str, Callable[[], object]] = {
    "Purgatory tick": lambda: Purgatory("p", tick=NAN_AS_FIVE),
    "Timer tick": lambda: Timer(tick=NAN_AS_FIVE),
    "Timer.call_later delay": lambda: Timer().call_later(NAN_AS_FIVE, print),
    "Timer.call_at when": lambda: Timer().call_at(NAN_AS_FIVE, print),
    "ManualClock start": lambda: ManualClock(start=NAN_AS_FIVE),
    "Purgatory.advance_key value": lambda: Purgatory("p").advance_key("k", NAN_AS_FIVE),
}


@pytest.mark.parametrize("what", list(NUMBER_ARGS))
async def test_every_time_argument_is_validated_as_the_float_it_becomes(what: str) -> None:
    with pytest.raises(ValueError, match=r"got 5 \(as a float: nan\)"):
        NUMBER_ARGS[what]()


async def test_a_threshold_is_validated_as_the_float_it_becomes(clock: ManualClock) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = MockOperation(1)
        with pytest.raises(ValueError, match="threshold must be finite"):
            await p.watch_threshold(op, "k", _SneakyInt(3, math.nan))
        with pytest.raises(ValueError, match="threshold must be finite"):
            await p.watch_threshold(op, "k", _LyingFloat(math.nan))
        assert (p.num_delayed, p.watched) == (0, 0)
        assert await p.watch_threshold(op, "k", _SneakyInt(3, 2.5)) is False


class _StopFloat(int):
    """An int whose conversion to float raises StopIteration."""

    def __float__(self) -> float:
        raise StopIteration("no float")


async def test_a_threshold_whose_conversion_raises_stop_iteration_is_refused_with_type_error(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = MockOperation(1)
        with pytest.raises(TypeError, match="threshold must be a number"):
            await p.watch_threshold(op, "k", _StopFloat(3))
        assert (p.num_delayed, p.watched) == (0, 0)
        assert await p.watch_threshold(op, "k", 3) is False


@pytest.mark.parametrize("argument", ["purge_interval", "wheel_size", "offload_threads"])
def test_a_count_is_validated_as_the_int_it_is(argument: str) -> None:
    with pytest.raises(ValueError, match=rf"{argument} must be >= \d, got 0"):
        Purgatory("p", **{argument: _LyingInt(0)})


# -- try_complete that completes its operation, then raises -------------------------------


class CompletesThenRaises(MockOperation):
    """``try_complete`` completes the operation (when completable), then raises."""

    def try_complete(self) -> bool:
        if self.completable:
            self.force_complete()
            raise ValueError("bookkeeping after completing failed")
        return False


async def test_try_complete_else_watch_reports_a_completion_even_if_try_complete_raised(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = CompletesThenRaises(1, completable=True)
        # The contract: True if op completed during this call, whatever try_complete did after.
        assert await p.try_complete_else_watch(op, ["k"]) is True, op
        assert await outcome_of(op) == ("result", "completed")
        assert p.stats().callback_errors == 1  # the error is logged and counted


async def test_check_and_complete_counts_a_completion_even_if_try_complete_raised(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = CompletesThenRaises(1)
        await p.try_complete_else_watch(op, ["k"])
        op.completable = True
        assert p.check_and_complete("k") == 1, op
        assert await outcome_of(op) == ("result", "completed")


async def test_check_and_complete_drops_the_entry_of_an_operation_its_raising_try_completed(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = CompletesThenRaises(1)
        await p.try_complete_else_watch(op, ["k"])
        op.completable = True
        p.check_and_complete("k")
        assert (p.num_delayed, p.watched) == (0, 0)


async def test_advance_key_counts_a_completion_even_if_try_complete_raised(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = CompletesThenRaises(1)
        await p.watch_threshold(op, "k", 3)
        op.completable = True
        assert p.advance_key("k", 3) == 1, op
        assert (p.num_delayed, p.watched) == (0, 0)


class CompletedByAThreadThenRaises(MockOperation):
    """While ``try_complete`` runs, another thread completes the operation; then it raises."""

    def try_complete(self) -> bool:
        if self.completable:
            thread = threading.Thread(target=self.force_complete)
            thread.start()
            thread.join(10)
            raise ValueError("raised after another thread completed the operation")
        return False


async def test_a_raising_try_does_not_report_a_completion_another_thread_won(
    clock: ManualClock,
) -> None:
    # As when try_complete returns its force_complete() (False: the thread won): the
    # completion belongs to the thread that won it, and its hand-over settles the op.
    async with Purgatory("p", clock=clock) as p:
        first = CompletedByAThreadThenRaises(1, completable=True)
        assert await p.try_complete_else_watch(first, ["k"]) is False
        second = CompletedByAThreadThenRaises(1)
        await p.try_complete_else_watch(second, ["k"])
        second.completable = True
        assert p.check_and_complete("k") == 0
        for op in (first, second):
            assert await outcome_of(op) == ("result", "completed")
        assert p.stats().completed == 2


# -- an outcome is never a StopIteration ----------------------------------------------------


class _SyncStops(DelayedOperation[str]):
    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> str:
        raise StopIteration("not a result")


class _AsyncExpirationStops(_SyncStops):
    async def on_expiration(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)


class _OffloadedStops(_SyncStops):
    offload_callbacks = True


class _AsyncStops(_SyncStops):
    async def on_complete(self) -> str:  # type: ignore[override]
        await asyncio.sleep(0)
        raise StopIteration("not a result")


STOPPING: dict[str, type[_SyncStops]] = {
    "inline": _SyncStops,
    "sync, with an async on_expiration": _AsyncExpirationStops,
    "offloaded": _OffloadedStops,
    "async": _AsyncStops,
}


@pytest.mark.parametrize("style", list(STOPPING))
async def test_await_never_turns_an_on_complete_stop_iteration_into_a_result(
    clock: ManualClock, style: str
) -> None:
    async with Purgatory("p", clock=clock) as p:
        op = STOPPING[style](1)
        await p.try_complete_else_watch(op, ["k"])
        await clock.advance(2)
        kind, error = await outcome_of(op)
        # As asyncio.Future.set_exception does: a RuntimeError caused by the StopIteration.
        assert kind == "error" and type(error) is RuntimeError, (kind, error)
        assert isinstance(error.__cause__, StopIteration)
        assert op.exception() is error


async def test_a_stop_iteration_from_try_complete_becomes_a_runtime_error_outcome(
    clock: ManualClock,
) -> None:
    class TryStops(MockOperation):
        def try_complete(self) -> bool:
            raise StopIteration("not a verdict")

    async with Purgatory("p", clock=clock) as p:
        op = TryStops(1)
        assert await p.try_complete_else_watch(op, ["k"]) is True
        kind, error = await outcome_of(op)
        assert kind == "error" and type(error) is RuntimeError, (kind, error)
        assert isinstance(error.__cause__, StopIteration)


def test_a_detached_operations_result_is_never_a_stop_iteration() -> None:
    op = _SyncStops(1)
    assert op.force_complete()
    with pytest.raises(RuntimeError) as caught:
        op.result()
    assert isinstance(caught.value.__cause__, StopIteration)


async def test_a_stop_async_iteration_outcome_is_raised_as_it_is(clock: ManualClock) -> None:
    # asyncio accepts it as a future's exception; only StopIteration ends an await.
    class AsyncStops(_SyncStops):
        def on_complete(self) -> str:
            raise StopAsyncIteration("an ordinary error here")

    async with Purgatory("p", clock=clock) as p:
        op = AsyncStops(1)
        await p.try_complete_else_watch(op, ["k"])
        await clock.advance(2)
        kind, error = await outcome_of(op)
        assert kind == "error" and type(error) is StopAsyncIteration, (kind, error)
