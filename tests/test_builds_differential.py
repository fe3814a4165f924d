"""The compiled and the pure implementation answer the same script of calls the same way.

The compiled wheel holds both: its extensions, and their pure source, which
``PURGATORY_AIO_NO_EXTENSIONS=1`` selects at import. A process imports one, so each runs
the script in a child process of its own, from the same install. Both runs must record
the same results, errors (type and message), counts after every step, event records and
outcomes. It runs once, from the compiled pass (it compares the two itself).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import purgatory_aio
from purgatory_aio import _build

TESTS = Path(__file__).resolve().parent
SEEDS = 25

pytestmark = pytest.mark.skipif(
    not purgatory_aio.compiled,
    reason="run from the compiled implementation, which it compares with the pure one"
    if _build.DISABLED
    else "this install has no compiled implementation to compare",
)


def run_script(pure: bool, loop: str, out: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONSAFEPATH": "1"}
    env.pop(_build.NO_EXTENSIONS_VAR, None)
    if pure:
        env[_build.NO_EXTENSIONS_VAR] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(
        [sys.executable, "-m", "differential_script", str(SEEDS), loop, str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_both_implementations_give_the_same_outcomes_counts_and_errors(
    loop: str, tmp_path: Path
) -> None:
    compiled = run_script(False, loop, tmp_path / "compiled.json")
    pure = run_script(True, loop, tmp_path / "pure.json")
    assert (compiled["compiled"], pure["compiled"]) == (True, False)
    for seed, (left, right) in enumerate(zip(compiled["runs"], pure["runs"], strict=True)):
        for step, (a, b) in enumerate(zip(left, right, strict=True)):
            assert a == b, f"seed {seed}, record {step}: compiled {a} != pure {b}"
        assert len(left) == len(right)
    raised = sum(1 for run in pure["runs"] for entry in run if entry[1] == "raised")
    assert raised > 0, "the script should provoke errors too"
