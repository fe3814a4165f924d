"""Finding, checking and reading event log files (Parquet and JSON Lines)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from purgatory_aio.analytics.errors import ReportError, missing_dependency
from purgatory_aio.events import COLUMNS, OUTCOMES

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        ArrayType,
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
    )
except ImportError as exc:
    raise missing_dependency(exc) from exc

PARQUET_SUFFIXES = (".parquet",)
JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")

#: The event log schema as Spark sees it; JSON is read with it, never inferred.
EVENT_SCHEMA = StructType(
    [
        StructField("purgatory", StringType()),
        StructField("op_type", StringType()),
        StructField("op_id", LongType()),
        StructField("keys", ArrayType(StringType())),
        StructField("created_at", DoubleType()),
        StructField("deadline", DoubleType()),
        StructField("settled_at", DoubleType()),
        StructField("outcome", StringType()),
        StructField("error", StringType()),
    ]
)
assert tuple(EVENT_SCHEMA.names) == COLUMNS

#: Columns every event must have a value for (``error`` is null unless it failed).
REQUIRED = tuple(name for name in COLUMNS if name != "error")

_CORRUPT = "_corrupt_record"
_FILE = "_file"


def _is_text(arrow_type: object) -> bool:
    return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))


def _is_text_list(arrow_type: object) -> bool:
    is_list = pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
    return bool(is_list and _is_text(arrow_type.value_type))  # type: ignore[attr-defined]


# What a Parquet event file may use per column, and the name of the type to ask for.
_PARQUET_TYPES: dict[str, tuple[str, Callable[[object], bool]]] = {
    "purgatory": ("string", _is_text),
    "op_type": ("string", _is_text),
    "op_id": ("int64", lambda t: bool(pa.types.is_int64(t))),
    "keys": ("list<string>", _is_text_list),
    "created_at": ("double", lambda t: bool(pa.types.is_float64(t))),
    "deadline": ("double", lambda t: bool(pa.types.is_float64(t))),
    "settled_at": ("double", lambda t: bool(pa.types.is_float64(t))),
    "outcome": ("string", _is_text),
    "error": ("string", lambda t: _is_text(t) or bool(pa.types.is_null(t))),
}


@dataclass(frozen=True)
class EventFiles:
    """Event log files found under a local directory."""

    parquet: list[str]
    json: list[str]

    def __len__(self) -> int:
        return len(self.parquet) + len(self.json)


def is_local(location: str) -> bool:
    """True for a plain path or a ``file:`` URI, False for ``hdfs://``, ``s3a://``..."""
    scheme = urlparse(location).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def _local_path(location: str) -> Path:
    parsed = urlparse(location)
    return Path(parsed.path if parsed.scheme == "file" else location)


def find_event_files(events_dir: str) -> EventFiles:
    """List event files under a local directory, recursively, as Spark would see them.

    Hidden names (``.x``, ``_x``: unfinished files of the writers, Spark's
    ``_SUCCESS``) are skipped, at any depth.

    Args:
        events_dir: A directory, or a single event file.

    Raises:
        ReportError: The path does not exist, or holds no event file.
    """
    root = _local_path(events_dir)
    if not root.exists():
        raise ReportError(f"events directory not found: {events_dir}")
    parquet: list[str] = []
    json: list[str] = []
    if root.is_file():
        candidates = [root]
    else:
        candidates = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
            candidates.extend(
                Path(dirpath, name) for name in sorted(filenames) if not name.startswith((".", "_"))
            )
    for path in candidates:
        name = path.name.lower()
        if name.endswith(PARQUET_SUFFIXES):
            parquet.append(str(path))
        elif name.endswith(JSON_SUFFIXES):
            json.append(str(path))
    files = EventFiles(parquet, json)
    if not files:
        kinds = ", ".join(f"*{suffix}" for suffix in PARQUET_SUFFIXES + JSON_SUFFIXES)
        raise ReportError(f"no event files ({kinds}) under {events_dir}")
    return files


def check_parquet_files(paths: list[str]) -> None:
    """Read each Parquet footer and check the columns, before Spark touches the data.

    Raises:
        ReportError: A file is not readable Parquet, or lacks or mistypes a column.
    """
    for path in paths:
        try:
            schema = pq.read_schema(path)
        except Exception as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ReportError(f"corrupt Parquet file {path}: {reason}") from exc
        missing = [name for name in COLUMNS if name not in schema.names]
        if missing:
            raise ReportError(f"Parquet file {path} lacks column(s): {', '.join(missing)}")
        for name, (expected, accepts) in _PARQUET_TYPES.items():
            found = schema.field(name).type
            if not accepts(found):
                raise ReportError(
                    f"Parquet file {path}: column {name} has type {found}, expected {expected}"
                )


def preflight(events_dir: str) -> EventFiles | None:
    """The checks that need no Spark: files present, Parquet footers sound.

    Returns:
        The local event files, or ``None`` for a remote location (not checked).

    Raises:
        ReportError: See :func:`find_event_files` and :func:`check_parquet_files`.
    """
    if not is_local(events_dir):
        return None
    files = find_event_files(events_dir)
    check_parquet_files(files.parquet)
    return files


def read_events(spark: SparkSession, events_dir: str) -> DataFrame:
    """All events under ``events_dir`` with two extra columns for checking.

    The extra columns are ``_file`` (source file) and ``_corrupt_record`` (the
    raw text of a JSON line that did not parse, else null).

    Raises:
        ReportError: See :func:`find_event_files` and :func:`check_parquet_files`.
    """
    frames: list[DataFrame] = []
    files = preflight(events_dir)
    if files is not None:
        if files.parquet:
            frames.append(_parquet(spark, files.parquet))
        if files.json:
            frames.append(_json(spark, files.json))
    else:
        # Remote storage: let Spark list it; the same hidden-file rule applies.
        frames.append(_parquet(spark, [events_dir], glob="*.parquet"))
        frames.append(_json(spark, [events_dir], glob="*.{jsonl,json,jsonl.gz,json.gz}"))
    events = frames[0]
    for frame in frames[1:]:
        events = events.unionByName(frame)
    return events


def _parquet(spark: SparkSession, paths: list[str], glob: str | None = None) -> DataFrame:
    reader = spark.read.schema(EVENT_SCHEMA)
    if glob is not None:
        reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", glob)
    frame = reader.parquet(*paths)
    return frame.select(
        *COLUMNS, F.lit(None).cast(StringType()).alias(_CORRUPT), F.input_file_name().alias(_FILE)
    )


def _json(spark: SparkSession, paths: list[str], glob: str | None = None) -> DataFrame:
    schema = StructType([*EVENT_SCHEMA.fields, StructField(_CORRUPT, StringType())])
    reader = (
        spark.read.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", _CORRUPT)
    )
    if glob is not None:
        reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", glob)
    frame = reader.json(list(paths))
    return frame.select(*COLUMNS, _CORRUPT, F.input_file_name().alias(_FILE))


#: Prefix of the checking aggregates' names, kept apart from the report's figures.
CHECK_PREFIX = "_check_"


def check_aggregates() -> list[Column]:
    """Aggregates over the raw events (see :func:`read_events`) that
    :func:`check_results` turns into a verdict.

    Only counts: they can share a hash aggregation with the report's figures,
    so checking costs no extra pass over the data.
    """
    checks = {name: F.count(F.when(problem, 1)) for name, problem in _problems().items()}
    checks["rows"] = F.count(F.lit(1))
    return [column.alias(CHECK_PREFIX + name) for name, column in checks.items()]


def _problems() -> dict[str, Column]:
    corrupt = F.col(_CORRUPT).isNotNull()
    problems = {"corrupt": corrupt}
    problems.update({f"null_{name}": ~corrupt & F.col(name).isNull() for name in REQUIRED})
    problems["unknown"] = (
        ~corrupt & F.col("outcome").isNotNull() & ~F.col("outcome").isin(*OUTCOMES)
    )
    return problems


def check_results(raw: DataFrame, rows: list[dict[str, Any]], events_dir: str) -> int:
    """Raise on the first problem the :func:`check_aggregates` rows reveal.

    Args:
        raw: The raw events, to look up an example when there is a problem.
        rows: Aggregated rows (as dicts), one per group or a single one.
        events_dir: The input, for messages.

    Returns:
        The number of events.

    Raises:
        ReportError: No events, JSON lines that do not parse, events lacking a
            required value (a missing column), or an unknown outcome.
    """

    def total(name: str) -> int:
        return sum(int(row[CHECK_PREFIX + name]) for row in rows)

    def example(name: str) -> Any:
        # Only on the error path: a string min() in the main pass would turn its
        # hash aggregation into a sort of every event.
        found = raw.where(_problems()[name]).select(_FILE, "outcome").limit(1).collect()
        return found[0] if found else {_FILE: "?", "outcome": "?"}

    count = total("rows")
    if count == 0:
        raise ReportError(f"the event files under {events_dir} hold no events")
    if corrupt := total("corrupt"):
        raise ReportError(
            f"corrupt event file: {corrupt} line(s) are not valid event JSON, "
            f"e.g. in {_display(example('corrupt')[_FILE])}"
        )
    incomplete = [name for name in REQUIRED if total(f"null_{name}")]
    if incomplete:
        first = incomplete[0]
        raise ReportError(
            f"events lack required column(s) {', '.join(incomplete)}: "
            f"{total(f'null_{first}')} of {count} events have no {first}, "
            f"e.g. in {_display(example(f'null_{first}')[_FILE])}"
        )
    if unknown := total("unknown"):
        raise ReportError(
            f"{unknown} event(s) have an unknown outcome such as "
            f"{example('unknown')['outcome']!r} (expected one of {', '.join(OUTCOMES)})"
        )
    return count


def validate_events(raw: DataFrame, events_dir: str) -> int:
    """Check every event in one pass; return how many there are.

    Raises:
        ReportError: See :func:`check_results`.
    """
    return check_results(raw, [raw.agg(*check_aggregates()).collect()[0].asDict()], events_dir)


def load_events(spark: SparkSession, events_dir: str) -> tuple[DataFrame, int]:
    """Read and validate the event log.

    Returns:
        The events with exactly the event log columns, and their number.

    Raises:
        ReportError: The input is missing, empty or malformed.
    """
    raw = read_events(spark, events_dir)
    count = validate_events(raw, events_dir)
    return raw.select(*COLUMNS), count


def _display(uri: object) -> str:
    text = str(uri)
    return text[len("file://") :] if text.startswith("file://") else text
