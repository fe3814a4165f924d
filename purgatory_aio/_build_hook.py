"""Wheel build hook: put the compiled core into the wheel (opt-in).

``HATCH_BUILD_HOOK_ENABLE_CUSTOM=1 pip install .`` (or ``pip wheel .``) builds a
wheel whose hot modules are mypyc-compiled extensions beside their sources; a
plain build stays pure Python. Needs a C compiler. Used only by hatchling, never
imported at run time.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CompiledCoreHook(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        source = Path(self.root) / "purgatory_aio" / "_compile.py"
        spec = importlib.util.spec_from_file_location("_purgatory_aio_compile", source)
        assert spec is not None and spec.loader is not None
        compiler = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(compiler)
        out = Path(self.directory) / ".purgatory-aio-mypyc"
        package = compiler.build(out)
        force_include = build_data.setdefault("force_include", {})
        for extension in package.glob("*.so"):
            force_include[str(extension)] = f"purgatory_aio/{extension.name}"
        for runtime in out.glob("*__mypyc*.so"):
            force_include[str(runtime)] = runtime.name
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
