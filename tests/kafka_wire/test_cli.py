"""``purgatory-broker`` as a user runs it: flags, and a graceful stop on SIGINT/SIGTERM."""

from __future__ import annotations

import datetime
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
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode as E
from minikafka.wire.codec import build, nested
from support import free_port, purgatory_broker

from .raw import RawConnection

METADATA, FETCH = 3, 1
#: A long poll's own deadline; being answered well before it is what is tested.
POLL_WAIT = datetime.timedelta(seconds=30)
#: Hang guard for start-up and exit, never a timing claim.
HANG_GUARD = 30.0


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minikafka.wire.cli", *args],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )


def test_help_names_the_contract_flags() -> None:
    result = _cli("--help")
    assert result.returncode == 0
    for flag in (
        "--host",
        "--port",
        "--brokers",
        "--partitions",
        "--replication-factor",
        "--min-insync-replicas",
    ):
        assert flag in result.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--brokers", "0"], "brokers"),
        (["--brokers", "2", "--min-insync-replicas", "3"], "min-insync-replicas"),
        (["--partitions", "0"], "partitions"),
        (["--brokers", "2", "--replication-factor", "3"], "replication-factor"),
        (["--port", "70000"], "port"),
        (["--port", "x"], "port"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_bad_flag_values_fail_with_one_line_naming_the_flag(args: list[str], named: str) -> None:
    result = _cli(*args)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"--{named}" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


@contextmanager
def _broker(tmp_path: Path, loop: str) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    port, log_path = free_port(), tmp_path / "broker.log"
    with purgatory_broker(log_path, "--port", str(port), "--loop", loop) as process:
        yield process, port, log_path


def _topic_with_leader(conn: RawConnection, topic: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while True:
        meta = conn.call(
            METADATA, 5, topics=(_metadata_topic(topic),), allow_auto_topic_creation=True
        )
        (only,) = meta.topics
        if only.error_code == E.none and only.partitions[0].leader_id == 0:
            return
        assert time.monotonic() < deadline, "the topic never got a leader"
        time.sleep(0.05)


def _metadata_topic(name: str) -> object:
    return build(nested(load_request_schema(METADATA, 5), "topics"), name=name)


def _long_poll(conn: RawConnection, topic: str) -> None:
    schema = load_request_schema(FETCH, 11)
    topic_t = nested(schema, "topics")
    partition_t = nested(topic_t, "partitions")
    part = build(
        partition_t,
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=0,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    conn.send_frame(
        conn.encode(
            FETCH,
            11,
            replica_id=-1,
            max_wait=POLL_WAIT,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            topics=(build(topic_t, topic=topic, partitions=(part,)),),
            forgotten_topics_data=(),
            rack_id="",
        )
    )


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_signal_answers_the_pending_long_poll_then_exits(
    tmp_path: Path, sig: signal.Signals, loop: str
) -> None:
    with _broker(tmp_path, loop) as (process, port, log_path), RawConnection(port) as conn:
        _topic_with_leader(conn, "quiet")
        _long_poll(conn, "quiet")
        answered: list[float] = []
        reader = threading.Thread(
            target=lambda: (conn.read_frame(), answered.append(time.monotonic())), daemon=True
        )
        reader.start()
        # Give the fetch time to park in the purgatory (an empty partition: it waits).
        reader.join(1.0)
        assert not answered, "the long poll was answered without data before the signal"
        signalled = time.monotonic()
        process.send_signal(sig)
        reader.join(HANG_GUARD)
        assert answered, "the long poll was never answered"
        waited = answered[0] - signalled
        assert waited < 5.0, f"answered {waited:.1f} s after the signal, not at shutdown"
        assert process.wait(HANG_GUARD) == 0
        output = log_path.read_text()
        assert "purgatory-broker stopped" in output
        assert "Traceback" not in output and "CancelledError" not in output, output


def test_a_taken_port_fails_with_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _cli("--port", str(port))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "error:" in line]
    assert f"cannot listen on 127.0.0.1 from port {port}" in line
