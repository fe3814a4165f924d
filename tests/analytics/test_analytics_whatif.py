"""The what-if on a log whose requests chose their own timeouts: every figure worked out
by hand below, and the findings, the table and the chart's legend saying the same.

Two groups. ``orders/Poll``: client-chosen timeouts of 0.5 to 2 s and three 60 s long
polls, plus one cancelled (with a 120 s timeout) and two shut down operations, which no
ratio and no timeout figure may count. ``orders/Ack``: every judged operation had 1.5 s,
and a shut down one had 30 s, which must not make its timeouts "vary".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from eventlog_reference import START, write_log
from purgatory_report import charts
from purgatory_report.cli import main
from purgatory_report.model import timeout_basis

from purgatory_aio.events import OperationEvent

pytestmark = pytest.mark.spark

#: (timeout, outcome, seconds from creation to settlement; None: just past the deadline)
POLL = (
    (0.5, "completed", 0.1),
    (1.0, "completed", 0.93),
    (2.0, "completed", 0.4),
    (1.5, "completed", 1.4),
    (60.0, "completed", 31.0),
    (60.0, "completed", 58.5),
    (0.5, "expired", None),
    (2.0, "expired", None),
    (60.0, "expired", None),
    (120.0, "cancelled", 5.0),
    (60.0, "shutdown", 10.0),
    (2.0, "shutdown", 1.0),
)
ACK = (
    (1.5, "completed", 0.1),
    (1.5, "completed", 0.2),
    (1.5, "completed", 0.3),
    (1.5, "completed", 0.5),
    (1.5, "expired", None),
    (30.0, "shutdown", 2.0),
)

# By hand. Poll: 6 completed + 3 expired = 9 judged, 3 expired. A completed request
# expires at fraction f when its latency exceeds f times its own timeout:
#   f = 0.10: all six (0.1 > 0.05, 0.93 > 0.1, 0.4 > 0.2, 1.4 > 0.15, 31 > 6, 58.5 > 6)
#   f = 0.25: 0.93, 1.4, 31, 58.5 (0.1 < 0.125, 0.4 < 0.5)
#   f = 0.50: 0.93, 1.4, 31, 58.5 (31 > 30)
#   f = 0.75: 0.93, 1.4, 58.5 (31 < 45)
#   f = 0.90: 0.93, 1.4, 58.5 (0.93 > 0.9, 1.4 > 1.35, 58.5 > 54)
#   f = 1.00: none (they completed in time)
POLL_WOULD = {0.1: 3 + 6, 0.25: 3 + 4, 0.5: 3 + 4, 0.75: 3 + 3, 0.9: 3 + 3, 1.0: 3}
# Ack: 4 completed + 1 expired = 5 judged, every one with 1.5 s:
#   f = 0.10 (150 ms): 0.2, 0.3, 0.5;  f = 0.25 (375 ms): 0.5;  f >= 0.5 (750 ms): none
ACK_WOULD = {0.1: 1 + 3, 0.25: 1 + 1, 0.5: 1, 0.75: 1, 0.9: 1, 1.0: 1}


def events() -> list[OperationEvent]:
    made = []
    for op_type, specs in (("Poll", POLL), ("Ack", ACK)):
        for timeout, outcome, after in specs:
            op_id = len(made)
            created = START + op_id
            settled = created + timeout + 0.001 if after is None else created + after
            made.append(
                OperationEvent(
                    "orders",
                    op_type,
                    op_id,
                    ["order-7"],
                    created,
                    created + timeout,
                    settled,
                    outcome,  # type: ignore[arg-type]
                    None,
                )
            )
    return made


@pytest.fixture(scope="module")
def report_dir(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("whatif")
    write_log(root / "events", events())
    assert main([str(root / "events"), "--out", str(root / "out")], spark=spark) == 0
    return root / "out"


def summary(report_dir: Path) -> dict[str, dict[str, Any]]:
    rows = json.loads((report_dir / "summary.json").read_text())
    return {row["op_type"]: row for row in rows}


def whatif(report_dir: Path, op_type: str) -> dict[float, dict[str, Any]]:
    rows = pq.read_table(report_dir / "tables" / "whatif").to_pylist()
    return {round(r["timeout_fraction"], 2): r for r in rows if r["op_type"] == op_type}


def test_ratios_leave_out_cancelled_and_shutdown_operations_alike(report_dir: Path) -> None:
    poll, ack = summary(report_dir)["Poll"], summary(report_dir)["Ack"]
    assert (poll["count"], poll["completed"], poll["expired"]) == (12, 6, 3)
    assert poll["expiry_ratio"] == pytest.approx(3 / 9)
    assert ack["expiry_ratio"] == pytest.approx(1 / 5)
    # The timeouts of judged operations only: not the cancelled 120 s nor the shut down 30 s.
    assert (poll["timeout_min"], poll["timeout_max"]) == (0.5, 60.0)
    assert poll["timeout_mean"] == pytest.approx((0.5 + 1 + 2 + 1.5 + 60 + 60 + 0.5 + 2 + 60) / 9)
    assert (ack["timeout_min"], ack["timeout_max"]) == (1.5, 1.5)
    keys = pq.read_table(report_dir / "tables" / "hot_keys").to_pylist()
    ratios = {row["op_type"]: row["expiry_ratio"] for row in keys if row["key"] == "order-7"}
    assert ratios == {"Poll": pytest.approx(3 / 9), "Ack": pytest.approx(1 / 5)}


@pytest.mark.parametrize(("op_type", "expected"), [("Poll", POLL_WOULD), ("Ack", ACK_WOULD)])
def test_whatif_counts_and_shares_are_the_hand_computed_ones(
    report_dir: Path, op_type: str, expected: dict[float, int]
) -> None:
    rows = whatif(report_dir, op_type)
    judged = {"Poll": 9, "Ack": 5}[op_type]
    for fraction, would in expected.items():
        assert rows[fraction]["judged"] == judged
        assert rows[fraction]["would_expire"] == would, fraction
        assert rows[fraction]["share"] == pytest.approx(would / judged)
    # At the timeouts used, the what-if is the expiry ratio: one denominator.
    assert rows[1.0]["share"] == pytest.approx(summary(report_dir)[op_type]["expiry_ratio"])


def test_an_absolute_candidate_only_where_the_group_used_one_timeout(report_dir: Path) -> None:
    for row in whatif(report_dir, "Poll").values():
        assert row["candidate_timeout_s"] is None
        assert row["timeout_used_s"] is None
    ack = whatif(report_dir, "Ack")
    assert ack[0.5]["candidate_timeout_s"] == pytest.approx(0.75)
    assert ack[0.5]["timeout_used_s"] == 1.5


def test_findings_table_and_legend_say_what_was_computed(report_dir: Path) -> None:
    text = (report_dir / "report.md").read_text()
    findings = text.split("## Key findings")[1].split("\n## ")[0]
    assert "4 of the 14 that completed or expired (28.57%) expired." in findings
    assert "`orders/Poll` expired most: 3 of 9 (33.33%)" in findings
    assert (
        "Shorter timeouts cost `orders/Poll` dearly: at 90% of each request's own timeout "
        "(500 ms to 60 s), 66.67% would expire instead of 33.33%."
    ) in findings
    assert (
        "A shorter timeout: `orders/Ack` at 750 ms (50% of its timeout of 1.5 s) would "
        "expire no more of its operations than now (20.00%)."
    ) in findings
    assert "| orders | Poll | 12 | 6 | 3 | 1 | 2 | 33.33% |" in text.replace("`", "")
    assert "### `orders/Poll`: each request's own timeout (500 ms to 60 s), 9 judged" in text
    assert "| 90% | each request's own | 6 | 66.67% |" in text
    assert "### `orders/Ack`: its timeout of 1.5 s, 5 judged" in text
    assert "| 50% | 750.0 | 1 | 20.00% |" in text
    # The chart's legend names the same basis as the findings, from the same rows.
    rows = summary(report_dir)
    bases = {f"orders/{op}": timeout_basis(rows[op]) for op in ("Poll", "Ack")}
    curves = {name: [(0.5, 0.1), (1.0, 0.0)] for name in bases}
    labels = [series.label for series in charts.whatif_series(curves, bases)]
    assert labels == [
        "orders/Poll: each request's own timeout (500 ms to 60 s)",
        "orders/Ack: its timeout of 1.5 s",
    ]
