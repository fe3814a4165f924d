"""Local JSON Lines event files turned into Parquet by Arrow's JSON reader before Spark reads them.

Spark parses JSON row by row (Jackson), and then must cache the parsed rows because
the figures take several scans: at 10M events (2.4 GB, ``local[2]``) the parse and the
cache were 22 s of a 47 s report. Arrow's reader parses the same files in about 10 s
on two processes, and Spark then reads the staged Parquet like any Parquet log: only
the columns each query needs, nothing cached.

Arrow must read a file exactly as Spark would, or not at all. Probing both readers
line by line showed Arrow stricter where Spark is lenient (single quotes, a
number where a string belongs, trailing text after an object: Arrow fails, and the
log falls back to Spark, which reads them as it always did) and looser in five
places, each checked here on the raw bytes or the parsed rows:

* several objects on one line are several rows to Arrow, one (the first) to Spark,
  and an object may span lines for Arrow: every newline must sit between ``}`` and
  ``{`` and there must be as many rows as lines (see :class:`_LineCheck`);
* a carriage return ends a line for Spark and is whitespace to JSON: an object with
  one between two fields is one row to Arrow and two corrupt lines to Spark, so no
  ``\\r`` may occur at all (Windows line ends included);
* a line ``null`` is a row of nulls to Arrow, a corrupt line to Spark: a staged log
  must leave no required column null (such a log fails the report anyway, and
  Spark's own parse then names the file);
* bytes that are not UTF-8 in an ignored field pass Arrow: the raw bytes are decoded;
* ``Inf`` is infinity to Arrow, a corrupt line to Spark: a staged log holds only
  finite times (NaN and Infinity, which both read, go to Spark too).

A file whose first line is ``null`` crashes Arrow's reader (pyarrow 26); the files
are therefore converted in worker processes (see :func:`_run_workers`), and a worker
that dies is one more reason to fall back, never a dead report. Anything that goes
wrong while staging (too little disk, a file gone) leaves Spark to parse the JSON
itself, as before.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import fcntl
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import structlog

from purgatory_aio.eventlog import arrow_schema
from purgatory_report.errors import ReportError, missing_dependency

try:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pa_json
    import pyarrow.parquet as pq
except ImportError as exc:
    raise missing_dependency(exc) from exc

_log = structlog.get_logger(__name__)

#: The event log schema as Arrow reads it: the writers' schema (the library's one
#: definition), with every column nullable, as in the Spark schema (a missing required
#: value is counted and reported, not refused by the parser).
ARROW_SCHEMA = pa.schema([field.with_nullable(True) for field in arrow_schema()])

#: Uncompressed files are cut into ranges of this many bytes, one worker task each,
#: so one large file still keeps every worker busy (Spark's own split size).
SPLIT_BYTES = 128 << 20

#: Arrow parses in blocks of this size (8 MiB: as fast as 4 or 64 MiB at 10M events).
BLOCK_BYTES = 8 << 20

#: Rows per Parquet row group written (about 40 MB of parsed rows per worker).
ROW_GROUP_ROWS = 1 << 18

#: The Spark setting that picks the JSON Lines parser: ``arrow`` (the default: staged
#: by Arrow when Spark runs on this machine) or ``spark`` (Spark's own reader).
JSON_READER_CONF = "spark.purgatory.jsonReader"
JSON_READERS = ("arrow", "spark")

#: How staged files are written. Uncompressed (snappy cost 0.1 s per 128 MB range, and
#: the files are read from the same disk, then removed), with statistics only for the
#: numbers (Spark prunes row groups by time with them; text statistics cost another
#: 0.1 s per range). Text keeps its dictionaries: without them the files are twice as
#: large and Spark's part of the report slower by what the writing saved. 10M events:
#: 36.6 s against 35.0 s for the whole report with every default but compression. The
#: numbers get none: nearly every one is distinct, so the writer built a dictionary
#: only to drop it (a 128 MB range written in 0.09-0.10 s against 0.15-0.21).
_WRITE_OPTIONS: dict[str, Any] = {
    "compression": "none",
    "write_statistics": ["op_id", "created_at", "deadline", "settled_at"],
    "use_dictionary": [
        f"{field.name}.list.element" if pa.types.is_list(field.type) else field.name
        for field in ARROW_SCHEMA
        if pa.types.is_string(getattr(field.type, "value_type", field.type))
    ],
}

_NEWLINE, _OPEN, _CLOSE = 0x0A, 0x7B, 0x7D


def reader_choice(value: str) -> str:
    """The JSON Lines reader a :data:`JSON_READER_CONF` value picks.

    Raises:
        ReportError: Not one of :data:`JSON_READERS`.
    """
    chosen = value.strip().lower()
    if chosen not in JSON_READERS:
        raise ReportError(
            f"{JSON_READER_CONF} must be one of {', '.join(JSON_READERS)}, got {value!r}"
        )
    return chosen


def arrow_workers(reader: str, master: str) -> tuple[int, None] | tuple[None, str]:
    """Whether Arrow parses the JSON Lines for a run on ``master``: its worker processes,
    or why Spark parses them (as the run section says it).

    Args:
        reader: The :data:`JSON_READER_CONF` value (``arrow`` unless set).
        master: The Spark master URL the report runs on.

    Raises:
        ReportError: ``reader`` is not one of :data:`JSON_READERS`.
    """
    from purgatory_report.session import local_cores

    if reader_choice(reader) == "spark":
        return None, f"parsed by Spark ({JSON_READER_CONF}=spark)"
    cores = local_cores(master)
    if cores is None:
        # Executors elsewhere could not read a staging directory on the driver.
        return None, "parsed by Spark (not a local master)"
    return cores, None


class StagingRefused(Exception):
    """A file Arrow would not read exactly as Spark does: Spark parses the log."""


@dataclass(frozen=True)
class StagedJson:
    """The outcome of :func:`stage_json`."""

    #: The staged Parquet files (empty when Spark is left to parse the JSON).
    parquet: list[str]
    #: What the report's run section says about how the JSON Lines were parsed.
    description: str


class _LineCheck(io.RawIOBase):
    """Bytes ``[begin, stop)`` of a file, handed to Arrow and checked on the way.

    Proves each line holds exactly one JSON object once Arrow reports as many rows
    as :attr:`lines`: the range starts with ``{``, ends with ``}`` (a newline after
    it allowed), and every newline sits between ``}`` and ``{``. Inside an object or
    array ``} {`` is not valid JSON, so every newline separates two top-level values:
    no object spans lines and none is blank, and with one row per line none holds two.
    Also decodes the bytes as UTF-8. Raises :class:`StagingRefused` on a violation.
    """

    def __init__(self, raw: IO[bytes], begin: int, stop: int | None) -> None:
        super().__init__()
        self._raw = raw
        self._left = None if stop is None else stop - begin
        if stop is not None:  # a plain file, where finding the range moved the position
            raw.seek(begin)
        self._newlines = 0
        self.size = 0  # bytes read
        self._last = -1  # the previous byte read, -1 before the first
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._ended = False

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        want = BLOCK_BYTES if size is None or size < 0 else size
        if self._left is not None:
            want = min(want, self._left)
        data = self._raw.read(want) if want else b""
        if self._left is not None:
            self._left -= len(data)
        self.size += len(data)
        if data:
            self._check(data)
        elif not self._ended:
            self._ended = True
            self._finish()
        return data

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    @property
    def lines(self) -> int:
        """Lines read: newlines, plus a last line without one."""
        return self._newlines + (self._last not in (-1, _NEWLINE))

    def _check(self, data: bytes) -> None:
        # numpy finds the newlines at 2 GB/s; bytes.count() alone is 1.7, and the
        # two-byte patterns 1.1 (10M events: 1.2 s of CPU against 6 s).
        view = np.frombuffer(data, np.uint8)
        if self._last in (-1, _NEWLINE) and view[0] != _OPEN:
            raise StagingRefused("a line does not start with '{'")
        if b"\r" in data:
            # A line end to Spark (as \n and \r\n), whitespace to JSON: an object with a
            # \r between two fields is one row to Arrow and two corrupt lines to Spark.
            raise StagingRefused("a carriage return (a line end to Spark)")
        at = np.flatnonzero(view == _NEWLINE)
        if at.size:
            before = view[at[at > 0] - 1]
            if (at[0] == 0 and self._last != _CLOSE) or np.any(before != _CLOSE):
                raise StagingRefused("a line does not end with '}'")
            after = view[at[at < view.size - 1] + 1]
            if np.any(after != _OPEN):
                raise StagingRefused("a line does not start with '{'")
        self._newlines += int(at.size)
        self._last = int(view[-1])
        if not data.isascii() or self._utf8.getstate()[0]:
            self._decode(data)

    def _finish(self) -> None:
        if self._last not in (-1, _NEWLINE, _CLOSE):
            raise StagingRefused("a line does not end with '}'")
        self._decode(b"", final=True)

    def _decode(self, data: bytes, *, final: bool = False) -> None:
        try:
            self._utf8.decode(data, final)
        except UnicodeDecodeError as exc:
            raise StagingRefused(f"not UTF-8 ({exc.reason})") from None


def _line_start(raw: IO[bytes], position: int, size: int) -> int:
    """The first line start at or after ``position`` (``size`` when there is none)."""
    if position <= 0:
        return 0
    raw.seek(position - 1)
    offset = position - 1
    while chunk := raw.read(1 << 16):
        found = chunk.find(b"\n")
        if found >= 0:
            return offset + found + 1
        offset += len(chunk)
    return size


@dataclass(frozen=True)
class _Task:
    path: str
    start: int
    end: int  # -1: to the end of a compressed file
    out: str
    required: tuple[str, ...]


def _convert(task: _Task) -> int:
    """Parse one byte range into one Parquet file; the rows written.

    Raises:
        StagingRefused: The range does not read exactly as Spark would read it.
    """
    compressed = task.path.endswith(".gz")
    with open(task.path, "rb") as plain:
        if compressed:
            raw: IO[bytes] = gzip.GzipFile(fileobj=plain)  # type: ignore[assignment]
            begin, stop = 0, None
        else:
            size = os.fstat(plain.fileno()).st_size
            begin = _line_start(plain, task.start, size)
            stop = _line_start(plain, task.end, size)
            if begin >= stop:
                return 0
            raw = plain
        source = _LineCheck(raw, begin, stop)
        try:
            reader = pa_json.open_json(
                source,
                read_options=pa_json.ReadOptions(block_size=BLOCK_BYTES, use_threads=False),
                parse_options=pa_json.ParseOptions(
                    explicit_schema=ARROW_SCHEMA, unexpected_field_behavior="ignore"
                ),
            )
        except pa.ArrowInvalid:
            if source.read() == b"" and source.size == 0:  # an empty .gz: no rows
                return 0
            raise
        rows = 0
        pending: list[pa.RecordBatch] = []
        with pq.ParquetWriter(task.out, ARROW_SCHEMA, **_WRITE_OPTIONS) as writer:
            for batch in reader:
                _check_values(batch, task.required)
                pending.append(batch)
                rows += batch.num_rows
                if sum(item.num_rows for item in pending) >= ROW_GROUP_ROWS:
                    writer.write_table(pa.Table.from_batches(pending, ARROW_SCHEMA))
                    pending.clear()
            if pending:
                writer.write_table(pa.Table.from_batches(pending, ARROW_SCHEMA))
        # The reader has read to the end, so the line checks are complete.
        source.read()
        if rows != source.lines:
            raise StagingRefused(f"{rows} objects on {source.lines} lines")
        return rows


def _check_values(batch: pa.RecordBatch, required: tuple[str, ...]) -> None:
    for name in required:
        if batch.column(name).null_count:
            raise StagingRefused(f"an event has no {name}")
    for name in _DOUBLES:
        if not pc.all(pc.is_finite(batch.column(name))).as_py():
            # Spark reads NaN and Infinity but not Inf, which Arrow reads too: such
            # rare logs are Spark's to read.
            raise StagingRefused(f"{name} is not a finite number")


_DOUBLES = tuple(field.name for field in ARROW_SCHEMA if pa.types.is_floating(field.type))


def _tasks(paths: Sequence[str], directory: Path, required: tuple[str, ...]) -> list[_Task]:
    """The ranges to convert, largest first (see :func:`_claim`)."""
    ranges: list[tuple[str, int, int]] = []
    for path in paths:
        if path.endswith(".gz"):
            ranges.append((path, 0, -1))
            continue
        size = os.path.getsize(path)
        ranges.extend(
            (path, start, min(start + SPLIT_BYTES, size)) for start in range(0, size, SPLIT_BYTES)
        )
    ranges.sort(key=_json_bytes, reverse=True)
    return [
        _Task(path, start, end, str(directory / f"part-{index:05d}.parquet"), required)
        for index, (path, start, end) in enumerate(ranges)
    ]


#: A gzip-compressed JSON Lines file holds about this many times its size in JSON.
_GZ_FACTOR = 10


def _json_bytes(item: tuple[str, int, int]) -> int:
    """About how many bytes of JSON a range of :func:`_tasks` holds."""
    path, start, end = item
    return _GZ_FACTOR * os.path.getsize(path) if end < 0 else end - start


def stage_json(
    paths: Sequence[str],
    directory: Path,
    workers: int,
    required: Sequence[str],
    cancel: threading.Event | None = None,
) -> StagedJson:
    """Parse local JSON Lines files into Parquet under ``directory`` with Arrow.

    Args:
        paths: Local JSON Lines files (``.gz`` ones read whole by one worker).
        directory: A directory for the staged files, empty but for its owner file
            (see :func:`staging_directory`); the caller removes it.
        workers: Worker processes (the cores Spark will use).
        required: Columns every event has a value for: a null in one of them
            leaves the log to Spark (see the module's notes).
        cancel: Set to stop the workers and leave the log to Spark.

    Returns:
        The staged files, or none when Arrow cannot be trusted with one of the
        files (or fails, or the disk fills): then Spark parses the JSON itself.
    """
    started = time.perf_counter()
    try:
        tasks = _tasks(paths, directory, tuple(required))  # a file gone since: Spark's
        if not tasks:  # only empty files: nothing to gain
            return StagedJson([], "parsed by Spark (the files are empty)")
        workers = max(1, min(workers, len(tasks)))
        if (short := _space_short(paths, directory)) is not None:
            _log.info("json_staging_skipped", reason=short, files=len(paths))
            return StagedJson([], f"parsed by Spark ({short})")
        rows = _run_workers(tasks, workers, directory, cancel)
    except Exception as exc:  # every failure means "let Spark parse it"
        reason = _reason(exc)
        _log.info("json_staging_refused", reason=reason, files=len(paths))
        for part in directory.glob("*"):
            if part.name != OWNER_FILE:  # the run's claim on the directory stays
                part.unlink(missing_ok=True)
        return StagedJson([], f"parsed by Spark (Arrow's reader refused: {reason})")
    seconds = time.perf_counter() - started
    _log.info("json_staged", files=len(paths), rows=rows, seconds=round(seconds, 2))
    processes = f"{workers} worker process{'es' if workers > 1 else ''}"
    return StagedJson(
        [task.out for task in tasks if os.path.exists(task.out)],
        f"parsed by Arrow into Parquet in {seconds:.1f} s ({processes}, {rows:,} events); "
        "Spark read the Parquet",
    )


#: Staged bytes per byte of JSON, with a margin (10M events: 380 MB from 2.4 GB), and
#: per byte of gzip-compressed JSON (which shrinks about tenfold).
_STAGED_SHARE = 0.35
_STAGED_SHARE_GZ = 3.5


def _space_short(paths: Sequence[str], directory: Path) -> str | None:
    """Why ``directory`` has no room for the staged files, or ``None`` if it has.

    A disk that fills midway would also end in Spark's parser, after the time spent.
    """
    needed = sum(
        os.path.getsize(path) * (_STAGED_SHARE_GZ if path.endswith(".gz") else _STAGED_SHARE)
        for path in paths
    )
    free = shutil.disk_usage(directory).free
    if free >= needed:
        return None
    return (
        f"about {needed / 2**20:,.0f} MiB to stage, {free / 2**20:,.0f} MiB free in "
        f"{directory.parent}; set spark.local.dir to a larger disk"
    )


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


#: Exit status of a worker that refused its ranges or failed on them (it says why).
_REFUSED = 3


def _run_workers(
    tasks: list[_Task], workers: int, directory: Path, cancel: threading.Event | None
) -> int:
    """Run ``tasks`` on ``workers`` processes; the rows staged.

    Each worker is ``python -m purgatory_report.staging TASKS_FILE``: a fresh
    interpreter on the caller's ``sys.path`` that imports only this module. (A
    multiprocessing pool's spawned workers would import the caller's ``__main__``
    again: a script without a ``__main__`` guard would run its whole report once per
    worker.) Every worker reads the whole list and takes the next range no other has
    taken (see :func:`_claim`), so one slowed down (by the JVM starting beside it) leaves
    the other no idle time at the end.

    Raises:
        StagingRefused: A worker refused a range, failed, or died, or ``cancel`` was set.
    """
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    listed = directory / "tasks.json"
    listed.write_text(json.dumps([dataclasses.astuple(task) for task in tasks]))
    running: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for index in range(workers):
            report = directory / f"worker-{index}"
            # Output to files, not pipes: a worker never blocks on a full pipe.
            with open(f"{report}.out", "wb") as stdout, open(f"{report}.err", "wb") as stderr:
                running[index] = subprocess.Popen(
                    [sys.executable, "-P", "-m", __name__, str(listed)],
                    stdout=stdout,
                    stderr=stderr,
                    env=env,
                )
        rows = 0
        while running:
            if cancel is not None and cancel.is_set():
                raise StagingRefused("cancelled")
            # The first worker to fail ends the staging at once (the others are killed).
            for index, worker in list(running.items()):
                if (status := worker.poll()) is None:
                    continue
                del running[index]
                report = directory / f"worker-{index}"
                out = Path(f"{report}.out").read_bytes()
                if status != 0:
                    err = Path(f"{report}.err").read_bytes()
                    raise StagingRefused(_worker_failure(status, out, err))
                rows += int(json.loads(out.splitlines()[-1])["rows"])
            if running:
                time.sleep(_POLL_SECONDS)
        return rows
    finally:
        for worker in running.values():
            worker.kill()
            worker.wait()


def _claim(task: _Task) -> bool:
    """Take ``task`` for this worker: true for exactly one of the workers that ask."""
    try:
        os.close(os.open(f"{task.out}.claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


#: How often the workers are polled: a 10-second staging waits at most 1% longer.
_POLL_SECONDS = 0.02


def _worker_failure(status: int, out: bytes, err: bytes) -> str:
    if status == _REFUSED:
        with contextlib.suppress(ValueError, KeyError, TypeError, IndexError):
            return str(json.loads(out.splitlines()[-1])["refused"])
    last = err.decode("utf-8", "replace").strip().splitlines()
    said = f": {last[-1]}" if last else ""
    if status < 0:
        return f"a worker process died (signal {-status}{said})"
    return f"a worker process failed (exit status {status}{said})"


def _work(tasks_file: str) -> int:
    """A worker process: stage the tasks listed in ``tasks_file`` that no other worker has
    taken; the exit status."""
    try:
        listed = json.loads(Path(tasks_file).read_text())
        tasks = [
            _Task(path, start, end, out, tuple(required))
            for path, start, end, out, required in listed
        ]
        rows = sum(_convert(task) for task in tasks if _claim(task))
    except Exception as exc:  # the parent falls back to Spark on any of them
        print(json.dumps({"refused": _reason(exc)}), flush=True)
        return _REFUSED
    print(json.dumps({"rows": rows}), flush=True)
    return 0


#: Staging directories are named with this prefix. Each holds :data:`OWNER_FILE`, which
#: its run keeps locked (``flock``) for as long as it lives: the kernel lets go of the
#: lock when the process ends, however it ends.
STAGING_PREFIX = "purgatory-report-json-"
OWNER_FILE = "owner.lock"


def staging_directory(local_dirs: str | None) -> tuple[Path, int]:
    """A fresh directory for staged files under Spark's first local directory, and the
    descriptor holding its owner lock (close it after removing the directory).

    Directories of runs that ended without removing theirs (killed) are removed first.
    """
    parent = Path((local_dirs or "").split(",")[0].strip() or tempfile.gettempdir())
    sweep_stale(parent)
    directory = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent))
    descriptor: int | None = None
    try:
        # Locked before it gets its name, so no sweep ever finds the owner file unlocked.
        descriptor, claim = tempfile.mkstemp(prefix=".claim-", dir=directory)
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        os.rename(claim, directory / OWNER_FILE)
    except BaseException:
        if descriptor is not None:
            os.close(descriptor)
        remove(directory)
        raise
    return directory, descriptor


def sweep_stale(parent: Path) -> list[Path]:
    """Remove the staging directories under ``parent`` whose run has ended; the removed.

    A directory counts as abandoned only when its owner file can be locked: a live run
    (in this process or any other, on this machine) holds the lock. Directories without
    an owner file (being created, or left by an older version) are left alone.
    """
    swept = []
    for candidate in parent.glob(f"{STAGING_PREFIX}*"):
        try:
            descriptor = os.open(candidate / OWNER_FILE, os.O_RDONLY)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its run is alive
            remove(candidate)
            swept.append(candidate)
            _log.info("json_staging_swept", directory=str(candidate))
        finally:
            os.close(descriptor)
    return swept


def remove(directory: Path) -> None:
    """Remove a staging directory and everything in it."""
    shutil.rmtree(directory, ignore_errors=True)


class Staging:
    """:func:`stage_json` begun on a thread, e.g. while Spark's JVM starts.

    The command line begins it before starting the JVM (whose start mostly waits on
    its own process) and hands it to :func:`~.report.run`.
    """

    def __init__(
        self,
        paths: Sequence[str],
        workers: int,
        required: Sequence[str],
        local_dirs: str | None = None,
    ) -> None:
        self.paths = tuple(paths)
        self.directory: Path | None = None
        self._owner: int | None = None
        self._result: Future[StagedJson] = Future()
        self._cancel = threading.Event()
        try:
            self.directory, self._owner = staging_directory(local_dirs)
        except OSError as exc:
            reason = f"no staging directory: {exc.strerror or exc}"
            self._result.set_result(StagedJson([], f"parsed by Spark ({reason})"))
            return
        pool = ThreadPoolExecutor(1, thread_name_prefix="purgatory-report-staging")
        self._result = pool.submit(
            stage_json, self.paths, self.directory, workers, required, self._cancel
        )
        pool.shutdown(wait=False)

    def result(self) -> StagedJson:
        """Wait for the staging to end; the staged files, or none (Spark parses)."""
        return self._result.result()

    def close(self) -> None:
        """Stop the staging if it still runs, then remove everything it staged."""
        self._cancel.set()
        try:
            with contextlib.suppress(Exception):  # only the directory matters now
                self._result.result()
        finally:
            if self.directory is not None:
                remove(self.directory)
            if self._owner is not None:
                os.close(self._owner)
                self._owner = None


if __name__ == "__main__":
    status = _work(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # Straight out, past the interpreter's teardown: pyarrow 26's reader threads now
    # and then abort it ("terminate called without an active exception", about one
    # worker in a hundred), after every file was written and closed.
    os._exit(status)
