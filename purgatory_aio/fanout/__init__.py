"""Completing operations across processes: publish key events anywhere, apply them everywhere.

A fan-out is a :class:`Fanout` over a :class:`FanoutBackend` (the engine).
``MemoryFanout`` (one process, tests) needs nothing more; ``RedisFanout`` needs
the ``redis`` extra (``pip install 'purgatory-aio[redis]'``) and ``PostgresFanout``
the ``postgres`` extra (``pip install 'purgatory-aio[postgres]'``); each is
imported only when used. ``fanout_from_url`` picks one by URL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import ABANDON_AFTER as ABANDON_AFTER
from ._base import BackendHost as BackendHost
from ._base import Event as Event
from ._base import FanoutBackend as FanoutBackend
from ._base import FanoutUnavailable as FanoutUnavailable
from ._base import MalformedMessage as MalformedMessage
from ._factory import ENV_FANOUT_URL as ENV_FANOUT_URL
from ._factory import fanout_from_url as fanout_from_url
from ._fanout import Fanout as Fanout
from ._memory import MemoryFanout as MemoryFanout
from ._memory import MemoryHub as MemoryHub
from ._stats import FanoutStats as FanoutStats
from ._stream import ValueStream as ValueStream
from ._value_reached import MAX_LABEL_CHARS as MAX_LABEL_CHARS
from ._value_reached import MAX_LABELS as MAX_LABELS
from ._value_reached import ValueReached as ValueReached
from ._value_reached import check_label as check_label

if TYPE_CHECKING:
    from ._postgres import PostgresFanout as PostgresFanout
    from ._redis import ENV_URL as ENV_URL
    from ._redis import RedisFanout as RedisFanout

# In the order of the API reference (members_order: __all__): what an application uses
# first, then the in-process engine, the statistics and errors, and last the internals
# an engine is built from.
__all__ = [  # noqa: RUF022
    "Fanout",
    "PostgresFanout",
    "RedisFanout",
    "fanout_from_url",
    "ENV_FANOUT_URL",
    "ENV_URL",
    "MemoryFanout",
    "MemoryHub",
    "ValueReached",
    "ValueStream",
    "MAX_LABELS",
    "MAX_LABEL_CHARS",
    "check_label",
    "FanoutStats",
    "FanoutUnavailable",
    "MalformedMessage",
    "FanoutBackend",
    "BackendHost",
    "Event",
    "ABANDON_AFTER",
]


def __getattr__(name: str) -> Any:
    # The engines import their clients, optional extras: load them on first use only.
    if name in ("RedisFanout", "ENV_URL"):
        from . import _redis

        return getattr(_redis, name)
    if name == "PostgresFanout":
        from . import _postgres

        return _postgres.PostgresFanout
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
