"""purgatory_aio: asyncio-native delayed operations on a hierarchical timing wheel.

Hold requests that complete when a condition on a key holds, or at a deadline —
long-poll fetches, acks=all writes, group joins, heartbeats — the way Kafka's
purgatory does, on one asyncio reaper and O(1) timers.
"""

from . import _build, _shell
from ._clock import Clock as Clock
from ._clock import LoopClock as LoopClock
from ._errors import PurgatoryClosed as PurgatoryClosed
from ._operation import DelayedOperation as DelayedOperation
from ._purgatory import Purgatory as Purgatory
from ._stats import PurgatoryStats as PurgatoryStats
from ._timer import Timer as Timer
from ._timer import TimerHandle as TimerHandle
from .events import EventSink as EventSink
from .events import OperationEvent as OperationEvent

__all__ = [
    "Clock",
    "DelayedOperation",
    "EventSink",
    "LoopClock",
    "OperationEvent",
    "Purgatory",
    "PurgatoryClosed",
    "PurgatoryStats",
    "Timer",
    "TimerHandle",
    "compiled",
]

__version__ = "0.1.0"

# The core's coroutine methods, coroutine functions on both builds (see _shell).
_shell.coroutine_methods(Purgatory, "__aenter__", "__aexit__", "shutdown")
_shell.coroutine_methods(Timer, "__aenter__", "__aexit__")

compiled: bool = _build.COMPILED
"""True when the hot modules run as compiled extensions: the compiled build, unless
``PURGATORY_AIO_NO_EXTENSIONS=1`` selected its pure source."""

if compiled:  # mypyc keeps no docstrings: the build saved them (see _native.restore_docs)
    from ._native import restore_docs as _restore_docs

    _restore_docs()
