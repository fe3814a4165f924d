"""``purgatory-broker``: the example cluster on real Kafka listeners."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Sequence

import structlog

from ..broker.config import BrokerConfig
from .server import WireCluster, WireConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="purgatory-broker",
        description=(
            "Serve a purgatory-backed Kafka cluster of 1-N brokers on consecutive ports; "
            "real Kafka clients (librdkafka, aiokafka, kafka-python) connect unmodified."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default %(default)s)")
    parser.add_argument(
        "--port", type=int, default=9092, help="port of broker 0; broker n listens on port+n"
    )
    parser.add_argument("--brokers", type=int, default=1, help="brokers (default %(default)s)")
    parser.add_argument(
        "--partitions", type=int, default=1, help="partitions of auto-created topics"
    )
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=None,
        help="replicas of auto-created topics (default: the number of brokers)",
    )
    parser.add_argument(
        "--min-insync-replicas", type=int, default=1, help="ISR size acks=all needs"
    )
    parser.add_argument(
        "--no-auto-create", action="store_true", help="refuse topics nobody created"
    )
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    return parser


async def serve(broker: BrokerConfig, wire: WireConfig) -> None:
    """Run until SIGINT or SIGTERM, then answer pending requests and stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with WireCluster(broker, wire) as cluster:
        print(f"purgatory-broker listening on {wire.host} ports {cluster.ports}", flush=True)
        await stop.wait()
    print("purgatory-broker stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        broker = BrokerConfig(brokers=args.brokers, min_insync_replicas=args.min_insync_replicas)
    except ValueError as exc:
        build_parser().error(str(exc))
    factor = args.replication_factor if args.replication_factor is not None else args.brokers
    if args.partitions < 1 or not 1 <= factor <= args.brokers:
        build_parser().error("need --partitions >= 1 and 1 <= --replication-factor <= --brokers")
    wire = WireConfig(
        host=args.host,
        port=args.port,
        partitions=args.partitions,
        replication_factor=factor,
        auto_create_topics=not args.no_auto_create,
    )
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(serve(broker, wire))
    else:
        asyncio.run(serve(broker, wire))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
