"""Pipeline workload: the PySpark event log report over a large synthetic log.

Generates ``--events`` operation events (default 10,000,000; ``--quick``
1,000,000) as Parquet files, vectorised with numpy and pyarrow, then times
``purgatory-report``'s Spark job on them (``local[2]`` by default) and writes a
JSON record under ``bench/results/``. Generation, JVM start-up and the report
are timed separately; the headline is events per second of the report itself.

The log follows W1's model: each operation watches 3 keys drawn uniformly from
100, completion latency is log-normal with median 20 ms and 75th percentile
50 ms, and an operation slower than its timeout expires.

Run with ``python -m bench pipeline`` or ``python -m bench.pipeline``. With
``--cluster`` it also starts a Spark standalone master and worker on 127.0.0.1
(from pyspark's own jars) and runs ``purgatory-report`` on the same log there
and on ``local[2]``, as separate processes: wall times of both, and whether
their ``summary.json`` agree (counts exactly, floats to 1e-12).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import RESULTS_DIR, make_record, write_record

DEFAULT_EVENTS = 10_000_000
QUICK_EVENTS = 1_000_000
ROWS_PER_FILE = 1_000_000
START = 1_700_000_000.0

#: (purgatory, op_type, timeout in seconds, share of operations)
GROUPS = (
    ("fetch", "FetchOp", 0.5, 0.6),
    ("produce", "ProduceOp", 0.2, 0.3),
    ("produce", "DeleteRecordsOp", 0.2, 0.1),
)
KEYS = 100
KEYS_PER_OP = 3
PCT50 = 0.020
PCT75 = 0.050
CANCELLED = 0.01
SHUTDOWN = 0.005


@dataclass(frozen=True)
class Generated:
    events: int
    files: int
    bytes: int
    seconds: float


def generate(directory: Path, events: int, *, seed: int, rate: float) -> Generated:
    """Write ``events`` synthetic events as Parquet files of up to 1,000,000 rows.

    Args:
        directory: Output directory (created).
        events: Number of events.
        seed: Random seed; the same seed gives the same log.
        rate: Arrivals per second; the log spans ``events / rate`` seconds.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from purgatory_aio.eventlog import arrow_schema

    started = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    schema = arrow_schema()
    purgatories = pa.array([g[0] for g in GROUPS])
    op_types = pa.array([g[1] for g in GROUPS])
    timeouts = np.array([g[2] for g in GROUPS])
    shares = np.array([g[3] for g in GROUPS])
    key_names = pa.array([f"topic-{k // 10}-{k % 10}" for k in range(KEYS)])
    outcomes = pa.array(["completed", "expired", "cancelled", "shutdown"])
    mu = math.log(PCT50)
    sigma = (math.log(PCT75) - mu) / 0.67449

    written = 0
    files = 0
    while written < events:
        n = min(ROWS_PER_FILE, events - written)
        rng = np.random.default_rng([seed, files])
        op_id = np.arange(written, written + n, dtype=np.int64)
        created = START + (op_id + rng.random(n)) / rate
        group = rng.choice(len(GROUPS), size=n, p=shares)
        timeout = timeouts[group]
        deadline = created + timeout
        latency = rng.lognormal(mu, sigma, n)
        draw = rng.random(n)
        completed = latency < timeout
        code = np.where(completed, 0, 1)
        code = np.where(draw < CANCELLED + SHUTDOWN, 3, code)
        code = np.where(draw < CANCELLED, 2, code)
        settled = np.where(
            code == 0,
            created + latency,
            np.where(
                code == 1,
                deadline + rng.exponential(0.001, n),
                created + np.minimum(latency, timeout) / 2,
            ),
        )
        keys = pa.ListArray.from_arrays(
            pa.array(np.arange(0, KEYS_PER_OP * n + 1, KEYS_PER_OP, dtype=np.int32)),
            key_names.take(pa.array(rng.integers(0, KEYS, KEYS_PER_OP * n))),
        )
        group_index = pa.array(group)
        table = pa.Table.from_arrays(
            [
                purgatories.take(group_index),
                op_types.take(group_index),
                pa.array(op_id),
                keys,
                pa.array(created),
                pa.array(deadline),
                pa.array(settled),
                outcomes.take(pa.array(code)),
                pa.nulls(n, pa.string()),
                pa.array([f"bench-{seed}"] * n, pa.string()),
            ],
            schema=schema,
        )
        pq.write_table(
            table,
            directory / f"events-{files:05d}.parquet",
            compression="zstd",
            row_group_size=256 * 1024,
        )
        written += n
        files += 1
    size = sum(path.stat().st_size for path in directory.glob("*.parquet"))
    return Generated(written, files, size, time.perf_counter() - started)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench pipeline",
        description="Time the PySpark event log report on a synthetic Parquet log.",
    )
    parser.add_argument("--events", type=int, default=None, help="events (default 10,000,000)")
    parser.add_argument("--quick", action="store_true", help="1,000,000 events")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--driver-memory", default="4g", help="spark.driver.memory (4g)")
    parser.add_argument("--rate", type=float, default=50_000.0, help="arrivals per second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None, help="keep the log and report here")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also compare local[2] with a standalone master + worker on 127.0.0.1",
    )
    return parser


def _report_process(log_dir: Path, out: Path, master: str, env: dict[str, str]) -> float:
    command = [
        sys.executable, "-m", "purgatory_aio.analytics.cli", str(log_dir), "--out", str(out),
        "--master", master,
        "--conf", "spark.driver.host=127.0.0.1",
        "--conf", "spark.driver.bindAddress=127.0.0.1",
        "--conf", "spark.sql.shuffle.partitions=4",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"purgatory-report on {master} failed: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - started


def _same_summary(first: Path, second: Path) -> bool:
    mine = json.loads((first / "summary.json").read_text())
    theirs = json.loads((second / "summary.json").read_text())
    if [list(row) for row in mine] != [list(row) for row in theirs]:
        return False
    for a, b in zip(mine, theirs, strict=True):
        for key, value in a.items():
            other = b[key]
            if isinstance(value, float) and isinstance(other, float):
                if not math.isclose(value, other, rel_tol=1e-12):
                    return False
            elif value != other:
                return False
    return True


def compare_on_cluster(log_dir: Path, workdir: Path) -> dict[str, Any]:
    """Run the report on local[2] and on a fresh standalone cluster; wall times, agreement."""
    from bench._cluster import StandaloneCluster, cluster_env

    env = cluster_env()
    local_s = _report_process(log_dir, workdir / "report-local", "local[2]", env)
    started = time.perf_counter()
    with StandaloneCluster(workdir / "cluster") as cluster:
        cluster_start = time.perf_counter() - started
        cluster_s = _report_process(log_dir, workdir / "report-cluster", cluster.url, env)
    same = _same_summary(workdir / "report-local", workdir / "report-cluster")
    print(
        f"> local[2] process {local_s:.1f} s, standalone cluster process {cluster_s:.1f} s "
        f"(cluster start {cluster_start:.1f} s); summaries identical: {same}",
        flush=True,
    )
    return {
        "local_process_s": local_s,
        "cluster_process_s": cluster_s,
        "cluster_start_s": cluster_start,
        "cluster_identical": same,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the pipeline workload; returns the exit status."""
    args = build_parser().parse_args(argv)
    events = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    if events < 1 or args.rate <= 0:
        print("pipeline: --events and --rate must be positive", file=sys.stderr)
        return 2
    try:
        import numpy  # noqa: F401
        import pyarrow  # noqa: F401

        from purgatory_aio.analytics import report, session
        from purgatory_aio.analytics.errors import ReportError
    except ImportError as exc:
        print(f"pipeline: {exc}", file=sys.stderr)
        return 1

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="purgatory-pipeline-"))
    log_dir, out_dir = workdir / "events", workdir / "report"
    shutil.rmtree(log_dir, ignore_errors=True)
    try:
        print(f"== pipeline: {events:,} events, master {args.master}", flush=True)
        generated = generate(log_dir, events, seed=args.seed, rate=args.rate)
        print(
            f"   generated {generated.files} Parquet files, {generated.bytes / 1e6:,.0f} MB "
            f"in {generated.seconds:.1f} s ({events / generated.seconds:,.0f} events/s)",
            flush=True,
        )
        try:
            started = time.perf_counter()
            spark = session.create_session(args.master, {"spark.driver.memory": args.driver_memory})
            startup = time.perf_counter() - started
            try:
                cpu_before = time.process_time()
                started = time.perf_counter()
                result = report.run(str(log_dir), out_dir, spark=spark)
                elapsed = time.perf_counter() - started
                driver_cpu = time.process_time() - cpu_before
                spark_version = spark.version
            finally:
                spark.stop()
        except ReportError as exc:
            print(f"pipeline: {exc}", file=sys.stderr)
            return 1
        assert result.events == events
        rate = events / elapsed
        print(f"   Spark session start {startup:.1f} s", flush=True)
        print(f"> report: {elapsed:.1f} s, {rate:,.0f} events/s", flush=True)
        figures: dict[str, Any] = {
            "generate_s": generated.seconds,
            "generate_events_per_s": events / generated.seconds,
            "parquet_files": generated.files,
            "parquet_bytes": generated.bytes,
            "session_start_s": startup,
            "report_s": elapsed,
            "report_events_per_s": rate,
            "report_python_cpu_s": driver_cpu,
            "groups": len(result.summary),
            "expired": sum(row["expired"] for row in result.summary),
            "completed": sum(row["completed"] for row in result.summary),
        }
        if args.cluster:
            (workdir / "cluster").mkdir(exist_ok=True)
            figures.update(compare_on_cluster(log_dir, workdir))
        params = {
            "events": events,
            "quick": args.quick,
            "master": args.master,
            "driver_memory": args.driver_memory,
            "rate": args.rate,
            "seed": args.seed,
            "cluster": args.cluster,
            "keys": KEYS,
            "keys_per_op": KEYS_PER_OP,
            "rows_per_file": ROWS_PER_FILE,
            "spark": spark_version,
            "python": sys.version.split()[0],
        }
        record = make_record(
            "pipeline",
            "none",
            params,
            figures,
            headline=[
                ("report", f"{rate:,.0f} events/s ({elapsed:.1f} s for {events:,})"),
                ("generate", f"{events / generated.seconds:,.0f} events/s"),
            ],
        )
        path = write_record(record, args.results_dir)
        print(f"   record: {path}", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
