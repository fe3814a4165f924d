"""A purgatory-broker cluster on free loopback ports, run on its own loop in a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

pytest.importorskip("kio")
pytest.importorskip("aiokafka")
pytest.importorskip("confluent_kafka")

from minikafka.broker.config import BrokerConfig
from minikafka.wire.server import WireCluster, WireConfig

T = TypeVar("T")


class RunningBroker:
    """A :class:`WireCluster` served from a background thread until :meth:`stop`."""

    def __init__(self, broker: BrokerConfig, wire: WireConfig, loop_name: str) -> None:
        self.wire = WireCluster(broker, wire)
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop_name = loop_name
        self._thread = threading.Thread(target=self._run, name="purgatory-broker", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the broker did not start within 10 s")

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.wire.ports)

    def _run(self) -> None:
        if self._loop_name == "uvloop":
            import uvloop

            uvloop.run(self._main())
        else:
            asyncio.run(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        self.loop = asyncio.get_running_loop()
        async with self.wire:
            self._ready.set()
            await self._stop.wait()

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on the broker's loop (the cluster is not thread-safe)."""

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def purgatory_stats(self, name: str) -> dict[str, int | str]:
        """The plain-dict stats of one of the cluster's purgatories, read on its loop."""
        return self.call(lambda: self.wire.cluster.purgatories[name].stats().as_dict())

    def stop(self) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the broker did not stop within 10 s"


def _running(loop_name: str) -> Iterator[RunningBroker]:
    running = RunningBroker(BrokerConfig(brokers=1), WireConfig(port=0, partitions=2), loop_name)
    yield running
    running.stop()


@pytest.fixture
def broker() -> Iterator[RunningBroker]:
    yield from _running("asyncio")


@pytest.fixture(params=["asyncio", "uvloop"])
def broker_any_loop(request: pytest.FixtureRequest) -> Iterator[RunningBroker]:
    """The broker on each event loop, for the tests where its loop matters (long polls)."""
    yield from _running(request.param)
