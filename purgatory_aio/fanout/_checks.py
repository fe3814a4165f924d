"""What the fan-out accepts: keys it can carry and the values it advances them to."""

from __future__ import annotations

from collections.abc import Iterable

from .._validation import check_finite


def check_key(key: object, max_bytes: int | None = None) -> str:
    """A key the fan-out can carry: a non-empty str that encodes as UTF-8, without NUL."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"fan-out keys are non-empty str (they name channels), got {key!r}")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"fan-out key {key!r} cannot be sent: it is not valid text "
            f"({exc.reason} at index {exc.start})"
        ) from None
    if "\x00" in key:
        # PostgreSQL's text cannot hold NUL; refused on every engine, so that a key that
        # works on one works on all.
        raise ValueError(f"fan-out key {key!r} contains NUL (\\x00), which keys may not")
    if max_bytes is not None and size > max_bytes:
        raise ValueError(
            f"fan-out key {key[:40]!r}... is {size} bytes in UTF-8; the engine carries at most "
            f"{max_bytes}"
        )
    return key


def check_keys(keys: object, max_bytes: int | None = None) -> tuple[str, ...]:
    """A collection of keys, refused as the purgatory refuses it when it is a single str."""
    if isinstance(keys, str | bytes):
        raise TypeError(f"keys must be a collection of keys, not the single key {keys!r}")
    if not isinstance(keys, Iterable):
        raise TypeError(f"keys must be an iterable of keys, got {keys!r}")
    return tuple(check_key(key, max_bytes) for key in keys)


def check_value(value: object, what: str = "value") -> float:
    """A finite number, as the purgatory's ``advance_key`` takes it (same errors)."""
    return check_finite(value, what)


__all__ = ["check_key", "check_keys", "check_value"]
