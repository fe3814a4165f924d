"""What a report run produced, shared by the run and the Markdown rendering."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from purgatory_aio.events import OUTCOMES

#: Keys every ``summary.json`` entry has, first and in this order.
SUMMARY_KEYS = (
    "purgatory",
    "op_type",
    "count",
    *OUTCOMES,
    "expiry_ratio",
    "latency_p50",
    "latency_p99",
    "lateness_p99",
)

Row = dict[str, Any]

if TYPE_CHECKING:
    from purgatory_report.anomalies import Window
    from purgatory_report.quality import Quality


@dataclass
class Report:
    """What a run produced; locations are inside :attr:`out_dir` (a path or URI)."""

    events_dir: str
    out_dir: str
    events: int
    generated_at: datetime
    summary: list[Row]
    whatif: list[Row]
    hot_keys: list[Row]
    latency_curves: dict[str, list[tuple[float, float]]]
    top_keys: int
    timeline_start: int
    timeline_bin_seconds: int
    quality: Quality
    #: Curve quantiles left out for some group: their rank error spans too much of the tail.
    withheld_quantiles: list[float] = field(default_factory=list)
    #: The ``--since``/``--until`` window in words, or ``None``.
    window: str | None = None
    #: What ran the report (Spark version, master, heap, partitions), for its run section.
    run: dict[str, str] = field(default_factory=dict)
    #: Anomalous windows of the timelines (expiration bursts, throughput drops).
    anomalies: list[Window] = field(default_factory=list)
    #: Per group, its busiest expiration bin: (seconds since the timeline's start, rate/s).
    expiry_peaks: dict[str, tuple[float, float]] = field(default_factory=dict)
    tables: dict[str, str] = field(default_factory=dict)
    charts: dict[str, str] = field(default_factory=dict)
    summary_json: str | None = None
    quality_json: str | None = None
    markdown: str | None = None


def label(row: Row) -> str:
    """``purgatory/op_type`` of a row."""
    return f"{row['purgatory']}/{row['op_type']}"


def timeouts_vary(row: Row) -> bool:
    """Whether a group's operations had different timeouts (beyond clock rounding)."""
    low, high = row["timeout_min"], row["timeout_max"]
    return bool(high - low > max(1e-5, 1e-3 * abs(high)))


def judged(row: Row) -> int:
    """Completed plus expired operations of a row: the denominator of every ratio in the
    report (cancelled and shut down operations tell nothing about a timeout)."""
    return int(row["completed"]) + int(row["expired"])


def ratio_of_judged(expired: int, row: Row) -> float | None:
    """``expired`` over :func:`judged` of ``row``; ``None`` where nothing was judged."""
    total = judged(row)
    return expired / total if total else None


def duration(seconds: float) -> str:
    """A timeout in words: ``500 ms``, ``1.5 s``, ``60 s``."""
    millis = seconds * 1000.0
    return f"{millis / 1000.0:g} s" if millis >= 1000.0 else f"{millis:g} ms"


def timeout_basis(row: Row) -> str:
    """What a group's what-if fractions are fractions of, as the chart's legend and the
    key findings both say it: the group's one timeout (``its timeout of 500 ms``) where
    every judged operation had the same, else each request's own (``each request's own
    timeout (500 ms to 60 s)``), never a mean no request used."""
    if timeouts_vary(row):
        low, high = duration(row["timeout_min"]), duration(row["timeout_max"])
        return f"each request's own timeout ({low} to {high})"
    return f"its timeout of {duration(row['timeout_max'])}"
