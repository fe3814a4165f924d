"""Threshold watches: advancing a key's value visits only the operations it satisfies."""

from __future__ import annotations

import asyncio
import gc
import math
import weakref

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from purgatory_aio import DelayedOperation, Purgatory
from purgatory_aio.testing import ManualClock


class Counter:
    def __init__(self) -> None:
        self.value = 0
        self.extra_ok = True


class WaitFor(DelayedOperation[int]):
    def __init__(self, counter: Counter, target: int, timeout: float = 10) -> None:
        super().__init__(timeout)
        self.counter = counter
        self.target = target
        self.tries = 0

    def try_complete(self) -> bool:
        self.tries += 1
        if self.counter.value >= self.target and self.counter.extra_ok:
            return self.force_complete()
        return False

    def on_complete(self) -> int:
        return self.counter.value


async def test_advance_completes_exactly_the_reached_thresholds() -> None:
    counter = Counter()
    async with Purgatory("hw", clock=ManualClock()) as p:
        ops = [WaitFor(counter, t) for t in range(1, 101)]
        for op in ops:
            assert await p.watch_threshold(op, "tp-0", op.target) is False
        assert p.watched == 100 and p.num_delayed == 100
        counter.value = 10
        assert p.advance_key("tp-0", 10) == 10
        assert [op.is_completed for op in ops[:11]] == [True] * 10 + [False]
        assert all(op.tries == 2 for op in ops[10:])  # the rest were never visited again
        assert p.watched == 90
        counter.value = 100
        assert p.advance_key("tp-0", 100) == 90
        assert p.watched == 0 and p.num_delayed == 0
        assert await ops[-1] == 100


async def test_an_operation_satisfied_at_once_is_not_indexed() -> None:
    counter = Counter()
    counter.value = 5
    async with Purgatory("hw", clock=ManualClock()) as p:
        op = WaitFor(counter, 3)
        assert await p.watch_threshold(op, "k", 3) is True
        assert p.watched == 0


async def test_a_declining_operation_moves_to_the_plain_watch_list() -> None:
    counter = Counter()
    counter.extra_ok = False
    async with Purgatory("hw", clock=ManualClock()) as p:
        op = WaitFor(counter, 2)
        await p.watch_threshold(op, "k", 2)
        counter.value = 2
        assert p.advance_key("k", 2) == 0
        assert not op.is_completed and p.watched == 1
        counter.extra_ok = True
        assert p.check_and_complete("k") == 1
        assert await op == 2


async def test_threshold_operations_expire_at_their_deadline() -> None:
    clock = ManualClock()
    counter = Counter()
    async with Purgatory("hw", clock=clock) as p:
        op = WaitFor(counter, 5, timeout=0.5)
        await p.watch_threshold(op, "k", 5)
        await clock.advance(0.6)
        assert op.expired and await op == 0
        assert p.advance_key("k", 10) == 0


async def test_settled_operations_are_compacted_out_of_the_index() -> None:
    counter = Counter()
    async with Purgatory("hw", clock=ManualClock(), purge_interval=10) as p:
        ops = [WaitFor(counter, 1000 + i) for i in range(200)]
        for op in ops:
            await p.watch_threshold(op, "k", op.target)
        for op in ops:
            op.force_complete()
        assert p.num_delayed == 0
        assert p.watched <= 10


async def test_check_and_complete_also_tries_threshold_operations() -> None:
    counter = Counter()
    async with Purgatory("hw", clock=ManualClock()) as p:
        op = WaitFor(counter, 3)
        await p.watch_threshold(op, "k", 3)
        counter.value = 3
        assert p.check_and_complete("k") == 1


async def test_cancel_for_key_covers_threshold_operations() -> None:
    counter = Counter()
    async with Purgatory("hw", clock=ManualClock()) as p:
        a, b = WaitFor(counter, 3), WaitFor(counter, 4)
        await p.watch_threshold(a, "k", 3)
        await p.try_complete_else_watch(b, ["k"])
        assert set(p.cancel_for_key("k")) == {a, b}
        assert p.watched == 0 and p.num_delayed == 0


@pytest.mark.parametrize(
    ("threshold", "error"), [(math.nan, ValueError), ("3", TypeError), (math.inf, ValueError)]
)
async def test_bad_thresholds_are_rejected(threshold: object, error: type[Exception]) -> None:
    async with Purgatory("hw", clock=ManualClock()) as p:
        op = WaitFor(Counter(), 1)
        with pytest.raises(error, match="threshold"):
            await p.watch_threshold(op, "k", threshold)  # type: ignore[arg-type]
        assert p.watched == 0 and op.deadline is None


class Recorded(DelayedOperation[None]):
    """Completes when the counter reaches its target; records the completion order."""

    def __init__(self, counter: Counter, target: int, log: list[int], ident: int) -> None:
        super().__init__(1000)
        self.counter = counter
        self.target = target
        self.log = log
        self.ident = ident

    def try_complete(self) -> bool:
        return self.counter.value >= self.target and self.force_complete()

    def on_complete(self) -> None:
        self.log.append(self.ident)


_actions = st.lists(
    st.one_of(
        st.tuples(st.just("watch"), st.integers(0, 2_000)),
        st.tuples(st.just("advance"), st.integers(0, 8)),
        st.tuples(st.just("cancel"), st.integers(0, 10_000)),
    ),
    max_size=600,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=_actions, ascending=st.booleans())
def test_index_takes_exactly_the_reached_operations_lowest_first(
    actions: list[tuple[str, int]], ascending: bool
) -> None:
    """Against a model: every advance completes exactly the pending operations whose
    threshold it reaches, by (threshold, arrival), however pushes, advances and
    cancellations interleave (enough of them to exercise the index's merges)."""

    async def scenario() -> None:
        counter = Counter()
        log: list[int] = []
        pending: dict[int, Recorded] = {}
        async with Purgatory("model", clock=ManualClock()) as p:
            for n, (action, arg) in enumerate(actions):
                if action == "watch":
                    # Rising thresholds (the common case) or any order around the value.
                    target = counter.value + (n % 61 if ascending else arg)
                    op = Recorded(counter, target, log, n)
                    done = await p.watch_threshold(op, "k", target)
                    assert done is (target <= counter.value)
                    if not done:
                        pending[n] = op
                elif action == "advance":
                    counter.value += arg
                    due = sorted(
                        (op.target, ident)
                        for ident, op in pending.items()
                        if op.target <= counter.value
                    )
                    del log[:]
                    assert p.advance_key("k", counter.value) == len(due)
                    assert log == [ident for _, ident in due]
                    for _, ident in due:
                        del pending[ident]
                elif pending:
                    ident = sorted(pending)[arg % len(pending)]
                    assert pending.pop(ident).cancel()
                assert p.num_delayed == len(pending)
            counter.value += 10_000
            assert p.advance_key("k", counter.value) == len(pending)

    asyncio.run(scenario())


async def test_the_index_keeps_no_completed_operation_alive() -> None:
    counter = Counter()
    # purge_interval=1: the purge's own list of retired operations holds one at most.
    async with Purgatory("hw", clock=ManualClock(), purge_interval=1) as p:
        ops = [WaitFor(counter, t) for t in range(1, 101)]
        for op in ops:
            await p.watch_threshold(op, "k", op.target)
        probes = [weakref.ref(op) for op in ops[:10]]
        counter.value = 10
        assert p.advance_key("k", 10) == 10  # a tenth: the index keeps its list, minus them
        del ops[:10], op
        gc.collect()
        assert sum(probe() is not None for probe in probes) <= 1
        counter.value = 100
        assert p.advance_key("k", 100) == 90 and p.watched == 0


async def test_callbacks_that_advance_and_cancel_during_advance_key() -> None:
    """Re-entrant calls from on_complete while advance_key walks what it took: a
    nested advance_key on the same key with a higher value, and cancelling another
    pending operation; between walks, new watches on the key (some already reached).
    Every operation settles exactly once, none before its threshold."""
    counter = Counter()
    settled: dict[int, int] = {}
    ops: list[DelayedOperation[None]] = []
    nested = [0, 0]  # nested advances, cancellations from callbacks

    class Hostile(DelayedOperation[None]):
        def __init__(self, target: int) -> None:
            super().__init__(1000)
            self.target = target
            self.ident = len(ops)
            ops.append(self)

        def try_complete(self) -> bool:
            return counter.value >= self.target and self.force_complete()

        def on_complete(self) -> None:
            assert counter.value >= self.target, "completed before its threshold"
            settled[self.ident] = settled.get(self.ident, 0) + 1
            if self.ident % 5 == 1 and counter.value < 450:
                counter.value += 2
                nested[0] += 1
                p.advance_key("k", counter.value)
            elif self.ident % 5 == 2:
                later = [op for op in ops[self.ident :] if not op.done()]
                if later:
                    nested[1] += later[len(later) // 2].cancel()

    async with Purgatory("hostile", clock=ManualClock()) as p:
        for target in range(300, 0, -1):  # descending: pushes wait in the heap, then merge
            await p.watch_threshold(Hostile(target), "k", target)
        for _ in range(200):
            counter.value += 7
            p.advance_key("k", counter.value)
            for offset in (-3, 5, 40):
                target = counter.value + offset
                await p.watch_threshold(Hostile(target), "k", target)
            if counter.value > 500:
                break
        counter.value = 10**6
        p.advance_key("k", counter.value)
        assert p.num_delayed == 0
    assert nested[0] > 10 and nested[1] > 10, nested
    assert all(count == 1 for count in settled.values())
    assert {i for i, op in enumerate(ops) if op.is_completed} == set(settled)
    assert all(op.done() for op in ops)


class Scripted(DelayedOperation[int]):
    """Completes once the counter reaches its target; its on_complete runs ``then``."""

    def __init__(self, counter: Counter, target: int, then: object = None) -> None:
        super().__init__(100)
        self.counter = counter
        self.target = target
        self.then = then
        self.completions = 0

    def try_complete(self) -> bool:
        if self.counter.value >= self.target:
            return self.force_complete()
        return False

    def on_complete(self) -> int:
        self.completions += 1
        if callable(self.then):
            self.then()
        return self.target


async def test_cancel_for_key_from_a_callback_takes_what_advance_key_has_yet_to_try() -> None:
    counter = Counter()
    taken: list[DelayedOperation[object]] = []
    async with Purgatory("walk", clock=ManualClock()) as p:
        first = Scripted(counter, 1, lambda: taken.extend(p.cancel_for_key("k")))
        rest = [Scripted(counter, t) for t in range(2, 11)]
        above = Scripted(counter, 50)
        for op in (first, *rest, above):
            await p.watch_threshold(op, "k", op.target)
        counter.value = 10
        assert p.advance_key("k", 10) == 1  # the first; its callback cancelled the rest
        assert set(taken) == {*rest, above}
        assert all(op.cancelled and op.completions == 0 for op in rest)
        assert first.completions == 1 and await first == 1
        assert p.watched == 0 and p.num_delayed == 0
        counter.value = 100
        assert p.advance_key("k", 100) == 0 and p.check_and_complete("k") == 0


async def test_check_and_complete_from_a_callback_tries_what_advance_key_has_yet_to_try() -> None:
    counter = Counter()
    nested: list[int] = []
    async with Purgatory("walk", clock=ManualClock()) as p:
        first = Scripted(counter, 1, lambda: nested.append(p.check_and_complete("k")))
        rest = [Scripted(counter, t) for t in range(2, 11)]
        for op in (first, *rest):
            await p.watch_threshold(op, "k", op.target)
        counter.value = 10
        # The nested walk completes the other nine; the outer one finds them settled.
        assert p.advance_key("k", 10) == 1
        assert nested == [9]
        assert all(op.completions == 1 for op in (first, *rest))
        assert p.watched == 0 and p.num_delayed == 0


async def test_an_interrupted_advance_key_leaves_the_untried_operations_watched() -> None:
    counter = Counter()

    def interrupt() -> None:
        raise KeyboardInterrupt

    async with Purgatory("walk", clock=ManualClock()) as p:
        first = Scripted(counter, 1, interrupt)
        rest = [Scripted(counter, t) for t in range(2, 6)]
        for op in (first, *rest):
            await p.watch_threshold(op, "k", op.target)
        counter.value = 5
        with pytest.raises(KeyboardInterrupt):
            p.advance_key("k", 5)
        assert first.done() and isinstance(first.exception(), KeyboardInterrupt)
        assert not any(op.done() for op in rest)
        assert p.watched == 4 and p.num_delayed == 4
        # Untried, they are plain watchers of the key now: a walk over it completes them.
        assert p.check_and_complete("k") == 4
        assert [await op for op in rest] == [2, 3, 4, 5]
        assert p.watched == 0 and p.num_delayed == 0


async def test_operations_completed_during_a_walk_are_counted_out_of_watched_once() -> None:
    counter = Counter()
    async with Purgatory("walk", clock=ManualClock(), purge_interval=10**6) as p:
        later = [Scripted(counter, t) for t in range(2, 21)]
        # The first's callback completes every other reached operation directly, and
        # cancels one above the value: the walk then only drops their entries.
        above = Scripted(counter, 99)

        def settle_others() -> None:
            for op in later:
                op.force_complete()
            above.cancel()

        first = Scripted(counter, 1, settle_others)
        for op in (first, *later, above):
            await p.watch_threshold(op, "k", op.target)
        assert p.watched == 21
        counter.value = 20
        assert p.advance_key("k", 20) == 1
        assert all(op.completions == 1 for op in (first, *later))
        assert p.num_delayed == 0
        assert p.watched == 1  # the cancelled one's stale index entry, until compacted
        counter.value = 100
        assert p.advance_key("k", 100) == 0
        assert p.watched == 0


async def test_operations_cancel_for_key_takes_from_a_walk_are_purged_cleanly() -> None:
    counter = Counter()
    taken: list[DelayedOperation[object]] = []
    # purge_interval=1: every retirement purges, the taken ones' included.
    async with Purgatory("walk", clock=ManualClock(), purge_interval=1) as p:
        first = Scripted(counter, 1, lambda: taken.extend(p.cancel_for_key("k")))
        rest = [Scripted(counter, t) for t in range(2, 6)]
        plain = Scripted(counter, 100)
        for op in (first, *rest):
            await p.watch_threshold(op, "k", op.target)
        await p.try_complete_else_watch(plain, ["k"])
        counter.value = 5
        assert p.advance_key("k", 5) == 1
        assert set(taken) == {*rest, plain}
        assert all(op.cancelled for op in (*rest, plain))
        assert (p.watched, p.num_delayed) == (0, 0)


async def test_declined_and_untried_operations_are_plain_watchers_after_an_interruption() -> None:
    """A walk interrupted after some operations declined: the declined ones and the
    untried ones alike stay watched under the key, each counted once."""
    counter = Counter()

    def interrupt() -> None:
        raise KeyboardInterrupt

    async with Purgatory("walk", clock=ManualClock()) as p:
        declining = [WaitFor(counter, t) for t in (1, 2)]
        counter.extra_ok = False
        for op in declining:
            await p.watch_threshold(op, "k", op.target)
        breaker = Scripted(counter, 3, interrupt)
        untried = [Scripted(counter, t) for t in (4, 5)]
        for op in (breaker, *untried):
            await p.watch_threshold(op, "k", op.target)
        counter.value = 5
        with pytest.raises(KeyboardInterrupt):
            p.advance_key("k", 5)
        assert breaker.done() and not any(op.done() for op in (*declining, *untried))
        assert p.watched == 4 and p.num_delayed == 4
        counter.extra_ok = True
        assert p.check_and_complete("k") == 4
        assert p.watched == 0 and p.num_delayed == 0


async def test_an_operation_declined_earlier_in_a_walk_completes_in_a_nested_check() -> None:
    counter = Counter()
    counter.extra_ok = False
    nested: list[int] = []

    def allow_and_check() -> None:
        counter.extra_ok = True
        nested.append(p.check_and_complete("k"))

    async with Purgatory("walk", clock=ManualClock(), purge_interval=1) as p:
        declined = WaitFor(counter, 1)
        await p.watch_threshold(declined, "k", 1)
        opener = Scripted(counter, 2, allow_and_check)
        await p.watch_threshold(opener, "k", 2)
        counter.value = 2
        # The first declines; the second's callback lets it complete in a nested walk,
        # which finds it still held by the outer one.
        assert p.advance_key("k", 2) == 1
        assert nested == [1] and await declined == 2 and opener.completions == 1
        assert p.watched == 0 and p.num_delayed == 0
        assert p.check_and_complete("k") == 0


@pytest.mark.parametrize("other", [1.0, True, 1])
async def test_an_operation_keeps_the_key_object_it_was_watched_under(other: object) -> None:
    """Operations under one key share one keys tuple, but only for the very same key
    object: one watched under an equal key of another type keeps its own."""
    async with Purgatory("keys", clock=ManualClock()) as p:
        first, second = WaitFor(Counter(), 5), WaitFor(Counter(), 6)
        await p.watch_threshold(first, 1, 5)
        await p.watch_threshold(second, other, 6)
        assert first.keys == (1,) and type(first.keys[0]) is int
        assert second.keys == (other,) and type(second.keys[0]) is type(other)
        assert p.advance_key(1, 10) == 0  # their conditions are on their own counters
        assert p.watched == 2


async def test_ties_between_the_run_and_the_heap_go_oldest_first() -> None:
    """Equal thresholds pushed before and after a lower one (which sends later pushes
    to the index's heap) complete in arrival order, merged or not."""
    counter = Counter()
    log: list[int] = []
    async with Purgatory("ties", clock=ManualClock()) as p:
        targets = [5, 5, 3, 5, 4, 5, 3]
        for ident, target in enumerate(targets):
            await p.watch_threshold(Recorded(counter, target, log, ident), "k", target)
        counter.value = 5
        assert p.advance_key("k", 5) == len(targets)
        assert log == [2, 6, 4, 0, 1, 3, 5]
