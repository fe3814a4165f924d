"""The figures of the report, as Spark aggregations over the event log.

Percentiles come from Spark's ``percentile_approx`` with accuracy
:data:`ACCURACY`: the value reported for quantile ``q`` of ``n`` values is one
of the observed values, and its rank in sorted order is within
``n / ACCURACY`` of ``q * n`` (relative rank error :data:`RANK_ERROR`). With
the default 10,000 that is 0.01% of ``n``: exact below 10,000 values, and at
most 100 positions off among a million.
"""

from __future__ import annotations

from purgatory_aio.analytics.errors import missing_dependency
from purgatory_aio.events import OUTCOMES

try:
    from pyspark.sql import Column, DataFrame, Window
    from pyspark.sql import functions as F
except ImportError as exc:
    raise missing_dependency(exc) from exc

#: ``percentile_approx`` accuracy; ``1 / ACCURACY`` is the relative rank error.
ACCURACY = 10_000
RANK_ERROR = 1.0 / ACCURACY

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
    """Whether ``percentile_approx`` at :data:`ACCURACY` says something about ``quantile``.

    Below :data:`ACCURACY` values the result is exact; above, the rank error
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


def group_aggregates(valid: Column | None = None) -> list[Column]:
    """Every plain per-(purgatory, op_type) figure: counts, sums, minima, maxima.

    Columns: ``count``, one count per outcome, ``latency_mean``/``_min``/``_max``,
    ``lateness_max``, ``first_settled_at``/``last_settled_at``,
    ``timeout_min``/``_mean``/``_max``, and ``would_expire``: per fraction ``f``
    of :data:`WHATIF_FRACTIONS`, the operations that would have expired with
    timeout ``f * (deadline - created_at)`` (expired ones, and completed ones
    slower than that). Their buffers are fixed-width numbers, so Spark runs them
    in its compiled hash aggregation; the percentiles are
    :func:`percentile_aggregates`.

    Args:
        valid: Rows to count; the others are left out of every figure (so one
            aggregation can also count what it leaves out).
    """
    keep = F.lit(True) if valid is None else valid
    completed, expired = keep & _is("completed"), keep & _is("expired")
    completion = F.when(completed, latency())
    late = F.when(expired, lateness())
    settled = F.when(keep, F.col("settled_at"))
    given = F.when(keep, timeout())
    would_expire = [
        F.count(F.when(expired | (completed & (F.lit(f) * timeout() < latency())), 1))
        for f in WHATIF_FRACTIONS
    ]
    return [
        F.count(F.when(keep, 1)).alias("count"),
        *(F.count(F.when(keep & _is(outcome), 1)).alias(outcome) for outcome in OUTCOMES),
        F.mean(completion).alias("latency_mean"),
        F.min(completion).alias("latency_min"),
        F.max(completion).alias("latency_max"),
        F.max(late).alias("lateness_max"),
        F.min(settled).alias("first_settled_at"),
        F.max(settled).alias("last_settled_at"),
        F.min(given).alias("timeout_min"),
        F.mean(given).alias("timeout_mean"),
        F.max(given).alias("timeout_max"),
        F.array(*would_expire).alias("would_expire"),
    ]


def percentile_aggregates() -> list[Column]:
    """``latency_curve`` (completion latencies at :data:`CURVE_QUANTILES`) and
    ``lateness_q`` (at :data:`LATENESS_QUANTILES`), for rows already filtered to
    the valid ones."""
    completion = F.when(_is("completed"), latency())
    late = F.when(_is("expired"), lateness())
    return [
        F.percentile_approx(completion, list(CURVE_QUANTILES), ACCURACY).alias("latency_curve"),
        F.percentile_approx(late, list(LATENESS_QUANTILES.values()), ACCURACY).alias("lateness_q"),
    ]


def per_second(events: DataFrame) -> DataFrame:
    """Operations settled per (purgatory, op_type) and whole UTC second, by outcome.

    Columns: ``purgatory``, ``op_type``, ``second`` (epoch seconds), ``time``
    (the same as a timestamp), ``settled`` and one count per outcome. Seconds
    in which nothing settled have no row.
    """
    second = F.floor("settled_at").cast("long")
    return (
        events.groupBy(*GROUP, second.alias("second"))
        .agg(F.count(F.lit(1)).alias("settled"), *_outcome_counts())
        .withColumn("time", F.timestamp_seconds("second"))
        .select(*GROUP, "second", "time", "settled", *OUTCOMES)
    )


def key_stats(events: DataFrame) -> DataFrame:
    """Operations watched per key, per (purgatory, op_type).

    Every key an operation was handed to the purgatory with counts, also for one
    satisfied at its first try (its record carries its keys). An operation watching
    a key twice counts once. Columns: ``purgatory``,
    ``op_type``, ``key``, ``watched``, one count per outcome and
    ``expiry_ratio`` (expired / watched). Not ranked: see :func:`top_keys`.
    """
    return (
        events.select(*GROUP, "outcome", F.explode(F.array_distinct("keys")).alias("key"))
        .groupBy(*GROUP, "key")
        .agg(F.count(F.lit(1)).alias("watched"), *_outcome_counts())
        .withColumn("expiry_ratio", F.col("expired") / F.col("watched"))
    )


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


def timeline(per_second_table: DataFrame, start: int, bin_seconds: int) -> DataFrame:
    """Settled and expired operations per bin of ``bin_seconds``, for charts.

    Args:
        per_second_table: The output of :func:`per_second`.
        start: Epoch second of bin 0.
        bin_seconds: Bin width in seconds.

    Returns:
        Columns ``purgatory``, ``op_type``, ``bin`` (index from ``start``),
        ``settled``, ``expired`` and ``peak`` (the most settled in one second of the bin).
    """
    index = F.floor((F.col("second") - F.lit(start)) / F.lit(bin_seconds)).cast("long")
    return per_second_table.groupBy(*GROUP, index.alias("bin")).agg(
        F.sum("settled").alias("settled"),
        F.sum("expired").alias("expired"),
        F.max("settled").alias("peak"),
    )
