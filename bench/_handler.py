"""handler: request coroutines waiting in one process, no HTTP: the waiting mechanism alone.

``clients`` coroutines, one per request, wait on one key in each of three ways:

* ``purgatory``: a ``DelayedOperation`` awaited with ``Purgatory.watch_and_wait``;
* ``integration``: the same through :func:`purgatory_aio.integrations.watch_until_disconnected`
  with a set-entry disconnection signal (what the aiohttp integration registers);
* ``naive``: the naive-handler baseline, a future in a ``dict[key, set[future]]``
  awaited under ``asyncio.timeout``.

Two phases, the contenders taking turns:

* *fan-out*: the coroutines park, one notification satisfies them all; process
  CPU per request to park and to wake, and latency from the notification to
  each coroutine running again;
* *expiry*: nothing satisfies them; lateness of each expiration past its
  deadline, and CPU per request.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Hashable
from typing import Any

from purgatory_aio import DelayedOperation, Purgatory
from purgatory_aio.integrations import watch_until_disconnected

from ._common import Record, lateness_summary, quantile

KEY = "partition-0"
CONTENDERS = ("integration", "purgatory", "naive")
_monotonic = time.monotonic


class Level:
    """The value requests wait for (a high watermark, say)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


class WaitForLevel(DelayedOperation[int]):
    __slots__ = ("level", "target")

    def __init__(self, level: Level, target: int, timeout: float) -> None:
        super().__init__(timeout)
        self.level = level
        self.target = target

    def try_complete(self) -> bool:
        return self.level.value >= self.target and self.force_complete()

    def on_complete(self) -> int:
        return self.level.value


class Naive:
    __slots__ = ("level", "waiters")

    def __init__(self, level: Level) -> None:
        self.level = level
        self.waiters: dict[Hashable, set[asyncio.Future[None]]] = {}

    async def wait(self, target: int, max_wait: float) -> int:
        level, waiters = self.level, self.waiters
        future = asyncio.get_running_loop().create_future()
        waiters.setdefault(KEY, set()).add(future)
        try:
            async with asyncio.timeout(max_wait):
                while level.value < target:
                    await future
                    future = asyncio.get_running_loop().create_future()
                    waiters.setdefault(KEY, set()).add(future)
        except TimeoutError:
            pass
        finally:
            pending = waiters.get(KEY)
            if pending is not None:
                pending.discard(future)
                if not pending:
                    del waiters[KEY]
        return level.value

    def notify(self) -> None:
        for future in self.waiters.pop(KEY, ()):
            if not future.done():
                future.set_result(None)


def _subscribe(callbacks: set[Callable[[], None]], callback: Callable[[], None]) -> Any:
    callbacks.add(callback)
    return functools.partial(callbacks.discard, callback)


class Contender:
    """One way of waiting, with what it needs to be notified."""

    def __init__(self, name: str, purgatory: Purgatory, level: Level) -> None:
        self.name = name
        self.purgatory = purgatory
        self.level = level
        self.naive = Naive(level)
        callbacks: set[Callable[[], None]] = set()
        self.on_disconnect = functools.partial(_subscribe, callbacks)

    async def wait(self, target: int, max_wait: float) -> int:
        if self.name == "naive":
            return await self.naive.wait(target, max_wait)
        op = WaitForLevel(self.level, target, max_wait)
        if self.name == "purgatory":
            return await self.purgatory.watch_and_wait(op, (KEY,))
        return await watch_until_disconnected(self.purgatory, op, (KEY,), self.on_disconnect)

    def notify(self) -> None:
        if self.name == "naive":
            self.naive.notify()
        else:
            self.purgatory.check_and_complete(KEY)


async def _settle(tasks: list[asyncio.Task[Any]]) -> None:
    await asyncio.gather(*tasks)


async def fanout(contender: Contender, clients: int) -> Record:
    level = contender.level
    resumed: list[float] = []
    target = level.value + 1

    async def request() -> None:
        await contender.wait(target, 60.0)
        resumed.append(time.perf_counter())

    loop = asyncio.get_running_loop()
    cpu0 = time.process_time()
    tasks = [loop.create_task(request()) for _ in range(clients)]
    # Let every request run up to its wait.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    cpu1 = time.process_time()
    level.value = target
    start = time.perf_counter()
    contender.notify()
    await _settle(tasks)
    cpu2 = time.process_time()
    return {
        "park_cpu_us": (cpu1 - cpu0) / clients * 1e6,
        "wake_cpu_us": (cpu2 - cpu1) / clients * 1e6,
        "latencies": [t - start for t in resumed],
    }


async def expiry(contender: Contender, clients: int, max_wait: float) -> Record:
    lateness: list[float] = []
    target = contender.level.value + 1

    async def request() -> None:
        deadline = _monotonic() + max_wait
        await contender.wait(target, max_wait)
        lateness.append(_monotonic() - deadline)

    loop = asyncio.get_running_loop()
    cpu0 = time.process_time()
    await _settle([loop.create_task(request()) for _ in range(clients)])
    return {"cpu_us": (time.process_time() - cpu0) / clients * 1e6, "lateness": lateness}


async def measure(clients: int, rounds: int, max_wait: float) -> Record:
    level = Level()
    async with Purgatory("handler") as purgatory:
        contenders = {name: Contender(name, purgatory, level) for name in CONTENDERS}
        park: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        wake: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        latencies: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        expiry_cpu: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        lateness: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        await fanout(contenders["naive"], clients)  # warm-up
        for round_ in range(rounds):
            shift = round_ % len(CONTENDERS)
            for name in CONTENDERS[shift:] + CONTENDERS[:shift]:
                result = await fanout(contenders[name], clients)
                park[name].append(result["park_cpu_us"])
                wake[name].append(result["wake_cpu_us"])
                latencies[name].extend(result["latencies"])
            for name in CONTENDERS[shift:] + CONTENDERS[:shift]:
                result = await expiry(contenders[name], clients, max_wait)
                expiry_cpu[name].append(result["cpu_us"])
                lateness[name].extend(result["lateness"])
    figures: Record = {}
    for name in CONTENDERS:
        ms = sorted(v * 1000 for v in latencies[name])
        late = lateness_summary(lateness[name])
        late.pop("curve_ms", None)
        figures[name] = {
            "park_cpu_us": _median(park[name]),
            "wake_cpu_us": _median(wake[name]),
            "fanout_p50_ms": quantile(ms, 0.5),
            "fanout_p99_ms": quantile(ms, 0.99),
            "expiry_cpu_us": _median(expiry_cpu[name]),
            "expiry_lateness": late,
        }
    return figures


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return quantile(ordered, 0.5)
