"""The queue and worker thread shared by every event log writer."""

from __future__ import annotations

import atexit
import collections
import contextlib
import itertools
import json
import math
import os
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Generic, Self, TypeVar

from purgatory_aio._logging import get_logger
from purgatory_aio._validation import check_positive_int, check_positive_seconds
from purgatory_aio.events import OperationEvent

logger = get_logger("purgatory_aio.eventlog")

#: Seconds between two "records dropped" warnings of one writer.
DROP_WARNING_INTERVAL = 10.0

#: Name of the marker file in which a writer records how many records it dropped;
#: hidden from Spark (leading ``_``), read by the report to say its input is incomplete.
DROP_MARKER_PREFIX = "_dropped-"

# Settlement times outside this range cannot be real (e.g. milliseconds given as
# seconds); their records go to the partition of the wall-clock hour instead.
_PARTITION_RANGE = (0.0, 4_102_444_800.0)  # 1970 .. 2100

# Process-wide, so two writers sharing a directory never pick the same file name.
_file_seq = itertools.count(1)


_Payload = TypeVar("_Payload")


class QueuedEventWriter(ABC, Generic[_Payload]):
    """An :class:`~purgatory_aio.events.EventSink` that writes files on a worker thread.

    ``emit`` appends to a bounded in-memory queue and returns at once: it never
    waits for the worker or the disk. When the queue is full the record is
    dropped and counted in :attr:`dropped`; the worker logs a warning at most
    every :data:`DROP_WARNING_INTERVAL` seconds, and :meth:`close` logs the total.

    The worker writes records in batches of ``batch_size`` (or whatever arrived
    within ``flush_seconds``) to a file named
    ``<prefix>-<UTC open time>-<pid>-<seq><suffix>``, so file names sort by
    time. With ``partitioned`` (the default) files go under
    ``date=YYYY-MM-DD/hour=HH/`` by the UTC hour the records settled in, so a
    reader can skip the hours it does not need; a file holds one hour only.

    Every record gets the writer's :attr:`producer` id (a random UUID per
    writer) unless it already names one, so ``(producer, purgatory, op_id)``
    identifies an operation.

    A file is written under a hidden ``.<name>.tmp`` name and made visible when
    it is closed (once it holds ``roll_bytes`` bytes, ``roll_seconds`` after it
    was opened, or at :meth:`close`): finished, flushed, synced to the disk
    (fsync), then renamed, and the rename synced. Readers such as Spark skip
    hidden files, so they never see a partial file. A write or a close that
    fails (a full disk, an unwritable directory) removes the file: its records
    are dropped, never half-written. So :attr:`written` is exactly the rows a
    reader finds in :attr:`files`, and every record emitted ends up written or
    dropped.

    Every drop (queue full, emitted after close, unencodable, failed write) is
    recorded in the log itself: a ``_dropped-<producer>.json`` marker at the top
    of ``directory`` holds the writer's totals, written (synced, then renamed)
    at the first drop, as drops grow, and at :meth:`close`, so a report can tell
    its input is incomplete, and by how much.

    A record the format cannot encode is dropped alone (counted, logged), never
    with its batch. ``emit`` is meant to be called from one thread at a time
    (the event-loop thread of the purgatories sharing the writer).

    Args:
        directory: Where the files go (created if missing).
        batch_size: Records per write (a Parquet row group).
        roll_bytes: Close the file once it is this large.
        roll_seconds: Close the file this long after it was opened.
        queue_size: Records waiting for the worker before ``emit`` drops.
        flush_seconds: Longest a record waits for its batch to fill.
        prefix: File name prefix.
        partitioned: Lay files out by settlement date and hour.

    Subclasses implement the format: :meth:`_encode`, :meth:`_open_file`,
    :meth:`_write_payload`, :meth:`_bytes_written` and :meth:`_close_file`.
    """

    suffix: ClassVar[str]

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        batch_size: int = 10_000,
        roll_bytes: int = 64 * 1024 * 1024,
        roll_seconds: float = 300.0,
        queue_size: int = 100_000,
        flush_seconds: float = 1.0,
        prefix: str = "events",
        partitioned: bool = True,
    ) -> None:
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.roll_bytes = check_positive_int(roll_bytes, "roll_bytes")
        self.roll_seconds = check_positive_seconds(roll_seconds, "roll_seconds")
        self.queue_size = check_positive_int(queue_size, "queue_size")
        self.flush_seconds = check_positive_seconds(flush_seconds, "flush_seconds")
        if not prefix or os.sep in prefix or prefix.startswith((".", "_")):
            raise ValueError(f"prefix must be a plain, visible file name part, got {prefix!r}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.partitioned = partitioned
        #: This writer's id, stamped on every record it writes.
        self.producer = uuid.uuid4().hex

        # A deque appended by the producer and popped by the worker needs no lock:
        # both operations are atomic, and only the producer can make it grow.
        self._pending: collections.deque[OperationEvent] = collections.deque()
        self._wakeup = threading.Event()
        self._closing = False
        self._close_lock = threading.Lock()
        # Drops counted by emit (producer thread), and write failures (worker thread).
        self._queue_full = 0
        self._after_close = 0
        self._failed = 0
        self._warned_after_close = False
        self._after_close_marked_at = -math.inf
        self._marker_lock = threading.Lock()
        self._drops_marked = 0
        self._marked_at = -math.inf  # when the worker last wrote (or tried) the marker

        # Worker-thread state.
        self._batch: list[OperationEvent] = []
        self._unaccounted = 0  # records of the batch being written not yet counted
        self._batch_started = 0.0
        self._written = 0  # records in completed files
        self._in_file = 0  # records in the open file
        self._files: list[Path] = []
        self._tmp_path: Path | None = None
        self._final_path: Path | None = None
        self._opened_at = 0.0
        self._partition: str | None = None
        self._drops_reported = 0
        self._drops_reported_at = -DROP_WARNING_INTERVAL

        self._thread = threading.Thread(
            target=self._run, name=f"{type(self).__name__}({self.directory})", daemon=True
        )
        self._thread.start()
        # The worker is a daemon so a forgotten close() cannot hang interpreter exit;
        # this still flushes what is queued at a normal exit.
        atexit.register(self.close)

    # -- producer side (event-loop thread) -----------------------------------------------

    def emit(self, event: OperationEvent) -> None:
        """Queue one record for writing; never blocks.

        Args:
            event: The settled operation.
        """
        pending = self._pending
        if len(pending) >= self.queue_size or self._closing:
            self._drop_emitted()
            return
        pending.append(event)
        if len(pending) >= self.batch_size and not self._wakeup.is_set():
            self._wakeup.set()

    def _drop_emitted(self) -> None:
        """Count a record ``emit`` could not queue, and see that the marker says so."""
        if not self._closing:
            self._queue_full += 1
            if self._queue_full == 1:
                self._wakeup.set()  # the worker writes the marker at the first drop
            return
        self._after_close += 1
        if not self._warned_after_close:
            self._warned_after_close = True
            logger.warning(
                "eventlog.emit_after_close",
                writer=type(self).__name__,
                directory=str(self.directory),
            )
            # Later drops reach the marker at most every DROP_WARNING_INTERVAL seconds
            # (an fsync per record would stall the loop), and at interpreter exit.
            atexit.register(self._mark_drops)
        now = time.monotonic()
        if now - self._after_close_marked_at >= DROP_WARNING_INTERVAL:
            self._after_close_marked_at = now
            self._mark_drops()

    @property
    def dropped(self) -> int:
        """Records lost: queue full, emitted after close, or failed to encode or write.

        Every one of them is also counted in the ``_dropped-<producer>.json`` marker,
        written at the first drop and again at :meth:`close`.
        """
        return self._queue_full + self._after_close + self._failed

    @property
    def written(self) -> int:
        """Records in completed files: exactly the rows a reader finds in :attr:`files`.

        A record counts once its file has been flushed, synced and renamed into view;
        until then it is :attr:`in_progress`.
        """
        return self._written

    @property
    def in_progress(self) -> int:
        """Records in the open, still hidden file: written or dropped once it is closed."""
        return self._in_file

    @property
    def files(self) -> list[Path]:
        """The completed (renamed) files, oldest first."""
        return list(self._files)

    def close(self, timeout: float | None = None) -> None:
        """Write everything queued, close the current file and stop the worker.

        Idempotent; later calls return at once. Records emitted afterwards are
        dropped and counted, in :attr:`dropped` and in the drop marker.

        Args:
            timeout: Seconds to wait for the worker; ``None`` waits until it is done.
        """
        with self._close_lock:
            if self._closing:
                return
            self._closing = True
        self._wakeup.set()
        self._thread.join(timeout)
        atexit.unregister(self.close)
        if not self._thread.is_alive():
            # Only reachable when close() raced an emit() from another thread.
            leftover = len(self._pending)
            self._pending.clear()
            self._after_close += leftover
        # Whatever happened to the worker: the marker holds every drop counted so far.
        self._mark_drops()
        if self.dropped:
            logger.warning(
                "eventlog.closed_with_drops",
                writer=type(self).__name__,
                directory=str(self.directory),
                dropped=self.dropped,
                written=self._written,
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self.directory)!r}, written={self._written}, "
            f"dropped={self.dropped})"
        )

    # -- format hooks (worker thread) ----------------------------------------------------

    @abstractmethod
    def _encode(self, events: Sequence[OperationEvent]) -> _Payload:
        """Turn ``events`` into what :meth:`_write_payload` writes; touches no file."""

    @abstractmethod
    def _open_file(self, path: Path) -> None:
        """Start a new file at ``path``."""

    @abstractmethod
    def _write_payload(self, payload: _Payload) -> None:
        """Append an encoded batch to the open file."""

    @abstractmethod
    def _bytes_written(self) -> int:
        """Size of the open file so far."""

    @abstractmethod
    def _close_file(self) -> None:
        """Finish the open file (footer, flush, close); it is synced and renamed afterwards.

        Also called, its errors ignored, to let go of a file that failed: it then
        releases whatever it holds even when finishing fails.
        """

    # -- worker ----------------------------------------------------------------------------

    def _run(self) -> None:
        pending = self._pending
        while True:
            self._wakeup.wait(self._wait_timeout())
            self._wakeup.clear()
            closing = self._closing
            try:
                self._step(closing)
            except Exception:
                # A bug or a hostile record this code did not foresee: what the step held
                # is lost, and counted, and the worker goes on with the next records.
                self._lose_file(len(self._batch) + self._unaccounted, "eventlog.worker_error")
                self._batch = []
                self._unaccounted = 0
            if closing and not pending:
                self._report_drops(time.monotonic())
                return

    def _step(self, closing: bool) -> None:
        pending = self._pending
        while pending:
            if not self._batch:
                self._batch_started = time.monotonic()
            self._batch.append(pending.popleft())
            if len(self._batch) >= self.batch_size:
                self._write_batch()
        now = time.monotonic()
        if self._batch and (closing or now - self._batch_started >= self.flush_seconds):
            self._write_batch()
        if self._tmp_path is not None and (closing or now - self._opened_at >= self.roll_seconds):
            self._finish_file()
        self._report_drops(now)

    def _wait_timeout(self) -> float:
        # emit() only signals full batches, so the worker also looks every flush_seconds.
        now = time.monotonic()
        deadline = now + self.flush_seconds
        if self._batch:
            deadline = min(deadline, self._batch_started + self.flush_seconds)
        if self._tmp_path is not None:
            deadline = min(deadline, self._opened_at + self.roll_seconds)
        return max(0.0, deadline - now)

    def _write_batch(self) -> None:
        batch, self._batch = self._batch, []
        # Each run of the batch is then counted as written (in the file) or dropped;
        # what is left here if something unforeseen raises is counted as dropped.
        self._unaccounted = len(batch)
        self._write(batch)
        self._unaccounted = 0

    def _write(self, batch: list[OperationEvent]) -> None:
        producer = self.producer
        stamped: list[OperationEvent] = []
        for event in batch:
            try:
                stamped.append(
                    event if event.producer is not None else event._replace(producer=producer)
                )
            except Exception:  # not an OperationEvent: the encoder says what it is
                stamped.append(event)
        if not self.partitioned:
            self._write_run(stamped)
            return
        # A file holds one hour: split the batch where the settlement hour changes.
        run: list[OperationEvent] = []
        run_partition: str | None = None
        for event in stamped:
            partition = _partition_of(event)
            if run and partition != run_partition:
                self._write_run(run, run_partition)
                run = []
            run_partition = partition
            run.append(event)
        if run:
            self._write_run(run, run_partition)

    def _write_run(self, batch: list[OperationEvent], partition: str | None = None) -> None:
        if self._tmp_path is not None and partition != self._partition:
            self._finish_file()
        self._unaccounted -= len(batch)  # from here on counted, whatever happens
        payload = self._encode_or_skip(batch)
        if payload is None:
            return
        records, encoded = payload
        try:
            if self._tmp_path is None:
                self._start_file(partition)
            self._write_payload(encoded)
            full = self._bytes_written() >= self.roll_bytes
        except Exception:
            # A full disk, an unwritable directory...: the file never becomes visible,
            # so none of its records may count as written.
            self._lose_file(records, "eventlog.write_failed")
            return
        self._in_file += records
        if full:
            self._finish_file()

    def _encode_or_skip(self, batch: list[OperationEvent]) -> tuple[int, _Payload] | None:
        try:
            return len(batch), self._encode(batch)
        except Exception:
            pass
        good: list[OperationEvent] = []
        bad: list[OperationEvent] = []
        for event in batch:
            (good if self._encodes(event) else bad).append(event)
        self._failed += len(bad)
        logger.error(
            "eventlog.unencodable_records",
            writer=type(self).__name__,
            dropped=len(bad),
            example=_shown(bad[0]) if bad else None,
        )
        if not good:
            return None
        try:
            return len(good), self._encode(good)
        except Exception:
            self._failed += len(good)
            logger.exception("eventlog.encode_failed", writer=type(self).__name__)
            return None

    def _encodes(self, event: OperationEvent) -> bool:
        try:
            self._encode([event])
        except Exception:
            return False
        return True

    def _start_file(self, partition: str | None) -> None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        name = f"{self.prefix}-{stamp}-{os.getpid()}-{next(_file_seq):06d}{self.suffix}"
        directory = self.directory
        if partition is not None:
            directory = directory / partition
        self._partition = partition
        self._final_path = directory / name
        self._tmp_path = directory / f".{name}.tmp"
        self._opened_at = time.monotonic()
        if partition is not None:
            directory.mkdir(parents=True, exist_ok=True)
        self._open_file(self._tmp_path)

    def _finish_file(self) -> None:
        """Make the open file visible: finish it, sync it to disk, rename it into view."""
        tmp, final = self._tmp_path, self._final_path
        assert tmp is not None and final is not None
        try:
            self._close_file()
            _fsync(tmp, os.O_RDONLY)
            os.replace(tmp, final)
        except Exception:
            self._lose_file(0, "eventlog.close_failed")
            return
        records, self._in_file = self._in_file, 0
        self._tmp_path = self._final_path = None
        self._written += records
        self._files.append(final)
        _sync_directory(final.parent)

    def _lose_file(self, records: int, event: str) -> None:
        """The open file (if any) failed, with ``records`` more meant for it: count them
        all as dropped and remove the file, so no reader ever sees part of it."""
        lost = self._in_file + records
        self._in_file = 0
        self._failed += lost
        tmp, final = self._tmp_path, self._final_path
        self._tmp_path = self._final_path = None
        logger.exception(event, writer=type(self).__name__, path=str(final), records=lost)
        with contextlib.suppress(Exception):
            self._close_file()
        if tmp is not None:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                logger.exception("eventlog.remove_failed", path=str(tmp))

    def _mark_drops(self) -> None:
        """Record the drop totals in the log directory, durably (synced, then renamed).

        Called by the worker (first drop, then as drops grow), by :meth:`close`, and
        by ``emit`` after close; one at a time.
        """
        with self._marker_lock:
            dropped = self.dropped
            if dropped == self._drops_marked:
                return
            marker = self.directory / f"{DROP_MARKER_PREFIX}{self.producer}.json"
            tmp = marker.with_name(f".{marker.name}.{threading.get_ident()}.tmp")
            record = {
                "producer": self.producer,
                "dropped": dropped,
                "written": self._written,
                "queue_full": self._queue_full,
                "after_close": self._after_close,
                "failed": self._failed,
                "updated_at": datetime.now(UTC).isoformat(),
            }
            try:
                with tmp.open("w", encoding="utf-8") as file:
                    file.write(json.dumps(record) + "\n")
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(tmp, marker)
            except OSError:
                logger.exception("eventlog.drop_marker_failed", path=str(marker))
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
                return
            self._drops_marked = dropped
        _sync_directory(self.directory)

    def _report_drops(self, now: float) -> None:
        # The first drop is marked at once, later ones at most every flush_seconds (a
        # worker that cannot keep up should not also sync a marker per batch) and at close.
        if self.dropped != self._drops_marked and (
            now - self._marked_at >= self.flush_seconds or self._closing
        ):
            self._marked_at = now
            self._mark_drops()
        dropped = self._queue_full
        if dropped > self._drops_reported and (
            now - self._drops_reported_at >= DROP_WARNING_INTERVAL or self._closing
        ):
            if not self._closing:
                logger.warning(
                    "eventlog.records_dropped",
                    writer=type(self).__name__,
                    directory=str(self.directory),
                    dropped_since_last=dropped - self._drops_reported,
                    dropped_total=dropped,
                    queue_size=self.queue_size,
                )
            self._drops_reported = dropped
            self._drops_reported_at = now


def _fsync(path: Path, flags: int) -> None:
    """Flush ``path``'s data to the disk (a descriptor opened just for that)."""
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable; a file system that cannot sync a
    directory (or a failure now, after the rename) leaves the file visible anyway."""
    try:
        _fsync(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        logger.debug("eventlog.directory_sync_failed", directory=str(directory), error=str(exc))


def _shown(event: object) -> str:
    try:
        return repr(event)[:500]
    except Exception as exc:
        return f"<unrepresentable {type(event).__name__}: {exc!r}>"


def _partition_of(event: OperationEvent) -> str:
    """``date=YYYY-MM-DD/hour=HH`` of the UTC hour ``event`` settled in."""
    low, high = _PARTITION_RANGE
    try:
        settled_at = float(event.settled_at)
    except Exception:  # not a time: the encoder refuses the record, counted there
        settled_at = math.nan
    instant = settled_at if math.isfinite(settled_at) and low <= settled_at < high else time.time()
    return datetime.fromtimestamp(instant, UTC).strftime("date=%Y-%m-%d/hour=%H")
