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
        (["--min-insync", "4"], "min-insync"),
        (["--producers", "-1"], "producers must not be negative"),
    ],
)
def test_semantically_bad_arguments_exit_non_zero_with_a_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*args, "--quiet"]) != 0
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--faults", "slow-follower,meteor"], "unknown fault meteor"),
        (["--acks", "2"], "invalid choice"),
        (["--duration", "soon"], "invalid float value"),
        (["--events-format", "csv"], "invalid choice"),
    ],
)
def test_malformed_arguments_exit_non_zero_with_a_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code != 0
    assert message in capsys.readouterr().err


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
