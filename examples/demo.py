"""`make demo`: the produce/fetch simulator feeding the Spark report.

1. Runs the mini Kafka broker simulator in virtual time with faults injected
   (a slow follower, a dead follower, a silent consumer, a producer burst), writing
   the purgatories' operation event log as Parquet.
2. Runs the PySpark report over that log on an embedded ``local[*]`` Spark.
3. Prints the headline figures, the report's key findings and where the full report is.

Usage: ``python -m examples.demo [--out DIR] [--duration SECONDS] [--seed N] [--master URL]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _run(step: str, argv: list[str]) -> None:
    print(f"\n== {step}\n   $ {' '.join(argv)}", flush=True)
    started = time.monotonic()
    result = subprocess.run(argv, check=False)
    if result.returncode != 0:
        raise SystemExit(f"demo: {step} failed (exit code {result.returncode})")
    print(f"   ({time.monotonic() - started:.1f} s)", flush=True)


def _fmt_seconds(value: Any) -> str:
    if value is None:
        return "-"
    return f"{float(value) * 1000:.1f} ms"


def _fmt_ratio(value: Any) -> str:
    # Null where no operation of the group completed or expired.
    return "-" if value is None else f"{float(value) * 100:.1f}%"


def _headlines(report_dir: Path) -> None:
    summary = json.loads((report_dir / "summary.json").read_text())
    print("\n== Headline figures (from the Spark report)")
    header = f"{'purgatory':<16}{'op_type':<22}{'count':>9}{'expired':>9}{'expiry':>8}"
    header += f"{'lat p50':>11}{'lat p99':>11}{'late p99':>11}"
    print(header)
    print("-" * len(header))
    for row in summary:
        print(
            f"{row['purgatory']:<16}{row['op_type']:<22}{row['count']:>9,}{row['expired']:>9,}"
            f"{_fmt_ratio(row['expiry_ratio']):>8}{_fmt_seconds(row['latency_p50']):>11}"
            f"{_fmt_seconds(row['latency_p99']):>11}{_fmt_seconds(row['lateness_p99']):>11}"
        )
    print(
        "\nlat = creation to settlement; late = settlement past the deadline, for expired\n"
        "operations. The simulation ran in virtual time: its ManualClock jumps straight to\n"
        "each deadline and runs what is due there, so expirations are never late (0.0 ms).\n"
        "Real lateness (event-loop delay) shows in a real-time run: purgatory-sim without\n"
        "--virtual-time, or `make bench` (W4)."
    )


def _findings(report_dir: Path) -> None:
    """The report's own key findings (its opening section), as report.md words them."""
    text = (report_dir / "report.md").read_text(encoding="utf-8")
    section = text.split("## Key findings", 1)[-1].split("\n## ", 1)[0]
    print("\n== Key findings (from report.md; anomalies are the injected faults' traces)")
    for line in section.strip().splitlines():
        print(f"  {line.replace('`', '')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-output"))
    parser.add_argument("--duration", type=float, default=300.0, help="virtual seconds")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)

    out: Path = args.out
    events = out / "events"
    report = out / "report"
    if events.exists():
        shutil.rmtree(events)
    out.mkdir(parents=True, exist_ok=True)

    import purgatory_aio

    build = "compiled (mypyc)" if purgatory_aio.compiled else "pure Python"
    print(f"purgatory_aio {purgatory_aio.__version__}, core: {build}", flush=True)
    python = sys.executable
    _run(
        "Simulating a broker with faults (virtual time)",
        [
            python, "-m", "minikafka",
            "--virtual-time",
            "--duration", str(args.duration),
            "--seed", str(args.seed),
            "--faults", "all",
            "--events", str(events),
            "--events-format", "parquet",
            "--json", str(out / "simulation.json"),
        ],
    )  # fmt: skip
    _run(
        f"Spark report over the event log ({args.master})",
        [
            python, "-m", "purgatory_report.cli",
            str(events), "--out", str(report), "--master", args.master,
        ],
    )  # fmt: skip
    _headlines(report)
    _findings(report)
    print(f"\nFull report: {report / 'report.md'}")
    print(f"Simulation report: {out / 'simulation.json'}; event log: {events}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
