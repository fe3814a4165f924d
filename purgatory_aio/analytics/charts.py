"""PNG charts of the report (matplotlib, drawn off-screen without pyplot)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from purgatory_aio.analytics.errors import missing_dependency

try:
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
except ImportError as exc:
    raise missing_dependency(exc) from exc

#: Series label -> points; labels are "purgatory/op_type".
Curves = Mapping[str, Sequence[tuple[float, float]]]

_SIZE = (8.0, 4.5)
_DPI = 110
_PERCENTILE_TICKS = (0.5, 0.9, 0.99, 0.999, 0.9999)

#: Latency chart floor in ms: a log axis cannot show zero (a virtual clock, an
#: operation completed at its first try), so smaller values are drawn here, and
#: the chart says so, instead of stretching the axis over empty decades.
LATENCY_FLOOR_MS = 0.01


def _figure() -> tuple[Figure, Axes]:
    # A bare Figure on the Agg canvas leaves the application's pyplot backend alone.
    figure = Figure(figsize=_SIZE, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _finish(figure: Figure, axes: Axes, path: Path, has_data: bool) -> Path:
    if has_data:
        axes.legend(fontsize="small")
    else:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
    axes.grid(True, which="major", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path


def _tail_position(quantile: float) -> float:
    return -math.log10(1.0 - quantile)


def latency_chart(path: Path, curves: Curves) -> Path:
    """Completion latency by percentile, the tail stretched out (x: 50%, 90%, 99%...).

    Args:
        path: Where the PNG goes.
        curves: Per series, ``(quantile, latency in seconds)`` points.
    """
    figure, axes = _figure()
    drawn = False
    clipped = False
    highest = 0.0
    for label, points in curves.items():
        usable = [(q, value) for q, value in points if q < 1.0]
        if not usable:
            continue
        millis = [value * 1000.0 for _, value in usable]
        clipped = clipped or min(millis) < LATENCY_FLOOR_MS
        axes.plot(
            [_tail_position(q) for q, _ in usable],
            [max(value, LATENCY_FLOOR_MS) for value in millis],
            marker=".",
            markersize=3,
            label=label,
        )
        highest = max(highest, max(q for q, _ in usable))
        drawn = True
    ticks = [q for q in _PERCENTILE_TICKS if q <= max(highest, 0.99)]
    axes.set_xticks([_tail_position(q) for q in ticks])
    axes.set_xticklabels([f"{q * 100:g}%" for q in ticks])
    if drawn:
        axes.set_yscale("log")
        if clipped:
            axes.set_ylim(bottom=LATENCY_FLOOR_MS * 0.8)
    floor_note = (
        f"; latencies under {LATENCY_FLOOR_MS:g} ms (e.g. 0) drawn at {LATENCY_FLOOR_MS:g} ms"
    )
    axes.set_xlabel("percentile" + (floor_note if drawn and clipped else ""))
    axes.set_ylabel("completion latency (ms)")
    axes.set_title("Completion latency distribution (completed operations)")
    return _finish(figure, axes, path, drawn)


def timeline_chart(path: Path, series: Curves, *, title: str, ylabel: str, xlabel: str) -> Path:
    """Rates over time, one line per series.

    Args:
        path: Where the PNG goes.
        series: Per series, ``(seconds since the start, rate)`` points.
        title: Chart title.
        ylabel: Y axis label.
        xlabel: X axis label.
    """
    figure, axes = _figure()
    drawn = False
    for label, points in series.items():
        if not points:
            continue
        axes.plot([x for x, _ in points], [y for _, y in points], linewidth=1.0, label=label)
        drawn = True
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.set_ylim(bottom=0)
    return _finish(figure, axes, path, drawn)


def whatif_chart(path: Path, curves: Curves, timeouts: Mapping[str, float]) -> Path:
    """Share of operations that would have expired against a shorter timeout.

    Each series is drawn against its own timeout (x: fraction of it), so a
    500 ms timeout and a 30 s one both span the whole axis.

    Args:
        path: Where the PNG goes.
        curves: Per series, ``(fraction of the timeout used, share 0..1)``
            points; the last point (fraction 1) is the timeout actually used.
        timeouts: Per series, its mean timeout in seconds, for the legend.
    """
    figure, axes = _figure()
    drawn = False
    for label, points in curves.items():
        if not points:
            continue
        xs = [fraction * 100.0 for fraction, _ in points]
        ys = [share * 100.0 for _, share in points]
        timeout = timeouts.get(label)
        name = label if timeout is None else f"{label} (timeout {_ms(timeout)})"
        (line,) = axes.plot(xs, ys, marker=".", markersize=4, label=name)
        axes.plot(xs[-1:], ys[-1:], marker="o", color=line.get_color())
        drawn = True
    axes.set_xlabel("candidate timeout (% of the timeout each operation type used)")
    axes.set_ylabel("operations that would expire (%)")
    axes.set_title("Timeout what-if (shorter timeouts only)")
    axes.set_ylim(0, 100)
    axes.set_xlim(0, 102)
    return _finish(figure, axes, path, drawn)


def _ms(seconds: float) -> str:
    millis = seconds * 1000.0
    return f"{millis / 1000.0:g} s" if millis >= 1000.0 else f"{millis:g} ms"
