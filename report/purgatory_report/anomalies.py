"""Anomalous windows of a timeline: bursts of expirations, drops of throughput.

A bin is anomalous when its count lies more than :data:`THRESHOLD` standard
deviations from the median bin, the deviation estimated robustly (scaled median
absolute deviation) and never below the Poisson noise of the median count
(``sqrt(median)``) or one operation. A window spans the whole episode around
such bins: the neighbouring bins still beyond :data:`EXTEND` deviations. A
fault injected into a run (a dead follower, a silent consumer) shows as such a
window; a steady log has none.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: Standard deviations from the median that make a bin anomalous.
THRESHOLD = 5.0
#: A window spans the whole episode around its anomalous bins: the bins beyond this
#: many deviations, across gaps of up to MERGE_GAP bins.
EXTEND = 1.0
MERGE_GAP = 3
#: Fewer bins than this give no baseline to judge against: no windows.
MIN_BINS = 10
#: Scales the median absolute deviation to a standard deviation (normal data).
_MAD_SCALE = 1.4826

#: Kinds of windows, with what they mean in the report.
KINDS = {
    "expirations": "expirations far above the usual rate",
    "throughput": "settlements far below the usual rate",
}


@dataclass(frozen=True)
class Window:
    """An anomaly from ``start`` to ``end``, in seconds since the timeline's start."""

    kind: str
    start: float
    end: float


def find_windows(counts: Sequence[float], bin_seconds: int, kind: str) -> list[Window]:
    """The anomalous windows of one timeline.

    Args:
        counts: Operations per bin, from bin 0.
        bin_seconds: Width of a bin.
        kind: ``"expirations"`` looks for bins far above the median, ``"throughput"``
            for bins far below it (only strictly between the first and last busy bin:
            before the first operation and after the last is not a drop, and those two
            bins are partial).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    busy = [index for index, count in enumerate(counts) if count > 0]
    if not busy:
        return []
    # The first and last busy bins of a log are partial (it starts and ends inside
    # them): never a drop.
    first, last = (0, len(counts) - 1) if kind == "expirations" else (busy[0] + 1, busy[-1] - 1)
    judged = list(counts[first : last + 1])
    if len(judged) < MIN_BINS:
        return []
    median = statistics.median(judged)
    spread = statistics.median(abs(count - median) for count in judged) * _MAD_SCALE
    sigma = max(spread, math.sqrt(median), 1.0)
    sign = 1.0 if kind == "expirations" else -1.0
    deviation = [sign * (count - median) / sigma for count in judged]
    windows: list[Window] = []
    index = 0
    while index < len(deviation):
        if deviation[index] <= THRESHOLD:
            index += 1
            continue
        # Widen the burst to the whole episode around it: while bins stay beyond one
        # deviation, across gaps of up to MERGE_GAP bins.
        low = index
        while low > 0 and _elevated(deviation, low - 1, -1):
            low -= 1
        high = index
        while high + 1 < len(deviation) and _elevated(deviation, high + 1, 1):
            high += 1
        while deviation[low] <= EXTEND:
            low += 1
        while deviation[high] <= EXTEND:
            high -= 1
        if windows and first + low <= windows[-1].end / bin_seconds:
            low = int(windows.pop().start / bin_seconds) - first
        windows.append(Window(kind, (first + low) * bin_seconds, (first + high + 1) * bin_seconds))
        index = high + 1
    return windows


def _elevated(deviation: Sequence[float], index: int, step: int) -> bool:
    """Whether a bin within :data:`MERGE_GAP` of ``index`` (going ``step``) is beyond
    :data:`EXTEND` deviations."""
    for offset in range(MERGE_GAP + 1):
        at = index + step * offset
        if not 0 <= at < len(deviation):
            return False
        if deviation[at] > EXTEND:
            return True
    return False
