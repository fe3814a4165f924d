"""Exceptions raised by purgatory_aio."""

from __future__ import annotations


class PurgatoryClosed(RuntimeError):
    """The purgatory has been shut down and accepts no new operations."""
