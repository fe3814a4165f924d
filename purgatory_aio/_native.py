"""What the compiled build of the core needs from the source.

The hot modules (timer, wheel, operation, purgatory, callbacks) can be compiled
to C extension modules with mypyc (``python hatch_build.py``); the
same source runs unchanged as pure Python. Compiled classes cannot be
subclassed by interpreted code unless they say so, which is what
``mypyc_attr(allow_interpreted_subclasses=True)`` does for the classes users
extend (``DelayedOperation``, ``TimerEntry``). ``Purgatory`` and ``Timer`` are
final on both builds instead: the pure classes refuse subclasses through
:func:`refuse_subclass`, as the compiled ones do by themselves. Without
mypy_extensions installed (a pure install), the decorator is a no-op.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

try:
    from mypy_extensions import i64 as i64
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - mypy_extensions comes with the dev install
    # A machine int where compiled (no overflow checks), a plain int where not.
    i64 = int  # type: ignore[misc]

    def mypyc_attr(*_args: object, **_attrs: object) -> Callable[[T], T]:  # type: ignore[misc]
        def keep(cls: T) -> T:
            return cls

        return keep


def refuse_subclass(base: str, subclass: type) -> TypeError:
    """The error a final class of the core raises for an attempted subclass."""
    return TypeError(
        f"{base} is final and cannot be subclassed (by {subclass.__qualname__}): "
        f"hold a {base} in your own class instead"
    )


def restore_docs() -> None:
    """Give the compiled classes and coroutine functions the pure source's docstrings.

    mypyc keeps no docstring. The build (``hatch_build.py``) writes those of methods,
    functions and properties into the extensions themselves; classes and coroutine
    functions cannot take theirs there, so it leaves them in a file beside the
    extensions, which this applies at import: a class gets its ``__doc__``; a coroutine
    function (``Purgatory.shutdown``, ``__aenter__``, ...), whose compiled object takes
    no attribute, is replaced by a coroutine function with the pure one's docstring and
    signature that awaits it (one more coroutine per call, on none of the hot paths:
    the core's hot methods are not coroutines).
    """
    data: dict[str, Any] = json.loads(Path(__file__).with_name(_DOCS_FILE).read_text())
    for module_name, entries in data.items():
        module = importlib.import_module(module_name)
        for name, doc in entries["classes"].items():
            getattr(module, name).__doc__ = doc
        for qualname, spec in entries["coroutines"].items():
            owner: Any = module
            *path, name = qualname.split(".")
            for part in path:
                owner = getattr(owner, part)
            compiled = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
            if not inspect.isfunction(compiled):  # a Python function is one restored already
                setattr(owner, name, _documented(compiled, qualname, module_name, spec))


#: The file ``hatch_build.py`` writes beside the compiled extensions (its DOCS_FILE).
_DOCS_FILE = "_compiled_docs.json"


def _documented(
    compiled: Callable[..., Coroutine[Any, Any, Any]],
    qualname: str,
    module: str,
    spec: dict[str, Any],
) -> Callable[..., Coroutine[Any, Any, Any]]:
    async def documented(*args: Any, **kwargs: Any) -> Any:
        return await compiled(*args, **kwargs)

    documented.__name__ = qualname.rsplit(".", 1)[-1]
    documented.__qualname__ = qualname
    documented.__module__ = module
    documented.__doc__ = spec["doc"]
    documented.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                name,
                inspect._ParameterKind(kind),
                default=inspect.Parameter.empty if default is None else ast.literal_eval(default),
                annotation=inspect.Parameter.empty if annotation is None else annotation,
            )
            for name, kind, default, annotation in spec["signature"]["params"]
        ],
        return_annotation=(
            inspect.Signature.empty
            if spec["signature"]["returns"] is None
            else spec["signature"]["returns"]
        ),
    )
    return documented


__all__ = ["mypyc_attr", "refuse_subclass", "restore_docs"]
