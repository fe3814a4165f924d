"""The webhook-acks example under real ``uvicorn --workers 2``, against a real redis-server and
a real PostgreSQL (the engine chosen by the URL alone)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from cluster_support import Cluster
from fanout_support import HANG_GUARD, RedisServer, free_port, wait_for_port
from pg_support import PostgresServer, ReplicatedPair
from sentinel_support import Sentinels

from purgatory_aio.fanout import fanout_from_url

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.one_loop  # the servers are subprocesses; one client loop is enough


@dataclass
class Engine:
    url: str
    freeze: Callable[[], None]  # SIGSTOP the engine's server (connections stay open)
    thaw: Callable[[], None]


@dataclass
class Workers:
    base: str
    engine: Engine


@contextlib.contextmanager
def engine_server(name: str, request: pytest.FixtureRequest) -> Iterator[Engine]:
    if name == "redis":
        with RedisServer() as redis_server:
            assert redis_server.proc is not None
            pid = redis_server.proc.pid
            yield Engine(
                redis_server.url,
                lambda: os.kill(pid, signal.SIGSTOP),
                lambda: os.kill(pid, signal.SIGCONT),
            )
    else:
        cluster: PostgresServer = request.getfixturevalue("postgres_cluster")
        cluster.ensure_running()
        yield Engine(cluster.url, cluster.freeze, cluster.thaw)


@contextlib.contextmanager
def uvicorn_workers(engine: Engine) -> Iterator[Workers]:
    """The example under ``uvicorn --workers 2`` on ``engine``'s URL; stopped by its PID."""
    port = free_port()
    env = {**os.environ, "PURGATORY_AIO_FANOUT_URL": engine.url}
    args = [
        sys.executable, "-m", "uvicorn", "examples.webhook_acks:app",
        "--workers", "2", "--host", "127.0.0.1", "--port", str(port),
        "--backlog", "16384", "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the supervisor and its workers: one group to stop
    )
    try:
        wait_for_port(port, timeout=30)
        yield Workers(f"http://127.0.0.1:{port}", engine)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="module", params=["redis", "postgres"])
def workers(request: pytest.FixtureRequest) -> Iterator[Workers]:
    with engine_server(request.param, request) as engine, uvicorn_workers(engine) as running:
        yield running


@pytest.fixture(scope="module")
def standby_workers(replicated_pair: ReplicatedPair) -> Iterator[Workers]:
    """The example on a PostgreSQL primary with a standby, by its multi-host URL."""
    replicated_pair.ensure()
    engine = Engine(replicated_pair.url, replicated_pair.primary.freeze, lambda: None)
    with uvicorn_workers(engine) as running:
        yield running


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=HANG_GUARD * 3)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        yield client


async def pinned_clients(base: str) -> dict[int, aiohttp.ClientSession]:
    """One single-connection client per worker process (keep-alive keeps each on its worker)."""
    by_pid: dict[int, aiohttp.ClientSession] = {}
    spare: list[aiohttp.ClientSession] = []
    deadline = time.monotonic() + HANG_GUARD
    while time.monotonic() < deadline:
        client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        async with client.get(f"{base}/whoami") as response:
            pid = (await response.json())["worker"]
        if pid in by_pid:
            spare.append(client)
            await asyncio.sleep(0.05)  # the other worker may still be starting
        else:
            by_pid[pid] = client
        if len(by_pid) == 2:
            break
    for client in spare:
        await client.close()
    if len(by_pid) != 2:
        for client in by_pid.values():
            await client.close()
        raise AssertionError("could not reach both uvicorn workers")
    return by_pid


async def answered(
    session: aiohttp.ClientSession, job: str, i: int, timeout_ms: int
) -> tuple[int, bool]:
    """The answer of one long poll on ``job`` (its URL): ``(i, whether it was acked)``."""
    async with session.get(f"{job}/wait?timeout_ms={timeout_ms}") as response:
        return i, bool((await response.json())["acked"])


async def test_a_wait_in_one_worker_is_completed_by_an_ack_to_the_other(workers: Workers) -> None:
    clients = await pinned_clients(workers.base)
    (pid_wait, waiter), (pid_ack, acker) = clients.items()
    try:
        started = time.monotonic()
        wait = asyncio.create_task(waiter.get(f"{workers.base}/jobs/cross/wait?timeout_ms=20000"))
        await asyncio.sleep(0.2)  # let it park (an earlier ack would be caught up from the store)
        async with acker.post(f"{workers.base}/jobs/cross/ack") as response:
            assert response.status == 202
            assert (await response.json())["worker"] == pid_ack
        async with await wait as response:
            body = await response.json()
        assert body == {"job": "cross", "acked": True, "worker": pid_wait}
        assert time.monotonic() - started < 10  # answered by the ack, not at its 20 s deadline
    finally:
        for client in clients.values():
            await client.close()


async def test_a_counter_streamed_from_one_worker_follows_the_advances_posted_to_the_other(
    workers: Workers,
) -> None:
    base, name = workers.base, f"s{uuid.uuid4().hex[:8]}"
    clients = await pinned_clients(base)
    (_, streamer), (_, poster) = clients.items()

    async def follow(response: aiohttp.ClientResponse, until: float, into: list[float]) -> None:
        async for raw in response.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                into.append(float(line.removeprefix("data: ")))
                if into[-1] >= until:
                    return

    async def post(value: float) -> None:
        async with poster.post(f"{base}/counters/{name}/advance?to={value}") as response:
            assert response.status == 202

    try:
        for client in clients.values():
            async with client.get(f"{base}/ready") as ready:
                assert ready.status == 200, await ready.text()
                assert (await ready.json())["fanout"]["connected"] is True
        seen: list[float] = []
        async with streamer.get(f"{base}/counters/{name}/events?timeout_ms=20000") as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            following = asyncio.create_task(follow(response, 30, seen))
            for value in (1, 3, 2, 3, *range(4, 25), 20, 30, 29):  # out of order, duplicated
                await post(value)
            async with asyncio.timeout(HANG_GUARD):
                await following
        assert seen == sorted(set(seen)) and seen[-1] == 30.0, seen
        # A client that reconnects with the last id it saw resumes after it.
        resumed: list[float] = []
        headers = {"Last-Event-ID": "30.0"}
        url = f"{base}/counters/{name}/events?timeout_ms=20000"
        async with streamer.get(url, headers=headers) as response:
            following = asyncio.create_task(follow(response, 31, resumed))
            await post(31)
            async with asyncio.timeout(HANG_GUARD):
                await following
        assert resumed == [31.0]
        async with streamer.get(url, headers={"Last-Event-ID": "nan"}) as refused:
            assert refused.status == 400
    finally:
        for client in clients.values():
            await client.close()


async def test_counter_advances_out_of_order_and_duplicated_across_workers(
    workers: Workers, session: aiohttp.ClientSession
) -> None:
    base = workers.base

    async def wait(mark: int) -> dict[str, object]:
        url = f"{base}/counters/c1/wait?at_least={mark}&timeout_ms=20000"
        async with session.get(url) as response:
            return dict(await response.json())

    waits = [asyncio.create_task(wait(mark)) for mark in range(1, 11)]
    await asyncio.sleep(0.2)
    for value in (4, 2, 4, 10, 1, 10, 7):
        async with session.post(f"{base}/counters/c1/advance?to={value}") as response:
            assert response.status == 202
    results = await asyncio.gather(*waits)
    assert all(result["reached"] for result in results)
    assert all(float(result["value"]) >= mark for mark, result in enumerate(results, 1))  # type: ignore[arg-type]


@pytest.mark.slow
async def test_a_burst_of_10k_events_answers_10k_parked_polls_across_two_workers_once_each(
    workers: Workers, session: aiohttp.ClientSession
) -> None:
    n = 10_000
    base = workers.base

    polls = [
        asyncio.create_task(answered(session, f"{base}/jobs/burst-{i}", i, 50000)) for i in range(n)
    ]
    pending: dict[int, int] = {}

    async def parked() -> int:
        # Fresh connections land on either worker: keep the latest count of each.
        async with aiohttp.ClientSession() as probe, probe.get(f"{base}/fanout/stats") as r:
            stats = await r.json()
        pending[stats["worker"]] = stats["pending"]
        return sum(pending.values())

    deadline = time.monotonic() + HANG_GUARD * 2
    while len(pending) < 2 or await parked() < n:
        assert time.monotonic() < deadline, f"only {sum(pending.values())} polls parked"
        await parked()
        await asyncio.sleep(0.1)
    async with fanout_from_url(workers.engine.url) as publisher:
        for i in range(n):
            publisher.advance(f"job:burst-{i}", 1)
        results = await asyncio.gather(*polls)
    assert sorted(i for i, _ in results) == list(range(n))  # each answered exactly once
    assert all(acked for _, acked in results)


async def test_2000_polls_parked_across_two_workers_are_each_answered_once_by_acks(
    workers: Workers, session: aiohttp.ClientSession
) -> None:
    base = workers.base
    polls = await park(session, base, 2000, "two")
    statuses = []
    for start in range(0, 2000, 200):
        statuses += await asyncio.gather(
            *(ack(session, base, f"two-{i}") for i in range(start, start + 200))
        )
    assert statuses == [202] * 2000  # each stored before it was answered
    await answered_once(polls, 2000)


async def test_2000_polls_across_two_workers_on_sentinel_are_answered_once_through_a_failover(
    sentinels: Sentinels, session: aiohttp.ClientSession
) -> None:
    n = 2000
    with uvicorn_workers(Engine(sentinels.url, lambda: None, lambda: None)) as running:
        base = running.base
        polls = await park(session, base, n, "fo")
        # The master killed: the acks it took and replicated survive, the others get a 503.
        # (SENTINEL FAILOVER instead leaves the old master writable until the sentinels
        # convert it, up to 10 s: see the operators' guide.)
        old = await asyncio.to_thread(sentinels.master)
        old.kill()
        failover = asyncio.create_task(asyncio.to_thread(sentinels.wait_new_master, old))
        statuses: list[int] = []
        for start in range(0, n, 200):  # acks before, during and after the failover
            batch = range(start, start + 200)
            statuses += await asyncio.gather(*(ack(session, base, f"fo-{i}") for i in batch))
            await asyncio.sleep(0.1)
        await failover
        await acked_again(session, base, "fo", statuses)
        await answered_once(polls, n)
        deadline = time.monotonic() + HANG_GUARD
        while True:  # the worker this lands on has moved its subscription, and counted it
            async with session.get(f"{base}/fanout/stats") as response:
                if (await response.json())["failovers"] == 1:
                    break
            assert time.monotonic() < deadline, "no failover counted"
            await asyncio.sleep(0.1)


async def test_2000_polls_across_two_workers_on_a_cluster_are_answered_once_through_a_failover(
    cluster: Cluster, session: aiohttp.ClientSession
) -> None:
    """Both workers subscribe on the master that is killed; its replica takes its slots."""
    n = 2000
    victim = (await asyncio.to_thread(cluster.masters))[0]
    with uvicorn_workers(Engine(cluster.url(victim), lambda: None, lambda: None)) as running:
        base = running.base
        polls = await park(session, base, n, "cl")
        victim.kill()
        statuses: list[int] = []
        for start in range(0, n, 200):  # acks before, during and after the failover
            batch = range(start, start + 200)
            statuses += await asyncio.gather(*(ack(session, base, f"cl-{i}") for i in batch))
        await asyncio.to_thread(cluster.wait_serving)
        await acked_again(session, base, "cl", statuses)
        await answered_once(polls, n)
        await failed_over_in_both(base)


async def acked_again(
    session: aiohttp.ClientSession, base: str, tag: str, statuses: list[int]
) -> None:
    """Each ack of job ``<tag>-<i>`` refused during the switch (``statuses[i]`` 503: not stored
    in time) sent again until stored, as the webhook's sender would after Retry-After."""

    async def again(i: int, status: int) -> None:
        while status != 202:
            assert status == 503, status
            await asyncio.sleep(0.1)
            status = await ack(session, base, f"{tag}-{i}")

    await asyncio.gather(*(again(i, status) for i, status in enumerate(statuses)))


async def failed_over_in_both(base: str) -> None:
    """Until each of the two workers has counted its subscription's move, once."""
    switched: set[int] = set()
    deadline = time.monotonic() + HANG_GUARD
    while len(switched) < 2:
        assert time.monotonic() < deadline, f"failovers counted by workers {switched}"
        async with aiohttp.ClientSession() as probe, probe.get(f"{base}/fanout/stats") as r:
            stats = await r.json()
        assert stats["failovers"] <= 1, stats
        if stats["failovers"] == 1:
            switched.add(stats["worker"])
        await asyncio.sleep(0.05)


async def park(
    session: aiohttp.ClientSession, base: str, n: int, tag: str
) -> list[asyncio.Task[tuple[int, bool]]]:
    """``n`` polls for jobs ``<tag>-<i>``, returned once all are pending across both workers."""

    polls = [
        asyncio.create_task(answered(session, f"{base}/jobs/{tag}-{i}", i, 40000)) for i in range(n)
    ]
    await parked_in_both(base, n)
    return polls


async def ack(session: aiohttp.ClientSession, base: str, job: str) -> int:
    """The status of one ack; sent again on a kept-alive connection the server had just
    closed as idle (a race of HTTP keep-alive, which any webhook sender retries)."""
    for _ in range(3):
        try:
            async with session.post(f"{base}/jobs/{job}/ack") as response:
                return response.status
        except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
            await asyncio.sleep(0.05)
    raise AssertionError(f"the ack of {job} was cut three times")


async def answered_once(polls: list[asyncio.Task[tuple[int, bool]]], n: int) -> None:
    results = await asyncio.gather(*polls)
    assert sorted(i for i, _ in results) == list(range(n))  # each answered exactly once
    assert all(acked for _, acked in results)


async def test_polls_parked_across_two_workers_are_answered_once_through_a_failover(
    standby_workers: Workers, replicated_pair: ReplicatedPair, session: aiohttp.ClientSession
) -> None:
    """The primary killed and the standby promoted under 2000 parked polls: every ack a client
    retries after a 503 is taken by the new primary, and every poll answered once."""
    n = 2000
    base = standby_workers.base

    async def ack(i: int) -> int:
        deadline = time.monotonic() + HANG_GUARD
        while True:  # as a client honouring Retry-After would
            async with session.post(f"{base}/jobs/failover-{i}/ack") as response:
                if response.status != 503 or time.monotonic() > deadline:
                    return response.status
            await asyncio.sleep(0.2)

    # Synchronous: a 202 answered before the kill is on the standby (see the operators' page).
    await asyncio.to_thread(replicated_pair.ensure, True)
    polls = [
        asyncio.create_task(answered(session, f"{base}/jobs/failover-{i}", i, 60000))
        for i in range(n)
    ]
    await parked_in_both(base, n)
    statuses = list(await asyncio.gather(*(ack(i) for i in range(n // 4))))
    await asyncio.to_thread(replicated_pair.fail_over)
    for start in range(n // 4, n, 250):
        statuses += await asyncio.gather(*(ack(i) for i in range(start, min(n, start + 250))))
    assert statuses == [202] * n
    results = await asyncio.gather(*polls)
    assert sorted(i for i, _ in results) == list(range(n))  # each answered exactly once
    assert all(acked for _, acked in results)
    switched: dict[int, int] = {}
    deadline = time.monotonic() + HANG_GUARD
    while len(switched) < 2:  # both workers followed the primary to the promoted standby
        assert time.monotonic() < deadline, f"failovers seen: {switched}"
        async with aiohttp.ClientSession() as probe, probe.get(f"{base}/fanout/stats") as r:
            stats = await r.json()
        if stats["failovers"] == 1:
            switched[stats["worker"]] = stats["completed"]
        await asyncio.sleep(0.05)


async def parked_in_both(base: str, n: int) -> None:
    """Until ``n`` polls are pending across the two workers."""
    pending: dict[int, int] = {}
    deadline = time.monotonic() + HANG_GUARD * 2
    while len(pending) < 2 or sum(pending.values()) < n:
        assert time.monotonic() < deadline, f"only {sum(pending.values())} polls parked"
        # Fresh connections land on either worker: keep the latest count of each.
        async with aiohttp.ClientSession() as probe, probe.get(f"{base}/fanout/stats") as r:
            stats = await r.json()
        pending[stats["worker"]] = stats["pending"]
        await asyncio.sleep(0.05)


async def test_an_ack_that_cannot_be_stored_is_answered_503_with_retry_after(
    workers: Workers, session: aiohttp.ClientSession
) -> None:
    workers.engine.freeze()
    try:
        async with session.post(f"{workers.base}/jobs/frozen/ack") as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "1"
            assert "not stored" in (await response.json())["detail"]
    finally:
        workers.engine.thaw()
    deadline = time.monotonic() + HANG_GUARD
    while True:  # after the thaw the same ack is taken
        async with session.post(f"{workers.base}/jobs/frozen/ack") as response:
            if response.status == 202:
                break
        assert time.monotonic() < deadline, "acks still refused after the engine came back"
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_worker_started_against_another_service_says_so_in_one_line(workers: int) -> None:
    """An HTTP port given as the Redis URL: one FanoutUnavailable line per worker, no
    traceback (neither redis-py's nor Starlette's lifespan one)."""
    with socket.socket() as http:
        http.bind(("127.0.0.1", 0))
        http.listen(16)
        port = http.getsockname()[1]
        stop = threading.Event()

        def answer_http() -> None:
            http.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn, _ = http.accept()
                except OSError:
                    continue
                with conn, contextlib.suppress(OSError):
                    conn.recv(1000)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        thread = threading.Thread(target=answer_http, daemon=True)
        thread.start()
        try:
            url = f"redis://:hunter2@127.0.0.1:{port}/0"
            args = [
                sys.executable, "-m", "uvicorn", "examples.webhook_acks:app",
                "--port", str(free_port()), "--host", "127.0.0.1", "--workers", str(workers),
            ]  # fmt: skip
            result = subprocess.run(
                args,
                cwd=ROOT,
                env={**os.environ, "PURGATORY_AIO_REDIS_URL": url},
                capture_output=True,
                text=True,
                timeout=HANG_GUARD * 2,
            )
        finally:
            stop.set()
            thread.join(timeout=5)
    output = result.stdout + result.stderr
    if workers == 1:
        assert result.returncode != 0
    else:  # uvicorn's supervisor stops every worker and exits (0, its own choice)
        assert "failed to start, stopping the parent process" in output, output
    lines = [line for line in output.splitlines() if "FanoutUnavailable: " in line]
    assert len(lines) == workers, output
    for line in lines:
        assert f"127.0.0.1:{port}" in line and "another service" in line
    assert "hunter2" not in output
    assert "Traceback" not in output and "InvalidResponse" not in output, output


@pytest.mark.parametrize(
    "url",
    [
        # A few shapes, ten seconds each: test_fanout_hostile holds the URL parser to every
        # shape, and the example turns whatever it raises into these lines.
        "postgresql:/user:hunter2@127.0.0.1:5432/app",  # one slash
        "postgresql://user:hunter2@127.0.0.1:notaport/app",
        "postgresql://user:hunter2@127.0.0.1/app?schema=app%22%3B%20DROP%20TABLE%20orders",
        "postgresql://user:hunter2@127.0.0.1/app?create=maybe",
    ],
)
def test_a_malformed_url_ends_each_worker_in_one_line_not_a_restart_loop(url: str) -> None:
    """Raised at import, the URL's error made uvicorn start each worker again and again;
    now each of the two workers says so in one line at start-up and the server exits."""
    args = [
        sys.executable, "-m", "uvicorn", "examples.webhook_acks:app",
        "--port", str(free_port()), "--host", "127.0.0.1", "--workers", "2",
    ]  # fmt: skip
    env = {**os.environ, "PURGATORY_AIO_FANOUT_URL": url}
    result = subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD * 2
    )
    output = result.stdout + result.stderr
    assert "failed to start, stopping the parent process" in output, output
    lines = [line for line in output.splitlines() if "FanoutUnavailable: " in line]
    assert len(lines) == 2, output
    assert all("the fan-out's URL is not usable" in line for line in lines), output
    assert "hunter2" not in output
    assert "Traceback" not in output, output
