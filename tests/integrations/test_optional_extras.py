"""Each integration needs its extra and says so; the core needs none of them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Runs in a fresh interpreter where the given top-level packages cannot be imported.
_BLOCKED_IMPORT = textwrap.dedent(
    """
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"No module named {name!r}")
            return None

    BLOCKED = set(sys.argv[1].split(","))
    sys.meta_path.insert(0, Block())
    try:
        __import__(sys.argv[2])
    except ImportError as exc:
        print(f"ImportError: {exc}")
    else:
        print("imported")
    """
)


def import_without(module: str, *blocked: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKED_IMPORT, ",".join(blocked), module],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("purgatory_aio.integrations.fastapi", ["fastapi"], "fastapi"),
        ("purgatory_aio.integrations.fastapi", ["uvicorn"], "fastapi"),
        ("purgatory_aio.integrations.aiohttp", ["aiohttp"], "aiohttp"),
        ("purgatory_aio.metrics", ["prometheus_client"], "metrics"),
    ],
)
def test_an_integration_without_its_extra_names_the_extra_to_install(
    module: str, blocked: list[str], extra: str
) -> None:
    output = import_without(module, *blocked)
    assert output.startswith("ImportError")
    assert f"install purgatory-aio[{extra}]" in output


@pytest.mark.parametrize(
    "module", ["purgatory_aio.integrations.fastapi", "purgatory_aio.integrations.aiohttp"]
)
def test_the_framework_integrations_do_not_need_prometheus(module: str) -> None:
    assert import_without(module, "prometheus_client") == "imported"


def test_the_core_and_the_shared_integration_code_need_no_extra() -> None:
    extras = ("fastapi", "starlette", "uvicorn", "aiohttp", "prometheus_client")
    assert import_without("purgatory_aio.integrations", *extras) == "imported"


def test_the_core_never_imports_the_integrations() -> None:
    code = (
        "import sys, purgatory_aio, purgatory_aio.testing\n"
        "print(sorted(m for m in sys.modules if m.startswith('purgatory_aio.integrations')"
        " or m.split('.')[0] in ('fastapi', 'aiohttp', 'prometheus_client', 'uvicorn')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
