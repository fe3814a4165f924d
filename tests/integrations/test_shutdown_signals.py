"""Stopping a real server process answers its pending long polls at once.

Each test starts the HTTP example broker as its own process, the way a user does
(plain ``uvicorn``, ``uvicorn --workers 2``, ``python -m examples.aiohttp_broker``),
parks a fetch with ``max_wait_ms=20000`` and sends the server the signal Ctrl-C
or a process manager would. The poll must be answered long before its own
deadline, and the server must exit.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support import free_port

ROOT = Path(__file__).resolve().parents[2]
#: A poll's own deadline; being answered well before it is the behaviour under test.
POLL_WAIT_MS = 20_000
#: Hang guard for start-up and exit, never a timing claim.
HANG_GUARD = 30.0

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@contextmanager
def _server(args: list[str], port: int, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = (tmp_path / "server.log").open("wb")
    # The checkout last on the path, so `-m examples...` imports however the package was
    # installed, and a compiled core put first (PYTHONPATH) stays first.
    path = [p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(path)}
    # Its own session: the server and any worker processes it forks form one group, which
    # the finally below can stop whole even when a failed test left the workers running.
    process = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + HANG_GUARD
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"the server did not start: {(tmp_path / 'server.log').read_text()}"
                    ) from None
                time.sleep(0.05)
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the group this test started, by its id
        process.wait(HANG_GUARD)
        log.close()


class _Poll(threading.Thread):
    """Produce one record, then long-poll past it, on one keep-alive connection (so with
    several workers both requests reach the same worker and its own broker)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.status: int | None = None
        self.body: dict[str, object] = {}
        self.answered_at: float | None = None
        self.error: BaseException | None = None
        # Set once the fetch is on the wire: a signal before that would find the keep-alive
        # connection idle, and a server shutting down may close an idle connection.
        self.fetch_sent = threading.Event()

    def run(self) -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=HANG_GUARD + 30)
            path = "/topics/t/partitions/0/records"
            body = json.dumps({"records": [{"key": None, "value": "hi"}]})
            conn.request(
                "POST", f"{path}?acks=1", body, headers={"content-type": "application/json"}
            )
            produced = conn.getresponse()
            assert produced.status == 200, produced.read()
            produced.read()
            conn.request("GET", f"{path}?offset=1&max_wait_ms={POLL_WAIT_MS}")
            self.fetch_sent.set()
            response = conn.getresponse()
            self.status = response.status
            self.body = json.loads(response.read())
            self.answered_at = time.monotonic()
            conn.close()
        except BaseException as exc:
            self.error = exc


def _assert_answered_promptly(process: subprocess.Popen[bytes], port: int, sig: int) -> None:
    poll = _Poll(port)
    poll.start()
    # The produce returned and the fetch was sent (however slow the machine), then long
    # enough for the server to read it and park it in the purgatory; a fetch that had not
    # parked yet would be answered 503, which fails below.
    assert poll.fetch_sent.wait(HANG_GUARD) or poll.error is not None, "the fetch was never sent"
    time.sleep(0.5)
    assert poll.answered_at is None and poll.error is None, "the poll did not wait"
    signalled = time.monotonic()
    process.send_signal(sig)
    poll.join(HANG_GUARD)
    assert poll.error is None, poll.error
    assert poll.answered_at is not None, "the poll was not answered"
    waited = poll.answered_at - signalled
    assert waited < 5.0, f"answered {waited:.1f} s after the signal, not at shutdown"
    assert poll.status == 200, poll.body
    assert poll.body == {"records": [], "high_watermark": 1}
    process.wait(HANG_GUARD)


@pytest.mark.parametrize("workers", [1, 2])
def test_plain_uvicorn_answers_pending_poll_on_sigint(tmp_path: Path, workers: int) -> None:
    port = free_port()
    args = ["-m", "uvicorn", "examples.fastapi_broker:app", "--port", str(port)]
    if workers > 1:
        args += ["--workers", str(workers)]
    with _server(args, port, tmp_path) as process:
        _assert_answered_promptly(process, port, signal.SIGINT)


def test_plain_uvicorn_answers_pending_poll_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    args = ["-m", "uvicorn", "examples.fastapi_broker:app", "--port", str(port)]
    with _server(args, port, tmp_path) as process:
        _assert_answered_promptly(process, port, signal.SIGTERM)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_gunicorn_uvicorn_workers_answer_pending_poll(tmp_path: Path, sig: signal.Signals) -> None:
    """gunicorn's arbiter passes SIGTERM (graceful) and SIGINT (quick) on to its workers."""
    pytest.importorskip("gunicorn")
    port = free_port()
    args = [
        "-m",
        "gunicorn",
        "examples.fastapi_broker:app",
        "--worker-class",
        "uvicorn.workers.UvicornWorker",
        "--workers",
        "1",
        "--bind",
        f"127.0.0.1:{port}",
        "--graceful-timeout",
        "25",
    ]
    with _server(args, port, tmp_path) as process:
        _assert_answered_promptly(process, port, sig)


def test_aiohttp_run_app_answers_pending_poll_on_sigint(tmp_path: Path) -> None:
    port = free_port()
    with _server(["-m", "examples.aiohttp_broker", "--port", str(port)], port, tmp_path) as process:
        _assert_answered_promptly(process, port, signal.SIGINT)
