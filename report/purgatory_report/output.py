"""Where a report goes, written atomically: a staging directory swapped in at the end.

A run writes everything into a hidden staging directory beside the report
directory (``.NAME.tmp-<id>``): Spark writes the large tables there, and the
driver writes the small files it computed from collected results (summary,
Markdown, charts). Only when all of it is written is the staging directory
renamed into place; a failed run deletes it and leaves the previous report as
it was.

The report directory may be a plain path or a ``file:`` URI (written with the
standard library) or any Hadoop-compatible URI such as ``hdfs://`` or
``s3a://`` (written through Spark's Hadoop file system: the small files are
first written to a local temporary directory and then copied up).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from purgatory_report.errors import ReportError, missing_dependency
from purgatory_report.inputs import is_local, local_path

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
except ImportError as exc:
    raise missing_dependency(exc) from exc

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Files whose presence marks a directory as a previous report (safe to replace).
REPORT_MARKERS = ("summary.json", "report.md")


def _local(location: str) -> Path:
    return Path(
        location[len("file:") :].replace("///", "/", 1)
        if location.startswith("file:")
        else location
    )


def check_local_target(location: str) -> None:
    """Fail before any work when a local report directory cannot be (re)placed.

    Raises:
        ReportError: It is a file, a directory that is not a previous report
            (never replaced), or its parent cannot hold a new directory.
    """
    if not is_local(location):
        return
    target = local_path(location)
    if target.exists() and not target.is_dir():
        raise ReportError(f"report directory is a file: {location}")
    if target.is_dir() and any(target.iterdir()) and not _is_report(target):
        raise ReportError(
            f"{location} exists and is not a purgatory report (no {' or '.join(REPORT_MARKERS)});"
            " refusing to replace it: choose a new or empty directory"
        )
    probe = _staging_name(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        raise ReportError(f"cannot write the report to {location}: {exc.strerror or exc}") from None


def _is_report(directory: Path) -> bool:
    return any((directory / name).is_file() for name in REPORT_MARKERS)


def _staging_name(target: Path) -> Path:
    return target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:12]}"


class ReportOutput:
    """The staging area of one run and the swap that publishes it.

    Use :attr:`uri` for what Spark writes and :attr:`files` (a local directory)
    for what the driver writes; then :meth:`commit`, or :meth:`abort` on failure.
    """

    def __init__(self, location: str, spark: SparkSession) -> None:
        self.location = location
        self._local_target: Path | None = None
        self._fs: Any = None
        if is_local(location):
            check_local_target(location)
            target = local_path(location).resolve()
            self._local_target = target
            self._staging = _staging_name(target)
            try:
                self._staging.mkdir()
            except OSError as exc:
                raise ReportError(
                    f"cannot write the report to {location}: {exc.strerror or exc}"
                ) from None
            self.uri = self._staging.as_uri()
            self.files = self._staging
            return
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        hadoop_path = jvm.org.apache.hadoop.fs.Path
        self._hadoop_path = hadoop_path
        self._target = hadoop_path(location)
        try:
            self._fs = self._target.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
            if self._fs.exists(self._target):
                if not self._fs.getFileStatus(self._target).isDirectory():
                    raise ReportError(f"report directory is a file: {location}")
                entries = self._fs.listStatus(self._target)
                names = {str(entry.getPath().getName()) for entry in entries}
                if names and not names & set(REPORT_MARKERS):
                    raise ReportError(
                        f"{location} exists and is not a purgatory report; refusing to replace it"
                    )
            parent = self._target.getParent()
            name = str(self._target.getName())
            self._remote_staging = hadoop_path(parent, f".{name}.tmp-{uuid.uuid4().hex[:12]}")
            if not self._fs.mkdirs(self._remote_staging):
                raise ReportError(f"cannot write the report to {location}: mkdirs failed")
        except ReportError:
            raise
        except Exception as exc:
            from purgatory_report.errors import describe_spark_error

            raise ReportError(
                f"cannot write the report to {location}: {describe_spark_error(exc)}"
            ) from None
        self.uri = str(self._remote_staging.toString())
        self.files = Path(tempfile.mkdtemp(prefix="purgatory-report-"))

    def final(self, relative: str) -> str:
        """Where ``relative`` (a path inside the report) ends up after :meth:`commit`."""
        if self._local_target is not None:
            return str(self._local_target / relative)
        return f"{self.location.rstrip('/')}/{relative}"

    def local_table(self, name: str) -> Path | None:
        """The directory Spark wrote ``tables/NAME`` to, when the report is local."""
        return self._table_dir(name) if self._local_target is not None else None

    def _table_dir(self, name: str) -> Path:
        return self.files / "tables" / name

    def write_small_table(self, name: str, table: pa.Table) -> None:
        """Write a table of a few rows at ``tables/NAME`` with pyarrow, laid out as Spark
        would (a directory of one part file) but without a Spark job (about 1.5 s each)."""
        directory = self._table_dir(name)
        directory.mkdir(parents=True, exist_ok=True)
        # Timestamps as INT96, as Spark writes them by default
        # (spark.sql.parquet.outputTimestampType): a table has the same types whichever
        # of the two wrote it.
        pq.write_table(
            table, directory / "part-00000.parquet", use_deprecated_int96_timestamps=True
        )

    def commit(self) -> None:
        """Publish the staging directory as the report, replacing any previous one."""
        if self._local_target is not None:
            target = self._local_target
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:12]}"
            if target.exists():
                os.rename(target, old)
            os.rename(self._staging, target)
            shutil.rmtree(old, ignore_errors=True)
            return
        jvm_path = self._hadoop_path
        fs = self._fs
        # File by file: Spark's tables/ is already there, and copying a directory onto an
        # existing one would nest it.
        for entry in sorted(path for path in self.files.rglob("*") if path.is_file()):
            relative = entry.relative_to(self.files).as_posix()
            fs.copyFromLocalFile(
                False, True, jvm_path(str(entry)), jvm_path(self._remote_staging, relative)
            )
        shutil.rmtree(self.files, ignore_errors=True)
        parent = self._target.getParent()
        old = jvm_path(parent, f".{self._target.getName()}.old-{uuid.uuid4().hex[:12]}")
        if fs.exists(self._target) and not fs.rename(self._target, old):
            raise ReportError(f"cannot move the previous report at {self.location} aside")
        if not fs.rename(self._remote_staging, self._target):
            raise ReportError(f"cannot move the new report into {self.location}")
        fs.delete(old, True)

    def abort(self) -> None:
        """Delete the staging directory; the previous report is untouched."""
        if self._local_target is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            return
        shutil.rmtree(self.files, ignore_errors=True)
        try:
            self._fs.delete(self._remote_staging, True)
        except Exception:  # best effort: the run has failed already and says why
            return
