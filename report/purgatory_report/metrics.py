"""The figures of the report, as Spark aggregations over the event log.

Percentiles are read from a KLL sketch per group (Spark's ``kll_sketch_agg_double``,
Apache DataSketches, with the largest size it takes, :data:`SKETCH_K`). The value
reported for quantile ``q`` of ``n`` values is one of the observed values. Up to
:data:`SKETCH_K` values the sketch keeps them all and the value is exact: the one at
rank ``ceil(q * n)``. Above, its rank is within ``n / ACCURACY`` of that rank
(relative rank error :data:`RANK_ERROR`, 0.01% of ``n``: at most 100 positions off
among a million), the bound Spark's ``percentile_approx`` keeps at accuracy 10,000.
The sketch is randomized: its own error is 0.0048% of ``n`` with 99% confidence
(DataSketches' figure for this size), less than half the bound, which it exceeds with
vanishing probability; two runs over the same events can report slightly different
values for a group of more than :data:`SKETCH_K`, each within the bound.
"""

from __future__ import annotations

from typing import Any

from purgatory_aio.events import OUTCOMES
from purgatory_report.errors import missing_dependency

try:
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import Column, DataFrame, Window
    from pyspark.sql import functions as F
except ImportError as exc:
    raise missing_dependency(exc) from exc

#: Accuracy of the percentiles, in ``percentile_approx``'s terms: ``1 / ACCURACY`` is
#: the relative rank error promised.
ACCURACY = 10_000
RANK_ERROR = 1.0 / ACCURACY

#: Size of the KLL sketches (``k``; DataSketches takes 8 to 65,535): the values a group
#: holds before its percentiles become approximate.
SKETCH_K = 65_535

#: Grouping of every per-purgatory figure.
GROUP = ("purgatory", "op_type")

#: Completion latency percentiles in the summary, with their summary key suffixes.
HEADLINE_QUANTILES: dict[str, float] = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}

#: Quantiles of the latency curve (table ``latency_quantiles`` and its chart).
CURVE_QUANTILES: tuple[float, ...] = tuple(
    sorted(
        {k / 100 for k in range(1, 100)}
        | {0.995, 0.999, 0.9995, 0.9999}
        | set(HEADLINE_QUANTILES.values())
    )
)

#: A tail percentile is reported only when the rank error is at most this share of
#: the tail beyond it: ``n / ACCURACY <= TAIL_SHARE * (1 - q) * n``.
TAIL_SHARE = 0.1


def meaningful(quantile: float, n: int) -> bool:
    """Whether a percentile at :data:`ACCURACY` says something about ``quantile``.

    Below :data:`ACCURACY` values the promise is the exact value; above, the rank error
    ``n / ACCURACY`` must stay within :data:`TAIL_SHARE` of the tail ``(1 - q) n``:
    p99.9 qualifies at accuracy 10,000, p99.99 (whose error spans its whole tail) does not.
    """
    return n <= ACCURACY or TAIL_SHARE * (1.0 - quantile) + 1e-12 >= RANK_ERROR


#: Expiration lateness percentiles.
LATENESS_QUANTILES: dict[str, float] = {"p50": 0.5, "p99": 0.99}

#: Candidate timeouts of the what-if, as fractions of the timeout each operation had.
WHATIF_FRACTIONS: tuple[float, ...] = tuple(k / 20 for k in range(1, 21))


def latency() -> Column:
    """``settled_at - created_at``: completion latency, for completed operations."""
    return F.col("settled_at") - F.col("created_at")


def lateness() -> Column:
    """``settled_at - deadline``: how late an expired operation was expired."""
    return F.col("settled_at") - F.col("deadline")


def timeout() -> Column:
    """``deadline - created_at``: the timeout an operation was given."""
    return F.col("deadline") - F.col("created_at")


def _is(outcome: str) -> Column:
    return F.col("outcome") == outcome


def _outcome_counts() -> list[Column]:
    return [F.count(F.when(_is(outcome), 1)).alias(outcome) for outcome in OUTCOMES]


#: Column of a per-second partial: the whole UTC second a valid record settled in.
SECOND = "second"


def second_of(valid: Column) -> Column:
    """The whole UTC second a valid record settled in (null for the others)."""
    return F.when(valid, F.floor("settled_at").cast("long")).alias(SECOND)


#: Column of :func:`expiring_fractions`, which :func:`partial_aggregates` counts.
EXPIRING = "_expiring"


def expiring_fractions(valid: Column) -> Column:
    """How many of :data:`WHATIF_FRACTIONS` would have expired a valid settled operation.

    All of them for an expired one. For a completed one, the fractions ``f`` for which
    ``f * (deadline - created_at) < settled_at - created_at`` (it was slower than the
    shorter timeout); a valid row has ``deadline >= created_at``, so ``f * timeout``
    grows with ``f`` and those fractions are the first ones: their count is found in
    five comparisons (a binary search), not twenty. Null for every other row.

    One column, read by the twenty counts of :func:`partial_aggregates`, where each
    count had made its own comparison: the 10M-event report 16.5 s against 17.1 on
    average (Parquet, local[2], three runs each, alternated).
    """
    # Each comparison parsed from SQL in one call to the JVM rather than built from a
    # dozen (0.16 s less at the start of a report on a fresh JVM); ``D``: a double.
    slower = [
        F.expr(f"{f!r}D * (deadline - created_at) < settled_at - created_at")
        for f in WHATIF_FRACTIONS
    ]

    def count(low: int, high: int) -> Column:
        # Of the fractions low..high (1-based), given that those below low are slower.
        if low > high:
            return F.lit(low - 1)
        middle = (low + high) // 2
        return F.when(slower[middle - 1], count(middle + 1, high)).otherwise(count(low, middle - 1))

    return (
        F.when(valid & _is("expired"), F.lit(len(WHATIF_FRACTIONS)))
        .when(valid & _is("completed"), count(1, len(WHATIF_FRACTIONS)))
        .alias(EXPIRING)
    )


def partial_aggregates(valid: Column) -> list[Column]:
    """Every plain figure as partials per (purgatory, op_type, :func:`second_of`), over
    rows that carry :func:`expiring_fractions` (column :data:`EXPIRING`).

    Counts, sums, minima and maxima only, so they add up exactly to the figures of a
    whole group (:func:`group_figures`) and their buffers are fixed-width numbers:
    Spark runs them in its compiled hash aggregation. Columns: ``count`` (also the
    operations settled in the second), one count per outcome, ``latency_sum``
    (completion latencies), ``latency_min``/``_max``, ``lateness_max``,
    ``first_settled_at``/``last_settled_at``, ``timeout_sum``/``_min``/``_max``
    (``deadline - created_at`` of the completed and expired operations only, those the
    what-if judges), and per fraction ``f`` of :data:`WHATIF_FRACTIONS`
    ``_would_<i>``: the operations that would have expired with timeout ``f *
    (deadline - created_at)`` (expired ones, and completed ones slower than that).
    The percentiles are :func:`percentile_aggregates`.

    Args:
        valid: Rows to count; the others are left out of every figure (so one
            aggregation can also count what it leaves out).
    """
    completed, expired = valid & _is("completed"), valid & _is("expired")
    completion = F.when(completed, latency())
    # The timeouts of the operations the what-if judges: a cancelled or shut down one
    # says nothing about whether its timeout was long enough.
    given = F.when(completed | expired, timeout())
    settled = F.when(valid, F.col("settled_at"))
    would_expire = [
        F.count(F.when(F.col(EXPIRING) > index, 1)).alias(f"_would_{index}")
        for index in range(len(WHATIF_FRACTIONS))
    ]
    return [
        F.count(F.when(valid, 1)).alias("count"),
        *(F.count(F.when(valid & _is(outcome), 1)).alias(outcome) for outcome in OUTCOMES),
        F.sum(completion).alias("latency_sum"),
        F.min(completion).alias("latency_min"),
        F.max(completion).alias("latency_max"),
        F.max(F.when(expired, lateness())).alias("lateness_max"),
        F.min(settled).alias("first_settled_at"),
        F.max(settled).alias("last_settled_at"),
        F.sum(given).alias("timeout_sum"),
        F.min(given).alias("timeout_min"),
        F.max(given).alias("timeout_max"),
        *would_expire,
    ]


#: How each column of :func:`partial_aggregates` adds up over the partials of a group
#: (a Spark and a pyarrow aggregate function alike); see :func:`group_figures`.
PARTIAL_REDUCTIONS: dict[str, str] = {
    "count": "sum",
    **{outcome: "sum" for outcome in OUTCOMES},
    "latency_sum": "sum",
    "latency_min": "min",
    "latency_max": "max",
    "lateness_max": "max",
    "first_settled_at": "min",
    "last_settled_at": "max",
    "timeout_sum": "sum",
    "timeout_min": "min",
    "timeout_max": "max",
    **{f"_would_{index}": "sum" for index in range(len(WHATIF_FRACTIONS))},
}


def group_figures(totals: dict[str, Any]) -> dict[str, Any]:
    """The figures of a whole (purgatory, op_type) from its partials added up by
    :data:`PARTIAL_REDUCTIONS`: the totals, plus ``latency_mean``, ``timeout_mean``
    (over the completed and expired operations; null without operations to average) and
    ``would_expire`` (one count per fraction of :data:`WHATIF_FRACTIONS`)."""

    def mean(total: float | None, count: int) -> float | None:
        return None if total is None or not count else total / count

    return {
        **totals,
        "latency_mean": mean(totals["latency_sum"], int(totals["completed"])),
        "timeout_mean": mean(
            totals["timeout_sum"], int(totals["completed"]) + int(totals["expired"])
        ),
        "would_expire": [int(totals[f"_would_{i}"]) for i in range(len(WHATIF_FRACTIONS))],
    }


#: Column of :func:`percentile_input`: what a percentile of a settled operation is about.
JUDGED = "_judged"

assert set(LATENESS_QUANTILES.values()) <= set(CURVE_QUANTILES)


def percentile_input() -> Column:
    """Completion latency of a completed operation, expiration lateness of an expired one.

    Aggregated by (purgatory, op_type, outcome) with :func:`percentile_aggregates`,
    each row feeds one sketch, not two sketches over a ``CASE`` each, one of them null
    on every row.
    """
    return F.when(_is("completed"), latency()).otherwise(lateness()).alias(JUDGED)


def percentile_aggregates() -> list[Column]:
    """``curve``: :func:`percentile_input` at :data:`CURVE_QUANTILES` (which hold the
    :data:`LATENESS_QUANTILES` too), for rows of the completed and expired operations;
    null for a group without a value (NaN counts as none).

    A KLL sketch rather than ``percentile_approx``, whose Greenwald-Khanna summary boxes
    every value and sorts them in batches of 50,000: 10M events, local[2], the whole
    report 17.7 s against 19.0 on average over four runs alternated (Parquet), the
    percentile pass alone, warm, 2.4 s against 3.7.
    """
    sketch = F.kll_sketch_agg_double(JUDGED, F.lit(SKETCH_K))
    ranks = F.array(*(F.lit(quantile) for quantile in CURVE_QUANTILES))
    # An empty sketch has no quantile (Spark raises): only the rows of a group whose
    # every value was null or NaN, e.g. where an exclusion discards the pass anyway.
    return [
        F.when(
            F.kll_sketch_get_n_double(sketch) > 0, F.kll_sketch_get_quantile_double(sketch, ranks)
        ).alias("curve")
    ]


def per_second(partials: DataFrame) -> DataFrame:
    """Operations settled per (purgatory, op_type) and whole UTC second, by outcome.

    Args:
        partials: Aggregated by (purgatory, op_type, :func:`second_of`) with
            :func:`partial_aggregates`.

    Returns:
        Columns ``purgatory``, ``op_type``, ``second`` (epoch seconds), ``time``
        (the same as a timestamp), ``settled`` and one count per outcome. Seconds
        in which nothing settled have no row.
    """
    return partials.where(F.col(SECOND).isNotNull()).select(
        *GROUP,
        SECOND,
        F.timestamp_seconds(SECOND).alias("time"),
        F.col("count").alias("settled"),
        *OUTCOMES,
    )


def per_second_table(partials: pa.Table) -> pa.Table:
    """:func:`per_second` of partials collected to the driver, as an Arrow table."""
    rows = partials.filter(pc.is_valid(partials[SECOND]))
    seconds = rows[SECOND]
    columns: dict[str, Any] = {
        **{name: rows[name] for name in GROUP},
        SECOND: seconds,
        "time": pc.multiply(seconds, 1_000_000).cast(pa.timestamp("us")),
        "settled": rows["count"],
        **{outcome: rows[outcome] for outcome in OUTCOMES},
    }
    return pa.table(columns)


#: Key lists up to this long are deduplicated by a scan of the list (see :func:`key_stats`).
SHORT_KEY_LIST = 16


def key_stats(events: DataFrame) -> DataFrame:
    """Operations watched per key, per (purgatory, op_type).

    Every key an operation was handed to the purgatory with counts, also for one
    satisfied at its first try (its record carries its keys). An operation watching
    a key twice counts once. Columns: ``purgatory``,
    ``op_type``, ``key``, ``watched``, one count per outcome and
    ``expiry_ratio`` (:func:`expiry_ratio`). Not ranked: see :func:`top_keys`.
    """
    # A key counts where it first occurs in its list: array_position scans a short list
    # in place, where array_distinct builds a hash set per record (hot keys at 10M
    # events, local[2]: 7.6 s of CPU against 10.1). Long lists, where that scan would
    # be quadratic, still go through array_distinct.
    short = F.size("keys") <= SHORT_KEY_LIST
    listed = F.when(short, F.col("keys")).otherwise(F.array_distinct("keys"))
    at = F.col("_at")
    first = ~short | F.coalesce(
        F.array_position("keys", F.col("key")) == at + 1,
        # array_position finds no null: a null key counts where no null precedes it.
        ~F.exists(F.slice("keys", 1, at), lambda key: key.isNull()),
    )
    return (
        events.select(*GROUP, "outcome", "keys", F.posexplode(listed).alias("_at", "key"))
        .where(first)
        .groupBy(*GROUP, "key")
        .agg(F.count(F.lit(1)).alias("watched"), *_outcome_counts())
        .withColumn("expiry_ratio", expiry_ratio())
    )


def expiry_ratio() -> Column:
    """``expired / (completed + expired)``, null where neither occurred: the report's one
    denominator, shared with the what-if's shares (cancelled and shut down operations
    tell nothing about a timeout, so no ratio counts them)."""
    judged = F.col("completed") + F.col("expired")
    return F.when(judged > 0, F.col("expired") / judged)


#: Hash buckets per group for the first round of :func:`top_keys`.
TOP_KEY_BUCKETS = 64


def top_keys(by_key: DataFrame, n: int) -> DataFrame:
    """The ``n`` most watched keys per group from :func:`key_stats`, with ``rank``.

    Two rounds, so no task ever sorts all the keys of a group: first the top
    ``n`` of each of :data:`TOP_KEY_BUCKETS` hash buckets of a group's keys,
    then the top ``n`` of those at most ``n * TOP_KEY_BUCKETS`` candidates.
    Rank 1 is the most watched; ties go to the smaller key.
    """
    bucket = F.pmod(F.xxhash64("key"), F.lit(TOP_KEY_BUCKETS)).alias("_bucket")
    order = (F.col("watched").desc(), F.col("key"))
    first = Window.partitionBy(*GROUP, "_bucket").orderBy(*order)
    candidates = (
        by_key.select("*", bucket)
        .withColumn("_rank", F.row_number().over(first))
        .where(F.col("_rank") <= n)
        .drop("_rank", "_bucket")
    )
    final = Window.partitionBy(*GROUP).orderBy(*order)
    return candidates.withColumn("rank", F.row_number().over(final)).where(F.col("rank") <= n)


def top_keys_table(by_key: pa.Table, n: int) -> list[dict[str, Any]]:
    """:func:`top_keys` of a key table read to the driver, as rows in the order
    ``(purgatory, op_type, rank)``: the same rows Spark ranks, ordered as Spark orders
    (text by its bytes, nulls first)."""
    # Nulls first by a validity column ahead of each text column: pyarrow before 25 sets
    # where nulls go for all columns at once, and the counts sort descending.
    flagged = by_key
    for name in (*GROUP, "key"):
        flagged = flagged.append_column(f"_valid_{name}", pc.is_valid(by_key[name]))

    def nulls_first(name: str) -> list[tuple[str, str]]:
        return [(f"_valid_{name}", "ascending"), (name, "ascending")]

    keys = [key for name in GROUP for key in nulls_first(name)]
    keys += [("watched", "descending"), *nulls_first("key")]
    ordered = flagged.sort_by(keys).select(by_key.column_names)
    kept: list[int] = []
    ranks: list[int] = []
    previous: tuple[Any, ...] | None = None
    rank = 0
    columns = (ordered[name].to_pylist() for name in GROUP)
    for index, group in enumerate(zip(*columns, strict=True)):
        rank = rank + 1 if group == previous else 1
        previous = group
        if rank <= n:
            kept.append(index)
            ranks.append(rank)
    rows = ordered.take(pa.array(kept, pa.int64())).to_pylist()
    return [{**row, "rank": rank} for row, rank in zip(rows, ranks, strict=True)]


def timeline(per_second_table: DataFrame, start: int, bin_seconds: int) -> DataFrame:
    """Settled and expired operations per bin of ``bin_seconds``, for charts.

    Args:
        per_second_table: The output of :func:`per_second`.
        start: Epoch second of bin 0.
        bin_seconds: Bin width in seconds.

    Returns:
        Columns ``purgatory``, ``op_type``, ``bin`` (index from ``start``),
        ``settled``, ``expired`` and ``peak`` (the most settled in one second of the bin).
        :func:`timeline_rows` computes the same on the driver.
    """
    index = F.floor((F.col("second") - F.lit(start)) / F.lit(bin_seconds)).cast("long")
    return per_second_table.groupBy(*GROUP, index.alias("bin")).agg(
        F.sum("settled").alias("settled"),
        F.sum("expired").alias("expired"),
        F.max("settled").alias("peak"),
    )


def timeline_rows(per_second: pa.Table, start: int, bin_seconds: int) -> list[dict[str, Any]]:
    """:func:`timeline` of a :func:`per_second_table` (whose seconds are at or after
    ``start``), as rows."""
    binned = per_second.append_column(
        "bin", pc.divide(pc.subtract(per_second[SECOND], start), bin_seconds)
    )
    table = binned.group_by([*GROUP, "bin"]).aggregate(
        [("settled", "sum"), ("expired", "sum"), ("settled", "max")]
    )
    names = {"settled_sum": "settled", "expired_sum": "expired", "settled_max": "peak"}
    rows: list[dict[str, Any]] = table.rename_columns(names).to_pylist()
    return rows
