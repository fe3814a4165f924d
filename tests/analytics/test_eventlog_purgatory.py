"""A purgatory logging to the writers, and the report over what it logged: each kind of
operation its own group, the fan-out's labelled waits too."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest
from purgatory_report.cli import main

from purgatory_aio import DelayedOperation, Purgatory
from purgatory_aio.eventlog import JsonLinesWriter, ParquetWriter, arrow_schema
from purgatory_aio.fanout import MemoryFanout, ValueReached
from purgatory_aio.testing import ManualClock

FETCHES = 300
PRODUCES = 200
#: Waits on values of the fan-out, labelled as two routes would label them: (label, how many).
LABELS = (("/orders/{id}/status", 40), ("/jobs/{id}/wait", 30))


class Fetch(DelayedOperation[str]):
    op_type = "Fetch"

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> str:
        return "expired" if self.expired else "done"


class Produce(Fetch):
    op_type = "Produce"


async def labelled_waits(acks: Purgatory, clock: ManualClock) -> Counter[tuple[str, str]]:
    """The waits of :data:`LABELS` on ``acks``: every other one reached, the rest expired."""
    expected: Counter[tuple[str, str]] = Counter()
    async with MemoryFanout() as fanout:
        for label, count in LABELS:
            for n in range(count):
                op = ValueReached.labelled(label)(fanout, f"{label}:{n}", 1, 0.1)
                await fanout.watch_threshold(acks, op, op.key, op.threshold)
                if n % 2:
                    fanout.advance(op.key, 1)
                expected[(label, "completed" if n % 2 else "expired")] += 1
        await clock.advance(0.2)
    return expected


async def scenario(directory: Path) -> Counter[tuple[str, str]]:
    """Drive three purgatories on virtual time; return the expected outcome counts per
    purgatory (and per label of the fan-out's waits)."""
    expected: Counter[tuple[str, str]] = Counter()
    clock = ManualClock()
    with (
        ParquetWriter(directory / "fetch", batch_size=64) as fetch_log,
        JsonLinesWriter(directory / "produce", batch_size=64) as produce_log,
        JsonLinesWriter(directory / "acks", batch_size=64) as acks_log,
    ):
        fetch = Purgatory("fetch", clock=clock, event_sink=fetch_log)
        produce = Purgatory("produce", clock=clock, event_sink=produce_log)
        acks = Purgatory("acks", clock=clock, event_sink=acks_log)
        expected.update(await labelled_waits(acks, clock))
        await acks.shutdown()
        ops: list[tuple[Purgatory, Fetch]] = []
        for n in range(FETCHES):
            op = Fetch(0.5)
            await fetch.try_complete_else_watch(op, [f"topic-{n % 7}", f"partition-{n % 3}"])
            ops.append((fetch, op))
        for n in range(PRODUCES):
            op = Produce(0.2)
            await produce.try_complete_else_watch(op, [f"topic-{n % 5}"])
            ops.append((produce, op))
        for step in range(10):
            await clock.advance(0.03)
            for n, (_, op) in enumerate(ops):
                if n % 10 == step and n % 4 != 0 and not op.is_completed:
                    op.force_complete()
        for n, (_, op) in enumerate(ops):
            if n % 20 == 4 and op.cancel():
                pass
        await clock.advance(0.15)  # every Produce still pending expires, no Fetch does
        await fetch.shutdown()
        await produce.shutdown()
        for purgatory, op in ops:
            if op.is_completed and op.expired:
                outcome = "expired" if purgatory is produce else "shutdown"
            elif op.is_completed:
                outcome = "completed"
            else:
                outcome = "cancelled"
            expected[(purgatory.name, outcome)] += 1
    assert fetch_log.dropped == produce_log.dropped == acks_log.dropped == 0
    return expected


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Counter[tuple[str, str]]]:
    directory = tmp_path_factory.mktemp("purgatory-log")
    expected = asyncio.run(scenario(directory))
    return directory, expected


def read_rows(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(directory.rglob("*.parquet")):
        rows.extend(pq.read_table(path).to_pylist())
    options = pajson.ParseOptions(explicit_schema=arrow_schema())
    for path in sorted(directory.rglob("*.jsonl")):
        rows.extend(pajson.read_json(path, parse_options=options).to_pylist())
    return rows


def test_every_settled_operation_reaches_the_files(logged) -> None:
    directory, expected = logged
    rows = read_rows(directory)
    assert len(rows) == FETCHES + PRODUCES + sum(count for _, count in LABELS)
    assert Counter(
        (r["op_type"] if r["purgatory"] == "acks" else r["purgatory"], r["outcome"]) for r in rows
    ) == expected  # fmt: skip
    assert {r["op_type"] for r in rows} == {"Fetch", "Produce", *(label for label, _ in LABELS)}


def test_logged_times_are_consistent(logged) -> None:
    timeouts = {"Fetch": 0.5, "Produce": 0.2}
    for row in read_rows(logged[0]):
        assert row["created_at"] <= row["settled_at"]
        assert row["deadline"] - row["created_at"] == pytest.approx(
            timeouts.get(row["op_type"], 0.1)
        )
        if row["outcome"] == "expired":
            assert row["settled_at"] >= row["deadline"]


@pytest.mark.spark
def test_report_counts_what_the_purgatories_settled(spark: Any, logged, tmp_path: Path) -> None:
    directory, expected = logged
    assert main([str(directory), "--out", str(tmp_path)], spark=spark) == 0
    summary = {
        row["op_type"] if row["purgatory"] == "acks" else row["purgatory"]: row
        for row in json.loads((tmp_path / "summary.json").read_text())
    }
    # One group per purgatory and op_type: the fan-out's waits, one per label.
    assert set(summary) == {"fetch", "produce", *(label for label, _ in LABELS)}
    for (group, outcome), count in expected.items():
        assert summary[group][outcome] == count
    assert summary["produce"]["lateness_p99"] is not None
    assert summary["fetch"]["latency_p50"] is not None
