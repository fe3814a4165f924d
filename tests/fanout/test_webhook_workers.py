"""The webhook-acks example under real ``uvicorn --workers 2``, against a real redis-server and
a real PostgreSQL (the engine chosen by the URL alone)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from fanout_support import HANG_GUARD, RedisServer, free_port, wait_for_port
from pg_support import PostgresServer

from purgatory_aio.fanout import fanout_from_url

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.one_loop  # the servers are subprocesses; one client loop is enough


@dataclass
class Workers:
    base: str
    url: str  # the engine's


@contextlib.contextmanager
def engine_url(name: str, request: pytest.FixtureRequest) -> Iterator[str]:
    if name == "redis":
        with RedisServer() as redis_server:
            yield redis_server.url
    else:
        cluster: PostgresServer = request.getfixturevalue("postgres_cluster")
        cluster.ensure_running()
        yield cluster.url


@pytest.fixture(scope="module", params=["redis", "postgres"])
def workers(request: pytest.FixtureRequest) -> Iterator[Workers]:
    with engine_url(request.param, request) as url:
        port = free_port()
        env = {**os.environ, "PURGATORY_AIO_FANOUT_URL": url}
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
            yield Workers(f"http://127.0.0.1:{port}", url)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


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

    async def wait(i: int) -> tuple[int, bool]:
        async with session.get(f"{base}/jobs/burst-{i}/wait?timeout_ms=50000") as response:
            body = await response.json()
            return i, bool(body["acked"])

    polls = [asyncio.create_task(wait(i)) for i in range(n)]
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
    async with fanout_from_url(workers.url) as publisher:
        for i in range(n):
            publisher.advance(f"job:burst-{i}", 1)
        results = await asyncio.gather(*polls)
    assert sorted(i for i, _ in results) == list(range(n))  # each answered exactly once
    assert all(acked for _, acked in results)
