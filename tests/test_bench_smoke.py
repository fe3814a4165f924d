"""The benchmark suite runs end to end at tiny sizes, through the same code paths as
``python -m bench``. Nothing here asserts a timing: only that every contender settles
every operation and that the records have the shape the report relies on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import purgatory_aio
from bench import __main__ as cli
from bench import memory, report, sweep, w1, w2, w3, w4, w5
from bench._common import Progress, uvloop_version

LOOPS = ["asyncio"] + (["uvloop"] if uvloop_version() else [])
QUIET = Progress(quiet=True)
RECORD_KEYS = {
    "schema",
    "workload",
    "loop",
    "date",
    "params",
    "env",
    "results",
    "ratios",
    "goals",
    "headline",
}


def assert_records(records: list[dict[str, Any]], workload: str, results_dir: Path) -> None:
    assert [r["loop"] for r in records] == LOOPS
    for record in records:
        assert set(record) >= RECORD_KEYS
        assert record["workload"] == workload
        for key in ("python", "cpu_model", "cores", "git_commit", "load_avg"):
            assert key in record["env"]
        assert record["headline"], "every record has figures for SUMMARY.md"
        for g in record["goals"]:
            assert set(g) >= {"goal", "target", "value", "met"}
    files = sorted(results_dir.glob(f"{workload}-*.json"))
    assert len(files) == len(LOOPS)
    for path in files:
        assert json.loads(path.read_text())["workload"] == workload


def test_w1_contenders_settle_every_operation(tmp_path: Path) -> None:
    records = w1.run(w1.W1Params(n=2_000), LOOPS, QUIET, tmp_path)
    assert_records(records, "w1", tmp_path)
    for record in records:
        contenders = record["results"]["contenders"]
        assert set(contenders) == {*w1.CONTENDERS, *w1.OUTSIDE_CONTENDERS}
        for name in w1.CONTENDERS:
            run = contenders[name]
            assert run["settled"] == run["completed"] + run["expired"] == 2_000
            assert run["left_pending"] == 0
        assert contenders["purgatory"]["lateness"]["early"] == 0
        # The outside variant: every operation settles; its driver alone settles those
        # it completes (its watch does nothing, so nothing expires; with the purgatory
        # one may expire before the driver gets round to completing it).
        for name in ("outside", "outside-tracked"):
            assert contenders[name]["settled"] == 2_000 and contenders[name]["left_pending"] == 0
            assert "net_cpu_us_per_op" in contenders[name]
        driver = contenders["outside-driver"]
        assert driver["settled"] == driver["completed"] >= contenders["outside"]["completed"]
        assert "outside net_cpu_per_op purgatory/kafka_java" in record["ratios"]


def test_w1_user_runs_a_user_style_operation_against_kafkas_figure(tmp_path: Path) -> None:
    records = w1.run(w1.W1Params(n=2_000, user=True), LOOPS, QUIET, tmp_path)
    assert_records(records, "w1-user", tmp_path)
    assert "__slots__" not in vars(w1.W1UserOp)
    for record in records:
        for name in w1.USER_CONTENDERS:
            run = record["results"]["contenders"][name]
            assert run["settled"] == run["completed"] + run["expired"] == 2_000
        assert "net_cpu_per_op purgatory/kafka_java" in record["ratios"]
        assert set(record["results"]["contenders"]) == {
            *w1.USER_CONTENDERS,
            *w1.OUTSIDE_CONTENDERS,
        }
        assert "net_cpu_per_op naive/user-code (ceiling of naive/purgatory)" in record["ratios"]
        assert "net_cpu_per_op naive/api-floor (ceiling for any implementation)" in record["ratios"]
        assert len(record["goals"]) == 3  # Kafka's figure, naive's, the outside variant's


def test_w1_check_completes_through_key_checks(tmp_path: Path) -> None:
    params = w1.W1Params(n=2_000, check=True, inflight=500)
    records = w1.run(params, LOOPS, QUIET, tmp_path)
    assert_records(records, "w1-check", tmp_path)
    for record in records:
        for run in record["results"]["contenders"].values():
            assert run["settled"] == 2_000
            assert run["completed"] > 0
            assert run["inflight_max"] <= 500


def test_w1_open_loop_replays_poisson_arrivals(tmp_path: Path) -> None:
    records = w1.run(w1.W1Params(n=2_000, rate=20_000.0), ["asyncio"], QUIET, None)
    for run in records[0]["results"]["contenders"].values():
        assert run["settled"] == 2_000
    assert not list(tmp_path.iterdir())  # no results_dir: nothing written


def test_w2_every_contender_completes_every_operation(tmp_path: Path) -> None:
    records = w2.run(w2.W2Params(sizes=(100, 300), steps=5), LOOPS, QUIET, tmp_path)
    assert_records(records, "w2", tmp_path)
    for record in records:
        for series in record["results"]["series"].values():
            assert set(series) == set(w2.CONTENDERS)  # user-code, the floor, included
            for rows in series.values():
                for row in rows.values():
                    assert row["settled"] == row["total"]
                    assert row["completed_in_steps"] == row["inc"] * row["steps"]


def test_w5_parks_operations_in_two_child_processes(tmp_path: Path) -> None:
    params = w5.W5Params(parked=2_000, timeout=0.5, topics=10, duration=0.6)
    records = w5.run(params, LOOPS, QUIET, tmp_path)
    assert_records(records, "w5", tmp_path)
    for record in records:
        runs = record["results"]["contenders"]
        assert set(runs) == set(w5.CONTENDERS)
        for name in ("purgatory", "naive-futures"):
            run = runs[name]
            assert run["pending_after_fill"] == 2_000
            assert run["completed"] == 0 and run["expired"] > 0  # every one expires
            assert run["lateness"]["count"] > 0 and run["arrived"] > 0
        assert runs["ticker-only"]["pending_after_fill"] == 0  # the machine's floor
        assert runs["ticker-only"]["lateness"]["count"] > 0
        # The naive baseline's future, handle, record, set... are tracked by the GC; the
        # purgatory's pending operations are not, on the compiled build.
        assert runs["naive-futures"]["tracked_per_pending"] > 3
        purgatory = runs["purgatory"]["tracked_per_pending"]
        assert purgatory < 0.1 if purgatory_aio.compiled else purgatory > 1
        assert record["results"]["kafka_java"]["max_ms"] == 60.0
        assert len(record["goals"]) == 3


def test_w5_quick_is_what_the_smoke_run_uses() -> None:
    args = cli.build_parser().parse_args(["w5", "--quick", "--duration", "2"])
    params = w5.params_from_args(args)
    assert params.parked == w5.QUICK.parked and params.duration == 2.0


def test_w5_leak_check_settles_every_operation() -> None:
    (result,) = w5.run_leak(20_000, w5.QUICK, ["asyncio"], QUIET)
    assert result["settled"] == 40_000  # two chunks of warm-up first
    held = result["traced_bytes"]
    # What is held moves with the dicts' sizes and the stale entries awaiting a purge;
    # it does not grow with the operations run.
    assert held[-1] <= max(held[:-1]) + 64 * 1024, held


def test_w3_measures_both_timers_at_each_size(tmp_path: Path) -> None:
    params = w3.W3Params(sizes=(1_000, 2_000), pairs=2_000, expire_spread=0.05)
    records = w3.run(params, LOOPS, QUIET, tmp_path)
    assert_records(records, "w3", tmp_path)
    for record in records:
        for name in ("timer", "call_later"):
            for size, row in record["results"]["contenders"][name].items():
                assert row["fired"] == int(size)
                assert row["pending"] == int(size)
                assert row["pairs"] == 2_000
                assert row["long_ns_per_pair"] > 0 and "net_long_ns_per_pair" in row
        goals = [g["goal"] for g in record["goals"]]
        assert any("random long delay" in g for g in goals) and any("churn" in g for g in goals)


def test_w4_fires_every_timer_and_counts_idle_wakeups(tmp_path: Path) -> None:
    params = w4.W4Params(timers=2_000, spread=0.1, idle=0.1, lead=0.05)
    records = w4.run(params, LOOPS, QUIET, tmp_path)
    assert_records(records, "w4", tmp_path)
    for record in records:
        timer = record["results"]["contenders"]["timer"]
        assert timer["fired"] == 2_000
        assert timer["pending_after"] == 0
        assert timer["lateness"]["early"] == 0
        assert "idle_wakeups" in timer


def test_memory_measures_each_contender_in_a_subprocess(tmp_path: Path) -> None:
    records = memory.run(memory.MemoryParams(sizes=(1_000,)), LOOPS, QUIET, tmp_path)
    assert_records(records, "memory", tmp_path)
    for record in records:
        for rows in record["results"]["contenders"].values():
            row = rows["1000"]
            assert row["settled"] == 1_000
            assert row["tracemalloc_bytes_per_op"] > 0


def test_sweep_search_is_bounded(tmp_path: Path) -> None:
    params = sweep.SweepParams(
        start_rate=5_000.0, max_rate=10_000.0, duration=0.2, refine=1, budget_s=10.0
    )
    records = sweep.run(params, ["asyncio"], QUIET, tmp_path)
    result = records[0]["results"]["contenders"]["purgatory"]
    assert 1 <= len(result["trials"]) <= 6
    for trial in result["trials"]:
        assert trial["rate"] <= 10_000.0


def test_report_builds_summary_and_charts_from_records(tmp_path: Path) -> None:
    w1.run(w1.W1Params(n=1_000), ["asyncio"], QUIET, tmp_path)
    w4.run(w4.W4Params(timers=500, spread=0.05, idle=0.05, lead=0.05), ["asyncio"], QUIET, tmp_path)
    report.run(tmp_path, QUIET)
    summary = (tmp_path / "SUMMARY.md").read_text()
    # Runs on the pure-Python core are marked as such; compiled runs carry the loop alone.
    loop = "asyncio" if purgatory_aio.compiled else "asyncio, pure"
    assert f"| w1 | {loop} |" in summary
    assert f"| w4 | {loop} |" in summary
    pytest.importorskip("matplotlib")
    assert (tmp_path / "w1_cpu_per_op.png").stat().st_size > 0
    assert (tmp_path / "lateness.png").stat().st_size > 0


@pytest.mark.usefixtures("restore_structlog")
def test_cli_runs_a_workload_and_reports(tmp_path: Path) -> None:
    argv = ["w1", "--n", "1000", "--loop", "asyncio", "--plain", "--results-dir", str(tmp_path)]
    assert cli.main(argv) == 0
    assert (tmp_path / "SUMMARY.md").exists()


@pytest.mark.usefixtures("restore_structlog")
def test_cli_explains_a_missing_delegated_module(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli.DELEGATED, "http", ("bench._no_such_module", "test"))
    assert cli.main(["http", "--anything"]) == 2
    assert "bench._no_such_module is not available" in capsys.readouterr().err


@pytest.mark.usefixtures("restore_structlog")
def test_kafka_bench_drives_real_clients_on_each_loop(tmp_path: Path) -> None:
    pytest.importorskip("confluent_kafka")
    argv = ["kafka", "--records", "2000", "--plain", "--results-dir", str(tmp_path)]
    assert cli.main([*argv, "--loop", "both" if len(LOOPS) == 2 else "asyncio"]) == 0
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("kafka-*.json"))]
    assert sorted(r["loop"] for r in records) == sorted(LOOPS)
    for record in records:
        assert set(record) >= RECORD_KEYS and record["headline"]
        assert record["ratios"]["records_per_s_idempotent_vs_plain"] is not None
        for acks in ("1", "all", "all+idempotence"):
            result = record["results"][acks]
            # Every record sent was delivered and consumed (warm-up and paced ones included).
            assert result["records"] == 2000
            assert result["consumed"] >= 2000 + result["paced"]["records"]
            assert result["purgatories"]["peak_fetch_pending"] >= 1  # the consumers' long polls


@pytest.mark.usefixtures("restore_structlog")
def test_opshape_settles_every_operation_of_each_shape(tmp_path: Path) -> None:
    argv = ["opshape", "--quick", "--plain", "--results-dir", str(tmp_path)]
    assert cli.main([*argv, "--loop", "both" if len(LOOPS) == 2 else "asyncio"]) == 0
    records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("opshape-*.json"))]
    assert sorted(r["loop"] for r in records) == sorted(LOOPS)
    for record in records:
        assert set(record["results"]["net_us_per_op"]) == {
            "slotted",
            "user",
            "user+slots",
            "user, no __init__",
        }


@pytest.mark.parametrize("loop_name", LOOPS)
def test_w1_cost_scenarios_settle_every_operation(loop_name: str) -> None:
    # The callgrind runs themselves take minutes; what they run is checked here: every
    # scenario finishes, and the purgatory's completes each operation, none expiring.
    from bench import w1_cost
    from bench._common import run_on

    for name in w1_cost.SCENARIOS:
        run_on(loop_name, lambda name=name: w1_cost._scenario(name, 3 * w1_cost.WINDOW))  # type: ignore[misc]


def test_w1_cost_says_what_it_needs_without_valgrind(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench import w1_cost

    monkeypatch.setattr(w1_cost.shutil, "which", lambda name: None)
    assert cli.main(["w1-cost"]) == 2
    assert "needs valgrind" in capsys.readouterr().err


def test_w1_cost_reads_the_compiled_functions_off_callgrind_annotate() -> None:
    from bench import w1_cost

    text = """\
5,903,233 (12.01%)  ???:CPyPy__purgatory___Purgatory___try_complete_else_watch [/x/a.so]
5,796,200 (11.80%)  ???:CPyDef__purgatory___Purgatory___try_complete_else_watch [/x/a.so]
  345,942 (11.72%)  ???:CPyDef__lifecycle___Lifecycle___watch
   12,000 ( 0.01%)  ???:CPyDef__lifecycle___Lifecycle___watch'2 [/x/a.so]
      100 ( 0.00%)  ???:CPyDef__lifecycle___Lifecycle___watch [/x/a.so]
    9,999 ( 0.30%)  /tmp/Python-3.11.7/Objects/dictobject.c:insertdict [/x/libpython.so]
"""
    assert w1_cost.parse_functions(text) == {
        "_purgatory___Purgatory___try_complete_else_watch": 5_796_200,
        "_lifecycle___Lifecycle___watch": 345_942,
    }


def test_calls_traces_one_admission_and_one_completion_on_the_pure_build() -> None:
    # Run as the docs say (the pure source of this install): the traced legs settle
    # their operations, and the counts come out in the shape the closing notes quote.
    import os
    import subprocess
    import sys

    env = {**os.environ, "PURGATORY_AIO_NO_EXTENSIONS": "1", "PYTHONSAFEPATH": "1"}
    out = subprocess.check_output(
        [sys.executable, "-m", "bench", "calls"], env=env, text=True, timeout=120
    )
    lines = {line.split()[1]: line.split() for line in out.splitlines() if line[:2] == "> "}
    assert set(lines) == {"admission", "completion"}
    # The hot path's shape, held to the goals: a completion by check_and_complete in at
    # most 12 calls in at most 4 of the library's files (purgatory, watch store,
    # operation, wheels; it was 17 in 6, then 13 in 7), an admission in at most 8 (14,
    # then 12) in at most 6 files: the purgatory, the operation's admit, the lifecycle's
    # test of its loop, the keys' check, the watch store and the wheels.
    for leg, most, files in (("admission", 8, 6), ("completion", 12, 4)):
        calls = int(lines[leg][2])
        assert lines[leg][3:5] == ["calls", "in"]
        assert calls <= most, f"{leg}: {calls} calls (at most {most})"
        assert int(lines[leg][5]) <= files, f"{leg}: {lines[leg][5]} files (at most {files})"


def test_calls_refuses_the_compiled_build(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(purgatory_aio, "compiled", True)
    assert cli.main(["calls"]) == 2
    assert "PURGATORY_AIO_NO_EXTENSIONS=1" in capsys.readouterr().err
