"""JSON Lines staged by Arrow: read exactly as Spark reads the JSON, or left to Spark."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from purgatory_report import staging
from purgatory_report.cli import main
from purgatory_report.inputs import REQUIRED, EventFiles, read_events

T0 = 1_700_000_000.0
EVENT: dict[str, Any] = {
    "purgatory": "fetch",
    "op_type": "FetchOp",
    "op_id": 1,
    "keys": ["t-0", "t-1"],
    "created_at": T0,
    "deadline": T0 + 0.5,
    "settled_at": T0 + 0.1,
    "outcome": "completed",
    "error": None,
    "producer": "p-1",
}


def line(**changes: Any) -> bytes:
    return json.dumps({**EVENT, **changes}, separators=(",", ":"), ensure_ascii=False).encode()


def lines(*items: bytes) -> bytes:
    return b"".join(item + b"\n" for item in items)


GOOD = lines(line(op_id=1), line(op_id=2), line(op_id=3))

#: name -> (file bytes, whether Arrow may stage it). Staged or not, the rows must be
#: Spark's own (see test_staged_rows_are_the_rows_spark_reads).
CASES: dict[str, tuple[bytes, bool]] = {
    "plain": (GOOD, True),
    "no final newline": (GOOD.rstrip(b"\n"), True),
    "extra fields, nested": (
        lines(line(extra={"a": [1, {"b": None}]}, more=[[], {}], other="x")),
        True,
    ),
    "unicode and escapes": (
        lines(line(producer="é\\u00e9\n\u2603", keys=["\u00fc", "a\x00b"])),
        True,
    ),
    "null and empty keys": (lines(line(keys=["a", None]), line(op_id=2, keys=[])), True),
    "numbers Spark and Arrow agree on": (
        lines(
            line(deadline=0, created_at=12345678901234567890123, op_id=-(2**63)).replace(
                b'"deadline":0', b'"deadline":1e-400'
            )
        ),
        True,
    ),
    "error text present": (lines(line(outcome="failed", error="boom")), True),
    "two objects on one line": (line(op_id=1) + b" " + line(op_id=2) + b"\n", False),
    "an object across two lines": (
        lines(line(op_id=1), b'{"purgatory":"fetch",', line(op_id=2)[1:]),
        False,
    ),
    "blank line": (line(op_id=1) + b"\n\n" + line(op_id=2) + b"\n", False),
    "whitespace line": (line(op_id=1) + b"\n   \n" + line(op_id=2) + b"\n", False),
    "indented line": (lines(line(op_id=1), b"  " + line(op_id=2)), False),
    "a carriage return inside an object": (
        lines(line(op_id=1), line(op_id=2).replace(b',"op_type"', b',\r"op_type"')),
        False,
    ),
    "crlf line ends": (line(op_id=1) + b"\r\n" + line(op_id=2) + b"\r\n", False),
    "cr line ends": (line(op_id=1) + b"\r" + line(op_id=2) + b"\r", False),
    "byte order mark": (b"\xef\xbb\xbf" + GOOD, False),
    "null line first": (lines(b"null", line(op_id=2)), False),
    "null line later": (lines(line(op_id=1), b"null"), False),
    "empty object": (lines(line(op_id=1), b"{}"), False),
    "missing required field": (lines(line(op_id=1), line(op_id=None)), False),
    "not UTF-8 in an ignored field": (
        lines(line(op_id=1)[:-1] + b',"junk":"\xff\xfe"}'),
        False,
    ),
    "not UTF-8 in a column": (lines(line(producer="X").replace(b'"X"', b'"\xc3"')), False),
    "lone surrogate escape": (lines(line(producer="X").replace(b'"X"', b'"\\ud800"')), False),
    **{
        f"{token.decode()} for a double": (
            lines(line(deadline=0).replace(b'"deadline":0', b'"deadline":' + token)),
            False,
        )
        for token in (b"NaN", b"Infinity", b"-Infinity", b"Inf", b"-Inf", b"+Infinity", b"nan")
    },
    "single quotes": (lines(line().replace(b'"op_id"', b"'op_id'")), False),
    "text after the object": (lines(line() + b" x"), False),
    "a comment": (lines(line() + b" // note"), False),
    "duplicate key": (lines(line()[:-1] + b',"op_id":9}'), False),
    "number for a string": (lines(line(producer=5)), False),
    "object for a string": (lines(line(producer={"a": 1})), False),
    "list in keys": (lines(line(keys=[["a"]])), False),
    "too large a double": (
        lines(line(deadline=0).replace(b'"deadline":0', b'"deadline":1e400')),
        False,
    ),
    "op_id out of range": (lines(line(op_id=2**63)), False),
    "fractional op_id": (lines(line(op_id=1.0)), False),
    "a top-level array": (lines(b"[" + line() + b"]"), False),
    "a line longer than a parse block": (
        lines(line(op_id=1), line(op_id=2, error="x" * (staging.BLOCK_BYTES + 10))),
        True,
    ),
}


def read_spark_json(spark: Any, path: Path) -> list[str]:
    """The rows Spark's JSON reader makes of a file, as text (so NaN equals NaN)."""
    return read_rows(spark, EventFiles([], [str(path)]))


def read_staged(spark: Any, files: list[str]) -> list[str]:
    return read_rows(spark, EventFiles(files, []))


def read_rows(spark: Any, files: EventFiles) -> list[str]:
    rows = read_events(spark, files).drop("_file").collect()
    return sorted(repr(tuple(row)) for row in rows)


@pytest.mark.parametrize("name", list(CASES))
def test_staged_rows_are_the_rows_spark_reads(spark: Any, tmp_path: Path, name: str) -> None:
    data, may_stage = CASES[name]
    source = tmp_path / "events.jsonl"
    source.write_bytes(data)
    out = tmp_path / "staged"
    out.mkdir()
    staged = staging.stage_json([str(source)], out, 2, REQUIRED)
    if not staged.parquet:
        assert not may_stage, staged.description
        assert staged.description.startswith("parsed by Spark (Arrow's reader refused: ")
        assert not list(out.iterdir())  # nothing half-staged is left behind
        return
    assert may_stage, f"staged a file Arrow reads differently: {name}"
    expected = read_spark_json(spark, source)
    # The last column is CORRUPT: Spark found every line sound, as Arrow did.
    assert all(row.endswith(", None)") for row in expected), expected
    assert read_staged(spark, staged.parquet) == expected


def test_gzip_files_are_staged_whole(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "events.jsonl.gz"
    source.write_bytes(gzip.compress(GOOD))
    out = tmp_path / "staged"
    out.mkdir()
    staged = staging.stage_json([str(source)], out, 2, REQUIRED)
    assert staged.parquet, staged.description
    assert read_staged(spark, staged.parquet) == read_spark_json(spark, source)


def test_ranges_of_a_file_tile_it_without_loss_or_repeat(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Split points fall mid-line, on a line start and at the end: every line once."""
    source = tmp_path / "events.jsonl"
    source.write_bytes(lines(*(line(op_id=index, error="e" * (index % 7)) for index in range(60))))
    first = len(line(op_id=0, error="")) + 1
    for split in (first, 97, 1000, source.stat().st_size):
        monkeypatch.setattr(staging, "SPLIT_BYTES", split)
        out = tmp_path / f"staged-{split}"
        out.mkdir()
        staged = staging.stage_json([str(source)], out, 2, REQUIRED)
        assert staged.parquet, staged.description
        assert read_staged(spark, staged.parquet) == read_spark_json(spark, source), split


def test_workers_take_the_ranges_in_turn_each_converted_once(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every worker reads the whole list and takes the next range nobody has taken:
    each range is converted by exactly one worker, the largest first."""
    sources = []
    for number, count in enumerate((40, 25, 7)):
        source = tmp_path / f"events-{number}.jsonl"
        source.write_bytes(lines(*(line(op_id=number * 100 + index) for index in range(count))))
        sources.append(source)
    monkeypatch.setattr(staging, "SPLIT_BYTES", 1500)
    out = tmp_path / "staged"
    out.mkdir()
    tasks = staging._tasks([str(source) for source in sources], out, REQUIRED)
    sizes = [task.end - task.start for task in tasks]
    assert len(tasks) > 6 and sizes == sorted(sizes, reverse=True)

    staged = staging.stage_json([str(source) for source in sources], out, 3, REQUIRED)
    assert "72 events" in staged.description, staged.description
    assert len(list(out.glob("*.claim"))) == len(tasks)
    expected = sorted(row for source in sources for row in read_spark_json(spark, source))
    assert read_staged(spark, staged.parquet) == expected


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 64])
def test_line_check_holds_across_every_read_size(size: int) -> None:
    text = "é☃".encode()
    data = lines(line(op_id=1, producer=text.decode()), line(op_id=2), line(op_id=3))
    check = staging._LineCheck(io.BytesIO(data), 0, None)
    while check.read(size):
        pass
    assert check.lines == 3
    for bad in (
        data.replace(b"}\n{", b"}\n\n{", 1),
        data.replace(b"}\n{", b"} \n{", 1),
        data.replace(b"}\n{", b"}\n {", 1),
        data[:-2] + b"\n",
        b" " + data,
        data.replace(text, text[:-1] + b"x", 1),  # a character cut short
        data[:-1] + b"\xe2",  # ends inside a character
    ):
        check = staging._LineCheck(io.BytesIO(bad), 0, None)
        with pytest.raises(staging.StagingRefused):
            while check.read(size):
                pass


def test_a_staging_that_cannot_write_leaves_the_json_to_spark(tmp_path: Path) -> None:
    source = tmp_path / "events.jsonl"
    source.write_bytes(GOOD)
    staged = staging.stage_json([str(source)], tmp_path / "missing" / "dir", 1, REQUIRED)
    assert staged.parquet == []
    assert "refused" in staged.description


def test_an_unusable_local_dir_leaves_the_json_to_spark(tmp_path: Path) -> None:
    source = tmp_path / "events.jsonl"
    source.write_bytes(GOOD)
    begun = staging.Staging([str(source)], 1, REQUIRED, str(tmp_path / "no" / "such" / "dir"))
    assert begun.result().parquet == []
    assert "no staging directory" in begun.result().description
    begun.close()


def test_empty_files_are_not_staged(tmp_path: Path) -> None:
    source = tmp_path / "events.jsonl"
    source.write_bytes(b"")
    staged = staging.stage_json([str(source)], tmp_path, 1, REQUIRED)
    assert staged.parquet == []


def test_reader_choice_names_a_bad_value() -> None:
    assert staging.reader_choice(" Spark ") == "spark"
    with pytest.raises(
        Exception, match=r"spark\.purgatory\.jsonReader must be one of arrow, spark, got 'duckdb'"
    ):
        staging.reader_choice("duckdb")


def report_run_section(out: Path) -> str:
    text = (out / "report.md").read_text()
    return text[text.index("## Run") :]


def json_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A one-file JSON Lines log, and the empty directory staging goes under."""
    events = tmp_path / "events"
    events.mkdir()
    (events / "a.jsonl").write_bytes(GOOD)
    staging_parent = tmp_path / "tmp"
    staging_parent.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(staging_parent))
    return events, staging_parent


def test_the_report_stages_json_and_says_so(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events, staging_parent = json_log(tmp_path, monkeypatch)
    assert main([str(events), "--out", str(tmp_path / "out")], spark=spark) == 0
    assert "parsed by Arrow into Parquet" in report_run_section(tmp_path / "out")
    assert list(staging_parent.iterdir()) == []  # the staged files are gone

    spark.conf.set(staging.JSON_READER_CONF, "spark")
    try:
        assert main([str(events), "--out", str(tmp_path / "out2")], spark=spark) == 0
    finally:
        spark.conf.unset(staging.JSON_READER_CONF)
    run = report_run_section(tmp_path / "out2")
    assert f"parsed by Spark ({staging.JSON_READER_CONF}=spark)" in run
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary == json.loads((tmp_path / "out2" / "summary.json").read_text())


def test_a_refused_log_reports_as_before(spark: Any, tmp_path: Path, capsys: Any) -> None:
    events = tmp_path / "events"
    events.mkdir()
    (events / "a.jsonl").write_bytes(lines(b"null", line(op_id=2)))
    assert main([str(events), "--out", str(tmp_path / "out")], spark=spark) == 1
    err = capsys.readouterr().err
    assert "a.jsonl line 1: " in err, err
    assert "Traceback" not in err


def test_a_bad_reader_value_fails_before_spark_starts(tmp_path: Path, capsys: Any) -> None:
    events = tmp_path / "events"
    events.mkdir()
    (events / "a.jsonl").write_bytes(GOOD)
    args = [
        str(events),
        "--out",
        str(tmp_path / "out"),
        "--conf",
        f"{staging.JSON_READER_CONF}=fast",
    ]
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        f"purgatory-report: error: {staging.JSON_READER_CONF} must be one of arrow, spark, "
        "got 'fast'"
    )


def test_a_script_without_a_main_guard_runs_once(tmp_path: Path) -> None:
    """The workers import only the staging module, never the caller's ``__main__``."""
    source = tmp_path / "events.jsonl"
    source.write_bytes(GOOD)
    ran = tmp_path / "ran.txt"
    script = tmp_path / "script.py"
    script.write_text(
        "from pathlib import Path\n"
        "from purgatory_report import staging\n"
        "from purgatory_report.inputs import REQUIRED\n"
        f"with open({str(ran)!r}, 'a') as marks:\n"
        "    marks.write('ran\\n')\n"
        f"out = Path({str(tmp_path / 'staged')!r})\n"
        "out.mkdir()\n"
        f"staged = staging.stage_json([{str(source)!r}], out, 2, REQUIRED)\n"
        "print(len(staged.parquet), staged.description)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]  # after the library's structlog lines
    assert last.startswith("1 parsed by Arrow into Parquet"), done.stdout
    assert ran.read_text() == "ran\n"


def test_a_failed_worker_is_described_in_one_line() -> None:
    refused = json.dumps({"refused": "a line does not end with '}'"}).encode()
    assert (
        staging._worker_failure(3, b"log line\n" + refused, b"") == "a line does not end with '}'"
    )
    assert staging._worker_failure(-11, b"", b"") == "a worker process died (signal 11)"
    assert staging._worker_failure(1, b"", b"Traceback\nMemoryError\n") == (
        "a worker process failed (exit status 1: MemoryError)"
    )
    assert staging._worker_failure(3, b"not json", b"") == "a worker process failed (exit status 3)"


def test_too_little_disk_leaves_the_json_to_spark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "events.jsonl"
    source.write_bytes(GOOD)
    out = tmp_path / "staged"
    out.mkdir()
    monkeypatch.setattr(staging, "_STAGED_SHARE", 1e15)  # more than any disk holds
    staged = staging.stage_json([str(source)], out, 1, REQUIRED)
    assert staged.parquet == []
    assert "MiB to stage" in staged.description
    assert "set spark.local.dir to a larger disk" in staged.description
    assert list(out.iterdir()) == []


def test_an_empty_gzip_file_is_no_rows(spark: Any, tmp_path: Path) -> None:
    empty = tmp_path / "a.jsonl.gz"
    empty.write_bytes(gzip.compress(b""))
    source = tmp_path / "b.jsonl"
    source.write_bytes(GOOD)
    out = tmp_path / "staged"
    out.mkdir()
    staged = staging.stage_json([str(empty), str(source)], out, 2, REQUIRED)
    assert staged.parquet, staged.description
    assert read_staged(spark, staged.parquet) == read_spark_json(spark, source)


def test_a_file_gone_before_staging_leaves_the_json_to_spark(tmp_path: Path) -> None:
    staged = staging.stage_json([str(tmp_path / "gone.jsonl")], tmp_path, 1, REQUIRED)
    assert staged.parquet == []
    # The reason is cut to one short line, where a long temporary directory (a test
    # worker's) may cut the file's name: the reason itself is there.
    assert staged.description.startswith("parsed by Spark (Arrow's reader refused: ")
    assert "No such file or directory" in staged.description


def test_a_cancelled_staging_leaves_the_json_to_spark(tmp_path: Path) -> None:
    source = tmp_path / "events.jsonl"
    source.write_bytes(GOOD)
    out = tmp_path / "staged"
    out.mkdir()
    cancel = threading.Event()
    cancel.set()
    staged = staging.stage_json([str(source)], out, 1, REQUIRED, cancel)
    assert staged.parquet == []
    assert staged.description == "parsed by Spark (Arrow's reader refused: cancelled)"
    assert list(out.iterdir()) == []


def test_a_run_interrupted_while_staging_removes_the_staging(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from purgatory_report import report

    events, staging_parent = json_log(tmp_path, monkeypatch)

    def interrupted(self: staging.Staging) -> staging.StagedJson:
        raise KeyboardInterrupt

    monkeypatch.setattr(staging.Staging, "result", interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.run(str(events), tmp_path / "out", spark=spark)
    assert list(staging_parent.iterdir()) == []


_HOLD_STAGING = (
    "import sys, time\n"
    "from purgatory_report import staging\n"
    "directory, _ = staging.staging_directory(sys.argv[1])\n"
    "(directory / 'part-0.parquet').write_bytes(b'staged')\n"
    "print(directory, flush=True)\n"
    "time.sleep(120)\n"
)


def _holder(parent: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process that made a staging directory under ``parent`` and lives on."""
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLD_STAGING, str(parent)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    return process, Path(process.stdout.readline().strip())


def test_a_killed_runs_staging_is_swept_by_the_next_and_a_live_one_never(tmp_path: Path) -> None:
    """A run killed outright (SIGKILL: no cleanup runs) leaves its staged files; the next
    staging removes them. A directory whose run lives (another process, or this one)
    is kept, and so is one without an owner file (not provably abandoned)."""
    killed, abandoned = _holder(tmp_path)
    alive, kept = _holder(tmp_path)
    try:
        killed.kill()
        killed.wait(timeout=30)
        unknown = tmp_path / f"{staging.STAGING_PREFIX}unknown"
        unknown.mkdir()
        assert abandoned.is_dir()
        mine, owner = staging.staging_directory(str(tmp_path))
        try:
            assert not abandoned.exists()
            assert kept.is_dir() and (kept / "part-0.parquet").exists()
            assert unknown.is_dir()
            assert staging.sweep_stale(tmp_path) == []  # this process's own run: alive
        finally:
            staging.remove(mine)
            os.close(owner)
    finally:
        alive.kill()
        alive.wait(timeout=30)
    assert staging.sweep_stale(tmp_path) == [kept]  # its process has ended since
    assert sorted(tmp_path.iterdir()) == [unknown]
