"""``python -m bench kafka``: unmodified librdkafka clients against purgatory-broker.

A three-broker cluster (3 partitions, replication factor 3, ``min.insync.replicas=2``)
runs in a subprocess on the loop under test. For acks=1, acks=all and acks=all with an
idempotent producer (``enable.idempotence``: the brokers check every batch's sequence
numbers; librdkafka, like every client, allows idempotence with acks=all only, and its
idempotent producer has one produce request per partition in flight at a time, so
flat out it sends fewer, larger requests, each waiting for replication), two
consumers long-poll the topic (``fetch.wait.max.ms``) while one producer sends
``--records`` records of ``--size`` bytes as fast as librdkafka batches them. Reported:
records/s produced (first send to last delivery report), produce latency p50/p99 (from
``produce()`` to the delivery report) both for 2,000 records sent at 2,000/s first and for
the flat-out run (where it is mostly librdkafka's own queue),
records/s consumed end to end, and the produce and fetch purgatories' sizes sampled
every 250 ms. The ratios compare acks=all with acks=1, and the idempotent producer with
the plain one at acks=all, in the same run; run with ``--loop both`` to compare the loops.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ._common import (
    RESULTS_DIR,
    Progress,
    Record,
    make_record,
    mark_quick,
    publish,
    quantile,
    quiet_logs,
    ratio,
    resolve_loops,
)

#: The producer settings compared: label -> (acks, enable.idempotence).
SETTINGS = {"1": ("1", False), "all": ("all", False), "all+idempotence": ("all", True)}
CONSUMERS = 2
#: Records sent first at a steady rate, for latency without librdkafka's queueing.
PACED, PACED_RATE = 2_000, 2_000.0
WARMUP = 100
#: Records each producer sends before its timed ones (three producers per setting).
PRODUCER_WARMUP = 10
PARTITIONS = 3
#: Hang guard for start-up, delivery and consumption, never a timing claim.
GUARD_S = 120.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="20,000 records per acks setting")
    parser.add_argument("--records", type=int, default=200_000, help="records per acks setting")
    parser.add_argument("--size", type=int, default=100, help="value bytes per record")
    parser.add_argument("--fetch-wait-ms", type=int, default=500, help="consumers' long poll")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--plain", action="store_true", help="plain progress lines, no rich")


class Broker:
    """The cluster subprocess and the latest purgatory statistics it printed."""

    def __init__(self, loop_name: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench._kafka_broker", "--loop", loop_name],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        if not first:
            raise RuntimeError(f"the broker did not start (exit {self.process.wait(10)})")
        self.ports: list[int] = json.loads(first)["ports"]
        self._lock = threading.Lock()
        self._peaks: dict[str, int] = {}
        self.latest: dict[str, dict[str, Any]] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            stats = json.loads(line)["stats"]
            with self._lock:
                self.latest = stats
                for name in ("produce", "fetch"):
                    for field in ("pending", "watched"):
                        key = f"{name}_{field}"
                        self._peaks[key] = max(self._peaks.get(key, 0), stats[name][field])

    def window(self) -> dict[str, int]:
        """Peak sizes since the last call, and settle counts so far."""
        with self._lock:
            peaks, self._peaks = self._peaks, {}
            latest = self.latest
        counts = {
            f"{name}_{field}": int(latest.get(name, {}).get(field, 0))
            for name in ("produce", "fetch")
            for field in ("completed", "expired")
        }
        return {**{f"peak_{k}": v for k, v in peaks.items()}, **counts}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@contextmanager
def running_broker(loop_name: str) -> Iterator[Broker]:
    broker = Broker(loop_name)
    try:
        yield broker
    finally:
        broker.stop()


class Consumers:
    """``CONSUMERS`` long-polling consumers splitting the topic's partitions."""

    def __init__(self, bootstrap: str, topic: str, expected: int, fetch_wait_ms: int) -> None:
        self.received = 0
        self.last_at = 0.0
        self._expected = expected
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._run,
                args=(bootstrap, topic, list(range(i, PARTITIONS, CONSUMERS)), fetch_wait_ms),
                daemon=True,
            )
            for i in range(CONSUMERS)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, bootstrap: str, topic: str, partitions: list[int], wait_ms: int) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "bench",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": wait_ms,
            }
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        try:
            while not self._stop.is_set():
                messages = consumer.consume(10_000, 0.2)
                if not messages:
                    continue
                now = time.monotonic()
                with self._lock:
                    self.received += sum(1 for m in messages if m.error() is None)
                    self.last_at = now
        finally:
            consumer.close()

    def wait_for_all(self, deadline: float) -> bool:
        while time.monotonic() < deadline:
            with self._lock:
                if self.received >= self._expected:
                    return True
            time.sleep(0.01)
        return False

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def _produce(
    bootstrap: str,
    topic: str,
    acks: str,
    n: int,
    size: int,
    progress: Progress,
    rate: float = 0.0,
    idempotence: bool = False,
) -> Record:
    """Send ``n`` records, as fast as librdkafka takes them (``rate`` 0) or paced."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "enable.idempotence": idempotence,
            "linger.ms": 5,
            "queue.buffering.max.messages": 100_000,
        }
    )
    # A few records first, outside the timing: a new producer's start (an idempotent one
    # waits up to 500 ms for a broker connection before it asks for its producer ID)
    # is not what the figures are about.
    for _ in range(PRODUCER_WARMUP):
        producer.produce(topic, b"w")
    if producer.flush(GUARD_S) != 0:
        raise RuntimeError(f"acks={acks}: warm-up records undelivered after {GUARD_S:.0f} s")
    sent = [0.0] * n
    latencies: list[float] = []
    errors: list[str] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
            return
        index = int.from_bytes(msg.key(), "big")
        latencies.append(time.monotonic() - sent[index])

    value = b"x" * size
    started = time.monotonic()
    pace = f" at {rate:,.0f}/s" if rate else ""
    with progress.task(f"acks={acks}: produce {n:,}{pace}", total=n) as ticker:
        for i in range(n):
            if rate:
                delay = started + i / rate - time.monotonic()
                if delay > 0:
                    producer.poll(delay)
            while True:
                sent[i] = time.monotonic()
                try:
                    producer.produce(topic, value, key=i.to_bytes(4, "big"), on_delivery=delivered)
                    break
                except BufferError:  # librdkafka's queue is full: serve callbacks, retry
                    producer.poll(0.01)
            if i % 1000 == 999:
                producer.poll(0)
                ticker.advance(1000)
        if producer.flush(GUARD_S) != 0:
            raise RuntimeError(f"acks={acks}: records undelivered after {GUARD_S:.0f} s")
    elapsed = time.monotonic() - started
    if errors:
        raise RuntimeError(f"acks={acks}: {len(errors)} delivery errors, e.g. {errors[0]}")
    latencies.sort()
    return {
        "records": n,
        "seconds": elapsed,
        "records_per_s": n / elapsed,
        "latency_ms": {
            "p50": quantile(latencies, 0.50) * 1000,
            "p99": quantile(latencies, 0.99) * 1000,
            "max": latencies[-1] * 1000,
        },
    }


def measure(loop_name: str, args: argparse.Namespace, progress: Progress) -> Record:
    n = 20_000 if args.quick else args.records
    results: Record = {}
    with running_broker(loop_name) as broker:
        progress.info(f"   broker on {loop_name}: ports {broker.ports}")
        for label, (acks, idempotence) in SETTINGS.items():
            topic = f"bench-acks-{label.replace('+', '-')}"
            _create(broker.bootstrap, topic)
            consumers = Consumers(
                broker.bootstrap,
                topic,
                WARMUP + PACED + n + 3 * PRODUCER_WARMUP,
                args.fetch_wait_ms,
            )
            try:
                # Until every follower fetches the new topic, acks=all waits for them to start.
                _produce(
                    broker.bootstrap,
                    topic,
                    acks,
                    WARMUP,
                    args.size,
                    Progress(quiet=True),
                    idempotence=idempotence,
                )
                broker.window()
                paced = _produce(
                    broker.bootstrap,
                    topic,
                    acks,
                    PACED,
                    args.size,
                    progress,
                    rate=PACED_RATE,
                    idempotence=idempotence,
                )
                flat_out_from = time.monotonic()
                produced = _produce(
                    broker.bootstrap, topic, acks, n, args.size, progress, idempotence=idempotence
                )
                delivered_at = time.monotonic()
                if not consumers.wait_for_all(delivered_at + GUARD_S):
                    raise RuntimeError(f"acks={acks}: consumers got {consumers.received} records")
            finally:
                consumers.stop()
            time.sleep(0.3)  # one more statistics line after the last fetch
            results[label] = {
                **produced,
                "paced": {"rate": PACED_RATE, **paced},
                "consumed": consumers.received,
                # The flat-out records, from the first send to the last one consumed.
                "consumed_per_s": n / (consumers.last_at - flat_out_from),
                "last_consumed_after_last_delivery_ms": max(
                    0.0, (consumers.last_at - delivered_at) * 1000
                ),
                "purgatories": broker.window(),
            }
    return results


def _create(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, PARTITIONS, 3)], operation_timeout=30)
    futures[topic].result(GUARD_S)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench kafka", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        print(
            "python -m bench kafka needs confluent-kafka: pip install './examples[all]'",
            file=sys.stderr,
        )
        return 2
    quiet_logs()
    mark_quick(args.quick)
    progress = Progress(plain=args.plain)
    progress.section("kafka: librdkafka producer and long-polling consumers vs purgatory-broker")
    per_loop: dict[str, Record] = {}
    for loop_name in resolve_loops(args.loop, progress):
        results = per_loop[loop_name] = measure(loop_name, args, progress)
        one, every, idem = results["1"], results["all"], results["all+idempotence"]
        ratios = {
            "records_per_s_acks_all_vs_1": ratio(every["records_per_s"], one["records_per_s"]),
            "paced_p50_acks_all_vs_1": ratio(
                every["paced"]["latency_ms"]["p50"], one["paced"]["latency_ms"]["p50"]
            ),
            "paced_p99_acks_all_vs_1": ratio(
                every["paced"]["latency_ms"]["p99"], one["paced"]["latency_ms"]["p99"]
            ),
            "p50_acks_all_vs_1": ratio(every["latency_ms"]["p50"], one["latency_ms"]["p50"]),
            "p99_acks_all_vs_1": ratio(every["latency_ms"]["p99"], one["latency_ms"]["p99"]),
            "records_per_s_idempotent_vs_plain": ratio(
                idem["records_per_s"], every["records_per_s"]
            ),
            "paced_p50_idempotent_vs_plain": ratio(
                idem["paced"]["latency_ms"]["p50"], every["paced"]["latency_ms"]["p50"]
            ),
            "paced_p99_idempotent_vs_plain": ratio(
                idem["paced"]["latency_ms"]["p99"], every["paced"]["latency_ms"]["p99"]
            ),
        }
        headline = [
            (
                f"acks={label} produced/s | consumed/s | p50/p99 ms at {PACED_RATE:,.0f}/s | "
                "p50/p99 ms flat out | peak produce/fetch pending",
                f"{r['records_per_s']:,.0f} | {r['consumed_per_s']:,.0f} | "
                f"{r['paced']['latency_ms']['p50']:.1f}/{r['paced']['latency_ms']['p99']:.1f} | "
                f"{r['latency_ms']['p50']:.1f}/{r['latency_ms']['p99']:.1f} | "
                f"{r['purgatories'].get('peak_produce_pending', 0)}/"
                f"{r['purgatories'].get('peak_fetch_pending', 0)}",
            )
            for label, r in results.items()
        ]
        headline += [(name, f"{v:.2f}x" if v is not None else "-") for name, v in ratios.items()]
        record = make_record(
            "kafka",
            loop_name,
            {
                "records": 20_000 if args.quick else args.records,
                "size": args.size,
                "fetch_wait_ms": args.fetch_wait_ms,
                "brokers": 3,
                "partitions": PARTITIONS,
                "replication_factor": 3,
                "min_insync_replicas": 2,
                "consumers": CONSUMERS,
            },
            results,
            ratios=ratios,
            headline=headline,
        )
        publish(record, loop_name, progress, args.results_dir)
    if len(per_loop) == 2:
        for label in SETTINGS:
            value = ratio(
                per_loop["uvloop"][label]["records_per_s"],
                per_loop["asyncio"][label]["records_per_s"],
            )
            progress.result(f"acks={label} records/s uvloop vs asyncio: {value or 0:.2f}x")
    return 0
