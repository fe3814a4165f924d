"""``purgatory-broker``: the example cluster on real Kafka listeners."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Sequence

import structlog

from ..broker.config import MESSAGE_MAX_BYTES, BrokerConfig
from .server import WireCluster, WireConfig


def _int_between(low: int, high: int = 2**31 - 1) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]`` (argparse names the flag on error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


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
        "--port",
        type=_int_between(0, 65535),
        default=9092,
        help="port of broker 0; broker n listens on port+n (0: any free ports)",
    )
    parser.add_argument(
        "--brokers", type=_int_between(1, 100), default=1, help="brokers (default %(default)s)"
    )
    parser.add_argument(
        "--partitions",
        type=_int_between(1, 10_000),
        default=1,
        help="partitions of auto-created topics",
    )
    parser.add_argument(
        "--replication-factor",
        type=_int_between(1),
        default=None,
        help="replicas of auto-created topics (default: the number of brokers)",
    )
    parser.add_argument(
        "--min-insync-replicas",
        type=_int_between(1),
        default=1,
        help="ISR size acks=all needs (at most the replication factor)",
    )
    parser.add_argument(
        "--message-max-bytes",
        type=_int_between(0, 2**31 - 1),
        default=MESSAGE_MAX_BYTES,
        help="largest record batch a producer may send (Kafka's message.max.bytes; a topic's "
        "max.message.bytes overrides it; default %(default)s)",
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
    cluster = WireCluster(broker, wire)
    try:
        await cluster.start()
        print(f"purgatory-broker listening on {wire.host} ports {cluster.ports}", flush=True)
        await stop.wait()
    finally:
        await cluster.close()
    print("purgatory-broker stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    factor = args.replication_factor if args.replication_factor is not None else args.brokers
    # Checked here, before anything starts: each error names the flag to change.
    if factor > args.brokers:
        parser.error(
            f"--replication-factor {factor} exceeds --brokers {args.brokers}: "
            "each replica needs its own broker"
        )
    if args.min_insync_replicas > factor:
        parser.error(
            f"--min-insync-replicas {args.min_insync_replicas} exceeds the replication factor "
            f"{factor}: acks=all could never succeed"
        )
    if args.port and args.port + args.brokers - 1 > 65535:
        parser.error(
            f"--port {args.port} leaves no room for {args.brokers} consecutive ports "
            "(broker n listens on port+n)"
        )
    logging.basicConfig(level=logging.INFO)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    broker = BrokerConfig(
        brokers=args.brokers,
        min_insync_replicas=args.min_insync_replicas,
        message_max_bytes=args.message_max_bytes,
    )
    wire = WireConfig(
        host=args.host,
        port=args.port,
        partitions=args.partitions,
        replication_factor=factor,
        auto_create_topics=not args.no_auto_create,
    )
    try:
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(serve(broker, wire))
        else:
            asyncio.run(serve(broker, wire))
    except OSError as exc:  # the address is taken, or not this machine's
        print(
            f"purgatory-broker: error: cannot listen on {args.host} from port {args.port}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
