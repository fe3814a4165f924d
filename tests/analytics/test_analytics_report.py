"""The report's figures against the same figures computed in plain Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from eventlog_reference import (
    by_group,
    key_counts,
    latencies,
    lateness,
    per_second,
    rank_bounds,
    would_expire,
)
from purgatory_report.cli import main
from purgatory_report.metrics import (
    HEADLINE_QUANTILES,
    RANK_ERROR,
    WHATIF_FRACTIONS,
)
from purgatory_report.model import SUMMARY_KEYS
from purgatory_report.render import NOT_JUDGEABLE

from purgatory_aio.events import OUTCOMES, OperationEvent

pytestmark = pytest.mark.spark

TOP_KEYS = 5
T0 = 1_700_000_000.0
Events = list[OperationEvent]


@pytest.fixture(scope="module")
def out_dir(spark: Any, event_log: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    status = main([str(event_log), "--out", str(out), "--top-keys", str(TOP_KEYS)], spark=spark)
    assert status == 0
    return out


@pytest.fixture(scope="module")
def summary(out_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    rows = json.loads((out_dir / "summary.json").read_text())
    return {(row["purgatory"], row["op_type"]): row for row in rows}


def table(out_dir: Path, name: str) -> list[dict[str, Any]]:
    return pq.read_table(out_dir / "tables" / name).to_pylist()


def test_summary_has_one_entry_per_purgatory_and_op_type(summary, events: Events) -> None:
    assert set(summary) == set(by_group(events))


def test_summary_json_has_the_required_keys_first(out_dir: Path) -> None:
    for row in json.loads((out_dir / "summary.json").read_text()):
        assert tuple(row)[: len(SUMMARY_KEYS)] == SUMMARY_KEYS


def test_outcome_counts_are_exact(summary, events: Events) -> None:
    for group, members in by_group(events).items():
        row = summary[group]
        assert row["count"] == len(members)
        for outcome in OUTCOMES:
            assert row[outcome] == sum(e.outcome == outcome for e in members), outcome
        expired = sum(e.outcome == "expired" for e in members)
        judged = sum(e.outcome in ("completed", "expired") for e in members)
        assert row["expiry_ratio"] == pytest.approx(expired / judged)


def test_the_test_log_has_every_outcome_and_unwatched_operations(events: Events) -> None:
    assert {e.outcome for e in events} == set(OUTCOMES)
    assert any(not e.keys for e in events)


@pytest.mark.parametrize("name", sorted(HEADLINE_QUANTILES))
def test_latency_percentiles_are_within_the_documented_rank_error(
    summary, events: Events, name: str
) -> None:
    quantile = HEADLINE_QUANTILES[name]
    for group, members in by_group(events).items():
        values = latencies(members)
        reported = summary[group][f"latency_{name}"]
        low, high = rank_bounds(values, quantile, RANK_ERROR)
        assert low <= reported <= high, (group, name)
        assert reported in values  # percentile_approx returns an observed value


def test_latency_mean_and_max_are_exact(summary, events: Events) -> None:
    for group, members in by_group(events).items():
        values = latencies(members)
        assert summary[group]["latency_max"] == max(values)
        assert summary[group]["latency_mean"] == pytest.approx(sum(values) / len(values))


@pytest.mark.parametrize(("key", "quantile"), [("lateness_p50", 0.5), ("lateness_p99", 0.99)])
def test_lateness_percentiles_are_within_the_documented_rank_error(
    summary, events: Events, key: str, quantile: float
) -> None:
    for group, members in by_group(events).items():
        values = lateness(members)
        low, high = rank_bounds(values, quantile, RANK_ERROR)
        assert low <= summary[group][key] <= high, group
        assert summary[group]["lateness_max"] == max(values)


def test_latency_quantiles_table_holds_the_headline_percentiles(out_dir: Path, summary) -> None:
    rows = table(out_dir, "latency_quantiles")
    for (purgatory, op_type), row in summary.items():
        curve = {
            r["quantile"]: r["latency_s"]
            for r in rows
            if (r["purgatory"], r["op_type"]) == (purgatory, op_type)
        }
        assert curve[0.5] == row["latency_p50"]
        assert curve[0.99] == row["latency_p99"]
        assert list(curve.values()) == sorted(curve.values())


def test_throughput_matches_plain_python(out_dir: Path, summary, events: Events) -> None:
    rows = table(out_dir, "throughput")
    for group, members in by_group(events).items():
        expected = per_second(members)
        found = {r["second"]: r["settled"] for r in rows if (r["purgatory"], r["op_type"]) == group}
        assert found == expected
        active = max(expected) - min(expected) + 1
        assert summary[group]["active_seconds"] == active
        assert summary[group]["throughput_per_s"] == pytest.approx(len(members) / active)
        assert summary[group]["peak_per_s"] == max(expected.values())


def test_hot_keys_match_plain_python(out_dir: Path, events: Events) -> None:
    rows = table(out_dir, "hot_keys")
    for group, members in by_group(events).items():
        found = sorted(
            (r["key"], r["watched"], r["expired"])
            for r in rows
            if (r["purgatory"], r["op_type"]) == group
        )
        assert found == sorted(key_counts(members))


def test_report_lists_the_top_keys(out_dir: Path, events: Events) -> None:
    text = (out_dir / "report.md").read_text()
    for members in by_group(events).values():
        ranked = key_counts(members)
        assert f"| {TOP_KEYS} | `{ranked[TOP_KEYS - 1][0]}` |" in text
        assert f"\n| {TOP_KEYS + 1} | `" not in text


def test_whatif_shares_match_plain_python(out_dir: Path, events: Events) -> None:
    rows = table(out_dir, "whatif")
    for group, members in by_group(events).items():
        judged = sum(e.outcome in ("completed", "expired") for e in members)
        found = {r["timeout_fraction"]: r for r in rows if (r["purgatory"], r["op_type"]) == group}
        assert sorted(found) == list(WHATIF_FRACTIONS)
        for fraction, row in found.items():
            expected = would_expire(members, fraction)
            assert row["judged"] == judged
            assert row["would_expire"] == expected, (group, fraction)
            assert row["share"] == pytest.approx(expected / judged)


def test_whatif_at_the_used_timeout_is_the_observed_expiry_share(out_dir: Path, summary) -> None:
    for row in table(out_dir, "whatif"):
        if row["timeout_fraction"] == 1.0:
            entry = summary[(row["purgatory"], row["op_type"])]
            assert row["would_expire"] == entry["expired"]


def test_whatif_candidates_are_shorter_than_the_used_timeout(out_dir: Path) -> None:
    rows = table(out_dir, "whatif")
    for row in rows:
        if row["op_type"] == "DeleteRecordsOp":  # timeouts of 0.1 and 0.3 s: no one used
            assert row["candidate_timeout_s"] is None
            assert row["timeout_used_s"] is None
        else:
            assert row["candidate_timeout_s"] <= row["timeout_used_s"] * (1 + 1e-9)
    assert {row["op_type"] for row in rows} == {"FetchOp", "ProduceOp", "DeleteRecordsOp"}


def test_report_says_longer_timeouts_cannot_be_judged(out_dir: Path) -> None:
    assert NOT_JUDGEABLE in (out_dir / "report.md").read_text()


def test_report_states_the_percentile_error_bound(out_dir: Path) -> None:
    text = (out_dir / "report.md").read_text()
    assert "accuracy 10,000" in text
    assert "n/10,000" in text
    assert "KLL sketch" in text


@pytest.mark.parametrize("chart", ["latency", "expirations", "whatif", "throughput"])
def test_report_md_references_each_png_chart(out_dir: Path, chart: str) -> None:
    png = out_dir / "charts" / f"{chart}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"](charts/{chart}.png)" in (out_dir / "report.md").read_text()


@pytest.mark.parametrize(
    "name", ["summary", "latency_quantiles", "throughput", "hot_keys", "whatif"]
)
def test_full_tables_are_written_as_parquet(out_dir: Path, name: str) -> None:
    assert table(out_dir, name)


def test_summary_table_matches_summary_json(out_dir: Path, summary) -> None:
    for row in table(out_dir, "summary"):
        entry = summary[(row["purgatory"], row["op_type"])]
        assert {key: entry[key] for key in row} == row


def test_undefined_figures_are_null(spark: Any, tmp_path: Path) -> None:
    only_cancelled = [
        OperationEvent("p", "Op", n, ["k"], T0 + n, T0 + 1 + n, T0 + 0.5 + n, "cancelled", None)
        for n in range(3)
    ]
    from eventlog_reference import write_log

    write_log(tmp_path / "events", only_cancelled)
    assert main([str(tmp_path / "events"), "--out", str(tmp_path / "out")], spark=spark) == 0
    (row,) = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert row["cancelled"] == 3
    assert row["latency_p50"] is None
    assert row["latency_p99"] is None
    assert row["lateness_p99"] is None
    assert row["expiry_ratio"] is None  # nothing completed or expired: no ratio


def assert_same_report(first: Path, second: Path) -> None:
    """The same figures, tables and findings (not the run section) in two reports."""
    local = json.loads((first / "summary.json").read_text())
    remote = json.loads((second / "summary.json").read_text())
    assert len(remote) == len(local)
    for mine, theirs in zip(local, remote, strict=True):
        assert list(mine) == list(theirs)
        for key, value in mine.items():
            if isinstance(value, float):
                # Means may sum in another order on other executors; all else is exact.
                assert theirs[key] == pytest.approx(value, rel=1e-12), key
            else:
                assert theirs[key] == value, key
    for name in ("hot_keys", "whatif", "throughput"):
        key = sorted(map(str, table(first, name)))
        assert sorted(map(str, table(second, name))) == key, name

    def body(report_dir: Path) -> str:  # from the data quality to the run section
        text = (report_dir / "report.md").read_text()
        return text.split("## Data quality")[1].split("## Run")[0]

    assert body(second) == body(first)


def test_partials_too_many_to_collect_are_finished_by_spark_alike(
    spark: Any, event_log: Path, out_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log whose per-second partials and hot keys are too many for the driver gets the
    same report, its figures, throughput table, timeline and top keys computed by Spark."""
    from purgatory_report import report

    monkeypatch.setattr(report, "DRIVER_PARTIALS", 0)
    monkeypatch.setattr(report, "DRIVER_KEYS", 0)  # and the top keys ranked by Spark
    out = tmp_path / "finished-by-spark"
    assert main([str(event_log), "--out", str(out), "--top-keys", str(TOP_KEYS)], spark=spark) == 0
    assert_same_report(out_dir, out)
    throughput = pq.read_table(out_dir / "tables" / "throughput").schema
    assert pq.read_table(out / "tables" / "throughput").schema.types == throughput.types


@pytest.mark.parametrize(
    ("target", "name"),
    [("_hot_keys", "hot keys broke"), ("_Passes._start_usable", "could not plan")],
    ids=["a pass fails", "starting the passes fails"],
)
def test_a_failure_stops_the_passes_and_leaves_nothing(
    spark: Any,
    event_log: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    name: str,
) -> None:
    """The passes run at once: one failing fails the run with its own error, after the
    others are stopped; so does an error while they are being started (after the
    identity check and the figures began). The report directory is never created and
    no job lingers."""
    from purgatory_report import report

    def broken(*_: object) -> None:
        raise RuntimeError(name)

    owner, _, attribute = target.rpartition(".")
    monkeypatch.setattr(getattr(report, owner) if owner else report, attribute, broken)
    with pytest.raises(RuntimeError, match=name):
        report.run(str(event_log), tmp_path / "report", spark=spark)
    assert list(tmp_path.iterdir()) == []
    assert not spark.sparkContext.statusTracker().getActiveJobsIds()


@pytest.mark.slow
def test_a_standalone_cluster_gives_the_same_report(
    standalone_cluster: str, event_log: Path, out_dir: Path, tmp_path: Path
) -> None:
    """The known-answer log on a real master + worker, driven as a user would drive it."""
    from bench._cluster import cluster_env

    out = tmp_path / "cluster-report"
    command = [
        sys.executable, "-m", "purgatory_report.cli", str(event_log),
        "--out", str(out), "--top-keys", str(TOP_KEYS), "--master", standalone_cluster,
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--conf", "spark.executor.memory=512m",
        "--conf", "spark.sql.shuffle.partitions=4",
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=240, env=cluster_env(), check=False
    )
    assert done.returncode == 0, done.stderr
    assert_same_report(out_dir, out)
    assert "| master | `spark://127.0.0.1:" in (out / "report.md").read_text()


@pytest.mark.slow
def test_the_first_local_run_keeps_a_class_archive_the_next_starts_from(
    event_log: Path, out_dir: Path, tmp_path: Path
) -> None:
    """The first run leaves one complete archive (nothing half-written); the next run
    maps it, and gives the same report with nothing more on stderr; a damaged archive
    is dropped and the run starts without it."""
    from purgatory_report.session import CLASS_CACHE_ENV

    cache = tmp_path / "classes"
    env = {**os.environ, CLASS_CACHE_ENV: str(cache)}
    outputs = []
    for run in range(3):
        if run == 2:  # as if written onto a full disk: it would crash the JVM that maps it
            (archive,) = cache.iterdir()
            archive.chmod(0o644)
            archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
        out = tmp_path / f"report-{run}"
        command = [
            sys.executable, "-m", "purgatory_report.cli", str(event_log),
            "--out", str(out), "--top-keys", str(TOP_KEYS), "--master", "local[2]",
        ]  # fmt: skip
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=240, env=env, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", done.stderr
        archives = sorted(path.name for path in cache.iterdir())
        run_section = (out / "report.md").read_text().split("## Run", 1)[1]
        if run == 2:  # dropped, and the run went on without it
            assert archives == [], archives
            assert "JVM class archive" not in run_section
        else:
            assert len(archives) == 1 and archives[0].endswith(".jsa"), archives
            said = "writes" if run == 0 else "started from"
            assert f"| JVM class archive | `{said} {cache / archives[0]}` |" in run_section
        outputs.append(json.loads((out / "summary.json").read_text()))
    assert outputs == [json.loads((out_dir / "summary.json").read_text())] * 3


@pytest.mark.spark
def test_a_borrowed_session_is_never_stopped_for_a_class_archive(
    spark: Any, event_log: Path, tmp_path: Path
) -> None:
    """An archive asked for but never given to a JVM (a start that failed, a caller that
    only built the options): the command run on a borrowed session leaves its JVM alone."""
    from purgatory_report import session

    assert session.class_archive_options(tmp_path / "classes")
    try:
        assert main([str(event_log), "--out", str(tmp_path / "report")], spark=spark) == 0
        assert not session.class_archive_pending()
        assert spark.range(3).count() == 3  # the JVM still answers
    finally:
        session.class_archive_options(None)


def test_the_class_archive_is_off_or_where_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from purgatory_report import session

    monkeypatch.setenv(session.CLASS_CACHE_ENV, "off")
    assert session.class_archive_dir() is None
    assert session.class_archive_options(None) == []
    assert not session.class_archive_pending()
    monkeypatch.delenv(session.CLASS_CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert session.class_archive_dir() == tmp_path / "purgatory-aio" / "spark-classes"
    monkeypatch.setenv(session.CLASS_CACHE_ENV, str(tmp_path / "mine"))
    assert session.class_archive_dir() == tmp_path / "mine"
    # No home to be found: no archive rather than one under the working directory.
    monkeypatch.delenv(session.CLASS_CACHE_ENV)
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: Path("~")))
    assert session.class_archive_dir() is None
    monkeypatch.undo()
    # A directory that cannot be created: the run goes on without an archive.
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert session.class_archive_options(blocker / "classes") == []
    assert not session.class_archive_pending()
    # Spark splits the JVM's options at blanks: such a directory gets no archive.
    assert session.class_archive_options(tmp_path / "with blank") == []
    assert not (tmp_path / "with blank").exists()
    options = session.class_archive_options(tmp_path / "plain")
    assert any(option.startswith("-XX:ArchiveClassesAtExit=") for option in options)
    # Asked of the next JVM this process starts; none started, so nothing to stop.
    assert not session.class_archive_pending()
    assert not session.save_class_archive()
    session.class_archive_options(None)


def test_report_opens_with_findings_and_states_its_run(out_dir: Path) -> None:
    from purgatory_report.session import local_defaults

    text = (out_dir / "report.md").read_text()
    assert text.index("## Key findings") < text.index("## Data quality")
    run = text.split("## Run", 1)[1]
    assert "| master | `local[2]` |" in run
    defaults = local_defaults("local[2]")
    assert f"| driver heap | `{defaults['spark.driver.memory']}` |" in run
    assert f"| shuffle partitions | `{defaults['spark.sql.shuffle.partitions']}` |" in run
    assert "override with --conf" in run


def test_local_defaults_come_from_the_machine() -> None:
    from purgatory_report.session import local_defaults, machine_memory

    defaults = local_defaults("local[2]")
    heap = int(defaults["spark.driver.memory"].rstrip("g"))
    assert 1 <= heap <= max(1, machine_memory() // 2**30 // 4)
    assert defaults["spark.sql.shuffle.partitions"] == "8"
    assert local_defaults("spark://h:7077") == {}
