"""The purgatory's contract: the intent of Kafka's DelayedOperationTest, and more."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest
from support import AsyncOperation, FailingOperation, MockOperation, awaiting, settled_once

from purgatory_aio import Purgatory, PurgatoryClosed
from purgatory_aio.events import OperationEvent
from purgatory_aio.testing import ManualClock


async def test_request_satisfaction(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        r1, r2 = MockOperation(100), MockOperation(100)
        assert p.check_and_complete("test1") == 0
        assert not await p.try_complete_else_watch(r1, ["test1"])
        assert p.check_and_complete("test1") == 0
        assert not await p.try_complete_else_watch(r2, ["test2"])
        assert p.check_and_complete("test2") == 0
        r1.completable = True
        assert p.check_and_complete("test1") == 1
        assert p.check_and_complete("test1") == 0
        r2.completable = True
        assert p.check_and_complete("test2") == 1
        assert p.check_and_complete("test2") == 0
        assert await r1 == "completed"
        assert await r2 == "completed"
        assert p.num_delayed == 0


async def test_operation_completable_at_once_is_not_watched(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        op = MockOperation(1, completable=True)
        assert await p.try_complete_else_watch(op, ["k"]) is True
        assert p.num_delayed == 0
        assert p.watched == 0
        assert op.tries == 1


async def test_request_expiry_never_before_the_deadline(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        r1, r2 = MockOperation(0.020), MockOperation(0.010)
        r1.clock = r2.clock = clock
        await p.try_complete_else_watch(r1, ["test1"])
        await p.try_complete_else_watch(r2, ["test1", "test2"])
        await clock.advance(0.0099)
        assert not r2.is_completed
        await clock.advance(0.0011)
        assert r2.expired and not r1.is_completed
        await clock.advance(0.0089)
        assert not r1.is_completed
        await clock.advance(0.0011)
        assert r1.expired
        assert r1.completed_at is not None and r1.completed_at >= 0.020
        assert r2.completed_at is not None and r2.completed_at >= 0.010
        assert await r1 == "expired"
        assert (r1.expirations, r2.expirations) == (1, 1)
        assert p.stats().expired == 2


async def test_request_purge(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        r1, r2, r3 = MockOperation(100), MockOperation(100), MockOperation(100)
        await p.try_complete_else_watch(r1, ["test1"])
        await p.try_complete_else_watch(r2, ["test1", "test2"])
        await p.try_complete_else_watch(r3, ["test1", "test2", "test3"])
        assert p.num_delayed == 3
        assert p.watched == 6

        r2.completable = True
        r2.try_complete()
        assert p.num_delayed == 2
        r3.completable = True
        r3.try_complete()
        assert p.num_delayed == 1

        # walking a key drops the completed entries from its list
        p.check_and_complete("test1")
        assert p.watched == 4
        p.check_and_complete("test2")
        assert p.watched == 2
        p.check_and_complete("test3")
        assert p.watched == 1


async def test_watch_lists_stay_bounded_after_force_completed_traffic(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock, purge_interval=100) as p:
        ops = [MockOperation(100) for _ in range(5000)]
        for i, op in enumerate(ops):
            await p.try_complete_else_watch(op, [i % 7, i % 11, "all"])
        for op in ops:
            assert op.force_complete()
        assert p.num_delayed == 0
        assert p.watched <= p.num_delayed + 100
        assert p.stats().purged > 0


async def test_cancel_for_key_returns_the_cancelled_operations(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        a, b, c = MockOperation(10), MockOperation(10), MockOperation(10)
        await p.try_complete_else_watch(a, ["key"])
        await p.try_complete_else_watch(b, ["key"])
        await p.try_complete_else_watch(c, ["key2"])
        cancelled = p.cancel_for_key("key")
        assert cancelled == [a, b]
        assert p.num_delayed == 1
        assert p.watched == 1
        assert p.cancel_for_key("key") == []
        with pytest.raises(asyncio.CancelledError):
            await a
        assert a.completions == 0


async def test_cancel_for_an_unknown_key_is_an_empty_list(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        assert p.cancel_for_key("nope") == []


async def test_try_complete_from_multiple_threads(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        ops = [MockOperation(100) for _ in range(200)]
        for i, op in enumerate(ops):
            await p.try_complete_else_watch(op, [i % 10])
        for op in ops:
            op.completable = True

        def hammer() -> list[Any]:
            return [p.check_and_complete_threadsafe(k) for k in range(10) for _ in range(5)]

        futures: list[Any] = []
        threads = [threading.Thread(target=lambda: futures.extend(hammer())) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counts = [await asyncio.wrap_future(f) for f in futures]
        assert sum(counts) == 200
        assert all(settled_once(op) for op in ops)
        assert all(op.tries == 3 for op in ops)  # twice while watched, once completing


async def test_force_complete_from_many_threads_wins_exactly_once(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        ops = [MockOperation(100) for _ in range(300)]
        for op in ops:
            await p.try_complete_else_watch(op, ["k"])
        wins: list[bool] = []
        lock = threading.Lock()
        barrier = threading.Barrier(6)

        def race() -> None:
            barrier.wait()
            mine = [op.force_complete() for op in ops]
            with lock:
                wins.extend(mine)

        threads = [threading.Thread(target=race) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wins.count(True) == 300
        results = await asyncio.gather(*(op for op in ops))  # type: ignore[arg-type]
        assert results == ["completed"] * 300
        assert all(op.completions == 1 for op in ops)
        assert p.num_delayed == 0


async def test_safe_try_complete_is_never_reentrant(clock: ManualClock) -> None:
    class Reentrant(MockOperation):
        purgatory: Purgatory

        def try_complete(self) -> bool:
            self.tries += 1
            assert self.purgatory.check_and_complete("k") == 0  # walks back into itself
            return False

    async with Purgatory("mock", clock=clock) as p:
        op = Reentrant(10)
        op.purgatory = p
        await p.try_complete_else_watch(op, ["k"])
        tries = op.tries
        p.check_and_complete("k")
        assert op.tries == tries + 1


async def test_callbacks_may_watch_complete_and_cancel_on_the_key_being_walked(
    clock: ManualClock,
) -> None:
    async with Purgatory("mock", clock=clock) as p:
        later = MockOperation(10)
        victim = MockOperation(10)
        spawned: list[MockOperation] = []
        watchers: list[asyncio.Future[bool]] = []

        class Chatty(MockOperation):
            def on_complete(self) -> str:
                result = super().on_complete()
                victim.cancel()
                later.completable = True
                assert p.check_and_complete("k") == 1  # re-entrant walk completes `later`
                extra = MockOperation(10)
                spawned.append(extra)
                watchers.append(asyncio.ensure_future(p.try_complete_else_watch(extra, ["k"])))
                return result

        first = Chatty(10)
        for op in (first, victim, later):
            await p.try_complete_else_watch(op, ["k"])
        first.completable = True
        assert p.check_and_complete("k") == 1
        await clock.advance(0)
        assert victim.cancelled and later.is_completed and first.is_completed
        assert all(settled_once(op) for op in (first, victim, later))
        assert len(spawned) == 1 and p.num_delayed == 1
        assert p.watched == 1


async def test_async_callbacks_run_as_tasks_and_are_awaited(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        op = AsyncOperation(0.5)
        await p.try_complete_else_watch(op, ["k"])
        await clock.advance(0.6)
        assert op.done()
        assert await op == "expired"
        assert op.expirations == 1
        fast = AsyncOperation(5, completable=True)
        assert await p.try_complete_else_watch(fast, ["k"])
        assert await fast == "completed"


async def test_await_returns_the_result_to_many_waiters(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        op = MockOperation(1)
        await p.try_complete_else_watch(op, ["k"])
        waiters = [asyncio.ensure_future(awaiting(op)) for _ in range(5)]
        await asyncio.sleep(0)
        op.completable = True
        p.check_and_complete("k")
        assert await asyncio.gather(*waiters) == ["completed"] * 5


async def test_on_expiration_runs_after_on_complete_only_when_expired(clock: ManualClock) -> None:
    order: list[str] = []

    class Ordered(MockOperation):
        def on_complete(self) -> str:
            order.append(f"complete:{self.expired}")
            return "x"

        def on_expiration(self) -> None:
            order.append("expiration")

    async with Purgatory("mock", clock=clock) as p:
        a, b = Ordered(0.1), Ordered(0.1)
        await p.try_complete_else_watch(a, ["k"])
        await p.try_complete_else_watch(b, ["k"])
        a.force_complete()
        await clock.advance(0.2)
        assert order == ["complete:False", "complete:True", "expiration"]


async def test_a_failing_callback_reaches_awaiters_and_is_counted(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        bad = FailingOperation(0.1)
        good = MockOperation(0.2)
        await p.try_complete_else_watch(bad, ["k"])
        await p.try_complete_else_watch(good, ["k"])
        await clock.advance(1)
        with pytest.raises(RuntimeError, match="on_complete failed"):
            await bad
        assert await good == "expired"
        assert p.stats().callback_errors == 1
        assert bad.completions == 1


async def test_try_complete_raising_settles_the_operation_with_its_error(
    clock: ManualClock,
) -> None:
    class Broken(MockOperation):
        def try_complete(self) -> bool:
            raise KeyError("broken condition")

    async with Purgatory("mock", clock=clock) as p:
        op = Broken(1)
        assert await p.try_complete_else_watch(op, ["k"]) is True
        with pytest.raises(KeyError):
            await op
        assert p.num_delayed == 0
        assert p.stats().callback_errors == 1


async def test_offloaded_callbacks_run_in_a_worker_thread(clock: ManualClock) -> None:
    threads: list[int] = []

    class Offloaded(MockOperation):
        offload_callbacks = True

        def on_complete(self) -> str:
            threads.append(threading.get_ident())
            return super().on_complete()

    async with Purgatory("mock", clock=clock) as p:
        op = Offloaded(0.1)
        await p.try_complete_else_watch(op, ["k"])
        await clock.advance(0.2)
        assert await op == "expired"
        assert threads and threads[0] != threading.get_ident()
        assert op.expirations == 1


async def test_purgatory_wide_offload_uses_a_bounded_limiter(clock: ManualClock) -> None:
    running = 0
    peak = 0
    guard = threading.Lock()

    class Slow(MockOperation):
        def on_complete(self) -> str:
            nonlocal running, peak
            with guard:
                running += 1
                peak = max(peak, running)
            threading.Event().wait(0.01)
            with guard:
                running -= 1
            return "done"

    async with Purgatory("mock", clock=clock, offload_callbacks=True, offload_threads=2) as p:
        ops = [Slow(0.1) for _ in range(8)]
        for op in ops:
            await p.try_complete_else_watch(op, ["k"])
        await clock.advance(0.2)
        assert [await op for op in ops] == ["done"] * 8
        assert peak <= 2


async def test_watch_and_wait_cancels_the_operation_when_the_caller_goes_away(
    clock: ManualClock,
) -> None:
    async with Purgatory("mock", clock=clock) as p:
        op = MockOperation(10)
        task = asyncio.ensure_future(p.watch_and_wait(op, ["k"]))
        await asyncio.sleep(0)
        assert p.num_delayed == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert op.cancelled
        assert p.num_delayed == 0
        assert op.completions == 0


async def test_watch_and_wait_returns_the_result(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        op = MockOperation(10)
        task = asyncio.ensure_future(p.watch_and_wait(op, ["k"]))
        await asyncio.sleep(0)
        op.completable = True
        p.check_and_complete("k")
        assert await task == "completed"


async def test_shutdown_settles_every_pending_operation(clock: ManualClock) -> None:
    p = Purgatory("mock", clock=clock)
    ops = [MockOperation(1000) for _ in range(100_000)]
    for i, op in enumerate(ops):
        await p.try_complete_else_watch(op, [i % 100])
    slow = AsyncOperation(1000)
    await p.try_complete_else_watch(slow, ["async"])
    await p.shutdown()
    assert all(op.is_completed and op.expired and op.completions == 1 for op in ops)
    assert await slow == "expired"
    assert p.num_delayed == 0 and p.watched == 0
    assert p.stats().shutdown == 100_001
    with pytest.raises(PurgatoryClosed):
        await p.try_complete_else_watch(MockOperation(1), ["k"])
    await p.shutdown()  # idempotent


async def test_shutdown_can_cancel_instead_of_expiring(clock: ManualClock) -> None:
    p = Purgatory("mock", clock=clock)
    op = MockOperation(10)
    await p.try_complete_else_watch(op, ["k"])
    await p.shutdown(expire_pending=False)
    assert op.cancelled and op.completions == 0
    with pytest.raises(asyncio.CancelledError):
        await op


async def test_lazy_start_without_async_with(clock: ManualClock) -> None:
    p = Purgatory("lazy", clock=clock)
    op = MockOperation(0.1)
    await p.try_complete_else_watch(op, ["k"])
    await clock.advance(0.2)
    assert await op == "expired"
    await p.shutdown()


async def test_real_time_never_leaks_into_a_manual_clock() -> None:
    clock = ManualClock()
    async with Purgatory("mock", clock=clock) as p:
        op = MockOperation(0.001)
        await p.try_complete_else_watch(op, ["k"])
        await asyncio.sleep(0.01)
        assert not op.is_completed
        await clock.advance(0.002)
        assert op.expired


class _Sink:
    def __init__(self) -> None:
        self.events: list[OperationEvent] = []

    def emit(self, event: OperationEvent) -> None:
        self.events.append(event)


async def test_every_settled_operation_is_one_event(clock: ManualClock) -> None:
    sink = _Sink()
    p = Purgatory("fetch", clock=clock, event_sink=sink)
    done, late, gone, left = (MockOperation(1) for _ in range(4))
    bad = FailingOperation(1, completable=True)
    for op in (done, late, gone, left):
        await p.try_complete_else_watch(op, ["a", 7])
    await p.try_complete_else_watch(bad, ["a"])
    await clock.advance(0.5)
    done.force_complete()
    gone.cancel()
    await clock.advance(0.5)
    left_after = MockOperation(10)
    await p.try_complete_else_watch(left_after, ["z"])
    await p.shutdown()
    outcomes = {(e.outcome, e.error is not None) for e in sink.events}
    assert len(sink.events) == 6
    assert outcomes == {
        ("completed", True),
        ("completed", False),
        ("cancelled", False),
        ("expired", False),
        ("shutdown", False),
    }
    first = next(e for e in sink.events if e.outcome == "completed" and e.error is None)
    assert first.keys == ["a", "7"] and first.op_type == "MockOperation"
    assert first.created_at == pytest.approx(clock.epoch_offset)
    assert first.deadline == pytest.approx(clock.epoch_offset + 1)
    assert first.settled_at == pytest.approx(clock.epoch_offset + 0.5)
    assert len({e.op_id for e in sink.events}) == 6


async def test_a_failing_sink_never_stops_the_purgatory(clock: ManualClock) -> None:
    class Broken:
        def emit(self, event: OperationEvent) -> None:
            raise OSError("disk full")

    async with Purgatory("p", clock=clock, event_sink=Broken()) as p:
        op = MockOperation(0.1)
        await p.try_complete_else_watch(op, ["k"])
        await clock.advance(0.2)
        assert await op == "expired"
        assert p.stats().events_failed == 1


# -- bad input: a clear error, and the purgatory unchanged -----------------------------------------


@pytest.mark.parametrize(
    ("timeout", "error"),
    [
        (-1, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (True, TypeError),
        ("1", TypeError),
        (None, TypeError),
    ],
)
def test_bad_timeouts_name_the_value(timeout: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=repr(timeout).replace("(", r"\(")):
        MockOperation(timeout)  # type: ignore[arg-type]


def _completed() -> MockOperation:
    op = MockOperation(1)
    op.force_complete()
    return op


def _cancelled() -> MockOperation:
    op = MockOperation(1)
    op.cancel()
    return op


@pytest.mark.parametrize(
    ("make_op", "keys", "error", "text"),
    [
        (lambda: MockOperation(1), [], ValueError, "keys must not be empty"),
        (
            lambda: MockOperation(1),
            [["unhashable"]],
            TypeError,
            r"\['unhashable'\] is not hashable",
        ),
        (lambda: MockOperation(1), "topic-0", TypeError, "not the single key 'topic-0'"),
        (lambda: MockOperation(1), 42, TypeError, "iterable of keys, got 42"),
        (lambda: "not an op", ["k"], TypeError, "DelayedOperation"),
        (_completed, ["k"], ValueError, "already completed"),
        (_cancelled, ["k"], ValueError, "already completed or cancelled"),
    ],
)
async def test_bad_watch_requests_leave_the_purgatory_unchanged(
    clock: ManualClock, make_op: Any, keys: Any, error: type[Exception], text: str
) -> None:
    async with Purgatory("mock", clock=clock) as p:
        await p.try_complete_else_watch(MockOperation(5), ["k"])
        before = p.stats()
        op = make_op()
        with pytest.raises(error, match=text):
            await p.try_complete_else_watch(op, keys)
        assert p.stats() == before
        if isinstance(op, MockOperation) and not op.is_completed and not op.cancelled:
            assert op.deadline is None  # untouched, still usable
            assert await p.try_complete_else_watch(op, ["ok"]) is False


async def test_watching_an_operation_twice_is_refused(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        op = MockOperation(1)
        await p.try_complete_else_watch(op, ["k"])
        before = p.stats()
        with pytest.raises(ValueError, match="already handed to purgatory 'mock'"):
            await p.try_complete_else_watch(op, ["k2"])
        assert p.stats() == before


async def test_duplicate_keys_are_watched_once(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        await p.try_complete_else_watch(MockOperation(1), ["k", "k", "j"])
        assert p.watched == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"purge_interval": 0}, ValueError, "purge_interval must be >= 1, got 0"),
        ({"tick": 0}, ValueError, "tick must be > 0"),
        ({"wheel_size": 1}, ValueError, "wheel_size must be >= 2"),
        ({"clock": object()}, TypeError, "clock must provide"),
        ({"event_sink": 3}, TypeError, "event_sink must have an emit"),
    ],
)
def test_bad_purgatory_settings_are_rejected(
    kwargs: dict[str, Any], error: type, text: str
) -> None:
    with pytest.raises(error, match=text):
        Purgatory("p", **kwargs)


async def test_check_and_complete_with_an_unhashable_key_names_it(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        with pytest.raises(TypeError, match=r"key \[1\] is not hashable"):
            p.check_and_complete([1])  # type: ignore[arg-type]


async def test_a_subclass_that_skips_super_init_gets_a_clear_error(clock: ManualClock) -> None:
    class Forgetful(MockOperation):
        def __init__(self) -> None:
            pass

    async with Purgatory("mock", clock=clock) as p:
        with pytest.raises(TypeError, match=r"Forgetful.__init__ must call super\(\).__init__"):
            await p.try_complete_else_watch(Forgetful(), ["k"])


def test_a_purgatory_refuses_a_second_event_loop() -> None:
    p = Purgatory("mock")

    async def watch() -> None:
        await p.try_complete_else_watch(MockOperation(10), ["k"])

    asyncio.run(watch())
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(watch())


async def test_a_key_hashing_to_zero_is_a_valid_single_key(clock: ManualClock) -> None:
    async with Purgatory("mock", clock=clock) as p:
        op = MockOperation(1)
        assert await p.try_complete_else_watch(op, [0]) is False
        assert p.watched == 1


class ByOffset(MockOperation):
    """Compares equal to any other request for the same offset, as a value would."""

    def __init__(self, offset: int, timeout: float) -> None:
        super().__init__(timeout)
        self.offset = offset

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByOffset) and other.offset == self.offset

    def __hash__(self) -> int:
        return hash(self.offset)


class Unhashable(ByOffset):
    """``__eq__`` without ``__hash__``, as a ``@dataclass`` has by default."""

    __hash__ = None  # type: ignore[assignment]


class HashRaises(MockOperation):
    def __hash__(self) -> int:
        raise RuntimeError("an operation's own hash is never needed")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("an operation's own equality is never needed")


async def test_operations_that_compare_equal_are_each_watched_and_checked(
    clock: ManualClock,
) -> None:
    async with Purgatory("p", clock=clock, purge_interval=1) as p:
        ops = [ByOffset(7, 5.0) for _ in range(3)]
        for op in ops:
            assert await p.try_complete_else_watch(op, ["k", "j"]) is False
        assert p.watched == 6 and p.num_delayed == 3
        ops[0].completable = ops[1].completable = True
        assert p.check_and_complete("k") == 2  # both ready ones, and only them
        # Purging the completed ones' entries under "j" leaves their equal, pending twin.
        assert p.watched == 1 + 1 and p.num_delayed == 1
        ops[2].completable = True
        assert p.check_and_complete("j") == 1
        assert all(op.is_completed and not op.expired for op in ops)
        assert p.watched == 0


@pytest.mark.parametrize("kind", [Unhashable, HashRaises])
async def test_an_operation_needs_no_hash_of_its_own(clock: ManualClock, kind: type[Any]) -> None:
    async with Purgatory("p", clock=clock) as p:
        first, second = (
            (kind(1, 5.0), kind(1, 5.0)) if kind is Unhashable else (kind(5.0), kind(5.0))
        )
        assert await p.try_complete_else_watch(first, ["k"]) is False
        assert await p.try_complete_else_watch(second, ["k"]) is False
        first.completable = True
        assert p.check_and_complete("k") == 1
        assert p.cancel_for_key("k") == [second]
        await clock.advance(10)
        assert first.is_completed and second.cancelled
        assert p.num_delayed == 0 and p.watched == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": 123}, r"name must be a non-empty str, got 123"),
        ({"name": ""}, r"name must be a non-empty str, got ''"),
        ({"name": "p", "offload_callbacks": 1}, r"offload_callbacks must be True or False, got 1"),
        ({"name": "p", "log_operations": "y"}, r"log_operations must be True or False, got 'y'"),
    ],
)
def test_a_bad_constructor_argument_is_named_on_both_builds(
    kwargs: dict[str, object], message: str
) -> None:
    # The compiled build used to refuse these with its own "str object expected; got int",
    # which names no parameter.
    with pytest.raises(TypeError, match=message):
        Purgatory(**kwargs)  # type: ignore[arg-type]
