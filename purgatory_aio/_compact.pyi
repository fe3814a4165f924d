"""Stub of the compiled build's ``_compact`` extension (``_compact.c``)."""

from collections.abc import Hashable
from typing import Any

from ._operation import DelayedOperation

def drop_ended(watch_list: list[DelayedOperation[Any]]) -> int:
    """Drop the operations that have ended from ``watch_list``, in place and keeping the
    order of the others; how many were dropped."""

def sweep_lists(
    lists: dict[Hashable, Any],
) -> tuple[int, list[tuple[Hashable, Any]] | None, list[tuple[Hashable, Any]] | None]:
    """Drop the ended operations from every watch list of a store's lists; how many
    entries went, the pairs to shrink, and the long lists held as dicts."""
