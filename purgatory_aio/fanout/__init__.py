"""Completing operations across processes: publish key events anywhere, apply them everywhere.

A fan-out is a :class:`Fanout` over a :class:`FanoutBackend` (the engine).
``MemoryFanout`` (one process, tests) needs nothing more; ``RedisFanout`` needs
the ``redis`` extra (``pip install 'purgatory-aio[redis]'``) and is imported
only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import BackendHost as BackendHost
from ._base import Event as Event
from ._base import Fanout as Fanout
from ._base import FanoutBackend as FanoutBackend
from ._base import FanoutStats as FanoutStats
from ._base import FanoutUnavailable as FanoutUnavailable
from ._base import MalformedMessage as MalformedMessage
from ._base import ValueReached as ValueReached
from ._memory import MemoryFanout as MemoryFanout
from ._memory import MemoryHub as MemoryHub

if TYPE_CHECKING:
    from ._redis import ENV_URL as ENV_URL
    from ._redis import RedisFanout as RedisFanout

__all__ = [
    "ENV_URL",
    "BackendHost",
    "Event",
    "Fanout",
    "FanoutBackend",
    "FanoutStats",
    "FanoutUnavailable",
    "MalformedMessage",
    "MemoryFanout",
    "MemoryHub",
    "RedisFanout",
    "ValueReached",
]


def __getattr__(name: str) -> Any:
    # The Redis backend imports redis-py, an optional extra: load it on first use only.
    if name in ("RedisFanout", "ENV_URL"):
        from . import _redis

        return getattr(_redis, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
