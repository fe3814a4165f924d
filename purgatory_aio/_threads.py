"""The calling thread's identifier, as every module of the core asks for it.

The compiled build takes it from its ``_threadid`` extension: the same value as
``threading.get_ident()``, without a new int object per call (see ``_threadid.c``).
The pure build calls ``threading.get_ident`` itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

from . import _build

#: ``threading.get_ident``, or the compiled build's equal without an int per call.
get_ident: Final[Callable[[], int]] = _build.native("_threadid", "get_ident", threading.get_ident)

__all__ = ["get_ident"]
