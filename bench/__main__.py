"""``python -m bench``: run the benchmark workloads (docs/benchmarks.md) and report.

python -m bench all [--quick] [--loop asyncio|uvloop|both]
python -m bench w1 --n 1000000 --rate 0
python -m bench w5 [--quick]      # 500k parked operations: loop stalls and full GCs
python -m bench w5 --leak 1000000 # memory held over 1M operations (tracemalloc)
python -m bench report            # SUMMARY.md and charts from existing records
python -m bench http ...          # bench.http, handler/HTTP benchmarks
python -m bench pipeline ...      # bench.pipeline, event-log pipeline benchmarks
python -m bench fanout [--quick]  # bench.fanout, completion across processes, Redis, PostgreSQL
python -m bench kafka [--quick]   # bench.kafka, real Kafka clients against purgatory-broker
python -m bench opshape [--quick] # bench.opshape, the cost of an operation class's shape
python -m bench streams [--quick] # bench.streams, a value stream's cost per delivered value
python -m bench w1-cost           # bench.w1_cost, W1-user's instructions per operation (valgrind)
python -m bench calls             # bench.calls, the calls of one admission and one completion
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from . import memory, report, sweep, w1, w2, w3, w4, w5
from ._common import RESULTS_DIR, Progress, Record, mark_quick, quiet_logs, resolve_loops

# Subcommands whose module another engineer owns: imported only when asked for.
DELEGATED = {
    "http": ("bench.http", "HTTP and request-handler benchmarks (naive-handler vs purgatory)"),
    "pipeline": ("bench.pipeline", "event-log pipeline benchmarks"),
    "fanout": (
        "bench.fanout",
        "cross-process completion through Redis and PostgreSQL vs broadcaster",
    ),
    "kafka": (
        "bench.kafka",
        "librdkafka clients against purgatory-broker (acks=1/all, idempotent)",
    ),
    "opshape": ("bench.opshape", "what the shape of a user's operation class costs"),
    "streams": ("bench.streams", "Fanout.stream's cost per delivered value vs a loop of waits"),
    "w1-cost": ("bench.w1_cost", "where W1-user's instructions go (callgrind, deterministic)"),
    "calls": ("bench.calls", "the calls of one admission and one completion (pure build)"),
}
SUITE = ("w1", "w1-user", "w1-check", "w2", "w3", "w4", "w5", "memory", "sweep")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop", "both"),
        default="both",
        help="event loop(s) to run on (default both)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--seed", type=int, default=1, help="seed of every generated schedule")
    parser.add_argument(
        "--results-dir", type=Path, default=RESULTS_DIR, help="where records and the summary go"
    )
    parser.add_argument(
        "--no-report", action="store_true", help="do not regenerate SUMMARY.md and charts"
    )
    parser.add_argument("--plain", action="store_true", help="plain progress lines, no rich")


_WORKLOADS: tuple[tuple[str, str, Callable[[argparse.ArgumentParser], None]], ...] = (
    (
        "w1",
        "purgatory throughput, completion by force_complete",
        lambda p: w1.add_arguments(p, check=False),
    ),
    (
        "w1-user",
        "W1 with a user-style operation class (no __slots__), against Kafka's Java figure",
        lambda p: w1.add_arguments(p, check=False),
    ),
    (
        "w1-check",
        "W1 with completion through check_and_complete(key)",
        lambda p: w1.add_arguments(p, check=True),
    ),
    ("w2", "hot key: watch list vs threshold index vs naive", w2.add_arguments),
    ("w3", "timer core: Timer vs loop.call_later at 1k..1M pending", w3.add_arguments),
    ("w4", "expiration accuracy and idle wake-ups", w4.add_arguments),
    ("w5", "500k parked operations: loop stalls, full GCs (child per contender)", w5.add_arguments),
    ("memory", "bytes per pending operation (subprocess per size)", memory.add_arguments),
    ("sweep", "highest W1 rate with expiry p99 < 5 ms", sweep.add_arguments),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="purgatory_aio benchmarks (docs/benchmarks.md). Every workload runs the "
        "library and its comparison in one process on one seeded schedule, on asyncio and "
        "uvloop, and writes a JSON record under bench/results/.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    _common(sub.add_parser("all", help="every workload below, then report"))
    for name, help_text, add_arguments in _WORKLOADS:
        p = sub.add_parser(name, help=help_text)
        _common(p)
        add_arguments(p)
    p = sub.add_parser("report", help="regenerate SUMMARY.md and charts from the records")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    p.add_argument("--plain", action="store_true")
    for name, (_, help_text) in DELEGATED.items():
        sub.add_parser(name, help=f"{help_text} (arguments passed through)", add_help=False)
    return parser


def run_workload(name: str, args: argparse.Namespace, progress: Progress) -> list[Record]:
    loops = resolve_loops(args.loop, progress)
    out: Path | None = args.results_dir
    runners: dict[str, Callable[[], list[Record]]] = {
        "w1": lambda: w1.run(w1.params_from_args(args, check=False), loops, progress, out),
        "w1-user": lambda: w1.run(
            w1.params_from_args(args, check=False, user=True), loops, progress, out
        ),
        "w1-check": lambda: w1.run(w1.params_from_args(args, check=True), loops, progress, out),
        "w2": lambda: w2.run(w2.params_from_args(args), loops, progress, out),
        "w3": lambda: w3.run(w3.params_from_args(args), loops, progress, out),
        "w4": lambda: w4.run(w4.params_from_args(args), loops, progress, out),
        "w5": lambda: (
            w5.run(w5.params_from_args(args), loops, progress, out)
            if args.leak is None
            else w5.run_leak(args.leak, w5.params_from_args(args), loops, progress)
        ),
        "memory": lambda: memory.run(memory.params_from_args(args), loops, progress, out),
        "sweep": lambda: sweep.run(sweep.params_from_args(args), loops, progress, out),
    }
    return runners[name]()


def _delegate(command: str, argv: list[str]) -> int:
    module_name, _ = DELEGATED[command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            print(
                f"python -m bench {command}: {module_name} is not available in this checkout "
                f"({module_name.replace('.', '/')}.py is missing).",
                file=sys.stderr,
            )
            return 2
        print(
            f"python -m bench {command}: {module_name} needs {exc.name!r}, which is not "
            "installed (try: pip install -e '.[dev]').",
            file=sys.stderr,
        )
        return 2
    entry = getattr(module, "main", None)
    if not callable(entry):
        print(f"python -m bench {command}: {module_name} has no main(argv)", file=sys.stderr)
        return 2
    result = entry(argv)
    return int(result or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        return _delegate(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_logs()
    progress = Progress(plain=args.plain)
    if args.command == "report":
        report.run(args.results_dir, progress)
        return 0
    mark_quick(args.quick)
    started = time.monotonic()
    names = list(SUITE) if args.command == "all" else [args.command]
    failed = []
    for name in names:
        if args.command == "all":
            # Each workload's own defaults, with the flags given to `all`.
            flags = ["--loop", args.loop, "--seed", str(args.seed)]
            flags += ["--results-dir", str(args.results_dir)]
            flags += ["--quick"] * args.quick + ["--plain"] * args.plain
            sub_args = parser.parse_args([name, *flags])
        else:
            sub_args = args
        try:
            run_workload(name, sub_args, progress)
        except Exception:
            if args.command != "all":
                raise
            failed.append(name)
            progress.info(f"{name} failed:\n{traceback.format_exc()}")
    if not args.no_report:
        report.run(args.results_dir, progress)
    progress.info(f"done in {time.monotonic() - started:.0f} s")
    if failed:
        progress.info(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
