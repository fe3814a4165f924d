"""Event construction: the record of one settled operation, for the event sink.

What a record holds (its fields and their meaning) is defined by
:mod:`purgatory_aio.events`; this module fills one in from an operation's public
state, once it has settled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .events import OperationEvent

if TYPE_CHECKING:
    from ._clock import Clock
    from ._operation import DelayedOperation

__all__ = ["event_of"]


def event_of(op: DelayedOperation[Any], purgatory: str, op_id: int, clock: Clock) -> OperationEvent:
    """The event record of ``op``, settled in purgatory ``purgatory`` just now."""
    exc = None if op.cancelled else op.exception()
    epoch = clock.epoch_offset
    deadline: float = op.deadline  # type: ignore[assignment]  # handed over: it has one
    return OperationEvent(
        purgatory=purgatory,
        op_type=type(op).op_type or type(op).__name__,
        op_id=op_id,
        # The keys it was handed to the purgatory with, also when its first try
        # satisfied it before it was ever watched: it was asked for under them.
        keys=[str(key) for key in op.keys],
        created_at=deadline - op.timeout + epoch,
        deadline=deadline + epoch,
        settled_at=clock.time() + epoch,
        outcome=op.outcome,  # type: ignore[arg-type]  # settled: never None
        error=None if exc is None else f"{type(exc).__name__}: {exc}",
    )
