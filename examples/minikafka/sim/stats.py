"""Small, deterministic summaries of samples."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values (0.0 for no values)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def millis(seconds: float) -> float:
    """Seconds to milliseconds, rounded to the microsecond for stable output."""
    return round(seconds * 1000.0, 3)


def latency_summary(samples: Sequence[float]) -> dict[str, float | int]:
    """Count, p50, p99 and max of latencies in seconds, reported in milliseconds."""
    ordered = sorted(samples)
    return {
        "count": len(ordered),
        "p50_ms": millis(percentile(ordered, 0.50)),
        "p99_ms": millis(percentile(ordered, 0.99)),
        "max_ms": millis(ordered[-1]) if ordered else 0.0,
    }


def histogram(samples: Sequence[float], edges: Sequence[float]) -> dict[str, int]:
    """Counts of samples (seconds) per bucket ``[edge_i, edge_i+1)``, labelled in ms."""
    labels = [f"<{millis(e):g}ms" for e in edges]
    labels.append(f">={millis(edges[-1]):g}ms")
    counts = dict.fromkeys(labels, 0)
    for value in samples:
        for edge, label in zip(edges, labels, strict=False):
            if value < edge:
                counts[label] += 1
                break
        else:
            counts[labels[-1]] += 1
    return counts
