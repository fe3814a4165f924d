"""``report.md``: the report as Markdown, with the charts beside it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from purgatory_report.anomalies import KINDS, THRESHOLD, Window
from purgatory_report.metrics import ACCURACY, RANK_ERROR, SKETCH_K, TAIL_SHARE
from purgatory_report.model import (
    Report,
    Row,
    duration,
    judged,
    label,
    timeout_basis,
)
from purgatory_report.quality import PLAUSIBLE_FROM, PLAUSIBLE_UNTIL, REASONS

#: A shorter timeout "costs little" when it expires at most this many more
#: operations (a share of those judged) than the timeout used.
AFFORDABLE_EXTRA = 0.01
#: Groups the findings give a what-if sentence for (the largest ones).
FINDINGS_GROUPS = 3

#: Fractions of the used timeout shown in the what-if tables of report.md.
WHATIF_SHOWN = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)

NOT_JUDGEABLE = (
    "**Longer timeouts cannot be judged from this log.** An operation that expired was "
    "abandoned at its deadline, so whether, and when, it would have completed with more time "
    "is unknown; only timeouts up to the one used are evaluated."
)


def accuracy_note() -> str:
    """How precise the percentiles are, in words."""
    return (
        f"Percentiles are approximate, at accuracy {ACCURACY:,} as Spark's `percentile_approx` "
        "counts it: each reported percentile is an observed value whose rank among the n "
        f"values lies within n/{ACCURACY:,} ({RANK_ERROR:.2%} of n) of the exact rank, at most "
        f"{1_000_000 // ACCURACY} positions among a million. They are read from a KLL sketch "
        f"per group (`kll_sketch_agg_double`, k = {SKETCH_K:,}): exact up to {SKETCH_K:,} "
        "values; above, the sketch's own error is 0.0048% of n with 99% confidence, and two "
        "runs over the same events can differ within the bound."
    )


def render_markdown(report: Report) -> str:
    """The whole of ``report.md``."""
    parts = [
        _header(report),
        _findings_section(report),
        _quality_section(report),
        _summary_section(report),
        _latency_section(report),
        _lateness_section(report),
        _timeline_section(report),
        _hot_keys_section(report),
        _whatif_section(report),
        _run_section(report),
        _tables_section(report),
    ]
    return "\n\n".join(part.strip() for part in parts) + "\n"


def _header(report: Report) -> str:
    first = min(row["first_settled_at"] for row in report.summary)
    last = max(row["last_settled_at"] for row in report.summary)
    window = f"\n- Only operations {report.window}" if report.window else ""
    return f"""
# Purgatory operations report

- Input: `{report.events_dir}`: {report.events:,} operations, {len(report.summary)} \
purgatory/op_type group(s)
- Settled between {_utc(first)} and {_utc(last)}
- Generated {report.generated_at.strftime("%Y-%m-%d %H:%M:%S UTC")}{window}

Times below are in milliseconds unless marked; `summary.json` holds the same figures in
seconds.
"""


def key_findings(report: Report) -> list[str]:
    """The report in a few sentences: volume, what expired most and when, anomalies,
    what a shorter timeout would cost, and whether the input had problems."""
    summary = report.summary
    total = sum(int(row["count"]) for row in summary)
    expired = sum(int(row["expired"]) for row in summary)
    decided = sum(judged(row) for row in summary)
    first = min(row["first_settled_at"] for row in summary)
    last = max(row["last_settled_at"] for row in summary)
    share = f" ({_pct(expired / decided)})" if decided else ""
    found = [
        f"{total:,} operations in {len(summary)} group(s) settled over "
        f"{_duration(last - first)}; {expired:,} of the {decided:,} that completed or "
        f"expired{share} expired."
    ]
    worst = max(summary, key=lambda row: (int(row["expired"]), row["expiry_ratio"] or 0.0))
    if int(worst["expired"]):
        sentence = (
            f"`{label(worst)}` expired most: {_int(worst['expired'])} of "
            f"{_int(judged(worst))} ({_pct(worst['expiry_ratio'])})"
        )
        peak = report.expiry_peaks.get(label(worst))
        if peak is not None:
            offset, rate = peak
            sentence += f", at worst {rate:,.1f}/s around {_clock(report.timeline_start + offset)}"
        found.append(sentence + ".")
    if report.anomalies:
        found.append(
            "Anomalies, shaded on the charts: "
            + "; ".join(_window_text(report, window) for window in report.anomalies)
            + "."
        )
    largest = sorted(summary, key=lambda row: -int(row["count"]))[:FINDINGS_GROUPS]
    for row in largest:
        whatif = _whatif_finding(row, [w for w in report.whatif if label(w) == label(row)])
        if whatif:
            found.append(whatif)
    if problems := report.quality.problems():
        found.append(f"The input has problems (see Data quality): {'; '.join(problems)}.")
    return found


def _whatif_finding(summary: Row, rows: list[Row]) -> str | None:
    """What the shortest affordable timeout of a group would cost, in one sentence: as an
    absolute timeout where the group used one, else as a share of each request's own."""
    if not rows:
        return None
    basis = timeout_basis(summary)

    def candidate(row: Row) -> str:
        fraction = f"{row['timeout_fraction']:.0%}"
        if row["candidate_timeout_s"] is None:
            return f"at {fraction} of {basis}"
        return f"at {duration(row['candidate_timeout_s'])} ({fraction} of {basis})"

    used = max(rows, key=lambda row: row["timeout_fraction"])
    base = float(used["share"])
    affordable = [
        row
        for row in rows
        if row is not used
        and float(row["share"]) - base <= AFFORDABLE_EXTRA + 1e-12
        and _shown(row["timeout_fraction"])
    ]
    name = f"`{label(summary)}`"
    if affordable:
        row = min(affordable, key=lambda r: r["timeout_fraction"])
        extra = float(row["share"]) - base
        cost = (
            f"only {_pct(extra)} more of its operations ({_pct(row['share'])} instead of "
            f"{_pct(base)})"
            if int(row["would_expire"]) > int(used["would_expire"])
            else f"no more of its operations than now ({_pct(base)})"
        )
        return f"A shorter timeout: {name} {candidate(row)} would expire {cost}."
    nearest = max(
        (r for r in rows if r is not used and _shown(r["timeout_fraction"])),
        default=None,
        key=lambda r: r["timeout_fraction"],
    )
    if nearest is None:
        return None
    return (
        f"Shorter timeouts cost {name} dearly: {candidate(nearest)}, "
        f"{_pct(nearest['share'])} would expire instead of {_pct(base)}."
    )


def _window_text(report: Report, window: Window) -> str:
    start = report.timeline_start + window.start
    end = datetime.fromtimestamp(report.timeline_start + window.end, UTC).strftime("%H:%M:%S")
    return f"{KINDS[window.kind]} from {_clock(start)} to {end}"


def _findings_section(report: Report) -> str:
    return "## Key findings\n\n" + "\n".join(f"- {sentence}" for sentence in key_findings(report))


def _run_section(report: Report) -> str:
    if not report.run:
        return ""
    rows = [
        [name, f"`{value}`" if name != "defaults" else value] for name, value in report.run.items()
    ]
    return "## Run\n\n" + _table(["setting", "value"], rows)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:,.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"


def _clock(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _quality_section(report: Report) -> str:
    quality = report.quality
    problems = quality.problems()
    verdict = (
        "No duplicates, no implausible records, no records dropped by the writers."
        if not problems
        else "**The input has problems**: " + "; ".join(problems) + "."
    )
    rows = [[REASONS[name], _int(count)] for name, count in quality.excluded.items()]
    table = _table(["excluded because", "records"], rows)
    lo = datetime.fromtimestamp(PLAUSIBLE_FROM, UTC).year
    hi = datetime.fromtimestamp(PLAUSIBLE_UNTIL, UTC).year
    incomplete = ""
    if quality.dropped_by_writers:
        incomplete = (
            f"\n\n**Input incomplete**: {len(quality.writer_drops)} writer(s) recorded "
            f"{quality.dropped_by_writers:,} dropped record(s) (queue full or write failures) "
            "in their `_dropped-*.json` markers; every count below is short by up to that many."
        )
    return f"""
## Data quality

{quality.rows_read:,} records read; {quality.duplicates:,} exact duplicate(s) dropped;
{sum(quality.excluded.values()):,} excluded from every figure; {report.events:,} used.
{verdict}

{table}

Records are checked in this order and counted under the first reason that applies;
plausible times lie between {lo} and {hi}. Operations recorded twice with different
contents under one `(producer, purgatory, op_id)`: {quality.conflicting_ids:,}.
Per-group counts are in `summary.json`, totals in `data_quality.json`.{incomplete}
"""


def _summary_section(report: Report) -> str:
    rows = [
        [
            f"`{row['purgatory']}`",
            f"`{row['op_type']}`",
            _int(row["count"]),
            _int(row["completed"]),
            _int(row["expired"]),
            _int(row["cancelled"]),
            _int(row["shutdown"]),
            _pct(row["expiry_ratio"]),
            f"{row['throughput_per_s']:,.1f}",
            _int(row["peak_per_s"]),
        ]
        for row in report.summary
    ]
    table = _table(
        [
            "purgatory",
            "op_type",
            "ops",
            "completed",
            "expired",
            "cancelled",
            "shutdown",
            "expiry ratio",
            "settled/s (mean)",
            "settled/s (peak)",
        ],
        rows,
    )
    return f"""
## Outcomes and throughput

{table}

Expiry ratio: expired / (completed + expired), the denominator of every share in this report
(the what-if's and the hot keys' too): a cancelled or shut down operation tells nothing about
whether its timeout was long enough, so no ratio counts it. Mean throughput: operations settled
per second (all outcomes) over the active window, from the first settlement's second to the last
one's; peak: the busiest second.
"""


def _latency_section(report: Report) -> str:
    rows = [
        [
            f"`{label(row)}`",
            _int(row["completed"]),
            *(_ms(row[key]) for key in ("latency_p50", "latency_p90", "latency_p99")),
            _ms(row["latency_p999"]),
            _ms(row["latency_mean"]),
            _ms(row["latency_max"]),
        ]
        for row in report.summary
    ]
    table = _table(["group", "completed", "p50", "p90", "p99", "p99.9", "mean", "max"], rows)
    return f"""
## Completion latency

`settled_at - created_at` of completed operations.

{table}

{accuracy_note()}{_withheld_note(report)}

![Completion latency distribution](charts/latency.png)
"""


def _withheld_note(report: Report) -> str:
    if not report.withheld_quantiles:
        return ""
    names = ", ".join(f"p{q * 100:g}" for q in report.withheld_quantiles)
    return (
        f"\n\nWithheld: {names} (in groups with more than {ACCURACY:,} completed operations). "
        f"Their rank error, n/{ACCURACY:,}, exceeds {TAIL_SHARE:.0%} of the tail beyond them, "
        "so they would say nothing the next lower percentile does not; they are left out of "
        "the tables and the chart."
    )


def _lateness_section(report: Report) -> str:
    rows = [
        [
            f"`{label(row)}`",
            _int(row["expired"]),
            _ms(row["lateness_p50"]),
            _ms(row["lateness_p99"]),
            _ms(row["lateness_max"]),
        ]
        for row in report.summary
    ]
    table = _table(["group", "expired", "p50", "p99", "max"], rows)
    return f"""
## Expiration lateness

`settled_at - deadline` of expired operations: how long after its deadline the purgatory
expired an operation (percentiles approximate as above).

{table}
"""


def _timeline_section(report: Report) -> str:
    width = report.timeline_bin_seconds
    binning = "per second" if width == 1 else f"averaged over {width} s bins"
    if report.anomalies:
        marked = "Shaded: " + "; ".join(_window_text(report, w) for w in report.anomalies)
    else:
        marked = "No anomalous window"
    anomalies = (
        f"{marked} (a bin is anomalous when its count lies more than {THRESHOLD:g} robust "
        "standard deviations from the median bin's)."
    )
    return f"""
## Over time

Rates {binning}; the per-second counts are in `tables/throughput`. {anomalies}

![Operations settled per second](charts/throughput.png)

![Expirations per second](charts/expirations.png)
"""


def _hot_keys_section(report: Report) -> str:
    sections = [
        f"""
## Hot keys

The {report.top_keys} most watched keys per group (an operation counts once per key it
watches); every key's counts are in `tables/hot_keys` (unranked).
"""
    ]
    for summary in report.summary:
        name = label(summary)
        rows = [
            [
                str(row["rank"]),
                f"`{_escape(row['key'])}`",
                _int(row["watched"]),
                _int(row["expired"]),
                _pct(row["expiry_ratio"]),
            ]
            for row in report.hot_keys
            if label(row) == name
        ]
        body = (
            _table(["rank", "key", "operations", "expired", "expiry ratio"], rows)
            if rows
            else "No keys."
        )
        sections.append(f"### `{name}`\n\n{body}")
    return "\n\n".join(section.strip() for section in sections)


def _whatif_section(report: Report) -> str:
    sections = [
        f"""
## Timeout what-if

What share of operations would have expired with a shorter timeout? Each candidate is a
fraction of the timeout each operation was given (`deadline - created_at`): where a group's
requests chose different timeouts, "90%" means 90% of each request's own timeout, and no
absolute candidate is given (no single timeout was used); where every request of a group had
the same timeout, the candidate is also shown in milliseconds. A completed operation slower
than its candidate would have expired; an expired one would have expired anyway. Shares are
over completed and expired operations, as the expiry ratio is: at 100% the share is the expiry
ratio. Cancelled and shutdown operations are left out, of the timeouts too. Counts are exact.

{NOT_JUDGEABLE}

![Timeout what-if](charts/whatif.png)
"""
    ]
    for summary in report.summary:
        name = label(summary)
        rows = [
            [
                f"{row['timeout_fraction']:.0%}",
                "each request's own"
                if row["candidate_timeout_s"] is None
                else _ms(row["candidate_timeout_s"]),
                _int(row["would_expire"]),
                _pct(row["share"]),
            ]
            for row in report.whatif
            if label(row) == name and _shown(row["timeout_fraction"])
        ]
        if not rows:
            sections.append(f"### `{name}`\n\nNo completed or expired operations.")
            continue
        table = _table(["fraction of timeout", "candidate", "would expire", "share"], rows)
        heading = f"`{name}`: {timeout_basis(summary)}, {_int(judged(summary))} judged"
        sections.append(f"### {heading}\n\n{table}")
    return "\n\n".join(section.strip() for section in sections)


def _tables_section(report: Report) -> str:
    lines = [f"- `tables/{name}/`" for name in report.tables]
    return "## Tables (Parquet)\n\n" + "\n".join(lines)


def _shown(fraction: float) -> bool:
    return any(abs(fraction - shown) < 1e-9 for shown in WHATIF_SHOWN)


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    millis = seconds * 1000.0
    if abs(millis) >= 100:
        return f"{millis:,.1f}"
    if abs(millis) >= 1:
        return f"{millis:.2f}"
    return f"{millis:.3f}"


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2%}"


def _int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def _utc(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
