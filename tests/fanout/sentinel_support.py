"""A Sentinel-managed Redis for the tests: a master, a replica and three sentinels on loopback.

Every process listens on 127.0.0.1 on a free port and is stopped by its own PID; with
:class:`Tls` every one of them takes TLS only, and they reach one another over TLS. The
sentinels judge a master down after a second (shorter, they misjudge the master they
just promoted), so a failover takes about two seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from fanout_support import RedisServer, free_port, wait_for_port

SERVICE = "purgatory"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 2000
#: The longest a topology may take to settle (a failover, a replica's first sync).
SETTLE = 30.0


@dataclass(frozen=True)
class Tls:
    """Certificates for a topology that takes TLS only: ``cert`` (with its ``key``) names
    127.0.0.1, and ``ca`` signed it."""

    ca: Path
    cert: Path
    key: Path

    def server_options(self) -> list[str]:
        """redis-server's options (a sentinel's configuration lines, without the dashes):
        TLS only on the port given, and TLS to the other nodes."""
        return [
            "--port", "0",
            "--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key),
            "--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "no",
            "--tls-replication", "yes",
        ]  # fmt: skip

    def client_options(self) -> dict[str, Any]:
        return {"ssl": True, "ssl_ca_certs": str(self.ca)}


def _command(port: int, *args: object, tls: Tls | None = None) -> Any:
    client = _client(port, tls)
    try:
        return client.execute_command(*args)
    finally:
        client.close()


def _client(port: int, tls: Tls | None) -> redis.Redis:
    options = {} if tls is None else tls.client_options()
    return redis.Redis(
        host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2, **options
    )


class Sentinels:
    """One master, one replica, three sentinels; ``url`` names them for the fan-out.

    With ``tls`` every node and sentinel takes TLS only (``rediss+sentinel://``)."""

    def __init__(self, tls: Tls | None = None) -> None:
        self.tls = tls
        self.nodes = [RedisServer() for _ in range(2)]
        for node in self.nodes:
            node.args = self._node_args(node)
        self.ports = [free_port() for _ in range(3)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None, None, None]
        self.dirs = [Path(node.dir) for node in self.nodes]

    def _node_args(self, node: RedisServer) -> list[str]:
        args = ["--repl-diskless-sync-delay", "0"]
        if self.tls is not None:
            args += ["--tls-port", str(node.port), *self.tls.server_options()]
        return args

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        if self.tls is None:
            return f"redis+sentinel://{hosts}/{SERVICE}"
        return f"rediss+sentinel://{hosts}/{SERVICE}?ssl_ca_certs={self.tls.ca}"

    def command(self, port: int, *args: object) -> Any:
        """One command to the node or sentinel on ``port`` (over TLS if the topology is)."""
        return _command(port, *args, tls=self.tls)

    def start(self) -> None:
        first, second = self.nodes
        first.start()
        second.args += ["--replicaof", "127.0.0.1", str(first.port)]
        second.start()
        for i, port in enumerate(self.ports):
            config = self.dirs[0] / f"sentinel-{port}.conf"
            if self.tls is None:
                listen = f"port {port}\n"
            else:  # the same options as the nodes', as configuration lines
                options = ["--tls-port", str(port), *self.tls.server_options()]
                listen = "".join(
                    f"{name[2:]} {value}\n"
                    for name, value in zip(options[::2], options[1::2], strict=True)
                )
            config.write_text(
                listen + "bind 127.0.0.1\n"
                f"dir {self.dirs[0]}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {first.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
            )
            binary = first.binary
            self.procs[i] = subprocess.Popen(
                [binary, str(config), "--sentinel", "--loglevel", "warning"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_for_port(port)
        self.wait_healthy()

    def master(self) -> RedisServer:
        """The node the sentinels name as master now."""
        _, port = self.command(self.ports[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return next(node for node in self.nodes if node.port == int(port))

    def replica(self) -> RedisServer:
        master = self.master()
        return next(node for node in self.nodes if node is not master)

    def _healthy(self) -> bool:
        try:
            masters = {
                int(self.command(port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])
                for port in self.ports
            }
            if len(masters) != 1:
                return False
            (port,) = masters
            state = self.command(self.ports[0], "SENTINEL", "MASTER", SERVICE)
            if state[b"flags"] != b"master":  # not down, no failover under way
                return False
            if int(state[b"num-other-sentinels"]) != 2 or int(state[b"num-slaves"]) < 1:
                return False
            for sentinel in self.ports:  # each may lead the next failover: each must see
                replicas = self.command(sentinel, "SENTINEL", "REPLICAS", SERVICE)
                if not any(_promotable(replica) for replica in replicas):
                    return False
            info = self.command(port, "INFO", "replication")
            replica = info.get("slave0")
            online = (
                info.get("role") == "master"
                and isinstance(replica, dict)
                and replica.get("state") == "online"
            )
            return online and _replicated(port, self.tls)
        except (redis.RedisError, OSError, StopIteration, KeyError, ValueError, TypeError):
            return False

    def wait_healthy(self) -> None:
        """Until both nodes run, the sentinels agree on a master whose replica acknowledges
        a write, no failover is under way, and all of it still holds a moment later."""
        for node in self.nodes:
            if node.proc is None:
                self.restart(node)
            elif node.proc.poll() is None:
                os.kill(node.proc.pid, signal.SIGCONT)  # a test may have left it frozen
        deadline = time.monotonic() + SETTLE
        settled = 0
        while settled < 2:  # twice, 0.3 s apart: not a moment before a replica resyncs
            if time.monotonic() > deadline:
                raise RuntimeError("the Sentinel topology did not settle")
            if self._healthy():
                settled += 1
                time.sleep(0.3 if settled < 2 else 0)
            else:
                settled = 0
                self._demote_stray_master()
                time.sleep(0.05)

    def _demote_stray_master(self) -> None:
        """A master the sentinels no longer name (after SENTINEL FAILOVER, or a thawed one)
        is turned into a replica at once, as the sentinels would at their next 10 s look."""
        try:
            master = self.master()
            for node in self.nodes:
                if node is not master and node.proc is not None:
                    info = self.command(node.port, "INFO", "replication")
                    if info.get("role") == "master":
                        self.command(node.port, "REPLICAOF", "127.0.0.1", master.port)
        except (redis.RedisError, OSError, StopIteration):
            pass

    def restart(self, node: RedisServer) -> None:
        """Start a killed node again, as a replica of the current master."""
        master = next(n for n in self.nodes if n is not node)
        node.args = [*self._node_args(node), "--replicaof", "127.0.0.1", str(master.port)]
        node.start()

    def failover(self) -> RedisServer:
        """``SENTINEL FAILOVER``: returns the new master once the sentinels name it."""
        old = self.master()
        self.command(self.ports[0], "SENTINEL", "FAILOVER", SERVICE)
        return self.wait_new_master(old)

    def wait_new_master(self, old: RedisServer) -> RedisServer:
        deadline = time.monotonic() + SETTLE
        while True:
            try:
                new = self.master()
            except (redis.RedisError, OSError, StopIteration):
                new = old
            if new is not old:
                return new
            if time.monotonic() > deadline:
                raise RuntimeError("no failover happened")
            time.sleep(0.02)

    @staticmethod
    def freeze(node: RedisServer) -> None:
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGSTOP)

    @staticmethod
    def thaw(node: RedisServer) -> None:
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            self.procs[i] = None
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                os.kill(node.proc.pid, signal.SIGCONT)
            node.__exit__()
        for where in self.dirs:
            shutil.rmtree(where, ignore_errors=True)


def _promotable(replica: dict[bytes, bytes]) -> bool:
    """Whether a sentinel would pick this replica in a failover: up as the sentinel sees it
    (not s_down, not disconnected). Its view of the replica's link comes from an INFO every
    10 s, which a failover does not wait for."""
    return replica.get(b"flags") == b"slave"


def _replicated(port: int, tls: Tls | None = None) -> bool:
    """Whether the master at ``port`` has a replica acknowledging a write (WAIT, on the
    connection that wrote)."""
    client = _client(port, tls)
    try:
        pipe = client.pipeline(transaction=False)
        pipe.set("purgatory-test:health", "1")
        pipe.execute_command("WAIT", 1, 200)
        _, acknowledged = pipe.execute()
        return int(acknowledged) >= 1
    finally:
        client.close()
