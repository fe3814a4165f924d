"""An operation's owners: a purgatory's lifecycle and the detached owner, two peers of one
interface (``_owner.Owner``).

The detached owner, of every operation no purgatory holds, is not a kind of lifecycle:
it holds no timer and no watch store. Whichever owner an operation has when it leaves
pending, it settles exactly once: its ``on_complete`` runs at most once, and nothing
after the first transition changes its outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import pytest
from support import AsyncOperation, MockOperation

from purgatory_aio import Purgatory, Timer
from purgatory_aio._lifecycle import Lifecycle
from purgatory_aio._operation import completed
from purgatory_aio._owner import Owner
from purgatory_aio._watches import WatchStore
from purgatory_aio.testing import ManualClock


class _ClashingKey:
    """Hashes like the watched key ``7``, then refuses to be compared with it."""

    def __hash__(self) -> int:
        return 7

    def __eq__(self, other: object) -> bool:
        raise ValueError("comparison refused")


def _held(owner: Owner) -> list[Any]:
    """Every attribute value ``owner`` has (its slots, on the compiled build)."""
    values = []
    for name in dir(owner):
        try:
            values.append(getattr(owner, name))
        except AttributeError:
            continue
    return values


def _settles_once(op: MockOperation, outcome: str | None) -> None:
    """``op`` has settled with ``outcome`` ("completed", "expired", or None: cancelled),
    ran ``on_complete`` once at most, and no later transition changes that."""
    assert op.done()
    assert op.completions == (0 if outcome is None else 1)
    assert not op.force_complete() and not op.cancel()
    assert op.completions == (0 if outcome is None else 1)
    if outcome is None:
        assert op.cancelled
    else:
        assert op.result() == outcome


def test_the_detached_owner_is_a_peer_of_the_lifecycle_and_holds_no_timer() -> None:
    owner = MockOperation(10)._owner
    assert isinstance(owner, Owner) and owner.detached
    assert not isinstance(owner, Lifecycle)
    assert issubclass(Lifecycle, Owner)
    assert not any(isinstance(value, Timer | WatchStore) for value in _held(owner))
    assert owner.timer is None and owner.store is None
    assert not hasattr(owner, "_timer") and not hasattr(owner, "_store")


def test_the_base_owner_implements_nothing_an_owner_must_decide() -> None:
    op = MockOperation(10)
    bare = Owner("bare", detached=False, observed=False, offload=False)
    for call in (
        lambda: bare.hand_over(completed, op, None),
        lambda: bare.spawn(op, False),
        lambda: bare.callback_failed(op, ValueError("x"), "on_complete"),
    ):
        with pytest.raises(NotImplementedError):
            call()
    assert not op.done() and op.completions == 0


def test_detached_operations_settle_exactly_once_whatever_comes_next() -> None:
    first = MockOperation(10)
    assert first.force_complete()
    _settles_once(first, "completed")
    cancelled = MockOperation(10)
    assert cancelled.cancel()
    _settles_once(cancelled, None)
    assert MockOperation(10)._owner is first._owner  # one detached owner for all


def test_a_detached_async_operation_is_refused_off_a_loop_and_left_pending() -> None:
    op = AsyncOperation(10)
    with pytest.raises(RuntimeError, match="no purgatory"):
        op.force_complete()
    assert not op.done() and op.completions == 0
    assert op.cancel()
    assert op.done() and op.cancelled and not op.cancel() and op.completions == 0


def test_an_ended_detached_operation_needing_a_loop_refuses_a_completion_with_false() -> None:
    # force_complete on a detached operation that has ended already is a lost race, not a
    # mistake: it returns False, even for an async (or offloaded) class, with no loop
    # running on the calling thread, and changes nothing.
    class Offloaded(MockOperation):
        offload_callbacks = True

    for cls in (AsyncOperation, Offloaded):
        op = cls(10)
        assert op.cancel()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a thread with no loop
            assert pool.submit(op.force_complete).result(timeout=10) is False, cls
        assert op.force_complete() is False, cls  # and this thread, with no loop either
        assert op.cancelled and op.done() and op.completions == 0 and not op.cancel()


async def test_a_detached_async_operation_settles_once_in_its_task() -> None:
    op = AsyncOperation(10)
    assert op.force_complete()
    assert not op.cancel()
    assert await asyncio.wait_for(op, 5.0) == "completed"
    _settles_once(op, "completed")


async def test_an_operation_a_purgatory_refused_is_detached_again_and_settles_once(
    clock: ManualClock,
) -> None:
    async with Purgatory("refuses", clock=clock) as p:
        held = MockOperation(10)
        assert not await p.try_complete_else_watch(held, [7])
        refused = MockOperation(10)
        with pytest.raises(TypeError, match="watch key"):
            await p.try_complete_else_watch(refused, [_ClashingKey()])
        assert refused._owner.detached and not isinstance(refused._owner, Lifecycle)
        assert p.num_delayed == 1 and p.watched == 1
        assert refused.force_complete()
        _settles_once(refused, "completed")
        assert p.stats().completed == 0  # nothing of it was this purgatory's
        held.cancel()


async def test_every_operation_leaving_a_purgatory_settles_exactly_once(
    clock: ManualClock,
) -> None:
    p = Purgatory("leaves", clock=clock)
    async with p:
        satisfied, expiring, cancelled, at_shutdown = (MockOperation(t) for t in (5, 1, 5, 5))
        for op in (satisfied, expiring, cancelled, at_shutdown):
            assert not await p.try_complete_else_watch(op, ["k"])
            assert isinstance(op._owner, Lifecycle) and not op._owner.detached
        satisfied.completable = True
        assert p.check_and_complete("k") == 1
        await clock.advance(2)
        assert cancelled.cancel()
    for op, outcome in (
        (satisfied, "completed"),
        (expiring, "expired"),
        (cancelled, None),
        (at_shutdown, "expired"),
    ):
        _settles_once(op, outcome)
    assert at_shutdown.expirations == expiring.expirations == 1
    stats = p.stats()
    assert (stats.completed, stats.expired, stats.cancelled, stats.shutdown) == (1, 1, 1, 1)
