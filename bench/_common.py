"""Plumbing shared by every workload: loops, measurement, statistics, records, progress."""

from __future__ import annotations

import asyncio
import datetime as _dt
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCHEMA = 1
LOOP_NAMES = ("asyncio", "uvloop")

Record = dict[str, Any]

# -- event loops ------------------------------------------------------------------------------


def uvloop_version() -> str | None:
    try:
        import uvloop
    except ImportError:
        return None
    return str(getattr(uvloop, "__version__", "unknown"))


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "asyncio":
        return asyncio.new_event_loop
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    raise ValueError(f"unknown event loop {name!r}; expected one of {LOOP_NAMES}")


def resolve_loops(choice: str, progress: Progress) -> list[str]:
    """The loops to run for ``--loop asyncio|uvloop|both``; uvloop only if importable."""
    wanted = list(LOOP_NAMES) if choice == "both" else [choice]
    if "uvloop" in wanted and uvloop_version() is None:
        if choice == "uvloop":
            raise SystemExit("uvloop is not installed: pip install 'purgatory-aio[bench]'")
        progress.info("uvloop is not installed: running on the asyncio loop only")
        wanted.remove("uvloop")
    return wanted


def run_on(loop_name: str, main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``main()`` on a fresh loop of the given kind (a fresh loop per measurement,
    so no contender inherits another's timer heap or ready queue)."""
    with asyncio.Runner(loop_factory=loop_factory(loop_name)) as runner:
        return runner.run(main())


# -- measurement ------------------------------------------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size now (Linux ``/proc``; peak RSS elsewhere, the best available)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


@contextmanager
def quiesced() -> Iterator[None]:
    """Collect garbage and freeze what survives for the duration of a measurement.

    The schedules (a million tuples and floats) would otherwise be rescanned by
    every full collection during the run, charging the harness's objects to
    whichever contender triggered the collection. GC itself stays enabled: the
    contenders' own objects are collected as they would be in a server.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@dataclass(slots=True)
class Meter:
    """Wall and process CPU time over a ``with`` block."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    _wall0: float = 0.0
    _cpu0: float = 0.0

    def __enter__(self) -> Meter:
        self._cpu0 = time.process_time()
        self._wall0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._wall0
        self.cpu_s = time.process_time() - self._cpu0


def median_run(runs: Sequence[Record], key: str) -> Record:
    """The run whose ``key`` is the median (lower median for an even count)."""
    ordered = sorted(runs, key=lambda r: float(r[key]))
    return ordered[(len(ordered) - 1) // 2]


def alternate(
    names: Sequence[str], repeat: int, run_one: Callable[[str], Record]
) -> dict[str, list[Record]]:
    """Run every contender ``repeat`` times, reversing the order on every other round
    so warm-up and heap growth do not always favour the same one."""
    runs: dict[str, list[Record]] = {name: [] for name in names}
    for round_ in range(repeat):
        order = list(names) if round_ % 2 == 0 else list(reversed(names))
        for name in order:
            runs[name].append(run_one(name))
    return runs


# -- statistics -------------------------------------------------------------------------------


def quantile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of an already sorted sequence."""
    if not ordered:
        return float("nan")
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def lateness_summary(seconds: Sequence[float], curve_points: int = 101) -> Record:
    """Percentiles of lateness (fire time minus deadline) in milliseconds.

    ``curve`` holds ``curve_points`` evenly spaced quantiles, enough to draw the
    distribution later without keeping every sample in the record.
    """
    ordered = sorted(seconds)
    n = len(ordered)
    if n == 0:
        return {"count": 0, "early": 0}
    ms = [v * 1000.0 for v in ordered]
    step = 1.0 / (curve_points - 1)
    return {
        "count": n,
        "early": sum(1 for v in ordered if v < 0.0),
        "min_ms": ms[0],
        "p50_ms": quantile(ms, 0.50),
        "p90_ms": quantile(ms, 0.90),
        "p99_ms": quantile(ms, 0.99),
        "p999_ms": quantile(ms, 0.999),
        "max_ms": ms[-1],
        "mean_ms": sum(ms) / n,
        "curve_ms": [round(quantile(ms, i * step), 4) for i in range(curve_points)],
    }


def distinct_keys(uniform: Callable[[], float], count: int, space: int) -> tuple[int, ...]:
    """``count`` distinct keys drawn uniformly from ``range(space)``."""
    chosen: list[int] = []
    while len(chosen) < count:
        key = int(uniform() * space)
        if key not in chosen:
            chosen.append(key)
    return tuple(chosen)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


# -- environment and records ------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


@cache
def environment() -> Record:
    """Machine, interpreter and source version, captured once per process."""
    cpu_model = platform.processor() or "unknown"
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    mem_gb = None
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
            break
    import purgatory_aio

    library_version = purgatory_aio.__version__
    # Dirty means a source change: the records and charts under bench/results do not count.
    status = _git("status", "--porcelain", "--", "purgatory_aio", "bench", ":!bench/results")
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "mem_total_gb": mem_gb,
        "purgatory_aio": library_version,
        # Which build of the core ran: mypyc-compiled extension modules, or pure Python.
        "build": "compiled" if purgatory_aio.compiled else "pure",
        "uvloop": uvloop_version(),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
    }


def goal(name: str, target: str, value: float | None, met: bool | None, note: str = "") -> Record:
    return {"goal": name, "target": target, "value": value, "met": met, "note": note}


_RUN = {"quick": False}


def mark_quick(quick: bool) -> None:
    """Tag the records of this process as a ``--quick`` run: the report prefers full
    runs, so a smoke run does not displace the figures a full run produced."""
    _RUN["quick"] = quick


def make_record(
    workload: str,
    loop: str,
    params: Mapping[str, Any],
    results: Mapping[str, Any],
    *,
    ratios: Mapping[str, float | None] | None = None,
    goals: Sequence[Record] = (),
    headline: Sequence[tuple[str, str]] = (),
) -> Record:
    """One run of one workload on one loop, in the shape every record shares."""
    return {
        "schema": SCHEMA,
        "workload": workload,
        "loop": loop,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "quick": _RUN["quick"],
        "params": dict(params),
        "env": {
            **environment(),
            # Other work on the machine, for reading the figures (ratios are what hold).
            "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        },
        "results": dict(results),
        "ratios": dict(ratios or {}),
        "goals": list(goals),
        "headline": [list(item) for item in headline],
    }


def publish(record: Record, loop_name: str, progress: Progress, results_dir: Path | None) -> Record:
    """Show a record's headline figures and write it under ``results_dir`` (if given)."""
    for label, value in record["headline"]:
        progress.result(f"{loop_name:8} {label}: {value}")
    if results_dir is not None:
        write_record(record, results_dir)
    return record


def write_record(record: Record, results_dir: Path) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    path = results_dir / f"{record['workload']}-{record['loop']}-{stamp}.json"
    path.write_text(json.dumps(record, indent=1, allow_nan=False, default=_jsonable) + "\n")
    return path


def _jsonable(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {value!r} into a record")


def finite(value: float) -> float | None:
    """JSON has no NaN/inf: such figures become null."""
    return value if value == value and abs(value) != float("inf") else None


# -- progress ---------------------------------------------------------------------------------


class Ticker:
    """Progress of one measured task. ``advance`` is cheap: it redraws at most a few
    times a second, and never from a background thread, whose CPU and GIL use would
    land inside the measurement."""

    def advance(self, n: int = 1) -> None:
        pass


class _RichTicker(Ticker):
    __slots__ = ("_next", "_progress", "_task")

    def __init__(self, progress: Any, task: Any) -> None:
        self._progress = progress
        self._task = task
        self._next = 0.0

    def advance(self, n: int = 1) -> None:
        self._progress.advance(self._task, n)
        now = time.monotonic()
        if now >= self._next:
            self._next = now + 0.25
            self._progress.refresh()


class Progress:
    """Console output while running: rich when installed and on a terminal, plain lines
    otherwise (``plain=True`` forces plain, e.g. under CI)."""

    def __init__(self, plain: bool = False, quiet: bool = False) -> None:
        self._quiet = quiet
        self._console: Any = None
        if not plain and not quiet:
            try:
                from rich.console import Console
            except ImportError:
                pass
            else:
                console = Console()
                if console.is_terminal:
                    self._console = console

    def section(self, title: str) -> None:
        if self._quiet:
            return
        if self._console is not None:
            self._console.rule(f"[bold]{title}")
        else:
            print(f"== {title}", flush=True)

    def info(self, message: str) -> None:
        if self._quiet:
            return
        if self._console is not None:
            self._console.print(message, markup=False, highlight=False)
        else:
            print(message, flush=True)

    def result(self, message: str) -> None:
        if self._quiet:
            return
        if self._console is not None:
            self._console.print(f"[bold green]>[/] {message}", highlight=False)
        else:
            print(f"> {message}", flush=True)

    @contextmanager
    def task(self, description: str, total: int | None = None) -> Iterator[Ticker]:
        if self._quiet:
            yield Ticker()
            return
        if self._console is None:
            print(f"   {description} ...", flush=True)
            yield Ticker()
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as RichProgress

        bar = RichProgress(
            TextColumn("   {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self._console,
            auto_refresh=False,
            transient=True,
        )
        with bar:
            task_id = bar.add_task(description, total=total)
            yield _RichTicker(bar, task_id)


# -- formatting -------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 1000 and digits <= 2:
        return f"{value:,.0f}{unit}"
    return f"{value:.{digits}f}{unit}"


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


# -- settlement accounting shared by every contender ------------------------------------------


class Settlements:
    """Counts settled operations and keeps expiration lateness.

    Every contender reports to one of these through the same two method calls, so
    the bookkeeping costs them all the same. ``done`` resolves once ``target``
    operations settled; :meth:`wake_when` lets a driver sleep until some number
    have settled instead of polling.
    """

    __slots__ = (
        "_waiter",
        "completed",
        "done",
        "expired",
        "lateness",
        "settled",
        "target",
        "wake_at",
    )

    def __init__(self, target: int) -> None:
        self.target = target
        self.completed = 0
        self.expired = 0
        self.settled = 0
        self.lateness: list[float] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter: asyncio.Future[None] | None = None
        self.wake_at = target  # the next settled count worth a look (one compare per settle)
        if target <= 0:
            self.done.set_result(None)

    def completed_one(self) -> None:
        self.completed += 1
        self.settled += 1
        if self.settled >= self.wake_at:
            self._reached()

    def expired_one(self, lateness: float) -> None:
        self.expired += 1
        self.lateness.append(lateness)
        self.settled += 1
        if self.settled >= self.wake_at:
            self._reached()

    def wake_when(self, settled: int, waiter: asyncio.Future[None]) -> None:
        """Resolve ``waiter`` once ``settled`` operations have settled."""
        self._waiter = waiter
        self.wake_at = min(settled, self.target)

    def _reached(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self.settled >= self.target:
            if not self.done.done():
                self.done.set_result(None)
            self.wake_at = 1 << 62
        else:
            self.wake_at = self.target


def quiet_logs() -> None:
    """The benchmark is the application here, so it configures the library's structlog
    output: warnings and errors only, none of the per-purgatory start/shutdown lines."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
