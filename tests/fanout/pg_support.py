"""A real PostgreSQL server for the tests, from Debian's package.

``initdb`` refuses to run as root, and so does ``postgres``: when the tests run as
root (CI does) both run as an unprivileged system user, the ``postgres`` user the
Debian package creates, else ``nobody``, else one made here with ``useradd``. The
cluster lives in a temporary directory that user owns; the server listens on
127.0.0.1 on a free port, its unix socket in that directory, and runs in a process
session of its own; it is stopped, frozen or killed by its own PID (and the PIDs of the
processes it started).
Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from fanout_support import free_port, until

from purgatory_aio import Purgatory
from purgatory_aio.fanout import PostgresFanout

__all__ = [
    "Certificates",
    "PostgresServer",
    "ReplicatedPair",
    "TlsPostgresServer",
    "admin",
    "fresh",
    "pair",
    "parked",
]

SUPERUSER = "postgres"
# Created with useradd when neither of the usual unprivileged users exists.
FALLBACK_USER = "purgatory-aio-pg"
# A primary says "...accept connections", a hot standby "...accept read-only connections".
READY = re.compile(r"database system is ready to accept (read-only )?connections")


def _binaries() -> Path:
    """The directory holding initdb and postgres: on PATH, else Debian's versioned one."""
    found = shutil.which("initdb")
    if found is not None:
        return Path(found).resolve().parent
    candidates = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if not candidates:
        pytest.fail(
            "PostgreSQL is not installed: run `make install` (it installs Debian's postgresql) "
            "or `apt-get install -y postgresql`"
        )

    def version(path: str) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", Path(path).parent.parent.name))

    return Path(max(candidates, key=version)).parent


def _server_user() -> tuple[int, int] | None:
    """``(uid, gid)`` to run the server as; None when not root (run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in (SUPERUSER, "nobody", FALLBACK_USER):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", FALLBACK_USER],
        check=True,
        timeout=60,
    )
    entry = pwd.getpwnam(FALLBACK_USER)
    return entry.pw_uid, entry.pw_gid


def _reachable_temp_root() -> str:
    """A temporary directory every user can traverse to (the server runs as another user)."""
    base = Path(tempfile.gettempdir()).resolve()
    for part in (base, *base.parents):
        if not part.stat().st_mode & stat.S_IXOTH:
            return "/tmp"
    return str(base)


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (the server's backends and workers: each of them is the
    leader of a session of its own, so a signal to the postmaster's group misses them)."""
    found = []
    for entry in glob.glob("/proc/[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(entry).read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                found.append(int(Path(entry).parent.name))
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


class PostgresServer:
    """One PostgreSQL cluster; ``kill()``/``start()`` keep the port and the data (a crash and a
    restart), ``freeze()``/``thaw()`` stop and continue every process of the server."""

    def __init__(self, password: str | None = None) -> None:
        self.bin = _binaries()
        self.owner = _server_user()
        self.password = password or secrets.token_hex(8)
        self.settings: dict[str, str] = {}  # more -c options for start()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="purgatory-pg-", dir=_reachable_temp_root()))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen = False

    @property
    def url(self) -> str:
        return self.url_as(self.password)

    def url_as(self, password: str) -> str:
        return f"postgresql://{SUPERUSER}:{password}@127.0.0.1:{self.port}/postgres"

    def _as_owner(self) -> dict[str, object]:
        if self.owner is None:
            return {}
        return {"user": self.owner[0], "group": self.owner[1], "extra_groups": []}

    def initdb(self) -> None:
        pwfile = self.dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.owner is not None:
            for path in (self.dir, pwfile):
                os.chown(path, *self.owner)
        self.dir.chmod(0o700)
        args = [
            str(self.bin / "initdb"),
            "--pgdata", str(self.data),
            "--username", SUPERUSER,
            "--pwfile", str(pwfile),
            "--auth-local", "trust",
            "--auth-host", "scram-sha-256",
            "--encoding", "UTF8",
            "--locale", "C",
            "--no-sync",
        ]  # fmt: skip
        done = subprocess.run(
            args,
            capture_output=True,
            timeout=120,
            env={**os.environ, "LC_ALL": "C", "HOME": str(self.dir)},
            cwd=self.dir,
            **self._as_owner(),  # type: ignore[call-overload]
        )
        pwfile.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.decode(errors='replace')[-2000:]}")

    def run(self, tool: str, *args: str, timeout: float = 60.0) -> str:
        """Run one of PostgreSQL's programs as the server's user; its output (raises on failure)."""
        done = subprocess.run(
            [str(self.bin / tool), *args],
            capture_output=True,
            timeout=timeout,
            env={**os.environ, "LC_ALL": "C", "HOME": str(self.dir), "PGPASSWORD": self.password},
            cwd=self.dir,
            **self._as_owner(),  # type: ignore[call-overload]
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr.decode(errors='replace')[-2000:]}")
        return str(done.stdout.decode())

    def sql(self, query: str) -> str:
        """One statement through psql on the server's unix socket (trusted); its output."""
        return self.run(
            "psql", "-h", str(self.dir), "-p", str(self.port), "-U", SUPERUSER, "-d", "postgres",
            "-XAtq", "-c", query, timeout=30,
        ).strip()  # fmt: skip

    def clone(self, primary: PostgresServer) -> None:
        """Make this (stopped) server a streaming standby of ``primary``: pg_basebackup -R."""
        shutil.rmtree(self.data, ignore_errors=True)
        if self.owner is not None:
            os.chown(self.dir, *self.owner)
        self.dir.chmod(0o700)
        self.password = primary.password
        self.run(
            "pg_basebackup",
            "--host", "127.0.0.1", "--port", str(primary.port), "--username", SUPERUSER,
            "--pgdata", str(self.data), "--write-recovery-conf", "--wal-method", "stream",
            "--checkpoint", "fast", "--no-sync",
        )  # fmt: skip
        # The copy carries the primary's ALTER SYSTEM settings: a standby promoted alone must
        # not wait for a standby of its own before each commit.
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            conf.write("synchronous_standby_names = ''\n")

    def promote(self) -> None:
        """``pg_ctl promote``: the standby ends recovery and takes writes (waits for it)."""
        self.run("pg_ctl", "promote", "--pgdata", str(self.data), "--wait", "--timeout", "30")

    def start(self, timeout: float = 30.0) -> None:
        offset = self.log.stat().st_size if self.log.exists() else 0
        args = [
            str(self.bin / "postgres"),
            "-D", str(self.data),
            "-p", str(self.port),
            "-k", str(self.dir),
            "-c", "listen_addresses=127.0.0.1",
            "-c", "max_connections=300",
            # A throwaway cluster: nothing needs to survive a power cut (commits still
            # reach the OS before they return, so a killed server keeps them).
            "-c", "fsync=off",
            "-c", "full_page_writes=off",
        ]  # fmt: skip
        for name, value in self.settings.items():
            args += ["-c", f"{name}={value}"]
        with self.log.open("ab") as log:
            if self.owner is not None:
                os.chown(self.log, *self.owner)
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # out of reach of the terminal's signals
                cwd=self.dir,
                env={**os.environ, "LC_ALL": "C"},
                **self._as_owner(),  # type: ignore[call-overload]
            )
        self.frozen = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.log.open("rb") as log:
                log.seek(offset)
                if READY.search(log.read().decode(errors="replace")):
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        tail = self.log.read_text(errors="replace")[-2000:]
        self.kill()
        raise RuntimeError(f"PostgreSQL did not start within {timeout} s:\n{tail}")

    def _signal(self, signum: int) -> list[int]:
        """Send ``signum`` (SIGSTOP or SIGKILL) to every process the postmaster started, then
        to the postmaster; their PIDs.

        The postmaster is stopped first, so that it starts nothing more and its children are
        still its own while they are listed: a killed postmaster's children belong to the
        init process at once, and a frozen server's, stopped, would never notice its death
        and stay behind for good.
        """
        if self.proc is None or self.proc.poll() is not None:
            return []
        os.kill(self.proc.pid, signal.SIGSTOP)
        pids = []
        for child in _children(self.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)
                pids.append(child)
        os.kill(self.proc.pid, signum)
        return [self.proc.pid, *pids]

    def freeze(self) -> None:
        """SIGSTOP every process of the server: connections stay open, nothing answers."""
        self._signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for child in _children(self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGCONT)
        self.frozen = False

    def kill(self) -> None:
        """SIGKILL the whole server (postmaster and backends), as a crash would; returns once
        all of them are gone, so that the server can start again on the same data."""
        if self.proc is None:
            return
        pids = self._signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        self.proc = None
        self.frozen = False

    def stop(self) -> None:
        """A fast shutdown (SIGINT to the postmaster), SIGKILL if it takes more than 10 s."""
        if self.proc is None:
            return
        if self.frozen:
            self.thaw()
        self.proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.kill()

    def ensure_running(self) -> None:
        """Undo what a previous test left: a frozen or killed server runs again."""
        if self.frozen:
            self.thaw()
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            self.start()

    def __enter__(self) -> PostgresServer:
        try:
            self.initdb()
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@asynccontextmanager
async def admin(server: PostgresServer) -> AsyncIterator[Any]:
    """A superuser connection to ``server``, closed after."""
    conn = await asyncpg.connect(server.url, timeout=10)
    try:
        yield conn
    finally:
        conn.terminate()


def fresh(name: str) -> str:
    """A name no earlier test used: the server, and so its tables, last the session."""
    return f"{name}_{uuid.uuid4().hex[:8]}"


class ReplicatedPair:
    """A primary and a streaming standby on loopback; :meth:`fail_over` kills (or freezes) the
    primary and promotes the standby, and :meth:`ensure` makes the dead one the new standby.

    Both ports stay the same for the whole session, so one multi-host URL names the pair
    whichever of them is the primary.
    """

    def __init__(self) -> None:
        first = PostgresServer()
        self.primary, self.standby = first, PostgresServer(first.password)
        self.sync = False
        self.failovers = 0
        self._conninfo: str | None = None  # the standby's, while its WAL receiver is stopped

    @property
    def servers(self) -> tuple[PostgresServer, PostgresServer]:
        """Both servers, in the order of the URL (which never changes)."""
        return tuple(sorted((self.primary, self.standby), key=lambda s: s.dir.name))  # type: ignore[return-value]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{server.port}" for server in self.servers)
        return (
            f"postgresql://{SUPERUSER}:{self.primary.password}@{hosts}/postgres"
            "?target_session_attrs=read-write"
        )

    def _streaming(self, sync: bool) -> bool:
        wanted = "sync" if sync else "async"
        return (
            self.primary.sql(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' "
                f"AND sync_state = '{wanted}'"
            )
            == "1"
        )

    def ensure(self, sync: bool = False, timeout: float = 60.0) -> None:
        """Both running and streaming, the replication synchronous or not as asked."""
        self.primary.ensure_running()
        if self._conninfo is not None and self.standby.proc is not None:
            self.resume_receiving()  # a test left it lagging
        if self.standby.proc is None or self.standby.frozen:
            self.standby.kill()  # a frozen old primary would come back as a second primary
            self.standby.clone(self.primary)
            self.standby.start()
        if sync != self.sync or self.failovers:
            names = "'*'" if sync else "''"
            self.primary.sql(f"ALTER SYSTEM SET synchronous_standby_names = {names}")
            self.primary.sql("SELECT pg_reload_conf()")
            self.sync = sync
            self.failovers = 0
        deadline = time.monotonic() + timeout
        while not self._streaming(sync):
            if time.monotonic() > deadline:
                raise RuntimeError("the standby does not stream from the primary")
            time.sleep(0.05)

    def caught_up(self, timeout: float = 30.0) -> None:
        """Wait until the standby has replayed everything the primary wrote so far."""
        deadline = time.monotonic() + timeout
        query = "SELECT bool_and(replay_lsn >= pg_current_wal_lsn()) FROM pg_stat_replication"
        while self.primary.sql(query) != "t":
            if time.monotonic() > deadline:
                raise RuntimeError("the standby does not catch up with the primary")
            time.sleep(0.02)

    def stop_receiving(self, timeout: float = 30.0) -> None:
        """Stop the standby's WAL receiver (its ``primary_conninfo`` emptied, as a cut link
        would): it keeps what it received and receives nothing more, so the primary's
        commits from now on are on the primary alone (with synchronous replication, they
        wait). :meth:`resume_receiving` undoes it."""
        self._conninfo = self.standby.sql("SHOW primary_conninfo")
        self._set_conninfo("")
        deadline = time.monotonic() + timeout
        while self.primary.sql("SELECT count(*) FROM pg_stat_replication") != "0":
            if time.monotonic() > deadline:
                raise RuntimeError("the standby's WAL receiver did not stop")
            time.sleep(0.02)

    def resume_receiving(self) -> None:
        """Give the standby its ``primary_conninfo`` back: it streams (and catches up) again."""
        if self._conninfo is not None:
            self._set_conninfo(self._conninfo)
            self._conninfo = None

    def _set_conninfo(self, conninfo: str) -> None:
        quoted = conninfo.replace("'", "''")
        self.standby.sql(f"ALTER SYSTEM SET primary_conninfo = '{quoted}'")
        self.standby.sql("SELECT pg_reload_conf()")

    def lose_primary(self, freeze: bool = False) -> None:
        """SIGKILL (or SIGSTOP) the primary; the standby stays a standby until :meth:`promote`."""
        if freeze:
            self.primary.freeze()
        else:
            self.primary.kill()

    def promote(self) -> None:
        """Promote the standby: it is the primary now, and the old primary the standby to be."""
        self.standby.promote()
        self.primary, self.standby = self.standby, self.primary
        self.failovers += 1
        self._conninfo = None  # the old primary, recloned by ensure(), streams from the start

    def fail_over(self, freeze: bool = False) -> None:
        """SIGKILL (or SIGSTOP) the primary, then promote the standby."""
        self.lose_primary(freeze)
        self.promote()

    def __enter__(self) -> ReplicatedPair:
        try:
            self.primary.initdb()
            self.primary.start()
            self.ensure()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        for server in (self.primary, self.standby):
            server.__exit__()


class Certificates:
    """A CA and a server certificate it signed for 127.0.0.1 (and nothing else), plus a second
    CA that signed nothing here: made with the ``openssl`` command in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = self._authority("ca")
        self.other_ca = self._authority("other-ca")
        self.key = directory / "server.key"
        self.cert = directory / "server.crt"
        request = directory / "server.csr"
        self._openssl("req", "-newkey", *_EC, "-nodes", "-keyout", str(self.key),
                      "-out", str(request), "-subj", "/CN=127.0.0.1")  # fmt: skip
        names = directory / "names.cnf"
        names.write_text("subjectAltName=IP:127.0.0.1\n")
        self._openssl("x509", "-req", "-in", str(request), "-CA", str(self.ca),
                      "-CAkey", str(directory / "ca.key"), "-CAcreateserial", "-days", "2",
                      "-out", str(self.cert), "-extfile", str(names))  # fmt: skip

    def _authority(self, name: str) -> Path:
        cert = self.dir / f"{name}.crt"
        self._openssl("req", "-x509", "-newkey", *_EC, "-nodes", "-days", "2",
                      "-keyout", str(self.dir / f"{name}.key"), "-out", str(cert),
                      "-subj", f"/CN=purgatory_aio test {name}")  # fmt: skip
        return cert

    def _openssl(self, *args: str) -> None:
        binary = shutil.which("openssl")
        if binary is None:
            pytest.fail("the openssl command is not installed: apt-get install -y openssl")
        done = subprocess.run([binary, *args], capture_output=True, timeout=60, cwd=self.dir)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.decode()[-2000:]}")


_EC = ("ec", "-pkeyopt", "ec_paramgen_curve:prime256v1")


class TlsPostgresServer(PostgresServer):
    """A server with ``ssl=on`` and a certificate for 127.0.0.1 signed by :attr:`certs`."""

    def __init__(self) -> None:
        super().__init__()
        self.certs = Certificates(Path(tempfile.mkdtemp(prefix="purgatory-tls-")))

    def url_tls(self, mode: str = "verify-full", ca: Path | None = None, host: str = "") -> str:
        root = ca or self.certs.ca
        address = host or "127.0.0.1"
        return (
            f"postgresql://{SUPERUSER}:{self.password}@{address}:{self.port}/postgres"
            f"?sslmode={mode}&sslrootcert={root}"
        )

    def initdb(self) -> None:
        super().initdb()
        # The server reads its key only if it alone may (0600, its own user).
        for source in (self.certs.cert, self.certs.key, self.certs.ca):
            target = self.dir / source.name
            shutil.copyfile(source, target)
            target.chmod(0o600)
            if self.owner is not None:
                os.chown(target, *self.owner)
        self.settings.update(
            ssl="on",
            ssl_cert_file=str(self.dir / self.certs.cert.name),
            ssl_key_file=str(self.dir / self.certs.key.name),
            ssl_ca_file=str(self.dir / self.certs.ca.name),
        )

    def __exit__(self, *exc_info: object) -> None:
        super().__exit__()
        shutil.rmtree(self.certs.dir, ignore_errors=True)


def pair(server: PostgresServer, name: str, **options: Any) -> tuple[Any, ...]:
    """Two purgatories and a member on each, under a prefix no other test uses (not started)."""
    a, b = Purgatory("a"), Purgatory("b")
    prefix = fresh(name)
    return (
        a,
        b,
        PostgresFanout(server.url, a, prefix=prefix, **options),
        PostgresFanout(server.url, b, prefix=prefix, **options),
    )


async def parked(fanout: PostgresFanout, purgatory: Purgatory, key: str) -> asyncio.Task[Any]:
    """A wait for ``key`` to reach 1, once the purgatory holds it."""
    before = purgatory.num_delayed
    task = asyncio.create_task(fanout.wait_for_value(purgatory, key, 1, 60))
    await until(lambda: purgatory.num_delayed == before + 1)
    return task
