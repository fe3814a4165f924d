"""What the wheels hold, the build switch, and one import name per module.

The wheel checks read the wheels `make test` built and installed (their directories
come in PURGATORY_AIO_WHEEL_DIR and PURGATORY_AIO_EXAMPLES_WHEEL_DIR); run outside make,
they skip and say so.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import hatch_build
import purgatory_aio

CHECKOUT = Path(__file__).resolve().parent.parent


def _wheel(variable: str) -> zipfile.ZipFile:
    directory = os.environ.get(variable)
    if not directory:
        pytest.skip(f"{variable} is unset: the wheel checks run under `make test`")
    wheels = sorted(Path(directory).glob("*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {directory}, found {wheels}"
    return zipfile.ZipFile(wheels[0])


def _entry_points(wheel: zipfile.ZipFile) -> str:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    return wheel.read(name).decode()


def test_the_library_wheel_holds_purgatory_aio_only() -> None:
    with _wheel("PURGATORY_AIO_WHEEL_DIR") as wheel:
        names = wheel.namelist()
        wheel_file = Path(wheel.filename or "").name
        scripts = _entry_points(wheel)
    stray = [
        n
        for n in names
        if not n.startswith(("purgatory_aio/", "purgatory_aio-"))
        # mypyc's shared runtime of the compiled modules sits at the top level.
        and not (purgatory_aio.compiled and "/" not in n and "__mypyc." in n)
    ]
    assert stray == []
    assert not [n for n in names if "minikafka" in n or "hatch_build" in n]
    assert "purgatory-sim" not in scripts
    assert "purgatory-report" in scripts
    extensions = {n.split("/")[-1].split(".")[0] for n in names if n.endswith(".so")}
    if purgatory_aio.compiled:
        assert {*hatch_build.COMPILED_MODULES, *hatch_build.NATIVE_MODULES} <= extensions
        assert "-cp3" in wheel_file
    else:
        assert extensions == set()
        assert wheel_file.endswith("-py3-none-any.whl")


def test_the_examples_wheel_holds_minikafka_and_its_script() -> None:
    with _wheel("PURGATORY_AIO_EXAMPLES_WHEEL_DIR") as wheel:
        names = wheel.namelist()
        scripts = _entry_points(wheel)
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = wheel.read(metadata).decode()
    assert [n for n in names if not n.startswith(("minikafka/", "purgatory_aio_examples-"))] == []
    assert "purgatory-sim = minikafka.cli:main" in scripts
    assert "Requires-Dist: purgatory-aio\n" in requires


LICENSE_TEXT = (CHECKOUT / "LICENSE").read_text()


@pytest.mark.parametrize(
    "variable", ["PURGATORY_AIO_WHEEL_DIR", "PURGATORY_AIO_EXAMPLES_WHEEL_DIR"]
)
def test_each_wheel_carries_the_apache_license_its_metadata_declares(variable: str) -> None:
    assert "Apache License" in LICENSE_TEXT and "Version 2.0, January 2004" in LICENSE_TEXT
    with _wheel(variable) as wheel:
        names = wheel.namelist()
        licenses = [n for n in names if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"]
        assert len(licenses) == 1, names
        assert wheel.read(licenses[0]).decode() == LICENSE_TEXT
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        declared = wheel.read(metadata).decode().split("\n\n", 1)[0]
    assert "Apache-2.0" in declared
    assert "License-File: LICENSE" in declared


def test_each_module_has_one_import_name() -> None:
    import minikafka

    from examples import http_broker_common

    assert not Path(minikafka.__file__ or "").resolve().is_relative_to(CHECKOUT / "examples")
    assert http_broker_common.Cluster is minikafka.Cluster
    with pytest.raises(ImportError, match="import the example broker as 'minikafka'"):
        importlib.import_module("examples.minikafka")


def test_a_listed_module_that_does_not_exist_fails_the_build(tmp_path: Path) -> None:
    (tmp_path / "_bucket.py").write_text("")
    with pytest.raises(hatch_build.BuildError, match="lists modules that do not exist"):
        hatch_build.build(tmp_path / "out", source=tmp_path)
    assert not (tmp_path / "out").exists()


def test_an_unknown_build_mode_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hatch_build.ENV_VAR, "fast")
    with pytest.raises(hatch_build.BuildError, match="'fast' is not one of auto, compiled, pure"):
        hatch_build.requested_mode()


def _build_without_compiler(mode: str, out: Path) -> subprocess.CompletedProcess[str]:
    # The venv's own hatchling, no isolated env: the hook decides before compiling anything.
    env = {**os.environ, hatch_build.ENV_VAR: mode, "CC": "no-such-cc"}
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v"]
    return subprocess.run(
        [*argv, "-w", str(out), str(CHECKOUT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_without_a_compiler_auto_builds_pure_with_one_line_and_compiled_fails(
    tmp_path: Path,
) -> None:
    auto = _build_without_compiler("auto", tmp_path / "auto")
    assert auto.returncode == 0, auto.stderr
    output = (auto.stdout + auto.stderr).splitlines()
    lines = [line for line in output if "building the pure-Python core" in line]
    assert len(lines) == 1
    assert "no C compiler ('no-such-cc' not found)" in lines[0]
    (built,) = (tmp_path / "auto").iterdir()
    assert built.name.endswith("-py3-none-any.whl")

    forced = _build_without_compiler("compiled", tmp_path / "compiled")
    assert forced.returncode != 0
    assert "PURGATORY_AIO_BUILD=compiled but no C compiler" in forced.stdout + forced.stderr
    assert not (tmp_path / "compiled").exists() or not list((tmp_path / "compiled").iterdir())
