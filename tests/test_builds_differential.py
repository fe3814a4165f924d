"""The pure and the compiled build answer the same script of calls the same way.

One process holds one build of the core (mypyc's modules and the pure ones share their
names), so each build runs the script in a child process of its own, from its wheel
(the ones ``make test`` built: PURGATORY_AIO_WHEEL_DIR names this build's, the other
build's sits beside it). Both runs must record the same results, errors (type and
message), counts after every step, event records and outcomes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
BUILDS = ("compiled", "pure")
SEEDS = 25


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each build's wheel unpacked into a directory of its own."""
    directory = os.environ.get("PURGATORY_AIO_WHEEL_DIR")
    if not directory:
        pytest.skip(
            "PURGATORY_AIO_WHEEL_DIR is unset: the differential test runs under `make test`"
        )
    dist = Path(directory).parent
    out: dict[str, Path] = {}
    for build in BUILDS:
        wheels = sorted((dist / build).glob("*.whl"))
        assert len(wheels) == 1, f"expected one {build} wheel in {dist / build}, found {wheels}"
        target = tmp_path_factory.mktemp(f"wheel-{build}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(target)
        out[build] = target
    return out


def run_script(where: Path, loop: str, out: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        # The unpacked wheel first: it shadows the build installed in this venv.
        "PYTHONPATH": os.pathsep.join([str(where), str(TESTS)]),
        "PYTHONHASHSEED": "0",
        "PYTHONSAFEPATH": "1",
    }
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
def test_both_builds_give_the_same_outcomes_counts_and_errors(
    unpacked: dict[str, Path], loop: str, tmp_path: Path
) -> None:
    compiled = run_script(unpacked["compiled"], loop, tmp_path / "compiled.json")
    pure = run_script(unpacked["pure"], loop, tmp_path / "pure.json")
    assert (compiled["compiled"], pure["compiled"]) == (True, False)
    for seed, (left, right) in enumerate(zip(compiled["runs"], pure["runs"], strict=True)):
        for step, (a, b) in enumerate(zip(left, right, strict=True)):
            assert a == b, f"seed {seed}, record {step}: compiled {a} != pure {b}"
        assert len(left) == len(right)
    raised = sum(1 for run in pure["runs"] for entry in run if entry[1] == "raised")
    assert raised > 0, "the script should provoke errors too"
