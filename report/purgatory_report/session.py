"""Creating a quiet SparkSession that works alone and under ``spark-submit``."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from purgatory_report.errors import (
    JAVA_MISSING,
    ReportError,
    describe_spark_error,
    missing_dependency,
)

try:
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession
except ImportError as exc:
    raise missing_dependency(exc) from exc

APP_NAME = "purgatory-report"
DEFAULT_MASTER = "local[*]"
LOG_LEVEL = "ERROR"

#: log4j2 settings for a JVM this module starts (errors only, on stderr).
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")

#: Garbage collector of an embedded (``local``) run's JVM.
LOCAL_GC = "-XX:+UseParallelGC"

#: When an embedded run's JVM compiles a method with its optimizing compiler (C2): after
#: 50,000 calls, 60,000 calls and loop iterations together, or 100,000 iterations of one
#: loop (by default 5,000, 15,000 and 40,000). A report is a short run on few cores,
#: where C2 took a core for half of it compiling code soon done with (each pass's own
#: generated classes); until then the quick compiler's code runs. 10M-event Parquet
#: report, local[2], runs alternated in one hour: 19.2 s on average of four against 22.5
#: with the defaults (C2: 6.9 s of CPU against 10.2); with the loop threshold left at its
#: default 20.4 s, raised to 500,000 20.3 s.
LOCAL_JIT = (
    "-XX:Tier4InvocationThreshold=50000",
    "-XX:Tier4CompileThreshold=60000",
    "-XX:Tier4BackEdgeThreshold=100000",
)

#: Address an embedded (``local``) Spark binds: nothing listens beyond this machine.
LOOPBACK = "127.0.0.1"


#: Environment variable naming the directory of the class-data archive of a local run
#: (:func:`class_archive_dir`); ``off`` writes and uses none.
CLASS_CACHE_ENV = "PURGATORY_REPORT_CLASS_CACHE"

#: An archive being written that is older than this (seconds) was left by a JVM that died.
STALE_ARCHIVE_SECONDS = 3600.0


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


def machine_memory() -> int:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


#: Driver heap of a local run: a quarter of the memory, within these bounds (GiB).
#: The JVM only commits what it uses; the report spills to disk beyond the heap.
DRIVER_MEMORY_GB = (1, 8)


def local_driver_memory() -> str:
    """``spark.driver.memory`` for a local run on this machine, e.g. ``"6g"``."""
    low, high = DRIVER_MEMORY_GB
    return f"{max(low, min(high, machine_memory() // 4 // 2**30))}g"


def local_cores(master: str) -> int | None:
    """Worker threads of a ``local`` master URL, or ``None`` for any other master."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if match is None:
        return None
    threads = match.group(1)
    if threads is None:
        return 1
    if threads == "*":
        return os.cpu_count() or 1
    return int(threads)


def local_defaults(master: str) -> dict[str, str]:
    """Settings for a single-machine run, derived from the machine; ``--conf`` overrides each.

    Args:
        master: A Spark master URL; only ``local``, ``local[N]`` and ``local[*]`` get defaults.
    """
    cores = local_cores(master)
    if cores is None:
        return {}
    return {
        # An embedded run serves nobody else: bind the driver (block manager, RPC) to
        # loopback instead of the address the host name resolves to.
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        # Spark's own default is 1 GB whatever the machine; the report spills what does
        # not fit, so this is speed (fewer spills), not whether it finishes.
        "spark.driver.memory": local_driver_memory(),
        # The default of 200 partitions costs more in task overhead than the
        # aggregations it splits; 4 per core keeps each task's share of a large log's
        # shuffle small (less to spill), and Spark's adaptive execution (on by default)
        # merges them again on small ones.
        "spark.sql.shuffle.partitions": str(max(4, 4 * cores)),
        "spark.default.parallelism": str(max(2, 2 * cores)),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }


#: Settings the report's run section states, with what they mean.
RUN_SETTINGS = {
    "spark.master": "master",
    "spark.driver.memory": "driver heap",
    "spark.sql.shuffle.partitions": "shuffle partitions",
}


def describe_run(spark: SparkSession) -> dict[str, str]:
    """What the report's run section says about the session: Spark version, master,
    heap and shuffle partitions, whether those are this machine's defaults, and the
    class archive its JVM started from or writes (see :func:`class_archive_options`)."""
    conf = spark.sparkContext.getConf()
    found = {
        "spark": str(spark.version),
        **{label: str(conf.get(key, "")) for key, label in RUN_SETTINGS.items()},
    }
    found["shuffle partitions"] = str(spark.conf.get("spark.sql.shuffle.partitions"))
    options = str(conf.get("spark.driver.extraJavaOptions", ""))
    for flag, state in (("SharedArchiveFile", "started from"), ("ArchiveClassesAtExit", "writes")):
        if (archive := _archive_option(options, flag)) is not None:
            # The one being written gets its final name when complete.
            path = re.sub(r"[.]\d+[.]tmp$", "", archive[1])
            found["JVM class archive"] = f"{state} {path}"
    if not found["driver heap"]:
        found["driver heap"] = "1g (Spark's default)"
    cores = local_cores(found["master"])
    if cores is not None:
        defaults = local_defaults(found["master"])
        chosen = [
            label
            for key, label in RUN_SETTINGS.items()
            if key in defaults and found[label] == defaults[key]
        ]
        if chosen:
            found["defaults"] = (
                f"{' and '.join(chosen)} derived from this machine ({cores} cores, "
                f"{machine_memory() / 2**30:.0f} GiB); override with --conf KEY=VALUE"
            )
    return found


def class_archive_dir() -> Path | None:
    """Where a local run keeps the archive of the classes its JVM loads, or ``None`` (off).

    ``$PURGATORY_REPORT_CLASS_CACHE`` when set (``off`` for none), else
    ``$XDG_CACHE_HOME/purgatory-aio/spark-classes`` (``~/.cache/...``).
    """
    chosen = os.environ.get(CLASS_CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "no", "false") else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            home = Path.home()
        except RuntimeError:  # no home directory at all (Python 3.12+ raises)
            return None
        base = str(home / ".cache")
    directory = Path(base) / "purgatory-aio" / "spark-classes"
    # A home Python cannot find comes back as "~": never an archive relative to the cwd.
    return directory if directory.is_absolute() else None


def class_archive_path(directory: Path) -> Path | None:
    """The archive for this Java runtime and these Spark jars, or ``None`` without Java."""
    java = find_java()
    if java is None:
        return None
    import pyspark

    identity = hashlib.sha256()
    for path in (Path(java).resolve(), Path(pyspark.__file__).resolve().parent / "jars"):
        try:
            stat = path.stat()
        except OSError:
            return None
        identity.update(f"{path}\0{stat.st_mtime_ns}\0{stat.st_size}\0".encode())
    version = re.sub(r"[^0-9A-Za-z.]", "_", str(pyspark.__version__))
    return directory / f"spark-{version}-{identity.hexdigest()[:16]}.jsa"


#: Options of every JVM given a class archive: an old Java ignores what it does not know,
#: and the archive's own messages stay off the user's terminal.
_QUIET_ARCHIVE = ("-XX:+IgnoreUnrecognizedVMOptions", "-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def archive_maps(archive: Path) -> bool:
    """Whether a JVM starts with ``archive`` mapped: False for a truncated or damaged one
    (e.g. written onto a full disk), which would crash every JVM given it."""
    java = find_java()
    if java is None:
        return False
    command = [
        java, *_QUIET_ARCHIVE, "-XX:-CreateCoredumpOnCrash", f"-XX:ErrorFile={os.devnull}",
        f"-XX:SharedArchiveFile={archive}", "-version",
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _archive_option(options: str, flag: str) -> re.Match[str] | None:
    """``-XX:<flag>=PATH`` among a JVM's options: the whole option, and PATH as group 1."""
    return re.search(rf"-XX:{flag}=(\S+)", options)


class _ClassArchive:
    """The archive asked of the next JVM this process starts (being written, final), and
    the one the JVM it started writes when it exits (with that JVM)."""

    requested: tuple[Path, Path] | None = None
    pending: tuple[Path, Path, subprocess.Popen[bytes]] | None = None


def class_archive_options(directory: Path | None) -> list[str]:
    """JVM options that start a local run from the archive of classes its JVM loaded
    the last time, or have this run's JVM write it when it exits (then
    :func:`save_class_archive` puts it in place).

    Java's class-data sharing maps the classes from that archive instead of reading,
    parsing and verifying them from Spark's jars again: at 10M events (Parquet,
    local[2]) the JVM starts in 2.8 s instead of 4.6 and the run takes 26.6 s instead
    of 29.2. A Java too old for dynamic archives (before 13) ignores the options; a
    stale or foreign archive is refused by the JVM, which then loads classes as usual.
    """
    _ClassArchive.requested = None
    if directory is None:
        return []
    archive = class_archive_path(directory)
    if archive is None:
        return []
    # Should an archive ever crash the JVM, its crash log goes to the temporary
    # directory, not into the directory the command was run from.
    crash_log = f"-XX:ErrorFile={Path(tempfile.gettempdir()) / 'purgatory-report-hs_err_%p.log'}"
    if re.search(r"[\s'\"]", f"{archive}{crash_log}"):
        return []  # Spark splits the JVM's options at blanks: such a path cannot be passed
    if archive.is_file():
        return [*_QUIET_ARCHIVE, crash_log, f"-XX:SharedArchiveFile={archive}"]
    try:
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        for left in directory.glob("*.jsa.*.tmp"):
            if now - left.stat().st_mtime > STALE_ARCHIVE_SECONDS:
                left.unlink(missing_ok=True)
    except OSError:  # an unwritable cache directory: run without the archive
        return []
    writing = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
    _ClassArchive.requested = (writing, archive)
    return [*_QUIET_ARCHIVE, crash_log, f"-XX:ArchiveClassesAtExit={writing}"]


def class_archive_pending() -> bool:
    """Whether a JVM this process started writes a class archive when it exits."""
    return _ClassArchive.pending is not None


def save_class_archive(wait: float = 60.0) -> bool:
    """After :meth:`SparkSession.stop`: let the JVM exit, writing the class archive
    :func:`class_archive_options` asked for, and put it in place. True when saved.

    Args:
        wait: Seconds to give the JVM to write the archive and exit.
    """
    pending, _ClassArchive.pending = _ClassArchive.pending, None
    if pending is None:
        return False
    writing, archive, process = pending
    try:
        if process.stdin is not None:
            process.stdin.close()  # Spark's gateway exits at the end of its standard input
        status = process.wait(wait)
    except (OSError, subprocess.TimeoutExpired):
        return False  # still writing: a later run removes what is left
    try:
        if status == 0 and writing.is_file() and archive_maps(writing):
            os.replace(writing, archive)
            return True
        writing.unlink(missing_ok=True)
    except OSError:
        pass
    return False


def create_session(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    class_archive: Path | None = None,
) -> SparkSession:
    """Start (or join) the SparkSession for a report run.

    Under ``spark-submit`` the master and settings given to ``spark-submit``
    stand unless ``master`` is passed; otherwise the default master is
    ``local[*]``. Local masters get :func:`local_defaults` below ``conf``.

    Args:
        master: Spark master URL, or ``None`` for the default.
        conf: Extra Spark settings (``spark.driver.memory`` and the like work
            only when this call starts the JVM).
        class_archive: Directory of the class-data archive a local JVM this call
            starts reads, or writes when it exits (see :func:`class_archive_options`;
            the caller then calls :func:`save_class_archive` after stopping the session).

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
        java_options = [f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"]
        if effective is not None and _is_local(effective):
            # The one JVM runs every task: the throughput collector suits a batch run
            # (10M-event Parquet report, local[2]: 62.5 s of JVM CPU against 69.4 with
            # the default G1).
            java_options += [LOCAL_GC, *LOCAL_JIT]
            if SparkContext._gateway is None:
                java_options += class_archive_options(class_archive)
        settings["spark.driver.extraJavaOptions"] = " ".join(java_options)
        if effective is not None and _is_local(effective):
            # Spark picks its address before reading settings; this also silences
            # its "resolves to a loopback address" warning.
            os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    settings.update(conf or {})
    if effective is not None and not under_spark_submit() and SparkContext._gateway is None:
        _launch_jvm(effective, settings)
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


#: What the JVM prints on its own at start-up that says nothing to a report's user
#: (Spark 4 loads the vector incubator module; Java warns about it on every start).
JVM_NOISE = re.compile(
    r"WARNING: Using incubator modules: .*"
    # DataSketches (the percentiles' sketches) on any Java after 11, once per JVM; it
    # uses no off-heap memory here.
    r"|Warning: Java versions > Java 11 can only operate in restricted mode where no "
    r"off-heap operations are allowed!"
)

#: Exit status of a Spark JVM that ran out of memory (Spark's ``SparkExitCode.OOM``).
OOM_EXIT_STATUS = 52


class _Jvm:
    """The JVM this process started, and what its standard error said."""

    process: subprocess.Popen[bytes] | None = None
    out_of_memory = False


def _launch_jvm(master: str, settings: Mapping[str, str]) -> None:
    """Start Spark's JVM with its standard error piped through :func:`forward_jvm_stderr`.

    PySpark would start it with the terminal as its standard error; here its start-up
    noise is dropped and every other line still reaches the user's standard error.
    """
    conf = SparkConf(loadDefaults=False).setMaster(master).setAppName(APP_NAME)
    for key, value in settings.items():
        conf.set(key, value)
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})  # type: ignore[no-untyped-call]
    except Exception as exc:
        options = settings.get("spark.driver.extraJavaOptions", "")
        archive = _archive_option(options, "SharedArchiveFile")
        if archive is not None and not archive_maps(Path(archive[1])):
            # A damaged archive crashes the JVM as it starts: drop it, start without.
            Path(archive[1]).unlink(missing_ok=True)
            kept = [word for word in options.split() if word != archive[0]]
            _launch_jvm(master, {**settings, "spark.driver.extraJavaOptions": " ".join(kept)})
            return
        raise ReportError(
            f"cannot start Spark (check --master and --conf): {describe_spark_error(exc)}"
        ) from exc
    process = getattr(gateway, "proc", None)
    requested, _ClassArchive.requested = _ClassArchive.requested, None
    options = settings.get("spark.driver.extraJavaOptions", "")
    if process is not None and requested is not None and str(requested[0]) in options:
        # Only the JVM started here with the request writes it (--conf may have
        # replaced the options); only it is ever stopped to let it finish writing.
        _ClassArchive.pending = (*requested, process)
    if process is not None and process.stderr is not None:
        _Jvm.process = process
        threading.Thread(
            target=forward_jvm_stderr,
            # Where the JVM's own standard error went before: the process's.
            args=(process.stderr, sys.__stderr__ or sys.stderr),
            name="spark-jvm-stderr",
            daemon=True,
        ).start()
    SparkContext(conf=conf, gateway=gateway)


def stop_session(spark: SparkSession) -> None:
    """``spark.stop()``, without most of its wait for PySpark's accumulator server.

    That server (a ``socketserver`` on its own thread) notices a shutdown only when
    its ``select`` returns: every half second, or at a connection. Stopping the
    session waited 0.3-0.4 s for it, the JVM's own stop 0.04 s. A thread here
    connects once the server is told to shut down; the server's handler then returns
    at once (it serves only while the server runs) and its loop ends. Anything
    unexpected (another PySpark, a server already closed) only leaves the wait as it was.
    """
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is not None and hasattr(server, "server_shutdown"):
        threading.Thread(
            target=_wake_accumulator_server, args=(server,), name="accumulator-wake", daemon=True
        ).start()
    spark.stop()


def _wake_accumulator_server(server: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not getattr(server, "server_shutdown", True):
        if time.monotonic() > deadline:
            return
        time.sleep(0.002)
    address = getattr(server, "server_address", None)
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    # Twice: a first connection seen before the loop's own shutdown flag is set only
    # sends it round once more.
    for _ in range(2):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.settimeout(1.0)
                probe.connect(address)  # type: ignore[arg-type]
        except (OSError, TypeError, ValueError):
            return
        time.sleep(0.01)


def release_jvm() -> bool:
    """After the session of a JVM this process started is stopped: let that JVM exit now.

    Spark's gateway exits at the end of its standard input, which otherwise comes only
    when this process has ended; its exit takes about 0.4 s (Hadoop's shutdown hook reads
    its configuration files again), which then overlaps this process's own end (0.26 s at
    a report's end) instead of following it. A later session in this process starts a
    new JVM. Nothing happens while a context runs or a class archive is still to be
    written (:func:`save_class_archive` ends that JVM). True when released.
    """
    process = _Jvm.process
    if process is None or _ClassArchive.pending is not None:
        return False
    gateway = SparkContext._gateway
    if gateway is None or gateway.proc is not process:  # another JVM's gateway
        return False
    if SparkContext._active_spark_context is not None:
        return False
    _Jvm.process = None
    SparkContext._gateway = None
    SparkContext._jvm = None
    with contextlib.suppress(Exception):  # its connections, not the JVM: nothing to report
        gateway.close()
    with contextlib.suppress(OSError):
        if process.stdin is not None:
            process.stdin.close()
    return True


def forward_jvm_stderr(source: IO[bytes], target: IO[str]) -> None:
    """Copy the JVM's standard error to ``target`` line by line, without :data:`JVM_NOISE`.

    Notes an ``OutOfMemoryError`` on the way, for :func:`jvm_failure`.
    """
    for raw in iter(source.readline, b""):
        line = raw.decode("utf-8", "replace")
        if "OutOfMemoryError" in line:
            _Jvm.out_of_memory = True
        if JVM_NOISE.fullmatch(line.rstrip("\r\n")):
            continue
        try:
            target.write(line)
            target.flush()
        except (OSError, ValueError):  # the terminal went away: keep draining the pipe
            continue


def driver_memory(spark: SparkSession) -> str:
    """The driver heap the session was started with, e.g. ``"6g"``."""
    return str(spark.sparkContext.getConf().get("spark.driver.memory", "1g"))


def jvm_failure(heap: str, *, wait: float = 5.0) -> str | None:
    """Why the JVM this process started is gone, or ``None`` while it runs.

    Args:
        heap: The driver heap it was given (:func:`driver_memory`), for the advice.
        wait: Seconds to give a dying JVM to exit (py4j may notice first).
    """
    process = _Jvm.process
    if process is None:
        return None
    deadline = time.monotonic() + wait
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    status = process.poll()
    if status is None:
        return None
    if status == OOM_EXIT_STATUS or _Jvm.out_of_memory:
        return out_of_memory_message(heap)
    if status < 0:
        return (
            f"the Spark JVM was killed by signal {-status} (e.g. the system ran out of memory;"
            f" its heap was {heap}); rerun, or with --conf spark.driver.memory=... if it recurs"
        )
    return f"the Spark JVM exited unexpectedly with status {status}"


def out_of_memory_message(heap: str) -> str:
    """The one line for a run that exhausted the driver's heap."""
    match = re.fullmatch(r"(\d+)([gGmM])?", heap.strip())
    if match is None:
        bigger = "a larger value"
    else:
        amount = int(match.group(1)) * (1024 if (match.group(2) or "m").lower() == "g" else 1)
        bigger = f"{max(2, amount * 2 // 1024)}g"
    return (
        f"Spark ran out of memory (driver heap {heap}): rerun with "
        f"--conf spark.driver.memory={bigger}"
    )


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
