"""The purgatory-broker cluster for ``python -m bench kafka``, with its purgatories' sizes.

Run as ``python -m bench._kafka_broker --loop uvloop --brokers 3 ...``: serves a
:class:`WireCluster` on free loopback ports, prints ``{"ports": [...]}`` once listening,
then one JSON line of purgatory statistics every ``--interval`` seconds, until SIGTERM or
SIGINT (then a graceful close, as ``purgatory-broker`` does).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys

from minikafka.broker.config import BrokerConfig
from minikafka.wire.server import WireCluster, WireConfig

from ._common import quiet_logs, run_on


def _emit(line: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


async def serve(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    broker = BrokerConfig(brokers=args.brokers, min_insync_replicas=args.min_insync_replicas)
    wire = WireConfig(
        port=0, partitions=args.partitions, replication_factor=args.replication_factor
    )
    async with WireCluster(broker, wire) as cluster:
        _emit({"ports": cluster.ports})
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.interval)
            purgatories = cluster.cluster.purgatories
            _emit({"stats": {name: p.stats().as_dict() for name, p in purgatories.items()}})


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench._kafka_broker")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--brokers", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--min-insync-replicas", type=int, default=2)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    quiet_logs()
    run_on(args.loop, lambda: serve(args))


if __name__ == "__main__":
    main()
