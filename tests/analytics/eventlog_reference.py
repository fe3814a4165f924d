"""A deterministic event log with answers computable in plain Python."""

from __future__ import annotations

import math
import random
from pathlib import Path

from purgatory_aio.eventlog import JsonLinesWriter, ParquetWriter
from purgatory_aio.events import OperationEvent

START = 1_700_000_000.0

#: (purgatory, op_type, timeouts to pick from, median latency, operations)
GROUPS = (
    ("fetch", "FetchOp", (0.5,), 0.05, 2_000),
    ("produce", "ProduceOp", (0.2,), 0.08, 1_500),
    ("produce", "DeleteRecordsOp", (0.1, 0.3), 0.06, 500),
)


def generate(seed: int = 7) -> list[OperationEvent]:
    """Events of :data:`GROUPS` over about two minutes: every outcome, some without keys."""
    rng = random.Random(seed)
    events: list[OperationEvent] = []
    op_id = 0
    for purgatory, op_type, timeouts, median, count in GROUPS:
        keys = [f"{purgatory}-topic-{n}" for n in range(12)]
        weights = [1.0 / (n + 1) for n in range(len(keys))]
        for _ in range(count):
            op_id += 1
            created = START + rng.uniform(0.0, 120.0)
            timeout = rng.choice(timeouts)
            deadline = created + timeout
            watched = sorted(set(rng.choices(keys, weights, k=rng.randint(1, 3))))
            latency = rng.lognormvariate(math.log(median), 1.0)
            draw = rng.random()
            error = None
            if draw < 0.03:
                outcome, settled = "cancelled", created + min(latency, timeout) / 2
            elif draw < 0.05:
                outcome, settled = "shutdown", created + min(latency, timeout) / 3
            elif latency < timeout:
                outcome, settled = "completed", created + latency
                if draw > 0.99:
                    error = "ValueError: bad response"
                elif draw > 0.96:
                    # No keys: earlier versions left them out of a first-try completion's
                    # record, and the report must still take such logs.
                    watched = []
            else:
                outcome = "expired"
                settled = deadline + rng.expovariate(1 / 0.002)
            events.append(
                OperationEvent(
                    purgatory, op_type, op_id, watched, created, deadline, settled, outcome, error
                )
            )
    rng.shuffle(events)
    return events


def write_log(directory: Path, events: list[OperationEvent]) -> None:
    """Two thirds as Parquet (top level), the rest as JSON Lines (a subdirectory)."""
    cut = len(events) * 2 // 3
    with ParquetWriter(directory, batch_size=1_000, roll_bytes=40_000) as parquet:
        for event in events[:cut]:
            parquet.emit(event)
    with JsonLinesWriter(directory / "jsonl", batch_size=500) as jsonl:
        for event in events[cut:]:
            jsonl.emit(event)
    assert parquet.dropped == jsonl.dropped == 0


# -- the same figures in plain Python --------------------------------------------------------


def by_group(events: list[OperationEvent]) -> dict[tuple[str, str], list[OperationEvent]]:
    groups: dict[tuple[str, str], list[OperationEvent]] = {}
    for event in events:
        groups.setdefault((event.purgatory, event.op_type), []).append(event)
    return groups


def latencies(events: list[OperationEvent]) -> list[float]:
    return sorted(e.settled_at - e.created_at for e in events if e.outcome == "completed")


def lateness(events: list[OperationEvent]) -> list[float]:
    return sorted(e.settled_at - e.deadline for e in events if e.outcome == "expired")


def rank_bounds(values: list[float], quantile: float, rank_error: float) -> tuple[float, float]:
    """Smallest and largest value whose rank is within ``rank_error * n`` of ``quantile * n``.

    One position of slack on each side covers the rounding of the target rank.
    """
    n = len(values)
    low = max(0, math.floor((quantile - rank_error) * n) - 1)
    high = min(n - 1, math.ceil((quantile + rank_error) * n))
    return values[low], values[high]


def would_expire(events: list[OperationEvent], fraction: float) -> int:
    return sum(
        1
        for e in events
        if e.outcome == "expired"
        or (
            e.outcome == "completed"
            and fraction * (e.deadline - e.created_at) < e.settled_at - e.created_at
        )
    )


def key_counts(events: list[OperationEvent]) -> list[tuple[str, int, int]]:
    """(key, operations, expired) ranked like the report: most watched first, ties by key."""
    watched: dict[str, int] = {}
    expired: dict[str, int] = {}
    for event in events:
        for key in set(event.keys):
            watched[key] = watched.get(key, 0) + 1
            expired[key] = expired.get(key, 0) + (event.outcome == "expired")
    ranked = sorted(watched, key=lambda key: (-watched[key], key))
    return [(key, watched[key], expired[key]) for key in ranked]


def per_second(events: list[OperationEvent]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for event in events:
        second = math.floor(event.settled_at)
        counts[second] = counts.get(second, 0) + 1
    return counts
