"""``python -m bench fanout``: what completing operations across processes costs, per engine.

Against a real redis-server and a real PostgreSQL, each started on a free port
(Debian's packages), on asyncio and uvloop, in one run, for each engine:

* **latency**: one operation parked, completed by an event; the time from the
  event being raised to the waiting task resuming. In-process
  (``advance_key`` on the same purgatory) vs through the engine with
  :class:`~purgatory_aio.fanout.RedisFanout` or
  :class:`~purgatory_aio.fanout.PostgresFanout` (a publish-only instance and a
  subscribing one, on their own connections, as two processes would be) vs encode's
  ``broadcaster`` backend for the same engine doing the same fan-out (its
  subscriber calls ``advance_key``). p50/p99, sequential events; what the engine
  adds is each one's latency less the in-process one.
* **throughput**: N operations parked on N keys, N events published by this
  process and applied by its subscriber; events per second from the first
  publish to the last completion, for both libraries.
* **subscription mode** (Redis): receiving and filtering one message that
  concerns no local key on the single channel vs a SUBSCRIBE + UNSUBSCRIBE pair
  per watched key (what per-key subscriptions cost instead).

Records go to ``bench/results/fanout/`` (not into the main summary).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from purgatory_aio import Purgatory
from purgatory_aio.fanout import Fanout, ValueReached, fanout_from_url

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
    run_on,
)

ENGINES = ("redis", "postgres")

# Stored values outlive a run: every run uses keys of its own, or its advances would be
# replays the store absorbs (by design) and nothing would be published.
RUN = uuid.uuid4().hex[:8]

Trigger = Callable[[str], Awaitable[None] | None]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument("--engine", choices=(*ENGINES, "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--samples", type=int, default=2000, help="latency samples per contender")
    parser.add_argument("--events", type=int, default=20000, help="events in the throughput run")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR / "fanout")
    parser.add_argument("--plain", action="store_true", help="plain progress lines, no rich")


@contextlib.contextmanager
def servers(engines: list[str]) -> Iterator[dict[str, str]]:
    """The engines' URLs, each a real server for the run. The test helpers are the one place
    that knows how to run redis-server and PostgreSQL; reuse them."""
    tests = Path(__file__).resolve().parent.parent / "tests"
    sys.path[:0] = [str(tests / "fanout"), str(tests)]
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        if "redis" in engines:
            support: Any = importlib.import_module("fanout_support")
            urls["redis"] = stack.enter_context(support.RedisServer()).url
        if "postgres" in engines:
            pg: Any = importlib.import_module("pg_support")
            urls["postgres"] = stack.enter_context(pg.PostgresServer()).url
        yield urls


async def _latency(purgatory: Purgatory, fanout: Fanout, trigger: Trigger, n: int) -> list[float]:
    samples = []
    for i in range(n):
        key = f"lat:{RUN}:{i}:{id(trigger)}"
        op = ValueReached(fanout, key, 1, 30)
        await purgatory.watch_threshold(op, key, 1)
        started = time.perf_counter()
        pending = trigger(key)
        if pending is not None:
            await pending
        await op
        samples.append(time.perf_counter() - started)
    return sorted(samples)


@contextlib.asynccontextmanager
async def _broadcaster(url: str, purgatory: Purgatory) -> AsyncIterator[Any]:
    from broadcaster import Broadcast

    pub, sub = Broadcast(url), Broadcast(url)
    await pub.connect()
    await sub.connect()
    ready = asyncio.Event()

    async def listen() -> None:
        async with sub.subscribe(channel="bench") as subscribed:
            subscriber: Any = subscribed
            ready.set()
            async for event in subscriber:
                purgatory.advance_key(event.message, 1.0)  # records the value, as the fan-out does

    task = asyncio.create_task(listen())
    await ready.wait()
    # broadcaster 0.3.1 starts its Redis listener when subscribe() begins, before redis-py
    # marks the connection subscribed; the listener then sees "not subscribed", stops and
    # waits for the next subscribe, so nothing is ever delivered. Wake it once more.
    backend: Any = getattr(sub, "_backend", None)
    await asyncio.sleep(0.05)
    if backend is not None and hasattr(backend, "_ready"):
        backend._ready.set()
    await asyncio.sleep(0.05)  # the SUBSCRIBE / LISTEN has reached the server
    try:
        yield pub
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await pub.disconnect()
        await sub.disconnect()


async def _throughput(
    purgatory: Purgatory,
    fanout: Fanout,
    publish_all: Callable[[list[str]], Awaitable[None]],
    n: int,
    tag: str,
) -> float:
    keys = [f"tp:{RUN}:{tag}:{i}" for i in range(n)]
    ops = [ValueReached(fanout, key, 1, 120) for key in keys]
    for op, key in zip(ops, keys, strict=True):
        await purgatory.watch_threshold(op, key, 1)
    started = time.perf_counter()
    await publish_all(keys)
    for op in ops:
        await op
    return n / (time.perf_counter() - started)


async def _subscription_cost(url: str, n: int) -> tuple[float, float]:
    """Seconds per key: a SUBSCRIBE+UNSUBSCRIBE pair vs one unrelated message received."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(url)
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe("warm")
        await pubsub.get_message(timeout=1)
        started = time.perf_counter()
        for i in range(n):
            await pubsub.subscribe(f"k{i}")
            await pubsub.get_message(timeout=1)
            await pubsub.unsubscribe(f"k{i}")
            await pubsub.get_message(timeout=1)
        per_key = (time.perf_counter() - started) / n
        pipe = client.pipeline(transaction=False)
        for i in range(n):
            pipe.publish("warm", f"c|x||other{i}")
        await pipe.execute()
        local: dict[str, int] = {}
        started = time.perf_counter()
        received = 0
        while received < n:
            message = await pubsub.get_message(timeout=1)
            if message is not None and message["type"] == "message":
                received += 1
                local.get(message["data"].decode().split("|", 3)[3])  # the filter
        per_message = (time.perf_counter() - started) / n
        return per_key, per_message
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await client.aclose()


async def _measure(engine: str, url: str, samples: int, events: int) -> Record:
    a, b = Purgatory("bench-a"), Purgatory("bench-b")
    # A table of its own per run on PostgreSQL; Redis keys carry the run in their names.
    options = {"prefix": f"bench_{RUN}"} if engine == "postgres" else {}
    fa = fanout_from_url(url, a, **options)
    fb = fanout_from_url(url, b, subscribe=False, **options)
    async with a, b, fa, fb:

        def local(key: str) -> None:
            a.advance_key(key, 1.0)

        def remote(key: str) -> None:
            fb.advance(key, 1)

        in_process = await _latency(a, fa, local, samples)
        through_fanout = await _latency(a, fa, remote, samples)

        async def fanout_publish(keys: list[str]) -> None:
            for key in keys:
                fb.advance(key, 1)

        fanout_rate = await _throughput(a, fa, fanout_publish, events, "fanout")

        async with _broadcaster(url, a) as broadcast:

            async def bc_trigger(key: str) -> None:
                await broadcast.publish(channel="bench", message=key)

            through_broadcaster = await _latency(a, fa, bc_trigger, samples)

            async def bc_publish(keys: list[str]) -> None:
                if engine == "postgres":
                    # broadcaster's PostgreSQL backend publishes on one asyncpg connection,
                    # which runs one statement at a time: concurrent publishes fail there.
                    for key in keys:
                        await broadcast.publish(channel="bench", message=key)
                    return
                # Concurrent publishes, as concurrent handlers would issue them.
                for start in range(0, len(keys), 64):
                    await asyncio.gather(
                        *(
                            broadcast.publish(channel="bench", message=k)
                            for k in keys[start : start + 64]
                        )
                    )

            broadcaster_rate = await _throughput(a, fa, bc_publish, events, "bc")
    subscription: Record = {}
    if engine == "redis":
        per_key, per_message = await _subscription_cost(url, max(200, samples // 4))
        subscription = {
            "per_key_subscribe_unsubscribe": per_key * 1e6,
            "single_channel_message": per_message * 1e6,
        }

    def pct(values: list[float], q: float) -> float:
        return quantile(values, q) * 1e6

    return {
        "latency_us": {
            name: {"p50": pct(values, 0.5), "p99": pct(values, 0.99)}
            for name, values in (
                ("in_process", in_process),
                ("fanout", through_fanout),
                ("broadcaster", through_broadcaster),
            )
        },
        "events_per_s": {"fanout": fanout_rate, "broadcaster": broadcaster_rate},
        "subscription_us": subscription,
    }


def _summary(engine: str, results: Record) -> tuple[Record, list[tuple[str, str]]]:
    lat, rate, sub = results["latency_us"], results["events_per_s"], results["subscription_us"]

    def added(name: str, q: str) -> float:
        return float(lat[name][q] - lat["in_process"][q])

    ratios: Record = {
        f"{engine}_added_p50_fanout_vs_broadcaster": ratio(
            added("fanout", "p50"), added("broadcaster", "p50")
        ),
        f"{engine}_added_p99_fanout_vs_broadcaster": ratio(
            added("fanout", "p99"), added("broadcaster", "p99")
        ),
        f"{engine}_events_per_s_fanout_vs_broadcaster": ratio(rate["fanout"], rate["broadcaster"]),
    }
    headline = [
        (
            f"{engine}: latency p50/p99 µs in-process / fanout / broadcaster",
            " / ".join(
                f"{lat[n]['p50']:.0f}/{lat[n]['p99']:.0f}"
                for n in ("in_process", "fanout", "broadcaster")
            ),
        ),
        (
            f"{engine}: events/s fanout / broadcaster",
            f"{rate['fanout']:.0f} / {rate['broadcaster']:.0f}",
        ),
    ]
    if sub:
        ratios[f"{engine}_per_key_subscription_vs_single_channel_message"] = ratio(
            sub["per_key_subscribe_unsubscribe"], sub["single_channel_message"]
        )
        headline.append(
            (
                f"{engine}: per key µs: SUBSCRIBE+UNSUBSCRIBE / one filtered message",
                f"{sub['per_key_subscribe_unsubscribe']:.1f} / {sub['single_channel_message']:.1f}",
            )
        )
    headline += [
        (name, f"{value:.2f}x" if value is not None else "-") for name, value in ratios.items()
    ]
    return ratios, headline


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fanout", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    quiet_logs()
    mark_quick(args.quick)
    progress = Progress(plain=args.plain)
    samples = 200 if args.quick else args.samples
    events = 2000 if args.quick else args.events
    engines = list(ENGINES) if args.engine == "both" else [args.engine]
    with servers(engines) as urls:
        for loop_name in resolve_loops(args.loop, progress):
            results: Record = {}
            ratios: Record = {}
            headline: list[tuple[str, str]] = []
            for engine in engines:
                global RUN
                RUN = uuid.uuid4().hex[:8]
                results[engine] = run_on(
                    loop_name, functools.partial(_measure, engine, urls[engine], samples, events)
                )
                engine_ratios, engine_headline = _summary(engine, results[engine])
                ratios.update(engine_ratios)
                headline += engine_headline
            record = make_record(
                "fanout",
                loop_name,
                {"samples": samples, "events": events, "engines": engines},
                results,
                ratios=ratios,
                headline=headline,
            )
            publish(record, loop_name, progress, args.results_dir)
    return 0
