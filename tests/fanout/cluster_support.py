"""A Redis Cluster for the tests: three masters with a replica each, on loopback.

Each node listens on 127.0.0.1 on a free port, with its cluster bus on another free port
(``--cluster-port``: the default, port + 10000, overflows above 55535), and is stopped by
its own PID. A node is judged failed after ``NODE_TIMEOUT_MS``, so a killed (or frozen)
master's replica takes over in a second or two. A killed node started again, or a frozen one
thawed, rejoins as a replica. A slot moves between masters as ``redis-cli --cluster reshard``
moves it, in two steps the tests can pause between (``begin_move``, ``finish_move``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from typing import Any

import redis
from fanout_support import RedisServer, free_port
from redis.crc import key_slot

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
        self.frozen: list[RedisServer] = []

    def url(self, first: RedisServer | None = None) -> str:
        """The Cluster URL, ``first`` named first (the node a member subscribes on)."""
        ordered = sorted(self.nodes, key=lambda node: node is not first)
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in ordered[:3])

    def start(self) -> None:
        cli = shutil.which("redis-cli")
        assert cli is not None, "redis-cli is missing (Debian's redis-tools)"
        for attempt in range(3):
            try:
                for node in self.nodes:
                    node.start()
            except RuntimeError as exc:  # its port was taken since it was picked
                said = str(exc)
            else:
                addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
                created = subprocess.run(
                    [cli, "--cluster", "create", *addresses, "--cluster-replicas", "1",
                     "--cluster-yes"],
                    capture_output=True,
                    timeout=60,
                )  # fmt: skip
                if created.returncode == 0:
                    break
                said = (created.stdout + created.stderr).decode(errors="replace")[-2000:]
            # Free ports are picked one at a time: two nodes may have drawn the same one, or
            # another process taken one since.
            self.stop()
            if attempt == 2:
                raise RuntimeError(f"the Redis Cluster did not start: {said}")
            self.nodes = [RedisServer(args=_node_options()) for _ in range(6)]
        self.wait_healthy()

    def master_of(self, key: str) -> RedisServer:
        """The node that serves ``key``'s slot now."""
        for node in self.answering():
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

    def masters(self) -> list[RedisServer]:
        """The running nodes that are masters now."""
        return [node for node in self.answering() if command(node.port, "ROLE")[0] == b"master"]

    def replica_of(self, master: RedisServer) -> RedisServer:
        """The node replicating ``master`` now."""
        for node in self.answering():
            role = command(node.port, "ROLE")
            if role[0] == b"slave" and int(role[2]) == master.port:
                return node
        raise RuntimeError(f"no replica of 127.0.0.1:{master.port}")

    def answering(self) -> list[RedisServer]:
        return [node for node in self.running() if node not in self.frozen]

    def slot_of(self, key: str) -> int:
        return int(command(self.answering()[0].port, "CLUSTER", "KEYSLOT", key))

    def freeze(self, node: RedisServer) -> None:
        """SIGSTOP: the process holds its connections open and answers nothing (a partition)."""
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGSTOP)
        self.frozen.append(node)

    def thaw(self, node: RedisServer) -> None:
        if node in self.frozen:
            self.frozen.remove(node)
            if node.proc is not None:
                os.kill(node.proc.pid, signal.SIGCONT)

    # -- moving a slot ----------------------------------------------------------------------

    def owner(self, slot: int) -> RedisServer:
        """The master that serves ``slot`` now, as the masters themselves say."""
        for node in self.masters():
            if self._owner(node, slot) == node.port:
                return node
        raise RuntimeError(f"no master serves slot {slot}")

    def begin_move(self, slot: int, target: RedisServer) -> RedisServer:
        """Mark ``slot`` migrating from its master to ``target`` (importing there) and move
        its keys: from here on its master answers ASK for them. Returns the source."""
        source = self.owner(slot)
        assert source is not target, "the slot is already on the target"
        command(target.port, "CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(source))
        command(source.port, "CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(target))
        while keys := command(source.port, "CLUSTER", "GETKEYSINSLOT", slot, 100):
            command(source.port, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        return source

    def finish_move(self, slot: int, target: RedisServer) -> None:
        """Give ``slot`` to ``target`` on every master (the target first, as redis-cli does),
        and wait until every node says so: from here on the old master answers MOVED."""
        others = [node for node in self.masters() if node is not target]
        for node in [target, *others]:
            command(node.port, "CLUSTER", "SETSLOT", slot, "NODE", _node_id(target))
        deadline = time.monotonic() + SETTLE
        while not all(self._owner(node, slot) == target.port for node in self.answering()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the nodes do not agree that slot {slot} moved")
            time.sleep(0.05)

    def move(self, slot: int, target: RedisServer) -> RedisServer:
        """Move ``slot`` to ``target`` at once; returns the master it left."""
        source = self.begin_move(slot, target)
        self.finish_move(slot, target)
        return source

    @staticmethod
    def _owner(node: RedisServer, slot: int) -> int | None:
        try:
            for start, end, master, *_ in command(node.port, "CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        except _ERRORS:
            return None
        return None

    def _finish_moves(self) -> None:
        """Finish any move a failed test left half done (its slot still marked migrating)."""
        for node in self.masters():
            for line in command(node.port, "CLUSTER", "NODES").decode().splitlines():
                fields = line.split()
                if "myself" not in fields[2]:
                    continue
                for item in fields[8:]:
                    if "->-" in item:  # [slot->-target id]: migrating from here
                        slot, _, target_id = item.strip("[]").partition("->-")
                        target = next(n for n in self.masters() if _node_id(n) == target_id)
                        self.begin_move(int(slot), target)
                        self.finish_move(int(slot), target)

    def _healthy(self) -> bool:
        try:
            for node in self.nodes:
                info = command(node.port, "CLUSTER", "INFO").decode()
                if "cluster_state:ok" not in info:
                    return False
            lines = command(self.nodes[0].port, "CLUSTER", "NODES").decode().splitlines()
            if any("fail" in line.split()[2] for line in lines):
                return False
            for node in self.nodes:  # a slot still migrating or importing somewhere
                if "[" in command(node.port, "CLUSTER", "NODES").decode():
                    return False
            masters = [line.split()[0] for line in lines if "master" in line.split()[2]]
            replicas = [line.split()[3] for line in lines if "slave" in line.split()[2]]
            if len(masters) != 3 or sorted(replicas) != sorted(masters):
                return False
            for node in self.nodes:  # every replica in sync with its master
                role = command(node.port, "ROLE")
                if role[0] == b"slave" and role[3] != b"connected":
                    return False
                # and acknowledging its writes (a rejoined one may still be loading).
                if role[0] == b"master" and not _acknowledged(node):
                    return False
            return True
        except _ERRORS:
            return False

    def wait_healthy(self) -> None:
        """Until every node runs, the cluster is ok, and each master has one replica in sync;
        a killed node is started again and a frozen one thawed (each rejoins as a replica),
        and a slot left half moved is moved."""
        for node in list(self.frozen):
            self.thaw(node)
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
                with contextlib.suppress(*_ERRORS, StopIteration, AssertionError, RuntimeError):
                    self._finish_moves()
                time.sleep(0.05)

    def wait_serving(self) -> None:
        """Until every slot is served by a node that answers, as every such node sees it (after
        a failover: the promoted replicas took over)."""
        deadline = time.monotonic() + SETTLE
        while not self._serving():
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis Cluster does not serve every slot")
            time.sleep(0.05)

    def _serving(self) -> bool:
        ports = {node.port for node in self.answering()}
        try:
            for node in self.answering():
                if "cluster_state:ok" not in command(node.port, "CLUSTER", "INFO").decode():
                    return False
                if any(
                    int(m[1]) not in ports for _, _, m, *_ in command(node.port, "CLUSTER", "SLOTS")
                ):
                    return False
        except _ERRORS:
            return False
        return True

    def wait_promoted(self, old: RedisServer, key: str) -> RedisServer:
        """The node that serves ``key`` once ``old`` (killed or frozen) no longer does, once
        every slot is served again."""
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline:
            try:
                new = self.master_of(key)
            except RuntimeError:
                new = old
            if new is not old:
                self.wait_serving()
                return new
            time.sleep(0.05)
        raise RuntimeError("no replica was promoted")

    def stop(self) -> None:
        for node in list(self.frozen):
            self.thaw(node)
        for node in self.nodes:
            node.__exit__()


def _acknowledged(master: RedisServer) -> bool:
    """A write to ``master`` (a key in its first range of slots) is acknowledged by its
    replica."""
    start, end = next(
        (int(first), int(last))
        for first, last, owner, *_ in command(master.port, "CLUSTER", "SLOTS")
        if int(owner[1]) == master.port
    )
    tag = next(tag for tag in range(1_000_000) if start <= key_slot(f"{{s{tag}}}".encode()) <= end)
    client = redis.Redis(host="127.0.0.1", port=master.port, socket_timeout=2)
    try:
        pipe = client.pipeline(transaction=False)
        pipe.set(f"{{s{tag}}}:settled", 1, ex=60)
        pipe.execute_command("WAIT", 1, 1000)
        return bool(pipe.execute()[-1] >= 1)
    finally:
        client.close()


def _node_id(node: RedisServer) -> str:
    return str(command(node.port, "CLUSTER", "MYID").decode())
