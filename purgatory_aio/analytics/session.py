"""Creating a quiet SparkSession that works alone and under ``spark-submit``."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from purgatory_aio.analytics.errors import (
    JAVA_MISSING,
    ReportError,
    describe_spark_error,
    missing_dependency,
)

try:
    from pyspark.sql import SparkSession
except ImportError as exc:
    raise missing_dependency(exc) from exc

APP_NAME = "purgatory-report"
DEFAULT_MASTER = "local[*]"
LOG_LEVEL = "ERROR"

#: log4j2 settings for a JVM this module starts (errors only, on stderr).
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")

#: Address an embedded (``local``) Spark binds: nothing listens beyond this machine.
LOOPBACK = "127.0.0.1"


def under_spark_submit() -> bool:
    """True when this Python process was started by ``spark-submit`` (its JVM is waiting)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def find_java() -> str | None:
    """The ``java`` executable Spark would launch, or ``None``.

    Spark's launcher uses ``$JAVA_HOME/bin/java`` when ``JAVA_HOME`` is set, and
    ``java`` from ``PATH`` otherwise.
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        return str(candidate) if os.access(candidate, os.X_OK) else None
    return shutil.which("java")


def check_java() -> None:
    """Raise :class:`ReportError` with install advice when no Java runtime is found."""
    if under_spark_submit():
        return
    if find_java() is None:
        java_home = os.environ.get("JAVA_HOME")
        if java_home:
            raise ReportError(f"JAVA_HOME={java_home} holds no bin/java. {JAVA_MISSING}")
        raise ReportError(JAVA_MISSING)


_MASTER_URL = re.compile(
    r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[.+\]|yarn|(spark|k8s|mesos)://.+"
)


def check_master(master: str) -> None:
    """Reject a master URL Spark cannot parse, before its JVM dies on it noisily.

    Raises:
        ReportError: ``master`` is not a Spark master URL.
    """
    if _MASTER_URL.fullmatch(master) is None:
        raise ReportError(
            f"not a Spark master URL: {master!r} (expected local[N], local[*], "
            "spark://HOST:PORT, yarn, k8s://URL, ...)"
        )


def local_defaults(master: str) -> dict[str, str]:
    """Settings for a single-machine run: few shuffle partitions, no web UI.

    Args:
        master: A Spark master URL; only ``local``, ``local[N]`` and ``local[*]`` get defaults.
    """
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if match is None:
        return {}
    threads = match.group(1)
    if threads is None:
        cores = 1
    elif threads == "*":
        cores = os.cpu_count() or 1
    else:
        cores = int(threads)
    return {
        # An embedded run serves nobody else: bind the driver (block manager, RPC) to
        # loopback instead of the address the host name resolves to.
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        # The default of 200 partitions costs more in task overhead than the
        # aggregations it splits: the report's grouped tables are small.
        "spark.sql.shuffle.partitions": str(max(2, 2 * cores)),
        "spark.default.parallelism": str(max(2, 2 * cores)),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }


def create_session(
    master: str | None = None, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """Start (or join) the SparkSession for a report run.

    Under ``spark-submit`` the master and settings given to ``spark-submit``
    stand unless ``master`` is passed; otherwise the default master is
    ``local[*]``. Local masters get :func:`local_defaults` below ``conf``.

    Args:
        master: Spark master URL, or ``None`` for the default.
        conf: Extra Spark settings (``spark.driver.memory`` and the like work
            only when this call starts the JVM).

    Raises:
        ReportError: No Java runtime, or the JVM failed to start.
    """
    if master is not None:
        check_master(master)
    check_java()
    settings: dict[str, str] = {
        # The report's wide aggregation trips the plan-printing limit and its warning.
        "spark.sql.debug.maxToStringFields": "1000",
    }
    effective = master or (None if under_spark_submit() else DEFAULT_MASTER)
    if effective is not None:
        settings.update(local_defaults(effective))
    if not under_spark_submit():
        # The command prints its own one-line result; a progress bar would interleave.
        settings["spark.ui.showConsoleProgress"] = "false"
        # Read before any log line: setLogLevel below comes too late for start-up warnings.
        settings["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"
        if effective is not None and _is_local(effective):
            # Spark picks its address before reading settings; this also silences
            # its "resolves to a loopback address" warning.
            os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    settings.update(conf or {})
    builder = SparkSession.builder.appName(APP_NAME)
    if effective is not None:
        builder = builder.master(effective)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        reason = describe_spark_error(exc)
        raise ReportError(f"cannot start Spark (check --master and --conf): {reason}") from exc
    context = spark.sparkContext
    context.setLogLevel(LOG_LEVEL)
    running_master = str(context.master)
    if running_master.startswith("local"):
        given = context.getConf()
        for key, value in local_defaults(running_master).items():
            # spark-submit's own master skipped them above; runtime SQL settings still apply.
            if key.startswith("spark.sql.") and not given.contains(key):
                spark.conf.set(key, value)
    _silence_task_failure_logs(spark)
    if not running_master.startswith("local"):
        check_worker_python(spark)
    return spark


def _is_local(master: str) -> bool:
    return re.fullmatch(r"local(\[.*\])?", master) is not None


def check_worker_python(spark: SparkSession) -> None:
    """Run one tiny Python task on the cluster: fail early, in one line, when workers
    cannot run this driver's Python (another minor version, a missing interpreter).

    Raises:
        ReportError: The workers' Python differs from the driver's or does not start.
    """
    driver = f"{sys.version_info.major}.{sys.version_info.minor}"
    try:
        found = spark.sparkContext.parallelize([0], 1).map(_python_version).collect()
    except Exception as exc:
        reason = describe_spark_error(exc)
        configured = os.environ.get("PYSPARK_PYTHON", "python3 (PYSPARK_PYTHON unset)")
        mismatch = re.search(r"different version \S+ \S+ than that in driver \S+", reason)
        if "PYTHON_VERSION_MISMATCH" in reason or mismatch:
            raise ReportError(
                f"Python version mismatch: the workers run another Python than the driver's "
                f"{driver} (PYSPARK_PYTHON={configured}); install Python {driver} on every "
                "worker and set PYSPARK_PYTHON to its absolute path"
            ) from exc
        raise ReportError(
            f"the Spark workers cannot run Python {driver} (PYSPARK_PYTHON={configured}): "
            f"{reason}; set PYSPARK_PYTHON to an absolute path valid on every worker"
        ) from exc
    if found and found[0] != driver:
        raise ReportError(
            f"Python version mismatch: driver {driver}, workers {found[0]}; "
            "set PYSPARK_PYTHON to an absolute path of Python " + driver + " on every worker"
        )


def _python_version(_: object) -> str:
    import sys as worker_sys

    return f"{worker_sys.version_info.major}.{worker_sys.version_info.minor}"


def _silence_task_failure_logs(spark: SparkSession) -> None:
    """A failed task fails the run, which reports it as one line itself.

    Without this, the executor's stack trace (logged at ERROR) would bury that line.
    """
    jvm = spark.sparkContext._jvm
    if jvm is None:
        return
    try:
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        fatal = jvm.org.apache.logging.log4j.Level.FATAL
        for name in ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler"):
            configurator.setLevel(name, fatal)
    except Exception:  # logging is cosmetic; a different log4j must not stop the report
        return
