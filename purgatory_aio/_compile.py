"""Build the compiled copy of the core: ``python -m purgatory_aio._compile``.

mypyc turns the strictly typed hot modules into C extension modules. The copy
is built beside the source, in ``build/mypyc`` by default: a complete
``purgatory_aio`` package whose hot modules are extensions. Put that directory
first on ``PYTHONPATH`` to run on it (``make bench`` and ``make test`` do);
``purgatory_aio.compiled`` says which build was imported. The source tree itself
stays pure Python, so an edit is never shadowed by a stale extension.

Needs mypy (mypyc), setuptools and a C compiler: ``pip install -e '.[dev]'``. Wheels
get the same modules compiled through ``_build_hook`` (``make wheel``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

#: The modules compiled: everything on the watch, completion and expiry paths.
COMPILED_MODULES = (
    "_bucket",
    "_wheel",
    "_states",
    "_validation",
    "_timer",
    "_watches",
    "_lifecycle",
    "_operation",
    "_purgatory",
)

_SOURCE = Path(__file__).resolve().parent


def build(out: Path, *, quiet: bool = True) -> Path:
    """Compile into ``out`` (replacing what was there); return the package directory."""
    try:
        from mypyc.build import mypycify
        from setuptools import setup
    except ImportError as exc:
        raise SystemExit(
            f"compiling needs mypy and setuptools ({exc.name} is missing): pip install -e '.[dev]'"
        ) from None
    out = out.resolve()
    package = out / "purgatory_aio"
    if package.exists():
        shutil.rmtree(package)
    for stale in out.glob("*__mypyc*"):
        stale.unlink()
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(_SOURCE, package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    sources = [f"purgatory_aio/{name}.py" for name in COMPILED_MODULES]
    cwd = Path.cwd()
    os.chdir(out)
    try:
        setup(
            name="purgatory-aio-compiled",
            packages=[],
            py_modules=[],
            ext_modules=mypycify(sources, opt_level="3", debug_level="0"),
            script_args=["-q" if quiet else "-v", "build_ext", "--inplace", "--build-temp", "tmp"],
        )
    finally:
        os.chdir(cwd)
    shutil.rmtree(out / "tmp", ignore_errors=True)
    shutil.rmtree(out / "build", ignore_errors=True)
    return package


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m purgatory_aio._compile", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--out", type=Path, default=Path("build/mypyc"))
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    started = time.monotonic()
    package = build(args.out, quiet=not args.verbose)
    built = sorted(p.name for p in package.glob("*.so"))
    print(
        f"compiled {len(built)} modules into {package} in {time.monotonic() - started:.0f} s",
        file=sys.stderr,
    )
    return 0 if len(built) == len(COMPILED_MODULES) else 1


if __name__ == "__main__":
    raise SystemExit(main())
