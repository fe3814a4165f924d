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
from purgatory_aio._stale import drop_ended, drop_ended_in_python


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
