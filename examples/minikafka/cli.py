"""``purgatory-sim``: run the mini Kafka simulation and print its report."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import structlog

from .sim.config import ACKS_CHOICES, FAULTS, MAX_DURATION, SimConfig
from .sim.progress import make_progress
from .sim.simulation import run_simulation
from .sim.sinks import EVENT_FORMATS, ClosableSink, open_event_writer

PROG = "purgatory-sim"


class _Parser(argparse.ArgumentParser):
    """Reports a bad argument in one line and a hint, not after the whole usage block."""

    def error(self, message: str) -> NoReturn:
        fail(message)


def fail(*problems: str) -> NoReturn:
    """Print each problem as ``purgatory-sim: error: ...``, then where to look; exit 2."""
    for problem in problems:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
    print(f"{PROG}: see '{PROG} --help' for the options", file=sys.stderr)
    raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    defaults = SimConfig()
    parser = _Parser(
        prog=PROG,
        description=(
            "Simulate a small Kafka cluster on purgatory_aio: acks=0/1/all producers, a "
            "consumer group with long-poll fetches, follower replication, rebalances and "
            "delayed messages, with optional faults. Prints a report at the end."
        ),
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=defaults.duration,
        metavar="SECONDS",
        help=f"seconds of traffic to simulate, at most {MAX_DURATION:g} (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=defaults.seed, help="random seed (default: %(default)s)"
    )
    parser.add_argument(
        "--brokers", type=int, default=defaults.brokers, help="brokers (default: %(default)s)"
    )
    parser.add_argument(
        "--producers", type=int, default=defaults.producers, help="producers (default: %(default)s)"
    )
    parser.add_argument(
        "--consumers",
        type=int,
        default=defaults.consumers,
        help="consumers in the group (default: %(default)s)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=defaults.partitions,
        help="partitions of the topic (default: %(default)s)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=defaults.replicas,
        help="replication factor, at most --brokers (default: %(default)s)",
    )
    parser.add_argument(
        "--min-insync",
        type=int,
        default=None,
        help="min.insync.replicas (default: 2, or the replication factor if smaller)",
    )
    parser.add_argument(
        "--acks",
        choices=ACKS_CHOICES,
        default=defaults.acks,
        help="producer acks; mixed cycles producers through all, 1 and 0 (default: %(default)s)",
    )
    parser.add_argument(
        "--faults",
        type=_faults,
        default=(),
        metavar="LIST",
        help=(
            f"comma-separated faults to inject: {', '.join(FAULTS)}; or all (every fault), "
            "or none (default: none)"
        ),
    )
    parser.add_argument(
        "--virtual-time",
        action="store_true",
        help="run on a virtual clock: fast, and the same report for the same seed",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=defaults.rate,
        help="records per second per producer (default: %(default)s)",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=defaults.max_in_flight,
        help="producer max.in.flight.requests.per.connection (default: %(default)s)",
    )
    parser.add_argument(
        "--idempotence",
        action="store_true",
        help="idempotent producers: the brokers drop retried batches they already have",
    )
    parser.add_argument(
        "--events",
        type=Path,
        metavar="DIR",
        help=(
            "write the operation event log of every purgatory into DIR "
            "(created if missing; its parent directory must exist)"
        ),
    )
    parser.add_argument(
        "--events-format",
        choices=EVENT_FORMATS,
        default="jsonl",
        help="event log format (default: %(default)s; parquet needs pyarrow)",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the report as JSON to the file PATH (its directory must exist)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress display")
    parser.add_argument(
        "--verbose",
        "-v",
        action="count",
        default=0,
        help="log more: -v for info (ISR changes, rebalances, faults), -vv for debug",
    )
    return parser


def _faults(text: str) -> tuple[str, ...]:
    names = [name.strip() for name in text.split(",")]
    if not any(names):
        raise argparse.ArgumentTypeError(
            f"empty; give a list of faults ({', '.join(FAULTS)}), all, or none"
        )
    if "" in names:
        raise argparse.ArgumentTypeError(f"{text!r} has an empty name between commas")
    unknown = [name for name in names if name not in (*FAULTS, "all", "none")]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown fault {', '.join(unknown)}; choose from {', '.join(FAULTS)}, all, none"
        )
    if "none" in names:
        if len(set(names)) > 1:
            raise argparse.ArgumentTypeError("none cannot be combined with faults")
        return ()
    if "all" in names:
        return FAULTS
    return tuple(dict.fromkeys(names))


def output_path_problems(json_text: str | None, events_dir: Path | None) -> list[str]:
    """Why the output paths cannot be written, found before any simulation work.

    A report file's directory must exist (a typo in it should not silently create a
    tree); an event-log directory is created if missing, but its parent must exist.
    """
    found: list[str] = []
    if json_text is not None:
        # Checked on the text: Path() drops the trailing slash that says "a directory".
        json_path = Path(json_text)
        if json_text.endswith(("/", os.sep)) or json_path.is_dir():
            found.append(f"--json {json_text} is a directory; give a file, e.g. {json_path}/r.json")
        else:
            found.extend(_writable("--json", json_path, "file"))
    if events_dir is not None:
        if events_dir.exists() and not events_dir.is_dir():
            found.append(f"--events {events_dir} exists and is not a directory")
        elif not events_dir.exists():
            found.extend(_writable("--events", events_dir, "directory"))
        elif not os.access(events_dir, os.W_OK | os.X_OK):
            found.append(f"--events {events_dir}: the directory is not writable")
    return found


def _writable(option: str, path: Path, kind: str) -> list[str]:
    parent = path.parent
    if not parent.is_dir():
        return [f"{option} {path}: the directory {parent} does not exist (create it first)"]
    if path.exists():
        if not os.access(path, os.W_OK):
            return [f"{option} {path}: the {kind} is not writable"]
    elif not os.access(parent, os.W_OK | os.X_OK):
        return [f"{option} {path}: cannot create a {kind} in {parent} (not writable)"]
    return []


def configure_logging(verbosity: int) -> None:
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbosity, 2)]
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = SimConfig(
        duration=args.duration,
        seed=args.seed,
        brokers=args.brokers,
        producers=args.producers,
        consumers=args.consumers,
        partitions=args.partitions,
        replicas=args.replicas,
        min_insync=args.min_insync,
        acks=args.acks,
        faults=args.faults,
        virtual_time=args.virtual_time,
        rate=args.rate,
        max_in_flight=args.max_in_flight,
        idempotence=args.idempotence,
    )
    problems = config.problems() + output_path_problems(args.json, args.events)
    if problems:
        fail(*problems)
    configure_logging(args.verbose)

    sink: ClosableSink | None = None
    if args.events is not None:
        try:
            sink = open_event_writer(args.events, args.events_format)
        except (RuntimeError, OSError) as exc:
            fail(str(exc))
    progress = make_progress(config.duration, enabled=not args.quiet)
    try:
        report = run_simulation(config, event_sink=sink, progress=progress.update)
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    finally:
        progress.close()
        if sink is not None:
            sink.close()

    print(report.render(), flush=True)
    if args.json is not None:
        try:
            Path(args.json).write_text(report.to_json() + "\n", encoding="utf-8")
        except OSError as exc:
            print(f"{PROG}: error: cannot write {args.json}: {exc}", file=sys.stderr)
            return 1
    if args.events is not None:
        print(f"event log written to {args.events}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
