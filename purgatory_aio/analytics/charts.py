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
    for label, points in curves.items():
        usable = [(q, value) for q, value in points if q < 1.0]
        if not usable:
            continue
        axes.plot(
            [_tail_position(q) for q, _ in usable],
            [max(value, 1e-9) * 1000.0 for _, value in usable],
            marker=".",
            markersize=3,
            label=label,
        )
        drawn = True
    axes.set_xticks([_tail_position(q) for q in _PERCENTILE_TICKS])
    axes.set_xticklabels([f"{q * 100:g}%" for q in _PERCENTILE_TICKS])
    if drawn:
        axes.set_yscale("log")
    axes.set_xlabel("percentile")
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


def whatif_chart(path: Path, curves: Curves) -> Path:
    """Share of operations that would have expired against a shorter timeout.

    Args:
        path: Where the PNG goes.
        curves: Per series, ``(candidate timeout in seconds, share 0..1)``
            points; the last point is the timeout actually used.
    """
    figure, axes = _figure()
    drawn = False
    for label, points in curves.items():
        if not points:
            continue
        xs = [timeout * 1000.0 for timeout, _ in points]
        ys = [share * 100.0 for _, share in points]
        (line,) = axes.plot(xs, ys, marker=".", markersize=4, label=label)
        axes.plot(xs[-1:], ys[-1:], marker="o", color=line.get_color())
        drawn = True
    axes.set_xlabel("candidate timeout (ms); the last point of each line is the timeout used")
    axes.set_ylabel("operations that would expire (%)")
    axes.set_title("Timeout what-if (shorter timeouts only)")
    axes.set_ylim(0, 100)
    axes.set_xlim(left=0)
    return _finish(figure, axes, path, drawn)
