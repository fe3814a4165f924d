"""The counters and gauges of one process's fan-out."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(slots=True)
class FanoutStats:
    """Counters of one process's fan-out (monotonic since start, except the gauges)."""

    # Those from `received` to `malformed` are counted by the fan-out's receiver, on the
    # compiled path of every delivered message (native ints there, not attributes of this).

    published: int = 0  # events the engine stored / published
    publish_dropped: int = 0  # refused at once: the queue was full, or the fan-out stopped
    publish_failures: int = 0  # batches sent again after a connection error
    publish_errors: int = 0  # events the engine refused (a foreign value under the key...)
    undelivered: int = 0  # events stop() could not hand to the engine
    received: int = 0
    applied_checks: int = 0
    applied_advances: int = 0
    applied_cancels: int = 0
    apply_errors: int = 0  # events whose application raised (logged)
    completed: int = 0  # operations completed by applied events
    malformed: int = 0  # messages or stored values that are not ours
    outages: int = 0
    recoveries: int = 0
    resyncs: int = 0
    resubscribes: int = 0  # subscriptions re-established after the first
    failovers: int = 0  # subscriptions re-established on another server than before
    refresh_failures: int = 0  # reads of stored values that failed (retried)
    connected: bool = False  # gauge
    watched_keys: int = 0  # gauge
    queued: int = 0  # gauge: events waiting to be published
    reads_pending: int = 0  # gauge: watched keys whose stored value is still to be read

    def as_dict(self) -> dict[str, int | bool]:
        """Every field by name, ready for ``json.dumps``."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


__all__ = ["FanoutStats"]
