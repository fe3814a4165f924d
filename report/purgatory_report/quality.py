"""Rows that cannot be right, and what the report does with them.

Exact duplicates (the same record twice: a file copied, the same records as
JSON Lines and Parquet) are dropped and counted. A record whose times cannot be
right is excluded from every figure and counted under the first reason it
matches, in the order of :data:`REASONS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from purgatory_report.errors import missing_dependency

try:
    from pyspark.sql import Column
    from pyspark.sql import functions as F
except ImportError as exc:
    raise missing_dependency(exc) from exc

#: Plausible times: 2000-01-01 .. 2100-01-01 UTC, in epoch seconds. Milliseconds
#: given as seconds (about 1.7e12) fall far outside, as do zero-based clocks.
PLAUSIBLE_FROM = 946_684_800.0
PLAUSIBLE_UNTIL = 4_102_444_800.0

_TIMES = ("created_at", "deadline", "settled_at")

#: Exclusion reasons, with what they mean in the report.
REASONS: dict[str, str] = {
    "non_finite_time": "a time is NaN or infinite",
    "implausible_time": "a time lies outside 2000-2100 (e.g. milliseconds given as seconds)",
    "settled_before_created": "settled before it was created",
    "deadline_before_created": "deadline before it was created",
}

#: Name of the column holding a row's exclusion reason (null: the row is used).
REASON = "_reason"


def reason() -> Column:
    """The first of :data:`REASONS` that applies to a row, or null."""
    times = [F.col(name) for name in _TIMES]
    non_finite = F.lit(False)
    implausible = F.lit(False)
    for time in times:
        non_finite = non_finite | F.isnan(time) | (F.abs(time) == F.lit(float("inf")))
        implausible = implausible | (time < PLAUSIBLE_FROM) | (time >= PLAUSIBLE_UNTIL)
    return (
        F.when(non_finite, "non_finite_time")
        .when(implausible, "implausible_time")
        .when(F.col("settled_at") < F.col("created_at"), "settled_before_created")
        .when(F.col("deadline") < F.col("created_at"), "deadline_before_created")
    )


@dataclass
class Quality:
    """What the report left out of its input, and why."""

    rows_read: int = 0
    duplicates: int = 0
    excluded: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    conflicting_ids: int = 0
    conflicting_rows: int = 0
    writer_drops: dict[str, int] = field(default_factory=dict)
    markers_read: bool = True

    @property
    def dropped_by_writers(self) -> int:
        return sum(self.writer_drops.values())

    def problems(self) -> list[str]:
        """Each problem as a phrase; empty when the input is clean."""
        found = []
        if self.duplicates:
            found.append(f"{self.duplicates:,} exact duplicate record(s) dropped")
        for name, count in self.excluded.items():
            if count:
                found.append(f"{count:,} record(s) excluded: {REASONS[name]}")
        if self.conflicting_ids:
            found.append(
                f"{self.conflicting_ids:,} operation id(s) (producer, purgatory, op_id) "
                f"recorded with different contents ({self.conflicting_rows:,} records)"
            )
        if self.dropped_by_writers:
            found.append(
                f"input incomplete: the writers dropped {self.dropped_by_writers:,} record(s)"
            )
        return found

    def as_dict(self) -> dict[str, object]:
        return {
            "rows_read": self.rows_read,
            "duplicates_dropped": self.duplicates,
            "excluded": dict(self.excluded),
            "excluded_total": sum(self.excluded.values()),
            "conflicting_op_ids": self.conflicting_ids,
            "conflicting_records": self.conflicting_rows,
            "dropped_by_writers": self.dropped_by_writers,
            "writer_drops": dict(self.writer_drops),
            "complete": self.dropped_by_writers == 0,
        }
