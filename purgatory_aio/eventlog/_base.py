"""The queue and worker thread shared by every event log writer."""

from __future__ import annotations

import atexit
import collections
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
    identifies an operation. Dropped records are also recorded in the log
    itself: a ``_dropped-<producer>.json`` file at the top of ``directory``
    holds the writer's running totals, so a report can tell its input is
    incomplete. A file is written under a hidden ``.<name>.tmp`` name and renamed when
    it is closed: once it holds ``roll_bytes`` bytes, ``roll_seconds`` after it
    was opened, or at :meth:`close`. Readers such as Spark skip hidden files, so
    they never see a partial file.

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
        self._dropped = 0
        self._written = 0
        self._failed = 0
        self._files: list[Path] = []
        self._warned_after_close = False

        # Worker-thread state.
        self._tmp_path: Path | None = None
        self._final_path: Path | None = None
        self._opened_at = 0.0
        self._partition: str | None = None
        self._drops_marked = 0
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
            self._dropped += 1
            if self._closing and not self._warned_after_close:
                self._warned_after_close = True
                logger.warning(
                    "eventlog.emit_after_close",
                    writer=type(self).__name__,
                    directory=str(self.directory),
                )
            return
        pending.append(event)
        if len(pending) >= self.batch_size and not self._wakeup.is_set():
            self._wakeup.set()

    @property
    def dropped(self) -> int:
        """Records lost: queue full, emitted after close, or failed to write."""
        return self._dropped + self._failed

    @property
    def written(self) -> int:
        """Records written to files (a file becomes visible when it is closed)."""
        return self._written

    @property
    def files(self) -> list[Path]:
        """The completed (renamed) files, oldest first."""
        return list(self._files)

    def close(self, timeout: float | None = None) -> None:
        """Write everything queued, close the current file and stop the worker.

        Idempotent; later calls return at once. Records emitted afterwards are
        dropped and counted.

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
            self._dropped += leftover
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
        """Finish the open file (footer, flush, close); it is renamed afterwards."""

    # -- worker ----------------------------------------------------------------------------

    def _run(self) -> None:
        batch: list[OperationEvent] = []
        batch_started = 0.0
        pending = self._pending
        while True:
            self._wakeup.wait(self._wait_timeout(batch, batch_started))
            self._wakeup.clear()
            closing = self._closing
            while pending:
                if not batch:
                    batch_started = time.monotonic()
                batch.append(pending.popleft())
                if len(batch) >= self.batch_size:
                    self._write(batch)
                    batch = []
            now = time.monotonic()
            if batch and (closing or now - batch_started >= self.flush_seconds):
                self._write(batch)
                batch = []
            if self._tmp_path is not None and (
                closing or now - self._opened_at >= self.roll_seconds
            ):
                self._finish_file()
            self._report_drops(now)
            if closing and not pending:
                return

    def _wait_timeout(self, batch: list[OperationEvent], batch_started: float) -> float:
        # emit() only signals full batches, so the worker also looks every flush_seconds.
        now = time.monotonic()
        deadline = now + self.flush_seconds
        if batch:
            deadline = min(deadline, batch_started + self.flush_seconds)
        if self._tmp_path is not None:
            deadline = min(deadline, self._opened_at + self.roll_seconds)
        return max(0.0, deadline - now)

    def _write(self, batch: list[OperationEvent]) -> None:
        producer = self.producer
        stamped = [e if e.producer is not None else e._replace(producer=producer) for e in batch]
        if not self.partitioned:
            self._write_run(stamped)
            return
        # A file holds one hour: split the batch where the settlement hour changes.
        run: list[OperationEvent] = []
        run_partition: str | None = None
        for event in stamped:
            partition = _partition_of(event.settled_at)
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
        payload = self._encode_or_skip(batch)
        if payload is None:
            return
        records, encoded = payload
        try:
            if self._tmp_path is None:
                self._start_file(partition)
            self._write_payload(encoded)
        except Exception:
            self._failed += records
            logger.exception(
                "eventlog.write_failed",
                writer=type(self).__name__,
                path=str(self._final_path),
                records=records,
            )
            self._abandon_file()
            return
        self._written += records
        if self._bytes_written() >= self.roll_bytes:
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
            example=repr(bad[0])[:500],
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
            directory.mkdir(parents=True, exist_ok=True)
        self._partition = partition
        self._final_path = directory / name
        self._tmp_path = directory / f".{name}.tmp"
        self._opened_at = time.monotonic()
        self._open_file(self._tmp_path)

    def _finish_file(self) -> None:
        tmp, final = self._tmp_path, self._final_path
        assert tmp is not None and final is not None
        try:
            self._close_file()
            os.replace(tmp, final)
        except Exception:
            logger.exception("eventlog.close_failed", writer=type(self).__name__, path=str(final))
            self._tmp_path = self._final_path = None
            return
        self._tmp_path = self._final_path = None
        self._files.append(final)

    def _abandon_file(self) -> None:
        """After a failed write: keep what the file already holds if it still closes."""
        if self._tmp_path is None:
            return
        self._finish_file()

    def _mark_drops(self) -> None:
        """Record the drop total in the log directory (replaced atomically)."""
        dropped = self.dropped
        if dropped == self._drops_marked:
            return
        self._drops_marked = dropped
        marker = self.directory / f"{DROP_MARKER_PREFIX}{self.producer}.json"
        tmp = marker.with_name(f".{marker.name}.tmp")
        record = {
            "producer": self.producer,
            "dropped": dropped,
            "written": self._written,
            "updated_at": datetime.now(UTC).isoformat(),
        }
        try:
            tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
            os.replace(tmp, marker)
        except OSError:
            logger.exception("eventlog.drop_marker_failed", path=str(marker))

    def _report_drops(self, now: float) -> None:
        self._mark_drops()
        dropped = self._dropped
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


def _partition_of(settled_at: float) -> str:
    """``date=YYYY-MM-DD/hour=HH`` of the UTC hour ``settled_at`` falls in."""
    low, high = _PARTITION_RANGE
    instant = settled_at if math.isfinite(settled_at) and low <= settled_at < high else time.time()
    return datetime.fromtimestamp(instant, UTC).strftime("date=%Y-%m-%d/hour=%H")
