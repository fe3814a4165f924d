"""The report run: event log in, ``summary.json``, Parquet tables, charts and ``report.md`` out.

Example:
    >>> from purgatory_aio.analytics.report import run
    >>> from purgatory_aio.analytics.session import create_session
    >>> report = run("events/", "report/", spark=create_session("local[2]"))  # doctest: +SKIP
    >>> report.summary[0]["latency_p99"]                                       # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

from purgatory_aio.analytics import charts, metrics
from purgatory_aio.analytics.errors import ReportError, missing_dependency
from purgatory_aio.analytics.inputs import check_aggregates, check_results, read_events
from purgatory_aio.analytics.metrics import (
    CURVE_QUANTILES,
    GROUP,
    HEADLINE_QUANTILES,
    LATENESS_QUANTILES,
    WHATIF_FRACTIONS,
)
from purgatory_aio.analytics.model import SUMMARY_KEYS, Report, Row, label
from purgatory_aio.analytics.render import render_markdown
from purgatory_aio.events import COLUMNS, OUTCOMES

try:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
    )
except ImportError as exc:
    raise missing_dependency(exc) from exc

#: Chart bins: the timelines are cut into at most this many bins.
TIMELINE_BINS = 600


def run(
    events_dir: str,
    out_dir: str | Path,
    *,
    spark: SparkSession,
    top_keys: int = 20,
) -> Report:
    """Compute the report of the event log under ``events_dir`` into ``out_dir``.

    Args:
        events_dir: Directory (searched recursively) of ``*.parquet`` and
            ``*.jsonl`` event files, or a Hadoop URI such as ``hdfs://...``.
        out_dir: Local directory for the report; created, and its report files
            replaced.
        spark: The session to run on; it is left running.
        top_keys: Hot keys listed per (purgatory, op_type) in ``report.md``.

    Raises:
        ReportError: Missing, empty or malformed input; ``out_dir`` unusable.
    """
    if top_keys < 1:
        raise ReportError(f"top_keys must be at least 1, got {top_keys}")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ReportError(f"report directory is a file: {out}")
    raw = read_events(spark, events_dir)
    # Checking shares the first pass over the data with the figures.
    grouped = raw.groupBy(*GROUP).agg(*metrics.group_aggregates(), *check_aggregates())
    rows = [row.asDict() for row in grouped.collect()]
    total = check_results(raw, rows, events_dir)
    stats = sorted(rows, key=lambda row: (row["purgatory"], row["op_type"]))
    events = raw.select(*COLUMNS)
    out.mkdir(parents=True, exist_ok=True)
    tables = out / "tables"

    _write(metrics.per_second(events), tables / "throughput")
    per_second = spark.read.parquet(str(tables / "throughput"))
    peaks = {
        (row["purgatory"], row["op_type"]): int(row["peak"])
        for row in per_second.groupBy(*GROUP).agg(F.max("settled").alias("peak")).collect()
    }

    _write(metrics.key_stats(events), tables / "hot_keys")
    hot_keys = [
        row.asDict()
        for row in spark.read.parquet(str(tables / "hot_keys"))
        .where(F.col("rank") <= top_keys)
        .orderBy(*GROUP, "rank")
        .collect()
    ]

    summary = [_summary_row(row, peaks) for row in stats]
    whatif = [entry for row in stats for entry in _whatif_rows(row)]
    curves = {
        label(row): list(zip(CURVE_QUANTILES, row["latency_curve"], strict=True))
        for row in stats
        if row["latency_curve"] is not None
    }
    start = math.floor(min(row["first_settled_at"] for row in stats))
    span = math.floor(max(row["last_settled_at"] for row in stats)) - start + 1
    bin_seconds = max(1, math.ceil(span / TIMELINE_BINS))
    bins = metrics.timeline(per_second, start, bin_seconds).collect()

    report = Report(
        events_dir=events_dir,
        out_dir=out,
        events=total,
        generated_at=datetime.now(UTC),
        summary=summary,
        whatif=whatif,
        hot_keys=hot_keys,
        latency_curves=curves,
        top_keys=top_keys,
        timeline_start=start,
        timeline_bin_seconds=bin_seconds,
    )
    report.tables["throughput"] = tables / "throughput"
    report.tables["hot_keys"] = tables / "hot_keys"
    for name, rows, schema in (
        ("summary", summary, _SUMMARY_SCHEMA),
        ("whatif", whatif, _WHATIF_SCHEMA),
        ("latency_quantiles", _curve_rows(stats), _CURVE_SCHEMA),
    ):
        _write(spark.createDataFrame(rows, schema).coalesce(1), tables / name)
        report.tables[name] = tables / name

    report.summary_json = out / "summary.json"
    report.summary_json.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    _draw_charts(report, [row.asDict() for row in bins], span)

    report.markdown = out / "report.md"
    report.markdown.write_text(render_markdown(report), encoding="utf-8")
    return report


def _write(frame: DataFrame, path: Path) -> None:
    frame.write.mode("overwrite").parquet(str(path))


def _summary_row(stats: Row, peaks: dict[tuple[str, str], int]) -> Row:
    count = int(stats["count"])
    curve = stats["latency_curve"]
    lateness = stats["lateness_q"]

    def latency_at(quantile: float) -> float | None:
        return None if curve is None else float(curve[CURVE_QUANTILES.index(quantile)])

    first, last = stats["first_settled_at"], stats["last_settled_at"]
    active_seconds = math.floor(last) - math.floor(first) + 1
    row: Row = {
        "purgatory": stats["purgatory"],
        "op_type": stats["op_type"],
        "count": count,
        **{outcome: int(stats[outcome]) for outcome in OUTCOMES},
        "expiry_ratio": stats["expired"] / count,
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
    judged = int(stats["completed"]) + int(stats["expired"])
    if judged == 0:
        return []
    used = float(stats["timeout_mean"])
    return [
        {
            "purgatory": stats["purgatory"],
            "op_type": stats["op_type"],
            "timeout_fraction": fraction,
            "candidate_timeout_s": fraction * used,
            "timeout_used_s": used,
            "judged": judged,
            "would_expire": int(would),
            "share": int(would) / judged,
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
    ]


def _draw_charts(report: Report, bins: list[Row], span: int) -> None:
    directory = report.out_dir / "charts"
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
    xs = [index * width for index in range(count)]
    xlabel = (
        f"seconds since {_utc(report.timeline_start)} ({width} s bin{'s' if width > 1 else ''})"
    )
    report.charts["latency"] = charts.latency_chart(
        directory / "latency.png", report.latency_curves
    )
    report.charts["throughput"] = charts.timeline_chart(
        directory / "throughput.png",
        {name: list(zip(xs, ys, strict=True)) for name, ys in settled.items()},
        title="Operations settled per second",
        ylabel="settled / s",
        xlabel=xlabel,
    )
    report.charts["expirations"] = charts.timeline_chart(
        directory / "expirations.png",
        {name: list(zip(xs, ys, strict=True)) for name, ys in expired.items()},
        title="Expirations per second",
        ylabel="expired / s",
        xlabel=xlabel,
    )
    whatif: dict[str, list[tuple[float, float]]] = {}
    for row in report.whatif:
        whatif.setdefault(label(row), []).append((row["candidate_timeout_s"], row["share"]))
    report.charts["whatif"] = charts.whatif_chart(directory / "whatif.png", whatif)


def _utc(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_SUMMARY_SCHEMA = StructType(
    [
        StructField("purgatory", StringType()),
        StructField("op_type", StringType()),
        StructField("count", LongType()),
        *(StructField(outcome, LongType()) for outcome in OUTCOMES),
        StructField("expiry_ratio", DoubleType()),
        *(
            StructField(name, DoubleType())
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
        StructField("peak_per_s", LongType()),
        StructField("active_seconds", LongType()),
        *(
            StructField(name, DoubleType())
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

_WHATIF_SCHEMA = StructType(
    [
        StructField("purgatory", StringType()),
        StructField("op_type", StringType()),
        StructField("timeout_fraction", DoubleType()),
        StructField("candidate_timeout_s", DoubleType()),
        StructField("timeout_used_s", DoubleType()),
        StructField("judged", LongType()),
        StructField("would_expire", LongType()),
        StructField("share", DoubleType()),
    ]
)

_CURVE_SCHEMA = StructType(
    [
        StructField("purgatory", StringType()),
        StructField("op_type", StringType()),
        StructField("quantile", DoubleType()),
        StructField("latency_s", DoubleType()),
    ]
)
