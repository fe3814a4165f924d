"""What must hold on every supported Python (3.11, 3.12, 3.13) and both implementations.

- No warning from the library: a compiled coroutine passed a cancellation on with the
  three-argument ``throw()``, deprecated since 3.12; the core's coroutines are
  interpreted now, so cancelling a wait, an ``await op`` or the reaper says nothing.
- Pending operations out of the cyclic GC on the compiled build whatever the
  interpreter does with instance dicts (3.12 and later manage them itself), and no dict
  made for an operation that has none.
- ``PURGATORY_AIO_NO_EXTENSIONS`` selects the pure source at import, in a child process.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import sys
import textwrap
import tracemalloc
import warnings
from typing import Any

import pytest

import purgatory_aio
from purgatory_aio import DelayedOperation, Purgatory, Timer, _build


class Parked(DelayedOperation[None]):
    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.request = {"client": "c1", "offset": 7}  # an instance dict of its own
        self.label = "fetch"

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        return None


class Bare(DelayedOperation[None]):
    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        return None


async def test_cancelling_waits_and_the_reaper_warns_of_nothing() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = Purgatory("warnings")
        first, second = Parked(30.0), Parked(30.0)
        wait = asyncio.ensure_future(p.watch_and_wait(first, ["k"]))
        assert not await p.try_complete_else_watch(second, ["k"])

        async def plain_await() -> None:
            await second

        other = asyncio.ensure_future(plain_await())
        timer = Timer(tick=0.01)
        handle = timer.call_later(30.0, lambda: None)
        await asyncio.sleep(0.01)
        wait.cancel()
        other.cancel()
        results = await asyncio.gather(wait, other, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results)
        assert first.cancelled
        handle.cancel()
        timer.close()  # cancels the timer's reaper while it waits
        async with Purgatory("entered") as entered:
            assert not entered.closed
        await p.shutdown()  # cancels this purgatory's reaper
        await asyncio.sleep(0)
    assert [str(w.message) for w in caught] == []


def test_the_coroutine_methods_are_coroutine_functions_with_their_docs() -> None:
    import inspect

    for method in (Purgatory.shutdown, Purgatory.__aenter__, Purgatory.__aexit__):
        assert inspect.iscoroutinefunction(method), method
    assert inspect.iscoroutinefunction(Timer.__aenter__)
    assert Purgatory.shutdown.__doc__ and "settle every pending" in Purgatory.shutdown.__doc__
    assert str(inspect.signature(Purgatory.shutdown)).startswith("(self, *, expire_pending")


def _tracked_objects() -> int:
    gc.collect()
    return len(gc.get_objects())


async def test_a_pending_operation_keeps_no_tracked_object_on_the_compiled_build() -> None:
    p = Purgatory("tracked")
    ops = [Parked(60.0) for _ in range(2000)]
    for op in ops:  # the dicts exist before admission, as in a real handler
        assert op.label == "fetch"
    before = _tracked_objects()
    for index, op in enumerate(ops):
        await p.try_complete_else_watch(op, [index % 10])
    added = _tracked_objects() - before
    if purgatory_aio.compiled:
        assert added <= 20, f"{added / len(ops):.3f} tracked objects per pending operation"
        assert not gc.is_tracked(ops[0]) and not gc.is_tracked(ops[0].__dict__)
    else:
        assert gc.is_tracked(ops[0])
    for op in ops:
        op.cancel()
    # Settled: the collector's again, dict included.
    assert gc.is_tracked(ops[0]) and gc.is_tracked(ops[0].__dict__)
    await p.shutdown()


async def test_untracking_makes_no_dict_for_an_operation_without_one() -> None:
    p = Purgatory("no-dict")
    ops = [Bare(60.0) for _ in range(3000)]
    gc.collect()
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        for index, op in enumerate(ops):
            await p.try_complete_else_watch(op, [index % 10])
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # About 130 bytes each (timer entry, watch entries); a dict made for each would add
    # about 340 more on 3.12 and 3.13.
    per_op = (end - start) / len(ops)
    assert per_op < 300, f"{per_op:.0f} bytes per admitted operation"
    await p.shutdown()


def _child(code: str, value: str | None) -> dict[str, Any]:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    env.pop(_build.NO_EXTENSIONS_VAR, None)
    if value is not None:
        env[_build.NO_EXTENSIONS_VAR] = value
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd="/",
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


_REPORT = """
    import json
    import purgatory_aio
    from purgatory_aio import _gc, _relay, _timer, _errors
    from purgatory_aio.fanout import _base
    print(json.dumps({
        "compiled": purgatory_aio.compiled,
        "timer_source": _timer.__file__.endswith(".py"),
        "relay_source": _relay.__file__.endswith(".py"),
        "untracking": _gc.UNTRACKING,
        "one_error_class": purgatory_aio.PurgatoryClosed is _errors.PurgatoryClosed,
    }))
"""


def _installed_has_extensions() -> bool:
    return _build._has_extension("_timer")


@pytest.mark.parametrize("value", ["1", "yes", " 1 "])
def test_the_switch_selects_the_pure_source_of_the_same_install(value: str) -> None:
    seen = _child(_REPORT, value)
    assert seen == {
        "compiled": False,
        "timer_source": True,
        "relay_source": True,
        "untracking": False,
        "one_error_class": True,
    }


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_the_switch_the_extensions_run_where_installed(value: str | None) -> None:
    has = _installed_has_extensions()
    seen = _child(_REPORT, value)
    assert seen["compiled"] is has
    assert seen["timer_source"] is (not has) and seen["relay_source"] is (not has)
    assert seen["untracking"] is has


def test_one_place_knows_which_implementation_runs() -> None:
    from pathlib import Path

    from purgatory_aio import _gc, _relay, _states

    assert purgatory_aio.compiled is _build.COMPILED
    assert _gc.UNTRACKING is _build.COMPILED
    assert _relay._COMPILED is _build.COMPILED
    assert _states.LOCKED is _states.needs_lock(not _build.COMPILED, _states._gil_enabled())
    # Nobody else works it out for themselves.
    package = Path(purgatory_aio.__file__ or "").parent
    for source in package.rglob("*.py"):
        if source.name != "_build.py":
            text = source.read_text(encoding="utf-8")
            assert 'endswith(".py")' not in text, source
            assert "FunctionType)" not in text, source
