"""What the wheels hold, the build switch, and one import name per module.

The wheel checks read the wheels `make test` built and installed (their directories
come in PURGATORY_AIO_WHEEL_DIR, PURGATORY_AIO_EXAMPLES_WHEEL_DIR and
PURGATORY_AIO_REPORT_WHEEL_DIR); run outside make,
they skip and say so.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import hatch_build

CHECKOUT = Path(__file__).resolve().parent.parent


def _wheel(variable: str, sibling: str | None = None) -> zipfile.ZipFile:
    """The one wheel in ``variable``'s directory (or in the ``sibling`` directory beside it)."""
    directory = os.environ.get(variable)
    if not directory:
        pytest.skip(f"{variable} is unset: the wheel checks run under `make test`")
    if sibling is not None:
        directory = str(Path(directory).parent / sibling)
    wheels = sorted(Path(directory).glob("*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {directory}, found {wheels}"
    return zipfile.ZipFile(wheels[0])


def _contents(variable: str) -> tuple[list[str], str, str]:
    """The names in the wheel of ``variable``'s directory, its entry points and its
    METADATA."""
    with _wheel(variable) as wheel:
        names = wheel.namelist()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        return names, _entry_points(wheel), wheel.read(metadata).decode()


def _entry_points(wheel: zipfile.ZipFile) -> str:
    """The wheel's entry points ("" when it declares none, as the library's now)."""
    names = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    return "".join(wheel.read(name).decode() for name in names)


@pytest.mark.parametrize("build", ["compiled", "pure"])
def test_the_library_wheel_holds_purgatory_aio_only(build: str) -> None:
    """Both wheels `make test` built (PURGATORY_AIO_WHEEL_DIR names the compiled one's
    directory; the pure one's sits beside it)."""
    with _wheel("PURGATORY_AIO_WHEEL_DIR", build) as wheel:
        wheel_name = Path(wheel.filename or "").name
        names = wheel.namelist()
        scripts = _entry_points(wheel)
        sources_text = b"".join(wheel.read(n) for n in names if n.endswith(".py"))
    compiled = build == "compiled"
    stray = [
        n
        for n in names
        if not n.startswith(("purgatory_aio/", "purgatory_aio-"))
        # mypyc's shared runtime of the compiled modules sits at the top level.
        and not (compiled and "/" not in n and "__mypyc." in n)
    ]
    assert stray == []
    assert not [n for n in names if "minikafka" in n or "hatch_build" in n]
    # The report is a distribution of its own: no Spark code in the library's wheel.
    assert not [n for n in names if "analytics" in n or "purgatory_report" in n]
    assert "purgatory-sim" not in scripts
    assert "purgatory-report" not in scripts
    assert b"pyspark" not in sources_text
    extensions = {n.split("/")[-1].split(".")[0] for n in names if n.endswith(".so")}
    sources = {n.split("/")[-1][:-3] for n in names if n.endswith(".py")}
    # Both implementations in the compiled wheel: every extension has its source beside.
    assert set(hatch_build.COMPILED_MODULES) <= sources
    if compiled:
        assert {*hatch_build.COMPILED_MODULES, *hatch_build.NATIVE_MODULES} <= extensions
        assert "-cp3" in wheel_name
    else:
        assert extensions == set()
        assert wheel_name.endswith("-py3-none-any.whl")


def test_the_examples_wheel_holds_minikafka_and_its_script() -> None:
    names, scripts, requires = _contents("PURGATORY_AIO_EXAMPLES_WHEEL_DIR")
    assert [n for n in names if not n.startswith(("minikafka/", "purgatory_aio_examples-"))] == []
    assert "purgatory-sim = minikafka.cli:main" in scripts
    assert "Requires-Dist: purgatory-aio\n" in requires


LICENSE_TEXT = (CHECKOUT / "LICENSE").read_text()


def test_the_report_wheel_holds_the_report_and_its_script() -> None:
    names, scripts, requires = _contents("PURGATORY_AIO_REPORT_WHEEL_DIR")
    assert [
        n for n in names if not n.startswith(("purgatory_report/", "purgatory_aio_report-"))
    ] == []
    assert "purgatory_report/cli.py" in names and "purgatory_report/py.typed" in names
    assert "purgatory-report = purgatory_report.cli:main" in scripts
    assert "Requires-Dist: purgatory-aio\n" in requires
    assert "Requires-Dist: pyspark>=3.5\n" in requires


@pytest.mark.parametrize(
    "variable",
    [
        "PURGATORY_AIO_WHEEL_DIR",
        "PURGATORY_AIO_EXAMPLES_WHEEL_DIR",
        "PURGATORY_AIO_REPORT_WHEEL_DIR",
    ],
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
    (tmp_path / "_wheels.py").write_text("")
    with pytest.raises(hatch_build.BuildError, match="lists modules that do not exist"):
        hatch_build.build(tmp_path / "out", source=tmp_path)
    assert not (tmp_path / "out").exists()


def test_an_unknown_build_mode_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hatch_build.ENV_VAR, "fast")
    with pytest.raises(hatch_build.BuildError, match="'fast' is not one of auto, compiled, pure"):
        hatch_build.requested_mode()


def _build_without_compiler(mode: str, out: Path) -> subprocess.CompletedProcess[str]:
    # The venv's own hatchling, no isolated env: the hook decides before compiling anything.
    return _pip_wheel(CHECKOUT, mode, out, CC="no-such-cc")


def _pip_wheel(
    source: Path, mode: str, out: Path, **environ: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, hatch_build.ENV_VAR: mode, **environ}
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v"]
    return subprocess.run(
        [*argv, "-w", str(out), str(source)],
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


def _fallback_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    output = (done.stdout + done.stderr).splitlines()
    return [line for line in output if "building the pure-Python core" in line]


@pytest.mark.slow
def test_a_failing_mypyc_falls_back_to_pure_in_auto_and_fails_compiled(tmp_path: Path) -> None:
    """A compiled build broken on purpose (a type error mypyc refuses, in a copy of the
    checkout): ``auto`` still installs, the pure core, saying why in one line."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "hatch_build.py", "README.md", "LICENSE"):
        shutil.copy(CHECKOUT / name, source / name)
    shutil.copytree(
        CHECKOUT / "purgatory_aio",
        source / "purgatory_aio",
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    wheel = source / "purgatory_aio" / "_wheels.py"
    wheel.write_text(wheel.read_text() + "\n\nBROKEN: int = 'not an int'\n")

    auto = _pip_wheel(source, "auto", tmp_path / "auto")
    assert auto.returncode == 0, auto.stderr[-3000:]
    (line,) = _fallback_lines(auto)
    assert "the compiled build failed" in line
    (built,) = (tmp_path / "auto").iterdir()
    assert built.name.endswith("-py3-none-any.whl")

    forced = _pip_wheel(source, "compiled", tmp_path / "compiled")
    assert forced.returncode != 0
    assert not (tmp_path / "compiled").exists() or not list((tmp_path / "compiled").iterdir())


def test_docstrings_are_read_without_importing_the_package(tmp_path: Path) -> None:
    """The build reads the docstrings from the source text: a module that cannot even be
    imported here (its imports missing) is read all the same, exactly as compiled."""
    package = tmp_path / "purgatory_aio"
    shutil.copytree(
        CHECKOUT / "purgatory_aio", package, ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    timer = package / "_timer.py"
    timer.write_text("import no_such_module_anywhere\n" + timer.read_text())
    docs = hatch_build.collect_docs(tmp_path)
    from purgatory_aio import Purgatory, _purgatory

    assert docs["runtime"]["purgatory_aio._purgatory"]["classes"]["Purgatory"] == (
        Purgatory.__doc__
    )
    assert docs["c"]["_purgatory___Purgatory"]["advance_key"] == Purgatory.advance_key.__doc__
    assert "Timer" in docs["runtime"]["purgatory_aio._timer"]["classes"]
    assert _purgatory.__name__ == "purgatory_aio._purgatory"


def test_a_coroutine_in_a_compiled_module_fails_the_build(tmp_path: Path) -> None:
    package = tmp_path / "purgatory_aio"
    shutil.copytree(
        CHECKOUT / "purgatory_aio", package, ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    bucket = package / "_wheels.py"
    bucket.write_text(bucket.read_text() + "\n\nasync def later() -> None:\n    pass\n")
    with pytest.raises(hatch_build.BuildError, match="later is a coroutine function"):
        hatch_build.collect_docs(tmp_path)


class _Extension:
    def __init__(self, *sources: Path) -> None:
        self.sources = [str(source) for source in sources]


def test_every_deallocator_must_take_the_weakref_fix(tmp_path: Path) -> None:
    c_file = tmp_path / "module.c"
    patched_shape = (
        "static void\nA_dealloc(AObject *self)\n{\n    PyObject_GC_UnTrack(self);\n"
        "    CPy_TRASHCAN_BEGIN(self, A_dealloc)\n    free(self);\n}\n"
    )
    other_shape = "static void\nB_dealloc(BObject *self)\n{\n    free(self);\n}\n"
    c_file.write_text(patched_shape)
    hatch_build._clear_weakrefs_on_dealloc([_Extension(c_file)])
    assert hatch_build._CLEAR_WEAKREFS in c_file.read_text()

    c_file.write_text(patched_shape + other_shape)
    with pytest.raises(hatch_build.BuildError, match="did not apply to B_dealloc"):
        hatch_build._clear_weakrefs_on_dealloc([_Extension(c_file)])
    c_file.write_text("int nothing;\n")
    with pytest.raises(hatch_build.BuildError, match="any deallocator"):
        hatch_build._clear_weakrefs_on_dealloc([_Extension(c_file)])


def test_every_docstring_must_find_its_method_entry(tmp_path: Path) -> None:
    c_file = tmp_path / "module.c"
    entry = (
        '{"go", (PyCFunction)CPyPy_m___C___go, METH_FASTCALL | METH_KEYWORDS, '
        'PyDoc_STR("go($self)\\n--\\n\\n") /* docstring */},\n'
    )
    c_file.write_text(entry)
    hatch_build._carry_docs([_Extension(c_file)], {"m___C": {"go": "Go now."}})
    assert '"Go now."' in c_file.read_text()

    c_file.write_text(entry)
    with pytest.raises(hatch_build.BuildError, match=r"m___C\.stop could not be placed"):
        hatch_build._carry_docs([_Extension(c_file)], {"m___C": {"go": "Go now.", "stop": "Stop."}})


def test_the_build_pins_the_mypy_the_checkout_lints_with() -> None:
    import tomllib

    project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())
    dev = project["project"]["optional-dependencies"]["dev"]
    assert hatch_build.MYPY_REQUIREMENT in dev
    assert hatch_build.MYPY_REQUIREMENT in hatch_build.COMPILE_REQUIRES


def test_a_free_threaded_interpreter_gets_the_pure_core(monkeypatch: pytest.MonkeyPatch) -> None:
    import sysconfig

    real = sysconfig.get_config_var
    monkeypatch.setattr(
        sysconfig,
        "get_config_var",
        lambda name: 1 if name == "Py_GIL_DISABLED" else real(name),
    )
    missing = hatch_build.missing_toolchain()
    assert missing is not None and "free-threaded" in missing


def test_the_supported_pythons_are_declared() -> None:
    import tomllib

    project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11"
    for version in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in project["classifiers"]


@pytest.mark.slow
def test_an_sdist_builds_compiled_with_a_compiler_and_pure_without(tmp_path: Path) -> None:
    """The sdist carries what the compiled build needs (the build hook, the C helper):
    built here it gives the compiled wheel, and without a C compiler the pure one."""
    sdist_dir = tmp_path / "sdist"
    done = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(sdist_dir)],
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (sdist,) = sdist_dir.glob("*.tar.gz")

    compiled = _pip_wheel(sdist, "auto", tmp_path / "compiled")
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert _fallback_lines(compiled) == []
    (wheel,) = (tmp_path / "compiled").iterdir()
    assert "-cp3" in wheel.name
    with zipfile.ZipFile(wheel) as archive:
        extensions = {n.split("/")[-1].split(".")[0] for n in archive.namelist() if ".so" in n}
    assert {*hatch_build.COMPILED_MODULES, *hatch_build.NATIVE_MODULES} <= extensions

    pure = _pip_wheel(sdist, "auto", tmp_path / "pure", CC="no-such-cc")
    assert pure.returncode == 0, pure.stderr[-3000:]
    assert len(_fallback_lines(pure)) == 1
    (wheel,) = (tmp_path / "pure").iterdir()
    assert wheel.name.endswith("-py3-none-any.whl")
