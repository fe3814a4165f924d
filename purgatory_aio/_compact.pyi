"""Stub of the compiled build's ``_compact`` extension (``_compact.c``)."""

from typing import Any

from ._operation import DelayedOperation

def drop_ended(watch_list: list[DelayedOperation[Any]]) -> int:
    """Drop the operations that have ended from ``watch_list``, in place and keeping the
    order of the others; how many were dropped."""
