"""Copying and pickling an operation: what ``DelayedOperation.__reduce_ex__``,
``__getstate__`` and ``__setstate__`` do (see their docstrings for the rules), and the
checks of an operation class at its creation (``__init_subclass__``).

Never on a hot path, so interpreted on both builds; the methods stay on the class and
hand their work to these functions.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from types import MemberDescriptorType
from typing import TYPE_CHECKING, Any

from ._detached import DETACHED
from ._states import describe

if TYPE_CHECKING:
    from ._operation import DelayedOperation

__all__ = [
    "class_traits",
    "fresh",
    "library_attributes",
    "not_copyable_operation",
    "reduce",
    "restore_state",
    "subclass_state",
]


def not_copyable_operation(op: DelayedOperation[Any], state: int, where: str | None) -> TypeError:
    """Why ``op`` (in state ``state``, in the purgatory named ``where`` if any) cannot be
    copied: only a fresh operation can."""
    status = describe(state)
    why = "completed by shutdown" if status == "shutdown" else status
    place = f" in purgatory {where!r}" if where is not None else ""
    return TypeError(
        f"cannot copy or pickle {op!r}: it is {why}{place}, and only a fresh "
        f"operation (never handed to a purgatory, completed or cancelled) can be "
        f"copied: a copy would be a second claim on its timer slot, watch lists and "
        f"result; construct a new {type(op).__name__} instead"
    )


def subclass_state(op: DelayedOperation[Any], base: type) -> object:
    """The state of ``op``'s own classes (those not in ``base.__mro__``, the library's):
    its ``__dict__`` and its ``__slots__``, in one dict, or None when it has none."""
    library = _library_bases(base)
    state: dict[str, object] = {}
    for klass in type(op).__mro__:
        if klass in library:
            continue
        # Each slot is a member descriptor in its class, under its stored (mangled) name.
        for name, member in vars(klass).items():
            if isinstance(member, MemberDescriptorType) and name not in state:
                with contextlib.suppress(AttributeError):  # an unset slot stays unset
                    state[name] = member.__get__(op, klass)
    fields = getattr(op, "__dict__", None)
    if fields:
        state.update(fields)
    return state or None


def restore_state(op: DelayedOperation[Any], state: object, base: type) -> None:
    """Set what :func:`subclass_state` returned (or ``object``'s ``(dict, slots)`` form) on
    ``op`` as attributes, none of them the library's (of ``base``, see
    :func:`library_attributes`); checked whole before anything is set."""
    reserved = library_attributes(base)
    fields: dict[Any, object]
    name = type(op).__name__
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
            f"{name}.__setstate__ takes a dict of attributes, not {type(state).__name__}"
        )
    bad = [key for key in fields if not isinstance(key, str)]
    if bad:
        raise TypeError(
            f"{name}.__setstate__ takes attribute names as str, not {', '.join(map(repr, bad))}"
        )
    refused = sorted(key for key in fields if key in reserved)
    if refused:
        raise ValueError(
            f"{name}.__setstate__ cannot set the library's own "
            f"attribute(s) {', '.join(map(repr, refused))}"
        )
    for key, value in fields.items():
        setattr(op, key, value)


@functools.cache
def _library_bases(base: type) -> frozenset[type]:
    """The library's own classes of an operation: their slots are not the subclass's state."""
    return frozenset(base.__mro__)


@functools.cache
def library_attributes(base: type) -> frozenset[str]:
    """What restored state may never set on an operation of class ``base`` (the library's
    own): the attributes its classes keep (compiled classes list theirs in
    ``__mypyc_attrs__`` rather than in ``__slots__``), and every name their namespaces
    define (an instance attribute ``_fire`` or ``force_complete`` would shadow the method
    the timer and the purgatory call; ``__class__`` would swap the class). Not the public
    class settings: the library reads them off the class."""
    return frozenset(
        {
            name
            for klass in base.__mro__
            for names in (
                klass.__dict__.get("__mypyc_attrs__", klass.__dict__.get("__slots__", ())),
                vars(klass),
            )
            for name in ((names,) if isinstance(names, str) else names)
        }
        | {"__dict__", "__weakref__"}
    ) - {"op_type", "offload_callbacks", "untrack_while_pending"}


def reduce(op: DelayedOperation[Any]) -> tuple[Any, ...]:
    """What ``DelayedOperation.__reduce_ex__`` returns for ``op``: a fresh operation's
    class, timeout and state; anything else is refused."""
    try:
        owner, state, timeout = op._owner, op._state, op._timeout
    except AttributeError:
        raise TypeError(
            f"cannot copy or pickle a {type(op).__name__}: its __init__ must call "
            f"super().__init__(timeout)"
        ) from None
    if owner is not DETACHED or state:
        raise not_copyable_operation(op, state, owner.name if owner is not DETACHED else None)
    return (fresh, (type(op), timeout), op.__getstate__())


def fresh(cls: type[DelayedOperation[Any]], timeout: float) -> DelayedOperation[Any]:
    """A fresh ``cls`` operation for ``DelayedOperation.__reduce_ex__``, before its state."""
    from ._operation import DelayedOperation  # _operation imports this module

    if not (isinstance(cls, type) and issubclass(cls, DelayedOperation)):
        raise TypeError(f"not a DelayedOperation class: {cls!r}")
    op = cls.__new__(cls)
    DelayedOperation.__init__(op, timeout)
    return op


def class_traits(
    cls: type[DelayedOperation[Any]], base: type
) -> tuple[tuple[str, ...], bool, bool]:
    """For ``base.__init_subclass__`` of a new operation class ``cls``, its flags checked:
    the abstract methods it leaves unimplemented, and whether its ``on_complete`` and its
    ``on_expiration`` are coroutine functions."""
    if not isinstance(cls.untrack_while_pending, bool):
        raise TypeError(
            f"{cls.__name__}.untrack_while_pending must be True or False, "
            f"got {cls.untrack_while_pending!r}"
        )
    unimplemented = tuple(
        name for name in ("on_complete", "try_complete") if _is_abstract(cls, base, name)
    )
    tries = cls.try_complete
    if inspect.iscoroutinefunction(tries) or inspect.isasyncgenfunction(tries):
        # Its answer would be a coroutine, never awaited: a condition never checked.
        raise TypeError(
            f"{cls.__name__}.try_complete must be a plain method: it is called synchronously "
            "and answers at once (an async one would return an unawaited coroutine); "
            "await nothing there, and move asynchronous work to on_complete"
        )
    return (
        unimplemented,
        inspect.iscoroutinefunction(cls.on_complete),
        inspect.iscoroutinefunction(cls.on_expiration),
    )


def _is_abstract(cls: type, base: type, name: str) -> bool:
    """Whether ``cls`` leaves method ``name`` of ``base`` abstract (compiled methods carry
    no marker)."""
    owner = next(klass for klass in cls.__mro__ if name in klass.__dict__)
    return owner is base or bool(getattr(owner.__dict__[name], "__isabstractmethod__", False))
