"""The end-of-run report: numbers as a dict (for JSON) and as text."""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

from ..broker.cluster import Cluster
from ..clients.config import acks_name
from .stats import histogram, latency_summary, millis

if TYPE_CHECKING:
    from .simulation import RunState


class Report:
    """What a run measured. ``data`` is plain JSON-able data; :meth:`render` is for people."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def to_json(self) -> str:
        return json.dumps(self.data, indent=2, sort_keys=False)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Report) and self.data == other.data

    __hash__ = None  # type: ignore[assignment]

    def render(self) -> str:
        d = self.data
        cfg = d["config"]
        lines = [
            f"minikafka simulation: {d['simulated_seconds']:g} s "
            f"({'virtual' if cfg['virtual_time'] else 'real'} time), seed {cfg['seed']}, "
            f"{cfg['brokers']} brokers, {cfg['partitions']} partitions x {cfg['replicas']} "
            f"replicas (min.insync {cfg['min_insync']}), faults: "
            f"{', '.join(cfg['faults']) or 'none'}",
            "",
        ]
        t = d["throughput"]
        lines += [
            "Throughput",
            _rate_line("appended", t["appended_records"], t["appended_records_per_s"])
            + f"  {t['appended_bytes_per_s'] / 1024:,.1f} KiB/s",
            _rate_line("acked", t["acked_records"], t["acked_records_per_s"]),
            _rate_line("consumed", t["consumed_records"], t["consumed_records_per_s"])
            + _redelivered_note(d["consumers"]["redelivered"]),
            "",
            "Produce latency (send to acknowledgement)",
            f"  {'acks':<5} {'producers':>9} {'records':>9} {'acked':>9} {'failed':>7} "
            f"{'retries':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>9}  errors",
        ]
        for name, p in d["produce"].items():
            lat = p["latency"]
            errors = ", ".join(f"{k} {v}" for k, v in p["errors"].items()) or "-"
            lines.append(
                f"  {name:<5} {p['producers']:>9} {p['sent']:>9,} {p['acked']:>9,} "
                f"{p['failed']:>7,} {p['retries']:>7,} {lat['p50_ms']:>8.2f} {lat['p99_ms']:>8.2f} "
                f"{lat['max_ms']:>9.2f}  {errors}"
            )
        f = d["fetch"]
        lines += [
            "",
            f"Consumer fetches: {f['fetches']:,} (min.bytes {cfg['fetch_min_bytes']}, "
            f"max.wait {millis(cfg['fetch_max_wait']):g} ms): {f['returned_early']:,} returned "
            f"early, {f['waited_full']:,} waited the full max.wait; wait p50 "
            f"{f['wait']['p50_ms']:g} ms, p99 {f['wait']['p99_ms']:g} ms",
            "  " + "  ".join(f"{k} {v:,}" for k, v in f["wait_histogram"].items()),
            f"Follower fetches: {f['follower_fetches']:,}",
            "",
            "Purgatories   completed    expired  cancelled   shutdown",
        ]
        for name, counts in d["purgatories"].items():
            lines.append(
                f"  {name:<13} {counts['completed']:>9,} {counts['expired']:>10,} "
                f"{counts['cancelled']:>10,} {counts['shutdown']:>10,}"
            )
        isr = d["isr"]
        lines += ["", f"ISR changes: {isr['shrinks']} shrinks, {isr['expands']} expands"]
        for change in isr["changes"][:12]:
            lines.append(
                f"  t={change['t']:>8.3f}s  {change['partition']:<12} {change['kind']:<6} "
                f"broker {change['broker']}  isr={change['isr']}"
            )
        if len(isr["changes"]) > 12:
            lines.append(f"  ... {len(isr['changes']) - 12} more")
        g = d["groups"]
        lines += [
            "",
            f"Rebalances: {g['rebalances']} completed ({g['all_rejoined']} with every member "
            f"rejoined, {g['at_timeout']} at the rebalance timeout); members expired "
            f"{g['members_expired']}, dropped at the barrier {g['members_dropped']}; "
            f"generation {g['generation']}, {g['members']} members at the end",
        ]
        dm = d["delayed_messages"]
        lines.append(
            f"Delayed messages: {dm['scheduled']:,} scheduled, {dm['delivered']:,} delivered "
            f"(max lateness {dm['max_lateness_ms']:g} ms), {dm['pending_at_end']:,} pending at "
            f"the end; consumed {dm['consumed']:,}, seen before due {dm['seen_before_due']}"
        )

        c = d["consumers"]
        o = d["ordering"]
        lines += [
            f"Consumers: end-to-end latency p50 {c['latency']['p50_ms']:g} ms, p99 "
            f"{c['latency']['p99_ms']:g} ms; {c['redelivered']:,} redelivered after rebalances",
            f"Log ordering per producer and partition: {o['duplicates']:,} duplicates, "
            f"{o['out_of_order']:,} out of order (retries with max.in.flight "
            f"{cfg['max_in_flight']}"
            f"{', idempotent producers' if cfg.get('idempotence') else ''}); "
            f"{d['unsettled_records']:,} records unsettled at the end",
        ]
        if d["faults"]:
            lines += ["", "Faults"]
            lines += [f"  t={e['t']:>8.3f}s  {e['fault']:<16} {e['detail']}" for e in d["faults"]]
        return "\n".join(lines)


def _redelivered_note(redelivered: int) -> str:
    if not redelivered:
        return ""
    # Consumers read a record again after a rebalance hands its partition to another
    # member before the offset was committed: "consumed" can exceed "appended".
    return f"  ({redelivered:,} of them redelivered after rebalances)"


def _rate_line(what: str, records: int, per_second: float) -> str:
    return f"  {what:<9} {records:>10,} records  {per_second:>10,.1f}/s"


def build_report(state: RunState) -> Report:
    config = state.config
    cluster = state.cluster
    elapsed = state.elapsed
    start = state.start
    per_second = (lambda n: round(n / elapsed, 3)) if elapsed > 0 else (lambda n: 0.0)
    logs = [p.log for p in cluster.replicas.partitions.values()]
    appended = sum(len(log) for log in logs)
    appended_bytes = sum(log.size for log in logs)
    acked = sum(p.producer.stats.acked for p in state.producers)
    deliveries = state.deliveries

    consumers = [loop.consumer for loop in state.consumers]
    waits = [w for c in consumers for w in c.stats.waits]
    fetches = sum(c.stats.fetches for c in consumers)
    early = sum(c.stats.early for c in consumers)
    max_wait = config.fetch_max_wait
    edges = sorted({0.001, 0.01, 0.1, max_wait})

    events = cluster.coordinator.events
    kinds = Counter(e.kind for e in events)
    at_timeout = cluster.coordinator.joins_at_timeout
    group = cluster.coordinator.group(config.group)
    delivery = cluster.replicas.delivery

    data: dict[str, Any] = {
        "config": config.as_dict(),
        "simulated_seconds": round(elapsed, 6),
        "throughput": {
            "appended_records": appended,
            "appended_records_per_s": per_second(appended),
            "appended_bytes_per_s": per_second(appended_bytes),
            "acked_records": acked,
            "acked_records_per_s": per_second(acked),
            "consumed_records": deliveries.records,
            "consumed_records_per_s": per_second(deliveries.records),
        },
        "produce": _produce_by_acks(state),
        "fetch": {
            "fetches": fetches,
            "returned_early": early,
            "waited_full": fetches - early,
            "wait": latency_summary(waits),
            "wait_histogram": histogram(waits, edges),
            "follower_fetches": sum(f.fetches for f in cluster.fetchers),
        },
        "purgatories": state.tally.table(),
        "isr": {
            "shrinks": sum(1 for c in cluster.replicas.isr_changes if c.kind == "shrink"),
            "expands": sum(1 for c in cluster.replicas.isr_changes if c.kind == "expand"),
            "changes": [
                {
                    "t": round(c.time - start, 6),
                    "partition": str(c.tp),
                    "kind": c.kind,
                    "broker": c.broker,
                    "isr": list(c.isr),
                }
                for c in cluster.replicas.isr_changes
            ],
        },
        "groups": {
            "rebalances": kinds["rebalance_completed"],
            "all_rejoined": kinds["rebalance_completed"] - at_timeout,
            "at_timeout": at_timeout,
            "members_expired": kinds["member_expired"],
            "members_dropped": kinds["member_dropped"],
            "members_left": kinds["member_left"],
            "generation": 0 if group is None else group.generation,
            "members": 0 if group is None else len(group.members),
            "events": [
                {
                    "t": round(e.time - start, 6),
                    "kind": e.kind,
                    "member": e.member_id,
                    "generation": e.generation,
                    "detail": e.detail,
                }
                for e in events
            ],
        },
        "delayed_messages": {
            "scheduled": delivery.scheduled,
            "delivered": delivery.delivered,
            "pending_at_end": delivery.pending,
            "max_lateness_ms": millis(delivery.max_lateness),
            "consumed": deliveries.delayed,
            "seen_before_due": deliveries.seen_before_due,
        },
        "consumers": {
            "records": deliveries.records,
            "redelivered": deliveries.redelivered,
            "latency": latency_summary(deliveries.latencies),
            "joins": sum(c.stats.joins for c in consumers),
        },
        "ordering": _ordering(cluster),
        "unsettled_records": state.unsettled,
        "faults": []
        if state.faults is None
        else [{"t": e.time, "fault": e.fault, "detail": e.detail} for e in state.faults.events],
    }
    return Report(data)


def _produce_by_acks(state: RunState) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Any]] = {}
    failed: Counter[str] = Counter()
    for index, loop in enumerate(state.producers):
        name = acks_name(loop.producer.config.acks)
        groups.setdefault(name, []).append(loop.producer.stats)
        # Records still unsent when the run stopped are reported as unsettled, not as
        # failures: closing the producer fails them, but no broker refused them.
        in_run = state.failed_in_run
        failed[name] += in_run[index] if index < len(in_run) else loop.producer.stats.failed
    result: dict[str, dict[str, Any]] = {}
    for name in ("all", "1", "0"):
        stats = groups.get(name)
        if not stats:
            continue
        errors: Counter[str] = Counter()
        for s in stats:
            errors.update(s.errors)
        result[name] = {
            "producers": len(stats),
            "sent": sum(s.sent for s in stats),
            "acked": sum(s.acked for s in stats),
            "failed": failed[name],
            "retries": sum(s.retries for s in stats),
            "requests": sum(s.requests for s in stats),
            "errors": dict(sorted(errors.items())),
            "latency": latency_summary([x for s in stats for x in s.latencies]),
        }
    return result


def _ordering(cluster: Cluster) -> dict[str, int]:
    """Duplicates and reordering in the logs, from the producers' sequence numbers.

    Delayed messages are left out: they join the log when due, out of send order by design.
    """
    duplicates = out_of_order = 0
    for partition in cluster.replicas.partitions.values():
        highest: dict[int, int] = {}
        seen: dict[int, set[int]] = {}
        for record in partition.log:
            producer = record.producer_id
            if producer < 0 or record.delay > 0:
                continue
            sequences = seen.setdefault(producer, set())
            sequence = record.sequence
            if sequence in sequences:
                duplicates += 1
                continue
            sequences.add(sequence)
            if sequence < highest.get(producer, -1):
                out_of_order += 1
            else:
                highest[producer] = sequence
    return {"duplicates": duplicates, "out_of_order": out_of_order}
