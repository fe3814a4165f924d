"""Pending operations out of the cyclic garbage collector (the compiled build).

CPython's full collections traverse every tracked container, and a parked
operation lives long enough to be traversed by each of them: with half a
million pending, a full collection stopped the loop for up to 0.7 s. While a
purgatory holds an operation (from the moment it is pending in the timer until
it settles), the operation and its instance dict are untracked; settling tracks
them again. The containers that hold pending operations in bulk (the key table,
the watch lists, a threshold index's lists and entries) are kept untracked too:
a collection traversing them would still read every operation's header, a cache
miss each. W5 at 500,000 parked, on the same loaded machine: full collections
paused the loop 120-870 ms with those containers tracked (operations untracked),
10-76 ms without (6-14 ms of CPU). The purgatory's strong reference makes this safe: an untracked
container is never traversed and whatever it references counts as reachable,
so nothing can be freed early; the one risk is a cycle through an untracked
object that becomes garbage, which is why every settlement re-tracks, and a
purgatory dropped with operations still pending re-tracks them (:class:`DropGuard`).

The functions come from the small C extension ``_untrack`` built beside the
mypyc modules. The pure build has no C extension and keeps everything tracked
(``untrack`` is None there): Python has no way to untrack a single object.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from . import _build

untrack: Callable[[object], bool] | None = _build.native("_untrack", "untrack", None)
track: Callable[[object], None] | None = _build.native("_untrack", "track", None)
untrack_container: Callable[[object], None] | None = _build.native(
    "_untrack", "untrack_container", None
)
track_container: Callable[[object], None] | None = _build.native(
    "_untrack", "track_container", None
)

#: Whether pending operations are untracked in this build.
UNTRACKING = untrack is not None


class _Retracker(Protocol):
    def retrack_pending(self) -> None: ...


class DropGuard:
    """Held by a purgatory alone: when the purgatory is dropped (freed, or collected
    with a cycle it is in), every operation it still holds is tracked again, so that
    operations nobody will ever settle do not keep what they reference alive for good."""

    __slots__ = ("_owner",)

    def __init__(self, owner: _Retracker) -> None:
        self._owner = owner

    def __del__(self) -> None:
        self._owner.retrack_pending()


__all__ = [
    "UNTRACKING",
    "DropGuard",
    "track",
    "track_container",
    "untrack",
    "untrack_container",
]
