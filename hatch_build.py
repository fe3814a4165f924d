"""Build tooling for the compiled core (never installed, never imported at run time).

Two uses:

* hatchling's custom build hook (hatch's conventional ``hatch_build.py``): every
  wheel build compiles the hot modules of ``purgatory_aio`` with mypyc and ships
  the extensions beside their sources. ``PURGATORY_AIO_BUILD`` chooses:

  - ``auto`` (default): compiled when it can be; pure Python otherwise (no C
    compiler or Python headers, a free-threaded interpreter, or any failure of the
    compiled build), with one line saying why;
  - ``compiled``: compiled or a build error naming what went wrong;
  - ``pure``: pure Python, nothing compiled (and no mypy in the build env).

  Editable installs are always pure: an edit must never be shadowed by a stale
  extension.

* a script, ``python hatch_build.py --out build/mypyc``: a compiled copy of the
  package in a directory, for profiling the extensions without installing them.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from hatchling.builders.config import BuilderConfig
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: The modules compiled: everything on the watch, completion and expiry paths, and the
#: fan-out's receiving path.
#: The one list to edit when a core module is added; a listed module that does
#: not exist fails the build.
COMPILED_MODULES = (
    "_wheels",
    "_entry",
    "_states",
    "_validation",
    "_keys",
    "_timer",
    "_index",
    "_watches",
    "_stale",
    "_waiters",
    "_owner",
    "_lifecycle",
    "_detached",
    "_operation",
    "_purgatory",
    "_relay",  # the fan-out's parse-and-apply of every message a subscriber receives
)

#: Hand-written C extensions built beside them, each from ``<name>.c`` in the package:
#: ``_untrack`` takes pending operations out of the cyclic GC (see ``_gc.py``);
#: ``_initsig`` gives a compiled class's ``__init__`` the signature help() shows;
#: ``_threadid`` is ``threading.get_ident`` without an int per call (see ``_threads.py``);
#: ``_compact`` drops ended operations from a watch list for the purge (see ``_stale.py``),
#: reading their state where mypyc's layout of the same build keeps it.
#: The compiled build fails without them, as without any compiled module.
NATIVE_MODULES = ("_untrack", "_initsig", "_threadid", "_compact")

#: What compiling needs in the build environment. mypyc type-checks the modules, so the
#: package's own dependencies must be there for their type information (nothing of the
#: package is imported at build time). mypy is held to the releases the suite runs
#: with: the C it writes is patched per site below, and a release that writes it
#: differently fails the compiled build loudly (and ``auto`` falls back to pure).
MYPY_REQUIREMENT = "mypy>=2.4,<2.5"
COMPILE_REQUIRES = [MYPY_REQUIREMENT, "setuptools>=65", "anyio>=4.4", "structlog>=24.1"]

#: Written beside the compiled extensions: what ``purgatory_aio._native.restore_docs``
#: gives the compiled classes and coroutine functions at import (see :func:`_carry_docs`).
DOCS_FILE = "_compiled_docs.json"

ENV_VAR = "PURGATORY_AIO_BUILD"
MODES = ("auto", "compiled", "pure")

_ROOT = Path(__file__).resolve().parent
_PACKAGE = "purgatory_aio"


class BuildError(RuntimeError):
    """The compiled build was asked for and cannot be made."""


def requested_mode() -> str:
    """The build mode from ``PURGATORY_AIO_BUILD`` (``auto`` when unset)."""
    mode = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise BuildError(f"{ENV_VAR}={mode!r} is not one of {', '.join(MODES)}")
    return mode


def missing_toolchain() -> str | None:
    """Why a C extension cannot be built here, or None when it can."""
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        # mypyc's support for free-threaded interpreters is partial and the compiled core
        # is untested there: such an interpreter gets the pure core.
        return "a free-threaded interpreter (the compiled core is built for the GIL only)"
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    argv = shlex.split(compiler)
    if not argv or shutil.which(argv[0]) is None:
        return f"no C compiler ({argv[0] if argv else compiler!r} not found)"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        return f"no Python headers ({headers} not found; install python3-dev)"
    return None


def build(out: Path, *, source: Path = _ROOT / _PACKAGE, quiet: bool = True) -> Path:
    """Compile a copy of the package into ``out`` (replacing what was there).

    Returns the package directory: the sources plus one extension per module of
    :data:`COMPILED_MODULES`; mypyc's shared runtime library lands in ``out``.
    """
    missing = [name for name in COMPILED_MODULES if not (source / f"{name}.py").is_file()]
    missing += [f"{name}.c" for name in NATIVE_MODULES if not (source / f"{name}.c").is_file()]
    if missing:
        raise BuildError(
            f"COMPILED_MODULES or NATIVE_MODULES in {Path(__file__).name} lists modules that "
            f"do not exist in "
            f"{source}: {', '.join(missing)}"
        )
    try:
        from mypyc.build import mypycify
        from setuptools import Extension, setup
    except ImportError as exc:
        raise BuildError(
            f"compiling needs {', '.join(COMPILE_REQUIRES[:2])} ({exc.name} is missing)"
        ) from None
    out = out.resolve()
    package = out / _PACKAGE
    if package.exists():
        shutil.rmtree(package)
    for stale in out.glob("*__mypyc*"):
        stale.unlink()
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    sources = [f"{_PACKAGE}/{name}.py" for name in COMPILED_MODULES]
    docs = collect_docs(out)
    (package / DOCS_FILE).write_text(json.dumps(docs["runtime"], indent=1, sort_keys=True))
    cwd = Path.cwd()
    os.chdir(out)
    try:
        extensions = mypycify(sources, opt_level="3", debug_level="0")
        _clear_weakrefs_on_dealloc(extensions)
        _carry_docs(extensions, docs["c"])
        layout = _layout_options(extensions)
        extensions += [
            Extension(
                f"{_PACKAGE}.{name}", [f"{_PACKAGE}/{name}.c"], extra_compile_args=["-O2"], **layout
            )
            for name in NATIVE_MODULES
        ]
        setup(
            name="purgatory-aio-compiled",
            packages=[],
            py_modules=[],
            ext_modules=extensions,
            script_args=["-q" if quiet else "-v", "build_ext", "--inplace", "--build-temp", "tmp"],
        )
    finally:
        os.chdir(cwd)
    shutil.rmtree(out / "tmp", ignore_errors=True)
    shutil.rmtree(out / "build", ignore_errors=True)
    built = {path.name.split(".", 1)[0] for path in package.glob("*.so")}
    absent = sorted({*COMPILED_MODULES, *NATIVE_MODULES} - built)
    if absent:
        raise BuildError(f"the build produced no extension for: {', '.join(absent)}")
    return package


def _layout_options(extensions: list[Any]) -> dict[str, Any]:
    """What a hand-written extension needs to read the compiled classes' fields: the
    include path of mypyc's group (its runtime headers and the generated ones) and the
    name of the group header declaring the object layouts, as ``PURGATORY_AIO_MYPYC_HEADER``
    (``_compact.c`` includes it). One group: mypycify builds one shared library."""
    groups = [ext for ext in extensions if ext.name.endswith("__mypyc")]
    if len(groups) != 1 or len(groups[0].sources) != 1:
        raise BuildError(
            f"expected mypyc to build one shared library from one C file, got "
            f"{[(ext.name, ext.sources) for ext in groups]}"
        )
    header = Path(groups[0].sources[0]).with_suffix(".h")
    if not header.is_file():
        raise BuildError(f"mypyc wrote no group header at {header}")
    return {
        "include_dirs": list(groups[0].include_dirs),
        "define_macros": [("PURGATORY_AIO_MYPYC_HEADER", f'"{header.name}"')],
    }


#: What the weakref fix puts before every compiled deallocator frees its object.
_CLEAR_WEAKREFS = "if (Py_TYPE(self)->tp_weaklistoffset) PyObject_ClearWeakRefs((PyObject *)self);"
_FREEING = re.compile(r"^(?P<indent>[ \t]*)CPy_TRASHCAN_BEGIN\(self, ", re.MULTILINE)
#: Every deallocator mypyc defines, and those the fix reached (by the function's name).
_DEALLOCATOR = re.compile(r"^[ \t]*(\w+_dealloc)\(\w+ \*self\)\s*\{", re.MULTILINE)
_PATCHED_DEALLOC = re.compile(
    re.escape(_CLEAR_WEAKREFS) + r"\n[ \t]*CPy_TRASHCAN_BEGIN\(self, (\w+_dealloc)\)"
)


def _clear_weakrefs_on_dealloc(extensions: list[Any]) -> None:
    """Make the generated deallocators clear weak references first.

    A compiled class with a Python class in its MRO (``DelayedOperation`` has
    ``typing.Generic``) gets ``__dict__`` and ``__weakref__`` slots of its own on
    Python < 3.12, so ``subtype_dealloc`` leaves the weak references to a user's
    subclass instance to it, and mypyc's deallocator then only drops the list's
    head pointer: calling a weak reference to a freed operation crashed the
    interpreter (``weakref.ref(op)()`` after ``del op``). Every deallocator now
    calls ``PyObject_ClearWeakRefs`` before freeing, as CPython's own
    ``subtype_dealloc`` does (a no-op where the list is already empty).
    ``tests/test_operation_weakrefs.py`` holds both builds to it. mypyc itself is
    compiled, so its code generator cannot be patched: the C it wrote is.
    """
    unpatched: list[str] = []
    found = 0
    for extension in extensions:
        for source in extension.sources:
            path = Path(source)
            text = path.read_text()
            text = _FREEING.sub(lambda m: f"{m['indent']}{_CLEAR_WEAKREFS}\n{m[0]}", text)
            path.write_text(text)
            # Checked per site: every deallocator mypyc wrote must have been patched.
            patched = set(_PATCHED_DEALLOC.findall(text))
            deallocators = set(_DEALLOCATOR.findall(text))
            found += len(deallocators)
            unpatched += sorted(deallocators - patched)
    if unpatched or not found:
        raise BuildError(
            "this mypyc version writes its deallocators differently: the weakref fix in "
            f"{Path(__file__).name} did not apply to {', '.join(unpatched) or 'any deallocator'}"
        )


# -- docstrings ---------------------------------------------------------------------------------
#
# mypyc drops every docstring: a compiled class, method or property has none, so help()
# and IDE hovers show nothing. The build restores what the pure source says, read from the
# source text (never by importing it) and exactly as this interpreter would report it:
# methods, functions and properties get it in their C definitions (a method's after the
# text signature mypyc writes), classes at import, from DOCS_FILE.


def collect_docs(root: Path) -> dict[str, Any]:
    """The docstrings and signatures of the compiled modules, read from their source.

    Read statically (the package is never imported at build time, so nothing about the
    interpreter building it, nor the package's own dependencies, can break the build):
    each module's top-level classes and functions and each class's methods, as the
    interpreter would define them. ``c``: by the prefix mypyc names a class's (or a
    module's) C functions with, the docstring of each method, function and property;
    ``runtime``: by module, the docstring of each class, and of each class's own
    ``__init__`` (empty for none) under ``inits``.
    """
    c_docs: dict[str, dict[str, str]] = {}
    runtime: dict[str, dict[str, Any]] = {}
    for name in COMPILED_MODULES:
        path = root / _PACKAGE / f"{name}.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        classes: dict[str, str | None] = {}
        inits: dict[str, str] = {}
        owners: list[tuple[str, list[ast.stmt]]] = [(name, tree.body)]
        for node in _definitions(tree.body):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = _docstring(node)
                owners.append((f"{name}___{node.name}", node.body))
                for member in _definitions(node.body):
                    if isinstance(member, ast.FunctionDef) and member.name == "__init__":
                        inits[node.name] = _docstring(member) or ""
        for prefix, body in owners:
            for node in _definitions(body):
                if isinstance(node, ast.AsyncFunctionDef):
                    raise BuildError(
                        f"{path.name}: {node.name} is a coroutine function; the compiled "
                        "modules keep their coroutines in interpreted code (see _shell.py)"
                    )
                if not isinstance(node, ast.FunctionDef) or _is_accessor(node):
                    continue
                doc = _docstring(node)
                if doc:
                    c_docs.setdefault(prefix, {})[node.name] = doc
        runtime[f"{_PACKAGE}.{name}"] = {"classes": classes, "inits": inits}
    return {"c": c_docs, "runtime": runtime}


#: A statement that defines a name: what the docstrings are read from.
_Definition = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def _definitions(body: list[ast.stmt]) -> list[_Definition]:
    """The statements of ``body`` that define a name there, the branches of an ``if``
    or ``try`` included (a later definition of a name replaces an earlier one, as at run
    time; dict order keeps the first position, as a namespace does)."""
    found: dict[str, _Definition] = {}
    for node in body:
        if isinstance(node, _Definition):
            if not _is_accessor(node):  # ``@x.setter``: the property keeps its getter's doc
                found[node.name] = node
            continue
        blocks: list[list[ast.stmt]] = []
        if isinstance(node, ast.If):
            blocks = [node.body, node.orelse]
        elif isinstance(node, ast.Try):
            blocks = [node.body, *(h.body for h in node.handlers), node.orelse]
        for block in blocks:
            found.update((inner.name, inner) for inner in _definitions(block))
    return list(found.values())


def _is_accessor(node: ast.stmt) -> bool:
    """A property's setter or deleter (``@name.setter``)."""
    return isinstance(node, ast.FunctionDef) and any(
        isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter")
        for d in node.decorator_list
    )


def _docstring(node: ast.ClassDef | ast.FunctionDef) -> str | None:
    """``node``'s docstring exactly as this interpreter reports it (3.13 and later strip
    its indentation when compiling): the docstring alone is compiled as a module's."""
    if not node.body:
        return None
    first = node.body[0]
    if not (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return None
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[first], type_ignores=[]), "<docstring>", "exec"), namespace)
    doc: str | None = namespace.get("__doc__")
    return doc


#: A method or module function in one of mypyc's method tables, with its doc: the
#: text signature mypyc wrote (``name($self, a, b)\n--\n\n``).
_METHOD_ENTRY = re.compile(
    r'\{"(?P<name>[^"]+)",\s*\(PyCFunction\)CPyPy_(?P<symbol>\w+),\s*(?P<flags>[\w |]+),'
    r'\s*PyDoc_STR\((?P<doc>"(?:[^"\\]|\\.)*")\)(?:\s*/\*[^*]*\*/)?\s*\}'
)
#: A property (or attribute) in a getset table; its doc is the NULL after the setter.
_GETSET_ENTRY = re.compile(
    r'\{"(?P<name>\w+)",\s*\(getter\)(?P<prefix>\w+)_get_(?P=name),'
    r"\s*(?P<setter>NULL|\(setter\)\w+),\s*NULL,"
)


def _carry_docs(extensions: list[Any], docs: dict[str, dict[str, str]]) -> None:
    """Write the pure modules' docstrings into the generated method and getset tables."""
    placed: set[tuple[str, str]] = set()

    def method(match: re.Match[str]) -> str:
        name, symbol = match["name"], match["symbol"]
        if not symbol.endswith(f"___{name}"):
            return match[0]
        prefix = symbol[: -len(name) - 3]
        doc = docs.get(prefix, {}).get(name)
        if doc is None:
            return match[0]
        placed.add((prefix, name))
        return match[0].replace(match["doc"], f"{match['doc']} {_c_string(doc)}", 1)

    def getset(match: re.Match[str]) -> str:
        doc = docs.get(match["prefix"], {}).get(match["name"])
        if doc is None:
            return match[0]
        placed.add((match["prefix"], match["name"]))
        return f"{match[0][: -len('NULL,')]}{_c_string(doc)},"

    for extension in extensions:
        for source in extension.sources:
            path = Path(source)
            text = path.read_text()
            patched = _GETSET_ENTRY.sub(getset, _METHOD_ENTRY.sub(method, text))
            if patched != text:
                path.write_text(patched)
    # Checked per site: every documented method, function and property must have been
    # given its docstring.
    expected = {(prefix, name) for prefix, names in docs.items() for name in names}
    missing = sorted(expected - placed)
    if missing:
        raise BuildError(
            "this mypyc version writes its method tables differently: the docstrings of "
            f"{', '.join(f'{prefix}.{name}' for prefix, name in missing)} could not be "
            f"placed by {Path(__file__).name}"
        )


def _c_string(text: str) -> str:
    """``text`` as C string literals (UTF-8, every byte outside printable ASCII escaped)."""
    pieces = []
    for start in range(0, len(text), 400):  # short literals: some compilers cap their length
        chunk = text[start : start + 400].encode("utf-8")
        escaped = "".join(
            chr(byte) if 0x20 <= byte < 0x7F and chr(byte) not in '"\\?' else f"\\{byte:03o}"
            for byte in chunk
        )
        pieces.append(f'"{escaped}"')
    return " ".join(pieces)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class CompiledCoreHook(BuildHookInterface[BuilderConfig]):
    """Put the compiled core into the wheel (see the module docstring)."""

    PLUGIN_NAME = "custom"
    _workdir: tempfile.TemporaryDirectory[str] | None = None

    def _mode(self, version: str) -> str:
        if self.target_name != "wheel" or version == "editable":
            return "pure"
        return requested_mode()

    def dependencies(self) -> list[str]:
        # Only a build that may compile pulls mypy into the isolated build env.
        return [] if requested_mode() == "pure" else list(COMPILE_REQUIRES)

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        mode = self._mode(version)
        if mode == "pure":
            return
        missing = missing_toolchain()
        if missing is not None:
            if mode == "compiled":
                raise BuildError(
                    f"{ENV_VAR}=compiled but {missing}: install a C compiler and the Python "
                    f"headers, or build the pure-Python core with {ENV_VAR}=pure"
                )
            self._fall_back(missing)
            return
        self._workdir = tempfile.TemporaryDirectory(prefix="purgatory-aio-mypyc-")
        out = Path(self._workdir.name)
        started = time.monotonic()
        try:
            package = build(out, source=Path(self.root) / _PACKAGE)
        except (Exception, SystemExit) as exc:  # setuptools exits when the C compiler fails
            if mode == "compiled":
                raise
            # auto: whatever broke the compiled build (mypyc, the compiler, a patch that
            # no longer applies), the pure build of the same source installs.
            self._workdir.cleanup()
            self._workdir = None
            self._fall_back(f"the compiled build failed ({_first_line(exc)})")
            return
        force_include = build_data.setdefault("force_include", {})
        for extension in package.glob("*.so"):
            force_include[str(extension)] = f"{_PACKAGE}/{extension.name}"
        for runtime in out.glob("*__mypyc*.so"):
            force_include[str(runtime)] = runtime.name
        force_include[str(package / DOCS_FILE)] = f"{_PACKAGE}/{DOCS_FILE}"
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        self.app.display_info(
            f"purgatory-aio: compiled {len(COMPILED_MODULES)} core modules with mypyc "
            f"in {time.monotonic() - started:.0f} s"
        )

    def _fall_back(self, why: str) -> None:
        """The one line ``auto`` says when it builds the pure core instead."""
        self.app.display_warning(
            f"purgatory-aio: {why}; building the pure-Python core "
            f"(slower; {ENV_VAR}=compiled makes this an error)"
        )

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self._workdir is not None:
            self._workdir.cleanup()


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        prog="python hatch_build.py",
        description="Compile a copy of purgatory_aio's core into a directory (mypyc).",
        epilog=doc.split("\n\n")[0],
    )
    parser.add_argument("--out", type=Path, default=Path("build/mypyc"))
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    missing = missing_toolchain()
    if missing is not None:
        print(f"cannot compile: {missing}", file=sys.stderr)
        return 1
    started = time.monotonic()
    try:
        package = build(args.out, quiet=not args.verbose)
    except BuildError as exc:
        print(f"cannot compile: {exc}", file=sys.stderr)
        return 1
    print(
        f"compiled {len(COMPILED_MODULES)} modules into {package} "
        f"in {time.monotonic() - started:.0f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
