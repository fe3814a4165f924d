"""Where each operation's callbacks run (inline, as a task, in a worker thread) is its
class's and its purgatory's choice, whatever ran before it: the completion reads the
choice once per class (a one-entry cache on the owner), so classes that alternate in
one purgatory, and one class in two purgatories, are the hostile cases here."""

from __future__ import annotations

import asyncio

from support import AsyncOperation, MockOperation

from purgatory_aio import Purgatory
from purgatory_aio.testing import ManualClock


class AsyncExpiry(MockOperation):
    """Synchronous on_complete, asynchronous on_expiration: satisfied ones run inline,
    expired ones in a task."""

    async def on_expiration(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self.expirations += 1


class Offloaded(MockOperation):
    offload_callbacks = True


def _inline(op: MockOperation) -> bool:
    """Completes ``op``; whether its callbacks had run by the time force_complete returned."""
    assert op.force_complete()
    return op.done()


async def _settle(*ops: MockOperation) -> None:
    await asyncio.wait_for(asyncio.gather(*ops, return_exceptions=True), 10)


async def test_classes_alternating_in_one_purgatory_each_run_their_callbacks_their_way(
    clock: ManualClock,
) -> None:
    async with Purgatory("alternating", clock=clock) as p:
        for _ in range(3):
            ops = [MockOperation(5), AsyncOperation(5), AsyncExpiry(5), Offloaded(5)]
            for op in ops:
                assert not await p.try_complete_else_watch(op, ["k"])
            assert [_inline(op) for op in ops] == [True, False, True, False]
            await _settle(*ops)
            assert all(op.result() == "completed" for op in ops)


async def test_an_expiry_of_a_class_whose_satisfied_ones_run_inline_runs_its_own_way(
    clock: ManualClock,
) -> None:
    async with Purgatory("expiring", clock=clock) as p:
        satisfied, expiring = AsyncExpiry(5), AsyncExpiry(1)
        for op in (satisfied, expiring):
            await p.try_complete_else_watch(op, ["k"])
        assert _inline(satisfied)  # the class is now the owner's inline one
        await clock.advance(1)
        await _settle(expiring)
        assert expiring.result() == "expired" and expiring.expirations == 1


async def test_one_class_in_an_offloading_purgatory_and_in_another_keeps_each_ones_choice(
    clock: ManualClock,
) -> None:
    async with (
        Purgatory("inline", clock=clock) as here,
        Purgatory("offloading", clock=clock, offload_callbacks=True) as offloading,
    ):
        for _ in range(3):
            local, remote = MockOperation(5), MockOperation(5)
            await here.try_complete_else_watch(local, ["k"])
            await offloading.try_complete_else_watch(remote, ["k"])
            assert _inline(local) and not _inline(remote)
            await _settle(remote)
            assert remote.result() == "completed"
