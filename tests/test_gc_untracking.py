"""Pending operations are out of the cyclic GC on the compiled build, and back once settled.

The compiled build untracks an operation (and its instance dict) once it is pending
in the timer, with the watch list and index entry that exist for it alone, and
tracks it again on every way it can settle. The pure build tracks everything as
Python always does. Either way nothing may leak, nothing may be freed early, and
weak references and ``gc.get_referrers`` keep working.
"""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import purgatory_aio
from purgatory_aio import DelayedOperation, Purgatory
from purgatory_aio.testing import ManualClock
from tests.support import AsyncOperation, MockOperation

COMPILED = bool(purgatory_aio.compiled)


class Payload:
    """Something an operation holds that holds it back: a cycle through the operation."""

    def __init__(self, op: DelayedOperation[Any]) -> None:
        self.op = op


class Request(MockOperation):
    def __init__(self, timeout: float, completable: bool = False) -> None:
        super().__init__(timeout, completable)
        self.payload = Payload(self)  # op -> dict -> payload -> op


class Tracked(Request):
    untrack_while_pending = False


class Raising(Request):
    def try_complete(self) -> bool:
        if self.completable:
            raise RuntimeError("try_complete failed")
        return False


def untracked_while_pending(op: DelayedOperation[Any]) -> bool:
    """What the build promises for a pending operation of a class that did not opt out."""
    return not gc.is_tracked(op) and not gc.is_tracked(op.__dict__)


async def pend(p: Purgatory, op: DelayedOperation[Any], keys: tuple[Any, ...] = ("k",)) -> None:
    assert not await p.try_complete_else_watch(op, keys)
    assert untracked_while_pending(op) == COMPILED


async def force(op: Request, p: Purgatory, clock: ManualClock) -> None:
    assert op.force_complete()


async def expire(op: Request, p: Purgatory, clock: ManualClock) -> None:
    await clock.advance(2.0)


async def cancel(op: Request, p: Purgatory, clock: ManualClock) -> None:
    assert op.cancel()


async def check(op: Request, p: Purgatory, clock: ManualClock) -> None:
    op.completable = True
    assert p.check_and_complete("k") == (0 if isinstance(op, Raising) else 1)


async def cancel_key(op: Request, p: Purgatory, clock: ManualClock) -> None:
    assert p.cancel_for_key("k") == [op]


async def shutdown(op: Request, p: Purgatory, clock: ManualClock) -> None:
    await p.shutdown()


async def shutdown_cancelling(op: Request, p: Purgatory, clock: ManualClock) -> None:
    await p.shutdown(expire_pending=False)


SETTLE = [force, expire, cancel, check, cancel_key, shutdown, shutdown_cancelling]


@pytest.mark.parametrize("settle", SETTLE, ids=lambda fn: fn.__name__)
async def test_every_way_of_settling_tracks_the_operation_again(
    settle: Callable[[Request, Purgatory, ManualClock], Awaitable[None]],
) -> None:
    clock = ManualClock()
    p = Purgatory("gc", clock=clock)
    op = Request(1.0)
    await pend(p, op)
    await settle(op, p, clock)
    assert op.done()
    assert gc.is_tracked(op)
    if not p.closed:
        await p.shutdown()


async def test_a_failing_try_complete_tracks_the_operation_again() -> None:
    clock = ManualClock()
    async with Purgatory("gc", clock=clock) as p:
        op = Raising(1.0)
        await pend(p, op)
        op.completable = True
        p.check_and_complete("k")
        assert op.done() and isinstance(op.exception(), RuntimeError)
        assert gc.is_tracked(op)


async def test_an_async_on_complete_tracks_it_again_once_it_settles() -> None:
    clock = ManualClock()
    async with Purgatory("gc", clock=clock) as p:
        op = AsyncOperation(1.0)
        await pend(p, op)
        op.force_complete()
        assert await op == "completed"
        assert gc.is_tracked(op)


async def test_a_threshold_operation_is_untracked_with_its_index_entry() -> None:
    clock = ManualClock()
    async with Purgatory("gc", clock=clock) as p:
        op = Request(1.0, completable=True)
        op.completable = False
        assert not await p.watch_threshold(op, "hw", 10)
        assert untracked_while_pending(op) == COMPILED
        op.completable = True
        assert p.advance_key("hw", 10) == 1
        assert gc.is_tracked(op)


async def test_no_tracked_container_of_the_library_holds_a_pending_operation() -> None:
    """What a full collection would traverse reaches no pending operation (compiled): the
    watch lists, the threshold index and the key table are out of the collector too."""
    clock = ManualClock()
    async with Purgatory("gc", clock=clock) as p:
        ops = [Request(1.0) for _ in range(6)]
        for index, op in enumerate(ops[:4]):
            await pend(p, op, ("shared", f"own-{index}"))
        for index, op in enumerate(ops[4:]):
            assert not await p.watch_threshold(op, "hw", index)
        for op in ops:
            held_by = [
                r
                for r in gc.get_referrers(op)
                if r is not ops and isinstance(r, dict | list | tuple | set)
            ]
            if COMPILED:
                assert held_by == [], held_by
            else:
                assert held_by  # the pure build's watch lists are ordinary tracked dicts


async def test_a_cycle_formed_while_pending_is_collected_after_settlement() -> None:
    clock = ManualClock()
    p = Purgatory("gc", clock=clock)
    op = Request(1.0)
    await pend(p, op, ("k", "unique-1"))
    op.later = Payload(op)  # type: ignore[attr-defined]  # formed while untracked
    probe, payload = weakref.ref(op), weakref.ref(op.payload)
    gc.collect()
    assert probe() is op  # held by the purgatory: never collected early
    op.force_complete()
    await p.shutdown()  # its stale watch entries go (else the next purge drops them)
    del op
    gc.collect()
    assert probe() is None and payload() is None


async def test_weak_references_and_referrers_work_while_pending_and_after() -> None:
    clock = ManualClock()
    p = Purgatory("gc", clock=clock)
    op = Request(1.0)
    probe = weakref.ref(op)
    holders = [op]
    await pend(p, op)
    assert probe() is op
    assert any(r is holders for r in gc.get_referrers(op))  # a tracked holder is seen
    assert op.payload in gc.get_referents(op.__dict__)  # traversal itself still works
    op.force_complete()
    assert any(r is op.__dict__ for r in gc.get_referrers(op.payload))
    await p.shutdown()
    del op, holders
    gc.collect()
    assert probe() is None


async def test_a_class_can_keep_its_pending_operations_tracked() -> None:
    clock = ManualClock()
    async with Purgatory("gc", clock=clock) as p:
        op = Tracked(1.0)
        assert not await p.try_complete_else_watch(op, ["k"])
        assert gc.is_tracked(op) and gc.is_tracked(op.__dict__)
        assert any(r is op.__dict__ for r in gc.get_referrers(op.payload))
        op.force_complete()
        assert gc.is_tracked(op)


def test_the_opt_out_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="untrack_while_pending must be True or False"):

        class Wrong(MockOperation):
            untrack_while_pending = 0  # type: ignore[assignment]


async def test_a_purgatory_dropped_with_pending_operations_gives_them_back() -> None:
    clock = ManualClock()
    p = Purgatory("gc", clock=clock)
    ops = [Request(1.0) for _ in range(3)]
    for index, op in enumerate(ops):
        await pend(p, op, ("k", f"unique-{index}"))
    del p
    # Nobody can shut it down now: a cycle through one of them must stay collectable.
    assert all(gc.is_tracked(op) and gc.is_tracked(op.__dict__) for op in ops)
    await clock.advance(2.0)  # its timer still runs them to their end
    assert all(op.done() and op.expired and gc.is_tracked(op) for op in ops)


async def test_no_memory_is_left_behind_by_many_operations() -> None:
    """The bench runs this at a million operations (``python -m bench w5 --leak``)."""

    async def batch(p: Purgatory, clock: ManualClock, n: int) -> None:
        ops = [Request(1.0) for _ in range(n)]
        for index, op in enumerate(ops):
            assert not await p.try_complete_else_watch(op, (index % 10, ("u", index)))
        for op in ops[::3]:
            op.force_complete()
        for op in ops[1::3]:
            op.cancel()
        await clock.advance(2.0)
        assert all(op.done() for op in ops)

    clock = ManualClock()
    async with Purgatory("gc", clock=clock, purge_interval=100) as p:
        tracemalloc.start()
        try:
            # Steady state first: free lists, dict sizes, and up to purge_interval stale
            # entries waiting for their purge are held whatever the count.
            for _ in range(2):
                await batch(p, clock, 2_000)
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(6):
                await batch(p, clock, 2_000)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
    # 12,000 operations of ~300 B: leaking one in a hundred would hold 36 kB. What moves
    # is the size of the dicts and of the stale entries left for the next purge.
    assert after - before < 32 * 1024, after - before


def test_the_build_untracks_exactly_when_it_can() -> None:
    from purgatory_aio import _gc

    assert _gc.UNTRACKING == COMPILED


@pytest.mark.one_loop
async def test_settling_from_another_thread_tracks_it_again() -> None:
    async with Purgatory("gc") as p:
        op = Request(5.0)
        await pend(p, op)
        assert await asyncio.to_thread(op.force_complete)
        await op
        assert gc.is_tracked(op)
