"""What a timer holds: an entry (its deadline, bucket and links), and the handle of a
callback scheduled with :meth:`Timer.call_later` / :meth:`Timer.call_at`.

A :class:`~purgatory_aio._operation.DelayedOperation` is an entry too: the timer
holds it by its own fields, with no wrapper object per operation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, NoReturn, SupportsFloat, SupportsIndex

from ._errors import not_copyable
from ._native import mypyc_attr
from ._validation import check_seconds

if TYPE_CHECKING:
    from ._timer import Timer
    from ._wheels import Bucket

__all__ = ["TimerEntry", "TimerHandle"]


@mypyc_attr(allow_interpreted_subclasses=True)
class TimerEntry:
    """Something the timer can hold: a deadline, its bucket, and what to do when due.

    Subclasses implement :meth:`_fire`. The timer's wheels (``_wheels``) own
    ``_bucket``, ``_prev`` and ``_next`` (the links of the entry in its bucket); the
    entry's ``_deadline`` is set by whoever adds it (an operation's lifecycle, a
    handle itself), and the wheels place the entry by it without ever writing it.
    """

    __slots__ = ("_bucket", "_deadline", "_next", "_prev")

    _deadline: float
    _bucket: Bucket | None
    _prev: TimerEntry | None
    _next: TimerEntry | None

    def _fire(self) -> None:
        raise NotImplementedError


_PENDING: Final = 0
_FIRED: Final = 1
_CANCELLED: Final = 2


class TimerHandle(TimerEntry):
    """A callback scheduled on a :class:`Timer`; returned by ``call_later``/``call_at``."""

    __slots__ = ("_args", "_callback", "_state", "_timer")

    def __init__(
        self, timer: Timer, callback: Callable[..., object], args: tuple[Any, ...], when: float
    ) -> None:
        self._deadline = when
        self._bucket = None
        self._timer = timer
        self._callback: Callable[..., object] | None = callback
        self._args = args
        self._state = _PENDING

    def when(self) -> float:
        """The deadline, in the timer's clock."""
        return self._deadline

    def cancel(self) -> bool:
        """Withdraw the callback at once; True if this call stopped it from running."""
        if self._state != _PENDING:
            return False
        self._state = _CANCELLED
        self._callback = None
        self._args = ()
        if self._bucket is not None:
            self._timer.remove_entry(self)
        return True

    def cancelled(self) -> bool:
        """True once the timer was cancelled before its callback ran."""
        return self._state == _CANCELLED

    def pending(self) -> bool:
        """True while the callback is scheduled and has not run."""
        return self._state == _PENDING

    def reschedule(self, delay: SupportsFloat) -> None:
        """Move the handle to ``now + delay``, whether pending or already run."""
        if self._state == _CANCELLED:
            raise RuntimeError("cannot reschedule a cancelled timer handle")
        seconds = check_seconds(delay, "delay")
        timer = self._timer
        when = timer.time() + seconds
        if when >= timer.horizon:
            timer.beyond(delay)
        timer.check_loop()
        if self._bucket is not None:
            timer.remove_entry(self)
        self._state = _PENDING
        self._deadline = when
        timer.add_entry(self, when)

    def _fire(self) -> None:
        if self._state == _PENDING:
            self._state = _FIRED
            callback = self._callback
            assert callback is not None
            callback(*self._args)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise not_copyable(
            self, "a handle is the one claim on its timer's slot; schedule another callback instead"
        )

    def __repr__(self) -> str:
        state = ("pending", "done", "cancelled")[self._state]
        return f"<TimerHandle {state} when={getattr(self, '_deadline', None)} {self._callback!r}>"
