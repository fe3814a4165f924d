"""The GC prototype of ``python -m bench proto-gc`` does what its figures claim.

Its two functions must take an object out of the collector and put it back without
ever tracking one twice, and the untracking contender must still settle every
operation of W1-user's schedule, each re-tracked once it has settled.
"""

from __future__ import annotations

import gc
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench import proto_gc, proto_timer, w1
from bench._common import Progress, uvloop_version

LOOPS = ["asyncio"] + (["uvloop"] if uvloop_version() else [])


@pytest.fixture(scope="module")
def gcuntrack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return proto_timer.load(tmp_path_factory.mktemp("proto"), source=proto_gc.SOURCE)


def test_untrack_and_track_are_idempotent(gcuntrack: Any) -> None:
    box: list[Any] = []
    assert gc.is_tracked(box)
    gcuntrack.untrack(box)
    gcuntrack.untrack(box)
    assert not gc.is_tracked(box)
    gcuntrack.track(box)
    gcuntrack.track(box)  # a second track would abort the interpreter if it were not checked
    assert gc.is_tracked(box)
    for atom in (1, "text", None):  # not containers: left alone
        gcuntrack.untrack(atom)
        gcuntrack.track(atom)


def test_a_cycle_is_collected_once_its_members_are_tracked_again(gcuntrack: Any) -> None:
    class Node:
        pass

    node = Node()
    node.me = node  # type: ignore[attr-defined]
    gcuntrack.untrack(node)
    gcuntrack.track(node)
    del node
    assert gc.collect() >= 1


@pytest.mark.parametrize("loop_name", LOOPS)
def test_every_operation_settles_and_is_tracked_again(
    loop_name: str, gcuntrack: Any, tmp_path: Path
) -> None:
    params = replace(w1.W1Params(user=True), n=2_000)
    best = proto_gc.measure(loop_name, params, Progress(quiet=True), gcuntrack)
    assert set(best) == set(proto_gc.NAMES)
    for run in best.values():
        assert run["settled"] == run["completed"] + run["expired"] == 2_000
        assert run["left_pending"] == 0
    record = proto_gc.build_record(loop_name, params, best)
    assert record["workload"] == "proto-gc" and record["headline"]


async def test_an_untracked_operation_is_tracked_again_when_it_settles(gcuntrack: Any) -> None:
    factory = proto_gc.contender_class(gcuntrack)
    params = replace(w1.W1Params(user=True), n=10)
    schedule = w1.make_schedule(params)
    contender = factory(schedule, params)
    settlements = w1.Settlements(10)
    await contender.start(settlements)
    ops = await contender.enqueue_user_ops(0, 10)
    assert ops and not any(gc.is_tracked(op) for op in ops)
    for index, op in enumerate(ops):
        contender.complete(op, index)
    assert all(gc.is_tracked(op) for op in ops)
    await contender.finish()
