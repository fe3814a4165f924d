"""W3: the timer core against the event loop's own timers, at growing pending counts.

For each pending count ``N``, fill ``N`` timers (delays uniform over 10-20 min,
so none fires), then measure, keeping exactly ``N`` pending throughout:

* **add+cancel of a random long delay** (the goal's figure): add a timer due at a
  random delay drawn like the pending ones and cancel it, ``pairs`` times. This is
  what a request costs the timer when it completes before its timeout, among ``N``
  others: what Kafka's timer does per satisfied operation, and what the figure
  measured for Kafka's Java timer counts. Reported as ns per pair.
* **churn** (harsher, reported beside it): ``pairs`` times cancel a *random
  other* pending handle and add a new one in its place. Reaching one of a million
  handles at random is a cache miss into memory for any timer (and the harness's
  handles are one shared object, so the miss is charged to the contender): a C
  prototype of the wheel measured once paid it too, so this figure grows
  with ``N`` in any implementation and measures the memory as much as the code.
* **add+cancel at once**: as the first, with a 0.2 s timer, so the short timer's
  slot is the earliest one pending.
* **add+expire**: add ``N`` timers due uniformly within ``expire_spread`` seconds
  and let them all fire; process CPU per timer (the idle wait costs none).

The loop gets control every ``chunk`` pairs so asyncio can compact its heap of
cancelled handles as it would in a server.

Contenders: ``timer`` (:class:`purgatory_aio.Timer`), ``call_later``
(``loop.call_later`` + ``TimerHandle.cancel``), and ``harness``, the same loops
around a do-nothing add/cancel, whose cost is subtracted for the net figures.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import purgatory_aio
from purgatory_aio import Timer

from ._common import (
    Progress,
    Record,
    fmt,
    fmt_ratio,
    goal,
    make_record,
    publish,
    quiesced,
    ratio,
    run_on,
)


@dataclass(frozen=True, slots=True)
class W3Params:
    sizes: tuple[int, ...] = (1_000, 10_000, 100_000, 1_000_000)
    pairs: int = 200_000
    chunk: int = 1024
    min_delay: float = 600.0
    max_delay: float = 1200.0
    short_delay: float = 0.2
    budget_s: float = 20.0  # most CPU seconds spent on one size's add+cancel pairs
    expire_spread: float = 1.0
    seed: int = 1


class _NullHandle:
    __slots__ = ()

    def cancel(self) -> None:
        pass


_NULL = _NullHandle()


def _null_add(delay: float, callback: Callable[..., object], *args: Any) -> _NullHandle:
    return _NULL


def _never() -> None:  # pragma: no cover - the churn timers never fire
    raise AssertionError("a churn timer fired")


class PendingTimer(Protocol):
    """What a contender's timer offers the drivers besides its add function."""

    def __len__(self) -> int: ...

    def close(self) -> None: ...


#: A contender: called on the running loop, it returns the add function
#: (``add(delay, callback, *args) -> handle with cancel()``) and the timer, if any.
AdderFactory = Callable[[], tuple[Callable[..., Any], PendingTimer | None]]


def _timer() -> tuple[Callable[..., Any], PendingTimer | None]:
    timer = Timer()
    return timer.call_later, timer


ADDERS: dict[str, AdderFactory] = {
    "harness": lambda: (_null_add, None),
    "timer": _timer,
    "call_later": lambda: (asyncio.get_running_loop().call_later, None),
}


async def _churn(
    name: str, size: int, params: W3Params, adders: dict[str, AdderFactory] = ADDERS
) -> Record:
    rng = random.Random(params.seed * 1_000_003 + size)
    lo, span = params.min_delay, params.max_delay - params.min_delay
    pairs = params.pairs
    delays = [lo + span * rng.random() for _ in range(size + pairs)]
    long_delays = [lo + span * rng.random() for _ in range(pairs)]
    victims = [int(rng.random() * size) for _ in range(pairs)]
    add, timer = adders[name]()
    perf, cpu = time.perf_counter, time.process_time
    initial = delays[:size]
    t0 = perf()
    handles = [add(delay, _never) for delay in initial]
    fill_s = perf() - t0
    await asyncio.sleep(0)
    chunk = params.chunk
    budget = params.budget_s
    done = 0
    t0, c0 = perf(), cpu()
    for start in range(0, pairs, chunk):
        stop = min(pairs, start + chunk)
        for j in range(start, stop):
            victim = victims[j]
            handles[victim].cancel()
            handles[victim] = add(delays[size + j], _never)
        done = stop
        await asyncio.sleep(0)
        if cpu() - c0 > budget:  # a contender that degrades badly: enough to know its cost
            break
    wall, cpu_s = perf() - t0, cpu() - c0
    # The request-timeout pattern: a short timeout added and cancelled at once (the
    # request completed), among the N long ones. Its bucket is the earliest pending.
    quick_pairs = min(pairs, 50_000)
    immediate_s = await _add_cancel_at_once(add, [params.short_delay] * quick_pairs, chunk)
    # A random long delay added and cancelled at once, among the N pending.
    long_s = await _add_cancel_at_once(add, long_delays, chunk)
    pending = len(timer) if timer is not None else size
    for handle in handles:
        handle.cancel()
    if timer is not None:
        timer.close()
    return {
        "pending": pending,
        "fill_ns_per_add": fill_s / size * 1e9,
        "pairs": done,
        # Process CPU time is the figure: these machines are shared, and wall time
        # there measures the neighbours as much as the code.
        "long_ns_per_pair": long_s / pairs * 1e9,
        "ns_per_pair": cpu_s / done * 1e9,
        "wall_ns_per_pair": wall / done * 1e9,
        "immediate_ns_per_pair": immediate_s / quick_pairs * 1e9,
    }


async def _add_cancel_at_once(add: Callable[..., Any], delays: list[float], chunk: int) -> float:
    """Add a timer at each delay and cancel it straight away; process CPU seconds."""
    cpu = time.process_time
    c0 = cpu()
    for start in range(0, len(delays), chunk):
        for delay in delays[start : start + chunk]:
            add(delay, _never).cancel()
        await asyncio.sleep(0)
    return cpu() - c0


async def _expire(
    name: str, size: int, params: W3Params, adders: dict[str, AdderFactory] = ADDERS
) -> Record:
    rng = random.Random(params.seed * 7_000_003 + size)
    spread = params.expire_spread
    delays = [spread * rng.random() for _ in range(size)]
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    fired = 0

    def on_fire() -> None:
        nonlocal fired
        fired += 1
        if fired == size:
            done.set_result(None)

    add, timer = adders[name]()
    perf, cpu = time.perf_counter, time.process_time
    t0, c0 = perf(), cpu()
    for delay in delays:
        add(delay, on_fire)
    if name == "harness":
        fired = size
    else:
        async with asyncio.timeout(spread + 60):
            await done
    wall, cpu_s = perf() - t0, cpu() - c0
    if timer is not None:
        timer.close()
    return {
        "fired": fired,
        "expire_wall_s": wall,
        "expire_cpu_us_per_timer": cpu_s / size * 1e6,
        "expire_per_cpu_s": size / cpu_s if cpu_s > 0 else None,
    }


def run(
    params: W3Params, loops: list[str], progress: Progress, results_dir: Path | None
) -> list[Record]:
    progress.section(f"w3 timer core: pending {', '.join(f'{s:,}' for s in params.sizes)}")
    records = []
    for loop_name in loops:
        table = measure(loop_name, params, progress)
        records.append(
            publish(_build_record(loop_name, params, table), loop_name, progress, results_dir)
        )
    return records


def measure(
    loop_name: str,
    params: W3Params,
    progress: Progress,
    adders: dict[str, AdderFactory] = ADDERS,
    label: str = "w3",
) -> dict[str, dict[str, Record]]:
    """Every contender of ``adders`` at every size, with figures net of the harness."""
    table: dict[str, dict[str, Record]] = {name: {} for name in adders}
    for size in params.sizes:
        for name in adders:
            with progress.task(f"{label} {loop_name} N={size:,} {name}"), quiesced():
                churn = run_on(
                    loop_name,
                    lambda name=name, size=size: _churn(name, size, params, adders),  # type: ignore[misc]
                )
            with quiesced():
                expire = run_on(
                    loop_name,
                    lambda name=name, size=size: _expire(name, size, params, adders),  # type: ignore[misc]
                )
            if expire["fired"] != size:
                raise RuntimeError(f"{label} {name}: {expire['fired']} of {size} timers fired")
            table[name][str(size)] = {**churn, **expire}
    harness = table["harness"]
    for name, rows in table.items():
        if name == "harness":
            continue
        for size_key, row in rows.items():
            base = harness[size_key]
            row["net_ns_per_pair"] = row["ns_per_pair"] - base["ns_per_pair"]
            row["net_long_ns_per_pair"] = row["long_ns_per_pair"] - base["long_ns_per_pair"]
            row["net_expire_cpu_us_per_timer"] = (
                row["expire_cpu_us_per_timer"] - base["expire_cpu_us_per_timer"]
            )
    return table


def _build_record(loop_name: str, params: W3Params, table: dict[str, dict[str, Record]]) -> Record:
    small, large = str(min(params.sizes)), str(max(params.sizes))
    timer, call_later = table["timer"], table["call_later"]
    ratios: dict[str, float | None] = {}
    for size in map(str, params.sizes):
        ratios[f"add+cancel long N={size} timer/call_later"] = ratio(
            timer[size]["long_ns_per_pair"], call_later[size]["long_ns_per_pair"]
        )
        ratios[f"add+cancel N={size} timer/call_later"] = ratio(
            timer[size]["ns_per_pair"], call_later[size]["ns_per_pair"]
        )
        ratios[f"add+cancel net N={size} timer/call_later"] = ratio(
            timer[size]["net_ns_per_pair"], call_later[size]["net_ns_per_pair"]
        )
        ratios[f"add+cancel at once N={size} timer/call_later"] = ratio(
            timer[size]["immediate_ns_per_pair"], call_later[size]["immediate_ns_per_pair"]
        )
        ratios[f"add+expire N={size} timer/call_later"] = ratio(
            timer[size]["expire_cpu_us_per_timer"], call_later[size]["expire_cpu_us_per_timer"]
        )
    for name in ("timer", "call_later"):
        ratios[f"{name} add+cancel long net N={large}/N={small}"] = ratio(
            table[name][large]["net_long_ns_per_pair"], table[name][small]["net_long_ns_per_pair"]
        )
        ratios[f"{name} add+cancel N={large}/N={small}"] = ratio(
            table[name][large]["ns_per_pair"], table[name][small]["ns_per_pair"]
        )
        ratios[f"{name} add+expire N={large}/N={small}"] = ratio(
            table[name][large]["expire_cpu_us_per_timer"],
            table[name][small]["expire_cpu_us_per_timer"],
        )
    long_net = timer[large]["net_long_ns_per_pair"]
    long_flat = ratios[f"timer add+cancel long net N={large}/N={small}"]
    at_large = ratios[f"add+cancel N={large} timer/call_later"]
    flat = ratios[f"timer add+cancel N={large}/N={small}"]
    note = "" if large == "1000000" else f"indicative: largest size run is {int(large):,}"
    churn = "churn: cancels a random other pending timer (memory-bound, see bench/w3.py)"
    compiled_note = "" if purgatory_aio.compiled else " (the goal is for the compiled core)"
    goals = [
        goal(
            f"W3 Timer add+cancel of a random long delay, net, at N={large}",
            "<= 250 ns",
            long_net,
            long_net <= 250 if purgatory_aio.compiled else None,
            note + compiled_note,
        ),
        goal(
            f"W3 Timer add+cancel of a random long delay, net, N={large} vs N={small}",
            "<= 1.3x",
            long_flat,
            long_flat is not None and long_flat <= 1.3,
            note,
        ),
        goal(
            f"W3 Timer churn vs call_later at N={large}",
            "<= 0.33x",
            at_large,
            at_large is not None and at_large <= 1 / 3,
            note or churn,
        ),
        goal(
            f"W3 Timer churn flatness N={large} vs N={small}",
            "<= 1.3x",
            flat,
            flat is not None and flat <= 1.3,
            note or churn,
        ),
    ]
    headline = [
        (
            f"add+cancel of a random long delay, net ns N={small} | N={large}",
            f"{fmt(timer[small]['net_long_ns_per_pair'], 0)} | {fmt(long_net, 0)} "
            f"(flatness {fmt_ratio(long_flat)}; call_later "
            f"{fmt(call_later[small]['net_long_ns_per_pair'], 0)} | "
            f"{fmt(call_later[large]['net_long_ns_per_pair'], 0)})",
        ),
        (
            f"churn ns N={small}: timer | call_later",
            f"{fmt(timer[small]['ns_per_pair'], 0)} | {fmt(call_later[small]['ns_per_pair'], 0)}",
        ),
        (
            f"churn ns N={large}: timer | call_later",
            f"{fmt(timer[large]['ns_per_pair'], 0)} | {fmt(call_later[large]['ns_per_pair'], 0)}",
        ),
        (f"timer/call_later at N={large}", fmt_ratio(at_large)),
        (
            f"churn flatness N={large}/N={small}: timer | call_later",
            f"{fmt_ratio(flat)} | "
            f"{fmt_ratio(ratios[f'call_later add+cancel N={large}/N={small}'])}",
        ),
        (
            f"add+cancel at once ns N={large}: timer | call_later",
            f"{fmt(timer[large]['immediate_ns_per_pair'], 0)} | "
            f"{fmt(call_later[large]['immediate_ns_per_pair'], 0)}",
        ),
        (
            f"add+expire CPU us N={large}: timer | call_later",
            f"{fmt(timer[large]['expire_cpu_us_per_timer'])} | "
            f"{fmt(call_later[large]['expire_cpu_us_per_timer'])}",
        ),
    ]
    return make_record(
        "w3",
        loop_name,
        asdict(params),
        {"contenders": table},
        ratios=ratios,
        goals=goals,
        headline=headline,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=str, default=None, help="pending counts, comma separated")
    parser.add_argument("--pairs", type=int, default=None, help="add+cancel pairs per size")


def params_from_args(args: argparse.Namespace) -> W3Params:
    if args.sizes:
        sizes = tuple(int(s) for s in args.sizes.split(","))
    else:
        sizes = (1_000, 10_000, 100_000) if args.quick else W3Params().sizes
    pairs = args.pairs or (50_000 if args.quick else 200_000)
    spread = 0.25 if args.quick else 1.0
    return W3Params(sizes=sizes, pairs=pairs, expire_spread=spread, seed=args.seed)
