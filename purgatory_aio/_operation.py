"""DelayedOperation: completes when its condition holds, or at its deadline at the latest.

An operation owns its admission, its state word and what follows a transition. Each
transition out of *pending* (completed: satisfied, expired or shut down; or cancelled) is
one guarded update of that word: one of any number of concurrent calls wins, from any
thread, and runs the aftermath here, in Kafka's shape: out of the timer, watch entries
retired, counted, callbacks, settled. What only its owner (:class:`~._owner.Owner`) can
do, it asks of it.
"""

from __future__ import annotations

import asyncio
import typing
from abc import ABCMeta, abstractmethod
from collections.abc import Awaitable, Generator, Hashable, Iterable
from typing import Any, ClassVar, Final, Generic, SupportsFloat, SupportsIndex, TypeVar, final

from . import _copying, _gc, _threads
from ._copying import fresh as _fresh  # noqa: F401  (where pickles of old releases find it)
from ._detached import DETACHED
from ._entry import TimerEntry
from ._errors import FATAL, unimplemented, uninitialised
from ._keys import check_keys, not_an_operation, not_fresh, watching_failed
from ._native import i64, mypyc_attr
from ._owner import Owner
from ._shell import callback_raised
from ._states import (
    CANCELLED,
    COMPLETED,
    ENDED,
    EXPIRED,
    FAILED,
    LOCKED,
    NOT_WATCHED,
    SETTLED,
    SHUTDOWN,
    acquire,
    describe,
    final_state,
    release,
    shown,
    state_of,
)
from ._validation import INF, check_seconds
from ._waiters import not_a_result, release_waiters, wait
from .events import Outcome

if typing.TYPE_CHECKING:
    from ._lifecycle import Lifecycle

__all__ = [
    "DelayedOperation",
    "admit",
    "cancelled",
    "completed",
    "settle",
    "tried_raising",
    "try_guarded",
]

R = TypeVar("R")

_get_ident: Final = _threads.get_ident  # threading.get_ident, see _threads
# Statics in the compiled build (see _gc), so each is one C call; None in the pure build.
_track: Final = _gc.track
_untrack: Final = _gc.untrack


@mypyc_attr(allow_interpreted_subclasses=True)
class DelayedOperation(TimerEntry, Generic[R], metaclass=ABCMeta):
    """An operation that completes when a condition holds, or at its deadline.

    Subclass it, implement :meth:`try_complete` (cheap, synchronous: check the
    condition and ``return self.force_complete()`` if it holds) and
    :meth:`on_complete` (sync or ``async``; builds the result, runs exactly once
    whether the operation was satisfied or expired). Optionally override
    :meth:`on_expiration`.

    Class attributes:
        op_type: name used in the event log (the class name by default).
        offload_callbacks: run synchronous callbacks in a worker thread
            (anyio, bounded by the purgatory's limiter) instead of on the loop.
        untrack_while_pending: True by default: on the compiled build, while a
            purgatory holds the operation (pending in its timer), the operation
            and its instance ``__dict__`` are out of the cyclic garbage collector,
            like msgspec's ``Struct(gc=False)``, so full collections do not
            traverse parked operations; settling puts them back. Objects only the
            operation references stay reachable meanwhile, and
            ``gc.get_referrers`` does not see the operation's ``__dict__`` as a
            referrer until it settles. Set it to False for a class whose pending
            operations must stay visible to the collector (``gc.get_referrers``
            on what they hold, ``gc.get_objects``). The pure build tracks every
            object as usual.

    Examples:
        >>> class WaitForOffset(DelayedOperation[int]):
        ...     def __init__(self, log, offset, timeout):
        ...         super().__init__(timeout)
        ...         self.log, self.offset = log, offset
        ...     def try_complete(self):
        ...         return self.log.end >= self.offset and self.force_complete()
        ...     def on_complete(self):
        ...         return self.log.end
    """

    # One writer per slot. Who writes each slot once __init__ has set it (TimerEntry's
    # four included), the modules named (tests/test_slot_writers.py holds the code to
    # this table; "-" means nothing after __init__):
    #   _timeout   -                     the timeout given
    #   _owner     _operation            its purgatory's lifecycle from admission (admit)
    #                                    on (and the detached owner again if refused)
    #   _keys      _operation            the keys it was handed over with (admit)
    #   _deadline  _operation            when it expires, stamped by admit before its
    #                                    tries (the timer places it by it, never writes it)
    #   _busy      _operation            a try of it is under way (try_guarded, and its
    #                                    two copies in admit)
    #   _outcome   _operation            its result or exception, at settlement
    #   _state     _operation            the state word: transitions, settlement
    #   _waiter    _waiters              the futures of its awaiters
    #   _store     _watches              where the store holds it
    #   _ident     _watches              its serial number in long watch lists
    #   _bucket    _wheels               its timer bucket, and its neighbours there
    #   _prev      _wheels
    #   _next      _wheels
    __slots__ = ("_busy", "_ident", "_keys", "_outcome", "_owner", "_state", "_store",
                 "_timeout", "_waiter")  # fmt: skip

    op_type: ClassVar[str | None] = None
    offload_callbacks: ClassVar[bool] = False
    # Read by the compiled build's C helper off the class (see _gc), never per instance.
    untrack_while_pending: ClassVar[bool] = True
    _async_complete: ClassVar[bool] = False
    _async_expire: ClassVar[bool] = False
    # Whether a satisfied / an expired one's callbacks run inline: one read per completion.
    _inline_complete: ClassVar[bool] = True
    _inline_expire: ClassVar[bool] = True
    # Abstract methods a class leaves unimplemented, for __init__ to refuse (the compiled
    # build's classes do not go through ABCMeta).
    _unimplemented: ClassVar[tuple[str, ...]] = ("on_complete", "try_complete")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._unimplemented, cls._async_complete, cls._async_expire = _copying.class_traits(
            cls, DelayedOperation
        )
        cls._inline_complete = not (cls._async_complete or cls.offload_callbacks)
        cls._inline_expire = cls._inline_complete and not cls._async_expire

    def __init__(self, timeout: SupportsFloat) -> None:
        if self._unimplemented:
            raise unimplemented(self, self._unimplemented)
        # Typed as a protocol so that the compiled build leaves bad input to this check.
        # Exactly float: a subclass may override its comparisons (or __float__), so it
        # goes through check_seconds, which tests the float it converts it to.
        seconds: float
        if type(timeout) is float and 0.0 <= timeout < INF:
            seconds = timeout
        else:
            seconds = check_seconds(timeout, "timeout")
        self._timeout = seconds
        self._state: i64 = 0
        self._busy = False
        self._bucket = None
        self._owner: Owner = DETACHED
        self._keys: tuple[Hashable, ...] = ()
        self._store: i64 = NOT_WATCHED  # where the watch store holds it (see _watches)
        self._ident: object = None  # its key in long watch lists, once in one
        self._waiter: asyncio.Future[None] | list[asyncio.Future[None]] | None = None
        self._outcome: Any = None

    # -- to implement ------------------------------------------------------------------------

    @abstractmethod
    def try_complete(self) -> bool:
        """Check the condition; if it holds ``return self.force_complete()``, else False."""

    @abstractmethod
    def on_complete(self) -> R | Awaitable[R]:
        """Build the result. Runs exactly once, satisfied or expired; may be ``async``."""

    def on_expiration(self) -> Awaitable[None] | None:
        """Runs after :meth:`on_complete`, only when the operation expired."""
        return None

    # -- state -------------------------------------------------------------------------------
    # Methods marked @final are not meant to be overridden. One whose __init__ skipped
    # DelayedOperation.__init__ is refused by name by every public member (see _states).

    @property
    @final
    def timeout(self) -> float:
        """The timeout given to ``__init__``, in seconds."""
        try:
            return self._timeout
        except AttributeError:
            raise uninitialised(self) from None

    @property
    @final
    def deadline(self) -> float | None:
        """Clock time at which it expires, once handed to a purgatory."""
        try:
            return self._deadline if self._owner is not DETACHED else None
        except AttributeError:
            raise uninitialised(self) from None

    @property
    @final
    def keys(self) -> tuple[Hashable, ...]:
        """The keys it was handed to a purgatory with; empty before that."""
        try:
            return self._keys
        except AttributeError:
            raise uninitialised(self) from None

    @property
    @final
    def is_completed(self) -> bool:
        """True once completed: satisfied, expired, or by shutdown (not when cancelled)."""
        return bool(state_of(self) & COMPLETED)

    @property
    @final
    def expired(self) -> bool:
        """True if it was completed by its deadline passing (or by shutdown: :attr:`outcome`
        tells the two apart)."""
        return bool(state_of(self) & EXPIRED)

    @property
    @final
    def cancelled(self) -> bool:
        """True if it was withdrawn without completing (``on_complete`` never ran)."""
        return bool(state_of(self) & CANCELLED)

    @property
    @final
    def outcome(self) -> Outcome | None:
        """How it left *pending*, in the words of the event log and ``stats()``; None
        while pending.

        ``"completed"``: satisfied (``force_complete``); ``"expired"``: its deadline
        passed; ``"shutdown"``: the purgatory shut down (``expired`` is True then too,
        and its callbacks ran as for an expiry); ``"cancelled"``: withdrawn. An
        operation whose callback raised keeps its outcome and carries the exception
        (``await op`` raises it). Decided at the transition, before the callbacks run:
        ``done()`` says when the result is final.
        """
        state = state_of(self)
        return describe(state) if state & ENDED else None  # type: ignore[return-value]

    @final
    def done(self) -> bool:
        """True once settled: the result, exception or cancellation is final."""
        return bool(state_of(self) & SETTLED)

    @final
    def result(self) -> R:
        """The result of a settled operation (like ``Future.result``)."""
        if final_state(self) & FAILED:
            raise self._outcome
        return self._outcome  # type: ignore[no-any-return]

    @final
    def exception(self) -> BaseException | None:
        """The exception of a settled, failed operation, else None."""
        return self._outcome if final_state(self) & FAILED else None

    # -- transitions: flip the state word, report who won, hand the winner to the owner ------

    def force_complete(self) -> bool:
        """Complete now; True only for the one call that completed it.

        Removes it from the timer and runs :meth:`on_complete`. Safe from any
        thread: off the purgatory's loop thread the rest is handed to the loop.
        """
        try:
            detached = self._owner is DETACHED
        except AttributeError:  # the one read that can fail: see "state" above
            raise uninitialised(self) from None
        if detached:
            DETACHED.check_can_complete(self)  # refuses before anything changes
        if LOCKED:  # transition(), inlined: every satisfied operation's path
            acquire()
        state = self._state
        owner = self._owner
        if state & ENDED:
            if LOCKED:
                release()
            return False
        self._state = state | COMPLETED
        if LOCKED:
            release()
        completed(self, None, owner)  # the owner read under the lock: see admit
        return True

    def cancel(self) -> bool:
        """Withdraw a pending operation: ``on_complete`` never runs, awaiters get
        :class:`asyncio.CancelledError`. True if this call withdrew it."""
        try:
            won = transition(self, CANCELLED)
        except AttributeError:  # transition() reads the state word before any lock
            raise uninitialised(self) from None
        if not won:
            return False
        cancelled(self, None)
        return True

    @final
    def _fire(self) -> None:
        """The timer says the deadline has passed (always on the loop thread)."""
        if transition(self, COMPLETED | EXPIRED):
            completed(self, None)

    # -- awaiting, copying and pickling (their work is _waiters' and _copying's) -------------

    def __await__(self) -> Generator[Any, None, R]:
        return wait(self, state_of(self))  # see _waiters.wait

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        """``copy.copy``, ``copy.deepcopy`` and ``pickle``: of a fresh operation only.

        An operation handed to a purgatory, completed or cancelled is one live claim
        on its timer slot, its watch lists, its awaiters and its result; a copy would
        be a second claim on the same, so it is refused with a TypeError. A fresh one
        is copied as a new fresh operation of the same class with the same timeout and
        what :meth:`__getstate__` returns. The subclass's ``__init__`` does not run
        again, as with any unpickled object.
        """
        return _copying.reduce(self)

    def __getstate__(self) -> object:
        """The subclass's own state: its ``__dict__`` and its ``__slots__``, in one dict
        (None when it has none). The library's own state is never part of it."""
        return _copying.subclass_state(self, DelayedOperation)

    def __setstate__(self, state: object) -> None:
        """Restores what :meth:`__getstate__` returned (or ``object``'s ``(dict, slots)``
        form), as attributes: never a name of the library's own classes.

        Everything is checked before anything is set: a refused state (TypeError for
        one that is not a dict of attribute names, ValueError for a library name)
        leaves the operation as it was.
        """
        _copying.restore_state(self, state, DelayedOperation)

    def __repr__(self) -> str:
        return shown(self)  # never raises (see _states.shown)


# -- the aftermath of a transition, run by the operation that won it ---------------------------


def completed(
    op: DelayedOperation[Any], failure: BaseException | None, owner: Owner | None = None
) -> None:
    """``op`` won *completed* (satisfied, expired or shut down), or ``try_complete``
    raised ``failure``: everything up to its settlement. Off its purgatory's loop
    thread all of it is handed to the loop; detached, the callbacks run right here.
    """
    if owner is None:
        owner = op._owner
    if not owner.detached:
        if owner.thread_id != _get_ident() and not owner.claim_thread():
            owner.hand_over(completed, op, failure)
            return
        # Won on the loop thread: if a try of op is under way, this is its doing (see
        # tried_raising, which reads this when try_complete raises after completing).
        op._busy = False
        if op._bucket is not None:
            owner.timer.remove_entry(op)  # type: ignore[union-attr]
        if op._store:
            owner.store.retire(op)  # type: ignore[union-attr]
        state = op._state
        if not state & EXPIRED:
            owner.n_completed += 1
        elif state & SHUTDOWN:
            owner.n_shutdown += 1
        else:
            owner.n_expired += 1
    if failure is not None:
        settle(op, failure, True)
        return
    cls = type(op)
    expired = op._state & EXPIRED
    # Satisfied ones of the class last seen inline ask nothing (see Owner.runs_inline: -157).
    if (cls is owner.inline_class and not expired) or owner.runs_inline(cls, expired):
        stage = "on_complete"
        try:
            result = op.on_complete()
            if expired:
                stage = "on_expiration"
                op.on_expiration()
        except BaseException as exc:
            callback_raised(op, exc, stage)
        else:
            settle(op, result, False)
        return
    owner.spawn(op, cls.offload_callbacks or owner.offload)


def cancelled(op: DelayedOperation[Any], failure: BaseException | None) -> None:
    """``op`` won *cancelled*: withdrawn as by :func:`completed`, but no callback runs and
    awaiters get CancelledError (``failure`` is None: the shape hand_over runs)."""
    owner = op._owner
    if not owner.detached:
        if owner.thread_id != _get_ident() and not owner.claim_thread():
            owner.hand_over(cancelled, op, failure)
            return
        if op._bucket is not None:
            owner.timer.remove_entry(op)  # type: ignore[union-attr]
        if op._store:
            owner.store.retire(op)  # type: ignore[union-attr]
        owner.n_cancelled += 1
    settle(op, None, False)


def settle(op: DelayedOperation[Any], outcome: Any, failed: bool) -> None:
    """Record the outcome, release awaiters, emit the event (once per operation)."""
    if _track is not None:
        _track(op)  # untracked while pending (admit): the collector's again
    if failed:  # a branch the state bits needed anyway: success costs nothing more
        if isinstance(outcome, StopIteration):
            outcome = not_a_result(outcome)
        op._outcome = outcome
        op._state |= SETTLED | FAILED
    else:
        op._outcome = outcome
        op._state |= SETTLED
    if op._waiter is not None:
        release_waiters(op)
    owner = op._owner
    if owner.observed:
        owner.observe(op)


def transition(op: DelayedOperation[Any], bits: int) -> bool:
    """Set ``bits`` if ``op`` is still pending; True for the one caller that did. The
    locked region cannot raise: no try/finally, which costs the compiled build 0.5k
    instructions a region (it saves and restores the exception state), measured."""
    if LOCKED:
        # Read once before the lock: an ended operation needs none, and an unset state
        # word (a subclass that skipped DelayedOperation.__init__) raises here.
        if op._state & ENDED:
            return False
        acquire()
    state = op._state
    won = not state & ENDED
    if won:
        op._state = state | bits
    if LOCKED:
        release()
    return won


# -- the admission: try, watch, try again, time -------------------------------------------------


def admit(
    life: Lifecycle, op: DelayedOperation[Any], keys: Iterable[Hashable], threshold: float | None
) -> bool:
    """Kafka's tryCompleteElseWatch of ``op`` in ``life``'s purgatory: True if it completed
    during the call. All is checked first: a refused operation is left as it was."""
    if not life.on_loop():  # closed or unbound: enter() refuses or binds
        life.enter()
    try:
        detached = op._owner
        fresh = detached.detached and not op._state & ENDED
    except AttributeError:
        raise not_an_operation(op) from None
    if not fresh:
        raise not_fresh(op)
    watch_keys = check_keys(keys)
    deadline = life.now() + op._timeout
    if deadline >= life.horizon:
        raise life.beyond_horizon(op)
    # Admitted: this owner's until it settles. A thread completing or cancelling it just
    # now may have read the detached owner: it settles it; the ENDED checks below stop here.
    op._owner = life
    op._keys = watch_keys
    op._deadline = deadline
    user: Any = op  # Python's own call: any answer by its truth (mypyc's demands a bool)
    # Kafka's two tries, before and after watching, each try_guarded's body inline (two
    # calls less; tests/test_hot_path_shape.py holds both to it). Written out twice: a loop
    # over the two cost 547 more instructions per admission (callgrind, compiled, W1-cost).
    if not (op._busy or op._state & ENDED):
        op._busy = True
        try:
            done = bool(user.try_complete())
        except BaseException as exc:
            done = tried_raising(op, exc)
        else:
            done = (done or not op._busy) and op._state & COMPLETED != 0
            op._busy = False
        if done:
            return True
    if op._state & ENDED:
        return False  # another thread completed or cancelled it; its hand-over follows
    try:
        if threshold is None:
            life.store.watch(op, watch_keys)  # type: ignore[union-attr]
        else:
            op._keys = life.store.watch_threshold(op, watch_keys[0], threshold)  # type: ignore[union-attr]
    except BaseException as exc:
        refused(life, op, watch_keys, detached, exc)
    # Ended meanwhile (another thread)? The guard declines, and the timer is skipped.
    if not (op._busy or op._state & ENDED):
        op._busy = True
        try:
            done = bool(user.try_complete())
        except BaseException as exc:
            done = tried_raising(op, exc)
        else:
            done = (done or not op._busy) and op._state & COMPLETED != 0
            op._busy = False
        if done:
            return True
    if op._state & ENDED:
        return False
    life.timer.add_entry(op, deadline)  # type: ignore[union-attr]
    if _untrack is not None:
        # Held by the timer until it settles (which tracks it again): no full collection
        # traverses it (see _gc). W1's outside variant: 1.42 -> 1.05 us net per operation.
        _untrack(op)
    return False


def refused(
    life: Lifecycle,
    op: DelayedOperation[Any],
    keys: tuple[Hashable, ...],
    detached: Owner,
    exc: BaseException,
) -> typing.NoReturn:
    """Watching ``op`` raised ``exc`` (comparing a key with one already watched; the keys
    were checked before): nothing stays half-watched, ``op`` goes back to its ``detached``
    owner, and ``exc`` is raised, an ordinary error as one that names the keys."""
    life.store.unwatch(op, keys)  # type: ignore[union-attr]
    op._owner = detached
    op._keys = ()
    if not isinstance(exc, Exception) or isinstance(exc, MemoryError):
        raise exc
    raise watching_failed(life.store, op, keys, exc) from exc  # type: ignore[arg-type]


# -- the guarded try: how the walks and the admission call try_complete -----------------------


def try_guarded(op: DelayedOperation[Any]) -> bool:
    """``op.try_complete()`` guarded against re-entrant calls; True only for a real completion.

    Whatever ``try_complete`` raises completes the operation with that exception
    (it could otherwise be left pending with a condition that can never be checked);
    only ``KeyboardInterrupt`` and ``SystemExit`` then propagate.

    The admission (:func:`admit`) carries this body inline twice, from the guard on, for
    its two tries; tests/test_hot_path_shape.py holds the copies to it.
    """
    if op._busy or op._state & ENDED:
        return False
    user: Any = op  # see admit: any answer is taken by its truth
    op._busy = True
    try:
        done = bool(user.try_complete())
    except BaseException as exc:
        return tried_raising(op, exc)
    # Won by this try (completed() cleared _busy): it counts, whatever the answer.
    done = (done or not op._busy) and op._state & COMPLETED != 0
    op._busy = False
    return done


def tried_raising(op: DelayedOperation[Any], exc: BaseException) -> bool:
    """``op.try_complete()`` raised ``exc``: complete ``op`` with it if still pending;
    whether the try counts as a completion. Clears ``_busy``; re-raises a FATAL one."""
    try:
        if isinstance(exc, FATAL):
            # Let it through once the operation has settled (by its own completion, or here).
            if not op._state & ENDED:
                fail(op, exc)
            raise exc
        # A completion won by this try on this thread counts though try_complete raised
        # after it (completed() cleared _busy); one won by another thread does not.
        return fail(op, exc) or (op._state & COMPLETED != 0 and not op._busy)
    finally:
        op._busy = False


def fail(op: DelayedOperation[Any], exc: BaseException) -> bool:
    """``try_complete`` raised: complete ``op`` with ``exc`` as its outcome if still pending."""
    op._owner.callback_failed(op, exc, "try_complete")
    if not transition(op, COMPLETED):
        return False
    completed(op, exc)
    return True
