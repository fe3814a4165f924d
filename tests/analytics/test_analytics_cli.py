"""``purgatory-report`` on bad input and environments: one line on stderr, non-zero exit."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import purgatory_report.cli as cli
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from purgatory_report.cli import main
from purgatory_report.errors import JAVA_MISSING

from purgatory_aio.eventlog import arrow_schema
from purgatory_aio.events import COLUMNS, OperationEvent

ROOT = Path(__file__).resolve().parents[2]
CLI_FILE = ROOT / "report" / "purgatory_report" / "cli.py"

T0 = 1_700_000_100.0
EVENT = OperationEvent("fetch", "FetchOp", 1, ["t-0"], T0, T0 + 0.5, T0 + 0.1, "completed", None)


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("purgatory-report: error: ")
    assert "Traceback" not in err
    assert "at org.apache" not in err
    return lines[0]


def write_parquet(path: Path, rows: list[dict[str, Any]], schema: Any = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def write_jsonl(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))


def run_cli(capsys: pytest.CaptureFixture[str], spark: Any, events: Path, out: Path) -> str:
    assert main([str(events), "--out", str(out)], spark=spark) == 1
    return error_line(capsys)


def test_missing_directory(capsys, tmp_path: Path) -> None:
    status = main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert status == 1
    assert "events directory not found" in error_line(capsys)


def test_directory_without_event_files(capsys, tmp_path: Path) -> None:
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "notes.txt").write_text("hello")
    (tmp_path / "events" / ".events-x.parquet.tmp").write_bytes(b"partial")
    status = main([str(tmp_path / "events"), "--out", str(tmp_path / "out")])
    assert status == 1
    assert "no event files" in error_line(capsys)


def test_corrupt_parquet_file(capsys, tmp_path: Path) -> None:
    write_parquet(tmp_path / "events" / "good.parquet", [EVENT.as_dict()], arrow_schema())
    (tmp_path / "events" / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    status = main([str(tmp_path / "events"), "--out", str(tmp_path / "out")])
    assert status == 1
    line = error_line(capsys)
    assert "corrupt Parquet file" in line
    assert "bad.parquet" in line


def test_parquet_file_missing_columns(capsys, tmp_path: Path) -> None:
    row = {k: v for k, v in EVENT.as_dict().items() if k not in ("settled_at", "outcome")}
    write_parquet(tmp_path / "events" / "part.parquet", [row])
    status = main([str(tmp_path / "events"), "--out", str(tmp_path / "out")])
    assert status == 1
    assert "lacks column(s): settled_at, outcome" in error_line(capsys)


def test_parquet_file_with_a_wrong_column_type(capsys, tmp_path: Path) -> None:
    row = {**EVENT.as_dict(), "op_id": "one"}
    write_parquet(tmp_path / "events" / "part.parquet", [row])
    assert main([str(tmp_path / "events"), "--out", str(tmp_path / "out")]) == 1
    assert "column op_id has type string, expected int64" in error_line(capsys)


@pytest.mark.spark
def test_parquet_file_with_corrupt_data_pages(
    capsys, spark: Any, tmp_path: Path, events: list[OperationEvent]
) -> None:
    path = tmp_path / "events" / "x.parquet"
    write_parquet(path, [e.as_dict() for e in events], arrow_schema())
    data = bytearray(path.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for offset in range(4, len(data) - footer, 5):
        data[offset] ^= 0xA5
    path.write_bytes(bytes(data))
    pq.read_schema(path)  # the footer survives: only Spark's read can find the damage
    line = run_cli(capsys, spark, tmp_path / "events", tmp_path / "out")
    assert "Spark job failed" in line
    assert "x.parquet" in line


@pytest.mark.spark
def test_jsonl_missing_columns(capsys, spark: Any, tmp_path: Path) -> None:
    row = {k: v for k, v in EVENT.as_dict().items() if k != "settled_at"}
    write_jsonl(tmp_path / "events" / "a.jsonl", [json.dumps(row)] * 3)
    line = run_cli(capsys, spark, tmp_path / "events", tmp_path / "out")
    assert "lack required column(s) settled_at" in line
    assert "a.jsonl" in line


@pytest.mark.spark
def test_corrupt_jsonl_file(capsys, spark: Any, tmp_path: Path) -> None:
    good = json.dumps(EVENT.as_dict())
    write_jsonl(tmp_path / "events" / "a.jsonl", [good, '{"purgatory": "fetch", "op_ty'])
    line = run_cli(capsys, spark, tmp_path / "events", tmp_path / "out")
    assert "not valid event records" in line
    assert "a.jsonl line 2: not JSON" in line


@pytest.mark.spark
def test_jsonl_line_with_a_wrong_type_names_file_line_and_field(
    capsys, spark: Any, tmp_path: Path
) -> None:
    good = json.dumps(EVENT.as_dict())
    bad = json.dumps({**EVENT.as_dict(), "op_id": "seven"})
    write_jsonl(tmp_path / "events" / "a.jsonl", [good, good, bad])
    line = run_cli(capsys, spark, tmp_path / "events", tmp_path / "out")
    assert 'a.jsonl line 3: field op_id is "seven" (a string), expected an integer' in line


@pytest.mark.spark
def test_unknown_outcome(capsys, spark: Any, tmp_path: Path) -> None:
    write_jsonl(
        tmp_path / "events" / "a.jsonl", [json.dumps({**EVENT.as_dict(), "outcome": "lost"})]
    )
    assert "unknown outcome such as 'lost'" in run_cli(
        capsys, spark, tmp_path / "events", tmp_path / "out"
    )


@pytest.mark.spark
def test_event_files_without_events(capsys, spark: Any, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "events" / "a.jsonl", [])
    assert "hold no events" in run_cli(capsys, spark, tmp_path / "events", tmp_path / "out")


@pytest.mark.spark
def test_parquet_and_jsonl_mixed_in_nested_directories(spark: Any, tmp_path: Path) -> None:
    write_parquet(tmp_path / "events" / "a" / "x.parquet", [EVENT.as_dict()], arrow_schema())
    second = EVENT._replace(op_id=2, outcome="expired", settled_at=T0 + 0.6)
    write_jsonl(tmp_path / "events" / "b" / "c" / "y.jsonl", [json.dumps(second.as_dict())])
    (tmp_path / "events" / "_SUCCESS").write_text("")
    out = tmp_path / "out"
    assert main([str(tmp_path / "events"), "--out", str(out)], spark=spark) == 0
    (row,) = json.loads((out / "summary.json").read_text())
    assert (row["count"], row["completed"], row["expired"]) == (2, 1, 1)


def test_a_file_that_is_not_an_event_file_is_not_a_directory(capsys, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    assert main([str(tmp_path / "notes.txt"), "--out", str(tmp_path / "out")]) == 1
    assert "not a directory" in error_line(capsys)


@pytest.mark.parametrize("out", ["/proc/report", "/proc/version/report"])
def test_unwritable_output_fails_before_spark_starts(
    capsys, tmp_path: Path, monkeypatch, out: str
) -> None:
    from purgatory_report import session

    write_parquet(tmp_path / "events" / "x.parquet", [EVENT.as_dict()], arrow_schema())

    def no_spark(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Spark was started before the output was checked")

    monkeypatch.setattr(session, "create_session", no_spark)
    assert main([str(tmp_path / "events"), "--out", out]) == 1
    assert "cannot write the report to" in error_line(capsys)


def test_a_directory_that_is_not_a_report_is_never_replaced(capsys, tmp_path: Path) -> None:
    write_parquet(tmp_path / "events" / "x.parquet", [EVENT.as_dict()], arrow_schema())
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("...")
    assert main([str(tmp_path / "events"), "--out", str(precious)]) == 1
    assert "not a purgatory report" in error_line(capsys)
    assert (precious / "thesis.tex").read_text() == "..."


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--since", "yesterday"], "not a time: 'yesterday'"),
        (["--since", "2026-02-01", "--until", "2026-01-01"], "must be before --until"),
    ],
)
def test_bad_time_window(capsys, tmp_path: Path, args: list[str], message: str) -> None:
    write_parquet(tmp_path / "events" / "x.parquet", [EVENT.as_dict()], arrow_schema())
    assert main([str(tmp_path / "events"), "--out", str(tmp_path / "out"), *args]) == 1
    assert message in error_line(capsys)


def test_no_java_says_how_to_install_it(capsys, tmp_path: Path, monkeypatch) -> None:
    write_parquet(tmp_path / "events" / "x.parquet", [EVENT.as_dict()], arrow_schema())
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert main([str(tmp_path / "events"), "--out", str(tmp_path / "out")]) == 1
    line = error_line(capsys)
    assert JAVA_MISSING in line
    assert "apt-get install openjdk-17-jre-headless" in line
    assert "JAVA_HOME" in line


def test_java_home_without_java(capsys, tmp_path: Path, monkeypatch) -> None:
    write_parquet(tmp_path / "events" / "x.parquet", [EVENT.as_dict()], arrow_schema())
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert main([str(tmp_path / "events"), "--out", str(tmp_path / "out")]) == 1
    assert "holds no bin/java" in error_line(capsys)


def test_missing_pyspark_says_which_extra_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "from purgatory_report.cli import main\n"
        f"raise SystemExit(main([{str(tmp_path)!r}, '--out', {str(tmp_path / 'out')!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        done.stderr.strip(),
    ]
    assert "pip install ./report from a clone: purgatory-aio-report" in done.stderr


def test_bad_master_url(capsys, tmp_path: Path) -> None:
    write_parquet(tmp_path / "events" / "x.parquet", [EVENT.as_dict()], arrow_schema())
    assert main([str(tmp_path / "events"), "--out", str(tmp_path / "out"), "--master", "foo"]) == 1
    assert "not a Spark master URL: 'foo'" in error_line(capsys)


def test_usage_error_exits_2(capsys) -> None:
    assert main(["events-only"]) == 2
    assert "--out" in capsys.readouterr().err


def test_bad_conf_exits_2(capsys, tmp_path: Path) -> None:
    assert main([str(tmp_path), "--out", str(tmp_path), "--conf", "novalue"]) == 2


def test_cli_file_runs_as_a_script_for_spark_submit() -> None:
    done = subprocess.run(
        [sys.executable, str(CLI_FILE), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=CLI_FILE.parent,
    )
    assert done.returncode == 0, done.stderr
    assert "EVENTS_DIR" in done.stdout


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "purgatory-report"
    assert script.exists() or shutil.which("purgatory-report")


def test_columns_of_the_cli_schema_match_the_event_schema() -> None:
    assert tuple(arrow_schema().names) == COLUMNS
    assert cli.PROG == "purgatory-report"
    assert os.sep not in cli.PROG


def test_the_jvm_start_up_noise_is_dropped_and_its_errors_kept() -> None:
    from purgatory_report.session import forward_jvm_stderr

    source = io.BytesIO(
        b"WARNING: Using incubator modules: jdk.incubator.vector\n"
        b"Warning: Java versions > Java 11 can only operate in restricted mode where no "
        b"off-heap operations are allowed!\n"
        b"Error occurred during initialization of VM\n"
        b"spark: ERROR SparkContext: Error initializing SparkContext.\n"
    )
    target = io.StringIO()
    forward_jvm_stderr(source, target)
    assert target.getvalue() == (
        "Error occurred during initialization of VM\n"
        "spark: ERROR SparkContext: Error initializing SparkContext.\n"
    )


# Runs the command in a fresh process whose report.run first does `action` to the JVM
# the command started (a real JVM, really killed), then runs as usual.
_DYING_JVM = """
import os, signal, sys
from purgatory_report import cli, report, session
real_run = report.run
def run(*args, spark, **kwargs):
    action = sys.argv[1]
    if action == "kill":
        os.kill(session._Jvm.process.pid, signal.SIGKILL)
    else:  # what Spark's handler of an uncaught OutOfMemoryError does
        try:
            spark.sparkContext._jvm.java.lang.System.exit(52)
        except Exception:
            pass
    return real_run(*args, spark=spark, **kwargs)
report.run = run
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.spark
@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("kill", "the Spark JVM was killed by signal 9"),
        (
            "oom",
            "Spark ran out of memory (driver heap 1g): rerun with --conf spark.driver.memory=2g",
        ),
    ],
)
def test_a_dying_jvm_is_one_line_not_a_write_error(
    tmp_path: Path, action: str, expected: str
) -> None:
    write_parquet(tmp_path / "events" / "e.parquet", [EVENT._asdict()], arrow_schema())
    command = [
        sys.executable, "-c", _DYING_JVM, action, str(tmp_path / "events"),
        "--out", str(tmp_path / "out"), "--master", "local[1]",
        "--conf", "spark.driver.memory=1g",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [lines[0]], done.stderr  # one line: no traceback, no JVM start-up noise
    assert lines[0].startswith(f"purgatory-report: error: {expected}"), lines[0]
    assert "cannot write the report" not in done.stderr
    assert not (tmp_path / "out").exists()


# Runs the command twice in one process, each starting its own JVM: the first's JVM is
# let go once its report is written (its exit overlaps the process's own), the second
# starts a new one.
_TWICE = """
import sys
from purgatory_report import cli, session
first = cli.main(sys.argv[1:] + ["--out", sys.argv[1] + "-1"])
released = session._Jvm.process is None
print("first", first, "released", released, flush=True)
second = cli.main(sys.argv[1:] + ["--out", sys.argv[1] + "-2"])
print("second", second, flush=True)
"""


@pytest.mark.spark
def test_a_command_lets_its_jvm_go_and_the_next_starts_a_new_one(tmp_path: Path) -> None:
    write_parquet(tmp_path / "events" / "e.parquet", [EVENT._asdict()], arrow_schema())
    command = [
        sys.executable, "-c", _TWICE, str(tmp_path / "events"), "--master", "local[1]",
        "--conf", "spark.driver.memory=1g",
    ]  # fmt: skip
    # No class archive: a first run on a machine would keep its JVM to write one.
    env = {**os.environ, "PURGATORY_REPORT_CLASS_CACHE": "off"}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=240, check=False, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "first 0 released True" in done.stdout, done.stdout + done.stderr
    assert "second 0" in done.stdout, done.stdout + done.stderr
    for run in ("1", "2"):
        assert (tmp_path / f"events-{run}" / "report.md").is_file()


def test_the_accumulator_server_is_woken_to_stop_without_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """PySpark's own server, stopped as a session stops it, with the wake-up beside it:
    the serving thread ends, its handler (serving the wake-up) reports nothing."""
    import threading

    from purgatory_report.session import _wake_accumulator_server
    from pyspark.accumulators import _start_update_server

    before = set(threading.enumerate())
    server = _start_update_server("secret-token", False)
    serving = [t for t in set(threading.enumerate()) - before if "serve_forever" in t.name]
    assert serving
    waker = threading.Thread(target=_wake_accumulator_server, args=(server,))
    waker.start()
    server.shutdown()
    waker.join(timeout=10)
    assert not waker.is_alive()
    for thread in serving:
        thread.join(timeout=10)
        assert not thread.is_alive()
    assert "Traceback" not in capsys.readouterr().err
    _wake_accumulator_server(server, timeout=0.1)  # closed already: returns quietly
