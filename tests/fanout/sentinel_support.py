"""A Sentinel-managed Redis for the tests: a master, a replica and three sentinels on loopback.

Every process listens on 127.0.0.1 on a free port and is stopped by its own PID. The
sentinels judge a master down after a second (shorter, they misjudge the master they
just promoted), so a failover takes about two seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
from fanout_support import RedisServer, free_port, wait_for_port

SERVICE = "purgatory"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 2000
#: The longest a topology may take to settle (a failover, a replica's first sync).
SETTLE = 30.0


def _command(port: int, *args: object) -> Any:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)
    try:
        return client.execute_command(*args)
    finally:
        client.close()


class Sentinels:
    """One master, one replica, three sentinels; ``url`` names them for the fan-out."""

    def __init__(self) -> None:
        self.nodes = [RedisServer(args=["--repl-diskless-sync-delay", "0"]) for _ in range(2)]
        self.ports = [free_port() for _ in range(3)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None, None, None]
        self.dirs = [Path(node.dir) for node in self.nodes]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def start(self) -> None:
        first, second = self.nodes
        first.start()
        second.args += ["--replicaof", "127.0.0.1", str(first.port)]
        second.start()
        for i, port in enumerate(self.ports):
            config = self.dirs[0] / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\n"
                "bind 127.0.0.1\n"
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
        _, port = _command(self.ports[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return next(node for node in self.nodes if node.port == int(port))

    def replica(self) -> RedisServer:
        master = self.master()
        return next(node for node in self.nodes if node is not master)

    def _healthy(self) -> bool:
        try:
            masters = {
                int(_command(port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])
                for port in self.ports
            }
            if len(masters) != 1:
                return False
            (port,) = masters
            state = _command(self.ports[0], "SENTINEL", "MASTER", SERVICE)
            if state[b"flags"] != b"master":  # not down, no failover under way
                return False
            if int(state[b"num-other-sentinels"]) != 2 or int(state[b"num-slaves"]) < 1:
                return False
            for sentinel in self.ports:  # each may lead the next failover: each must see
                replicas = _command(sentinel, "SENTINEL", "REPLICAS", SERVICE)
                if not any(_promotable(replica) for replica in replicas):
                    return False
            info = _command(port, "INFO", "replication")
            replica = info.get("slave0")
            online = (
                info.get("role") == "master"
                and isinstance(replica, dict)
                and replica.get("state") == "online"
            )
            return online and _replicated(port)
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
                    info = _command(node.port, "INFO", "replication")
                    if info.get("role") == "master":
                        _command(node.port, "REPLICAOF", "127.0.0.1", master.port)
        except (redis.RedisError, OSError, StopIteration):
            pass

    def restart(self, node: RedisServer) -> None:
        """Start a killed node again, as a replica of the current master."""
        master = next(n for n in self.nodes if n is not node)
        node.args = ["--repl-diskless-sync-delay", "0"]
        node.args += ["--replicaof", "127.0.0.1", str(master.port)]
        node.start()

    def failover(self) -> RedisServer:
        """``SENTINEL FAILOVER``: returns the new master once the sentinels name it."""
        old = self.master()
        _command(self.ports[0], "SENTINEL", "FAILOVER", SERVICE)
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


def _replicated(port: int) -> bool:
    """Whether the master at ``port`` has a replica acknowledging a write (WAIT, on the
    connection that wrote)."""
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)
    try:
        pipe = client.pipeline(transaction=False)
        pipe.set("purgatory-test:health", "1")
        pipe.execute_command("WAIT", 1, 200)
        _, acknowledged = pipe.execute()
        return int(acknowledged) >= 1
    finally:
        client.close()
