"""The event log on a full or failing disk: whole files or none, and every drop marked.

A full disk is simulated in a child process with ``RLIMIT_FSIZE`` (no file it writes may
grow past the limit; Python ignores SIGXFSZ, so the write fails with EFBIG). After every
run, whatever failed: each visible file reads back whole, the rows found are exactly
``written``, ``written + dropped`` is every record emitted, no temporary file is left,
and the ``_dropped-<producer>.json`` marker holds ``dropped``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from purgatory_report.cli import main
from test_eventlog_writers import WRITERS, make_events, read_back, visible

from purgatory_aio import DelayedOperation, Purgatory
from purgatory_aio.eventlog import JsonLinesWriter, ParquetWriter, QueuedEventWriter
from purgatory_aio.testing import ManualClock

#: The simulated disk: no file may grow past this.
FILE_LIMIT = 50_000
EMITTED = 3_000

CHILD = textwrap.dedent(
    """
    import json, sys
    from test_eventlog_writers import make_events
    from purgatory_aio.eventlog import JsonLinesWriter, ParquetWriter

    cls = {"ParquetWriter": ParquetWriter, "JsonLinesWriter": JsonLinesWriter}[sys.argv[1]]
    options = json.loads(sys.argv[3])
    events = make_events(int(sys.argv[4]))
    block = int(sys.argv[5])
    if block:
        # Runs of block and 2 * block records, each in an hour of its own: files of two
        # sizes, so a run both completes files and loses some.
        shifted, start, run = [], 0, 0
        while start < len(events):
            size = block * (1 + run % 2)
            hours = 3600.0 * (run % 2)
            run_events = events[start:start + size]
            shifted += [e._replace(settled_at=e.settled_at + hours) for e in run_events]
            start, run = start + size, run + 1
        events = shifted
    writer = cls(sys.argv[2], flush_seconds=0.05, **options)
    for event in events:
        writer.emit(event)
    writer.close()
    print(json.dumps({
        "written": writer.written,
        "dropped": writer.dropped,
        "producer": writer.producer,
        "files": [str(path) for path in writer.files],
    }))
    """
)


def run_on_full_disk(
    cls: type[QueuedEventWriter[Any]],
    directory: Path,
    options: dict[str, Any],
    count: int,
    block: int = 0,
) -> dict[str, Any]:
    """Run a writer in a child process whose files cannot grow past FILE_LIMIT bytes.

    With ``block``, the records settle in alternating hours, in runs of ``block`` and
    ``2 * block`` records (one file per run).
    """

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))

    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parent),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            cls.__name__,
            str(directory),
            json.dumps(options),
            str(count),
            str(block),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=limit,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def check_books(directory: Path, result: dict[str, Any], emitted: int) -> None:
    """What a reader finds agrees with what the writer reported, marker included."""
    files = [Path(p) for p in result["files"]]
    assert visible(directory) == sorted(files)
    rows = read_back(files)  # every visible file reads back whole
    assert len(rows) == result["written"]
    assert result["written"] + result["dropped"] == emitted
    assert len({row["op_id"] for row in rows}) == len(rows)
    leftovers = [p.name for p in directory.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []
    marker = directory / f"_dropped-{result['producer']}.json"
    if result["dropped"]:
        record = json.loads(marker.read_text())
        assert (record["dropped"], record["written"]) == (result["dropped"], result["written"])
    else:
        assert not marker.exists()


#: (batch_size, roll_bytes): files that fit, files that outgrow the disk, one big file,
#: batches smaller than a line's worth of buffering.
SETTINGS = [(100, 20_000), (100, 10**6), (1_000, 10**6), (7, 30_000), (250, 45_000)]


@pytest.mark.parametrize("cls", WRITERS)
@pytest.mark.parametrize(("batch_size", "roll_bytes"), SETTINGS)
def test_full_disk_leaves_only_whole_files_and_counts_what_a_reader_finds(
    cls: type[QueuedEventWriter[Any]], batch_size: int, roll_bytes: int, tmp_path: Path
) -> None:
    options = {"batch_size": batch_size, "roll_bytes": roll_bytes}
    result = run_on_full_disk(cls, tmp_path, options, EMITTED)
    check_books(tmp_path, result, EMITTED)


@pytest.mark.parametrize("cls", WRITERS)
def test_full_disk_losing_every_file_says_so_in_the_marker(
    cls: type[QueuedEventWriter[Any]], tmp_path: Path
) -> None:
    # One file for everything, far past the limit: nothing becomes visible.
    result = run_on_full_disk(cls, tmp_path, {"batch_size": 500, "roll_bytes": 10**9}, EMITTED)
    check_books(tmp_path, result, EMITTED)
    assert (result["written"], result["dropped"]) == (0, EMITTED)


@pytest.mark.parametrize("cls", WRITERS)
def test_unwritable_partition_directory_drops_its_records_into_the_marker(
    cls: type[QueuedEventWriter[Any]], tmp_path: Path
) -> None:
    events = make_events(40)
    # The first settlement hour's directory cannot be created (a file holds its name);
    # the tests run as root, where permission bits would not stop the writer.
    (tmp_path / "date=2023-11-14").write_text("not a directory")
    late = [e._replace(op_id=e.op_id + 1000, settled_at=e.settled_at + 86_400) for e in events]
    with cls(tmp_path, batch_size=10) as writer:
        for event in [*events, *late]:
            writer.emit(event)
    assert (writer.written, writer.dropped) == (len(late), len(events))
    assert sorted(r["op_id"] for r in read_back(writer.files)) == [e.op_id for e in late]
    marker = json.loads((tmp_path / f"_dropped-{writer.producer}.json").read_text())
    assert (marker["dropped"], marker["failed"]) == (len(events), len(events))


@pytest.mark.parametrize("cls", WRITERS)
def test_a_failing_close_removes_the_file_and_counts_its_records(
    cls: type[QueuedEventWriter[Any]], tmp_path: Path
) -> None:
    class FailsToFinish(cls):  # type: ignore[valid-type, misc]
        def _close_file(self) -> None:
            super()._close_file()
            raise OSError(28, "No space left on device")

    with FailsToFinish(tmp_path, batch_size=5) as writer:
        for event in make_events(12):
            writer.emit(event)
    assert (writer.written, writer.dropped, writer.files) == (0, 12, [])
    assert visible(tmp_path) == []
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [
        f"_dropped-{writer.producer}.json"
    ]


@pytest.mark.parametrize("cls", WRITERS)
def test_drops_after_close_reach_the_marker_without_an_earlier_drop(
    cls: type[QueuedEventWriter[Any]], tmp_path: Path
) -> None:
    writer = cls(tmp_path)
    writer.emit(make_events(1)[0])
    writer.close()
    marker = tmp_path / f"_dropped-{writer.producer}.json"
    assert not marker.exists()
    writer.emit(make_events(2)[1])
    assert writer.dropped == 1
    record = json.loads(marker.read_text())
    assert (record["dropped"], record["after_close"], record["written"]) == (1, 1, 1)


def test_later_drops_after_close_reach_the_marker_at_exit(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from test_eventlog_writers import make_events
        from purgatory_aio.eventlog import JsonLinesWriter

        writer = JsonLinesWriter(sys.argv[1])
        writer.close()
        for event in make_events(25):
            writer.emit(event)
        print(writer.producer)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    producer = done.stdout.split()[-1]
    record = json.loads((tmp_path / f"_dropped-{producer}.json").read_text())
    assert (record["dropped"], record["after_close"]) == (25, 25)


@pytest.mark.parametrize("cls", WRITERS)
def test_the_first_queue_full_drop_is_marked_before_close(
    cls: type[QueuedEventWriter[Any]], tmp_path: Path
) -> None:
    from test_eventlog_writers import stuck, wait_for

    writer = stuck(cls)(tmp_path, batch_size=1, queue_size=1, flush_seconds=60)
    writer.emit(make_events(1)[0])
    assert writer.entered.wait(5)
    writer.emit(make_events(2)[1])  # queued
    writer.emit(make_events(3)[2])  # dropped: the queue is full
    marker = tmp_path / f"_dropped-{writer.producer}.json"
    writer.release.set()
    wait_for(marker.exists)
    assert json.loads(marker.read_text())["queue_full"] == 1
    writer.close()
    assert (writer.written, writer.dropped) == (2, 1)


@pytest.mark.parametrize("cls", WRITERS)
def test_written_counts_only_files_made_visible(
    cls: type[QueuedEventWriter[Any]], tmp_path: Path
) -> None:
    from test_eventlog_writers import wait_for

    writer = cls(tmp_path, batch_size=1, roll_seconds=3600)
    for event in make_events(4):
        writer.emit(event)
    wait_for(lambda: writer.in_progress == 4)
    assert (writer.written, writer.files, visible(tmp_path)) == (0, [], [])
    writer.close()
    assert (writer.written, writer.in_progress, len(writer.files)) == (4, 0, 1)


def test_parquet_files_left_by_a_full_disk_read_with_their_footer(tmp_path: Path) -> None:
    options = {"batch_size": 100, "roll_bytes": 10**6}
    result = run_on_full_disk(ParquetWriter, tmp_path, options, EMITTED, block=1_000)
    assert result["files"] and result["dropped"], "the setting should complete and lose files"
    assert sum(pq.read_metadata(path).num_rows for path in result["files"]) == result["written"]
    check_books(tmp_path, result, EMITTED)


def test_jsonl_files_left_by_a_full_disk_end_in_a_whole_line(tmp_path: Path) -> None:
    options = {"batch_size": 100, "roll_bytes": 10**6}
    result = run_on_full_disk(JsonLinesWriter, tmp_path, options, EMITTED, block=150)
    assert result["files"] and result["dropped"], "the setting should complete and lose files"
    lines = 0
    for path in result["files"]:
        text = Path(path).read_text(encoding="utf-8")
        assert text.endswith("\n")
        for line in text.splitlines():
            json.loads(line)
            lines += 1
    assert lines == result["written"]
    check_books(tmp_path, result, EMITTED)


@pytest.mark.spark
def test_the_report_says_a_full_disk_log_is_incomplete_and_by_how_much(
    spark: Any, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    options = {"batch_size": 100, "roll_bytes": 10**6}
    parquet = run_on_full_disk(ParquetWriter, log, options, EMITTED, block=1_000)
    jsonl = run_on_full_disk(JsonLinesWriter, log / "jsonl", options, EMITTED, block=150)
    assert parquet["dropped"] and jsonl["dropped"]
    out = tmp_path / "report"
    assert main([str(log), "--out", str(out)], spark=spark) == 0
    quality = json.loads((out / "data_quality.json").read_text())
    # Both writers emitted the same op_ids: the report keeps each writer's own rows.
    assert quality["rows_read"] == parquet["written"] + jsonl["written"]
    dropped = parquet["dropped"] + jsonl["dropped"]
    assert (quality["dropped_by_writers"], quality["complete"]) == (dropped, False)
    report = (out / "report.md").read_text()
    assert "**Input incomplete**" in report
    assert f"{dropped:,} dropped record(s)" in report


class Ready(DelayedOperation[str]):
    """Completes at its first try when ``ready``; otherwise waits for its deadline."""

    def __init__(self, timeout: float, ready: bool) -> None:
        super().__init__(timeout)
        self.ready = ready

    def try_complete(self) -> bool:
        return self.ready and self.force_complete()

    def on_complete(self) -> str:
        return "expired" if self.expired else "done"


@pytest.mark.parametrize("cls", WRITERS)
async def test_operations_settle_whatever_the_sink_meets_on_disk(
    cls: type[QueuedEventWriter[Any]], tmp_path: Path
) -> None:
    # Every file the writer tries fails: its partition directory cannot be created.
    (tmp_path / "date=2026-01-01").write_text("not a directory")
    clock = ManualClock()  # virtual time 0 is 2026-01-01T00:00Z
    with cls(tmp_path, batch_size=16, flush_seconds=0.01) as sink:
        async with Purgatory("disk", clock=clock, event_sink=sink) as p:
            ops = [Ready(0.5, ready=n % 3 == 0) for n in range(90)]
            for n, op in enumerate(ops):
                await p.try_complete_else_watch(op, [f"k{n % 4}"])
            await clock.advance(0.5)
            results = [await op for op in ops]
        assert results.count("done") == 30 and results.count("expired") == 60
        assert p.stats().events_failed == 0  # the sink took every record; the disk failed
    assert (sink.written, sink.dropped, sink.files) == (0, 90, [])
    marker = json.loads((tmp_path / f"_dropped-{sink.producer}.json").read_text())
    assert (marker["dropped"], marker["failed"]) == (90, 90)


@pytest.mark.parametrize("cls", WRITERS)
def test_an_unforeseen_error_in_the_worker_loses_only_what_it_held_and_counts_it(
    cls: type[QueuedEventWriter[Any]], tmp_path: Path
) -> None:
    class BreaksOnce(cls):  # type: ignore[valid-type, misc]
        broken = False

        def _finish_file(self) -> None:
            if not self.broken:
                self.broken = True
                raise RuntimeError("a bug in the writer")
            super()._finish_file()

    events = make_events(50)
    # Two settlement hours: the change of hour finishes the first file mid-batch.
    late = [e._replace(op_id=e.op_id + 100, settled_at=e.settled_at + 3600) for e in events]
    with BreaksOnce(tmp_path, batch_size=100) as writer:
        for event in [*events, *late]:
            writer.emit(event)
    rows = read_back(writer.files)
    assert len(rows) == writer.written
    assert writer.written + writer.dropped == len(events) + len(late)
    assert writer.dropped > 0 and not [p for p in tmp_path.rglob("*.tmp")]
    marker = json.loads((tmp_path / f"_dropped-{writer.producer}.json").read_text())
    assert marker["dropped"] == writer.dropped
