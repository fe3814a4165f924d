"""Which implementation of the core runs: the one place that decides and knows.

A compiled wheel holds both implementations of the hot modules: each module's mypyc
extension and, beside it, its pure-Python source. Python's import system prefers the
extension. ``PURGATORY_AIO_NO_EXTENSIONS=1`` (any value but empty or ``0``), set before
the package is first imported, selects the pure source of every module instead, as
``AIOHTTP_NO_EXTENSIONS`` and ``YARL_NO_EXTENSIONS`` do for theirs: one installed wheel
runs either way, so the pure implementation can be tried, profiled or tested beside the
compiled one without a second install. The public classes and exceptions are defined
once whichever runs; a process imports one implementation.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Final, TypeVar, cast

T = TypeVar("T")

#: The environment variable that selects the pure implementation.
NO_EXTENSIONS_VAR: Final = "PURGATORY_AIO_NO_EXTENSIONS"

_PACKAGE: Final = __name__.rpartition(".")[0]
_HERE: Final = Path(__file__).resolve().parent


def extensions_disabled() -> bool:
    """Whether ``PURGATORY_AIO_NO_EXTENSIONS`` asks for the pure implementation."""
    return os.environ.get(NO_EXTENSIONS_VAR, "").strip() not in ("", "0")


def _has_extension(module: str) -> bool:
    return any((_HERE / f"{module}{suffix}").is_file() for suffix in EXTENSION_SUFFIXES)


class _PureSource(MetaPathFinder):
    """Finds each module of the package in its ``.py`` source, before the extensions."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != _PACKAGE:
            return None
        source = _HERE / f"{name}.py"
        if not source.is_file():
            return None  # a subpackage, or an extension with no source (_untrack)
        return importlib.util.spec_from_file_location(fullname, source)


DISABLED: Final = extensions_disabled()
if DISABLED and not any(isinstance(finder, _PureSource) for finder in sys.meta_path):
    sys.meta_path.insert(0, _PureSource())

#: True when the compiled implementation runs: this install has it, and it is not
#: switched off.
COMPILED: Final = not DISABLED and _has_extension("_timer")


def native(module: str, name: str, pure: T) -> T:
    """``name`` from the compiled build's hand-written extension ``module`` (one of
    hatch_build.py's NATIVE_MODULES), or ``pure`` when the pure implementation runs: the
    one place that chooses between a C helper and the Python it stands for."""
    if not COMPILED:
        return pure
    try:
        extension = importlib.import_module(f"{_PACKAGE}.{module}")
    except ImportError as exc:  # pragma: no cover - the compiled build always ships them
        raise ImportError(
            f"purgatory_aio's compiled core is installed without its {module} extension: "
            f"reinstall it (PURGATORY_AIO_BUILD=compiled builds it): {exc}"
        ) from None
    return cast(T, getattr(extension, name))


__all__ = ["COMPILED", "DISABLED", "NO_EXTENSIONS_VAR", "extensions_disabled", "native"]
