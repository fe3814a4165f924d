"""``purgatory-report``: the event log report as a command.

Usage::

    purgatory-report EVENTS_DIR --out REPORT_DIR [--master URL] [--top-keys N]
                     [--since TIME] [--until TIME] [--strict] [--conf KEY=VALUE ...]

It also runs under ``spark-submit``, which then chooses the master::

    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/spark-submit \\
        --master spark://HOST:7077 report/purgatory_report/cli.py EVENTS_DIR --out REPORT_DIR

Exit status: 0 on success, 1 on bad input, a data quality problem under
``--strict`` or a failed Spark job (one line on stderr says why), 2 on bad usage.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a file (spark-submit): the modules beside this one must not shadow top-level ones.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _here]

import argparse
import importlib
import importlib.util
import logging
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from purgatory_report.errors import SPARK_MISSING, ReportError, describe_spark_error

if TYPE_CHECKING:
    from pyspark.sql import SparkSession as Session

    from purgatory_report.staging import Staging

PROG = "purgatory-report"


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Report on a purgatory_aio operation event log (Parquet and JSON Lines files) "
            "with PySpark: outcomes, latency and lateness percentiles, throughput, hot keys "
            "and a timeout what-if."
        ),
    )
    parser.add_argument("events_dir", metavar="EVENTS_DIR", help="event log directory")
    parser.add_argument("--out", required=True, metavar="REPORT_DIR", help="report directory")
    parser.add_argument(
        "--master",
        default=None,
        metavar="URL",
        help="Spark master (default: local[*], or the one given to spark-submit)",
    )
    parser.add_argument(
        "--top-keys",
        type=int,
        default=20,
        metavar="N",
        help="hot keys listed per purgatory/op_type (default: 20)",
    )
    parser.add_argument(
        "--since",
        metavar="TIME",
        help="only operations settled at or after TIME (ISO date/time, UTC by default, "
        "or epoch seconds); earlier date=/hour= partitions are not read",
    )
    parser.add_argument(
        "--until",
        metavar="TIME",
        help="only operations settled before TIME (same forms and pruning as --since)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1) on duplicates, implausible records or records the writers dropped",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting, e.g. spark.driver.memory=4g (repeatable)",
    )
    return parser


def main(argv: Sequence[str] | None = None, *, spark: Session | None = None) -> int:
    """Run the report command.

    Args:
        argv: Arguments without the program name; ``None`` reads ``sys.argv``.
        spark: A session to use instead of starting one; it is left running.

    Returns:
        The exit status.
    """
    try:
        return _main(argv, spark)
    finally:
        _keep_class_archive()


def _keep_class_archive() -> None:
    """After the result is out: the first local run on a machine waits here while its
    JVM writes the class archive that later runs start from (an interrupt skips it)."""
    session = sys.modules.get("purgatory_report.session")
    if session is None or not session.class_archive_pending():
        return
    if sys.stderr.isatty():
        print(
            f"{PROG}: keeping the classes Spark loaded, for faster starts "
            f"(once; {session.CLASS_CACHE_ENV}=off skips it)",
            file=sys.stderr,
        )
    try:
        session.save_class_archive()
    except KeyboardInterrupt:  # what the JVM leaves half-written is removed later
        return


def _main(argv: Sequence[str] | None, spark: Session | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    conf: dict[str, str] = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.print_usage(sys.stderr)
            return _fail(f"--conf expects KEY=VALUE, got {item!r}", status=2)
        conf[key.strip()] = value
    if args.top_keys < 1:
        return _fail(f"--top-keys must be at least 1, got {args.top_keys}", status=2)

    try:
        from pyspark.sql import SparkSession

        from purgatory_report import inputs, output, session
        from purgatory_report import staging as _staging  # noqa: F401 - names a missing numpy

        if importlib.util.find_spec("matplotlib") is None:  # imported below, on a thread
            raise ImportError("no module named 'matplotlib'", name="matplotlib")
    except ImportError as exc:
        return _fail(_missing(exc))
    # The report's own modules (matplotlib above all: 1-2 s) load on a thread while the
    # JVM starts, which mostly waits on its own process.
    loading = ThreadPoolExecutor(1, thread_name_prefix="purgatory-report-import")
    report_module = loading.submit(importlib.import_module, "purgatory_report.report")
    loading.shutdown(wait=False)

    # py4j logs a dying JVM's broken connection with a traceback (some of it through the
    # root logger); the one line below says what happened instead.
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    root = logging.getLogger()
    if _from_py4j not in root.filters:
        root.addFilter(_from_py4j)
    # PySpark warns again when it stops a context whose JVM is gone (also at exit).
    warnings.filterwarnings("ignore", message=_UNCLEAN_SHUTDOWN, category=RuntimeWarning)
    # A session already running in this process (a notebook, a test) is borrowed, not stopped.
    own_session = spark is None and SparkSession.getActiveSession() is None
    heap: str | None = None
    json_staging: Staging | None = None
    try:
        since = None if args.since is None else inputs.parse_time(args.since)
        until = None if args.until is None else inputs.parse_time(args.until)
        window = inputs.TimeRange(since, until)
        # Bad input and an unusable output are reported before paying for a JVM start.
        output.check_local_target(args.out)
        files = inputs.preflight(args.events_dir, window)
        if spark is None and files is not None and files.json:
            # Arrow parses the JSON Lines while the JVM starts (see staging.Staging).
            json_staging = _begin_staging(args.master, conf, files.json)
        if spark is None:
            spark = session.create_session(
                args.master, conf, class_archive=session.class_archive_dir()
            )
        heap = session.driver_memory(spark)
        try:
            try:
                report = report_module.result()
            except ImportError as exc:
                raise ReportError(_missing(exc)) from None
            result = report.run(
                args.events_dir,
                args.out,
                spark=spark,
                top_keys=args.top_keys,
                since=since,
                until=until,
                strict=args.strict,
                json_staging=json_staging,
            )
        finally:
            if own_session:
                _stop(spark)
    except ReportError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _fail("interrupted", status=130)
    except Exception as exc:
        # A JVM that died (out of memory, killed) surfaces as any error at all, a
        # ConnectionRefusedError from py4j among them: ask the JVM before the error.
        if heap is not None and (failure := session.jvm_failure(heap)):
            return _fail(failure)
        if heap is not None and "OutOfMemoryError" in _describe(exc):
            return _fail(session.out_of_memory_message(heap))
        if isinstance(exc, OSError) and not _is_spark_error(exc):
            return _fail(f"cannot write the report: {exc}")
        if not _is_spark_error(exc):
            raise
        return _fail(f"Spark job failed: {describe_spark_error(exc)}")
    finally:
        if json_staging is not None:
            json_staging.close()
    if own_session:
        session.release_jvm()  # its exit overlaps this process's own
    print(f"{PROG}: {result.events:,} events, report in {result.markdown}")
    for problem in result.quality.problems():
        print(f"{PROG}: warning: {problem} (see the Data quality section)", file=sys.stderr)
    return 0


def _begin_staging(master: str | None, conf: dict[str, str], paths: list[str]) -> Staging | None:
    """Local JSON Lines parsed by Arrow from now on when Spark will run on this machine."""
    from purgatory_report import inputs, session, staging

    reader = conf.get(staging.JSON_READER_CONF, "arrow")
    if master is None and session.under_spark_submit():
        staging.reader_choice(reader)  # a bad value still fails before the JVM starts
        return None  # spark-submit's master is only known once the session runs
    cores, _ = staging.arrow_workers(reader, master or session.DEFAULT_MASTER)
    if cores is None:
        return None
    return staging.Staging(paths, cores, inputs.REQUIRED, conf.get("spark.local.dir"))


_UNCLEAN_SHUTDOWN = "Unable to cleanly shutdown Spark JVM process"


def _stop(spark: Session) -> None:
    """Stop a session this command started; a dead JVM has nothing left to stop."""
    from purgatory_report import session

    try:
        session.stop_session(spark)
    except Exception:  # the run's own error (or the JVM's death) is what gets reported
        return


def _from_py4j(record: logging.LogRecord) -> bool:
    """Logging filter: False (drop) for what py4j logs on the root logger."""
    return f"{os.sep}py4j{os.sep}" not in record.pathname


def _describe(exc: BaseException) -> str:
    try:
        return describe_spark_error(exc) if _is_spark_error(exc) else str(exc)
    except Exception:  # a dead gateway cannot describe its own exceptions
        return str(exc)


def _is_spark_error(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.startswith(("pyspark", "py4j"))


def _missing(exc: ImportError) -> str:
    return str(exc) if SPARK_MISSING in str(exc) else f"{SPARK_MISSING} ({exc})"


def _fail(message: str, *, status: int = 1) -> int:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
