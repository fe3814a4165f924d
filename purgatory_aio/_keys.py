"""Key validation: what a key handed to a purgatory must be, and the errors that name it
(and those that name an operation that cannot be handed over).

Keys are validated where they come in, before anything changes: hashed (and
deduplicated as a dict would) when an operation is watched, looked up when a key is
checked, advanced or cancelled. Whatever a key's ``__hash__`` or ``__eq__`` raises
becomes a ``TypeError`` naming that key; a ``StopIteration`` in particular must not
escape, since raised through a coroutine (the callers') it would end it as if it
had returned.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._operation import DelayedOperation
    from ._watches import WatchStore

__all__ = [
    "bad_key",
    "check_keys",
    "fails_lookup",
    "looked_up",
    "not_an_operation",
    "not_fresh",
    "watching_failed",
]


def check_keys(keys: Iterable[Hashable]) -> tuple[Hashable, ...]:
    """Validate the keys of a watch request; return them as a tuple without duplicates.

    The common case (a tuple or list of up to three distinct hashable keys) costs a
    hash and a comparison per key, and no allocation.
    """
    if type(keys) is not tuple:
        if isinstance(keys, str | bytes):
            raise TypeError(f"keys must be a collection of keys, not the single key {keys!r}")
        if not isinstance(keys, Iterable):
            raise TypeError(f"keys must be an iterable of keys, got {keys!r}")
        keys = tuple(keys)
    count = len(keys)
    try:
        # Hash every key before anything is inserted, so an unhashable one leaves no
        # partial watch behind. Duplicates are what the watch lists' dicts would take
        # for one key: equal hashes, then the same object or ==. Up to three keys,
        # distinct hashes (the common case) settle it with int comparisons: no set
        # (measured: 0.9k instructions per op), no == call, no allocation (callgrind,
        # compiled, per watched op: 2 keys 12.9k unchanged, 3 keys 14.3k -> 14.0k).
        # Keys with equal hashes go to a dict, which decides exactly as the watch
        # lists will (a NaN given twice is one key there, though nan != nan).
        if count == 1:
            hash(keys[0])
            return keys
        if count == 2:
            first, second = keys
            if hash(first) != hash(second):
                return keys
            return tuple(dict.fromkeys(keys))
        if count == 3:
            first, second, third = keys
            one, two, three = hash(first), hash(second), hash(third)
            if one != two and one != three and two != three:
                return keys
            return tuple(dict.fromkeys(keys))
        distinct = len(set(keys))
    except Exception as exc:
        # Whatever a key's __hash__ or __eq__ raises becomes a TypeError naming the key. A
        # StopIteration in particular must not escape: raised through a coroutine (the
        # callers'), it would end it as if it had returned.
        raise bad_watch_key(keys, exc) from exc
    if distinct != count:
        keys = tuple(dict.fromkeys(keys))
    elif not distinct:
        raise ValueError("keys must not be empty: an operation has to be watched under a key")
    return keys


def bad_watch_key(keys: tuple[Hashable, ...], exc: BaseException) -> TypeError:
    """The error for watch keys that could not be hashed or compared, naming the key.

    Replays what failed one key at a time: hashing it, then adding it to a dict of
    the keys before it (which compares it with those of an equal hash).
    """
    seen: dict[Hashable, None] = {}
    for key in keys:
        error = hash_error(key, "watch key")
        if error is not None:
            return error
        try:
            seen[key] = None
        except Exception as raised:
            return TypeError(
                f"watch key {key!r} cannot be compared with the keys before it: {raised!r}"
            )
    return TypeError(f"watch keys {keys!r} cannot be hashed or compared: {exc!r}")


def looked_up(store: WatchStore, key: Hashable, indexed: bool) -> bool:
    """Whether ``store`` holds ``key`` (its threshold index looked up first, if
    ``indexed``: one lookup for advance_key's usual key), with a key that cannot be
    hashed or compared refused by name, whatever its ``__hash__`` or ``__eq__`` raised
    (a StopIteration from them must not end a calling coroutine). A key held only in a
    plain list or a walk counts too: advance_key records its value for them."""
    try:
        return (indexed and key in store.indexes) or store.holds(key)
    except Exception as exc:
        raise bad_key(key, exc) from exc


def bad_key(key: object, exc: BaseException, what: str = "key") -> TypeError:
    """The error for a key whose lookup in the watch lists raised ``exc``."""
    error = hash_error(key, what)
    if error is not None:
        return error
    return TypeError(f"{what} {key!r} cannot be compared with the keys watched: {exc!r}")


def fails_lookup(store: WatchStore, key: Hashable) -> bool:
    try:
        store.holds(key)
    except Exception:
        return True
    return False


def watching_failed(
    store: WatchStore, op: DelayedOperation[Any], keys: tuple[Hashable, ...], exc: Exception
) -> TypeError:
    """The error for watching ``op`` under ``keys``, which raised ``exc``: the first key
    whose lookup in ``store`` fails named, else the keys."""
    for key in keys:
        if fails_lookup(store, key):
            return bad_key(key, exc, "watch key")
    return TypeError(f"watching {op!r} under {keys!r} failed: {exc!r}")


def hash_error(key: object, what: str) -> TypeError | None:
    """Why ``key`` cannot be hashed, or None if it can."""
    try:
        hash(key)
    except TypeError:
        return TypeError(f"{what} {key!r} is not hashable")
    except Exception as raised:  # StopIteration included: never let it through
        return TypeError(f"{what} {key!r} cannot be hashed: its __hash__ raised {raised!r}")
    return None


def not_an_operation(op: object) -> TypeError:
    """What handing over something whose library attributes are missing raises."""
    if isinstance(op, _operation_type()):
        return TypeError(f"{type(op).__name__}.__init__ must call super().__init__(timeout)")
    return TypeError(f"op must be a DelayedOperation, got {op!r}")


def not_fresh(op: DelayedOperation[Any]) -> ValueError:
    """What handing over an operation already handed over, completed or cancelled raises."""
    if not op._owner.detached:
        return ValueError(f"{op!r} was already handed to purgatory {op._owner.name!r}")
    return ValueError(f"{op!r} is already completed or cancelled")


def _operation_type() -> type:
    from ._operation import DelayedOperation

    return DelayedOperation
