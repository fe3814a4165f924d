"""DelayedOperation: completes when its condition holds, or at its deadline at the latest.

An operation owns exactly one thing: its state word. Each transition out of
*pending* — completed (satisfied, expired or shut down) or cancelled — is one
guarded update of that word, taken under one lock, so exactly one of any number
of concurrent ``force_complete``/expiration/``cancel``/shutdown calls wins, from
whichever thread. The winner hands the operation to its owner
(:class:`~purgatory_aio._owner.Owner`: a purgatory's lifecycle, or the detached
owner), which does everything that
follows — timer and watch bookkeeping, callbacks, settlement, awaiters, counters
and events — in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from abc import ABCMeta, abstractmethod
from collections.abc import Awaitable, Generator, Hashable
from types import MemberDescriptorType
from typing import Any, ClassVar, Generic, SupportsFloat, SupportsIndex, TypeVar, final

from . import _shell
from ._detached import DETACHED
from ._entry import TimerEntry
from ._native import mypyc_attr
from ._owner import Owner
from ._states import (
    CANCELLED,
    COMPLETED,
    ENDED,
    EXPIRED,
    FAILED,
    LOCKED,
    SETTLED,
    acquire,
    describe,
    release,
    transition,
)
from ._validation import INF, check_seconds
from ._waiters import add_waiter, forget
from ._watches import NOT_WATCHED
from .events import Outcome

__all__ = ["DelayedOperation"]

R = TypeVar("R")


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
    #   _timeout   -                         the timeout given
    #   _owner     _lifecycle                its purgatory's lifecycle from admission on
    #                                        (and the detached owner again if refused)
    #   _keys      _lifecycle                the keys it was handed over with
    #   _deadline  _lifecycle, _timer        when it expires (set at admission; the
    #                                        timer's add_entry sets every entry's)
    #   _busy      _lifecycle                a try of it is under way
    #   _outcome   _owner                    its result or exception, at settlement
    #   _state     _states, _operation, _owner  the state word: transitions (and
    #                                        force_complete's inline copy of one,
    #                                        tests/test_hot_path_shape.py), settlement
    #   _waiter    _waiters                  the futures of its awaiters
    #   _ident     _watches                  its key in plain watch lists
    #   _store     _watches                  where the store holds it
    #   _bucket    _bucket, _wheels          its timer bucket (a pass of the timer
    #                                        clears it when it fires the entry)
    #   _prev      _bucket                   its neighbours in that bucket
    #   _next      _bucket
    __slots__ = (
        "_busy",
        "_ident",
        "_keys",
        "_outcome",
        "_owner",
        "_state",
        "_store",
        "_timeout",
        "_waiter",
    )
    # Set when it first enters a plain watch list (see _watches): its entries' key.
    _ident: object

    op_type: ClassVar[str | None] = None
    offload_callbacks: ClassVar[bool] = False
    # Read by the compiled build's C helper off the class (see _gc), never per instance.
    untrack_while_pending: ClassVar[bool] = True
    _async_complete: ClassVar[bool] = False
    _async_expire: ClassVar[bool] = False
    # Whether the callbacks of a satisfied / an expired operation can run inline on the
    # loop: decided once per class so the completion path reads one attribute.
    _inline_complete: ClassVar[bool] = True
    _inline_expire: ClassVar[bool] = True
    # Abstract methods a class leaves unimplemented. ABCMeta refuses to instantiate such
    # a class, but the compiled build's classes do not go through ABCMeta, so __init__
    # checks this too (one class-attribute read).
    _unimplemented: ClassVar[tuple[str, ...]] = ("on_complete", "try_complete")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.untrack_while_pending, bool):
            raise TypeError(
                f"{cls.__name__}.untrack_while_pending must be True or False, "
                f"got {cls.untrack_while_pending!r}"
            )
        cls._unimplemented = tuple(
            name for name in ("on_complete", "try_complete") if _is_abstract(cls, name)
        )
        cls._async_complete = inspect.iscoroutinefunction(cls.on_complete)
        cls._async_expire = inspect.iscoroutinefunction(cls.on_expiration)
        cls._inline_complete = not (cls._async_complete or cls.offload_callbacks)
        cls._inline_expire = cls._inline_complete and not cls._async_expire

    def __init__(self, timeout: SupportsFloat) -> None:
        if self._unimplemented:
            missing = ", ".join(self._unimplemented)
            raise TypeError(
                f"Can't instantiate abstract class {type(self).__name__} "
                f"without an implementation for abstract method(s) {missing}"
            )
        # Typed as a protocol so that the compiled build leaves bad input to this check.
        # Exactly float: a subclass may override its comparisons (or __float__), so it
        # goes through check_seconds, which tests the float it converts it to.
        seconds: float
        if type(timeout) is float and 0.0 <= timeout < INF:
            seconds = timeout
        else:
            seconds = check_seconds(timeout, "timeout")
        self._timeout = seconds
        self._state = 0
        self._busy = False
        self._bucket = None
        self._owner: Owner = DETACHED
        self._keys: tuple[Hashable, ...] = ()
        self._store = NOT_WATCHED  # see _watches
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
    # Methods marked @final are not meant to be overridden.
    #
    # The library's attributes exist only once DelayedOperation.__init__ has run. A subclass
    # whose __init__ forgot super().__init__(timeout) reads as unset attributes (a bare
    # AttributeError about a private name, on either build): every public member turns that
    # into the TypeError naming the mistake, the readers of the state word through
    # _state_of. The handler runs only on that error path: a try costs nothing in CPython
    # 3.11, and in the compiled build the read's own error branch jumps to it.

    @property
    @final
    def timeout(self) -> float:
        """The timeout given to ``__init__``, in seconds."""
        try:
            return self._timeout
        except AttributeError:
            raise _uninitialised(self) from None

    @property
    @final
    def deadline(self) -> float | None:
        """Clock time at which it expires, once handed to a purgatory."""
        try:
            return self._deadline if self._owner is not DETACHED else None
        except AttributeError:
            raise _uninitialised(self) from None

    @property
    @final
    def keys(self) -> tuple[Hashable, ...]:
        """The keys it was handed to a purgatory with; empty before that."""
        try:
            return self._keys
        except AttributeError:
            raise _uninitialised(self) from None

    @property
    @final
    def is_completed(self) -> bool:
        """True once completed: satisfied, expired, or by shutdown (not when cancelled)."""
        return bool(_state_of(self) & COMPLETED)

    @property
    @final
    def expired(self) -> bool:
        """True if it was completed by its deadline passing (or by shutdown: :attr:`outcome`
        tells the two apart)."""
        return bool(_state_of(self) & EXPIRED)

    @property
    @final
    def cancelled(self) -> bool:
        """True if it was withdrawn without completing (``on_complete`` never ran)."""
        return bool(_state_of(self) & CANCELLED)

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
        state = _state_of(self)
        return describe(state) if state & ENDED else None  # type: ignore[return-value]

    @final
    def done(self) -> bool:
        """True once settled: the result, exception or cancellation is final."""
        return bool(_state_of(self) & SETTLED)

    @final
    def result(self) -> R:
        """The result of a settled operation (like ``Future.result``)."""
        state = _state_of(self)
        if not state & SETTLED:
            raise asyncio.InvalidStateError("operation is not settled yet")
        if state & CANCELLED:
            raise asyncio.CancelledError("operation was cancelled")
        if state & FAILED:
            raise self._outcome
        return self._outcome  # type: ignore[no-any-return]

    @final
    def exception(self) -> BaseException | None:
        """The exception of a settled, failed operation, else None."""
        state = _state_of(self)
        if not state & SETTLED:
            raise asyncio.InvalidStateError("operation is not settled yet")
        if state & CANCELLED:
            raise asyncio.CancelledError("operation was cancelled")
        return self._outcome if state & FAILED else None

    # -- transitions: flip the state word, report who won, hand the winner to the owner ------

    def force_complete(self) -> bool:
        """Complete now; True only for the one call that completed it.

        Removes it from the timer and runs :meth:`on_complete`. Safe from any
        thread: off the purgatory's loop thread the rest is handed to the loop.
        """
        try:
            detached = self._owner is DETACHED
        except AttributeError:  # the one read that can fail: see "state" above
            raise _uninitialised(self) from None
        if detached:
            DETACHED.check_can_complete(self)  # refuses before anything changes
        # transition(), inlined: this is every satisfied operation's path.
        if LOCKED:
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
        owner.completed(self, None)
        return True

    def cancel(self) -> bool:
        """Withdraw a pending operation: ``on_complete`` never runs, awaiters get
        :class:`asyncio.CancelledError`. True if this call withdrew it."""
        try:
            won = transition(self, CANCELLED)
        except AttributeError:  # transition() reads the state word before any lock
            raise _uninitialised(self) from None
        if not won:
            return False
        self._owner.cancelled(self)
        return True

    @final
    def _fire(self) -> None:
        """The timer says the deadline has passed (always on the loop thread)."""
        if transition(self, COMPLETED | EXPIRED):
            self._owner.completed(self, None)

    # -- awaiting ----------------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, R]:
        # A plain method handing the wait to an interpreted generator (see _shell: a
        # compiled generator passes a cancellation on with the deprecated three-argument
        # throw()).
        state = _state_of(self)
        if state & SETTLED:
            return _shell.settled(self)
        if not state & ENDED and self._owner is DETACHED:
            # Pending and in no purgatory: nothing would ever complete or expire it.
            raise _never_handed_over(self)
        # One future per awaiting task: a task that is cancelled cancels only its own,
        # and the common single awaiter costs one future, no shield around a shared one.
        future = asyncio.get_running_loop().create_future()
        add_waiter(self, future)
        # Settlement may have happened on another thread between the check above
        # and publishing the future; it then found nothing to wake.
        if self._state & SETTLED:
            future.set_result(None)
        return _shell.awaiting(self, future, forget)

    # -- copying and pickling ----------------------------------------------------------------

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        """``copy.copy``, ``copy.deepcopy`` and ``pickle``: of a fresh operation only.

        An operation handed to a purgatory, completed or cancelled is one live claim
        on its timer slot, its watch lists, its awaiters and its result; a copy would
        be a second claim on the same, so it is refused with a TypeError. A fresh one
        is copied as a new fresh operation of the same class with the same timeout and
        what :meth:`__getstate__` returns. The subclass's ``__init__`` does not run
        again, as with any unpickled object.
        """
        try:
            owner, state, timeout = self._owner, self._state, self._timeout
        except AttributeError:
            raise TypeError(
                f"cannot copy or pickle a {type(self).__name__}: its __init__ must call "
                f"super().__init__(timeout)"
            ) from None
        if owner is not DETACHED or state:
            status = describe(state)
            why = "completed by shutdown" if status == "shutdown" else status
            where = f" in purgatory {owner.name!r}" if owner is not DETACHED else ""
            raise TypeError(
                f"cannot copy or pickle {self!r}: it is {why}{where}, and only a fresh "
                f"operation (never handed to a purgatory, completed or cancelled) can be "
                f"copied: a copy would be a second claim on its timer slot, watch lists and "
                f"result; construct a new {type(self).__name__} instead"
            )
        return (_fresh, (type(self), timeout), self.__getstate__())

    def __getstate__(self) -> object:
        """The subclass's own state: its ``__dict__`` and its ``__slots__``, in one dict
        (None when it has none). The library's own state is never part of it."""
        state: dict[str, object] = {}
        for klass in type(self).__mro__:
            if klass in _LIBRARY_BASES:
                continue
            # Each slot is a member descriptor in its class, under its stored (mangled) name.
            for name, member in vars(klass).items():
                if isinstance(member, MemberDescriptorType) and name not in state:
                    with contextlib.suppress(AttributeError):  # an unset slot stays unset
                        state[name] = member.__get__(self, klass)
        fields = getattr(self, "__dict__", None)
        if fields:
            state.update(fields)
        return state or None

    def __setstate__(self, state: object) -> None:
        """Restores what :meth:`__getstate__` returned (or ``object``'s ``(dict, slots)``
        form), as attributes: never a name of the library's own classes.

        Everything is checked before anything is set: a refused state (TypeError for
        one that is not a dict of attribute names, ValueError for a library name)
        leaves the operation as it was.
        """
        fields: dict[Any, object]
        if isinstance(state, dict):
            fields = state
        elif (
            isinstance(state, tuple)
            and len(state) == 2
            and all(part is None or isinstance(part, dict) for part in state)
        ):
            fields = {**(state[0] or {}), **(state[1] or {})}
        else:
            raise TypeError(
                f"{type(self).__name__}.__setstate__ takes a dict of attributes, "
                f"not {type(state).__name__}"
            )
        bad = [name for name in fields if not isinstance(name, str)]
        if bad:
            raise TypeError(
                f"{type(self).__name__}.__setstate__ takes attribute names as str, "
                f"not {', '.join(map(repr, bad))}"
            )
        reserved = sorted(name for name in fields if name in _LIBRARY_ATTRIBUTES)
        if reserved:
            raise ValueError(
                f"{type(self).__name__}.__setstate__ cannot set the library's own "
                f"attribute(s) {', '.join(map(repr, reserved))}"
            )
        for name, value in fields.items():
            setattr(self, name, value)

    def __repr__(self) -> str:
        # Never raises: logs and error messages (that one about forgetting super().__init__
        # included) are built with it.
        name = type(self).__name__
        try:
            state, timeout = self._state, self._timeout
        except AttributeError:
            return f"<{name} uninitialised (its __init__ did not call super().__init__(timeout))>"
        return f"<{name} {describe(state)} timeout={timeout}>"


def _state_of(op: DelayedOperation[Any]) -> int:
    """``op``'s state word, for the public members that read it (see "state" above)."""
    try:
        return op._state
    except AttributeError:
        raise _uninitialised(op) from None


def _uninitialised(op: DelayedOperation[Any]) -> TypeError:
    """What using an operation whose ``__init__`` skipped ``DelayedOperation.__init__`` raises."""
    name = type(op).__name__
    return TypeError(
        f"{name} is not initialised: {name}.__init__ must call super().__init__(timeout)"
    )


def _never_handed_over(op: DelayedOperation[Any]) -> RuntimeError:
    """What awaiting a pending operation that no purgatory holds raises."""
    return RuntimeError(
        f"{op!r} was never handed to a purgatory, so nothing would ever complete or expire "
        "it and awaiting it would wait for ever: hand it over first "
        "(purgatory.try_complete_else_watch(op, keys) or purgatory.watch_and_wait(op, keys)), "
        "or complete or cancel it"
    )


def _fresh(cls: type[DelayedOperation[Any]], timeout: float) -> DelayedOperation[Any]:
    """A fresh ``cls`` operation for :meth:`DelayedOperation.__reduce_ex__`, before its state."""
    if not (isinstance(cls, type) and issubclass(cls, DelayedOperation)):
        raise TypeError(f"not a DelayedOperation class: {cls!r}")
    op = cls.__new__(cls)
    DelayedOperation.__init__(op, timeout)
    return op


def _is_abstract(cls: type, name: str) -> bool:
    """Whether ``cls`` leaves method ``name`` abstract (compiled methods carry no marker)."""
    owner = next(klass for klass in cls.__mro__ if name in klass.__dict__)
    return owner is DelayedOperation or bool(
        getattr(owner.__dict__[name], "__isabstractmethod__", False)
    )


#: The library's own classes of an operation: their slots are not the subclass's state.
_LIBRARY_BASES: frozenset[type] = frozenset(DelayedOperation.__mro__)
#: What restored state may never set: the attributes the library's classes keep (compiled
#: classes list theirs in ``__mypyc_attrs__`` rather than in ``__slots__``), and every
#: name their namespaces define (an instance attribute ``_fire`` or ``force_complete``
#: would shadow the method the timer and the purgatory call; ``__class__`` would swap
#: the class). Not the two public class settings: the library reads them off the class.
_LIBRARY_ATTRIBUTES: frozenset[str] = frozenset(
    {
        name
        for klass in DelayedOperation.__mro__
        for names in (
            klass.__dict__.get("__mypyc_attrs__", klass.__dict__.get("__slots__", ())),
            vars(klass),
        )
        for name in ((names,) if isinstance(names, str) else names)
    }
    | {"__dict__", "__weakref__"}
) - {"op_type", "offload_callbacks", "untrack_while_pending"}
