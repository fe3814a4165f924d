"""``python -m bench fanout``: what completing operations across processes costs.

In one run, on asyncio and uvloop:

* **apply cost** (no engine): what every receiving process pays for one advance
  event that reaches a key with 1k / 10k / 100k watchers, applied by the
  fan-out (decode + ``advance_key`` on the attached purgatory) against
  ``advance_key`` called directly in one process. Two shapes: an advance that
  reaches no operation, and one that completes exactly one. The goal: the
  fan-out within 2x of ``advance_key``, and flat in the number of watchers
  (O(log n + k) per advance, as in one process).

Then for each engine (``--engine``: Redis and PostgreSQL, each a real server
started on a free port from Debian's package):

* **latency**: one operation parked, completed by an event; the time from the
  event being raised to the waiting task resuming. In-process
  (``advance_key`` on the same purgatory) vs through the engine with the
  fan-out (a publish-only instance and a subscribing one, on their own
  connections, as two processes would be) vs encode's ``broadcaster`` on the same
  engine doing the same fan-out (its subscriber calls ``advance_key``). p50/p99,
  sequential events.
* **throughput**: N operations parked on N keys, N events published by this
  process and applied by its subscriber; events per second from the first
  publish to the last completion, for both libraries.
* engine-specific figures (Redis: receiving and filtering one message that
  concerns no local key on the single channel vs a SUBSCRIBE + UNSUBSCRIBE pair
  per watched key).

With PostgreSQL, ``--failovers N`` (default 20) adds a primary with a streaming
standby and measures what a primary's death costs (see :mod:`bench._pg_failover`).

Another engine is one more :class:`Engine` in :data:`ENGINES`.
Records go to ``bench/results/fanout/`` (not into the main summary).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from purgatory_aio import Purgatory
from purgatory_aio.fanout import Fanout, MemoryFanout, PostgresFanout, RedisFanout, ValueReached
from purgatory_aio.fanout._base import ADVANCE, encode

from . import _pg_failover
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

# Stored values outlive a run: every run uses keys of its own, or its advances would be
# replays the store absorbs (by design) and nothing would be published.
RUN = uuid.uuid4().hex[:8]

Trigger = Callable[[str], Awaitable[None] | None]

#: Watchers on the advanced key in the apply-cost section.
WATCHERS = (1_000, 10_000, 100_000)


@dataclass(frozen=True)
class Engine:
    """One engine the fan-out runs on, and how to measure it.

    ``server`` starts a private server and yields its URL; ``fanout`` builds a
    fan-out on it (``url``, the purgatories, ``subscribe``); ``broadcaster_url``
    maps the URL to the one encode's broadcaster takes (None: no broadcaster
    contender); ``broadcaster_serial``: its backend takes one publish at a time;
    ``extra`` measures what only this engine has (a dict of figures).
    """

    name: str
    server: Callable[[], contextlib.AbstractContextManager[str]]
    fanout: Callable[[str, tuple[Purgatory, ...], bool], Fanout]
    broadcaster_url: Callable[[str], str] | None = None
    broadcaster_serial: bool = False
    extra: Callable[[str, int], Awaitable[dict[str, float]]] | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument(
        "--engine", choices=(*ENGINES, "all", "none"), default="all", help="engines to measure"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--samples", type=int, default=2000, help="latency samples per contender")
    parser.add_argument("--events", type=int, default=20000, help="events in the throughput run")
    parser.add_argument(
        "--failovers",
        type=int,
        default=20,
        help="PostgreSQL primaries killed and standbys promoted, timed (0: no failover section)",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR / "fanout")
    parser.add_argument("--plain", action="store_true", help="plain progress lines, no rich")


# -- the apply cost: what each receiving process pays per advance -------------------------------


async def _apply_cost(watchers: int, advances: int, rounds: int) -> dict[str, dict[str, float]]:
    """Microseconds per advance, direct vs through the fan-out's delivery, for an advance that
    reaches no operation and one that completes exactly one (medians of ``rounds``
    alternating runs, each contender on its own purgatory holding ``watchers`` operations)."""
    key = f"apply:{RUN}"

    async def loaded(offset: float) -> tuple[Purgatory, Fanout]:
        purgatory = Purgatory(f"apply-{watchers}")
        fanout = MemoryFanout(None, purgatory)  # never started: only its delivery path runs
        for i in range(watchers):
            threshold = offset + i
            await purgatory.watch_threshold(
                ValueReached(fanout, key, threshold, 3600), key, threshold
            )
        return purgatory, fanout

    # Never more advances than operations to complete: each round takes its own.
    advances = max(1, min(advances, watchers // (rounds + 1)))
    results: dict[str, dict[str, float]] = {}
    for shape, offset in (("reaches_none", 1e9), ("completes_one", 1.0)):
        direct_p, _ = await loaded(offset)
        relay_p, relay = await loaded(offset)
        # The operations just created are young: the first collections would scan them all,
        # and only the contender that allocates (parsing messages) would trigger them and
        # pay (2.4 against 0.9 us per advance at 100k watchers). Made old first, for both.
        gc.collect()
        direct: list[float] = []
        through: list[float] = []
        for r in range(rounds):
            if shape == "reaches_none":
                values = [float(r * advances + j) for j in range(advances)]
            else:  # each advance completes the next operation, lowest threshold first
                values = [offset + r * advances + j for j in range(advances)]
            messages = [encode(ADVANCE, key, value, "elsewhere") for value in values]
            started = time.perf_counter()
            for value in values:
                direct_p.advance_key(key, value)
            direct.append((time.perf_counter() - started) / advances)
            deliver = relay.deliver
            started = time.perf_counter()
            for message in messages:
                deliver(message)
            through.append((time.perf_counter() - started) / advances)
            await asyncio.sleep(0)  # the completed operations' awaiters, between rounds
        results[shape] = {
            "advance_key_us": statistics.median(direct) * 1e6,
            "fanout_us": statistics.median(through) * 1e6,
        }
        for purgatory in (direct_p, relay_p):
            await purgatory.shutdown(expire_pending=False)
    return results


# -- through an engine ---------------------------------------------------------------------------


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
                purgatory.advance_key(event.message, 1.0)  # records the value, as the fan-out

    task = asyncio.create_task(listen())
    await ready.wait()
    # broadcaster 0.3.1 starts its listener when subscribe() begins, before redis-py marks
    # the connection subscribed; the listener then sees "not subscribed", stops and waits
    # for the next subscribe, so nothing is ever delivered. Wake it once more.
    backend: Any = getattr(sub, "_backend", None)
    await asyncio.sleep(0.05)
    if backend is not None and hasattr(backend, "_ready"):
        backend._ready.set()
    await asyncio.sleep(0.05)  # the SUBSCRIBE has reached the engine
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


async def _through_engine(engine: Engine, url: str, samples: int, events: int) -> dict[str, Any]:
    a, b = Purgatory("bench-a"), Purgatory("bench-b")
    fa, fb = engine.fanout(url, (a,), True), engine.fanout(url, (b,), False)
    name = engine.name
    async with a, b, fa, fb:

        def local(key: str) -> None:
            a.advance_key(key, 1.0)

        def remote(key: str) -> None:
            fb.advance(key, 1)

        latency = {
            "in_process": await _latency(a, fa, local, samples),
            f"fanout_{name}": await _latency(a, fa, remote, samples),
        }

        async def fanout_publish(keys: list[str]) -> None:
            for key in keys:
                fb.advance(key, 1)

        rates = {f"fanout_{name}": await _throughput(a, fa, fanout_publish, events, "fanout")}
        if engine.broadcaster_url is not None:
            async with _broadcaster(engine.broadcaster_url(url), a) as broadcast:

                async def bc_trigger(key: str) -> None:
                    await broadcast.publish(channel="bench", message=key)

                latency[f"broadcaster_{name}"] = await _latency(a, fa, bc_trigger, samples)

                async def bc_publish(keys: list[str]) -> None:
                    if engine.broadcaster_serial:
                        for key in keys:
                            await broadcast.publish(channel="bench", message=key)
                        return
                    # Concurrent publishes, as concurrent handlers would issue them.
                    for start in range(0, len(keys), 64):
                        chunk = keys[start : start + 64]
                        await asyncio.gather(
                            *(broadcast.publish(channel="bench", message=k) for k in chunk)
                        )

                rates[f"broadcaster_{name}"] = await _throughput(a, fa, bc_publish, events, "bc")
        extra = await engine.extra(url, max(200, samples // 4)) if engine.extra else {}

    def pct(values: list[float], q: float) -> float:
        return quantile(values, q) * 1e6

    return {
        "latency_us": {
            contender: {"p50": pct(values, 0.5), "p99": pct(values, 0.99)}
            for contender, values in latency.items()
        },
        "events_per_s": rates,
        "extra": extra,
    }


# -- Redis ---------------------------------------------------------------------------------------


def _test_support(module: str) -> Any:
    # The test helpers are the one place that knows how to run each server; reuse them.
    import importlib
    import sys

    tests = Path(__file__).resolve().parent.parent / "tests"
    sys.path[:0] = [str(tests / "fanout"), str(tests)]
    return importlib.import_module(module)


@contextlib.contextmanager
def _redis_server() -> Iterator[str]:
    with _test_support("fanout_support").RedisServer() as server:
        yield server.url


def _redis_fanout(url: str, purgatories: tuple[Purgatory, ...], subscribe: bool) -> Fanout:
    return RedisFanout(url, *purgatories, subscribe=subscribe)


async def _subscription_cost(url: str, n: int) -> dict[str, float]:
    """Microseconds per key: a SUBSCRIBE+UNSUBSCRIBE pair vs one unrelated message received."""
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
        return {
            "per_key_subscribe_unsubscribe_us": per_key * 1e6,
            "single_channel_message_us": per_message * 1e6,
        }
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await client.aclose()


# -- PostgreSQL ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _postgres_server() -> Iterator[str]:
    with _test_support("pg_support").PostgresServer() as server:
        yield server.url


def _postgres_fanout(url: str, purgatories: tuple[Purgatory, ...], subscribe: bool) -> Fanout:
    # A table of its own per run (Redis keys carry the run in their names instead).
    return PostgresFanout(url, *purgatories, subscribe=subscribe, prefix=f"bench_{RUN}")


ENGINES: dict[str, Engine] = {
    "redis": Engine(
        name="redis",
        server=_redis_server,
        fanout=_redis_fanout,
        broadcaster_url=lambda url: url,
        extra=_subscription_cost,
    ),
    "postgres": Engine(
        name="postgres",
        server=_postgres_server,
        fanout=_postgres_fanout,
        broadcaster_url=lambda url: url,
        # broadcaster's PostgreSQL backend publishes on its one asyncpg connection, which
        # runs one statement at a time: concurrent publishes fail there.
        broadcaster_serial=True,
    ),
}


# -- the run -------------------------------------------------------------------------------------


def _apply_rows(apply: dict[int, dict[str, dict[str, float]]]) -> tuple[dict[str, Any], list[Any]]:
    ratios: dict[str, float | None] = {}
    headline: list[tuple[str, str]] = []
    for shape in ("reaches_none", "completes_one"):
        cells = []
        for watchers, by_shape in apply.items():
            row = by_shape[shape]
            cells.append(
                f"{watchers}: {row['advance_key_us']:.2f}/{row['fanout_us']:.2f}"
                f" ({(ratio(row['fanout_us'], row['advance_key_us']) or 0):.2f}x)"
            )
            ratios[f"apply_{shape}_{watchers}_fanout_vs_advance_key"] = ratio(
                row["fanout_us"], row["advance_key_us"]
            )
        sizes = list(apply)
        ratios[f"apply_{shape}_fanout_{sizes[-1]}_vs_{sizes[0]}"] = ratio(
            apply[sizes[-1]][shape]["fanout_us"], apply[sizes[0]][shape]["fanout_us"]
        )
        headline.append(
            (f"µs per advance ({shape}) watchers: advance_key/fanout", "  ".join(cells))
        )
    return ratios, headline


def _engine_rows(name: str, results: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    lat, rate = results["latency_us"], results["events_per_s"]
    fan, bc = f"fanout_{name}", f"broadcaster_{name}"
    ratios: dict[str, float | None] = {}
    if bc in lat:
        for q in ("p50", "p99"):
            ratios[f"{name}_added_{q}_fanout_vs_broadcaster"] = ratio(
                lat[fan][q] - lat["in_process"][q], lat[bc][q] - lat["in_process"][q]
            )
        ratios[f"{name}_events_per_s_fanout_vs_broadcaster"] = ratio(rate[fan], rate[bc])
    headline = [
        (
            f"{name} latency p50/p99 µs " + " / ".join(lat),
            " / ".join(f"{v['p50']:.0f}/{v['p99']:.0f}" for v in lat.values()),
        ),
        (f"{name} events/s " + " / ".join(rate), " / ".join(f"{v:.0f}" for v in rate.values())),
        *((f"{name} {k}", f"{v:.1f}") for k, v in results["extra"].items()),
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
    watchers = (1_000, 10_000) if args.quick else WATCHERS
    advances, rounds = (200, 3) if args.quick else (2000, 7)
    chosen = {"all": list(ENGINES), "none": []}.get(args.engine, [args.engine])
    failovers = min(args.failovers, 3) if args.quick else args.failovers
    with contextlib.ExitStack() as servers:
        urls = {name: servers.enter_context(ENGINES[name].server()) for name in chosen}
        pair = (
            servers.enter_context(_test_support("pg_support").ReplicatedPair())
            if "postgres" in chosen and failovers > 0
            else None
        )
        for loop_name in resolve_loops(args.loop, progress):
            global RUN
            RUN = uuid.uuid4().hex[:8]
            apply = {
                n: run_on(loop_name, lambda n=n: _apply_cost(n, advances, rounds))  # type: ignore[misc]
                for n in watchers
            }
            ratios, headline = _apply_rows(apply)
            results: dict[str, Any] = {"apply_cost_us": apply}
            for name in chosen:
                engine = ENGINES[name]
                measured = run_on(
                    loop_name,
                    lambda e=engine: _through_engine(e, urls[e.name], samples, events),  # type: ignore[misc]
                )
                results[name] = measured
                more_ratios, more_rows = _engine_rows(name, measured)
                ratios.update(more_ratios)
                headline.extend(more_rows)
            if pair is not None:
                failover = run_on(
                    loop_name, lambda: _pg_failover.measure(pair, failovers, args.quick)
                )
                results["postgres_failover"] = failover
                more_ratios, more_rows = _pg_failover.rows(failover)
                ratios.update(more_ratios)
                headline.extend(more_rows)
            record: Record = make_record(
                "fanout",
                loop_name,
                {
                    "samples": samples,
                    "events": events,
                    "watchers": list(watchers),
                    "failovers": failovers if pair is not None else 0,
                },
                results,
                ratios=ratios,
                headline=headline,
            )
            publish(record, loop_name, progress, args.results_dir)
    return 0
