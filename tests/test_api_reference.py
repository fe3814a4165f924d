"""Every public name has a docstring and an entry in the API reference (``docs/reference/``).

A public module is one of the library's ``purgatory_aio/`` or the report's
``report/purgatory_report/`` (a distribution of its own) with no path component starting
with an underscore; its public names are its ``__all__``. The source is read statically (griffe,
as mkdocstrings reads it for the site), so this checks the same thing on the pure and the
compiled build and needs none of the optional extras importable.
"""

from __future__ import annotations

import re
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
#: ``::: dotted.path`` at the start of a line: a mkdocstrings entry.
DIRECTIVE = re.compile(r"^:::\s*(?P<path>[\w.]+)\s*$", re.MULTILINE)


#: Each documented package and the directory it lives in.
PACKAGE_ROOTS = {"purgatory_aio": ROOT, "purgatory_report": ROOT / "report"}


def _public_modules() -> list[str]:
    found = []
    for package, root in PACKAGE_ROOTS.items():
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if not any(part.startswith("_") for part in parts):
                found.append(".".join(parts))
    return found


PUBLIC_MODULES = _public_modules()
PACKAGES = {
    package: griffe.load(
        package,
        search_paths=[root, ROOT],
        resolve_aliases=True,
        resolve_external=False,
    )
    for package, root in PACKAGE_ROOTS.items()
}


def _module(path: str) -> griffe.Module:
    package, _, rest = path.partition(".")
    loaded = PACKAGES[package]
    if not rest:
        assert isinstance(loaded, griffe.Module)
        return loaded
    found = loaded[rest]
    assert isinstance(found, griffe.Module)
    return found


def _exports(module: griffe.Module) -> list[str]:
    return [str(name) for name in module.exports or ()]


def _target(obj: griffe.Object | griffe.Alias) -> griffe.Object:
    return obj.final_target if isinstance(obj, griffe.Alias) else obj


def _documented_in_class_or_base(cls: griffe.Class, name: str) -> bool:
    """A method or property documented where it is first declared counts for its
    overrides."""
    for owner in (cls, *cls.mro()):
        member = owner.members.get(name)
        if member is not None and _target(member).docstring:
            return True
    return False


def _documented_entries() -> set[str]:
    return {
        match["path"]
        for page in REFERENCE.rglob("*.md")
        for match in DIRECTIVE.finditer(page.read_text(encoding="utf-8"))
    }


EXPORTING = [m for m in PUBLIC_MODULES if _exports(_module(m))]


def test_there_are_public_modules_with_exports() -> None:
    assert "purgatory_aio" in EXPORTING and "purgatory_aio.testing" in EXPORTING


@pytest.mark.parametrize("path", PUBLIC_MODULES)
def test_public_module_has_a_docstring(path: str) -> None:
    assert _module(path).docstring, f"{path} has no module docstring"


@pytest.mark.parametrize("path", EXPORTING)
def test_module_with_exports_has_a_reference_entry(path: str) -> None:
    entries = _documented_entries()
    assert path in entries, (
        f"{path} defines __all__ but no page of docs/reference/ has '::: {path}'"
    )


@pytest.mark.parametrize("path", EXPORTING)
def test_every_exported_name_has_a_docstring(path: str) -> None:
    module = _module(path)
    missing = []
    for name in _exports(module):
        if name not in module.members:
            missing.append(f"{name} (in __all__ but not defined)")
            continue
        target = _target(module.members[name])
        if not target.docstring:
            missing.append(name)
        if isinstance(target, griffe.Class):
            missing += [
                f"{name}.{member}"
                for member, value in target.members.items()
                if not member.startswith("_")
                and (_target(value).is_function or "property" in _target(value).labels)
                and not _documented_in_class_or_base(target, member)
            ]
    assert not missing, f"{path}: public names without a docstring: {', '.join(missing)}"


def test_every_reference_entry_names_something_that_exists() -> None:
    for entry in _documented_entries():
        assert entry.split(".")[0] in PACKAGE_ROOTS, f"{entry}: not this project's"
        assert entry in PUBLIC_MODULES, f"::: {entry} is not a public module"


#: What an application of the fan-out uses: its reference page opens with these.
FANOUT_API = ["Fanout", "PostgresFanout", "RedisFanout", "fanout_from_url"]
#: The internals an engine is built from: after them on the page.
FANOUT_INTERNALS = {"FanoutBackend", "BackendHost", "Event", "ABANDON_AFTER"}


def test_the_fanout_reference_opens_with_what_an_application_uses() -> None:
    """The page lists the module's members in its ``__all__`` order, not by kind (which
    would put the constants, ``ABANDON_AFTER`` among them, first)."""
    page = (REFERENCE / "fanout.md").read_text(encoding="utf-8")
    assert re.search(r"^\s+members_order: __all__$", page, re.MULTILINE)
    assert re.search(r"^\s+group_by_category: false$", page, re.MULTILINE)
    exports = _exports(_module("purgatory_aio.fanout"))
    assert exports[: len(FANOUT_API)] == FANOUT_API
    assert set(exports) >= FANOUT_INTERNALS
