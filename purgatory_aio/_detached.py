"""The detached owner: of every operation not (yet) handed to a purgatory.

An operation starts out here. Completed or cancelled before any purgatory holds it,
it settles where that happens: its callbacks run inline (or in a task on the
running loop, for async or offloaded ones), with no timer, watch list, counter or
event involved (the operation's aftermath, see ``_operation.completed``, skips all
that for it). It is a peer of :class:`~._lifecycle.Lifecycle`, not a kind of it: both
implement :class:`~._owner.Owner`, and this one holds no timer, no watch store and no
loop.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

from ._logging import get_logger
from ._owner import Owner
from ._shell import run_callbacks
from ._states import ENDED

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = ["DETACHED"]

_log: Final = get_logger("purgatory_aio.purgatory")

_running_loop: Final = asyncio._get_running_loop


class _Detached(Owner):
    """The owner of operations no purgatory holds: callbacks run where they complete."""

    def __init__(self) -> None:
        super().__init__("detached", detached=True, observed=False, offload=False)
        # Tasks of async callbacks: kept here so they are not collected mid-way.
        self._orphans: set[asyncio.Task[None]] = set()

    def check_can_complete(self, op: DelayedOperation[Any]) -> None:
        cls = type(op)
        # An ended operation is not refused: its force_complete loses the transition and
        # returns False, whatever its callbacks would have needed.
        if not cls._inline_complete and not op._state & ENDED and _running_loop() is None:
            what = "an async on_complete" if cls._async_complete else "offloaded callbacks"
            raise RuntimeError(
                f"{op!r} has {what} and no purgatory: complete it from a running event "
                "loop, or hand it to a purgatory first"
            )

    def callback_failed(self, op: DelayedOperation[Any], exc: BaseException, stage: str) -> None:
        _log.error("callback_error", op=repr(op), stage=stage, exc_info=exc)

    def spawn(self, op: DelayedOperation[Any], offload: bool) -> None:
        task = asyncio.get_running_loop().create_task(run_callbacks(self, op, offload))
        self._orphans.add(task)
        task.add_done_callback(self._orphans.discard)


#: The owner of every operation not (yet) handed to a purgatory.
DETACHED: Final = _Detached()
