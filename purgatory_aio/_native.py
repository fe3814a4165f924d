"""What the compiled build of the core needs from the source.

The hot modules (timer, wheel, operation, purgatory, callbacks) can be compiled
to C extension modules with mypyc (``python hatch_build.py``); the
same source runs unchanged as pure Python. Compiled classes cannot be
subclassed by interpreted code unless they say so, which is what
``mypyc_attr(allow_interpreted_subclasses=True)`` does for the classes users
and the rest of the package extend. Without mypy_extensions installed (a pure
install), the decorator is a no-op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - mypy_extensions comes with the dev install

    def mypyc_attr(*_args: object, **_attrs: object) -> Callable[[T], T]:  # type: ignore[misc]
        def keep(cls: T) -> T:
            return cls

        return keep


__all__ = ["mypyc_attr"]
