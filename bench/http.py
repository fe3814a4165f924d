"""HTTP: long polls against the example broker servers, versus the naive handler.

For each framework (FastAPI on uvicorn, aiohttp) and each event loop, one server
process (:mod:`bench._http_server`) serves three sets of the same routes on one
in-process broker, differing only in how a long poll waits:

* ``integration``: the example's routes (:mod:`examples.fastapi_broker`,
  :mod:`examples.aiohttp_broker`): a ``DelayedFetch`` watched through the
  integration's ``watch_and_wait``, which also listens for the client leaving;
* ``purgatory``: the same ``DelayedFetch`` awaited with the core's
  ``Purgatory.watch_and_wait``: a coroutine per request awaiting the purgatory's
  operation, the contender the naive handler is measured against;
* ``naive``: the *naive-handler* baseline: the handler registers a future in
  a ``dict[key, set[future]]`` and awaits it under ``asyncio.timeout(max_wait)``;
  the produce route resolves the futures of its partition.

Parsing, the broker calls and the JSON answers are shared; a poll that can be
answered at once never waits in any of them.

Load comes from this process (aiohttp client, uvloop when installed), on
loopback only:

* *fan-out*: ``clients`` long polls park on one partition, then one record is
  produced; the latency of each answer is measured from just before the
  produce request is sent (p50/p99 over ``rounds`` rounds; the contenders take
  turns, in a rotating order);
* *sustained*: for ``duration`` seconds per contender (in slices, the
  contenders taking turns) each client polls from its next offset in a loop
  while one producer appends records back to back; answered polls and
  produces per second, and the server's CPU time per answered poll.

Each loop's run writes a record (workload ``http``) under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ._common import (
    REPO_ROOT,
    RESULTS_DIR,
    Progress,
    Record,
    fmt,
    fmt_ratio,
    make_record,
    quantile,
    quiet_logs,
    ratio,
    resolve_loops,
    run_on,
    uvloop_version,
    write_record,
)

FRAMEWORKS = ("fastapi", "aiohttp")
CONTENDERS = ("integration", "purgatory", "naive")
#: Route prefix of each contender (see bench/_http_server.py).
PREFIX = {"integration": "", "purgatory": "/core", "naive": "/naive"}
#: The sustained phase is cut into slices, the contenders taking turns.
SLICES = 3
MAX_CLIENTS = 2000
MAX_ROUNDS = 50
MAX_DURATION = 30.0
#: Upper bound on any wait of the harness: a hang guard, not a measurement.
GUARD = 60.0


@dataclass(frozen=True, slots=True)
class HttpParams:
    clients: int = 500
    rounds: int = 6
    duration: float = 3.0
    max_wait_ms: int = 30_000

    def checked(self) -> HttpParams:
        if not 1 <= self.clients <= MAX_CLIENTS:
            raise SystemExit(f"--clients must be 1 to {MAX_CLIENTS}, got {self.clients}")
        if not 1 <= self.rounds <= MAX_ROUNDS:
            raise SystemExit(f"--rounds must be 1 to {MAX_ROUNDS}, got {self.rounds}")
        if not 0 < self.duration <= MAX_DURATION:
            raise SystemExit(f"--duration must be in (0, {MAX_DURATION}], got {self.duration}")
        # Each client holds a connection; leave room for the server's side and the rest.
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and self.clients + 64 > soft:
            raise SystemExit(f"--clients {self.clients} needs more file descriptors ({soft})")
        return self


QUICK = HttpParams(clients=200, rounds=4, duration=1.5)


# -- the load -------------------------------------------------------------------------------


@dataclass(slots=True)
class ContenderFigures:
    latencies: list[float]
    answers: int = 0
    produces: int = 0
    sustained_s: float = 0.0
    server_cpu_s: float = 0.0

    def summary(self) -> Record:
        ordered = sorted(self.latencies)
        ms = [v * 1000 for v in ordered]
        polls_per_s = self.answers / self.sustained_s if self.sustained_s else None
        requests = self.answers + self.produces
        return {
            "fanout_answers": len(ms),
            "latency_p50_ms": quantile(ms, 0.50) if ms else None,
            "latency_p99_ms": quantile(ms, 0.99) if ms else None,
            "latency_max_ms": ms[-1] if ms else None,
            "sustained_s": self.sustained_s,
            "polls_answered": self.answers,
            "produces": self.produces,
            "polls_per_s": polls_per_s,
            "requests_per_s": requests / self.sustained_s if self.sustained_s else None,
            "server_cpu_us_per_poll": (
                self.server_cpu_s / self.answers * 1e6 if self.answers else None
            ),
        }


class Load:
    """Drives one server from this process."""

    def __init__(self, session: Any, params: HttpParams) -> None:
        self._session = session
        self._params = params
        self._offsets = {contender: 0 for contender in CONTENDERS}

    @staticmethod
    def topic(contender: str) -> str:
        return f"bench-{contender}"

    def _records(self, contender: str) -> str:
        return f"{PREFIX[contender]}/topics/{self.topic(contender)}/partitions/0/records"

    async def state(self) -> dict[str, float]:
        async with self._session.get("/bench/state") as response:
            state: dict[str, float] = await response.json()
            return state

    async def _produce(self, contender: str) -> int:
        body = {"records": [{"key": None, "value": "x" * 100}]}
        url = self._records(contender)
        async with self._session.post(url, params={"acks": "1"}, json=body) as response:
            answer = await response.json()
            if response.status != 200:
                raise RuntimeError(f"produce failed: {response.status} {answer}")
            return int(answer["base_offset"])

    async def _poll(self, contender: str, offset: int, max_wait_ms: int) -> dict[str, Any]:
        params = {"offset": str(offset), "max_wait_ms": str(max_wait_ms)}
        async with self._session.get(self._records(contender), params=params) as response:
            answer: dict[str, Any] = await response.json()
            if response.status != 200:
                raise RuntimeError(f"poll failed: {response.status} {answer}")
            return answer

    async def warm_up(self) -> None:
        for contender in CONTENDERS:
            # Creates the topic and opens the connections the rounds will reuse.
            await asyncio.gather(
                *(self._poll(contender, 0, 0) for _ in range(self._params.clients))
            )

    async def fanout_round(self, contender: str, figures: ContenderFigures) -> None:
        clients = self._params.clients
        offset = self._offsets[contender]
        answered: list[float] = []

        async def poll() -> None:
            answer = await self._poll(contender, offset, self._params.max_wait_ms)
            answered.append(time.perf_counter())
            if len(answer["records"]) != 1:
                raise RuntimeError(f"a poll answered {answer!r}")

        polls = [asyncio.ensure_future(poll()) for _ in range(clients)]
        try:
            async with asyncio.timeout(GUARD):
                # The condition lives in the server process: ask until it holds.
                while (await self.state())[contender] < clients:  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
                sent = time.perf_counter()
                self._offsets[contender] = await self._produce(contender) + 1
                await asyncio.gather(*polls)
        finally:
            for task in polls:
                task.cancel()
        figures.latencies.extend(t - sent for t in answered)

    async def sustained(self, contender: str, figures: ContenderFigures, duration: float) -> None:
        running = True
        answers = produces = 0

        async def client() -> None:
            nonlocal answers
            offset = self._offsets[contender]
            while running:
                answer = await self._poll(contender, offset, 1000)
                if running:
                    answers += 1
                offset += len(answer["records"])

        async def producer() -> None:
            nonlocal produces
            while running:
                last = await self._produce(contender)
                if running:
                    produces += 1
                self._offsets[contender] = last + 1

        cpu0 = (await self.state())["cpu_s"]
        tasks = [asyncio.ensure_future(client()) for _ in range(self._params.clients)]
        tasks.append(asyncio.ensure_future(producer()))
        start = time.perf_counter()
        await asyncio.sleep(duration)
        running = False
        elapsed = time.perf_counter() - start
        cpu1 = (await self.state())["cpu_s"]
        # Let the last polls end on their own (a poll waits at most 1 s): cancelling
        # them would disconnect clients, which is not what this phase measures.
        async with asyncio.timeout(GUARD):
            await self._produce(contender)
            await asyncio.gather(*tasks)
        figures.answers += answers
        figures.produces += produces
        figures.sustained_s += elapsed
        figures.server_cpu_s += cpu1 - cpu0


def rotated(turn: int) -> tuple[str, ...]:
    """The contenders in a different order each turn, so none always goes first."""
    shift = turn % len(CONTENDERS)
    return CONTENDERS[shift:] + CONTENDERS[:shift]


@contextlib.asynccontextmanager
async def server_process(framework: str, loop_name: str) -> AsyncIterator[int]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.http",
        "--serve",
        framework,
        "--server-loop",
        loop_name,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    assert process.stdout is not None and process.stdin is not None
    try:
        async with asyncio.timeout(GUARD):
            line = (await process.stdout.readline()).decode()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the {framework} server did not start (said {line!r})")
        yield int(line.split()[1])
    finally:
        process.stdin.close()
        try:
            async with asyncio.timeout(GUARD):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()


async def measure(framework: str, loop_name: str, params: HttpParams, progress: Progress) -> Record:
    import aiohttp

    figures = {contender: ContenderFigures([]) for contender in CONTENDERS}
    async with server_process(framework, loop_name) as port:
        connector = aiohttp.TCPConnector(limit=params.clients + 16, force_close=False)
        timeout = aiohttp.ClientTimeout(total=GUARD)
        async with aiohttp.ClientSession(
            f"http://127.0.0.1:{port}", connector=connector, timeout=timeout
        ) as session:
            load = Load(session, params)
            await load.warm_up()
            turns = params.rounds * len(CONTENDERS)
            with progress.task(f"{framework} fan-out", total=turns) as ticker:
                for round_ in range(params.rounds):
                    for contender in rotated(round_):
                        await load.fanout_round(contender, figures[contender])
                        ticker.advance()
            turns = SLICES * len(CONTENDERS)
            with progress.task(f"{framework} sustained", total=turns) as ticker:
                for slice_ in range(SLICES):
                    for contender in rotated(slice_):
                        await load.sustained(
                            contender, figures[contender], params.duration / SLICES
                        )
                        ticker.advance()
    return {contender: figures[contender].summary() for contender in CONTENDERS}


def run_loop(
    loop_name: str, frameworks: tuple[str, ...], params: HttpParams, progress: Progress
) -> Record:
    client_loop = "uvloop" if uvloop_version() is not None else "asyncio"
    results: Record = {}
    ratios: dict[str, float | None] = {}
    headline: list[tuple[str, str]] = []
    for framework in frameworks:

        async def main(framework: str = framework) -> Record:
            return await measure(framework, loop_name, params, progress)

        figures = run_on(client_loop, main)
        results[framework] = figures
        naive = figures["naive"]
        for contender in ("integration", "purgatory"):
            mine = figures[contender]
            for name, key in (
                ("latency_p50", "latency_p50_ms"),
                ("latency_p99", "latency_p99_ms"),
                ("polls_per_s", "polls_per_s"),
                ("server_cpu_per_poll", "server_cpu_us_per_poll"),
            ):
                ratios[f"{framework}.{contender}.{name}"] = ratio(mine[key], naive[key])
        headline.extend(_headline(framework, figures))
    record_params = {
        **asdict(params),
        "frameworks": list(frameworks),
        "client_loop": client_loop,
        "server": "subprocess, loopback",
        "broker": "1 partition, replication factor 1, acks=1, 100-byte records",
    }
    return make_record("http", loop_name, record_params, results, ratios=ratios, headline=headline)


@dataclass(frozen=True, slots=True)
class HandlerParams:
    clients: int = 10_000
    rounds: int = 5
    timeout: float = 0.05

    def checked(self) -> HandlerParams:
        if not 1 <= self.clients <= 200_000:
            raise SystemExit(f"--handler-clients must be 1 to 200000, got {self.clients}")
        return self


def run_handler(loop_name: str, params: HandlerParams, progress: Progress) -> Record:
    from . import _handler

    async def main() -> Record:
        return await _handler.measure(params.clients, params.rounds, params.timeout)

    with progress.task(f"handler on {loop_name}"):
        figures = run_on(loop_name, main)
    ratios: dict[str, float | None] = {}
    naive = figures["naive"]
    for contender in ("integration", "purgatory"):
        for key in ("park_cpu_us", "wake_cpu_us", "fanout_p99_ms", "expiry_cpu_us"):
            ratios[f"{contender}.{key}"] = ratio(figures[contender][key], naive[key])

    def line(key: str, digits: int) -> str:
        parts = []
        for contender in _handler.CONTENDERS:
            value = figures[contender][key]
            text = f"{contender} {fmt(value, digits)}"
            if contender != "naive":
                text += f" ({fmt_ratio(ratio(value, naive[key]))})"
            parts.append(text)
        return ", ".join(parts)

    headline = [
        ("park CPU µs/request", line("park_cpu_us", 1)),
        ("wake CPU µs/request", line("wake_cpu_us", 1)),
        ("fan-out p99 ms", line("fanout_p99_ms", 2)),
        ("expiry CPU µs/request", line("expiry_cpu_us", 1)),
        (
            "expiry lateness p99 ms",
            ", ".join(
                f"{c} {fmt(figures[c]['expiry_lateness'].get('p99_ms'), 2)}"
                for c in _handler.CONTENDERS
            ),
        ),
    ]
    return make_record(
        "handler", loop_name, asdict(params), figures, ratios=ratios, headline=headline
    )


def _headline(framework: str, figures: Record) -> list[tuple[str, str]]:
    def line(key: str, digits: int, ratios: bool) -> str:
        naive = figures["naive"][key]
        parts = []
        for contender in CONTENDERS:
            value = figures[contender][key]
            text = f"{contender} {fmt(value, digits)}"
            if ratios and contender != "naive":
                text += f" ({fmt_ratio(ratio(value, naive))})"
            parts.append(text)
        return ", ".join(parts)

    return [
        (f"{framework} fan-out p50 ms", line("latency_p50_ms", 1, True)),
        (f"{framework} fan-out p99 ms", line("latency_p99_ms", 1, True)),
        (f"{framework} polls/s", line("polls_per_s", 0, True)),
        (f"{framework} server CPU µs/poll", line("server_cpu_us_per_poll", 1, True)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench http", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="fewer clients, rounds, seconds")
    parser.add_argument("--clients", type=int, default=None, help="concurrent long polls")
    parser.add_argument("--rounds", type=int, default=None, help="fan-out rounds per contender")
    parser.add_argument("--duration", type=float, default=None, help="sustained seconds")
    parser.add_argument("--framework", choices=(*FRAMEWORKS, "both"), default="both")
    parser.add_argument(
        "--part",
        choices=("http", "handler", "both"),
        default="both",
        help="HTTP servers, in-process request handlers, or both (default)",
    )
    parser.add_argument(
        "--handler-clients", type=int, default=None, help="waiting requests of the handler part"
    )
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-write", action="store_true", help="print, write no record")
    parser.add_argument("--plain", action="store_true", help="plain progress output")
    parser.add_argument("--serve", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    parser.add_argument("--server-loop", default="asyncio", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        from ._http_server import serve

        return serve(args.serve, args.server_loop)

    base = QUICK if args.quick else HttpParams()
    overrides = {
        name: value
        for name in ("clients", "rounds", "duration")
        if (value := getattr(args, name)) is not None
    }
    params = replace(base, **overrides).checked()
    handler = HandlerParams(clients=2_000, rounds=3) if args.quick else HandlerParams()
    if args.handler_clients is not None:
        handler = replace(handler, clients=args.handler_clients)
    handler = handler.checked()
    frameworks = FRAMEWORKS if args.framework == "both" else (args.framework,)
    quiet_logs()
    progress = Progress(plain=args.plain)
    records: list[Record] = []
    loops = resolve_loops(args.loop, progress)
    if args.part in ("handler", "both"):
        progress.section(
            f"handler: {handler.clients} waiting requests, {handler.rounds} rounds, in process"
        )
        records += [run_handler(loop_name, handler, progress) for loop_name in loops]
    if args.part in ("http", "both"):
        progress.section(
            f"http: {params.clients} long polls, {params.rounds} fan-out rounds, "
            f"{params.duration:g}s sustained"
        )
        for loop_name in loops:
            progress.info(f"server loop: {loop_name}")
            records.append(run_loop(loop_name, frameworks, params, progress))
    for record in records:
        for label, text in record["headline"]:
            progress.result(f"[{record['workload']} {record['loop']}] {label}: {text}")
        if not args.no_write:
            path = write_record(record, args.results_dir)
            progress.info(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
