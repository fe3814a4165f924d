"""A real redis-server for the tests: 127.0.0.1, a free port, no persistence, stopped by PID."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

# The integrations' hang guard and polling helper, shared rather than copied.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integrations"))
from http_support import HANG_GUARD
from http_support import wait_until as until
from support import free_port

from purgatory_aio import DelayedOperation

__all__ = ["HANG_GUARD", "Flag", "RedisServer", "free_port", "until", "wait_for_port"]


class Flag(DelayedOperation[bool]):
    """Completes once its flag is set (the application's own truth)."""

    def __init__(self, flags: set[str], key: str, timeout: float) -> None:
        super().__init__(timeout)
        self.flags, self.key = flags, key

    def try_complete(self) -> bool:
        return self.key in self.flags and self.force_complete()

    def on_complete(self) -> bool:
        return self.key in self.flags


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
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
        wait_for_port(self.port)

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
