"""A Spark standalone cluster (master + N workers) on loopback, for tests and the bench."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Self

#: Longest wait for the master to listen and the worker to register.
START_TIMEOUT = 90.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spark_home() -> Path:
    """The installed pyspark package directory: it holds Spark's jars."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def cluster_env() -> dict[str, str]:
    """What the JVMs and a driver need: loopback only, this Python on the workers."""
    env = dict(os.environ)
    env["SPARK_HOME"] = str(spark_home())
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    # The executor launcher asks for it when it runs from a pip-installed pyspark.
    env.setdefault("SPARK_SCALA_VERSION", _scala_version())
    env["PYSPARK_PYTHON"] = sys.executable  # absolute: the workers start it themselves
    return env


def _scala_version() -> str:
    jars = spark_home() / "jars"
    for jar in jars.glob("spark-core_*.jar"):
        return jar.name.split("_", 1)[1].split("-", 1)[0]
    return "2.13"


class StandaloneCluster:
    """``java -cp $SPARK_HOME/jars/* org.apache.spark.deploy.{master.Master,worker.Worker}``."""

    def __init__(self, work: Path, *, cores: int = 2, memory: str = "1g", workers: int = 1) -> None:
        self.work = work
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self._processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def _start(self, name: str, main_class: str, *args: str) -> None:
        java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin"))
        java = java or shutil.which("java")
        assert java, "the cluster needs Java"
        log = (self.work / f"{name}.log").open("wb")
        self._logs.append(log)
        classpath = f"{spark_home() / 'jars'}/*"
        command = [java, "-Xmx512m", "-cp", classpath, main_class, *args]
        self._processes.append(
            subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=cluster_env())
        )

    def __enter__(self) -> Self:
        try:
            self._start(
                "master",
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(self.port)),
                *("--webui-port", str(self.ui_port)),
            )
            for index in range(self.workers):
                self._start(
                    f"worker-{index}",
                    "org.apache.spark.deploy.worker.Worker",
                    self.url,
                    *("--host", "127.0.0.1", "--port", str(free_port())),
                    *("--webui-port", str(free_port())),
                    *("--cores", str(self.cores), "--memory", self.memory),
                    *("--work-dir", str(self.work / f"worker-{index}")),
                )
            self._wait_for_worker()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_worker(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        status = f"http://127.0.0.1:{self.ui_port}/json/"
        while time.monotonic() < deadline:
            for process in self._processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a cluster JVM exited: see the logs in {self.work}")
            try:
                with urllib.request.urlopen(status, timeout=2) as answer:
                    if json.load(answer).get("aliveworkers", 0) >= self.workers:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(
            f"no worker registered within {START_TIMEOUT:.0f} s; logs in {self.work}"
        )

    def stop(self) -> None:
        """Stop the worker, then the master, each by its PID."""
        for process in reversed(self._processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(15)
        self._processes.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
