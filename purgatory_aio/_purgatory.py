"""The purgatory: operations watched under keys and timed out by a timing wheel.

:class:`Purgatory` is the public face: it checks arguments and hands the work to
its parts — the timer (:mod:`._timer`), the watch lists and threshold indexes
(:mod:`._watches`) and the owner of every operation's lifecycle
(:mod:`._lifecycle`).
"""

from __future__ import annotations

import concurrent.futures
import sys
from collections.abc import Awaitable, Callable, Coroutine, Generator, Hashable, Iterable
from typing import Any, Final, NoReturn, SupportsFloat, SupportsIndex, TypeVar, final

from . import _shell
from ._clock import DEFAULT_CLOCK, Clock
from ._errors import OutsideLoop, not_copyable
from ._gc import UNTRACKING, DropGuard
from ._lifecycle import Lifecycle
from ._logging import get_logger
from ._native import refuse_subclass
from ._operation import DelayedOperation, admit
from ._shutdown import Shutdown
from ._stats import PurgatoryStats
from ._timer import Timer
from ._validation import check_finite, check_flag, check_positive_int
from ._watches import WatchStore
from .events import EventSink

__all__ = ["Purgatory", "PurgatoryStats"]

_log: Final = get_logger("purgatory_aio.purgatory")

R = TypeVar("R")


@final
class Purgatory:
    """Holds delayed operations until their condition holds or their deadline passes.

    Examples:
        >>> async def handle_fetch(p: Purgatory, partition, offset):
        ...     op = DelayedFetch(partition, offset, timeout=0.5)
        ...     return await p.watch_and_wait(op, [partition])

    Args:
        name: label for logs, metrics and the event log.
        tick: timing-wheel tick in seconds (at least 1 ns). Expirations are never
            early, and late only by the event loop's own wake-up delay.
        wheel_size: slots per timing-wheel level.
        purge_interval: how many stale watch-list entries may linger before a purge.
        clock: time source (the loop's monotonic clock by default; a
            :class:`~purgatory_aio.testing.ManualClock` in tests).
        event_sink: receives an :class:`~purgatory_aio.events.OperationEvent` per
            settled operation.
        offload_callbacks: run every operation's synchronous callbacks in worker
            threads (an operation class can ask for it alone).
        offload_threads: worker threads the offloaded callbacks may use at once.
        log_operations: log every settled operation at debug level.

    It is final and takes no weak references, on both builds (the compiled class
    has no slot for them, so the pure one declares none either).
    """

    __slots__ = ("_clock", "_drop_guard", "_life", "_shutdown", "_store", "_timer", "name")

    def __init_subclass__(cls, **kwargs: object) -> None:
        # Final on both builds. The compiled class refuses interpreted subclasses by
        # itself; allowing them (and Timer's) costs every internal method call a check
        # for an override: 196 instructions per watched-and-completed operation
        # (16,968 -> 16,772 compiled, callgrind), about 1.2 %.
        raise refuse_subclass("Purgatory", cls)

    def __init__(
        self,
        # ``name`` and the two flags are typed ``object`` on purpose: the compiled build
        # checks a parameter's declared type before the body runs, with a message that
        # names no parameter ("str object expected; got int"); typed ``object`` they
        # reach the checks below, whose errors say which argument is wrong and why.
        name: object,
        *,
        tick: SupportsFloat = 0.001,
        wheel_size: SupportsIndex = 20,
        purge_interval: SupportsIndex = 1000,
        clock: Clock | None = None,
        event_sink: EventSink | None = None,
        offload_callbacks: object = False,
        offload_threads: SupportsIndex = 8,
        log_operations: object = False,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        interval = check_positive_int(purge_interval, "purge_interval")
        threads = check_positive_int(offload_threads, "offload_threads")
        offload = check_flag(offload_callbacks, "offload_callbacks")
        log_ops = check_flag(log_operations, "log_operations")
        if clock is not None and not all(
            callable(getattr(clock, method, None)) for method in ("time", "call_at", "attach")
        ):
            raise TypeError(f"clock must provide time(), call_at() and attach(), got {clock!r}")
        if event_sink is not None and not callable(getattr(event_sink, "emit", None)):
            raise TypeError(f"event_sink must have an emit(event) method, got {event_sink!r}")
        self.name = name
        self._clock: Clock = DEFAULT_CLOCK if clock is None else clock
        self._timer = Timer(tick=tick, wheel_size=wheel_size, clock=self._clock)
        self._store = WatchStore(interval)
        self._life = Lifecycle(
            name,
            self._timer,
            self._store,
            self._clock,
            event_sink=event_sink,
            offload=offload,
            offload_threads=threads,
            log_operations=log_ops,
        )
        self._shutdown = Shutdown(self._life, self._timer, self._store)
        # Held by the purgatory alone: dropping the purgatory re-tracks what it holds.
        self._drop_guard: DropGuard | None = DropGuard(self._life) if UNTRACKING else None

    # -- lifecycle -----------------------------------------------------------------------------

    # The coroutine methods are plain methods returning a coroutine of the interpreted
    # _shell module (see there why): awaited, they behave as ``async def`` would.

    def __aenter__(self) -> Coroutine[Any, Any, Purgatory]:
        return _shell.enter(self, self._life)

    def __aexit__(self, *exc_info: object) -> Coroutine[Any, Any, None]:
        return _shell.shutdown(self._shutdown, True)

    @property
    def closed(self) -> bool:
        """True once shutdown has begun: new operations are refused with ``PurgatoryClosed``."""
        return self._life.closed

    def shutdown(self, *, expire_pending: bool = True) -> Coroutine[Any, Any, None]:
        """Stop the reaper and settle every pending operation.

        By default each pending operation is expired now (``on_complete`` then
        ``on_expiration`` run, so every waiting client gets an answer); with
        ``expire_pending=False`` they are cancelled instead. Returns once every
        operation completed before or during the call has settled (callbacks
        finished, awaiters released), whichever thread completed it.
        Idempotent: later calls wait for the first to finish.

        From an async callback of this purgatory's own operations, it returns once
        everything else has settled; that callback's operation settles when the
        callback returns. From another event loop (or thread) it raises
        ``RuntimeError`` and changes nothing, unless the purgatory's own loop is
        closed: then nothing could ever run there again, and it settles everything
        from the caller's loop (callbacks that need the closed loop, async ones,
        settle with :class:`PurgatoryClosed`).
        """
        return _shell.shutdown(self._shutdown, expire_pending)

    # -- the contract --------------------------------------------------------------------------

    # The three ways to hand an operation over admit it at the call, not when the result
    # is awaited: a forgotten ``await`` (which the compiled build's coroutines would not
    # even warn about) then loses only the answer, never the operation, which is timed
    # and settles as any other. Every refusal is raised by the call itself. Called with
    # no event loop running, to be run by ``asyncio.run`` or ``run_until_complete``, they
    # return a coroutine that admits the operation once it runs in the loop, as before
    # (an operation never admitted is refused by ``await op``, so nothing hangs).

    def try_complete_else_watch(
        self, op: DelayedOperation[Any], keys: Iterable[Hashable]
    ) -> Awaitable[bool]:
        """Try once; if not completed, watch ``op`` under every key, try again, and
        if still pending add it to the timer (deadline ``now + op.timeout``).

        ``await`` it for True if ``op`` was completed during this call. The work is
        done by the call itself (errors included); the awaitable only reports the
        answer, so an operation whose call was not awaited is still watched and timed.
        """
        try:
            completed = admit(self._life, op, keys, None)
        except OutsideLoop:
            return _shell.called(admit, self._life, op, keys, None)
        return _COMPLETED if completed else _WATCHED

    def watch_and_wait(self, op: DelayedOperation[R], keys: Iterable[Hashable]) -> Awaitable[R]:
        """Watch ``op`` and return its result, for request handlers.

        ``op`` is watched at the call, as by :meth:`try_complete_else_watch`; awaiting
        returns its result. If the awaiting task is cancelled (the client went away),
        ``op`` is cancelled too, so nothing stays pending for a caller who is gone.
        """
        try:
            admit(self._life, op, keys, None)
        except OutsideLoop:
            return _shell.watch_then_wait(admit, self._life, op, keys)
        return _shell.await_or_cancel(op)

    def watch_threshold(
        self, op: DelayedOperation[Any], key: Hashable, threshold: SupportsFloat
    ) -> Awaitable[bool]:
        """Like :meth:`try_complete_else_watch` for one key, indexed by ``threshold``.

        For operations waiting for a monotonic per-key value (a high watermark, bytes
        available) to reach their own threshold: :meth:`advance_key` then visits
        only the operations the new value can satisfy. ``try_complete`` still decides;
        one that declines once its threshold is reached moves to the key's plain
        watch list, so general conditions keep working.
        """
        value = check_finite(threshold, "threshold")
        try:
            completed = admit(self._life, op, (key,), value)
        except OutsideLoop:
            return _shell.called(admit, self._life, op, (key,), value)
        return _COMPLETED if completed else _WATCHED

    def advance_key(self, key: Hashable, value: SupportsFloat) -> int:
        """The value watched under ``key`` reached ``value``: try exactly the operations
        whose threshold is <= ``value``, lowest first; return how many completed.

        While something is watched under ``key`` the highest value given is kept
        (:meth:`key_value`), for the operations' ``try_complete`` to read."""
        return self._store.advance(key, check_finite(value, "value"), self._life)

    def check_and_complete(self, key: Hashable) -> int:
        """Try to complete the operations watched under ``key``; return how many did.

        For the loop thread (re-entrant calls from callbacks are fine); from other
        threads use :meth:`check_and_complete_threadsafe`.
        """
        return self._store.check(key, self._life)

    def check_and_complete_threadsafe(self, key: Hashable) -> concurrent.futures.Future[int]:
        """:meth:`check_and_complete` from any thread; the future gets the count."""
        loop = self._life.loop
        if loop is None:
            raise RuntimeError(f"purgatory {self.name!r} has not started on an event loop")
        try:
            hash(key)
        except TypeError:
            raise TypeError(f"key {key!r} is not hashable") from None
        except Exception as exc:  # a StopIteration would end a calling coroutine
            raise TypeError(f"key {key!r} cannot be hashed: its __hash__ raised {exc!r}") from exc
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        loop.call_soon_threadsafe(self._check_into, key, future)
        return future

    def _check_into(self, key: Hashable, future: concurrent.futures.Future[int]) -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(self.check_and_complete(key))
        except BaseException as exc:
            future.set_exception(exc)

    # -- what is watched: the interface for layers that relay key events (a fan-out) ----------

    def watched_keys(self) -> list[Hashable]:
        """Every key something is watched under, in no particular order.

        A key stays listed until its last watch entry is removed; the entries of
        settled operations are removed lazily (by the next walk over the key or a
        purge), so the list may hold a few keys whose operations have all settled.
        """
        return self._store.keys()

    def key_value(self, key: Hashable) -> float | None:
        """The highest value :meth:`advance_key` was given for ``key`` while something
        was watched under it, or None.

        Forgotten with the key's last watch entry, so it costs memory only for
        watched keys. An operation waiting for ``key``'s value to reach a threshold
        reads it in ``try_complete``.
        """
        return self._store.values.get(key)

    def add_key_listener(self, listener: Callable[[Hashable, bool], object]) -> None:
        """Call ``listener(key, True)`` when ``key`` gains its first watch entry and
        ``listener(key, False)`` when it loses its last one (adding one twice is harmless).

        With a listener a relay of key events knows which keys this purgatory
        watches, however the operations were watched, without keeping a copy.
        It runs on the loop thread in the middle of the purgatory's bookkeeping:
        it may record the key or schedule work, but must not call this purgatory.
        An exception it raises is logged and otherwise ignored.
        """
        if not callable(listener):
            raise TypeError(f"listener must be callable, got {listener!r}")
        self._store.add_listener(listener)

    def remove_key_listener(self, listener: Callable[[Hashable, bool], object]) -> None:
        """Stop calling ``listener`` (one never added is ignored)."""
        self._store.remove_listener(listener)

    def cancel_for_key(self, key: Hashable) -> list[DelayedOperation[Any]]:
        """Cancel every pending operation watched under ``key`` and return them."""
        return self._life.cancel_key(key)

    @property
    def num_delayed(self) -> int:
        """Pending operations in the timer."""
        return len(self._timer)

    @property
    def watched(self) -> int:
        """Entries across all watch lists, including settled ones not yet purged."""
        return self._store.watched

    @property
    def clock(self) -> Clock:
        """The time source of this purgatory and its timer."""
        return self._clock

    def time(self) -> float:
        """The current time of this purgatory's clock (deadlines are on it)."""
        return self._clock.time()

    def stats(self) -> PurgatoryStats:
        """A snapshot of the counters; ``stats().as_dict()`` is a JSON-ready dict."""
        life = self._life
        store = self._store
        return PurgatoryStats(
            name=self.name,
            pending=len(self._timer),
            watched=store.watched,
            watched_keys=store.key_count(),
            completed=life.n_completed,
            expired=life.n_expired,
            cancelled=life.n_cancelled,
            shutdown=life.n_shutdown,
            purged=store.purged,
            callback_errors=life.n_errors,
            events_failed=life.n_event_errors,
        )

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        raise not_copyable(
            self,
            "a purgatory is one live holder of its pending operations, its reaper and its "
            "event loop; create another Purgatory instead",
        )

    def __repr__(self) -> str:
        return (
            f"<Purgatory {self.name!r} delayed={len(self._timer)} watched={self._store.watched}"
            f"{' closed' if self._life.closed else ''}>"
        )


#: From Python 3.12 on, an ``await`` runs any iterator but the interpreter's own generators
#: through its ``__next__``, so a compiled generator returns its value by raising
#: StopIteration (W1-cost on 3.12, compiled, asyncio: about 750 instructions per await):
#: the admission's answer is then awaited through an interpreted generator, which the
#: await runs in place. 3.11 sends to any iterator that can take it, the compiled
#: generator included, which costs less there.
_AWAIT_NEXTS: Final = sys.version_info >= (3, 12)
_answered: Final = _shell.answered  # a static of the compiled build: no module look-up


@final
class _Admitted:
    """What admitting an operation returns: an awaitable answer, computed already.

    It speaks the coroutine protocol (``send``, ``throw``, ``close``, and it is
    registered as a :class:`collections.abc.Coroutine`), so whatever takes a coroutine
    takes it: ``asyncio.create_task``, ``asyncio.run``'s callers, anyio's
    ``start_soon`` and task groups. It has no state, so two instances serve every call
    (one per answer): each ``send`` ends at once with the answer, each ``await`` runs a
    fresh generator that does the same.
    """

    __slots__ = ("_completed",)

    def __init__(self, completed: bool) -> None:
        self._completed = completed

    def __await__(self) -> Generator[None, None, bool]:
        if _AWAIT_NEXTS:
            return _answered(self._completed)
        return self._answer()

    def _answer(self) -> Generator[None, None, bool]:
        return self._completed
        yield  # never reached: it makes this a generator, which the await then runs

    def send(self, value: object) -> NoReturn:
        """Finish at once with the answer, as a coroutine with nothing to wait for."""
        raise StopIteration(self._completed)

    def throw(self, typ: object, val: object = None, tb: object = None) -> NoReturn:
        """Raise what is thrown in, as a coroutine that has not started would."""
        if isinstance(typ, BaseException):
            raise typ
        if isinstance(typ, type) and issubclass(typ, BaseException):
            raise val if isinstance(val, typ) else typ() if val is None else typ(val)
        raise TypeError(f"exceptions must derive from BaseException, not {typ!r}")

    def close(self) -> None:
        """Nothing to close: the work was done by the call."""

    def __repr__(self) -> str:
        return f"<admitted: {'completed at once' if self._completed else 'watched'}>"


# Registered rather than inherited: the compiled build's native classes cannot take
# ABCMeta, and registration is all asyncio.iscoroutine and anyio check.
Coroutine.register(_Admitted)

_COMPLETED: Final = _Admitted(True)
_WATCHED: Final = _Admitted(False)
