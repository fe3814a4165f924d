"""The public surface: names from the contract, exported and typed."""

from __future__ import annotations

import importlib
import pathlib

import purgatory_aio


def test_contract_names_import() -> None:
    from purgatory_aio import DelayedOperation, Purgatory, PurgatoryClosed, Timer
    from purgatory_aio.testing import ManualClock

    assert all((DelayedOperation, Purgatory, Timer, PurgatoryClosed, ManualClock))


def test_all_lists_every_public_name() -> None:
    public = {
        name
        for name in dir(purgatory_aio)
        if not name.startswith("_")
        and not isinstance(getattr(purgatory_aio, name), type(purgatory_aio))
    }
    assert public == set(purgatory_aio.__all__)
    for name in purgatory_aio.__all__:
        assert getattr(purgatory_aio, name) is not None


def test_package_is_typed() -> None:
    assert (pathlib.Path(purgatory_aio.__file__).parent / "py.typed").exists()


def test_core_imports_no_optional_dependency() -> None:
    import sys

    for module in ("purgatory_aio", "purgatory_aio.testing", "purgatory_aio.events"):
        importlib.import_module(module)
    heavy = {"pyspark", "pyarrow", "fastapi", "aiohttp", "prometheus_client", "uvloop", "rich"}
    core_files = pathlib.Path(purgatory_aio.__file__).parent.glob("_*.py")
    for path in core_files:
        text = path.read_text()
        for name in heavy:
            assert f"import {name}" not in text, f"{path.name} imports {name}"
    assert "purgatory_aio" in sys.modules
