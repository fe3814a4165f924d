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
  per watched key; PostgreSQL: the advance in the caller's own transaction,
  ``advance_in``, against the same write committed and then ``advance_confirmed``
  in a second transaction, and against ``advance_confirmed`` alone: p50/p99 of the
  write path and of the wait it completes in another member).

With ``--sentinel``, Redis behind Sentinel (a master, a replica, three sentinels on
loopback, as the tests start them):

* **failover recovery**: the master killed (SIGKILL) ``--failovers`` times; the time from
  its death to the first event delivered again (published right after the kill, taken
  by the new master, applied by the other member), p50/p99;
* **confirmed acks lost**: ``--acks`` confirmed advances on as many keys, 64 at a time,
  the master killed halfway; how many of those confirmed are missing on the new master,
  per 10,000, without and with ``min_replicas=1``; again with the replica lagging (frozen
  and its link cut from halfway, the master killed at three quarters);
* **the replica option's cost**: one confirmed advance at a time on a healthy topology,
  with ``min_replicas=1`` against without.

With ``--cluster``, a Redis Cluster (three masters with a replica each on loopback, as
the tests start it) against one Redis, in the same process and run, alternated twice:
events per second per process (N operations parked on N keys, spread over every master,
completed by N advances from another member), and the p50 of one confirmed advance; and
what the classic pub/sub the fan-out uses costs per message received against sharded pub/sub
(N messages published to another master than the subscriber's node and relayed by the
cluster bus, against ``SPUBLISH`` to the shard owner the subscriber is on). With
``--failovers N`` (default 20) the Cluster gets the failover figures Sentinel gets (see
:mod:`bench._redis_failover`): the time from the death of the master that serves the key
and holds the waiting member's subscription to the first event delivered again, the
confirmed acks lost when a master (that of a third of the keys) is killed, and the cost of
``min_replicas=1`` per confirmed advance.

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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from purgatory_aio import Purgatory
from purgatory_aio.fanout import (
    Fanout,
    FanoutUnavailable,
    MemoryFanout,
    PostgresFanout,
    RedisFanout,
    ValueReached,
)
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
from ._redis_failover import ClusterSide, SentinelSide, Side

# Stored values outlive a run: every run uses keys of its own, or its advances would be
# replays the store absorbs (by design) and nothing would be published.
RUN = uuid.uuid4().hex[:8]

Trigger = Callable[[str], Awaitable[None] | None]
#: An optional part of the run: its key in the results, its measurement, its rows.
Section = tuple[str, Callable[[], Coroutine[Any, Any, Any]], Callable[[Any], Any]]

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
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR / "fanout")
    parser.add_argument("--plain", action="store_true", help="plain progress lines, no rich")
    parser.add_argument(
        "--sentinel", action="store_true", help="measure Redis behind Sentinel too (failovers)"
    )
    parser.add_argument(
        "--failovers",
        type=int,
        default=20,
        help="failovers timed: Redis masters killed (with --sentinel) and PostgreSQL primaries "
        "killed with their standbys promoted (0: no PostgreSQL failover section)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="measure a Redis Cluster (3 masters, a replica each) against one Redis",
    )
    parser.add_argument("--acks", type=int, default=10000, help="confirmed advances per kill run")


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


@contextlib.contextmanager
def _topology(module: str, name: str) -> Iterator[Any]:
    """A topology of the tests (``Sentinels``, ``Cluster``), started, and stopped by PID."""
    topology = getattr(_test_support(module), name)()
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()


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


async def _transactional_advance(url: str, n: int) -> dict[str, float]:
    """The user's write (``UPDATE orders``) and the advance that tells the waiters, three ways,
    on the user's own asyncpg connection: in one transaction (``advance_in``), as two (the
    write committed, then ``advance_confirmed``), and ``advance_confirmed`` alone. Timed
    twice: the write path alone (what a handler waits for before answering), and from its
    start to the wait it completes resuming in another member."""
    import asyncpg

    a, b = Purgatory("bench-tx-a"), Purgatory("bench-tx-b")
    fa = _postgres_fanout(url, (a,), True)
    fb = cast(PostgresFanout, _postgres_fanout(url, (b,), False))
    orders = f"bench_orders_{RUN}"
    conn = await asyncpg.connect(url)
    await conn.execute(f"CREATE TABLE {orders} (id text PRIMARY KEY, version bigint NOT NULL)")
    await conn.execute(f"INSERT INTO {orders} VALUES ('o', 0)")
    update = f"UPDATE {orders} SET version = version + 1 WHERE id = 'o'"

    async def write() -> None:
        await conn.execute(update)

    async def in_transaction(key: str) -> None:
        async with conn.transaction():
            await conn.execute(update)
            await fb.advance_in(conn, key, 1)

    async def two_transactions(key: str) -> None:
        await conn.execute(update)
        await fb.advance_confirmed(key, 1)

    async def confirmed_alone(key: str) -> None:
        await fb.advance_confirmed(key, 1)

    ways: dict[str, Callable[[str], Awaitable[None]]] = {
        "advance_in": in_transaction,
        "two_transactions": two_transactions,
        "advance_confirmed": confirmed_alone,
    }
    figures: dict[str, float] = {}
    try:
        async with a, b, fa, fb:
            for way, trigger in ways.items():  # warm the statements and connections
                for i in range(20):
                    await trigger(f"warm:{RUN}:{way}:{i}")
            write_path = {"write_alone": [await _timed(write()) for _ in range(n)]}
            for way, trigger in ways.items():
                write_path[way] = sorted(
                    [await _timed(trigger(f"tx:{RUN}:{way}:{i}")) for i in range(n)]
                )
            to_waiter = {way: await _latency(a, fa, trigger, n) for way, trigger in ways.items()}
    finally:
        await conn.execute(f"DROP TABLE {orders}")
        await conn.close()
    for q in ("p50", "p99"):
        level = 0.5 if q == "p50" else 0.99
        path = {way: quantile(sorted(v), level) * 1e6 for way, v in write_path.items()}
        waiter = {way: quantile(v, level) * 1e6 for way, v in to_waiter.items()}
        figures.update({f"write_path_{way}_{q}_us": v for way, v in path.items()})
        figures.update({f"to_waiter_{way}_{q}_us": v for way, v in waiter.items()})
        # What the advance adds to the user's write, each way; and the ratios between them.
        added_in = path["advance_in"] - path["write_alone"]
        added_two = path["two_transactions"] - path["write_alone"]
        figures[f"added_{q}_advance_in_us"] = added_in
        figures[f"added_{q}_two_transactions_us"] = added_two
        figures[f"added_{q}_advance_in_vs_two_transactions"] = ratio(added_in, added_two) or 0.0
        figures[f"added_{q}_advance_in_vs_advance_confirmed"] = (
            ratio(added_in, path["advance_confirmed"]) or 0.0
        )
        figures[f"to_waiter_{q}_advance_in_vs_two_transactions"] = (
            ratio(waiter["advance_in"], waiter["two_transactions"]) or 0.0
        )
    return figures


async def _timed(step: Awaitable[None]) -> float:
    started = time.perf_counter()
    await step
    return time.perf_counter() - started


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
        extra=_transactional_advance,
    ),
}


# -- Redis behind Sentinel -------------------------------------------------------------------------


def _member(
    side: Side, purgatory: Purgatory, prefix: str, first: Any = None, **options: Any
) -> Fanout:
    url = side.url(first)
    return RedisFanout(url, purgatory, prefix=prefix, connect_timeout=1.0, **options)


async def _failover_recovery(side: Side, failovers: int) -> list[float]:
    """Seconds from the death of the master that serves the key and holds the waiting
    member's subscription to the first event delivered again, per failover."""
    prefix = f"fo{RUN}"
    times = []
    for i in range(failovers):
        await asyncio.to_thread(side.wait_healthy)
        key = f"fo:{i}"
        old = await asyncio.to_thread(side.master, f"{prefix}:value:{key}")
        a, b = Purgatory("bench-a"), Purgatory("bench-b")
        async with (
            a,
            b,
            _member(side, a, prefix, first=old) as fa,
            _member(side, b, prefix, subscribe=False) as fb,
        ):
            op = ValueReached(fa, key, 1, 120)
            await fa.watch_threshold(a, op, key, 1)
            killed = time.perf_counter()
            old.kill()
            fb.advance(key, 1)  # queued, sent again until a master takes it
            await op
            times.append(time.perf_counter() - killed)
    return sorted(times)


async def _acks_lost(side: Side, acks: int, replicas: int, lagging: bool) -> dict[str, float]:
    """Confirmed advances missing after a master was killed: halfway, or (``lagging``) with
    its replica frozen and its link cut from halfway and the master killed at three
    quarters. On a Cluster the master is the one of the first key (a third of the keys)."""
    import redis.asyncio as aioredis

    await asyncio.to_thread(side.wait_healthy)
    prefix = f"ack{RUN}r{replicas}{'lag' if lagging else ''}"
    b = Purgatory("bench-b")
    confirmed: list[str] = []
    refused = 0
    todo = iter(range(acks))
    first = f"{prefix}:value:k0"
    async with b, _member(side, b, prefix, subscribe=False, min_replicas=replicas) as fb:
        old = await asyncio.to_thread(side.master, first)
        replica = await asyncio.to_thread(side.replica, old)

        async def worker() -> None:
            nonlocal refused
            for i in todo:
                if lagging and i == acks // 2:
                    side.freeze(replica)
                    admin = aioredis.Redis(host="127.0.0.1", port=old.port)
                    await admin.client_kill_filter(_type="replica")
                    await admin.aclose()
                if i == (acks * 3 // 4 if lagging else acks // 2):
                    old.kill()
                    if lagging:
                        side.thaw(replica)
                try:
                    await fb.advance_confirmed(f"k{i}", 1, timeout=5)
                except FanoutUnavailable:
                    refused += 1
                else:
                    confirmed.append(f"k{i}")

        await asyncio.gather(*(worker() for _ in range(64)))
    await asyncio.to_thread(side.new_master, old, first)
    held = await side.held([f"{prefix}:value:{key}" for key in confirmed])
    lost = sum(1 for value in held if value is None)
    return {
        "confirmed": len(confirmed),
        "refused": refused,
        "lost": lost,
        "lost_per_10k": 10_000 * lost / max(1, len(confirmed)),
    }


async def _confirm_times(fanout: Fanout, samples: int) -> list[float]:
    """Seconds per confirmed advance, one at a time on fresh keys, sorted."""
    times = []
    for i in range(samples):
        started = time.perf_counter()
        await fanout.advance_confirmed(f"c{i}", 1)
        times.append(time.perf_counter() - started)
    return sorted(times)


async def _confirm_cost(side: Side, samples: int) -> dict[str, float]:
    """µs per confirmed advance, one at a time, without and with one replica's WAIT."""
    await asyncio.to_thread(side.wait_healthy)
    b = Purgatory("bench-b")
    costs: dict[str, float] = {}
    async with b:
        for replicas in (0, 1):
            options = {"subscribe": False, "min_replicas": replicas}
            async with _member(side, b, f"cost{RUN}r{replicas}", **options) as fb:
                for i in range(50):  # warm-up: connections, script load
                    await fb.advance_confirmed(f"warm{i}", 1)
                times = await _confirm_times(fb, samples)
            costs[f"min_replicas_{replicas}_p50_us"] = quantile(times, 0.5) * 1e6
            costs[f"min_replicas_{replicas}_p99_us"] = quantile(times, 0.99) * 1e6
    return costs


async def _failover_section(side: Side, failovers: int, acks: int, samples: int) -> dict[str, Any]:
    """A replicated topology's failover figures: recovery, acks lost, the option's cost."""
    recovery = await _failover_recovery(side, failovers)
    lost = {
        f"{'lagging_' if lagging else ''}min_replicas_{n}": await _acks_lost(side, acks, n, lagging)
        for lagging in (False, True)
        for n in (0, 1)
    }
    return {
        "failovers": len(recovery),
        "recovery_s": {"p50": quantile(recovery, 0.5), "p99": quantile(recovery, 0.99)},
        "acks_lost": lost,
        "confirm_cost_us": await _confirm_cost(side, samples),
    }


def _failover_rows(name: str, results: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    recovery, lost, cost = results["recovery_s"], results["acks_lost"], results["confirm_cost_us"]
    ratios = {
        f"{name}_confirm_p50_min_replicas_1_vs_0": ratio(
            cost["min_replicas_1_p50_us"], cost["min_replicas_0_p50_us"]
        )
    }
    headline = [
        (
            f"{name} master death to first event again p50/p99 s ({results['failovers']} kills)",
            f"{recovery['p50']:.2f}/{recovery['p99']:.2f}",
        ),
        *(
            (
                f"{name} confirmed acks lost per 10k under a kill{lag}, min_replicas 0 / 1",
                " / ".join(
                    f"{row['lost_per_10k']:.1f} ({row['lost']:.0f} of {row['confirmed']:.0f})"
                    for key, row in lost.items()
                    if key.startswith("lagging") == bool(lag)
                ),
            )
            for lag in ("", ", replica lagging")
        ),
        (
            f"{name} µs per confirmed advance p50, min_replicas 0 / 1",
            f"{cost['min_replicas_0_p50_us']:.0f} / {cost['min_replicas_1_p50_us']:.0f}",
        ),
    ]
    return ratios, headline


# -- Redis Cluster ---------------------------------------------------------------------------------


async def _cluster_section(
    topology: Any, single_url: str, events: int, samples: int
) -> dict[str, Any]:
    """Events/s per process and µs per confirmed advance through the Cluster and through one
    Redis, alternated twice (the better of the two runs each), in this process."""
    rates: dict[str, list[float]] = {"single": [], "cluster": []}
    confirm: dict[str, list[float]] = {"single": [], "cluster": []}
    for attempt in range(2):
        for name, url in (("single", single_url), ("cluster", topology.url())):
            prefix = f"cl{RUN}{name}{attempt}"
            a, b = Purgatory("bench-a"), Purgatory("bench-b")
            fa = RedisFanout(url, a, prefix=prefix)
            fb = RedisFanout(url, b, prefix=prefix, subscribe=False)
            async with a, b, fa, fb:

                async def publish_all(keys: list[str], fb: Fanout = fb) -> None:
                    for key in keys:
                        fb.advance(key, 1)

                tag = f"{name}{attempt}"
                rates[name].append(await _throughput(a, fa, publish_all, events, tag))
                times = await _confirm_times(fb, samples)
                confirm[name].append(quantile(times, 0.5) * 1e6)
    return {
        "events_per_s": {name: max(runs) for name, runs in rates.items()},
        "confirm_p50_us": {name: min(runs) for name, runs in confirm.items()},
        "relay": await _relay_cost(topology, events),
    }


async def _relay_cost(topology: Any, n: int) -> dict[str, float]:
    """µs per message received by one subscriber: classic PUBLISH sent to another master than
    the subscriber's node (relayed over the cluster bus), against sharded SPUBLISH to the
    shard owner the subscriber is on (``SSUBSCRIBE``, no relay)."""
    import redis.asyncio as aioredis

    channel = f"relay{RUN}"
    owner = await asyncio.to_thread(topology.master_of, channel)
    other = next(node for node in topology.nodes if node is not owner)
    costs: dict[str, float] = {}
    for shape, (sub_node, pub_node) in {
        "classic_relayed": (other, owner),
        "sharded": (owner, owner),
    }.items():
        sub = aioredis.Redis(host="127.0.0.1", port=sub_node.port)
        pub = aioredis.Redis(host="127.0.0.1", port=pub_node.port)
        pubsub = sub.pubsub()
        sharded = shape == "sharded"
        try:
            if sharded:
                await pubsub.ssubscribe(channel)
            else:
                await pubsub.subscribe(channel)
            started = time.perf_counter()
            pipe = pub.pipeline(transaction=False)
            for i in range(n):
                pipe.execute_command("SPUBLISH" if sharded else "PUBLISH", channel, str(i))
            await pipe.execute()
            received = 0
            while received < n:
                message = await pubsub.get_message(timeout=1)
                if message is not None and message["type"] in ("message", "smessage"):
                    received += 1
            costs[f"{shape}_us_per_message"] = (time.perf_counter() - started) / n * 1e6
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]
            await sub.aclose()
            await pub.aclose()
    return costs


def _cluster_rows(results: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    rate, confirm, relay = results["events_per_s"], results["confirm_p50_us"], results["relay"]
    ratios = {
        "cluster_events_per_s_vs_single": ratio(rate["cluster"], rate["single"]),
        "cluster_confirm_p50_vs_single": ratio(confirm["cluster"], confirm["single"]),
        "cluster_classic_relayed_vs_sharded_per_message": ratio(
            relay["classic_relayed_us_per_message"], relay["sharded_us_per_message"]
        ),
    }
    headline = [
        (
            "cluster events/s per process, one Redis / Cluster",
            f"{rate['single']:.0f} / {rate['cluster']:.0f}",
        ),
        (
            "cluster µs per confirmed advance p50, one Redis / Cluster",
            f"{confirm['single']:.0f} / {confirm['cluster']:.0f}",
        ),
        (
            "cluster µs per message received, classic relayed / sharded",
            f"{relay['classic_relayed_us_per_message']:.2f}"
            f" / {relay['sharded_us_per_message']:.2f}",
        ),
    ]
    return ratios, headline


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
        *((f"{name} {k}", f"{v:.2f}") for k, v in results["extra"].items()),
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
    failovers, acks = (min(args.failovers, 3), 1000) if args.quick else (args.failovers, args.acks)
    with contextlib.ExitStack() as servers:
        urls = {name: servers.enter_context(ENGINES[name].server()) for name in chosen}
        topology = (
            servers.enter_context(_topology("sentinel_support", "Sentinels"))
            if args.sentinel
            else None
        )
        cluster = (
            servers.enter_context(_topology("cluster_support", "Cluster")) if args.cluster else None
        )
        sentinel = None if topology is None else SentinelSide(topology)
        cluster_side = None if cluster is None else ClusterSide(cluster)
        single = (
            urls["redis"]
            if "redis" in urls
            else servers.enter_context(_redis_server())
            if args.cluster
            else None
        )
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
            sections: list[Section] = []
            if sentinel is not None:
                sections.append(
                    (
                        "sentinel",
                        lambda: _failover_section(sentinel, failovers, acks, samples),
                        lambda results: _failover_rows("sentinel", results),
                    )
                )
            if cluster is not None and single is not None:
                sections.append(
                    (
                        "cluster",
                        lambda: _cluster_section(cluster, single, events, samples),
                        _cluster_rows,
                    )
                )
                if cluster_side is not None and failovers > 0:
                    sections.append(
                        (
                            "cluster_failover",
                            lambda: _failover_section(cluster_side, failovers, acks, samples),
                            lambda results: _failover_rows("cluster", results),
                        )
                    )
            if pair is not None:
                sections.append(
                    (
                        "postgres_failover",
                        lambda: _pg_failover.measure(pair, failovers, args.quick),
                        _pg_failover.rows,
                    )
                )
            for key, measure, rows in sections:
                measured = run_on(loop_name, measure)
                results[key] = measured
                more_ratios, more_rows = rows(measured)
                ratios.update(more_ratios)
                headline.extend(more_rows)
            params = {"samples": samples, "events": events, "watchers": list(watchers)}
            if topology is not None or cluster is not None:
                params |= {"failovers": failovers, "acks": acks}
            if pair is not None:
                params |= {"failovers": failovers}
            record: Record = make_record(
                "fanout",
                loop_name,
                params,
                results,
                ratios=ratios,
                headline=headline,
            )
            publish(record, loop_name, progress, args.results_dir)
    return 0
