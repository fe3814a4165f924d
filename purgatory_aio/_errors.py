"""Exceptions raised by purgatory_aio."""

from __future__ import annotations

from typing import Final

#: Exceptions that may leave a callback's frame (after its operation has settled);
#: every other exception a callback raises is caught, logged and counted.
FATAL: Final = (KeyboardInterrupt, SystemExit)


class PurgatoryClosed(RuntimeError):
    """The purgatory has been shut down and accepts no new operations."""
