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


def refuse_subclass(base: str, subclass: type) -> TypeError:
    """The error a final class of the core raises for an attempted subclass."""
    return TypeError(
        f"{base} is final and cannot be subclassed (by {subclass.__qualname__}): "
        f"hold a {base} in your own class instead"
    )


__all__ = ["mypyc_attr", "refuse_subclass"]
