"""What each part of a :class:`~purgatory_aio.fanout.Fanout` (its publisher, its reader of the
store) declares it shares with the rest of the fan-out, which sets and defines it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._base import BackendHost, FanoutBackend

if TYPE_CHECKING:
    from ._stats import FanoutStats


class FanoutPart(BackendHost):
    """The state and the methods of the fan-out that both of its parts use."""

    # Set by Fanout.__init__.
    backend: FanoutBackend
    _stats: FanoutStats
    _stopped: bool

    if TYPE_CHECKING:  # defined by Fanout

        @property
        def address(self) -> str: ...

        def _up(self) -> None: ...


__all__ = ["FanoutPart"]
