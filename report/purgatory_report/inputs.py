"""Finding, checking and reading event log files (Parquet and JSON Lines)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, assert_never
from urllib.parse import urlparse

from purgatory_aio.events import COLUMNS, FIELDS, OUTCOMES, Kind
from purgatory_aio.events import REQUIRED as REQUIRED  # the columns every event must fill
from purgatory_report.errors import ReportError, missing_dependency

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        ArrayType,
        DataType,
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


def spark_type(kind: Kind) -> DataType:
    """The Spark type a column of this kind is read as."""
    match kind:
        case "string":
            return StringType()
        case "int64":
            return LongType()
        case "double":
            return DoubleType()
        case "list<string>":
            return ArrayType(StringType())
        case _:
            assert_never(kind)


#: The event log schema as Spark sees it, from the library's one definition
#: (:data:`purgatory_aio.events.FIELDS`); JSON is read with it, never inferred. Every
#: column is nullable here: a missing required value is found and reported by
#: :func:`check_results`, not refused by Spark.
EVENT_SCHEMA = StructType([StructField(f.name, spark_type(f.kind)) for f in FIELDS])

#: Marker files in which the writers record how many records they dropped.
DROP_MARKER = re.compile(r"_dropped-[0-9A-Za-z-]+\.json")

_PARTITION_DIR = re.compile(r"(date|hour)=(.+)")

_CORRUPT = "_corrupt_record"
_FILE = "_file"

#: The raw text of a JSON line that did not parse (null for good rows).
CORRUPT = _CORRUPT
#: How many identical copies of a row were read (after duplicates are collapsed).
COPIES = "_copies"


def _is_text(arrow_type: object) -> bool:
    return bool(pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type))


def _is_text_list(arrow_type: object) -> bool:
    is_list = pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
    return bool(is_list and _is_text(arrow_type.value_type))  # type: ignore[attr-defined]


def _parquet_accepts(kind: Kind) -> Callable[[object], bool]:
    """Whether an Arrow type found in a Parquet file can be read as this kind."""
    match kind:
        case "string":
            return _is_text
        case "int64":
            return lambda t: bool(pa.types.is_int64(t))
        case "double":
            return lambda t: bool(pa.types.is_float64(t))
        case "list<string>":
            return _is_text_list
        case _:
            assert_never(kind)


def _or_null(accepts: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda t: accepts(t) or bool(pa.types.is_null(t))


# What a Parquet event file may use per column, and the name of the type to ask for: a
# nullable column may also be all nulls (Arrow's null type).
_PARQUET_TYPES: dict[str, tuple[str, Callable[[object], bool]]] = {
    f.name: (f.kind, _or_null(_parquet_accepts(f.kind)) if f.nullable else _parquet_accepts(f.kind))
    for f in FIELDS
}


@dataclass(frozen=True)
class TimeRange:
    """``[since, until)`` in epoch seconds; ``None`` leaves that side open."""

    since: float | None = None
    until: float | None = None

    def __post_init__(self) -> None:
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ReportError(f"--{name} must be a finite time, got {value}")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ReportError(
                f"--since ({_iso(self.since)}) must be before --until ({_iso(self.until)})"
            )

    @property
    def bounded(self) -> bool:
        return self.since is not None or self.until is not None

    def overlaps(self, start: float, end: float) -> bool:
        """Whether ``[start, end)`` shares an instant with this range."""
        return (self.until is None or start < self.until) and (
            self.since is None or end > self.since
        )

    def describe(self) -> str:
        low = "the start" if self.since is None else _iso(self.since)
        high = "the end" if self.until is None else _iso(self.until)
        return f"settled from {low} until {high}"


def parse_time(text: str) -> float:
    """An ISO 8601 date or date-time (UTC unless it says otherwise), or epoch seconds.

    Raises:
        ReportError: ``text`` is neither.
    """
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ReportError(f"not a time: {text!r}")
        return value
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ReportError(
            f"not a time: {text!r} (expected e.g. 2026-01-31, 2026-01-31T14:00, or epoch seconds)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _iso(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def partition_span(name: str, parent: tuple[float, float] | None) -> tuple[float, float] | None:
    """The time span of a ``date=YYYY-MM-DD`` or ``hour=HH`` directory, else ``None``.

    Args:
        name: Directory name.
        parent: Span of the enclosing ``date=`` directory, for an ``hour=`` one.
    """
    match = _PARTITION_DIR.fullmatch(name)
    if match is None:
        return None
    kind, value = match.groups()
    try:
        if kind == "date":
            day = datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
            return day, day + 86_400.0
        hour = int(value)
    except ValueError:
        return None
    if parent is None or not 0 <= hour < 24:
        return None
    start = parent[0] + hour * 3_600.0
    return start, start + 3_600.0


def in_range(path: str, window: TimeRange) -> bool:
    """Whether the partition directories on ``path`` (if any) overlap ``window``."""
    span: tuple[float, float] | None = None
    for part in path.replace("\\", "/").split("/")[:-1]:
        found = partition_span(part, span)
        if found is not None:
            span = found
            if not window.overlaps(*span):
                return False
    return True


@dataclass(frozen=True)
class EventFiles:
    """Event log files found under a directory, and the writers' drop markers."""

    parquet: list[str]
    json: list[str]
    markers: list[str] = field(default_factory=list)
    #: Required columns no event of the local Parquet files leaves null, as their
    #: footers prove (see :func:`check_parquet_files`); empty when nothing is proven.
    #: JSON Lines rows may leave any column null: see :attr:`proven_null_free`.
    null_free: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return len(self.parquet) + len(self.json)

    @property
    def proven_null_free(self) -> frozenset[str]:
        """Required columns no event of the whole log leaves null (none with JSON Lines)."""
        return frozenset() if self.json else self.null_free


def is_local(location: str) -> bool:
    """True for a plain path or a ``file:`` URI, False for ``hdfs://``, ``s3a://``..."""
    scheme = urlparse(location).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def local_path(location: str) -> Path:
    parsed = urlparse(location)
    return Path(parsed.path if parsed.scheme == "file" else location)


def _kinds() -> str:
    return ", ".join(f"*{suffix}" for suffix in PARQUET_SUFFIXES + JSON_SUFFIXES)


def classify(paths: Iterable[str], window: TimeRange, events_dir: str) -> EventFiles:
    """Sort listed file paths into Parquet, JSON Lines and drop markers.

    Hidden names (``.x``, ``_x``: unfinished files of the writers, Spark's
    ``_SUCCESS``) are skipped, except the writers' drop markers; files in
    ``date=``/``hour=`` partitions outside ``window`` are left out.

    Raises:
        ReportError: No event file is left.
    """
    parquet: list[str] = []
    json_files: list[str] = []
    markers: list[str] = []
    for path in paths:
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if DROP_MARKER.fullmatch(name):
            markers.append(path)
            continue
        if name.startswith((".", "_")) or not in_range(path, window):
            continue
        lowered = name.lower()
        if lowered.endswith(PARQUET_SUFFIXES):
            parquet.append(path)
        elif lowered.endswith(JSON_SUFFIXES):
            json_files.append(path)
    files = EventFiles(parquet, json_files, markers)
    if not files:
        where = f" {window.describe()}" if window.bounded else ""
        raise ReportError(f"no event files ({_kinds()}){where} under {events_dir}")
    return files


def find_event_files(events_dir: str, window: TimeRange | None = None) -> EventFiles:
    """List event files under a local directory, recursively, as Spark would see them.

    ``date=``/``hour=`` directories outside ``window`` are not even listed.

    Args:
        events_dir: A directory, or a single event file.
        window: Settlement times wanted.

    Raises:
        ReportError: The path does not exist, is a file but not an event file,
            or holds no event file.
    """
    window = window or TimeRange()
    root = local_path(events_dir)
    if not root.exists():
        raise ReportError(f"events directory not found: {events_dir}")
    if root.is_file():
        if not root.name.lower().endswith(PARQUET_SUFFIXES + JSON_SUFFIXES):
            raise ReportError(f"not a directory: {events_dir} (and not an event file: {_kinds()})")
        return classify([str(root)], TimeRange(), events_dir)
    if not root.is_dir():
        raise ReportError(f"not a directory: {events_dir}")
    candidates: list[str] = []
    spans: dict[str, tuple[float, float] | None] = {str(root): None}
    for dirpath, dirnames, filenames in os.walk(root):
        parent = spans.pop(dirpath, None)
        kept = []
        for name in sorted(dirnames):
            if name.startswith((".", "_")):
                continue
            span = partition_span(name, parent) or parent
            if span is not None and not window.overlaps(*span):
                continue  # partition pruning: never listed, never read
            spans[os.path.join(dirpath, name)] = span
            kept.append(name)
        dirnames[:] = kept
        candidates.extend(os.path.join(dirpath, name) for name in sorted(filenames))
    return classify(candidates, TimeRange(), events_dir)


def list_remote(spark: SparkSession, events_dir: str, window: TimeRange) -> EventFiles:
    """:func:`find_event_files` for a Hadoop URI, listed through Spark's file system."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    root = jvm.org.apache.hadoop.fs.Path(events_dir)
    fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    if not fs.exists(root):
        raise ReportError(f"events directory not found: {events_dir}")
    found: list[str] = []
    listing = fs.listFiles(root, True)
    while listing.hasNext():
        found.append(str(listing.next().getPath().toString()))
    prefix = str(fs.makeQualified(root).toString()).rstrip("/")
    relative = [p[len(prefix) :] if p.startswith(prefix) else p for p in found]
    keep = {rel: full for rel, full in zip(relative, found, strict=True)}
    files = classify(keep, window, events_dir)
    return EventFiles(
        [keep[p] for p in files.parquet],
        [keep[p] for p in files.json],
        [keep[p] for p in files.markers],
    )


def read_drop_markers(spark: SparkSession, files: EventFiles) -> dict[str, int]:
    """Records each writer dropped, by producer id, from its drop marker.

    Raises:
        ReportError: A marker is not the JSON a writer writes.
    """
    texts: list[tuple[str, str]] = []
    local = [path for path in files.markers if is_local(path)]
    for path in local:
        texts.append((path, local_path(path).read_text(encoding="utf-8")))
    remote = [path for path in files.markers if not is_local(path)]
    if remote:
        rows = spark.read.option("wholetext", "true").text(remote).collect()
        texts.extend(("remote drop marker", row[0]) for row in rows)
    dropped: dict[str, int] = {}
    for path, text in texts:
        try:
            record = json.loads(text)
            producer, count = str(record["producer"]), int(record["dropped"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ReportError(f"unreadable drop marker {path}: {exc}") from None
        dropped[producer] = max(dropped.get(producer, 0), count)
    return dropped


def check_parquet_files(paths: list[str]) -> frozenset[str]:
    """Read each Parquet footer once: check the columns, before Spark touches the data,
    and find the required columns its statistics prove null-free.

    A column is null-free when every row group of every file says it holds no null (for
    ``keys``: no null or empty list, no null key). The report then leaves those
    columns' null checks out of its main pass: the check of ``keys`` alone made that
    pass read every key list (10M events, local[2]). A row group without statistics
    proves nothing.

    Returns:
        The required columns proven null-free.

    Raises:
        ReportError: A file is not readable Parquet, or lacks or mistypes a column.
    """
    proven = set(REQUIRED)
    for path in paths:
        try:
            metadata = pq.read_metadata(path)
            schema = metadata.schema.to_arrow_schema()
        except Exception as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ReportError(f"corrupt Parquet file {path}: {reason}") from exc
        missing = [name for name in REQUIRED if name not in schema.names]
        if missing:
            raise ReportError(f"Parquet file {path} lacks column(s): {', '.join(missing)}")
        for name, (expected, accepts) in _PARQUET_TYPES.items():
            if name not in schema.names:
                continue
            found = schema.field(name).type
            if not accepts(found):
                raise ReportError(
                    f"Parquet file {path}: column {name} has type {found}, expected {expected}"
                )
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            seen = set()
            for index in range(row_group.num_columns):
                chunk = row_group.column(index)
                name = chunk.path_in_schema.split(".", 1)[0]
                seen.add(name)
                stats = chunk.statistics
                if stats is None or not stats.has_null_count or stats.null_count:
                    proven.discard(name)
            proven &= seen
    return frozenset(proven)


def preflight(events_dir: str, window: TimeRange | None = None) -> EventFiles | None:
    """The checks that need no Spark: files present, Parquet footers sound.

    Returns:
        The local event files, or ``None`` for a remote location (listed later, by Spark).

    Raises:
        ReportError: See :func:`find_event_files` and :func:`check_parquet_files`.
    """
    if not is_local(events_dir):
        return None
    files = find_event_files(events_dir, window)
    return dataclasses.replace(files, null_free=check_parquet_files(files.parquet))


def list_event_files(
    spark: SparkSession, events_dir: str, window: TimeRange | None = None
) -> EventFiles:
    """The event files to read, local (checked) or remote, partitions pruned.

    Raises:
        ReportError: See :func:`find_event_files` and :func:`check_parquet_files`.
    """
    window = window or TimeRange()
    files = preflight(events_dir, window)
    return files if files is not None else list_remote(spark, events_dir, window)


def read_events(spark: SparkSession, files: EventFiles) -> DataFrame:
    """All events of ``files`` with two extra columns for checking.

    The extra columns are ``_file`` (source file) and ``_corrupt_record`` (the
    raw text of a JSON line that did not parse, else null).
    """
    frames: list[DataFrame] = []
    if files.parquet:
        frames.append(_parquet(spark, files.parquet))
    if files.json:
        frames.append(_json(spark, files.json))
    events = frames[0]
    for frame in frames[1:]:
        events = events.unionByName(frame)
    return events


def _parquet(spark: SparkSession, paths: list[str]) -> DataFrame:
    frame = spark.read.schema(EVENT_SCHEMA).parquet(*paths)
    return frame.select(
        *COLUMNS, F.lit(None).cast(StringType()).alias(_CORRUPT), F.input_file_name().alias(_FILE)
    )


def _json(spark: SparkSession, paths: list[str]) -> DataFrame:
    schema = StructType([*EVENT_SCHEMA.fields, StructField(_CORRUPT, StringType())])
    reader = (
        spark.read.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", _CORRUPT)
    )
    frame = reader.json(list(paths))
    return frame.select(*COLUMNS, _CORRUPT, F.input_file_name().alias(_FILE))


#: Prefix of the checking aggregates' names, kept apart from the report's figures.
CHECK_PREFIX = "_check_"


def check_aggregates(weight: Column | None = None, null_free: Collection[str] = ()) -> list[Column]:
    """Aggregates over the raw events (see :func:`read_events`) that
    :func:`check_results` turns into a verdict.

    Only counts: they can share a hash aggregation with the report's figures,
    so checking costs no extra pass over the data.

    Args:
        weight: Rows each row stands for (the copy count of collapsed duplicates).
        null_free: Columns known to hold no null (:attr:`EventFiles.null_free`): not checked.
    """
    each = F.lit(1) if weight is None else weight
    skipped = {f"null_{name}" for name in null_free}
    checks = {
        name: F.coalesce(F.sum(F.when(problem, each)), F.lit(0))
        for name, problem in _problems().items()
        if name not in skipped
    }
    checks["rows"] = F.coalesce(F.sum(each), F.lit(0))
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

    def total(name: str) -> int:  # a check left out (see check_aggregates) found nothing
        return sum(int(row.get(CHECK_PREFIX + name, 0)) for row in rows)

    def example(name: str) -> Any:
        # Only on the error path: a string min() in the main pass would turn its
        # hash aggregation into a sort of every event.
        # Every column is selected: JSON parsing skips unselected fields, and a line
        # whose only fault is a field's type would then not be corrupt at all.
        found = raw.where(_problems()[name]).select(_FILE, *COLUMNS).limit(1).collect()
        return found[0] if found else {_FILE: "?", "outcome": "?"}

    count = total("rows")
    if count == 0:
        raise ReportError(f"the event files under {events_dir} hold no events")
    if corrupt := total("corrupt"):
        where = _display(example("corrupt")[_FILE])
        located = describe_json_problem(where) if where != "?" and is_local(where) else None
        raise ReportError(
            f"corrupt event file: {corrupt} line(s) are not valid event records, "
            f"e.g. {located or 'in ' + where}"
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


def _display(uri: object) -> str:
    text = str(uri)
    return text[len("file:") :].replace("///", "/", 1) if text.startswith("file:") else text


# What a JSON value of each kind of column must be, and how to say so.
_JSON_KINDS: dict[Kind, tuple[str, Callable[[object], bool]]] = {
    "string": ("a string", lambda v: isinstance(v, str)),
    "int64": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "double": ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    "list<string>": (
        "a list of strings",
        lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    ),
}
_FIELD_KINDS: dict[str, Kind] = {f.name: f.kind for f in FIELDS}

#: Lines :func:`describe_json_problem` reads before giving up looking.
_SCAN_LIMIT = 10_000_000


def describe_json_problem(path: str) -> str:
    """Where and why the first bad line of a local JSON Lines file is bad, in one line.

    Example: ``events.jsonl line 3: field op_id is "7" (a string), expected an integer``.
    """
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if number > _SCAN_LIMIT:
                    break
                if not line.strip():
                    continue
                problem = _line_problem(line)
                if problem:
                    return f"{path} line {number}: {problem}"
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path}: unreadable ({exc})"
    return f"in {path}"


def _line_problem(line: str) -> str | None:
    try:
        record = json.loads(line)
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, expected an object"
    for name, kind in _FIELD_KINDS.items():
        value = record.get(name)
        if value is None:
            continue
        expected, accepts = _JSON_KINDS[kind]
        if not accepts(value):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return f"field {name} is {shown} ({_json_kind(value)}), expected {expected}"
    return None


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    for description, accepts in _JSON_KINDS.values():
        if accepts(value):
            return description
    return f"a {type(value).__name__}"
