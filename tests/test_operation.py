"""DelayedOperation on its own: exactly-once transitions, awaiting, results."""

from __future__ import annotations

import asyncio
import threading

import pytest
from support import AsyncOperation, FailingOperation, MockOperation, awaiting

from purgatory_aio import DelayedOperation, Purgatory


def test_force_complete_is_true_only_once() -> None:
    op = MockOperation(1)
    assert op.force_complete() is True
    assert op.force_complete() is False
    assert op.is_completed and not op.expired and op.done()
    assert op.result() == "completed"
    assert op.completions == 1


def test_cancel_withdraws_without_completing() -> None:
    op = MockOperation(1)
    assert op.cancel() is True
    assert op.cancel() is False
    assert op.force_complete() is False
    assert op.cancelled and not op.is_completed and op.completions == 0
    with pytest.raises(asyncio.CancelledError):
        op.result()


def test_concurrent_force_complete_and_cancel_settle_once() -> None:
    for _ in range(200):
        op = MockOperation(1)
        barrier = threading.Barrier(4)
        outcomes: list[bool] = []

        def race(
            op: MockOperation = op,
            barrier: threading.Barrier = barrier,
            outcomes: list[bool] = outcomes,
        ) -> None:
            barrier.wait()
            outcomes.append(op.force_complete() if threading.get_ident() % 2 else op.cancel())

        threads = [threading.Thread(target=race) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcomes.count(True) == 1
        assert op.completions == (0 if op.cancelled else 1)


def test_result_before_settlement_is_an_error() -> None:
    op = MockOperation(1)
    with pytest.raises(asyncio.InvalidStateError):
        op.result()


def test_abstract_methods_must_be_implemented() -> None:
    class Incomplete(DelayedOperation[int]):
        def try_complete(self) -> bool:
            return False

    with pytest.raises(TypeError, match="on_complete"):
        Incomplete(1)  # type: ignore[abstract]


def test_an_abstract_base_of_your_own_can_be_completed_by_its_subclasses() -> None:
    # Runs on both builds: the compiled DelayedOperation does not go through ABCMeta.
    class Base(DelayedOperation[int]):
        def on_complete(self) -> int:
            return self.value

    class Concrete(Base):
        def __init__(self, timeout: float, value: int) -> None:
            super().__init__(timeout)
            self.value = value  # no __slots__: an instance dict, as users write them

        def try_complete(self) -> bool:
            return self.force_complete()

    with pytest.raises(TypeError, match="try_complete"):
        Base(1)  # type: ignore[abstract]
    op = Concrete(1, 42)
    assert op.try_complete() and op.result() == 42


def test_the_package_says_which_build_it_is() -> None:
    import purgatory_aio

    assert isinstance(purgatory_aio.compiled, bool)
    suffix = purgatory_aio._operation.__file__.rsplit(".", 1)[-1]
    assert (suffix != "py") is purgatory_aio.compiled


def test_integer_timeouts_are_accepted() -> None:
    assert MockOperation(0).timeout == 0.0
    assert MockOperation(3).timeout == 3.0


async def test_awaiting_a_completed_operation_returns_at_once() -> None:
    op = MockOperation(1)
    op.force_complete()
    assert await op == "completed"


# A pending operation is awaited once a purgatory holds it (awaiting one that none holds
# is refused: nothing would ever settle it). The deadlines below are far off: these tests
# settle every operation themselves.


async def test_awaiting_an_operation_completed_from_another_thread() -> None:
    async with Purgatory("p") as purgatory:
        op = MockOperation(60)
        await purgatory.try_complete_else_watch(op, ["k"])
        waiter = asyncio.ensure_future(awaiting(op))
        await asyncio.sleep(0)
        thread = threading.Thread(target=op.force_complete)
        thread.start()
        thread.join()
        assert await asyncio.wait_for(waiter, 5) == "completed"


async def test_a_cancelled_awaiter_does_not_cancel_the_operation_for_others() -> None:
    async with Purgatory("p") as purgatory:
        op = MockOperation(60)
        await purgatory.try_complete_else_watch(op, ["k"])
        first = asyncio.ensure_future(awaiting(op))
        second = asyncio.ensure_future(awaiting(op))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        op.force_complete()
        assert await second == "completed"
        assert not op.cancelled


async def test_cancel_wakes_awaiters_with_cancelled_error() -> None:
    async with Purgatory("p") as purgatory:
        op = MockOperation(60)
        await purgatory.try_complete_else_watch(op, ["k"])
        waiter = asyncio.ensure_future(awaiting(op))
        await asyncio.sleep(0)
        op.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter


async def test_async_on_complete_without_a_purgatory() -> None:
    op = AsyncOperation(1)
    op.force_complete()
    assert op.is_completed and not op.done()
    assert await op == "completed"


async def test_on_complete_errors_reach_awaiters() -> None:
    op = FailingOperation(1)
    op.force_complete()
    with pytest.raises(RuntimeError, match="on_complete failed"):
        await op
    assert isinstance(op.exception(), RuntimeError)
