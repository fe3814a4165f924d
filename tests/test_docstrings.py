"""help() on the installed build shows what the pure source says, for every public name.

The reference is the checkout's pure source, imported in a subprocess; the installed build
(compiled or pure) must agree with it on every name of every public module's ``__all__``
and on each of their members that is public or documented: the same ``__doc__``, and the
same signature as ``inspect.signature`` reads it. Signatures are compared by parameter
names, kinds and defaults: a compiled method's signature is a text signature, which
cannot carry annotations, and its ``self`` is positional-only there.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import pkgutil
import pydoc
import re
import subprocess
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

import purgatory_aio
from purgatory_aio import _build

CHECKOUT = Path(__file__).resolve().parent.parent
#: Where an object's repr names its address, which differs between processes.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


#: Public modules that every environment imports (the core's own).
CORE_MODULES = ("purgatory_aio", "purgatory_aio.events", "purgatory_aio.testing")


def public_modules() -> list[str]:
    names = ["purgatory_aio"]
    for info in pkgutil.walk_packages(purgatory_aio.__path__, "purgatory_aio."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def _signature(obj: Any) -> list[Any] | str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError) as exc:
        return f"no signature ({type(exc).__name__})"
    params = []
    for index, param in enumerate(signature.parameters.values()):
        kind = param.kind.name
        if index == 0 and param.name in ("self", "cls"):
            kind = "self"
        default = None if param.default is param.empty else _ADDRESS.sub("", repr(param.default))
        params.append([param.name, kind, default])
    return params


def _documented(cls: type, names: list[str] | None = None) -> dict[str, Any]:
    """A class's own members that help() shows: public ones, its ``__init__`` (whose
    parameters help() shows), and documented dunders (``names``: these members instead,
    as the reference found them)."""
    members = {}
    for name in list(vars(cls)) if names is None else names:
        raw = inspect.getattr_static(cls, name, None)
        # A compiled class's properties are getset descriptors.
        attribute = isinstance(raw, property) or inspect.isgetsetdescriptor(raw)
        shown = (
            name == "__init__"
            or not name.startswith("_")
            or bool(name.startswith("__") and _doc(cls, name))
        )
        if names is None and (
            not (attribute or isinstance(raw, staticmethod | classmethod) or callable(raw))
            or not shown
        ):
            continue
        if attribute:
            members[name] = {"doc": raw.__doc__}
        elif callable(raw) or isinstance(raw, staticmethod | classmethod):
            member = getattr(cls, name)
            members[name] = {"doc": member.__doc__, "signature": _signature(member)}
        else:
            members[name] = {"missing": repr(raw)}
    return members


def _doc(cls: type, name: str) -> str | None:
    doc: str | None = getattr(cls, name).__doc__
    return doc


def describe(reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every public name's documentation, as the imported build shows it (of the members
    the ``reference`` describes, when given)."""
    described: dict[str, Any] = {}
    for module_name in public_modules():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            # A module of an optional extra this environment lacks (its error names the
            # extra to install): left out on both sides alike. Such modules are
            # interpreted on every build; the core's never need an extra.
            if "purgatory-aio[" not in str(exc) or module_name in CORE_MODULES:
                raise
            continue
        for name in getattr(module, "__all__", ()):
            try:
                obj = getattr(module, name)
            except ImportError as exc:  # a lazily imported name of a missing extra
                if "purgatory-aio[" not in str(exc) or module_name in CORE_MODULES:
                    raise
                continue
            key = f"{module_name}.{name}"
            if isinstance(obj, type):
                described[key] = {
                    "doc": obj.__doc__,
                    "signature": _signature(obj),
                    "members": _documented(
                        obj, None if reference is None else list(reference[key]["members"])
                    ),
                }
            elif callable(obj):
                described[key] = {"doc": obj.__doc__, "signature": _signature(obj)}
    return described


def _pure_reference() -> dict[str, Any]:
    script = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); import purgatory_aio; "
        "assert not purgatory_aio.compiled, purgatory_aio.__file__; "
        "sys.path.insert(0, sys.argv[2]); import test_docstrings; "
        "print(json.dumps(test_docstrings.describe()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(CHECKOUT), str(CHECKOUT / "tests")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        cwd=CHECKOUT,
    )
    assert done.returncode == 0, done.stderr
    reference: dict[str, Any] = json.loads(done.stdout)
    return reference


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return _pure_reference()


def test_every_public_name_is_documented_as_in_the_pure_source(reference: dict[str, Any]) -> None:
    installed = json.loads(json.dumps(describe(reference)))  # tuples and lists alike
    assert installed.keys() == reference.keys()
    for key, expected in reference.items():
        assert installed[key] == expected, key


def test_the_core_classes_are_documented(reference: dict[str, Any]) -> None:
    # The reference itself says something: no empty docs on the core's public classes.
    for name in ("Purgatory", "DelayedOperation", "Timer", "TimerHandle"):
        described = reference[f"purgatory_aio.{name}"]
        assert described["doc"], name
    members = reference["purgatory_aio.Purgatory"]["members"]
    assert members["try_complete_else_watch"]["doc"]
    assert [p[0] for p in members["try_complete_else_watch"]["signature"]] == [
        "self",
        "op",
        "keys",
    ]


def _unwrapped(text: str) -> str:
    """pydoc's text with each signature broken over lines (3.13) put back on one."""
    text = re.sub(r"\(\n \|\s+", "(", text)
    text = re.sub(r",\n \|\s+", ", ", text)
    return re.sub(r"\n \|\s+\)", ")", text)


def test_help_shows_the_docstrings_and_signatures() -> None:
    from purgatory_aio import DelayedOperation, Purgatory

    # 3.13's pydoc breaks a long signature over lines: read it as one.
    text = _unwrapped(pydoc.render_doc(Purgatory, renderer=pydoc.plaintext))
    assert "Holds delayed operations until their condition holds" in text
    assert "try_complete_else_watch(self" in text
    assert "Try once; if not completed, watch ``op`` under every key" in text
    assert "shutdown(self, *, expire_pending" in text
    assert "Stop the reaper and settle every pending operation." in text
    assert "num_delayed\n |      Pending operations in the timer." in text
    op_text = _unwrapped(pydoc.render_doc(DelayedOperation, renderer=pydoc.plaintext))
    assert "outcome\n |      How it left *pending*" in op_text
    assert "force_complete(self" in op_text


def test_help_on_init_shows_the_parameters_of_every_public_class(
    reference: dict[str, Any],
) -> None:
    """On either build, ``help(cls.__init__)`` of every public class defining one shows the
    pure source's parameters: on the compiled one, not the slot wrapper's generic
    ``(self, /, *args, **kwargs)``."""
    inits = {
        key: described["members"]["__init__"]["signature"]
        for key, described in reference.items()
        if "__init__" in described.get("members", {})
    }
    assert {"purgatory_aio.DelayedOperation", "purgatory_aio.Purgatory"} <= set(inits)
    for key, expected in inits.items():
        module, _, name = key.rpartition(".")
        init = getattr(importlib.import_module(module), name).__init__
        assert json.loads(json.dumps(_signature(init))) == expected, key
        # 3.13's pydoc breaks a long signature into a line per parameter: one line again.
        text = re.sub(
            r"(?<=[(,])\n\s+|\n(?=\))", "", pydoc.render_doc(init, renderer=pydoc.plaintext)
        )
        # A Protocol's is typing's own, under its own name.
        line = next(line for line in text.splitlines() if re.match(r"\w+\(self", line))
        for param, _, _ in expected[1:]:
            assert re.search(rf"[(,]\s*\**{param}\b", line), (key, param, line)
        if not any(kind.startswith("VAR_") for _, kind, _ in expected):
            assert "*args" not in line and "**kwargs" not in line, (key, line)
    from purgatory_aio import DelayedOperation

    assert list(inspect.signature(DelayedOperation).parameters) == ["timeout"]
    text = pydoc.render_doc(DelayedOperation.__init__, renderer=pydoc.plaintext)
    assert "*args" not in text
    assert re.search(r"__init__\(self, (/, )?timeout\b", text)
    if purgatory_aio.compiled:
        # Still the slot wrapper of mypyc's C initialiser (see _initsig.c), which a
        # subclass inheriting __init__ keeps calling directly.
        init = DelayedOperation.__dict__["__init__"]
        assert isinstance(init, types.WrapperDescriptorType)


def test_only_a_compiled_class_s_own_slot_wrapper_takes_a_signature() -> None:
    if not purgatory_aio.compiled:
        pytest.skip("_initsig is the compiled build's")
    from purgatory_aio import DelayedOperation, _initsig

    class Interpreted:
        def __init__(self) -> None:
            pass

    class Inheriting(DelayedOperation[None]):
        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> None:
            pass

        def on_expiration(self) -> None:
            pass

    before = DelayedOperation.__dict__["__init__"]
    cases: list[tuple[Any, Any, type[Exception], str]] = [
        (DelayedOperation, b"__init__($self)", TypeError, "cls a class, doc a str"),
        ("DelayedOperation", "__init__($self)", TypeError, "cls a class, doc a str"),
        (int, "__init__($self)\n--\n\n", TypeError, "int is a static type"),
        (DelayedOperation, "timeout)\n--\n\n", ValueError, "must start with"),
        (DelayedOperation, "__init__($self)\x00", ValueError, "no NUL character"),
        (Interpreted, "__init__($self)\n--\n\n", TypeError, "is not the slot wrapper"),
        (Inheriting, "__init__($self)\n--\n\n", TypeError, "has no __init__ of its own"),
    ]
    for cls, doc, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            _initsig.show_init_signature(cls, doc)
    assert DelayedOperation.__dict__["__init__"] is before
    assert "__init__" not in vars(Inheriting)


def test_signatures_of_bound_methods_leave_self_out() -> None:
    from purgatory_aio import Purgatory

    p = Purgatory("docs")
    assert list(inspect.signature(p.try_complete_else_watch).parameters) == ["op", "keys"]
    assert list(inspect.signature(p.shutdown).parameters) == ["expire_pending"]
    assert list(inspect.signature(p.advance_key).parameters) == ["key", "value"]
    assert inspect.iscoroutinefunction(Purgatory.shutdown)


def test_the_compiled_wheel_carries_what_the_extensions_cannot_hold() -> None:
    import hatch_build

    directory = os.environ.get("PURGATORY_AIO_WHEEL_DIR")
    if not directory:
        pytest.skip("PURGATORY_AIO_WHEEL_DIR is unset: the wheel checks run under `make test`")
    (wheel,) = Path(directory).glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    # Whichever implementation runs: the wheel with the extensions carries their docs.
    assert (f"purgatory_aio/{hatch_build.DOCS_FILE}" in names) is _build._has_extension("_timer")


def test_restoring_the_docs_twice_changes_nothing() -> None:
    from purgatory_aio import Purgatory, _native

    if not purgatory_aio.compiled:
        pytest.skip("only the compiled build restores docstrings at import")
    shutdown, init = Purgatory.__dict__["shutdown"], Purgatory.__dict__["__init__"]
    _native.restore_docs()
    assert Purgatory.__dict__["shutdown"] is shutdown
    assert Purgatory.__dict__["__init__"] is init


@pytest.mark.parametrize(
    "text", ["plain", 'quotes " and \\ and ??=', "é ✓\n\ttabs\x00", "x" * 1000]
)
def test_docstrings_become_c_string_literals_byte_for_byte(text: str) -> None:
    import hatch_build

    literal = hatch_build._c_string(text)
    # Adjacent C literals; their escapes (three-digit octal) read the same in Python bytes.
    pieces = re.findall(r'"([^"]*)"', literal)
    assert literal == " ".join(f'"{piece}"' for piece in pieces)
    assert b"".join(ast.literal_eval(f'b"{piece}"') for piece in pieces) == text.encode("utf-8")
