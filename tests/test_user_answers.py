"""What the user's methods answer is taken by its truth, on both builds alike.

``try_complete`` is documented to return a bool, and Python code that forgets a
``return`` answers None. Each way the library calls a user's method (the admission's two
tries, ``check_and_complete``, ``advance_key``, ``cancel_for_key`` calling an override of
``cancel``) takes whatever comes back as Python's ``if`` would: a falsy answer is "not
completed", never an error, and a completion made during the try counts whatever the try
then answers. A ``cancel`` override that answers oddly or raises still leaves no
operation taken from its key and left unsettled.
"""

from __future__ import annotations

from typing import Any

import pytest
from support import MockOperation

from purgatory_aio import Purgatory
from purgatory_aio.testing import ManualClock

#: Answers that are not bools, falsy and truthy.
FALSY: tuple[Any, ...] = (None, 0, 0.0, "", (), [])
TRUTHY: tuple[Any, ...] = (1, "yes", (1,), 2.5, object())


class Answering(MockOperation):
    """try_complete answers ``answer``; completes first once ``ready`` is set."""

    def __init__(self, answer: Any, ready: bool = False) -> None:
        super().__init__(10.0)
        self.answer = answer
        self.ready = ready

    def try_complete(self) -> bool:
        self.tries += 1
        if self.ready:
            self.force_complete()
        return self.answer  # type: ignore[no-any-return]


def _ids(values: tuple[Any, ...]) -> list[str]:
    return [type(v).__name__ + "-" + repr(v)[:8] for v in values]


@pytest.mark.parametrize("answer", FALSY, ids=_ids(FALSY))
async def test_a_falsy_answer_leaves_the_operation_pending_with_no_error(
    answer: Any, clock: ManualClock
) -> None:
    async with Purgatory("falsy", clock=clock) as p:
        op = Answering(answer)
        assert await p.try_complete_else_watch(op, ["k"]) is False
        assert op.tries == 2 and op.outcome is None and p.num_delayed == 1
        assert p.check_and_complete("k") == 0
        threshold = Answering(answer)
        assert await p.watch_threshold(threshold, "t", 5) is False
        assert p.advance_key("t", 10) == 0
        assert threshold.outcome is None and threshold.tries == 3
        assert p.stats().callback_errors == 0
        op.ready = threshold.ready = True
        assert p.check_and_complete("k") == 1
        # Declined once its threshold was reached, it moved to the key's plain list.
        assert p.check_and_complete("t") == 1
        assert op.result() == threshold.result() == "completed"


@pytest.mark.parametrize("answer", TRUTHY, ids=_ids(TRUTHY))
async def test_a_truthy_answer_without_a_completion_does_not_count(
    answer: Any, clock: ManualClock
) -> None:
    async with Purgatory("truthy", clock=clock) as p:
        op = Answering(answer)
        assert await p.try_complete_else_watch(op, ["k"]) is False
        assert p.check_and_complete("k") == 0
        assert op.outcome is None and p.num_delayed == 1 and p.stats().callback_errors == 0
        op.cancel()


@pytest.mark.parametrize("answer", (False, *FALSY, *TRUTHY), ids=_ids((False, *FALSY, *TRUTHY)))
async def test_a_completion_made_by_the_try_counts_whatever_the_try_answers(
    answer: Any, clock: ManualClock
) -> None:
    async with Purgatory("made", clock=clock) as p:
        first = Answering(answer, ready=True)
        assert await p.try_complete_else_watch(first, ["k"]) is True
        assert first.tries == 1 and first.result() == "completed"
        late = Second(answer)  # completes at its second try, after watching
        assert await p.try_complete_else_watch(late, ["k"]) is True
        assert late.tries == 2 and late.result() == "completed" and p.num_delayed == 0
        walked = Answering(answer)
        assert await p.try_complete_else_watch(walked, ["k", "j"]) is False
        walked.ready = True
        assert p.check_and_complete("j") == 1
        indexed = Answering(answer)
        assert await p.watch_threshold(indexed, "t", 5) is False
        indexed.ready = True
        assert p.advance_key("t", 5) == 1
        assert p.stats().callback_errors == 0
        assert p.stats().completed == 4


class Second(Answering):
    """Completes at its second try."""

    def try_complete(self) -> bool:
        self.ready = self.tries == 1
        return super().try_complete()


class OddCancel(MockOperation):
    """An override of cancel that answers ``answer`` (after cancelling, or not at all)."""

    def __init__(self, answer: Any, withdraw: bool = True, raises: bool = False) -> None:
        super().__init__(10.0)
        self.answer = answer
        self.withdraw = withdraw
        self.raises = raises

    def cancel(self) -> bool:
        if self.withdraw:
            super().cancel()
        if self.raises:
            raise RuntimeError(f"cancel of {self!r} raised")
        return self.answer  # type: ignore[no-any-return]


@pytest.mark.parametrize("answer", (*FALSY, *TRUTHY), ids=_ids((*FALSY, *TRUTHY)))
async def test_cancel_for_key_takes_an_overrides_answer_by_its_truth(
    answer: Any, clock: ManualClock
) -> None:
    async with Purgatory("cancels", clock=clock) as p:
        ops = [OddCancel(answer) for _ in range(3)]
        for op in ops:
            await p.try_complete_else_watch(op, ["k"])
        withdrawn = p.cancel_for_key("k")
        assert withdrawn == (ops if answer else [])
        assert all(op.cancelled for op in ops)
        assert p.num_delayed == 0 and p.watched == 0


async def test_cancel_for_key_offers_every_operation_its_cancel_when_one_raises(
    clock: ManualClock,
) -> None:
    async with Purgatory("raising", clock=clock) as p:
        ops = [
            OddCancel(True),
            OddCancel(True, raises=True),
            OddCancel(True, withdraw=False, raises=True),
            OddCancel(True),
        ]
        for op in ops:
            await p.try_complete_else_watch(op, ["k"])
        with pytest.raises(RuntimeError, match=r"cancel of .* raised") as raised:
            p.cancel_for_key("k")
        assert repr(ops[1]) in str(raised.value)
        assert [op.cancelled for op in ops] == [True, True, False, True]
        # The one whose override withdrew nothing is no longer watched under the key
        # (cancel_for_key took it), but its deadline still settles it.
        assert p.watched == 0 and p.num_delayed == 1
        await clock.advance(10.0)
        assert ops[2].expired and ops[2].result() == "expired"


def test_an_asynchronous_try_complete_is_refused_when_the_class_is_made() -> None:
    # Called synchronously, it would answer with a coroutine nobody awaits: refused
    # with the reason, before any operation of the class exists.
    with pytest.raises(TypeError, match=r"Waiting\.try_complete must be a plain method"):

        class Waiting(MockOperation):
            async def try_complete(self) -> bool:  # type: ignore[override]
                return False

    with pytest.raises(TypeError, match=r"Streaming\.try_complete must be a plain method"):

        class Streaming(MockOperation):
            async def try_complete(self):  # type: ignore[no-untyped-def,override]
                yield False
