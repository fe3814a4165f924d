"""PNG charts of the report (matplotlib, drawn off-screen without pyplot)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from purgatory_report.anomalies import Window
from purgatory_report.errors import missing_dependency

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


#: Percentile axis ticks; those below 50% sit close together at the left, so only two.
_LOW_TICKS = (0.0, 0.25)

#: Groups with fewer completed operations than this are drawn as their observations
#: (points), never as a curve: a percentile line over 1-3 values says nothing.
SMALL_GROUP = 10


@dataclass(frozen=True)
class Series:
    """One line or set of points of a chart, as drawn: positions on the axes."""

    label: str
    xs: list[float]
    ys: list[float]
    points_only: bool = False
    marker: str = "."
    linestyle: str = "-"


def latency_series(curves: Curves, completed: Mapping[str, int]) -> list[Series]:
    """What :func:`latency_chart` draws per group: x is :func:`_tail_position`, y ms.

    A curve stops at the percentile its operations can resolve (``1 - 1/n``: beyond
    it every percentile is the maximum); a group of fewer than :data:`SMALL_GROUP`
    operations is drawn as its observed values, as points at ``(i + 0.5) / n``.
    """
    drawn: list[Series] = []
    for label, points in curves.items():
        usable = [(q, value) for q, value in points if q < 1.0]
        n = completed.get(label, 0)
        if not usable or n < 1:
            continue
        if n < SMALL_GROUP:
            quantiles = [(index + 0.5) / n for index in range(n)]
            values = [min(usable, key=lambda point: abs(point[0] - q))[1] for q in quantiles]
            drawn.append(
                Series(
                    f"{label} ({n} operation{'s' if n > 1 else ''}: too few for a curve)",
                    [_tail_position(q) for q in quantiles],
                    [value * 1000.0 for value in values],
                    points_only=True,
                    marker="o",
                    linestyle="none",
                )
            )
            continue
        resolved = [(q, value) for q, value in usable if q <= 1.0 - 1.0 / n + 1e-12]
        drawn.append(
            Series(
                label,
                [_tail_position(q) for q, _ in resolved],
                [value * 1000.0 for _, value in resolved],
            )
        )
    return drawn


def latency_chart(path: Path, curves: Curves, completed: Mapping[str, int]) -> Figure:
    """Completion latency by percentile, the tail stretched out (x: 50%, 90%, 99%...).

    Args:
        path: Where the PNG goes.
        curves: Per series, ``(quantile, latency in seconds)`` points.
        completed: Per series, how many completed operations the curve describes.

    Returns:
        The drawn figure (for checking what it shows).
    """
    figure, axes = _figure()
    series = latency_series(curves, completed)
    clipped = any(min(line.ys) < LATENCY_FLOOR_MS for line in series)
    for line in series:
        axes.plot(
            line.xs,
            [max(value, LATENCY_FLOOR_MS) for value in line.ys],
            marker=line.marker,
            markersize=6 if line.points_only else 3,
            linestyle=line.linestyle,
            label=line.label,
        )
    furthest = max((max(line.xs) for line in series), default=_tail_position(0.99))
    ticks = [*_LOW_TICKS, *(q for q in _PERCENTILE_TICKS if _tail_position(q) <= furthest)]
    if furthest < _tail_position(0.99):
        ticks.append(0.99)
    axes.set_xticks([_tail_position(q) for q in ticks])
    axes.set_xticklabels([f"{q * 100:g}%" for q in ticks])
    axes.set_xlim(-0.02 * max(furthest, 1.0), max(furthest, _tail_position(0.99)) * 1.03)
    if series:
        axes.set_yscale("log")
        if clipped:
            axes.set_ylim(bottom=LATENCY_FLOOR_MS * 0.8)
    floor_note = (
        f"; latencies under {LATENCY_FLOOR_MS:g} ms (e.g. 0) drawn at {LATENCY_FLOOR_MS:g} ms"
    )
    axes.set_xlabel("percentile" + (floor_note if series and clipped else ""))
    axes.set_ylabel("completion latency (ms)")
    axes.set_title("Completion latency distribution (completed operations)")
    _finish(figure, axes, path, bool(series))
    return figure


#: Colours of marked windows: spikes of expirations, and drops of throughput.
_WINDOW_COLOURS = {"expirations": "tab:red", "throughput": "tab:gray"}


def timeline_chart(
    path: Path,
    series: Curves,
    *,
    title: str,
    ylabel: str,
    xlabel: str,
    windows: Sequence[Window] = (),
) -> Path:
    """Rates over time, one line per series, anomalous windows shaded.

    Args:
        path: Where the PNG goes.
        series: Per series, ``(seconds since the start, rate)`` points.
        title: Chart title.
        ylabel: Y axis label.
        xlabel: X axis label.
        windows: Anomalies to shade (see :func:`~.anomalies.find_windows`).
    """
    figure, axes = _figure()
    drawn = False
    for label, points in series.items():
        if not points:
            continue
        axes.plot([x for x, _ in points], [y for _, y in points], linewidth=1.0, label=label)
        drawn = True
    shown: set[str] = set()
    for window in windows:
        name = f"anomaly: {window.kind}"
        axes.axvspan(
            window.start,
            window.end,
            color=_WINDOW_COLOURS.get(window.kind, "tab:orange"),
            alpha=0.18,
            label=None if name in shown else name,
        )
        shown.add(name)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.set_ylim(bottom=0)
    return _finish(figure, axes, path, drawn)


#: Below this share (in %), the what-if axis is linear; above, logarithmic: a line
#: at 0.2% stays clear of one at 2% and of the axis, and 80% still fits.
WHATIF_LINEAR_BELOW = 1.0
#: Distinct per line, so lines that overlap remain tellable apart.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINESTYLES = ("-", "--", "-.", ":")


def whatif_series(curves: Curves, bases: Mapping[str, str]) -> list[Series]:
    """What :func:`whatif_chart` draws: x in % of the timeout, y the share in %."""
    drawn = []
    for index, (label, points) in enumerate(curves.items()):
        if not points:
            continue
        basis = bases.get(label)
        drawn.append(
            Series(
                label if basis is None else f"{label}: {basis}",
                [fraction * 100.0 for fraction, _ in points],
                [share * 100.0 for _, share in points],
                marker=_MARKERS[index % len(_MARKERS)],
                linestyle=_LINESTYLES[index % len(_LINESTYLES)],
            )
        )
    return drawn


def whatif_chart(path: Path, curves: Curves, bases: Mapping[str, str]) -> Figure:
    """Share of operations that would have expired against a shorter timeout.

    Each series is drawn against its own timeout (x: fraction of it), so a
    500 ms timeout and a 30 s one both span the whole axis. The y axis is
    linear up to :data:`WHATIF_LINEAR_BELOW` % and logarithmic above, and starts
    below zero, so a line near zero stands clear of the axis and of its neighbours.

    Args:
        path: Where the PNG goes.
        curves: Per series, ``(fraction of the timeout used, share 0..1)``
            points; the last point (fraction 1) is the timeout actually used.
        bases: Per series, what its fractions are fractions of, for the legend
            (:func:`purgatory_report.model.timeout_basis`).

    Returns:
        The drawn figure (for checking where the lines landed).
    """
    figure, axes = _figure()
    series = whatif_series(curves, bases)
    for line in series:
        (drawn,) = axes.plot(
            line.xs,
            line.ys,
            marker=line.marker,
            markersize=4,
            linestyle=line.linestyle,
            label=line.label,
        )
        axes.plot(line.xs[-1:], line.ys[-1:], marker="o", markersize=7, color=drawn.get_color())
    axes.set_yscale("symlog", linthresh=WHATIF_LINEAR_BELOW, linscale=1.0)
    axes.set_ylim(-0.15 * WHATIF_LINEAR_BELOW, 100.0)
    ticks = [0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
    axes.set_yticks(ticks)
    axes.set_yticklabels([f"{tick:g}" for tick in ticks])
    axes.set_xlabel("candidate timeout (% of the timeout each operation had)")
    axes.set_ylabel("operations that would expire (%)")
    axes.set_title("Timeout what-if (shorter timeouts only)")
    axes.set_xlim(0, 102)
    _finish(figure, axes, path, bool(series))
    return figure
