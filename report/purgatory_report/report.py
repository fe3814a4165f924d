"""The report run: event log in, ``summary.json``, Parquet tables, charts and ``report.md`` out.

Examples:
    >>> from purgatory_report.report import run
    >>> from purgatory_report.session import create_session
    >>> report = run("events/", "report/", spark=create_session("local[2]"))  # doctest: +SKIP
    >>> report.summary[0]["latency_p99"]                                       # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from purgatory_aio.events import COLUMNS, OUTCOMES
from purgatory_report import charts, inputs, metrics, staging
from purgatory_report.anomalies import find_windows
from purgatory_report.errors import ReportError, missing_dependency
from purgatory_report.inputs import (
    CHECK_PREFIX,
    COPIES,
    CORRUPT,
    REQUIRED,
    EventFiles,
    TimeRange,
    check_aggregates,
    check_results,
    list_event_files,
    read_drop_markers,
    read_events,
)
from purgatory_report.metrics import (
    CURVE_QUANTILES,
    GROUP,
    HEADLINE_QUANTILES,
    LATENESS_QUANTILES,
    WHATIF_FRACTIONS,
    meaningful,
)
from purgatory_report.model import (
    SUMMARY_KEYS,
    Report,
    Row,
    judged,
    label,
    ratio_of_judged,
    timeout_basis,
    timeouts_vary,
)
from purgatory_report.output import ReportOutput, check_local_target
from purgatory_report.quality import REASON, REASONS, Quality
from purgatory_report.quality import reason as quality_reason
from purgatory_report.render import render_markdown
from purgatory_report.session import describe_run

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark import StorageLevel
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import functions as F
except ImportError as exc:
    raise missing_dependency(exc) from exc

_T = TypeVar("_T")

#: Chart bins: the timelines are cut into at most this many bins.
TIMELINE_BINS = 600


def run(
    events_dir: str,
    out_dir: str | Path,
    *,
    spark: SparkSession,
    top_keys: int = 20,
    since: float | None = None,
    until: float | None = None,
    strict: bool = False,
    json_staging: staging.Staging | None = None,
) -> Report:
    """Compute the report of the event log under ``events_dir`` into ``out_dir``.

    Every figure is computed by Spark and collected to the driver; the large
    tables are written by Spark into the report, never read back. The report
    appears at ``out_dir`` all at once when everything is written (see
    :mod:`~.output`); a failed run leaves a previous report there untouched.

    Args:
        events_dir: Directory (searched recursively) of ``*.parquet`` and
            ``*.jsonl`` event files, or a Hadoop URI such as ``hdfs://...``.
        out_dir: Report directory: a plain path or a Hadoop URI; replaced.
        spark: The session to run on; it is left running.
        top_keys: Hot keys listed per (purgatory, op_type) in ``report.md``.
        since: Only operations settled at or after this epoch second; whole
            ``date=``/``hour=`` partitions before it are not read.
        until: Only operations settled before this epoch second (same pruning).
        strict: Fail instead of reporting when rows were dropped or excluded,
            or the writers dropped records.
        json_staging: The log's JSON Lines files already being parsed by Arrow
            (see :class:`~.staging.Staging`); removed when the run ends.

    Raises:
        ReportError: Missing, empty or malformed input; ``out_dir`` unusable;
            with ``strict``, any data quality problem.
    """
    if top_keys < 1:
        raise ReportError(f"top_keys must be at least 1, got {top_keys}")
    window = TimeRange(since, until)
    location = str(out_dir)
    check_local_target(location)
    files = list_event_files(spark, events_dir, window)
    quality = Quality(writer_drops=read_drop_markers(spark, files))
    json_reader: str | None = None
    try:
        if files.json:
            files, json_reader, json_staging = _stage_json(spark, files, json_staging)
        asked = _Asked(events_dir, location, top_keys, window, strict, quality, json_reader)
        return _run(spark, files, asked)
    finally:
        if json_staging is not None:
            json_staging.close()


def _stage_json(
    spark: SparkSession, files: EventFiles, begun: staging.Staging | None
) -> tuple[EventFiles, str, staging.Staging | None]:
    """Local JSON Lines files parsed by Arrow into Parquet (see :mod:`~.staging`) when
    Spark runs on this machine: the files to read, what the run section says about the
    JSON Lines, and the staging to close when the run ends."""
    reader = str(spark.conf.get(staging.JSON_READER_CONF, "arrow"))
    cores, spark_parses = staging.arrow_workers(reader, str(spark.sparkContext.master))
    if cores is None:
        return files, str(spark_parses), begun
    if not all(inputs.is_local(path) for path in files.json):
        return files, "parsed by Spark (the files are not on this machine)", begun
    paths = [str(inputs.local_path(path)) for path in files.json]
    if begun is None or begun.paths != tuple(paths):
        if begun is not None:
            begun.close()
        begun = staging.Staging(paths, cores, REQUIRED, spark.conf.get("spark.local.dir", None))
    try:
        staged = begun.result()
    except BaseException:  # interrupted while waiting: the staging is this run's to remove
        begun.close()
        raise
    if not staged.parquet:
        return files, staged.description, begun
    # Staged rows leave no required column null (or the log goes to Spark).
    merged = dataclasses.replace(files, parquet=[*files.parquet, *staged.parquet], json=[])
    return merged, staged.description, begun


@dataclasses.dataclass(frozen=True)
class _Asked:
    """What one run was asked for, and what it learnt before computing a figure."""

    events_dir: str
    location: str
    top_keys: int
    window: TimeRange
    strict: bool
    quality: Quality
    #: What the run section says about the JSON Lines (none without any).
    json_reader: str | None


def _run(spark: SparkSession, files: EventFiles, asked: _Asked) -> Report:
    window, quality = asked.window, asked.quality
    raw = read_events(spark, files)
    if window.bounded:
        settled = F.col("settled_at")
        inside = F.lit(True)
        if window.since is not None:
            inside = inside & (settled >= window.since)
        if window.until is not None:
            inside = inside & (settled < window.until)
        raw = raw.where(F.col(CORRUPT).isNotNull() | settled.isNull() | inside)
    records = raw.select(*COLUMNS, CORRUPT)
    cached: list[DataFrame] = []
    output = ReportOutput(asked.location, spark)
    if files.json:
        # Parsing JSON is most of a scan's cost and the figures take four scans: parse
        # once (10M events, local[2]: 144 s against 244 s parsing each time). Spilled
        # to disk when it does not fit. Parquet is never cached: each query reads only
        # the columns it needs.
        records = records.persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(records)
    try:
        # Most logs hold no duplicate: the passes start with the identity check, over
        # the records as they are. A log with duplicates is computed again over its
        # unique records (the first passes are cancelled).
        first = records.withColumn(COPIES, F.lit(1))
        passes = _Passes(spark, first, files, output, asked, cached, check=records)
        try:
            assert passes.identities is not None
            passes.result(passes.identities)
            if quality.duplicates:
                passes.cancel()
                # Rare: collapse exact copies (a full shuffle of every column), once.
                unique = (
                    records.groupBy(*COLUMNS, CORRUPT)
                    .agg(F.count(F.lit(1)).alias(COPIES))
                    .persist(StorageLevel.MEMORY_AND_DISK)
                )
                cached.append(unique)
                passes = _Passes(spark, unique, files, output, asked, cached)
            report = _report_from(spark, passes, raw, output, asked)
        finally:
            passes.cancel()
        output.commit()
        return report
    except BaseException:
        output.abort()
        raise
    finally:
        for frame in cached:
            frame.unpersist()


#: Partials (a row per purgatory, op_type and second) up to this many are collected
#: and finished on the driver, the throughput table written with pyarrow: no Spark
#: job for the figures, the table or the timeline. A longer log's stay with Spark.
DRIVER_PARTIALS = 250_000


class _Passes:
    """The passes of one run over its records, started at once, each on a thread.

    On one machine a single job leaves cores idle: while the driver plans it, and
    while a stage's last tasks run; Spark fills them with the tasks of the other
    jobs. The percentiles and the hot keys start on every row, as if none were
    excluded (most logs): :meth:`exclude` starts them again when the figures say
    otherwise.
    """

    def __init__(
        self,
        spark: SparkSession,
        unique: DataFrame,
        files: EventFiles,
        output: ReportOutput,
        asked: _Asked,
        cached: list[DataFrame],
        *,
        check: DataFrame | None = None,
    ) -> None:
        """Start the passes over ``unique``, with :func:`check_identities` of ``check``
        when given (its job submitted first). What they cache is added to ``cached``,
        for the caller to remove. Whatever started is stopped if this fails."""
        self._spark = spark
        self._output = output
        self._top_keys = asked.top_keys
        self._groups: dict[Future[Any], str] = {}
        self._lock = threading.Lock()
        self._failure: BaseException | None = None
        self._stopped: set[str] = set()
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="purgatory-report-pass")
        try:
            self._unique = unique.withColumn(REASON, quality_reason())
            self.identities = (
                None if check is None else self.start(check_identities, check, asked.quality)
            )
            self.figures = self.start(_figures, self._unique, files.proven_null_free, cached)
            # Without the exclusion test the two passes read none of the three times it
            # needs (hot keys at 10M events, local[2], warm: 3.2 s against 3.8).
            self._start_usable(self._unique.select(*COLUMNS))
        except BaseException:
            self.cancel()
            raise

    def _start_usable(self, events: DataFrame) -> None:
        self.curves = self.start(_curves, events)
        self.hot_keys = self.start(_hot_keys, self._spark, events, self._output, self._top_keys)

    def exclude(self) -> None:
        """Compute the percentiles and the hot keys again over the rows no exclusion
        reason applies to; the passes over every row are stopped first."""
        self._stop([self.curves, self.hot_keys])
        if (failure := self._first_failure()) is not None:
            raise failure
        self._start_usable(self._unique.where(F.col(REASON).isNull()).select(*COLUMNS))

    def start(self, function: Callable[..., _T], *args: Any) -> Future[_T]:
        """``function(*args)`` on a thread, its Spark jobs in a job group of its own."""
        context = self._spark.sparkContext
        group = f"purgatory-report-{uuid.uuid4().hex}"

        def job() -> _T:
            # Not interrupted when cancelled: a task writing to HDFS must not be (Spark's
            # warning); a cancelled task ends with its partition (see cancel).
            context.setJobGroup(group, "purgatory report", interruptOnCancel=False)
            try:
                return function(*args)
            except BaseException as exc:
                # The first failure fails the run at once: the other passes are stopped
                # (their own errors then are only that).
                with self._lock:
                    first = self._failure is None and group not in self._stopped
                    if first:
                        self._failure = exc
                if first:
                    self._stop(None, wait_for=False)
                raise

        with self._lock:
            started = self._pool.submit(job)
            self._groups[started] = group
        return started

    def result(self, started: Future[_T]) -> _T:
        """What a pass started by :meth:`start` returned; the first failure of any pass
        if this one failed."""
        try:
            return started.result()
        except Exception:  # an interrupt of this thread stays an interrupt
            if (first := self._first_failure()) is not None:
                raise first from None
            raise

    def _first_failure(self) -> BaseException | None:
        with self._lock:
            return self._failure

    def _stop(self, passes: list[Future[Any]] | None, *, wait_for: bool = True) -> None:
        """Cancel ``passes`` (every one when None): their running jobs and any they would
        start; wait for their threads unless told not to."""
        with self._lock:
            chosen = list(self._groups) if passes is None else passes
            running = [started for started in chosen if not started.done()]
            groups = [self._groups[started] for started in running]
            self._stopped.update(self._groups[started] for started in chosen)
        for group in groups:
            # Also the jobs a pass submits from now on: cancelJobGroup alone stops only
            # those running, and a pass between two jobs would start its next one.
            self._spark.sparkContext._jsc.sc().cancelJobGroupAndFutureJobs(group)
        if wait_for:
            wait(running)
            self._settle(groups)

    def _settle(self, groups: list[str], timeout: float = 60.0) -> None:
        """Wait until no task of the cancelled ``groups`` runs: a pass's action returns
        when its job is cancelled, while its tasks finish their partitions (a write among
        them, which must not land in an output already removed)."""
        tracker = self._spark.sparkContext.statusTracker()
        deadline = time.monotonic() + timeout
        while groups and time.monotonic() < deadline:
            stages = [
                stage
                for group in groups
                for job in tracker.getJobIdsForGroup(group)
                if (info := tracker.getJobInfo(job)) is not None
                for stage in info.stageIds
            ]
            if not any(
                (running := tracker.getStageInfo(stage)) is not None and running.numActiveTasks > 0
                for stage in stages
            ):
                return
            time.sleep(0.05)

    def cancel(self) -> None:
        """Stop what still runs and wait for it (its error, if any, is not this run's)."""
        self._stop(None)
        self._pool.shutdown(wait=True)


@dataclasses.dataclass(frozen=True)
class _Figures:
    """Every plain figure and input check per (purgatory, op_type); and the partials
    themselves when they are few enough to finish on the driver."""

    rows: list[Row]
    #: The partials, collected; else cached, for Spark to finish.
    partials: pa.Table | DataFrame


def _figures(unique: DataFrame, null_free: frozenset[str], cached: list[DataFrame]) -> _Figures:
    # Planned here, on the pass's own thread: the other passes start meanwhile.
    partials = _partials(unique, null_free)
    checks = [column for column in partials.columns if column.startswith(CHECK_PREFIX)]
    counted = ["_duplicates", *(f"_x_{name}" for name in REASONS)]
    reductions = {**metrics.PARTIAL_REDUCTIONS, **{name: "sum" for name in checks + counted}}
    # One partition (the partials of a typical log are a few thousand rows): the limit
    # then needs no shuffle of its own and the partials reach the driver in one job after
    # the scan's, where a cache and a limit over several partitions took three, at the
    # end of the run (10M events, local[2]: 0.4 s each).
    table = partials.coalesce(1).limit(DRIVER_PARTIALS + 1).toArrow()
    finished: pa.Table | DataFrame
    if table.num_rows <= DRIVER_PARTIALS:
        grouped = table.group_by(list(GROUP)).aggregate(list(reductions.items()))
        names = {f"{name}_{how}": name for name, how in reductions.items()}
        totals = grouped.rename_columns([names.get(c, c) for c in grouped.column_names])
        rows, finished = totals.to_pylist(), table
    else:
        # A log of more seconds than that (e.g. a day of several purgatories): computed
        # again, and kept for the per-second table.
        finished = partials.persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(finished)
        aggregates = [getattr(F, how)(name).alias(name) for name, how in reductions.items()]
        rows = [row.asDict() for row in finished.groupBy(*GROUP).agg(*aggregates).collect()]
    return _Figures([metrics.group_figures(row) for row in rows], finished)


def _curves(events: DataFrame) -> dict[tuple[str, str, str], list[float]]:
    """The percentile curve per (purgatory, op_type, outcome) of the completed and
    expired operations, in an aggregation of their own, over the rows they describe:
    a sketch's buffer would take every other figure off the hash path."""
    return {
        (row["purgatory"], row["op_type"], row["outcome"]): row["curve"]
        for row in events.where(F.col("outcome").isin("completed", "expired"))
        .select(*GROUP, "outcome", metrics.percentile_input())
        .groupBy(*GROUP, "outcome")
        .agg(*metrics.percentile_aggregates())
        .collect()
    }


#: A hot keys table of up to this many rows, written to a local report, is ranked on the
#: driver (pyarrow): 0.01 s, where Spark's two rounds of windows took five small jobs,
#: 0.7-1.2 s at the end of a run (10M events, local[2], 300 keys).
DRIVER_KEYS = 250_000


def _hot_keys(spark: SparkSession, events: DataFrame, output: ReportOutput, top: int) -> list[Row]:
    """The hot keys table, written by Spark; its top keys read back (small, aggregated
    Parquet), so no cache holds the table meanwhile: by pyarrow when the report is
    local and the table has at most :data:`DRIVER_KEYS` rows, else by Spark."""
    _write(metrics.key_stats(events), output, "hot_keys")
    written = output.local_table("hot_keys")
    parts = [] if written is None else sorted(written.glob("*.parquet"))
    if parts and sum(pq.read_metadata(part).num_rows for part in parts) <= DRIVER_KEYS:
        return metrics.top_keys_table(pq.read_table([str(part) for part in parts]), top)
    return [
        row.asDict()
        for row in metrics.top_keys(_read(spark, output, "hot_keys"), top)
        .orderBy(*GROUP, "rank")
        .collect()
    ]


#: The columns that identify one operation across processes, restarts and copies.
IDENTITY = ("producer", "purgatory", "op_id")


#: Operation ids are checked in blocks of 64 consecutive ids (``op_id >> 6``), one
#: bit per id: purgatories number their operations 1, 2, 3, ..., so a block holds up
#: to 64 records of one writer and the first pass groups 64 times fewer rows than ids.
ID_BLOCK_BITS = 6


def writer_hash() -> Column:
    """The 64-bit hash of (producer, purgatory) that :func:`check_identities` groups by."""
    return F.xxhash64("producer", "purgatory")


def check_identities(records: DataFrame, quality: Quality) -> None:
    """Count exact duplicates and conflicting operation ids; one pass over three columns
    on a log whose ids are all distinct.

    The first pass groups the records by a 64-bit hash of (producer, purgatory) and
    ``op_id >> 6`` and keeps, per group, its records and a 64-bit mask of the ids seen
    (``bit_or``). Where every group has as many records as bits set, no id
    (:data:`IDENTITY`) occurs twice: no duplicates, no conflicts, and only the identity
    columns were read. Two writers whose hashes collide share a group, which can only
    add records beyond its bits, never hide any: at worst their block takes the exact
    pass. Otherwise only the records of the groups with more records than ids go to
    the exact pass: keyed
    by the identity and a hash of all columns, which tells the same record twice (a
    duplicate) from different records claiming one id (a conflict). Sets ``rows_read``,
    ``duplicates``, ``conflicting_ids`` and ``conflicting_rows``.
    """
    block = F.shiftright("op_id", ID_BLOCK_BITS).alias("_block")
    seen = F.expr(f"shiftleft(1L, cast(op_id & {2**ID_BLOCK_BITS - 1} AS INT))")
    # Fixed-width buffers (a count and a long), so Spark's compiled hash aggregation
    # runs it and the partial aggregation shrinks each block to one row before the
    # shuffle: at 10M events (local[2], warm) 1.5 s against 3.3 for a shuffle of one id
    # hash per record, and 5.6 for the id and row hashes together. Keyed by two longs
    # rather than two strings and a long: 1.03 s against 1.23.
    writer = writer_hash().alias("_writer")
    blocks = records.groupBy(writer, block).agg(
        F.count(F.lit(1)).alias("records"), F.bit_count(F.bit_or(seen)).alias("ids")
    )
    # A null op_id sets no bit, so its group always takes the exact pass.
    shared = F.col("records") > F.col("ids")
    totals = blocks.agg(
        F.sum("records").alias("rows"), F.count(F.when(shared, 1)).alias("shared")
    ).collect()[0]
    quality.rows_read = int(totals["rows"] or 0)
    quality.duplicates = quality.conflicting_ids = quality.conflicting_rows = 0
    if not totals["shared"]:
        return
    suspect = blocks.where(shared).select("_writer", "_block").alias("s")
    candidates = (
        records.select("*", writer, block)
        .alias("r")
        .join(
            suspect,
            on=[F.col(f"r.{name}").eqNullSafe(F.col(f"s.{name}")) for name in suspect.columns],
            how="left_semi",
        )
        .drop("_writer", "_block")
    )
    columns = [*COLUMNS, CORRUPT]
    # The null flags keep (null, "x") and ("x", null) apart, which xxhash64 alone
    # would not; two different records of one id share a 64-bit hash with
    # probability 2**-64.
    row_hash = F.xxhash64(*columns, *(F.isnull(name) for name in columns)).alias("_hash")
    # Partitioning by the identity once lets both groupings run without another shuffle.
    distinct = (
        candidates.select(*IDENTITY, row_hash)
        .repartition(*IDENTITY)
        .groupBy(*IDENTITY, "_hash")
        .agg(F.count(F.lit(1)).alias("copies"))
        .groupBy(*IDENTITY)
        .agg(F.count(F.lit(1)).alias("records"), F.sum("copies").alias("copies"))
    )
    conflicting = F.col("producer").isNotNull() & (F.col("records") > 1)
    exact = distinct.agg(
        F.sum(F.col("copies") - F.col("records")).alias("duplicates"),
        F.count(F.when(conflicting, 1)).alias("ids"),
        F.sum(F.when(conflicting, F.col("records"))).alias("conflicting_rows"),
    ).collect()[0]
    quality.duplicates = int(exact["duplicates"] or 0)
    quality.conflicting_ids = int(exact["ids"] or 0)
    quality.conflicting_rows = int(exact["conflicting_rows"] or 0)


def _partials(unique: DataFrame, null_free: frozenset[str]) -> DataFrame:
    """Every plain figure, the input checks and the exclusion counts, per (purgatory,
    op_type, second).

    Plain counts, sums, minima and maxima only: Spark's compiled hash aggregation, per
    second, so that the throughput table and the timeline come from this pass too (10M
    events, local[2]: 9.5 s of CPU against 13.5 + 4.0 for the figures and the
    per-second counts in passes of their own).
    """
    valid = F.col(REASON).isNull()
    rows = unique.withColumn(metrics.EXPIRING, metrics.expiring_fractions(valid))
    return rows.groupBy(*GROUP, metrics.second_of(valid)).agg(
        *metrics.partial_aggregates(valid),
        *check_aggregates(F.col(COPIES), null_free),
        F.sum(F.col(COPIES) - 1).alias("_duplicates"),
        *(F.count(F.when(F.col(REASON) == name, 1)).alias(f"_x_{name}") for name in REASONS),
    )


def _report_from(
    spark: SparkSession, passes: _Passes, raw: DataFrame, output: ReportOutput, asked: _Asked
) -> Report:
    events_dir, window, quality = asked.events_dir, asked.window, asked.quality
    figures = passes.result(passes.figures)
    rows = figures.rows
    check_results(raw, rows, events_dir)
    for name in REASONS:
        quality.excluded[name] = sum(int(row[f"_x_{name}"]) for row in rows)
    if asked.strict and (problems := quality.problems()):
        raise ReportError(f"--strict: the input has problems: {'; '.join(problems)}")
    stats = sorted(
        (row for row in rows if row["count"]), key=lambda row: (row["purgatory"], row["op_type"])
    )
    if not stats:
        raise ReportError(
            f"no usable events under {events_dir}"
            + (f" {window.describe()}" if window.bounded else "")
            + (f": {'; '.join(quality.problems())}" if quality.problems() else "")
        )
    if any(quality.excluded.values()):
        passes.exclude()
    curves = passes.result(passes.curves)
    for row in stats:
        latency = curves.get((row["purgatory"], row["op_type"], "completed"))
        late = curves.get((row["purgatory"], row["op_type"], "expired"))
        row["latency_curve"] = latency
        row["lateness_q"] = (
            None
            if late is None
            else [late[CURVE_QUANTILES.index(q)] for q in LATENESS_QUANTILES.values()]
        )
    return _write_report(spark, output, passes, figures.partials, stats, asked)


def _write_report(
    spark: SparkSession,
    output: ReportOutput,
    passes: _Passes,
    partials: pa.Table | DataFrame,
    stats: list[Row],
    asked: _Asked,
) -> Report:
    window, json_reader = asked.window, asked.json_reader
    start = math.floor(min(row["first_settled_at"] for row in stats))
    span = math.floor(max(row["last_settled_at"] for row in stats)) - start + 1
    bin_seconds = max(1, math.ceil(span / TIMELINE_BINS))
    # The per-second counts: from the partials collected, else from the cached ones by
    # Spark (while the hot keys pass writes its own table).
    if isinstance(partials, pa.Table):
        seconds = metrics.per_second_table(partials)
        output.write_small_table("throughput", seconds)
        bins = metrics.timeline_rows(seconds, start, bin_seconds)
    else:
        throughput = metrics.per_second(partials)
        _write(throughput, output, "throughput")
        bins = [row.asDict() for row in metrics.timeline(throughput, start, bin_seconds).collect()]
    peaks: dict[tuple[str, str], int] = {}
    for bin_row in bins:
        where = (bin_row["purgatory"], bin_row["op_type"])
        peaks[where] = max(peaks.get(where, 0), int(bin_row["peak"]))
    summary = [_summary_row(row, peaks) for row in stats]
    for row, group in zip(summary, stats, strict=True):
        row["duplicates_dropped"] = int(group["_duplicates"] or 0)
        row["excluded"] = {name: int(group[f"_x_{name}"]) for name in REASONS}
    whatif = [entry for row in stats for entry in _whatif_rows(row)]
    curves = {
        label(row): [
            (q, float(v))
            for q, v in zip(CURVE_QUANTILES, row["latency_curve"], strict=True)
            if meaningful(q, int(row["completed"]))
        ]
        for row in stats
        if row["latency_curve"] is not None
    }
    withheld = sorted(
        {
            q
            for row in stats
            if row["latency_curve"] is not None
            for q in CURVE_QUANTILES
            if not meaningful(q, int(row["completed"]))
        }
    )
    report = Report(
        events_dir=asked.events_dir,
        out_dir=output.location,
        events=sum(int(row["count"]) for row in stats),
        generated_at=datetime.now(UTC),
        summary=summary,
        whatif=whatif,
        hot_keys=[],
        latency_curves=curves,
        top_keys=asked.top_keys,
        timeline_start=start,
        timeline_bin_seconds=bin_seconds,
        quality=asked.quality,
        withheld_quantiles=withheld,
        window=window.describe() if window.bounded else None,
        run={**describe_run(spark), **({"JSON Lines": json_reader} if json_reader else {})},
    )
    # The charts are drawn on a thread while Spark computes the hot keys: matplotlib
    # needs the driver's CPU for about a second, the Spark job mostly waits on its JVM.
    drawing = ThreadPoolExecutor(1, thread_name_prefix="purgatory-report-charts")
    charts_done = drawing.submit(_draw_charts, report, output, bins, span)
    drawing.shutdown(wait=False)
    try:
        report.hot_keys = passes.result(passes.hot_keys)
    finally:
        charts_done.result()  # also when the hot keys failed: nothing may write after abort
    report.tables["throughput"] = output.final("tables/throughput")
    report.tables["hot_keys"] = output.final("tables/hot_keys")
    # A few rows each: written here with pyarrow, not by a Spark job apiece.
    for name, table_rows, schema in (
        ("summary", [_table_row(row) for row in summary], _SUMMARY_SCHEMA),
        ("whatif", whatif, _WHATIF_SCHEMA),
        ("latency_quantiles", _curve_rows(stats), _CURVE_SCHEMA),
    ):
        output.write_small_table(name, pa.Table.from_pylist(table_rows, schema=schema))
        report.tables[name] = output.final(f"tables/{name}")

    (output.files / "summary.json").write_text(
        json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8"
    )
    report.summary_json = output.final("summary.json")
    quality_doc = {
        **asked.quality.as_dict(),
        "window": report.window,
        "withheld_percentiles": [f"p{q * 100:g}" for q in withheld],
    }
    (output.files / "data_quality.json").write_text(
        json.dumps(quality_doc, indent=2, allow_nan=False) + "\n", encoding="utf-8"
    )
    report.quality_json = output.final("data_quality.json")
    (output.files / "report.md").write_text(render_markdown(report), encoding="utf-8")
    report.markdown = output.final("report.md")
    return report


def _table_row(row: Row) -> Row:
    return {
        key: value for key, value in row.items() if key not in ("duplicates_dropped", "excluded")
    }


def _write(frame: DataFrame, output: ReportOutput, name: str) -> None:
    frame.write.mode("overwrite").parquet(f"{output.uri}/tables/{name}")


def _read(spark: SparkSession, output: ReportOutput, name: str) -> DataFrame:
    return spark.read.parquet(f"{output.uri}/tables/{name}")


def _summary_row(stats: Row, peaks: dict[tuple[str, str], int]) -> Row:
    count = int(stats["count"])
    curve = stats["latency_curve"]
    lateness = stats["lateness_q"]

    def latency_at(quantile: float) -> float | None:
        if curve is None or not meaningful(quantile, int(stats["completed"])):
            return None
        return float(curve[CURVE_QUANTILES.index(quantile)])

    first, last = stats["first_settled_at"], stats["last_settled_at"]
    active_seconds = math.floor(last) - math.floor(first) + 1
    row: Row = {
        "purgatory": stats["purgatory"],
        "op_type": stats["op_type"],
        "count": count,
        **{outcome: int(stats[outcome]) for outcome in OUTCOMES},
        "expiry_ratio": ratio_of_judged(int(stats["expired"]), stats),
        "latency_p50": latency_at(HEADLINE_QUANTILES["p50"]),
        "latency_p99": latency_at(HEADLINE_QUANTILES["p99"]),
        "lateness_p99": None if lateness is None else float(lateness[1]),
    }
    row.update(
        {
            "latency_p90": latency_at(HEADLINE_QUANTILES["p90"]),
            "latency_p999": latency_at(HEADLINE_QUANTILES["p999"]),
            "latency_mean": stats["latency_mean"],
            "latency_max": stats["latency_max"],
            "lateness_p50": None if lateness is None else float(lateness[0]),
            "lateness_max": stats["lateness_max"],
            "throughput_per_s": count / active_seconds,
            "peak_per_s": peaks.get((stats["purgatory"], stats["op_type"]), 0),
            "active_seconds": active_seconds,
            "first_settled_at": first,
            "last_settled_at": last,
            "timeout_min": stats["timeout_min"],
            "timeout_mean": stats["timeout_mean"],
            "timeout_max": stats["timeout_max"],
        }
    )
    assert tuple(row)[: len(SUMMARY_KEYS)] == SUMMARY_KEYS
    assert len(LATENESS_QUANTILES) == 2
    return row


def _whatif_rows(stats: Row) -> list[Row]:
    """The what-if of a group: per fraction, its count over the same denominator as the
    expiry ratio. An absolute candidate (and the timeout used) only where every judged
    operation had the same timeout; null where each had its own, whose mean no request
    used."""
    total = judged(stats)
    if total == 0:
        return []
    used = None if timeouts_vary(stats) else float(stats["timeout_max"])
    return [
        {
            "purgatory": stats["purgatory"],
            "op_type": stats["op_type"],
            "timeout_fraction": fraction,
            "candidate_timeout_s": None if used is None else fraction * used,
            "timeout_used_s": used,
            "judged": total,
            "would_expire": int(would),
            "share": ratio_of_judged(int(would), stats),
        }
        for fraction, would in zip(WHATIF_FRACTIONS, stats["would_expire"], strict=True)
    ]


def _curve_rows(stats: list[Row]) -> list[Row]:
    return [
        {
            "purgatory": row["purgatory"],
            "op_type": row["op_type"],
            "quantile": quantile,
            "latency_s": float(value),
        }
        for row in stats
        if row["latency_curve"] is not None
        for quantile, value in zip(CURVE_QUANTILES, row["latency_curve"], strict=True)
        if meaningful(quantile, int(row["completed"]))
    ]


def _draw_charts(report: Report, output: ReportOutput, bins: list[Row], span: int) -> None:
    directory = output.files / "charts"
    width = report.timeline_bin_seconds
    count = max(1, math.ceil(span / width))
    settled: dict[str, list[float]] = {}
    expired: dict[str, list[float]] = {}
    for row in report.summary:
        settled[label(row)] = [0.0] * count
        expired[label(row)] = [0.0] * count
    for row in bins:
        index = int(row["bin"])
        settled[label(row)][index] = row["settled"] / width
        expired[label(row)][index] = row["expired"] / width
    for name, rates in expired.items():
        busiest = max(range(count), key=lambda index: rates[index])
        if rates[busiest] > 0:
            report.expiry_peaks[name] = (busiest * width, rates[busiest])
    # Anomalies of the whole log (all groups together), marked on both timelines.
    report.anomalies = [
        *find_windows(_totals(expired.values(), width), width, "expirations"),
        *find_windows(_totals(settled.values(), width), width, "throughput"),
    ]
    xs = [index * width for index in range(count)]
    xlabel = (
        f"seconds since {_utc(report.timeline_start)} ({width} s bin{'s' if width > 1 else ''})"
    )
    report.charts["latency"] = output.final("charts/latency.png")
    completed = {label(row): int(row["completed"]) for row in report.summary}
    charts.latency_chart(directory / "latency.png", report.latency_curves, completed)
    for name, per_group, title, ylabel in (
        ("throughput", settled, "Operations settled per second", "settled / s"),
        ("expirations", expired, "Expirations per second", "expired / s"),
    ):
        report.charts[name] = output.final(f"charts/{name}.png")
        charts.timeline_chart(
            directory / f"{name}.png",
            {series: list(zip(xs, ys, strict=True)) for series, ys in per_group.items()},
            title=title,
            ylabel=ylabel,
            xlabel=xlabel,
            windows=report.anomalies,
        )
    whatif: dict[str, list[tuple[float, float]]] = {}
    for row in report.whatif:
        whatif.setdefault(label(row), []).append((row["timeout_fraction"], row["share"]))
    report.charts["whatif"] = output.final("charts/whatif.png")
    charts.whatif_chart(directory / "whatif.png", whatif, whatif_bases(report))


def whatif_bases(report: Report) -> dict[str, str]:
    """Per group with a what-if, its legend's :func:`timeout_basis` (the findings say the
    same of it)."""
    having = {label(row) for row in report.whatif}
    return {label(row): timeout_basis(row) for row in report.summary if label(row) in having}


def _totals(rates: Iterable[list[float]], width: int) -> list[float]:
    """Operations per bin over every group, from per-group rates per second."""
    return [sum(column) * width for column in zip(*rates, strict=True)]


def _utc(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_SUMMARY_SCHEMA = pa.schema(
    [
        ("purgatory", pa.string()),
        ("op_type", pa.string()),
        ("count", pa.int64()),
        *((outcome, pa.int64()) for outcome in OUTCOMES),
        ("expiry_ratio", pa.float64()),
        *(
            (name, pa.float64())
            for name in (
                "latency_p50",
                "latency_p99",
                "lateness_p99",
                "latency_p90",
                "latency_p999",
                "latency_mean",
                "latency_max",
                "lateness_p50",
                "lateness_max",
                "throughput_per_s",
            )
        ),
        ("peak_per_s", pa.int64()),
        ("active_seconds", pa.int64()),
        *(
            (name, pa.float64())
            for name in (
                "first_settled_at",
                "last_settled_at",
                "timeout_min",
                "timeout_mean",
                "timeout_max",
            )
        ),
    ]
)

_WHATIF_SCHEMA = pa.schema(
    [
        ("purgatory", pa.string()),
        ("op_type", pa.string()),
        ("timeout_fraction", pa.float64()),
        ("candidate_timeout_s", pa.float64()),
        ("timeout_used_s", pa.float64()),
        ("judged", pa.int64()),
        ("would_expire", pa.int64()),
        ("share", pa.float64()),
    ]
)

_CURVE_SCHEMA = pa.schema(
    [
        ("purgatory", pa.string()),
        ("op_type", pa.string()),
        ("quantile", pa.float64()),
        ("latency_s", pa.float64()),
    ]
)
