"""A real redis-server for the tests: 127.0.0.1, a free port, no persistence, stopped by PID."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

# The integrations' hang guard and polling helper, shared rather than copied.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integrations"))
from http_support import HANG_GUARD
from http_support import wait_until as until
from support import free_port

from purgatory_aio import DelayedOperation, Purgatory
from purgatory_aio.fanout import Fanout, FanoutUnavailable

__all__ = [
    "HANG_GUARD",
    "Flag",
    "RedisServer",
    "Storm",
    "assert_refused",
    "assert_unavailable",
    "free_port",
    "until",
    "wait_for_port",
]


class Flag(DelayedOperation[bool]):
    """Completes once its flag is set (the application's own truth)."""

    def __init__(self, flags: set[str], key: str, timeout: float) -> None:
        super().__init__(timeout)
        self.flags, self.key = flags, key

    def try_complete(self) -> bool:
        return self.key in self.flags and self.force_complete()

    def on_complete(self) -> bool:
        return self.key in self.flags


def assert_refused(url: str, says: str) -> None:
    """``url`` is refused with a ValueError before anything connects: by RedisFanout saying
    ``says``, by fanout_from_url too; no password in it shows."""
    from purgatory_aio.fanout import RedisFanout, fanout_from_url

    with pytest.raises(ValueError) as caught:
        RedisFanout(url)
    assert says in str(caught.value) and "secret" not in str(caught.value)
    with pytest.raises(ValueError) as caught:
        fanout_from_url(url)
    assert "secret" not in str(caught.value)


async def assert_unavailable(url: str, says: str, connect_timeout: float = 0.5) -> None:
    """Starting a RedisFanout on ``url`` fails with one FanoutUnavailable line saying ``says``."""
    from purgatory_aio.fanout import RedisFanout

    fanout = RedisFanout(url, connect_timeout=connect_timeout)
    with pytest.raises(FanoutUnavailable) as caught:
        await fanout.start()
    message = str(caught.value)
    assert says in message and "\n" not in message
    await fanout.stop()


class Storm:
    """Confirmed advances 1 to ``rounds`` on each of ``keys``, from a member with the replica
    option, while a master dies; a key's storm stops at its first refused confirmation (the
    promoted master has no replica yet)."""

    def __init__(self, publisher: Fanout, keys: Sequence[str], rounds: int) -> None:
        self.publisher, self.keys, self.rounds = publisher, list(keys), rounds
        self.confirmed: dict[str, int] = {}
        self.tasks = [asyncio.create_task(self._storm(key)) for key in self.keys]

    async def _storm(self, key: str) -> None:
        for value in range(1, self.rounds + 1):
            try:
                await self.publisher.advance_confirmed(key, value, timeout=2.0)
            except (FanoutUnavailable, TimeoutError):
                return
            self.confirmed[key] = value

    async def check(
        self,
        held: Callable[[str], Awaitable[float | None]],
        waits: Sequence[asyncio.Task[float | None]],
        waiter: Purgatory,
    ) -> None:
        """Once the storm is over: nothing a replica acknowledged was lost with its master
        (``held``: what the new master holds), and once the last round is published again
        where it was not confirmed, every wait completes, once."""
        async with asyncio.timeout(60):  # each call is bounded by its own timeout
            await asyncio.gather(*self.tasks)
        for key, value in self.confirmed.items():
            stored = await held(key)
            assert stored is not None and stored >= value, (key, value, stored)
        for key in self.keys:
            if self.confirmed.get(key) != self.rounds:
                self.publisher.advance(key, self.rounds)
        async with asyncio.timeout(30):
            assert await asyncio.gather(*waits) == [float(self.rounds)] * len(self.keys)
        assert waiter.stats().completed == len(self.keys) and waiter.num_delayed == 0


def wait_for_port(
    port: int, timeout: float = 10.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Until something listens on ``port``; ``proc``: the server meant to, which may have
    exited (its port taken by another process since it was picked)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server for 127.0.0.1:{port} exited ({proc.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class RedisServer:
    """One redis-server process; ``kill()`` and ``start()`` again keep the port (an outage)."""

    def __init__(self, password: str | None = None, args: Sequence[str] = ()) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(
                "redis-server is not installed: run `make install` (it installs Debian's "
                "redis-server) or `apt-get install -y redis-server`"
            )
        self.binary = binary
        self.port = free_port()
        self.password = password
        self.args = list(args)  # more options (replication, TLS): changed between starts
        self.dir = tempfile.mkdtemp(prefix="purgatory-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self.dir,
            "--loglevel", "warning",
        ]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        args += self.args
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, proc=self.proc)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
