"""The owner of an operation: what an operation reads and calls on the one holding it.

Two owners implement it, as peers: a purgatory's :class:`~._lifecycle.Lifecycle`,
and the detached owner (:mod:`._detached`) of every operation no purgatory holds.
The operation does the aftermath of its own transitions (:mod:`._operation`: out of
the timer, its watch entries retired, counted, callbacks, settlement); the owner
gives it what that needs: its timer and watch store (None when detached), the
thread its loop runs on, the counters, and the few things only an owner can do
(hand a completion over to the loop thread, run callbacks in a task, record a
settlement, log a failed callback).

:class:`Owner` is a plain base class, not a ``typing.Protocol``: in the compiled
build it is a native class, so an operation's reads of ``op._owner.timer`` and its
calls through ``op._owner`` stay native attribute reads and vtable calls (through a
protocol they go through Python attribute lookup there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._native import i64

if TYPE_CHECKING:
    import anyio

    from ._operation import DelayedOperation
    from ._timer import Timer
    from ._watches import WatchStore

__all__ = ["Aftermath", "Owner"]

#: The aftermath of a transition that :meth:`Owner.hand_over` runs on the loop thread.
Aftermath = Callable[["DelayedOperation[Any]", "BaseException | None"], None]


class Owner:
    """What an operation reads and calls on its owner, and nothing else of it."""

    def __init__(self, name: str, *, detached: bool, observed: bool, offload: bool) -> None:
        self.name = name
        #: Whether this owner holds the operations no purgatory holds (see _detached):
        #: no timer, no watch store, no loop; the aftermath runs where it is won.
        self.detached = detached
        #: Whether a settlement is recorded anywhere (an event sink, the debug log).
        self.observed = observed
        #: Whether every callback runs in a worker thread, whatever its class says.
        self.offload = offload
        #: The operation class whose satisfied operations last had their callbacks run
        #: inline here (see runs_inline). A strong reference: no other class takes its
        #: address.
        self.inline_class: type | None = None
        #: The timer and the watch store holding its pending operations (None: detached).
        self.timer: Timer | None = None
        self.store: WatchStore | None = None
        #: The thread its loop runs on (-1: none yet, or detached).
        self.thread_id = -1
        #: How its operations left pending (counted by the operations' aftermath).
        self.n_completed: i64 = 0
        self.n_expired: i64 = 0
        self.n_cancelled: i64 = 0
        self.n_shutdown: i64 = 0
        self.n_errors: i64 = 0

    def runs_inline(self, cls: type[DelayedOperation[Any]], expired: int) -> bool:
        """Whether the callbacks of an operation of class ``cls``, satisfied (or
        ``expired``), run inline here rather than in a task or a worker thread.

        A class whose satisfied operations do is remembered (:attr:`inline_class`): the
        next completion of one of them reads no class attribute (a look-up through the
        type, the user's class and its metaclass: W1-cost, compiled, asyncio: -157
        instructions per operation).
        """
        inline = (cls._inline_expire if expired else cls._inline_complete) and not self.offload
        if inline and not expired:
            self.inline_class = cls
        return inline

    def claim_thread(self) -> bool:
        """Whether the calling thread, not the one last seen, now runs the owner's loop
        (then it becomes the loop thread)."""
        return False

    def hand_over(
        self, aftermath: Aftermath, op: DelayedOperation[Any], failure: BaseException | None
    ) -> None:
        """Run ``aftermath(op, failure)`` on the loop thread, from another thread."""
        raise NotImplementedError

    def callback_failed(self, op: DelayedOperation[Any], exc: BaseException, stage: str) -> None:
        """A callback of ``op`` raised ``exc``: log it (it becomes the outcome)."""
        raise NotImplementedError

    def check_can_complete(self, op: DelayedOperation[Any]) -> None:
        """Refuse, before anything changes, a completion that could not run its callbacks."""

    def limiter(self) -> anyio.CapacityLimiter | None:
        """The limiter of offloaded callbacks (None: anyio's default one)."""
        return None

    def spawn(self, op: DelayedOperation[Any], offload: bool) -> None:
        """Run ``op``'s callbacks in a task on the loop (they settle it when done)."""
        raise NotImplementedError

    def observe(self, op: DelayedOperation[Any]) -> None:
        """Record the settlement of ``op`` (called only when ``observed``)."""
