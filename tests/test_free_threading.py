"""The transition lock on an interpreter without the GIL, on both builds.

The compiled build skips the lock around an operation's state transition only where the
GIL makes that region atomic; without the GIL (a free-threaded 3.13t or later) it takes
the lock like the pure build. The decision is made at import from
``sys._is_gil_enabled()``, so a child process that answers for the interpreter before
importing the package shows what each build decides, and that the locked path works:
threads racing ``force_complete`` and ``cancel`` on the same operations have exactly
one winner each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import purgatory_aio
from purgatory_aio._states import LOCKED, needs_lock

CHILD = textwrap.dedent(
    """
    import json, sys, threading
    mode = sys.argv[1]
    if mode == "gil-off":
        sys._is_gil_enabled = lambda: False
    elif mode == "gil-on":
        sys._is_gil_enabled = lambda: True
    elif hasattr(sys, "_is_gil_enabled"):  # an interpreter that predates the question
        del sys._is_gil_enabled

    import purgatory_aio
    from purgatory_aio import DelayedOperation
    from purgatory_aio._states import LOCKED

    class Op(DelayedOperation[None]):
        def try_complete(self):
            return False

        def on_complete(self):
            return None

    ops = [Op(1.0) for _ in range(3000)]
    wins = [0] * len(ops)
    start = threading.Barrier(6)

    def race(n):
        start.wait()
        for i, op in enumerate(ops):
            if (op.force_complete() if (i + n) % 2 else op.cancel()):
                wins[i] += 1

    threads = [threading.Thread(target=race, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({
        "compiled": purgatory_aio.compiled,
        "locked": LOCKED,
        "winners": sorted(set(wins)),
    }))
    """
)


def run_child(mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        cwd=Path(__file__).parent,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


@pytest.mark.parametrize(
    ("mode", "locked_when_compiled"), [("gil-off", True), ("gil-on", False), ("no-answer", False)]
)
def test_each_build_takes_the_transition_lock_when_the_interpreter_has_no_gil(
    mode: str, locked_when_compiled: bool
) -> None:
    result = run_child(mode)
    assert result["compiled"] == purgatory_aio.compiled  # the build under test
    expected = locked_when_compiled if purgatory_aio.compiled else True
    assert result["locked"] is expected
    assert result["winners"] == [1], "an operation with no winner or with two"


def test_the_decision_table() -> None:
    assert needs_lock(interpreted=True, gil_enabled=True)
    assert needs_lock(interpreted=True, gil_enabled=False)
    assert needs_lock(interpreted=False, gil_enabled=False)
    assert not needs_lock(interpreted=False, gil_enabled=True)


def test_this_interpreter_gets_the_lock_it_needs() -> None:
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    assert needs_lock(not purgatory_aio.compiled, gil) == LOCKED
