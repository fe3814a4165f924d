"""purgatory-sim: determinism, argument errors, the event log and the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from minikafka.broker import PURGATORY_NAMES
from minikafka.cli import main
from minikafka.sim import FAULTS, SimConfig, run_simulation

from purgatory_aio.events import COLUMNS, OUTCOMES

SHORT_RUN = ["--virtual-time", "--duration", "15", "--quiet"]

# main() configures structlog, as an application does; undo it for the other tests.
pytestmark = pytest.mark.usefixtures("restore_structlog")


def run_cli(*args: str) -> int:
    code: int = main([*SHORT_RUN, *args])
    return code


def test_same_seed_in_virtual_time_gives_the_same_report(tmp_path: Path) -> None:
    first, second, other = tmp_path / "1.json", tmp_path / "2.json", tmp_path / "3.json"
    assert run_cli("--seed", "5", "--faults", "all", "--json", str(first)) == 0
    assert run_cli("--seed", "5", "--faults", "all", "--json", str(second)) == 0
    assert run_cli("--seed", "6", "--faults", "all", "--json", str(other)) == 0
    assert first.read_text() == second.read_text()
    assert first.read_text() != other.read_text()


def test_the_report_covers_every_headline(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli("--seed", "1") == 0
    out = capsys.readouterr().out
    for heading in (
        "Throughput",
        "Produce latency",
        "Consumer fetches",
        "Purgatories",
        "ISR changes",
        "Rebalances",
        "Delayed messages",
    ):
        assert heading in out


def test_json_report_has_latency_per_acks_and_counts_per_purgatory(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    assert run_cli("--acks", "mixed", "--json", str(path)) == 0
    report = json.loads(path.read_text())
    assert set(report["produce"]) == {"all", "1", "0"}
    assert set(report["produce"]["all"]["latency"]) == {"count", "p50_ms", "p99_ms", "max_ms"}
    assert list(report["purgatories"]) == list(PURGATORY_NAMES)
    assert report["delayed_messages"]["seen_before_due"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "4", "--brokers", "3"], "cannot exceed brokers"),
        (["--duration", "0"], "duration must be a positive"),
        (["--duration", "-5"], "duration must be a positive"),
        (["--duration", "1e308"], "up to 3600, got 1e+308"),
        (["--min-insync", "4"], "min-insync"),
        (["--producers", "-1"], "producers must not be negative"),
        (["--brokers", "0"], "brokers must be at least 1, got 0"),
        (["--faults", "slow-follower,meteor"], "unknown fault meteor;"),
        (["--faults", "all,bogus"], "unknown fault bogus;"),
        (["--faults", ""], "--faults: empty;"),
        (["--faults", "none,slow-follower"], "none cannot be combined"),
        (["--acks", "2"], "invalid choice"),
        (["--duration", "soon"], "invalid float value"),
        (["--events-format", "csv"], "invalid choice"),
    ],
)
def test_bad_arguments_fail_with_one_error_line_and_a_hint(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--quiet"])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("purgatory-sim: error: ") and message in lines[0]
    assert lines[1] == "purgatory-sim: see 'purgatory-sim --help' for the options"


def test_faults_all_with_a_fault_named_again_is_every_fault() -> None:
    from minikafka.cli import build_parser

    assert build_parser().parse_args(["--faults", "all,slow-follower"]).faults == FAULTS


def _fails_before_running(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    # A one-hour run would take minutes: failing at once shows nothing ran.
    with pytest.raises(SystemExit) as exit_:
        main(["--virtual-time", "--duration", "3600", "--quiet", *args])
    assert exit_.value.code == 2
    err: str = capsys.readouterr().err
    return err


def test_json_naming_a_directory_fails_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _fails_before_running(["--json", f"{tmp_path}/"], capsys)
    assert "is a directory; give a file" in err
    err = _fails_before_running(["--json", str(tmp_path)], capsys)
    assert "is a directory" in err


def test_json_in_a_missing_directory_is_refused_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "missing" / "dir" / "r.json"
    err = _fails_before_running(["--json", str(target)], capsys)
    assert f"the directory {target.parent} does not exist" in err
    assert not (tmp_path / "missing").exists()


def test_events_path_that_is_a_file_or_has_no_parent_fails_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("")
    assert "is not a directory" in _fails_before_running(["--events", str(a_file)], capsys)
    missing = tmp_path / "no" / "events"
    assert "does not exist" in _fails_before_running(["--events", str(missing)], capsys)
    assert not missing.parent.exists()


def read_events(directory: Path) -> list[dict[str, Any]]:
    files = sorted(directory.rglob("*.jsonl"))
    assert files, f"no event files in {directory}"
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line]


def test_events_dir_gets_one_record_per_settled_operation_with_the_fixed_columns(
    tmp_path: Path,
) -> None:
    events_dir = tmp_path / "events"
    report_path = tmp_path / "report.json"
    assert run_cli("--faults", "all", "--events", str(events_dir), "--json", str(report_path)) == 0
    events = read_events(events_dir)
    assert all(list(event) == list(COLUMNS) for event in events)
    assert {event["purgatory"] for event in events} <= set(PURGATORY_NAMES)
    assert {event["outcome"] for event in events} <= set(OUTCOMES)
    assert all(e["created_at"] <= e["settled_at"] for e in events)
    ops = {(e["purgatory"], e["op_id"]) for e in events}
    assert len(ops) == len(events), "every operation settles exactly once"
    tally = json.loads(report_path.read_text())["purgatories"]
    assert len(events) == sum(sum(counts.values()) for counts in tally.values())


def test_events_can_be_written_as_parquet(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    events_dir = tmp_path / "events"
    assert run_cli("--events", str(events_dir), "--events-format", "parquet") == 0
    files = sorted(events_dir.rglob("*.parquet"))
    assert files
    assert pq.read_schema(files[0]).names == list(COLUMNS)


def test_simulation_is_usable_without_the_cli() -> None:
    config = SimConfig(duration=5.0, seed=2, virtual_time=True, faults=FAULTS)
    first = run_simulation(config)
    assert first == run_simulation(config)
    assert first.data["throughput"]["acked_records"] > 0


def test_idempotent_producers_leave_no_duplicates_under_every_fault(tmp_path: Path) -> None:
    counts = {}
    for flag in ("", "--idempotence"):
        path = tmp_path / f"report{flag}.json"
        args = ["--seed", "3", "--acks", "all", "--faults", "all", "--json", str(path)]
        assert (
            main(["--virtual-time", "--duration", "20", "--quiet", *args, *filter(None, [flag])])
            == 0
        )
        counts[flag] = json.loads(path.read_text())["ordering"]["duplicates"]
    assert counts[""] > 0  # retried acks=all writes whose first copy was appended
    assert counts["--idempotence"] == 0


def test_idempotence_bounds_the_requests_in_flight() -> None:
    assert SimConfig(idempotence=True, max_in_flight=6).problems() == [
        "max-in-flight must be at most 5 with idempotence (the batches a broker remembers "
        "per producer), got 6"
    ]
