"""Watch lists as lists, removed from lazily: a purge either sweeps every list (while what
is watched is small next to what is stale) or visits the keys of the operations waiting
for it (a large purgatory). Both leave exactly the live entries, in arrival order, for
operations that compare equal, are unhashable, or end while a walk is on them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from purgatory_aio import Purgatory
from purgatory_aio.testing import ManualClock
from tests.support import MockOperation


class AllEqual(MockOperation):
    """Every instance equals every other and hashes alike: entries go by identity."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 7


@dataclasses.dataclass(eq=True)
class Unhashable(MockOperation):
    """A dataclass with ``eq``: ``__hash__`` is None, so it cannot be a dict key."""

    label: str = "x"

    def __post_init__(self) -> None:
        super().__init__(1.0)


class Recording(MockOperation):
    """Records the order in which its tries are made."""

    def __init__(self, name: str, seen: list[str]) -> None:
        super().__init__(1.0)
        self.name = name
        self.seen = seen

    def try_complete(self) -> bool:
        self.seen.append(self.name)
        return super().try_complete()


def _live_entries(p: Purgatory, ops: list[Any], keys_of: dict[int, tuple[str, ...]]) -> int:
    return sum(len(keys_of[id(op)]) for op in ops if not op.done())


@pytest.mark.parametrize(("parked", "interval"), [(0, 200), (5_000, 20)], ids=["sweep", "by-key"])
async def test_a_purge_leaves_exactly_the_live_entries(parked: int, interval: int) -> None:
    # At most 900 entries against 200 stale, the purge sweeps every list; ``parked``
    # operations alone under keys of their own make the purgatory large next to the 20
    # stale, and it visits the keys of the operations it purges instead.
    async with Purgatory("lists", clock=ManualClock(), purge_interval=interval) as p:
        lone = [MockOperation(1.0) for _ in range(parked)]
        for i, op in enumerate(lone):
            await p.try_complete_else_watch(op, [f"lone-{i}"])
        ops: list[Any] = []
        keys_of: dict[int, tuple[str, ...]] = {}
        for i in range(300):
            op = AllEqual(1.0) if i % 3 else Unhashable()
            keys = (f"k{i % 7}", f"m{i % 11}", f"own-{i}")
            keys_of[id(op)] = keys
            await p.try_complete_else_watch(op, keys)
            ops.append(op)
        purged_before = p.stats().purged
        for op in ops[::2]:
            assert op.force_complete()
        for op in ops[1::10]:
            assert op.cancel()
        assert p.stats().purged > purged_before  # purges ran
        expected = _live_entries(p, ops, keys_of) + parked
        stale = p.watched - expected
        assert 0 <= stale <= interval + 3
        # Every live operation is still found under each of its keys, and only those.
        for op in ops:
            if not op.done():
                op.completable = True
        completed = sum(p.check_and_complete(f"k{i}") for i in range(7))
        assert completed == sum(1 for op in ops if op.completable)
        assert all(op.done() for op in ops)
        for op in lone:
            op.cancel()
        for i in range(300):
            p.check_and_complete(f"own-{i}")
        for i in range(11):
            p.check_and_complete(f"m{i}")
        for i in range(parked):
            p.check_and_complete(f"lone-{i}")
        assert p.watched == 0 and p.stats().watched_keys == 0


async def test_a_walk_tries_oldest_first_and_keeps_order_after_compaction() -> None:
    seen: list[str] = []
    async with Purgatory("order", clock=ManualClock(), purge_interval=1) as p:
        ops = [Recording(name, seen) for name in "abcdef"]
        for op in ops:
            await p.try_complete_else_watch(op, ["k", f"own-{op.name}"])
        seen.clear()
        ops[1].force_complete()
        ops[3].cancel()  # a purge has run by now (interval 1)
        assert p.check_and_complete("k") == 0
        assert seen == ["a", "c", "e", "f"]
        assert p.watched == 4 * 2
        seen.clear()
        late = Recording("g", seen)
        await p.try_complete_else_watch(late, ["k"])
        seen.clear()
        assert p.check_and_complete("k") == 0
        assert seen == ["a", "c", "e", "f", "g"]


async def test_a_list_down_to_one_operation_then_grows_again() -> None:
    async with Purgatory("one", clock=ManualClock(), purge_interval=1_000) as p:
        first, second, third = MockOperation(1.0), MockOperation(1.0), MockOperation(1.0)
        await p.try_complete_else_watch(first, ["k"])
        await p.try_complete_else_watch(second, ["k"])
        second.completable = True
        assert p.check_and_complete("k") == 1  # the list compacts to ``first`` alone
        assert p.watched == 1
        await p.try_complete_else_watch(third, ["k"])
        assert p.watched == 2
        first.completable = third.completable = True
        assert p.check_and_complete("k") == 2
        assert p.watched == 0 and p.stats().watched_keys == 0


async def test_operations_ended_by_a_walks_callbacks_are_dropped_with_it() -> None:
    async with Purgatory("callbacks", clock=ManualClock(), purge_interval=1_000) as p:
        victims = [MockOperation(1.0) for _ in range(3)]

        class Killer(MockOperation):
            def on_complete(self) -> str:
                for victim in victims:
                    victim.cancel()
                return super().on_complete()

        killer = Killer(1.0)
        await p.try_complete_else_watch(killer, ["k"])
        for victim in victims:
            await p.try_complete_else_watch(victim, ["k", "elsewhere"])
        killer.completable = True
        assert p.check_and_complete("k") == 1
        assert all(v.cancelled for v in victims)
        # The key's list held four entries, all ended now: one pass dropped them all.
        assert p.watched == 3  # the victims' entries under "elsewhere", stale
        assert p.stats().watched_keys == 1
        assert p.check_and_complete("elsewhere") == 0
        assert p.watched == 0 and p.stats().watched_keys == 0


class Touchy:
    """Hashes like 1 and refuses to be compared: the lookup under it raises."""

    def __hash__(self) -> int:
        return hash(1)

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing me")


async def test_a_refused_watch_leaves_no_entry_in_lists_it_entered() -> None:
    async with Purgatory("refused", clock=ManualClock()) as p:
        a, b = MockOperation(1.0), MockOperation(1.0)
        await p.try_complete_else_watch(a, ["shared", 1])
        with pytest.raises(TypeError):
            await p.try_complete_else_watch(b, ["shared", "fresh", Touchy()])
        assert p.watched == 2
        assert p.stats().watched_keys == 2
        assert p.cancel_for_key("shared") == [a]
        assert p.check_and_complete(1) == 0
        assert p.watched == 0 and p.stats().watched_keys == 0
        # b was left as it was, usable elsewhere.
        async with Purgatory("other", clock=ManualClock()) as q:
            b.completable = True
            assert await q.try_complete_else_watch(b, ["k"])


async def test_a_hot_key_of_a_large_purgatory_keeps_every_guarantee() -> None:
    # 2,000 parked operations make the purgatory large next to what is stale, so its
    # purges go by keys; the hot key's list (400 operations) is then held by identity.
    seen: list[str] = []
    async with Purgatory("hot", clock=ManualClock(), purge_interval=10) as p:
        for i in range(2_000):
            await p.try_complete_else_watch(MockOperation(1.0), [f"parked-{i}"])
        hot = [Recording(f"{i:03}", seen) for i in range(400)]
        for op in hot:
            await p.try_complete_else_watch(op, ["hot", f"own-{op.name}"])
        for op in hot[::3]:
            assert op.force_complete()  # purges run: the hot list is long
        for op in hot[1::7]:
            op.cancel()
        live = [op for op in hot if not op.done()]
        assert 0 <= p.watched - (2_000 + 2 * len(live)) <= 10 + 2
        # A walk tries what is left, oldest first, once each.
        seen.clear()
        assert p.check_and_complete("hot") == 0
        assert seen == [op.name for op in live]
        # Late arrivals join the same key and are tried after the others.
        late = Recording("late", seen)
        await p.try_complete_else_watch(late, ["hot"])
        seen.clear()
        p.check_and_complete("hot")
        assert seen == [*(op.name for op in live), "late"]
        # A refused watch leaves nothing behind in the hot key: it went in there, then
        # comparing its other key with one watched raised.
        one = MockOperation(1.0)
        await p.try_complete_else_watch(one, [1])
        with pytest.raises(TypeError):
            await p.try_complete_else_watch(MockOperation(1.0), ["hot", Touchy()])
        one.cancel()
        # An operation declining at its threshold becomes a plain watcher of the key.
        indexed = Recording("indexed", seen)
        await p.watch_threshold(indexed, "hot", 5)
        assert p.advance_key("hot", 10) == 0
        seen.clear()
        p.check_and_complete("hot")
        assert seen == [*(op.name for op in live), "late", "indexed"]
        # Half of them complete through the walk; cancel_for_key takes the rest.
        for op in live[::2]:
            op.completable = True
        assert p.check_and_complete("hot") == len(live[::2])
        taken = p.cancel_for_key("hot")
        assert sorted(op.name for op in taken) == sorted(
            [*(op.name for op in live[1::2]), "late", "indexed"]
        )
        assert all(op.done() for op in hot)
        for i in range(400):
            p.check_and_complete(f"own-{i:03}")
        p.check_and_complete(1)
        assert p.watched == 2_000
