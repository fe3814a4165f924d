"""The report's findings and charts, checked as data (no Spark needed)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from purgatory_report import charts
from purgatory_report.anomalies import Window, find_windows
from purgatory_report.metrics import CURVE_QUANTILES, WHATIF_FRACTIONS
from purgatory_report.model import Report
from purgatory_report.quality import Quality
from purgatory_report.render import key_findings, render_markdown

T0 = 1_767_225_600  # 2026-01-01 00:00:00 UTC


def curve(values_ms: list[float]) -> list[tuple[float, float]]:
    """A latency curve at every CURVE_QUANTILES point over these observations (exact)."""
    ordered = sorted(values_ms)
    n = len(ordered)
    return [(q, ordered[max(0, math.ceil(q * n) - 1)] / 1000) for q in CURVE_QUANTILES]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_group_of_one_to_three_operations_is_points_not_a_curve(n: int) -> None:
    values = [10.0 * (index + 1) for index in range(n)]
    (series,) = charts.latency_series({"p/Op": curve(values)}, {"p/Op": n})
    assert series.points_only
    assert series.linestyle == "none"
    assert len(series.xs) == n
    assert sorted(series.ys) == pytest.approx(values)
    # Never out to 99.99%: the points sit at the middle of each observation's share.
    assert max(series.xs) < charts._tail_position(0.99)
    assert f"{n} operation" in series.label


def test_a_curve_stops_where_its_group_size_resolves_it() -> None:
    n = 50
    (series,) = charts.latency_series(
        {"p/Op": curve([float(v) for v in range(1, n + 1)])}, {"p/Op": n}
    )
    assert not series.points_only
    assert max(series.xs) == pytest.approx(charts._tail_position(1 - 1 / n))
    big = 1_000_000
    (large,) = charts.latency_series({"p/Op": curve([1.0, 2.0, 3.0] * 10)}, {"p/Op": big})
    assert max(large.xs) == pytest.approx(charts._tail_position(max(CURVE_QUANTILES)))


def test_latency_chart_labels_ticks_below_fifty_percent(tmp_path: Path) -> None:
    figure = charts.latency_chart(
        tmp_path / "latency.png", {"p/Op": curve([float(v) for v in range(1, 201)])}, {"p/Op": 200}
    )
    labels = [tick.get_text() for tick in figure.axes[0].get_xticklabels()]
    assert labels[:3] == ["0%", "25%", "50%"]
    assert "99%" in labels
    assert (tmp_path / "latency.png").read_bytes()[:4] == b"\x89PNG"


def test_whatif_lines_near_zero_stand_clear_of_the_axis_and_each_other(tmp_path: Path) -> None:
    near_zero = {
        "a/Op": [(f, 0.0) for f in WHATIF_FRACTIONS],
        "b/Op": [(f, 0.002) for f in WHATIF_FRACTIONS],
        "c/Op": [(f, 0.005) for f in WHATIF_FRACTIONS],
        "d/Op": [(f, 0.8 * (1 - f)) for f in WHATIF_FRACTIONS],
    }
    figure = charts.whatif_chart(tmp_path / "whatif.png", near_zero, {})
    axes = figure.axes[0]
    figure.canvas.draw()

    def pixel_y(share: float) -> float:
        return float(axes.transData.transform((50.0, share * 100.0))[1])

    bottom = axes.bbox.y0
    heights = [pixel_y(share) for share in (0.0, 0.002, 0.005)]
    assert heights[0] - bottom >= 5, "a zero line must not sit on the axis"
    assert heights[1] - heights[0] >= 10
    assert heights[2] - heights[1] >= 10
    assert pixel_y(0.8) <= axes.bbox.y1
    series = charts.whatif_series(near_zero, {})
    assert len({(line.marker, line.linestyle) for line in series}) == len(series)


def test_anomaly_windows_span_a_burst_and_a_steady_log_has_none() -> None:
    steady = [20.0, 22.0, 19.0, 21.0, 20.0] * 40
    assert find_windows(steady, 1, "expirations") == []
    assert find_windows(steady, 1, "throughput") == []
    burst = [0.0] * 300
    for second in range(60, 75):
        burst[second] = 3.0
    burst[66] = 12.0
    assert find_windows(burst, 2, "expirations") == [Window("expirations", 120, 150)]
    stall = [100.0] * 200
    for second in range(50, 60):
        stall[second] = 5.0
    assert find_windows(stall, 1, "throughput") == [Window("throughput", 50, 60)]
    stall[0], stall[-1] = 30.0, 40.0  # a log starts and ends inside its edge bins
    assert find_windows(stall, 1, "throughput") == [Window("throughput", 50, 60)]
    assert find_windows([0.0, 50.0, 0.0], 1, "expirations") == []  # too few bins to judge


def whatif_rows(purgatory: str, timeout: float, shares: dict[float, float], judged: int) -> list:
    return [
        {
            "purgatory": purgatory,
            "op_type": "Op",
            "timeout_fraction": f,
            "candidate_timeout_s": f * timeout,
            "timeout_used_s": timeout,
            "judged": judged,
            "would_expire": round(shares[f] * judged),
            "share": round(shares[f] * judged) / judged,
        }
        for f in WHATIF_FRACTIONS
    ]


def summary_row(purgatory: str, count: int, expired: int, timeout: float) -> dict[str, Any]:
    return {
        "purgatory": purgatory,
        "op_type": "Op",
        "count": count,
        "completed": count - expired,
        "expired": expired,
        "cancelled": 0,
        "shutdown": 0,
        "expiry_ratio": expired / count,
        "first_settled_at": T0 + 0.5,
        "last_settled_at": T0 + 600.0,
        "timeout_min": timeout,
        "timeout_mean": timeout,
        "timeout_max": timeout,
        "throughput_per_s": count / 600,
        "peak_per_s": count // 100,
        "active_seconds": 600,
        **dict.fromkeys(
            ("latency_p50", "latency_p90", "latency_p99", "latency_p999", "latency_mean"), 0.01
        ),
        **dict.fromkeys(("latency_max", "lateness_p50", "lateness_p99", "lateness_max"), 0.02),
    }


def small_report() -> Report:
    produce = {f: 0.021 + (0.0021 if f >= 0.5 else 0.3) * (f < 1.0) for f in WHATIF_FRACTIONS}
    fetch = {f: 0.05 + 0.5 * (1 - f) for f in WHATIF_FRACTIONS}
    return Report(
        events_dir="events/",
        out_dir="report/",
        events=30_000,
        generated_at=datetime.now(UTC),
        summary=[
            summary_row("fetch", 20_000, 1_000, 0.5),
            summary_row("produce", 10_000, 210, 1.0),
        ],
        whatif=whatif_rows("fetch", 0.5, fetch, 20_000)
        + whatif_rows("produce", 1.0, produce, 10_000),
        hot_keys=[],
        latency_curves={},
        top_keys=20,
        timeline_start=T0,
        timeline_bin_seconds=1,
        quality=Quality(),
        anomalies=[Window("expirations", 120, 150)],
        expiry_peaks={"fetch/Op": (130.0, 41.0)},
    )


def test_key_findings_say_what_expired_most_when_and_what_a_shorter_timeout_costs() -> None:
    findings = key_findings(small_report())
    assert findings[0].startswith("30,000 operations in 2 group(s) settled over 10.0 min")
    assert findings[1] == (
        "`fetch/Op` expired most: 1,000 of 20,000 (5.00%), at worst 41.0/s around "
        "2026-01-01 00:02:10 UTC."
    )
    assert "2026-01-01 00:02:00 UTC to 00:02:30" in findings[2]
    assert (
        "A shorter timeout: `produce/Op` at 500 ms (50% of its timeout of 1 s) would expire "
        "only 0.21% more of its operations (2.31% instead of 2.10%)."
    ) in findings
    assert any(
        sentence.startswith("Shorter timeouts cost `fetch/Op` dearly: at 450 ms (90% of its")
        for sentence in findings
    )
    text = render_markdown(small_report())
    assert text.index("## Key findings") < text.index("## Data quality")
