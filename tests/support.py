"""Operations and helpers shared by the core tests."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from purgatory_aio import DelayedOperation


class MockOperation(DelayedOperation[str]):
    """Completes when ``completable`` is set; records its callbacks (like Kafka's mock)."""

    def __init__(self, timeout: float, completable: bool = False) -> None:
        super().__init__(timeout)
        self.completable = completable
        self.completions = 0
        self.expirations = 0
        self.tries = 0
        self.completed_at: float | None = None
        self.clock: Any = None

    def try_complete(self) -> bool:
        self.tries += 1
        if self.completable:
            return self.force_complete()
        return False

    def on_complete(self) -> str:
        self.completions += 1
        if self.clock is not None:
            self.completed_at = self.clock.time()
        return "expired" if self.expired else "completed"

    def on_expiration(self) -> None:
        self.expirations += 1


class AsyncOperation(MockOperation):
    """Async callbacks: ``on_complete`` yields to the loop before answering."""

    async def on_complete(self) -> str:  # type: ignore[override]
        await asyncio.sleep(0)
        return MockOperation.on_complete(self)

    async def on_expiration(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        self.expirations += 1


class FailingOperation(MockOperation):
    def on_complete(self) -> str:
        self.completions += 1
        raise RuntimeError("on_complete failed")


def settled_once(op: MockOperation) -> bool:
    """Exactly one exit: on_complete ran once, or never for a cancelled op."""
    if op.cancelled:
        return op.completions == 0
    return op.completions == 1 and op.expirations == (1 if op.expired else 0)


class Recorder:
    """Collects calls in order, for asserting what ran when."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, *args: Any) -> None:
        self.calls.append(args[0] if len(args) == 1 else args)


async def awaiting(op: DelayedOperation[Any]) -> Any:
    """``await op`` as a coroutine of its own, to run as a separate task."""
    return await op


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def purgatory_broker(log_path: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``purgatory-broker ARGS`` (the installed example) until the block ends, its output in
    ``log_path``; started once it says it listens, stopped by its own PID if still running."""
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "minikafka.wire.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            deadline = time.monotonic() + 30  # a hang guard, not a timing claim
            while "listening on" not in log_path.read_text():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the broker did not start: {log_path.read_text()}")
                time.sleep(0.05)
            yield process
        finally:
            if process.poll() is None:
                process.kill()
            process.wait(30)
