"""Bad data is counted and said, never silently counted twice or in a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from eventlog_reference import START, by_group
from purgatory_report.cli import main
from purgatory_report.inputs import TimeRange, find_event_files
from purgatory_report.metrics import meaningful
from purgatory_report.quality import REASONS

from purgatory_aio.eventlog import JsonLinesWriter, ParquetWriter
from purgatory_aio.events import OperationEvent

GOOD = OperationEvent("bad", "Op", 1, ["k"], START, START + 1.0, START + 0.5, "completed", None)

#: One record per exclusion reason (Parquet: it can hold NaN), plus one good one.
BAD = {
    "non_finite_time": GOOD._replace(op_id=2, settled_at=float("nan")),
    "implausible_time": GOOD._replace(
        op_id=3, created_at=START * 1000, deadline=START * 1000 + 1000, settled_at=START * 1000
    ),
    "settled_before_created": GOOD._replace(op_id=4, settled_at=START - 5.0),
    "deadline_before_created": GOOD._replace(op_id=5, deadline=START - 1.0),
}


@pytest.fixture(scope="module")
def dirty_log(event_log: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference log, one of its files twice, bad records and a writer's drop marker."""
    directory = tmp_path_factory.mktemp("dirty")
    shutil.copytree(event_log, directory / "log")
    first = sorted((directory / "log").rglob("*.parquet"))[0]
    shutil.copy(first, first.with_name("copy-" + first.name))
    with ParquetWriter(directory / "log" / "bad") as writer:
        for event in [GOOD, *BAD.values()]:
            writer.emit(event)
    (directory / "log" / "_dropped-feedface.json").write_text(
        json.dumps({"producer": "feedface", "dropped": 17, "written": 3})
    )
    return directory / "log"


@pytest.fixture(scope="module")
def dirty_report(spark: Any, dirty_log: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dirty-report") / "report"
    assert main([str(dirty_log), "--out", str(out)], spark=spark) == 0
    return out


def copied_rows(dirty_log: Path) -> int:
    import pyarrow.parquet as pq

    (copy,) = dirty_log.rglob("copy-*.parquet")
    return int(pq.read_metadata(copy).num_rows)


@pytest.mark.spark
def test_exact_duplicates_are_dropped_and_counted(
    dirty_report: Path, dirty_log: Path, events: list[OperationEvent]
) -> None:
    quality = json.loads((dirty_report / "data_quality.json").read_text())
    assert quality["duplicates_dropped"] == copied_rows(dirty_log)
    summary = {
        (r["purgatory"], r["op_type"]): r
        for r in json.loads((dirty_report / "summary.json").read_text())
    }
    for group, members in by_group(events).items():
        assert summary[group]["count"] == len(members)  # not doubled
    assert sum(r["duplicates_dropped"] for r in summary.values()) == copied_rows(dirty_log)


@pytest.mark.spark
def test_rows_that_cannot_be_right_are_excluded_by_reason(dirty_report: Path) -> None:
    quality = json.loads((dirty_report / "data_quality.json").read_text())
    assert quality["excluded"] == dict.fromkeys(REASONS, 1)
    (row,) = (
        r
        for r in json.loads((dirty_report / "summary.json").read_text())
        if r["purgatory"] == "bad"
    )
    assert row["count"] == 1
    assert row["excluded"] == dict.fromkeys(REASONS, 1)
    assert 0 < row["latency_p99"] < 1
    text = (dirty_report / "report.md").read_text()
    for meaning in REASONS.values():
        assert f"| {meaning} | 1 |" in text


@pytest.mark.spark
def test_writer_drops_make_the_input_incomplete(dirty_report: Path) -> None:
    quality = json.loads((dirty_report / "data_quality.json").read_text())
    assert quality["dropped_by_writers"] == 17
    assert quality["complete"] is False
    assert "**Input incomplete**" in (dirty_report / "report.md").read_text()


def bad_group_figures(report: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary row and the hot keys of the purgatory of :data:`BAD`'s records."""
    import pyarrow.parquet as pq

    summary = json.loads((report / "summary.json").read_text())
    (row,) = (r for r in summary if r["purgatory"] == "bad")
    keys = pq.read_table(report / "tables" / "hot_keys").to_pylist()
    return row, [r for r in keys if r["purgatory"] == "bad"]


@pytest.mark.spark
@pytest.mark.parametrize("copies", [1, 2], ids=["unique", "duplicated"])
def test_excluded_rows_are_in_no_percentile_and_no_hot_key(
    spark: Any, tmp_path: Path, copies: int
) -> None:
    """Percentiles and hot keys start on every row; with rows to exclude they are
    computed again without them (with and without duplicates to collapse first)."""
    with ParquetWriter(tmp_path / "log") as writer:
        for event in [GOOD, *BAD.values()]:
            writer.emit(event)
    for written in list((tmp_path / "log").rglob("*.parquet")):
        for copy in range(1, copies):
            shutil.copy(written, written.with_name(f"copy-{copy}-{written.name}"))
    assert main([str(tmp_path / "log"), "--out", str(tmp_path / "report")], spark=spark) == 0
    row, keys = bad_group_figures(tmp_path / "report")
    assert row["excluded"] == dict.fromkeys(REASONS, 1)
    assert row["duplicates_dropped"] == (copies - 1) * (1 + len(BAD))
    assert row["latency_p50"] == row["latency_p99"] == 0.5  # GOOD's alone
    assert [(r["key"], r["watched"], r["completed"]) for r in keys] == [("k", 1, 1)]
    assert not spark.sparkContext.statusTracker().getActiveJobsIds()


@pytest.mark.spark
def test_strict_fails_in_one_line_and_leaves_the_previous_report(
    capsys, spark: Any, dirty_log: Path, dirty_report: Path
) -> None:
    before = {p: p.read_bytes() for p in dirty_report.rglob("*") if p.is_file()}
    assert main([str(dirty_log), "--out", str(dirty_report), "--strict"], spark=spark) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("purgatory-report: error: --strict: the input has problems")
    assert "exact duplicate" in err[0]
    assert "input incomplete" in err[0]
    assert {p: p.read_bytes() for p in dirty_report.rglob("*") if p.is_file()} == before
    assert not [p for p in dirty_report.parent.iterdir() if p.name.startswith(".")]
    assert not spark.sparkContext.statusTracker().getActiveJobsIds()  # the passes stopped


def test_since_and_until_prune_date_hour_partitions(tmp_path: Path) -> None:
    with JsonLinesWriter(tmp_path) as writer:
        for hour in range(5):
            writer.emit(GOOD._replace(op_id=hour, settled_at=START + hour * 3600.0))
    everything = find_event_files(str(tmp_path))
    assert len(everything.json) == 5
    # START is 22:13 UTC: hours 22, 23, 00, 01, 02 across two dates.
    window = TimeRange(since=START + 3600.0, until=START + 3 * 3600.0)
    chosen = find_event_files(str(tmp_path), window)
    assert [Path(p).parent.name for p in chosen.json] == ["hour=23", "hour=00", "hour=01"]


@pytest.mark.spark
def test_since_and_until_count_only_their_window(spark: Any, tmp_path: Path) -> None:
    with JsonLinesWriter(tmp_path / "events") as writer:
        for hour in range(5):
            writer.emit(GOOD._replace(op_id=hour, settled_at=START + hour * 3600.0))
    since = START + 3600.0
    args = ["--since", str(since), "--until", "2023-11-15T01:00:00"]
    out = tmp_path / "out"
    assert main([str(tmp_path / "events"), "--out", str(out), *args], spark=spark) == 0
    (row,) = json.loads((out / "summary.json").read_text())
    assert row["count"] == 2  # 23:13 and 00:13; 01:13 is after --until
    assert "Only operations settled from 2023-11-14T23:13:20Z" in (out / "report.md").read_text()


def test_tail_percentiles_are_withheld_where_the_rank_error_spans_the_tail() -> None:
    assert meaningful(0.9999, 5_000)  # below the accuracy: exact
    assert meaningful(0.999, 1_000_000)
    assert not meaningful(0.9999, 1_000_000)
    assert not meaningful(0.9995, 20_000)


@pytest.mark.spark
def test_whatif_counts_hold_at_the_fraction_boundaries(spark: Any, tmp_path: Path) -> None:
    """Latencies exactly at ``f * timeout`` (equal, one ulp either side), a zero timeout,
    a zero latency and an excluded record: the counts of plain Python, which compares
    each fraction on its own."""
    import math

    import pyarrow.parquet as pq
    from eventlog_reference import would_expire
    from purgatory_report.metrics import WHATIF_FRACTIONS

    events = []
    op_id = 0

    def add(timeout: float, latency: float, outcome: str = "completed") -> None:
        nonlocal op_id
        op_id += 1
        created = START + op_id
        deadline, settled = created + timeout, created + latency
        events.append(
            OperationEvent("p", "Op", op_id, ["k"], created, deadline, settled, outcome, None)
        )

    for fraction in WHATIF_FRACTIONS:
        for timeout in (0.2, 0.3, 1.0, 7.0):
            at = fraction * timeout
            for latency in (at, math.nextafter(at, 0.0), math.nextafter(at, math.inf)):
                add(timeout, latency)
    add(0.0, 0.0)
    add(0.0, 0.5)
    add(0.5, 0.0)
    add(0.5, 0.9, "expired")
    add(0.5, 0.9, "cancelled")
    with ParquetWriter(tmp_path / "events") as writer:
        for event in events:
            writer.emit(event)
        writer.emit(events[0]._replace(op_id=10_000, deadline=START - 1.0))  # excluded
    out = tmp_path / "out"
    assert main([str(tmp_path / "events"), "--out", str(out)], spark=spark) == 0
    rows = pq.read_table(out / "tables" / "whatif").to_pylist()
    found = {row["timeout_fraction"]: row["would_expire"] for row in rows}
    assert found == {fraction: would_expire(events, fraction) for fraction in WHATIF_FRACTIONS}


@pytest.mark.spark
def test_percentiles_are_observed_values_within_the_rank_error_and_exact_when_few(
    spark: Any,
) -> None:
    """A group beyond what a sketch keeps (150,000 values, many tied), one within it
    (3,000: exact, the value at rank ceil(q * n)), expired operations early and late,
    and a group whose every value is NaN (no curve, no error)."""
    import math
    from bisect import bisect_left, bisect_right

    from purgatory_report.metrics import (
        CURVE_QUANTILES,
        JUDGED,
        RANK_ERROR,
        SKETCH_K,
        percentile_input,
    )
    from purgatory_report.report import _curves
    from pyspark.sql import functions as F

    created = F.lit(1.7e9) + F.col("id") / 1000
    big = spark.range(150_000).select(
        F.lit("p").alias("purgatory"),
        F.lit("Big").alias("op_type"),
        F.lit("completed").alias("outcome"),
        created.alias("created_at"),
        (created + 1.0).alias("deadline"),
        # Log-normal, rounded to the millisecond: long runs of equal values.
        (created + F.round(F.exp(F.randn(seed=7)) / 10, 3)).alias("settled_at"),
    )
    small = spark.range(3_000).select(
        F.lit("p").alias("purgatory"),
        F.lit("Small").alias("op_type"),
        F.when(F.col("id") % 3 == 0, "expired").otherwise("completed").alias("outcome"),
        created.alias("created_at"),
        (created + 0.5).alias("deadline"),
        (created + 0.5 + (F.col("id") * 7919 % 1013 - 500) / 1e4).alias("settled_at"),
    )
    nan = spark.range(5).select(
        F.lit("p").alias("purgatory"),
        F.lit("NaN").alias("op_type"),
        F.lit("completed").alias("outcome"),
        F.lit(float("nan")).alias("created_at"),
        F.lit(1.7e9).alias("deadline"),
        F.lit(1.7e9).alias("settled_at"),
    )
    events = big.unionByName(small).unionByName(nan)
    judged = events.select("op_type", "outcome", percentile_input()).collect()
    curves = _curves(events)
    assert curves[("p", "NaN", "completed")] is None
    for key in [("p", "Big", "completed"), ("p", "Small", "completed"), ("p", "Small", "expired")]:
        values = sorted(r[JUDGED] for r in judged if (r["op_type"], r["outcome"]) == key[1:])
        n = len(values)
        allowed = 0 if n <= SKETCH_K else RANK_ERROR * n
        for quantile, reported in zip(CURVE_QUANTILES, curves[key], strict=True):
            rank = min(max(math.ceil(quantile * n), 1), n)
            first, last = bisect_left(values, reported) + 1, bisect_right(values, reported)
            assert first <= last, (key, quantile)  # an observed value
            assert first - allowed <= rank <= last + allowed, (key, quantile)


@pytest.mark.spark
def test_hot_key_top_n_equals_a_full_sort(spark: Any) -> None:
    from purgatory_report import metrics

    rows = [("p", "Op", f"key-{n:04d}", (n * 7919) % 503, 0, 0, 0, 0) for n in range(2_000)]
    columns = ["purgatory", "op_type", "key", "watched", *("completed", "expired", "cancelled")]
    frame = spark.createDataFrame(rows, [*columns, "shutdown"])
    found = [(r["rank"], r["key"]) for r in metrics.top_keys(frame, 25).orderBy("rank").collect()]
    expected = sorted(rows, key=lambda r: (-r[3], r[2]))[:25]
    assert found == [(rank, r[2]) for rank, r in enumerate(expected, 1)]


@pytest.mark.spark
def test_hot_keys_ranked_on_the_driver_are_the_ones_spark_ranks(spark: Any) -> None:
    """Ties in the count (the smaller key first, by its bytes), null and non-ASCII keys,
    a null group, groups with fewer keys than asked: the same rows in the same order."""

    from purgatory_report import metrics

    rows = [
        (purgatory, op_type, key, watched, watched // 2, watched // 3, 0, 0, watched / 7)
        for purgatory, op_type, count in (("p", "A", 40), ("p", "B", 3), ("q", "A", 30))
        for n in range(count)
        for key, watched in ((f"k{n % 11}-{n}", (n * 7919) % 13 + 1),)
    ]
    rows += [
        ("p", "A", None, 5, 0, 0, 0, 0, 0.0),
        ("p", "A", "é", 13, 0, 0, 0, 0, 0.0),
        ("p", "A", "z", 13, 0, 0, 0, 0, 0.0),
        ("p", "A", "Z", 13, 0, 0, 0, 0, 0.0),
        (None, "A", "k", 2, 0, 0, 0, 0, 0.0),
    ]
    schema = (
        "purgatory string, op_type string, key string, watched long, completed long, "
        "expired long, cancelled long, shutdown long, expiry_ratio double"
    )
    frame = spark.createDataFrame(rows, schema)
    for top in (1, 5, 20):
        expected = [
            row.asDict()
            for row in metrics.top_keys(frame, top).orderBy(*metrics.GROUP, "rank").collect()
        ]
        found = metrics.top_keys_table(frame.toArrow(), top)
        assert found == expected, top
    empty = metrics.top_keys_table(frame.limit(0).toArrow(), 3)
    assert empty == []


@pytest.mark.spark
def test_a_key_listed_twice_counts_once_in_short_and_long_lists(spark: Any) -> None:
    """Repeated keys, null keys anywhere, lists of one to seven keys and longer than the
    in-place scan handles."""
    from purgatory_report import metrics

    long_list = [f"k{n % 7}" for n in range(3 * metrics.SHORT_KEY_LIST)]
    lists = [
        ["a", "a", "b"],
        [None, "a", None],
        ["b", "a", "b", "a"],
        long_list,
        [],
        ["a"],
        [None],
        [None, None],
        ["a", None],
        ["c", "a"],
        ["a", "a"],
        ["a", "b", "c", "d"],
        ["a", "b", "c", "a"],
        ["a", "b", "c", "d", "e"],
        ["a", "b", "c", "d", "b"],
        ["e", "d", "c", "b", "a", "e", None],
    ]
    outcomes = ["completed", "expired", "cancelled", "shutdown"] * 4
    frame = spark.createDataFrame(
        [("p", "Op", keys, outcome) for keys, outcome in zip(lists, outcomes, strict=True)],
        "purgatory string, op_type string, keys array<string>, outcome string",
    )
    found = {
        row["key"]: (row["watched"], row["expired"]) for row in metrics.key_stats(frame).collect()
    }
    expected: dict[str | None, tuple[int, int]] = {}
    for keys, outcome in zip(lists, outcomes, strict=True):
        for key in dict.fromkeys(keys):
            watched, expired = expected.get(key, (0, 0))
            expected[key] = (watched + 1, expired + (outcome == "expired"))
    assert found == expected


@pytest.mark.spark
def test_uris_go_through_hadoop_file_system(
    spark: Any,
    event_log: Path,
    events: list[OperationEvent],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``file:`` URIs taken down the path of ``hdfs://``/``s3a://``: listed, read, the
    small files copied up and the staging directory renamed, all by Hadoop's file system."""
    from purgatory_report import inputs, output

    def only_plain_paths(location: str) -> bool:
        return ":" not in location

    monkeypatch.setattr(inputs, "is_local", only_plain_paths)
    monkeypatch.setattr(output, "is_local", only_plain_paths)
    target = tmp_path / "remote-report"
    for _ in range(2):  # the second run replaces the first
        assert main([event_log.as_uri(), "--out", target.as_uri()], spark=spark) == 0
    rows = json.loads((target / "summary.json").read_text())
    assert sum(row["count"] for row in rows) == len(events)
    assert (target / "report.md").is_file()
    assert (target / "charts" / "latency.png").is_file()
    assert (target / "tables" / "hot_keys").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["remote-report"]


def checked_identities(spark: Any, tmp_path: Path, records: list[OperationEvent]) -> Any:
    """``records`` written as one Parquet file, read back and checked: (quality, frame)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from purgatory_report.inputs import CORRUPT, read_events
    from purgatory_report.quality import Quality
    from purgatory_report.report import check_identities

    from purgatory_aio.eventlog import arrow_schema
    from purgatory_aio.events import COLUMNS

    path = tmp_path / "events" / "part.parquet"
    path.parent.mkdir()
    pq.write_table(
        pa.Table.from_pylist([r.as_dict() for r in records], schema=arrow_schema()), path
    )
    frame = read_events(spark, find_event_files(str(path.parent))).select(*COLUMNS, CORRUPT)
    quality = Quality()
    check_identities(frame, quality)
    return quality, frame


@pytest.mark.spark
def test_copies_and_conflicting_ids_are_told_apart_in_one_pass(spark: Any, tmp_path: Path) -> None:
    """A record twice is a duplicate; two records under one (producer, purgatory, op_id)
    are a conflict; without a producer only exact copies count."""
    a = GOOD._replace(producer="w1")
    b = a._replace(settled_at=START + 0.25)  # same id, other contents
    c = a._replace(op_id=9)
    d = a._replace(op_id=10, error=None, keys=["k", "x"])
    e = d._replace(keys=["x", "k"])  # the same id with its keys in another order
    orphan = GOOD._replace(op_id=11, producer=None)
    other = orphan._replace(settled_at=START + 0.75)  # no producer: never a conflict
    records = [a, a, b, a, c, c, d, e, orphan, orphan, other]
    quality, _ = checked_identities(spark, tmp_path, records)
    distinct = set(map(str, records))
    assert quality.rows_read == len(records)
    assert quality.duplicates == len(records) - len(distinct) == 4
    assert (quality.conflicting_ids, quality.conflicting_rows) == (2, 4)  # (a, b) and (d, e)


@pytest.mark.spark
def test_id_blocks_hold_at_their_edges(spark: Any, tmp_path: Path) -> None:
    """Ids around block edges (63/64, -1/0, the extremes of a long), many writers sharing
    ids, and repeats within and across blocks: counted as a record-by-record check would."""
    from purgatory_report.quality import Quality
    from purgatory_report.report import check_identities

    edges = [-(2**63), -(2**63) + 1, -65, -64, -63, -1, 0, 1, 63, 64, 127, 128, 2**63 - 1]
    records = [GOOD._replace(producer=writer, op_id=op) for writer in ("w1", "w2") for op in edges]
    repeated = [
        GOOD._replace(producer="w1", op_id=64),  # a copy, at a block's first id
        GOOD._replace(producer="w1", op_id=63, settled_at=START + 0.75),  # a conflict, last id
        GOOD._replace(producer="w2", op_id=-(2**63)),  # a copy at the smallest long
        GOOD._replace(producer=None, op_id=5),
        GOOD._replace(producer=None, op_id=5),  # no producer: a copy, never a conflict
        GOOD._replace(producer=None, op_id=5, settled_at=START + 0.25),
    ]
    records += repeated
    quality, frame = checked_identities(spark, tmp_path, records)

    by_id: dict[tuple[object, ...], set[str]] = {}
    for record in records:
        by_id.setdefault((record.producer, record.purgatory, record.op_id), set()).add(str(record))
    conflicting = [ids for key, ids in by_id.items() if key[0] is not None and len(ids) > 1]
    assert quality.rows_read == len(records)
    assert quality.duplicates == len(records) - sum(len(ids) for ids in by_id.values()) == 3
    assert quality.conflicting_ids == len(conflicting) == 1
    assert quality.conflicting_rows == sum(len(ids) for ids in conflicting) == 2

    clean = Quality()
    check_identities(frame.where(frame.producer.isNotNull()).dropDuplicates(), clean)
    assert (clean.duplicates, clean.conflicting_ids) == (0, 1)


@pytest.mark.spark
def test_writers_whose_hashes_collide_are_still_counted_exactly(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every writer hashed alike shares its id blocks with the others: the shared blocks
    only take the exact pass, and the counts are those of distinct hashes."""
    from purgatory_report import report
    from pyspark.sql import functions as F

    records = [
        GOOD._replace(producer=writer, purgatory=purgatory, op_id=op)
        for writer, purgatory in (("w1", "fetch"), ("w2", "fetch"), ("w1", "produce"))
        for op in range(70)
    ]
    records += [records[5], records[75]._replace(settled_at=START + 0.25)]
    for name in ("distinct", "colliding"):
        (tmp_path / name).mkdir()
    distinct, _ = checked_identities(spark, tmp_path / "distinct", records)
    monkeypatch.setattr(report, "writer_hash", lambda: F.lit(0).cast("long"))
    colliding, _ = checked_identities(spark, tmp_path / "colliding", records)
    assert (distinct.duplicates, distinct.conflicting_ids, distinct.conflicting_rows) == (1, 1, 2)
    assert colliding.as_dict() == distinct.as_dict()
