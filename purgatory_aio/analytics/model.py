"""What a report run produced, shared by the run and the Markdown rendering."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

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


@dataclass
class Report:
    """What a run produced; paths are inside :attr:`out_dir`."""

    events_dir: str
    out_dir: Path
    events: int
    generated_at: datetime
    summary: list[Row]
    whatif: list[Row]
    hot_keys: list[Row]
    latency_curves: dict[str, list[tuple[float, float]]]
    top_keys: int
    timeline_start: int
    timeline_bin_seconds: int
    tables: dict[str, Path] = field(default_factory=dict)
    charts: dict[str, Path] = field(default_factory=dict)
    summary_json: Path | None = None
    markdown: Path | None = None


def label(row: Row) -> str:
    """``purgatory/op_type`` of a row."""
    return f"{row['purgatory']}/{row['op_type']}"


def timeouts_vary(row: Row) -> bool:
    """Whether a group's operations had different timeouts (beyond clock rounding)."""
    low, high = row["timeout_min"], row["timeout_max"]
    return bool(high - low > max(1e-5, 1e-3 * abs(high)))
