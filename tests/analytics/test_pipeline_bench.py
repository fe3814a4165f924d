"""The pipeline benchmark's comparison: DuckDB's figures and the report's agree, and the
check notices when they do not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from purgatory_report.cli import main

pytestmark = pytest.mark.spark


def test_duckdb_and_the_report_agree_on_both_formats(spark: Any, tmp_path: Path) -> None:
    from bench.pipeline import disagreements, duckdb_figures, generate, to_json_lines

    log = tmp_path / "events"
    generate(log, 20_000, seed=3, rate=2_000.0)
    out = tmp_path / "report"
    assert main([str(log), "--out", str(out)], spark=spark) == 0
    _, parquet = duckdb_figures(log, "parquet")
    assert disagreements(out, parquet) == []
    to_json_lines(log, tmp_path / "jsonl")
    _, jsonl = duckdb_figures(tmp_path / "jsonl", "jsonl")
    assert jsonl["groups"] == parquet["groups"]
    assert jsonl["keys"] == parquet["keys"]
    summary = json.loads((out / "summary.json").read_text())
    summary[0]["expired"] += 1
    (out / "summary.json").write_text(json.dumps(summary))
    assert any("expired" in problem for problem in disagreements(out, parquet))
