"""``python -m bench proto-timer``: a C prototype of the timer core, measured by W3.

Would the wheel have to move to a hand-written extension to reach Kafka's flat
~110-160 ns per add+cancel at 1M pending? This answers with a prototype's
figures before committing to one. ``bench/proto/cwheel.c`` is that prototype: the
handle returned to Python is itself the node of its bucket's intrusive list,
handles are not tracked by the garbage collector and come from a pool of huge
pages (its header says what each of these is meant to buy). This command
compiles it with the interpreter's C compiler into ``build/proto/`` and runs
W3's own drivers (the same schedules, harness and sizes as ``python -m bench
w3``) on four contenders in one process: the harness, ``purgatory_aio.Timer``
(the build installed), the prototype, and ``loop.call_later``.

The prototype is not part of the library and nothing imports it outside this
command and its tests, which ``make bench-proto`` runs (never ``make test``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import math
import shlex
import subprocess
import sys
import sysconfig
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from purgatory_aio import LoopClock

from . import w3
from ._common import (
    RESULTS_DIR,
    Progress,
    Record,
    fmt,
    fmt_ratio,
    goal,
    make_record,
    mark_quick,
    publish,
    quiet_logs,
    ratio,
    resolve_loops,
)

SOURCE = Path(__file__).resolve().parent / "proto" / "cwheel.c"
BUILD_DIR = Path(__file__).resolve().parent.parent / "build" / "proto"


class BuildError(RuntimeError):
    """The prototype cannot be compiled here (no C compiler or no Python headers)."""


def load(build_dir: Path = BUILD_DIR, source: Path = SOURCE) -> ModuleType:
    """A prototype's compiled module (``source``'s stem), built on first use and again
    whenever its source changes."""
    text = source.read_bytes()
    digest = hashlib.sha256(text + sys.version.encode()).hexdigest()[:16]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    target = build_dir / digest / f"{source.stem}{suffix}"
    if not target.exists():
        _compile(source, target)
    spec = importlib.util.spec_from_file_location(source.stem, target)
    if spec is None or spec.loader is None:  # pragma: no cover - a file we just built
        raise BuildError(f"cannot load {target}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(source: Path, target: Path) -> None:
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise BuildError(f"the Python headers are missing ({include}/Python.h)")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    # -O2 as the wheel's mypyc extensions are built; no -march, so figures do not
    # depend on this machine's instruction set.
    command = [
        *compiler,
        "-O2",
        "-fPIC",
        "-shared",
        f"-I{include}",
        str(source),
        "-o",
        str(partial),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise BuildError(f"no C compiler ({compiler[0]} not found)") from None
    if done.returncode != 0:
        raise BuildError(f"compiling {source.name} failed:\n{done.stderr}")
    partial.replace(target)


class _Cancellable(Protocol):
    def cancel(self) -> object: ...


class ProtoTimer:
    """The prototype core on a running loop: one wake-up armed for its next bucket.

    Arming is deferred to the end of the loop iteration (``call_soon``), as the
    library's Timer does, so a timeout added and cancelled in one iteration costs
    no re-arming.
    """

    def __init__(self, cwheel: ModuleType) -> None:
        self._loop = asyncio.get_running_loop()
        # The library Timer's clock: time.monotonic, wake-ups armed through the loop.
        self._clock = LoopClock()
        self._core: Any = cwheel.Core(self._clock.time, self._sooner)
        self.call_later = self._core.call_later
        self._armed: _Cancellable | None = None
        self._soon = False

    def __len__(self) -> int:
        return len(self._core)

    def _sooner(self, when: float) -> None:
        if not self._soon:
            self._soon = True
            self._loop.call_soon(self._rearm)

    def _rearm(self) -> None:
        self._soon = False
        when = self._core.next_due()
        if when == self._core.armed_when:
            return
        self._disarm()
        if when < math.inf:
            self._core.armed_when = when
            self._armed = self._clock.call_at(when, self._due)

    def _disarm(self) -> None:
        if self._armed is not None:
            self._armed.cancel()
            self._armed = None
        self._core.armed_when = math.inf

    def _due(self) -> None:
        self._armed = None
        self._core.armed_when = math.inf
        self._core.advance(self._clock.time())
        self._rearm()

    def close(self) -> None:
        self._core.close()
        self._disarm()


def adders(cwheel: ModuleType) -> dict[str, w3.AdderFactory]:
    """W3's contenders with the prototype beside the library's Timer."""

    def proto() -> tuple[Any, w3.PendingTimer | None]:
        timer = ProtoTimer(cwheel)
        return timer.call_later, timer

    contenders = dict(w3.ADDERS)
    contenders["proto"] = proto
    return {name: contenders[name] for name in ("harness", "timer", "proto", "call_later")}


def build_record(
    loop_name: str, params: w3.W3Params, table: dict[str, dict[str, Record]]
) -> Record:
    small, large = str(min(params.sizes)), str(max(params.sizes))
    ratios: dict[str, float | None] = {}
    for size in map(str, params.sizes):
        for name in ("timer", "call_later"):
            ratios[f"add+cancel net N={size} proto/{name}"] = ratio(
                table["proto"][size]["net_ns_per_pair"], table[name][size]["net_ns_per_pair"]
            )
            ratios[f"add+expire N={size} proto/{name}"] = ratio(
                table["proto"][size]["expire_cpu_us_per_timer"],
                table[name][size]["expire_cpu_us_per_timer"],
            )
    for name in ("timer", "proto", "call_later"):
        ratios[f"{name} add+cancel N={large}/N={small}"] = ratio(
            table[name][large]["ns_per_pair"], table[name][small]["ns_per_pair"]
        )
        ratios[f"{name} add+cancel net N={large}/N={small}"] = ratio(
            table[name][large]["net_ns_per_pair"], table[name][small]["net_ns_per_pair"]
        )
        ratios[f"{name} add+cancel long net N={large}/N={small}"] = ratio(
            table[name][large]["net_long_ns_per_pair"], table[name][small]["net_long_ns_per_pair"]
        )
    net_large = table["proto"][large]["net_ns_per_pair"]
    flat = ratios[f"proto add+cancel N={large}/N={small}"]
    long_net = table["proto"][large]["net_long_ns_per_pair"]
    long_flat = ratios[f"proto add+cancel long net N={large}/N={small}"]
    note = "" if large == "1000000" else f"indicative: largest size run is {int(large):,}"
    goals = [
        goal(
            f"W3 prototype add+cancel of a random long delay, net, at N={large}",
            "<= 250 ns",
            long_net,
            long_net <= 250,
            note,
        ),
        goal(
            f"W3 prototype add+cancel of a random long delay, net, N={large} vs N={small}",
            "<= 1.3x",
            long_flat,
            long_flat is not None and long_flat <= 1.3,
            note,
        ),
        goal(
            f"W3 prototype churn net at N={large}",
            "<= 250 ns",
            net_large,
            net_large <= 250,
            note or "churn: cancels a random other pending timer (memory-bound)",
        ),
        goal(
            f"W3 prototype churn flatness N={large} vs N={small}",
            "<= 1.3x",
            flat,
            flat is not None and flat <= 1.3,
            note or "churn: cancels a random other pending timer (memory-bound)",
        ),
    ]

    def row(key: str, digits: int = 0) -> str:
        return " | ".join(
            fmt(table[name][large][key], digits) for name in ("timer", "proto", "call_later")
        )

    headline = [
        (
            f"add+cancel of a random long delay, net ns N={small}: timer | proto | call_later",
            " | ".join(
                fmt(table[n][small]["net_long_ns_per_pair"], 0)
                for n in ("timer", "proto", "call_later")
            ),
        ),
        (
            f"add+cancel of a random long delay, net ns N={large}: timer | proto | call_later",
            row("net_long_ns_per_pair"),
        ),
        (
            f"churn net ns N={small}: timer | proto | call_later",
            " | ".join(
                fmt(table[n][small]["net_ns_per_pair"], 0) for n in ("timer", "proto", "call_later")
            ),
        ),
        (f"churn net ns N={large}: timer | proto | call_later", row("net_ns_per_pair")),
        (
            f"churn ns N={large} (harness included): timer | proto | call_later",
            row("ns_per_pair"),
        ),
        (
            f"churn flatness N={large}/N={small}: timer | proto",
            f"{fmt_ratio(ratios[f'timer add+cancel N={large}/N={small}'])} | {fmt_ratio(flat)}",
        ),
        (
            f"add+cancel at once ns N={large}: timer | proto | call_later",
            row("immediate_ns_per_pair"),
        ),
        (
            f"add+expire CPU us N={large}: timer | proto | call_later",
            row("expire_cpu_us_per_timer", 2),
        ),
    ]
    return make_record(
        "proto-timer",
        loop_name,
        asdict(params),
        {"contenders": table},
        ratios=ratios,
        goals=goals,
        headline=headline,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench proto-timer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="sizes up to 100k, 50k pairs")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--plain", action="store_true", help="plain progress lines, no rich")
    w3.add_arguments(parser)
    args = parser.parse_args(argv)
    quiet_logs()
    mark_quick(args.quick)
    try:
        cwheel = load()
    except BuildError as exc:
        print(f"python -m bench proto-timer: {exc}", file=sys.stderr)
        return 2
    params = w3.params_from_args(args)
    progress = Progress(plain=args.plain)
    progress.section("proto-timer: the C prototype of the timer core on W3's drivers")
    contenders = adders(cwheel)
    for loop_name in resolve_loops(args.loop, progress):
        table = w3.measure(loop_name, params, progress, contenders, label="proto-timer")
        publish(build_record(loop_name, params, table), loop_name, progress, args.results_dir)
    return 0
