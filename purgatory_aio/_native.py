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

import importlib
import json
from collections.abc import Callable
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
    """Give the compiled classes the pure source's docstrings.

    mypyc keeps no docstring. The build (``hatch_build.py``) writes those of methods,
    functions and properties into the extensions themselves; a class cannot take its
    own there, so the build leaves them in a file beside the extensions, which this
    applies at import. (The compiled modules hold no coroutine function: the core's
    coroutines are interpreted, see ``_shell``.) Each class's ``__init__`` gets its
    parameters there too, from the class's own text signature (see ``_initsig.c``).
    """
    from . import _initsig  # the compiled build's only

    data: dict[str, Any] = json.loads(Path(__file__).with_name(_DOCS_FILE).read_text())
    for module_name, entries in data.items():
        module = importlib.import_module(module_name)
        for name, doc in entries["classes"].items():
            getattr(module, name).__doc__ = doc
        for name, doc in entries["inits"].items():
            cls = getattr(module, name)
            signature = cls.__text_signature__  # mypyc's: "(timeout)"
            if signature is not None:
                params = signature[1:-1]
                text = f"__init__($self{', ' if params else ''}{params})\n--\n\n{doc}"
                _initsig.show_init_signature(cls, text)


#: The file ``hatch_build.py`` writes beside the compiled extensions (its DOCS_FILE).
_DOCS_FILE = "_compiled_docs.json"


__all__ = ["mypyc_attr", "refuse_subclass", "restore_docs"]
