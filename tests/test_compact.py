"""The purge's compaction of a watch list (``_stale.drop_ended``): on the compiled build a
C helper reading the state where mypyc keeps it (``_compact.c``), held here to the
Python one (``drop_ended_in_python``, the pure build's) on lists of every shape; and what
the helper must survive: entries that are not operations, an operation whose state was
never set, and the release of a dropped operation running code that changes the list."""

from __future__ import annotations

import gc
import random
import weakref
from typing import Any

import pytest

import purgatory_aio
from purgatory_aio import DelayedOperation
from purgatory_aio._stale import (
    drop_ended,
    drop_ended_in_python,
    sweep_lists,
    sweep_lists_in_python,
)


class _Op(DelayedOperation[None]):
    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        pass


class _Slotted(_Op):
    __slots__ = ()


class _Other(_Op):
    """A third class, so that lists alternate between classes the helper remembers."""

    def __init__(self, timeout: float, tag: int) -> None:
        super().__init__(timeout)
        self.tag = tag


def _make(kind: int, i: int) -> _Op:
    if kind == 0:
        return _Op(1.0)
    if kind == 1:
        return _Slotted(1.0)
    return _Other(1.0, i)


def _end(op: _Op, how: int) -> None:
    if how == 1:
        assert op.force_complete()
    elif how == 2:
        assert op.cancel()


@pytest.mark.parametrize("seed", range(40))
def test_it_drops_what_the_python_one_drops_keeping_the_order(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.choice([0, 1, 2, 3, 7, 31, 32, 33, 200])
    ops = [_make(rng.randrange(3), i) for i in range(size)]
    for op in ops:
        _end(op, rng.choice([0, 0, 1, 2]))
    ours: list[DelayedOperation[Any]] = list(ops)
    reference: list[DelayedOperation[Any]] = list(ops)
    assert drop_ended(ours) == drop_ended_in_python(reference)
    assert ours == reference  # the same objects in the same order
    assert all(a is b for a, b in zip(ours, reference, strict=True))
    assert all(not (op.is_completed or op.cancelled) for op in ours)


def test_none_ended_leaves_the_list_as_it_was_and_all_ended_empties_it() -> None:
    ops = [_make(i % 3, i) for i in range(10)]
    watch_list: list[DelayedOperation[Any]] = list(ops)
    assert drop_ended(watch_list) == 0
    assert all(a is b for a, b in zip(watch_list, ops, strict=True))
    for op in ops:
        op.cancel()
    assert drop_ended(watch_list) == 10
    assert watch_list == []


def test_dropped_operations_are_released_and_kept_ones_are_not() -> None:
    ops = [_Op(1.0) for _ in range(6)]
    refs = [weakref.ref(op) for op in ops]
    for op in ops[::2]:
        op.cancel()
    watch_list: list[DelayedOperation[Any]] = list(ops)
    kept = ops[1::2]
    del ops, op
    assert drop_ended(watch_list) == 3
    gc.collect()
    assert [ref() is None for ref in refs] == [True, False] * 3
    assert watch_list == kept


@pytest.mark.skipif(not purgatory_aio.compiled, reason="the C helper's own guard")
def test_an_entry_that_is_not_an_operation_is_refused_and_nothing_is_lost() -> None:
    # Watch lists hold operations only; the helper checks each class before it reads the
    # state word, so anything else is an error, not a read of another object's memory.
    ops = [_Op(1.0) for _ in range(4)]
    ops[0].cancel()
    stranger = object()
    watch_list: list[Any] = [ops[0], ops[1], stranger, ops[2], ops[3]]
    with pytest.raises(TypeError, match="not a DelayedOperation"):
        drop_ended(watch_list)
    # Whatever it did before it stopped, every object is still in the list once.
    assert sorted(map(id, watch_list)) == sorted(map(id, [*ops, stranger]))


def test_a_list_is_required() -> None:
    with pytest.raises(TypeError):
        drop_ended((_Op(1.0),))  # type: ignore[arg-type]


def test_an_operation_whose_init_skipped_the_library_is_refused() -> None:
    class Skipper(_Op):
        def __init__(self) -> None:  # no super().__init__: no state
            pass

    watch_list: list[DelayedOperation[Any]] = [_Op(1.0), Skipper()]
    with pytest.raises((TypeError, AttributeError)):
        drop_ended(watch_list)
    assert len(watch_list) == 2


def test_a_release_that_adds_to_the_list_is_survived() -> None:
    # A dropped operation's finaliser admits another operation under the same key (an
    # append to the very list being compacted): the new ones are kept, none is lost.
    watch_list: list[Any] = []
    fresh: list[_Op] = []

    class Meddler(_Op):
        def __del__(self) -> None:
            op = _Op(1.0)
            fresh.append(op)
            watch_list.append(op)

    kept = [_Op(1.0) for _ in range(3)]
    doomed = [Meddler(1.0) for _ in range(5)]
    for op in doomed:
        op.cancel()
    watch_list.extend([doomed[0], kept[0], doomed[1], doomed[2], kept[1], kept[2], *doomed[3:]])
    del doomed, op
    assert drop_ended(watch_list) == 5
    gc.collect()
    assert len(fresh) == 5
    assert watch_list[:3] == kept
    assert sorted(map(id, watch_list)) == sorted(map(id, kept + fresh))


def test_the_compiled_build_runs_the_helper() -> None:
    if purgatory_aio.compiled:
        assert drop_ended is not drop_ended_in_python
        assert type(drop_ended).__name__ == "builtin_function_or_method"
    else:
        assert drop_ended is drop_ended_in_python


def _store_shape(rng: random.Random) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """Two equal stores' ``lists`` (the same operations): lists, lone operations and
    long lists held as dicts, with some operations ended."""
    ours: dict[Any, Any] = {}
    reference: dict[Any, Any] = {}
    for key in range(rng.randrange(0, 30)):
        shape = rng.randrange(3)
        if shape == 0:
            ops = [_make(rng.randrange(3), i) for i in range(rng.randrange(2, 12))]
            for op in ops:
                _end(op, rng.choice([0, 0, 1, 2]))
            ours[key], reference[key] = list(ops), list(ops)
        elif shape == 1:
            op = _make(rng.randrange(3), key)
            _end(op, rng.choice([0, 1, 2]))
            ours[key] = reference[key] = op
        else:
            ops = [_make(0, i) for i in range(rng.randrange(2, 6))]
            for op in ops:
                _end(op, rng.choice([0, 1]))
            ours[key] = {i: op for i, op in enumerate(ops)}
            reference[key] = ours[key]  # left to the caller: the very same dict
    return ours, reference


@pytest.mark.parametrize("seed", range(30))
def test_the_sweep_answers_what_the_python_one_answers(seed: int) -> None:
    ours, reference = _store_shape(random.Random(seed))
    got = sweep_lists(ours)
    want = sweep_lists_in_python(reference)
    assert got[0] == want[0]

    def pairs(found: list[tuple[Any, Any]] | None) -> list[tuple[Any, int]]:
        return sorted((key, id(held)) for key, held in found or ())

    # The same keys noted, each with its own store's value.
    assert [k for k, _ in pairs(got[1])] == [k for k, _ in pairs(want[1])]
    assert all(ours[key] is held for key, held in got[1] or ())
    assert pairs(got[2]) == pairs(want[2])
    for key in ours:
        if type(ours[key]) is list:
            assert all(a is b for a, b in zip(ours[key], reference[key], strict=True))


@pytest.mark.skipif(not purgatory_aio.compiled, reason="the C helper's own guard")
def test_the_sweep_refuses_what_a_store_never_holds() -> None:
    with pytest.raises(TypeError):
        sweep_lists({"k": object()})
    with pytest.raises(TypeError):
        sweep_lists([])  # type: ignore[arg-type]


def test_a_purge_survives_a_release_that_admits_under_the_same_key() -> None:
    # End to end: the watch lists hold the last reference to each completed operation, so
    # a purge releases them, and each finaliser watches a new operation under a new key
    # and a key being swept. Before the sweep walked the store's dict in C, the compiled
    # build's pass over it raised "dictionary changed size during iteration" out of
    # force_complete. Every operation is accounted for after.
    import asyncio

    from purgatory_aio import Purgatory

    async def main() -> None:
        async with Purgatory("compact", purge_interval=8) as p:
            born: list[_Op] = []

            class Reborn(_Op):
                def __del__(self) -> None:
                    if len(born) < 20:
                        child = _Op(5.0)
                        born.append(child)
                        p.try_complete_else_watch(child, [100 + len(born), len(born) % 3])

            for round_ in range(6):
                ops = [Reborn(5.0) for _ in range(10)]
                for i, op in enumerate(ops):
                    await p.try_complete_else_watch(op, [i % 3, 10 + round_])
                while ops:  # the caller keeps no reference: the lists hold the last one
                    op = ops.pop()
                    assert op.force_complete()
                    del op
                gc.collect()
            assert len(born) == 20
            assert p.num_delayed == len(born)
            for child in born:
                assert child.force_complete()
            assert p.num_delayed == 0
            assert p.watched - p.num_delayed <= 8

    asyncio.run(main())


def test_a_purge_interval_beyond_a_machine_int_is_taken() -> None:
    # The store counts in machine ints on the compiled build; an interval larger than
    # any count is the same as the largest one, not an OverflowError.
    import asyncio

    from purgatory_aio import Purgatory

    async def main() -> None:
        async with Purgatory("huge-interval", purge_interval=10**30) as p:
            ops = [_Op(5.0) for _ in range(50)]
            for op in ops:
                await p.try_complete_else_watch(op, [1, 2])
            for op in ops:
                assert op.force_complete()
            assert p.num_delayed == 0
            assert p.watched == 100  # nothing purged: the interval is never exceeded

    asyncio.run(main())
