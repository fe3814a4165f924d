"""A Redis Cluster for the tests: three masters with a replica each, on loopback.

Each node listens on 127.0.0.1 on a free port, with its cluster bus on another free port
(``--cluster-port``: the default, port + 10000, overflows above 55535), and is stopped by
its own PID. A node is judged failed after ``NODE_TIMEOUT_MS``, so a killed master's
replica takes over in a second or two. A killed node started again rejoins as a replica.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from typing import Any

import redis
from fanout_support import RedisServer, free_port

NODE_TIMEOUT_MS = 1000
#: The longest the cluster may take to settle (its creation, a failover, a rejoin).
SETTLE = 30.0
_ERRORS = (redis.RedisError, OSError, ValueError, KeyError, IndexError)


def command(port: int, *args: object) -> Any:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)
    try:
        return client.execute_command(*args)
    finally:
        client.close()


def _node_options() -> list[str]:
    return [
        "--cluster-enabled", "yes",
        "--cluster-port", str(free_port()),
        "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
        "--repl-diskless-sync-delay", "0",
    ]  # fmt: skip


class Cluster:
    """Six nodes; ``url`` names two of them for the fan-out (it finds the others)."""

    def __init__(self) -> None:
        self.nodes = [RedisServer(args=_node_options()) for _ in range(6)]

    def url(self, first: RedisServer | None = None) -> str:
        """The Cluster URL, ``first`` named first (the node a member subscribes on)."""
        ordered = sorted(self.nodes, key=lambda node: node is not first)
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in ordered[:3])

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        cli = shutil.which("redis-cli")
        assert cli is not None, "redis-cli is missing (Debian's redis-tools)"
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        self.wait_healthy()

    def master_of(self, key: str) -> RedisServer:
        """The node that serves ``key``'s slot now."""
        for node in self.running():
            try:
                slot = int(command(node.port, "CLUSTER", "KEYSLOT", key))
                for start, end, master, *_ in command(node.port, "CLUSTER", "SLOTS"):
                    if start <= slot <= end:
                        port = int(master[1])
                        return next(n for n in self.nodes if n.port == port)
            except _ERRORS:
                continue
        raise RuntimeError(f"no node serves {key!r}")

    def running(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.proc is not None]

    def _healthy(self) -> bool:
        try:
            for node in self.nodes:
                info = command(node.port, "CLUSTER", "INFO").decode()
                if "cluster_state:ok" not in info:
                    return False
            lines = command(self.nodes[0].port, "CLUSTER", "NODES").decode().splitlines()
            if any("fail" in line.split()[2] for line in lines):
                return False
            masters = [line.split()[0] for line in lines if "master" in line.split()[2]]
            replicas = [line.split()[3] for line in lines if "slave" in line.split()[2]]
            if len(masters) != 3 or sorted(replicas) != sorted(masters):
                return False
            for node in self.nodes:  # every replica in sync with its master
                role = command(node.port, "ROLE")
                if role[0] == b"slave" and role[3] != b"connected":
                    return False
            return True
        except _ERRORS:
            return False

    def wait_healthy(self) -> None:
        """Until every node runs, the cluster is ok, and each master has one replica in sync;
        a killed node is started again (it rejoins as a replica)."""
        for node in self.nodes:
            if node.proc is None:
                node.start()
        deadline = time.monotonic() + SETTLE
        settled = 0
        while settled < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster did not settle")
            if self._healthy():
                settled += 1
                time.sleep(0.2 if settled < 2 else 0)
            else:
                settled = 0
                time.sleep(0.05)

    def wait_promoted(self, old: RedisServer, key: str) -> RedisServer:
        """The node that serves ``key`` once ``old`` (killed) no longer does."""
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline:
            try:
                new = self.master_of(key)
            except RuntimeError:
                new = old
            if new is not old:
                return new
            time.sleep(0.05)
        raise RuntimeError("no replica was promoted")

    def stop(self) -> None:
        for node in self.nodes:
            node.__exit__()
