"""Serving purgatories from web applications: what the aiohttp and FastAPI integrations share.

Framework-neutral pieces, importable without any extra:

* :class:`Purgatories`, the named purgatories of one application, started and
  shut down with it;
* :func:`watch_until_disconnected` and :func:`cancel_on_disconnect`, which
  withdraw a waiting operation the moment its client goes away, given a way to
  hear about the disconnection (an :data:`OnDisconnect`);
* :func:`readiness`, whether the application can serve its waits now (for
  Kubernetes readiness probes and load balancers), as a :class:`Readiness`;
* :func:`server_sent_events` and :func:`last_event_value`, a
  :class:`~purgatory_aio.fanout.ValueStream` as Server-Sent Events and where a
  reconnecting client resumes.

The framework modules, :mod:`purgatory_aio.integrations.fastapi` and
:mod:`purgatory_aio.integrations.aiohttp`, adapt these to their seams
(lifespan and ``Depends``; ``cleanup_ctx`` and ``AppKey``) and supply the
disconnection signal of their server.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, SupportsFloat, TypeVar

from .._errors import PurgatoryClosed
from .._operation import DelayedOperation
from .._purgatory import Purgatory, PurgatoryStats
from ..fanout import Fanout, ValueReached, check_label
from ._events import last_event_value as last_event_value
from ._events import server_sent_events as server_sent_events
from ._health import Readiness as Readiness
from ._health import readiness as readiness

__all__ = [
    "ClientDisconnected",
    "OnDisconnect",
    "OperationCancelled",
    "Purgatories",
    "Readiness",
    "already_disconnected",
    "cancel_on_disconnect",
    "last_event_value",
    "make_request_id",
    "never_disconnected",
    "readiness",
    "route_label",
    "server_sent_events",
    "wait_for_value_until_disconnected",
    "watch_until_disconnected",
]

R = TypeVar("R")

_GONE = "the client disconnected before the answer was ready"

#: Registers ``callback`` to run once if the client disconnects; returns the function
#: that unregisters it. Each framework module builds one per request.
OnDisconnect = Callable[[Callable[[], None]], Callable[[], None]]
"""Registers a callback run once the request's client disconnects; returns its remover."""


class ClientDisconnected(Exception):
    """The client went away before its answer was ready; its operation was withdrawn.

    The framework modules raise subclasses that are also the framework's HTTP
    exception (status 499, *client closed request*), so an unhandled one ends
    the request quietly: the server has nobody left to send the response to.
    """


class OperationCancelled(Exception):
    """The operation was cancelled by the application (``op.cancel()``,
    ``Purgatory.cancel_for_key``) while its client was still waiting.

    The framework modules raise subclasses that answer 503.
    """


@contextmanager
def translate_errors(
    disconnected: type[ClientDisconnected],
    cancelled: type[OperationCancelled],
    unavailable: type[PurgatoryClosed],
) -> Iterator[None]:
    """Turn the errors of waiting into a framework's own HTTP exceptions.

    Each framework module passes its subclasses (499, 503, 503), so a handler that
    lets them through answers with the right status.
    """
    try:
        yield
    except ClientDisconnected as exc:
        if isinstance(exc, disconnected):
            raise
        raise disconnected() from None
    except OperationCancelled as exc:
        if isinstance(exc, cancelled):
            raise
        raise cancelled(str(exc)) from None
    except PurgatoryClosed as exc:
        if isinstance(exc, unavailable):
            raise
        raise unavailable(str(exc)) from None


class Purgatories:
    """The purgatories of one application, by name, started and shut down together.

    Iterating yields the purgatories (so a metrics collector given this object
    sees purgatories added later); ``registry["fetch"]`` looks one up by name.

    Example::

        registry = Purgatories([Purgatory("fetch"), Purgatory("produce")])
        async with registry:
            await registry["fetch"].try_complete_else_watch(op, [key])
    """

    __slots__ = ("_by_name",)

    def __init__(self, purgatories: Iterable[Purgatory] = ()) -> None:
        self._by_name: dict[str, Purgatory] = {}
        for purgatory in purgatories:
            self.add(purgatory)

    def add(self, purgatory: Purgatory) -> Purgatory:
        """Register ``purgatory`` under its name; names are unique within an application."""
        if not isinstance(purgatory, Purgatory):
            raise TypeError(f"expected a Purgatory, got {purgatory!r}")
        existing = self._by_name.get(purgatory.name)
        if existing is not None and existing is not purgatory:
            raise ValueError(f"another purgatory is already registered as {purgatory.name!r}")
        self._by_name[purgatory.name] = purgatory
        return purgatory

    def __getitem__(self, name: str) -> Purgatory:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(map(repr, self._by_name)) or "none"
            raise KeyError(f"no purgatory named {name!r} (registered: {known})") from None

    def only(self) -> Purgatory:
        """The purgatory of an application that has exactly one."""
        if len(self._by_name) != 1:
            raise LookupError(
                f"expected exactly one purgatory, {len(self._by_name)} are registered: "
                "name the one you want"
            )
        return next(iter(self._by_name.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Purgatory]:
        return iter(tuple(self._by_name.values()))

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def names(self) -> tuple[str, ...]:
        """The purgatories' names, in the order they were added."""
        return tuple(self._by_name)

    def stats(self) -> list[PurgatoryStats]:
        """Each purgatory's :meth:`~purgatory_aio.Purgatory.stats`, in the order added."""
        return [purgatory.stats() for purgatory in self]

    async def start(self) -> None:
        """Start every purgatory on the running loop (each starts its reaper)."""
        for purgatory in self:
            await purgatory.__aenter__()

    async def shutdown(self) -> None:
        """Shut every purgatory down; each pending operation is expired now, so every
        waiting client gets its answer. Idempotent."""
        await asyncio.gather(*(purgatory.shutdown() for purgatory in self))

    async def __aenter__(self) -> Purgatories:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown()

    def __repr__(self) -> str:
        return f"Purgatories({list(self._by_name)!r})"


async def watch_until_disconnected(
    purgatory: Purgatory,
    op: DelayedOperation[R],
    keys: Iterable[Hashable],
    on_disconnect: OnDisconnect,
    *,
    threshold: SupportsFloat | None = None,
) -> R:
    """Watch ``op`` and return its result, withdrawing it if the client disconnects.

    An operation that completes at once never touches ``on_disconnect``. Otherwise
    a disconnection cancels ``op`` (its ``on_complete`` never runs) and this raises
    :class:`ClientDisconnected`; cancelling the awaiting task cancels ``op`` too, and so
    does an ``on_disconnect`` that fails to subscribe (its error propagates).

    Raises:
        ClientDisconnected: the client went away first.
        OperationCancelled: the application cancelled ``op``.
        PurgatoryClosed: the purgatory is shut down.

    Whatever else ``op`` ends with (its ``on_complete`` raised, even
    :class:`asyncio.CancelledError`) is raised as it is. With ``threshold``, ``op``
    is watched with :meth:`Purgatory.watch_threshold` under the one key given.
    """
    if threshold is None:
        await purgatory.try_complete_else_watch(op, keys)
    else:
        (key,) = keys
        await purgatory.watch_threshold(op, key, threshold)
    if op.done():
        return op.result()
    withdrawal = _Withdrawal(op)
    try:
        unsubscribe = on_disconnect(withdrawal)
    except BaseException:
        # Nobody will hear the client leave, nor wait for op: withdraw it now.
        op.cancel()
        raise
    try:
        return await op
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # The handler itself is being cancelled (aiohttp's handler_cancellation,
            # a server's graceful-shutdown timeout): nobody is left to wait for op.
            op.cancel()
            raise
        if withdrawal.withdrawn:
            raise ClientDisconnected(_GONE) from None
        if op.cancelled:
            raise OperationCancelled(f"{op!r} was cancelled while its client waited") from None
        raise  # op completed, and its on_complete raised this CancelledError
    finally:
        unsubscribe()


async def wait_for_value_until_disconnected(
    fanout: Fanout,
    purgatory: Purgatory,
    key: str,
    threshold: SupportsFloat,
    timeout: float,  # noqa: ASYNC109 - the operation's own deadline, enforced by the purgatory
    on_disconnect: OnDisconnect,
    label: str | None = None,
) -> float | None:
    """:meth:`Fanout.wait_for_value <purgatory_aio.fanout.Fanout.wait_for_value>`, withdrawn
    when the client disconnects, as :func:`watch_until_disconnected` withdraws its operation."""
    op = ValueReached.labelled(label)(fanout, key, threshold, timeout)
    fanout.attach(purgatory)
    return await watch_until_disconnected(
        purgatory, op, (op.key,), on_disconnect, threshold=op.threshold
    )


def route_label(template: object) -> str | None:
    """A route's template as the label of the waits its handler parks (the event log's
    ``op_type``), or None when it cannot be one (not a str, empty, too long, unprintable):
    a label the application did not choose never fails a request."""
    try:
        return check_label(template)
    except (TypeError, ValueError):
        return None


class _Withdrawal:
    """The disconnection callback of one wait: cancels the operation, remembers if it did.

    A slotted object rather than a closure: one allocation per waiting request
    instead of a function and a cell, which matters with many requests parked."""

    __slots__ = ("op", "withdrawn")

    def __init__(self, op: DelayedOperation[Any]) -> None:
        self.op = op
        self.withdrawn = False

    def __call__(self) -> None:
        self.withdrawn = self.op.cancel()


@asynccontextmanager
async def cancel_on_disconnect(on_disconnect: OnDisconnect) -> AsyncIterator[None]:
    """Cancel the enclosed block if the client disconnects, then raise :class:`ClientDisconnected`.

    For awaits that are not a single operation, such as a broker call that
    watches its operation with :meth:`Purgatory.watch_and_wait` (which cancels
    the operation when its task is cancelled). Works like :func:`asyncio.timeout`:
    the task is cancelled and the cancellation is turned into the exception at
    the end of the block. The cancellation never outlives the block: a client
    already gone when the block starts (``on_disconnect`` calls back at once)
    cancels it at its first suspension, as an expired ``asyncio.timeout`` does,
    and a block that finishes without suspending finishes normally.
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("cancel_on_disconnect must be used inside a task")
    cancelling = task.cancelling()  # cancellations requested before the block, not ours
    fired = False
    requested = False  # task.cancel() called: ours to take back with uncancel()
    deferred: asyncio.Handle | None = None

    def request() -> None:
        nonlocal requested
        requested = True
        task.cancel()

    def cancel() -> None:
        nonlocal fired, deferred
        if fired:
            return
        fired = True
        if asyncio.current_task() is task:
            # Called back from inside the task itself (while subscribing, or by the block's
            # own code): a cancel() now would stay pending until the task's next await,
            # after the block if the block never suspends. Request it from the loop
            # instead, which runs it only once the task is suspended (inside the block).
            deferred = task.get_loop().call_soon(request)
        else:
            request()

    try:
        unsubscribe = on_disconnect(cancel)
    except BaseException:
        if deferred is not None:
            deferred.cancel()
        raise
    try:
        yield
    except asyncio.CancelledError:
        if requested:
            requested = False
            # uncancel() tells our own cancellation from one requested by someone else.
            if task.uncancel() <= cancelling:
                raise ClientDisconnected(_GONE) from None
        raise
    finally:
        if deferred is not None:
            deferred.cancel()  # the block finished before suspending: nothing to cancel
        if requested:
            task.uncancel()  # delivered inside the block, which swallowed it
        unsubscribe()


_REQUEST_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:")


def make_request_id(supplied: str | None) -> str:
    """The id to log a request under: the client's own (an ``X-Request-ID`` header)
    when it is short and plain enough to put in logs and headers, else a fresh one."""
    if supplied and len(supplied) <= 128 and _REQUEST_ID_CHARS.issuperset(supplied):
        return supplied
    return uuid.uuid4().hex


def _nothing() -> None:
    return None


def already_disconnected(callback: Callable[[], None]) -> Callable[[], None]:
    """The :data:`OnDisconnect` of a client known to be gone: runs ``callback`` at once."""
    callback()
    return _nothing


def never_disconnected(callback: Callable[[], None]) -> Callable[[], None]:
    """The :data:`OnDisconnect` of a transport that cannot report disconnection."""
    return _nothing
