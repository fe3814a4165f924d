"""ParquetWriter and JsonLinesWriter: roundtrip, rolling, drop counting, closing."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest
import structlog
from structlog.testing import LogCapture

from purgatory_aio.eventlog import JsonLinesWriter, ParquetWriter, QueuedEventWriter, arrow_schema
from purgatory_aio.events import EventSink, OperationEvent

WRITERS = [ParquetWriter, JsonLinesWriter]


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    """Everything the writers log, whatever level the suite's structlog set-up filters."""
    saved = structlog.get_config()
    capture = LogCapture()
    structlog.configure(
        processors=[capture],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        cache_logger_on_first_use=False,
    )
    try:
        yield capture.entries
    finally:
        structlog.configure(**saved)


def make_events(count: int, start: int = 0) -> list[OperationEvent]:
    return [
        OperationEvent(
            purgatory="fetch" if n % 3 else "produce",
            op_type="FetchOp" if n % 3 else "ProduceOp",
            op_id=n,
            keys=[f"topic-{n % 7}", f"tópic-{n % 5}"][: 1 + n % 2],
            created_at=1_700_000_000.0 + n / 1000,
            deadline=1_700_000_000.5 + n / 1000,
            settled_at=1_700_000_000.1 + n / 1000,
            outcome=("completed", "expired", "cancelled", "shutdown")[n % 4],
            error=None if n % 5 else f"RuntimeError: failure {n}",
        )
        for n in range(start, start + count)
    ]


def read_back(files: list[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in files:
        if path.suffix == ".parquet":
            rows.extend(pq.read_table(path).to_pylist())
        else:
            options = pajson.ParseOptions(explicit_schema=arrow_schema())
            rows.extend(pajson.read_json(path, parse_options=options).to_pylist())
    return rows


def visible(directory: Path) -> list[Path]:
    """Event files at any depth, as a reader sees them (no hidden names, no markers)."""
    return sorted(
        p for p in directory.rglob("*") if p.is_file() and not p.name.startswith((".", "_"))
    )


def written_as(writer: QueuedEventWriter[Any], events: list[OperationEvent]) -> list[Any]:
    """``events`` as the writer writes them: stamped with its producer id."""
    return [event._replace(producer=writer.producer).as_dict() for event in events]


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def stuck(cls: type[QueuedEventWriter[Any]]) -> type[QueuedEventWriter[Any]]:
    """A writer class whose worker blocks in its first write until ``release`` is set."""

    class Stuck(cls):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.entered = threading.Event()
            self.release = threading.Event()
            super().__init__(*args, **kwargs)

        def _write_payload(self, payload: Any) -> None:
            self.entered.set()
            self.release.wait(30)
            super()._write_payload(payload)

    return Stuck


@pytest.mark.parametrize("cls", WRITERS)
def test_roundtrip_reads_back_the_emitted_rows(cls, tmp_path: Path) -> None:
    events = make_events(2_500)
    with cls(tmp_path, batch_size=700) as writer:
        for event in events:
            writer.emit(event)
    assert writer.written == len(events)
    assert writer.dropped == 0
    assert read_back(writer.files) == written_as(writer, events)


def test_parquet_files_carry_the_event_schema(tmp_path: Path) -> None:
    with ParquetWriter(tmp_path) as writer:
        writer.emit(make_events(1)[0])
    assert pq.read_schema(writer.files[0]).equals(arrow_schema())


def test_jsonl_has_one_object_per_line_with_the_event_columns(tmp_path: Path) -> None:
    events = make_events(3)
    with JsonLinesWriter(tmp_path) as writer:
        for event in events:
            writer.emit(event)
    lines = writer.files[0].read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == written_as(writer, events)


@pytest.mark.parametrize("cls", WRITERS)
def test_writers_are_event_sinks(cls, tmp_path: Path) -> None:
    with cls(tmp_path) as writer:
        assert isinstance(writer, EventSink)


@pytest.mark.parametrize("cls", WRITERS)
def test_files_roll_by_size(cls, tmp_path: Path) -> None:
    events = make_events(200)
    with cls(tmp_path, batch_size=20, roll_bytes=1) as writer:
        for event in events:
            writer.emit(event)
    assert len(writer.files) >= 10
    assert read_back(writer.files) == written_as(writer, events)


@pytest.mark.parametrize("cls", WRITERS)
def test_files_roll_by_time(cls, tmp_path: Path) -> None:
    first, second = make_events(2)
    with cls(tmp_path, roll_seconds=0.2, flush_seconds=0.02) as writer:
        writer.emit(first)
        wait_for(lambda: len(writer.files) == 1)
        writer.emit(second)
    assert len(writer.files) == 2
    assert [read_back([path]) for path in writer.files] == [
        written_as(writer, [first]),
        written_as(writer, [second]),
    ]


@pytest.mark.parametrize("cls", WRITERS)
def test_file_names_sort_in_writing_order(cls, tmp_path: Path) -> None:
    with cls(tmp_path, batch_size=5, roll_bytes=1, prefix="ops") as writer:
        for event in make_events(60):
            writer.emit(event)
    names = [path.name for path in writer.files]
    assert names == sorted(names)
    assert all(name.startswith("ops-") and name.endswith(cls.suffix) for name in names)
    assert visible(tmp_path) == writer.files


@pytest.mark.parametrize("cls", WRITERS)
def test_open_file_stays_hidden_until_closed(cls, tmp_path: Path) -> None:
    writer = cls(tmp_path, batch_size=1, roll_seconds=3600)
    for event in make_events(10):
        writer.emit(event)
    wait_for(lambda: writer.in_progress == 10)
    assert (writer.written, visible(tmp_path)) == (0, [])  # counted once visible
    (hidden,) = (p for p in tmp_path.rglob("*") if p.is_file())
    assert hidden.name.startswith(".")
    assert hidden.name.endswith(".tmp")
    writer.close()
    assert visible(tmp_path) == writer.files
    assert (len(writer.files), writer.written, writer.in_progress) == (1, 10, 0)
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("cls", WRITERS)
def test_full_queue_drops_records_and_counts_them(cls, tmp_path: Path) -> None:
    writer = stuck(cls)(tmp_path, batch_size=1, queue_size=5)
    events = make_events(13)
    writer.emit(events[0])
    assert writer.entered.wait(5)
    for event in events[1:]:
        writer.emit(event)
    assert writer.dropped == 7
    writer.release.set()
    writer.close()
    assert (writer.written, writer.dropped) == (6, 7)
    assert read_back(writer.files) == written_as(writer, events[:6])
    # The log itself says it is incomplete.
    marker = json.loads((tmp_path / f"_dropped-{writer.producer}.json").read_text())
    assert (marker["producer"], marker["dropped"]) == (writer.producer, 7)


@pytest.mark.parametrize("cls", WRITERS)
def test_drops_are_logged_once_per_interval_not_per_record(
    cls, tmp_path: Path, logs: list[dict[str, Any]]
) -> None:
    writer = stuck(cls)(tmp_path, batch_size=1, queue_size=1, flush_seconds=0.01)
    writer.emit(make_events(1)[0])
    assert writer.entered.wait(5)
    for event in make_events(500, start=1):
        writer.emit(event)
    writer.release.set()
    wait_for(lambda: any(e["event"] == "eventlog.records_dropped" for e in logs))
    writer.close()
    dropped = [e for e in logs if e["event"] == "eventlog.records_dropped"]
    assert len(dropped) == 1
    assert dropped[0]["log_level"] == "warning"
    assert dropped[0]["dropped_total"] == 499
    (closing,) = [e for e in logs if e["event"] == "eventlog.closed_with_drops"]
    assert (closing["dropped"], closing["written"]) == (499, 2)


@pytest.mark.parametrize("cls", WRITERS)
def test_emit_never_blocks_while_the_worker_is_stuck(cls, tmp_path: Path) -> None:
    writer = stuck(cls)(tmp_path, batch_size=1, queue_size=1_000)
    events = make_events(1) * 100_000
    writer.emit(events[0])
    assert writer.entered.wait(5)
    # The worker stays stuck until every emit has returned: an emit that waited for
    # room in the queue would never return, and the guard below would trip.
    emitter = threading.Thread(target=lambda: [writer.emit(event) for event in events])
    emitter.start()
    emitter.join(60)
    finished = not emitter.is_alive()
    writer.release.set()
    emitter.join()
    writer.close()
    assert finished, "emit blocked while the worker was stuck"
    assert writer.written + writer.dropped == len(events) + 1
    assert writer.dropped == len(events) - 1_000


@pytest.mark.parametrize("cls", WRITERS)
def test_close_is_idempotent(cls, tmp_path: Path) -> None:
    writer = cls(tmp_path)
    writer.emit(make_events(1)[0])
    writer.close()
    files = writer.files
    writer.close()
    writer.close()
    assert writer.files == files
    assert writer.written == 1


@pytest.mark.parametrize("cls", WRITERS)
def test_emit_after_close_is_dropped_and_counted(
    cls, tmp_path: Path, logs: list[dict[str, Any]]
) -> None:
    writer = cls(tmp_path)
    writer.close()
    writer.emit(make_events(1)[0])
    writer.emit(make_events(1)[0])
    assert writer.dropped == 2
    assert [e["event"] for e in logs] == ["eventlog.emit_after_close"]
    marker = json.loads((tmp_path / f"_dropped-{writer.producer}.json").read_text())
    assert (marker["dropped"], marker["after_close"]) == (1, 1)  # the first at once


@pytest.mark.parametrize("cls", WRITERS)
def test_close_with_nothing_emitted_writes_no_file(cls, tmp_path: Path) -> None:
    with cls(tmp_path) as writer:
        pass
    assert writer.files == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cls", WRITERS)
def test_a_record_that_cannot_be_encoded_is_dropped_alone(
    cls, tmp_path: Path, logs: list[dict[str, Any]]
) -> None:
    good = make_events(4)
    bad = good[0]._replace(op_id=99, keys=[object()])
    with cls(tmp_path) as writer:
        for event in [good[0], good[1], bad, good[2], good[3]]:
            writer.emit(event)
    assert (writer.written, writer.dropped) == (4, 1)
    assert read_back(writer.files) == written_as(writer, good)
    assert any(e["event"] == "eventlog.unencodable_records" for e in logs)


@pytest.mark.parametrize("cls", WRITERS)
def test_directory_is_created(cls, tmp_path: Path) -> None:
    with cls(tmp_path / "a" / "b") as writer:
        writer.emit(make_events(1)[0])
    assert writer.files[0].is_relative_to(tmp_path / "a" / "b")


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("batch_size", 0, ValueError),
        ("queue_size", -1, ValueError),
        ("roll_seconds", float("nan"), ValueError),
        ("roll_bytes", 1.5, TypeError),
        ("flush_seconds", "1", TypeError),
        ("batch_size", True, TypeError),
        ("prefix", ".hidden", ValueError),
    ],
)
def test_invalid_options_are_rejected(tmp_path: Path, option: str, value: Any, error) -> None:
    with pytest.raises(error, match=option if option != "prefix" else "prefix"):
        JsonLinesWriter(tmp_path, **{option: value})


def test_parquet_compression_is_configurable(tmp_path: Path) -> None:
    with ParquetWriter(tmp_path, compression="snappy") as writer:
        writer.emit(make_events(1)[0])
    metadata = pq.read_metadata(writer.files[0])
    assert metadata.row_group(0).column(0).compression == "SNAPPY"


def test_parquet_writer_without_pyarrow_says_how_to_install_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"pip install 'purgatory-aio\[parquet\]'"):
        ParquetWriter(tmp_path)


def test_core_and_json_writer_work_without_pyarrow(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['pyarrow'] = None\n"
        "import purgatory_aio, purgatory_aio.events\n"
        "from purgatory_aio.eventlog import JsonLinesWriter\n"
        "from purgatory_aio.events import OperationEvent\n"
        f"with JsonLinesWriter({str(tmp_path)!r}) as w:\n"
        "    w.emit(OperationEvent('p', 'Op', 1, ['k'], 1.0, 2.0, 1.5, 'completed', None))\n"
        "assert w.written == 1, w\n"
        "assert 'pyspark' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def test_arrow_schema_types(tmp_path: Path) -> None:
    schema = arrow_schema()
    assert schema.field("op_id").type == pa.int64()
    assert schema.field("keys").type == pa.list_(pa.string())
    assert schema.field("error").nullable
    assert not schema.field("settled_at").nullable


@pytest.mark.parametrize("cls", WRITERS)
def test_files_are_laid_out_by_settlement_date_and_hour(cls, tmp_path: Path) -> None:
    base = make_events(1)[0]
    hours = [1_700_000_000.0, 1_700_000_000.0 + 3_600, 1_700_000_000.0 + 86_400]
    events = [base._replace(op_id=n, settled_at=t) for n, t in enumerate(hours)]
    with cls(tmp_path) as writer:
        for event in events:
            writer.emit(event)
    parts = [str(path.parent.relative_to(tmp_path)) for path in writer.files]
    assert parts == [
        "date=2023-11-14/hour=22",
        "date=2023-11-14/hour=23",
        "date=2023-11-15/hour=22",
    ]
    assert read_back(writer.files) == written_as(writer, events)


@pytest.mark.parametrize("cls", WRITERS)
def test_unpartitioned_writer_writes_flat(cls, tmp_path: Path) -> None:
    with cls(tmp_path, partitioned=False) as writer:
        writer.emit(make_events(1)[0])
    assert [path.parent for path in writer.files] == [tmp_path]


@pytest.mark.parametrize("cls", WRITERS)
def test_an_implausible_time_still_gets_a_partition(cls, tmp_path: Path) -> None:
    event = make_events(1)[0]
    with cls(tmp_path) as writer:
        writer.emit(event._replace(settled_at=1.7e12))
        writer.emit(event._replace(op_id=2, settled_at=-5.0))
    assert all(path.parent.name.startswith("hour=") for path in writer.files)
    assert writer.dropped == 0


def test_each_writer_stamps_its_own_producer_id(tmp_path: Path) -> None:
    event = make_events(1)[0]
    with JsonLinesWriter(tmp_path / "a") as first, JsonLinesWriter(tmp_path / "b") as second:
        first.emit(event)
        second.emit(event)
        second.emit(event._replace(producer="given"))
    assert first.producer != second.producer
    rows = read_back(first.files) + read_back(second.files)
    assert [row["producer"] for row in rows] == [first.producer, second.producer, "given"]


@pytest.mark.parametrize("cls", WRITERS)
def test_no_marker_without_drops(cls, tmp_path: Path) -> None:
    with cls(tmp_path) as writer:
        writer.emit(make_events(1)[0])
    assert not list(tmp_path.glob("_dropped-*"))
