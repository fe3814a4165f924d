"""Pipeline workload: the PySpark event log report over a large synthetic log.

Generates ``--events`` operation events (default 10,000,000; ``--quick``
1,000,000) as Parquet files, vectorised with numpy and pyarrow, and the same
events as JSON Lines (converted by DuckDB). On each format it times two
contenders on the same files, in this process's run:

- ``duckdb``: DuckDB (2 threads) computing the report's core figures, as an
  analyst would instead: per purgatory and op_type the count, completed,
  expired and their ratio, p50/p99 completion latency (exact), the peak per
  second and the 20 most watched keys;
- ``report``: ``purgatory-report`` as a user runs it, a process at its default
  settings (``--master local[2]``, nothing else), JVM start-up included.

Then it checks that the figures agree (counts, ratios, peaks and hot keys
exactly, the report's percentiles within their documented rank error of
DuckDB's exact ones) and writes a JSON record under ``bench/results/``. The
headline is the report's time as a multiple of DuckDB's.

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
from purgatory_aio.events import FIELDS, Kind

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
        description="Time the PySpark event log report against DuckDB on a synthetic log.",
    )
    parser.add_argument("--events", type=int, default=None, help="events (default 10,000,000)")
    parser.add_argument("--quick", action="store_true", help="1,000,000 events")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument(
        "--driver-memory",
        default=None,
        help="spark.driver.memory for the report (default: the report's own default)",
    )
    parser.add_argument(
        "--formats",
        default="parquet,jsonl",
        help="comma-separated: parquet, jsonl (default both)",
    )
    parser.add_argument("--runs", type=int, default=1, help="best of N runs per contender")
    parser.add_argument("--rate", type=float, default=50_000.0, help="arrivals per second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the logs and reports here; a log generated there before is reused",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also compare local[2] with a standalone master + 2 workers on 127.0.0.1",
    )
    return parser


#: DuckDB's threads: the report's local[2].
DUCKDB_THREADS = 2
#: Hot keys compared.
TOP = 20


def _report_process(
    log_dir: Path, out: Path, master: str, env: dict[str, str], conf: dict[str, str]
) -> float:
    command = [
        sys.executable, "-m", "purgatory_report.cli", str(log_dir), "--out", str(out),
        "--master", master,
    ]  # fmt: skip
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"purgatory-report on {master} failed: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - started


#: Summary keys that may differ between two runs: the percentiles come from randomized
#: sketches (within their rank error).
_APPROXIMATE = ("latency_p", "lateness_p")


def _same_summary(first: Path, second: Path) -> bool:
    """Whether two runs' summaries agree: exactly, but for the approximate percentiles."""
    mine = json.loads((first / "summary.json").read_text())
    theirs = json.loads((second / "summary.json").read_text())
    if [list(row) for row in mine] != [list(row) for row in theirs]:
        return False
    for a, b in zip(mine, theirs, strict=True):
        for key, value in a.items():
            if key.startswith(_APPROXIMATE):
                continue
            other = b[key]
            if isinstance(value, float) and isinstance(other, float):
                if not math.isclose(value, other, rel_tol=1e-12):
                    return False
            elif value != other:
                return False
    return True


def compare_on_cluster(log_dir: Path, workdir: Path) -> dict[str, Any]:
    """The report on local[2] and on a fresh standalone cluster of 2 workers (1 core each,
    the same 2 cores in all): wall times, and whether the summaries agree."""
    from bench._cluster import StandaloneCluster, cluster_env

    env = cluster_env()
    local_s = _report_process(log_dir, workdir / "report-local", "local[2]", env, {})
    started = time.perf_counter()
    with StandaloneCluster(workdir / "cluster", workers=2, cores=1, memory="2g") as cluster:
        cluster_start = time.perf_counter() - started
        cluster_s = _report_process(
            log_dir,
            workdir / "report-cluster",
            cluster.url,
            env,
            {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.executor.memory": "2g",
            },
        )
    same = _same_summary(workdir / "report-local", workdir / "report-cluster")
    print(
        f"> local[2] process {local_s:.1f} s, standalone cluster (2 workers) process "
        f"{cluster_s:.1f} s = {cluster_s / local_s:.2f}x (cluster start {cluster_start:.1f} s); "
        f"summaries identical but for approximate percentiles: {same}",
        flush=True,
    )
    return {
        "local_process_s": local_s,
        "cluster_process_s": cluster_s,
        "cluster_vs_local": cluster_s / local_s,
        "cluster_start_s": cluster_start,
        "cluster_identical": same,
    }


def to_json_lines(parquet_dir: Path, json_dir: Path) -> float:
    """The Parquet log rewritten as JSON Lines files (one per Parquet file) by DuckDB."""
    import duckdb

    started = time.perf_counter()
    json_dir.mkdir(parents=True, exist_ok=True)
    with duckdb.connect() as db:
        db.execute(f"SET threads = {DUCKDB_THREADS}")
        for source in sorted(parquet_dir.glob("*.parquet")):
            target = json_dir / (source.stem + ".jsonl")
            db.execute(f"COPY (SELECT * FROM read_parquet('{source}')) TO '{target}' (FORMAT JSON)")
    return time.perf_counter() - started


#: DuckDB's type for each kind of event log column.
DUCKDB_TYPES: dict[Kind, str] = {
    "string": "VARCHAR",
    "int64": "BIGINT",
    "double": "DOUBLE",
    "list<string>": "VARCHAR[]",
}

#: The columns DuckDB reads JSON Lines with, from the library's one definition.
_JSON_COLUMNS = "{" + ", ".join(f"{f.name}: '{DUCKDB_TYPES[f.kind]}'" for f in FIELDS) + "}"


def _source(log_dir: Path, fmt: str) -> str:
    if fmt == "parquet":
        return f"read_parquet('{log_dir}/*.parquet')"
    return (
        f"read_json('{log_dir}/*.jsonl', format = 'newline_delimited', columns = {_JSON_COLUMNS})"
    )


def duckdb_figures(log_dir: Path, fmt: str) -> tuple[float, dict[str, Any]]:
    """DuckDB's core figures on the log, and the wall time they took (connect included)."""
    import duckdb

    source = _source(log_dir, fmt)
    started = time.perf_counter()
    with duckdb.connect() as db:
        db.execute(f"SET threads = {DUCKDB_THREADS}")
        db.execute(
            "CREATE TEMP TABLE e AS SELECT purgatory, op_type, outcome, keys, settled_at, "
            f"settled_at - created_at AS latency FROM {source}"
        )
        groups = db.execute(
            """
            SELECT purgatory, op_type, count(*) AS count,
                   count(*) FILTER (outcome = 'completed') AS completed,
                   count(*) FILTER (outcome = 'expired') AS expired,
                   quantile_disc(latency, [0.5, 0.99]) FILTER (outcome = 'completed') AS q
            FROM e GROUP BY ALL ORDER BY ALL
            """
        ).fetchall()
        peaks = db.execute(
            """
            SELECT purgatory, op_type, max(n) FROM (
                SELECT purgatory, op_type, floor(settled_at) AS s, count(*) AS n
                FROM e GROUP BY ALL)
            GROUP BY ALL
            """
        ).fetchall()
        keys = db.execute(
            f"""
            SELECT purgatory, op_type, key, count(*) AS watched FROM (
                SELECT purgatory, op_type, unnest(list_distinct(keys)) AS key FROM e)
            GROUP BY purgatory, op_type, key
            QUALIFY row_number() OVER (
                PARTITION BY purgatory, op_type ORDER BY watched DESC, key) <= {TOP}
            ORDER BY purgatory, op_type, watched DESC, key
            """
        ).fetchall()
        elapsed = time.perf_counter() - started
        # Unmeasured: the exact latencies a rank error (and a position, for the two
        # definitions of a discrete quantile) away, to judge the report's.
        bounds = {}
        for purgatory, op_type, n in db.execute(
            "SELECT purgatory, op_type, count(*) FROM e WHERE outcome = 'completed' GROUP BY ALL"
        ).fetchall():
            slack = RANK_ERROR + 2.0 / n
            low = [max(0.0, q - slack) for q in (0.5, 0.99)]
            high = [min(1.0, q + slack) for q in (0.5, 0.99)]
            bounds[(purgatory, op_type)] = db.execute(
                f"SELECT quantile_disc(latency, {low}), quantile_disc(latency, {high}) FROM e "
                "WHERE outcome = 'completed' AND purgatory = ? AND op_type = ?",
                [purgatory, op_type],
            ).fetchone()
    figures: dict[str, Any] = {
        "groups": {
            (p, t): {
                "count": n,
                "completed": c,
                "expired": x,
                # The report's one denominator: completed and expired operations.
                "expiry_ratio": x / (c + x) if c + x else None,
                "latency_p50": q[0],
                "latency_p99": q[1],
            }
            for p, t, n, c, x, q in groups
        },
        "peaks": {(p, t): int(m) for p, t, m in peaks},
        "keys": [(p, t, k, int(w)) for p, t, k, w in keys],
        "bounds": bounds,
    }
    return elapsed, figures


#: The report's documented relative rank error (accuracy 10,000).
RANK_ERROR = 1e-4


def disagreements(report_dir: Path, duck: dict[str, Any]) -> list[str]:
    """Where the report's figures differ from DuckDB's; empty when they agree."""
    import pyarrow.parquet as pq

    found: list[str] = []
    summary = {(r["purgatory"], r["op_type"]): r for r in json.loads(
        (report_dir / "summary.json").read_text()
    )}  # fmt: skip
    if set(summary) != set(duck["groups"]):
        return [f"groups differ: {sorted(summary)} vs {sorted(duck['groups'])}"]
    for group, theirs in duck["groups"].items():
        mine = summary[group]
        for key in ("count", "completed", "expired"):
            if mine[key] != theirs[key]:
                found.append(f"{group} {key}: report {mine[key]}, duckdb {theirs[key]}")
        if (mine["expiry_ratio"] is None) != (theirs["expiry_ratio"] is None) or (
            theirs["expiry_ratio"] is not None
            and not math.isclose(mine["expiry_ratio"], theirs["expiry_ratio"], rel_tol=1e-12)
        ):
            found.append(f"{group} expiry_ratio differs")
        if mine["peak_per_s"] != duck["peaks"][group]:
            found.append(
                f"{group} peak: report {mine['peak_per_s']}, duckdb {duck['peaks'][group]}"
            )
        low, high = duck["bounds"][group]
        for index, key in enumerate(("latency_p50", "latency_p99")):
            if not low[index] <= mine[key] <= high[index]:
                found.append(
                    f"{group} {key} {mine[key]} outside [{low[index]}, {high[index]}] "
                    f"(DuckDB's exact values a rank error {RANK_ERROR:g} away)"
                )
    rows = pq.read_table(report_dir / "tables" / "hot_keys").to_pylist()
    ranked: list[tuple[str, str, str, int]] = []
    for group in sorted(summary):
        members = sorted(
            (r for r in rows if (r["purgatory"], r["op_type"]) == group),
            key=lambda r: (-r["watched"], r["key"]),
        )[:TOP]
        ranked.extend((*group, r["key"], int(r["watched"])) for r in members)
    if ranked != sorted(duck["keys"], key=lambda k: (k[0], k[1], -k[3], k[2])):
        found.append("the top-20 hot keys differ")
    return found


def class_archive_state() -> str:
    """Whether the report's runs start from a class-data archive of Spark's classes:
    ``present``, ``off``, or ``written by the first run`` (which then takes longer)."""
    from purgatory_report.session import class_archive_dir, class_archive_path

    directory = class_archive_dir()
    if directory is None:
        return "off"
    archive = class_archive_path(directory)
    if archive is None:
        return "off"
    return "present" if archive.is_file() else "written by the first run"


def _log(workdir: Path, events: int, seed: int, rate: float) -> tuple[Path, Generated | None]:
    """The Parquet log in ``workdir``, generated unless one of these parameters is there."""
    log_dir = workdir / f"events-{events}"
    stamp = log_dir / "_generated.json"
    wanted = {"events": events, "seed": seed, "rate": rate}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return log_dir, None
    shutil.rmtree(log_dir, ignore_errors=True)
    generated = generate(log_dir, events, seed=seed, rate=rate)
    stamp.write_text(json.dumps(wanted))
    return log_dir, generated


def main(argv: list[str] | None = None) -> int:
    """Run the pipeline workload; returns the exit status."""
    args = build_parser().parse_args(argv)
    events = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)
    formats = [name.strip() for name in args.formats.split(",") if name.strip()]
    if events < 1 or args.rate <= 0 or args.runs < 1:
        print("pipeline: --events, --rate and --runs must be positive", file=sys.stderr)
        return 2
    if not formats or set(formats) - {"parquet", "jsonl"}:
        print("pipeline: --formats takes parquet, jsonl or both", file=sys.stderr)
        return 2
    try:
        import duckdb
        import numpy  # noqa: F401
        import pyarrow  # noqa: F401
        import pyspark

        from bench._cluster import cluster_env
    except ImportError as exc:
        print(f"pipeline: {exc} (pip install 'purgatory-aio[bench,spark]')", file=sys.stderr)
        return 1

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="purgatory-pipeline-"))
    workdir.mkdir(parents=True, exist_ok=True)
    env = cluster_env()
    conf = {} if args.driver_memory is None else {"spark.driver.memory": args.driver_memory}
    figures: dict[str, Any] = {}
    agree = True
    archive = class_archive_state()
    try:
        print(
            f"== pipeline: {events:,} events, report on {args.master}; "
            f"JVM class archive: {archive}",
            flush=True,
        )
        parquet_dir, generated = _log(workdir, events, args.seed, args.rate)
        if generated is not None:
            print(
                f"   generated {generated.files} Parquet files, {generated.bytes / 1e6:,.0f} MB "
                f"in {generated.seconds:.1f} s",
                flush=True,
            )
            figures["generate_s"] = generated.seconds
        figures["parquet_bytes"] = sum(p.stat().st_size for p in parquet_dir.glob("*.parquet"))
        for fmt in formats:
            log_dir = parquet_dir
            if fmt == "jsonl":
                log_dir = workdir / f"events-{events}-jsonl"
                if not any(log_dir.glob("*.jsonl")):
                    seconds = to_json_lines(parquet_dir, log_dir)
                    print(f"   converted to JSON Lines in {seconds:.1f} s", flush=True)
                figures["jsonl_bytes"] = sum(p.stat().st_size for p in log_dir.glob("*.jsonl"))
            duck_s = math.inf
            duck: dict[str, Any] = {}
            report_s = math.inf
            out = workdir / f"report-{fmt}"
            for _ in range(args.runs):
                seconds, duck = duckdb_figures(log_dir, fmt)
                duck_s = min(duck_s, seconds)
                report_s = min(report_s, _report_process(log_dir, out, args.master, env, conf))
            problems = disagreements(out, duck)
            agree = agree and not problems
            ratio = report_s / duck_s
            print(
                f"> {fmt}: duckdb {duck_s:.1f} s, report {report_s:.1f} s = {ratio:.1f}x; "
                f"figures agree: {'yes' if not problems else '; '.join(problems)}",
                flush=True,
            )
            figures[f"{fmt}_duckdb_s"] = duck_s
            figures[f"{fmt}_report_s"] = report_s
            figures[f"{fmt}_report_vs_duckdb"] = ratio
            figures[f"{fmt}_report_events_per_s"] = events / report_s
            figures[f"{fmt}_figures_agree"] = not problems
        if args.cluster:
            (workdir / "cluster").mkdir(exist_ok=True)
            figures.update(compare_on_cluster(parquet_dir, workdir))
        params = {
            "events": events,
            "quick": args.quick,
            "master": args.master,
            "driver_memory": args.driver_memory or "report default",
            "formats": formats,
            "runs": args.runs,
            "rate": args.rate,
            "seed": args.seed,
            "cluster": args.cluster,
            "class_archive": archive,
            "keys": KEYS,
            "keys_per_op": KEYS_PER_OP,
            "rows_per_file": ROWS_PER_FILE,
            "spark": pyspark.__version__,
            "duckdb": duckdb.__version__,
            "duckdb_threads": DUCKDB_THREADS,
            "python": sys.version.split()[0],
        }
        record = make_record(
            "pipeline",
            "none",
            params,
            figures,
            ratios={
                f"{fmt}_report_vs_duckdb": figures[f"{fmt}_report_vs_duckdb"] for fmt in formats
            },
            headline=[
                (f"report vs duckdb ({fmt})", f"{figures[f'{fmt}_report_vs_duckdb']:.1f}x")
                for fmt in formats
            ],
        )
        path = write_record(record, args.results_dir)
        print(f"   record: {path}", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
