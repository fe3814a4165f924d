"""The operation that waits for a key's value to reach a threshold in any process, and the
labels that name it in the event log."""

from __future__ import annotations

from typing import ClassVar, Final, SupportsFloat

from .._operation import DelayedOperation
from ._checks import check_key, check_value
from ._fanout import Fanout

MAX_LABEL_CHARS: Final = 200
"""The longest operation label, in characters."""
MAX_LABELS: Final = 1000
"""How many distinct labels one process may use: a label names a kind of wait (a route
template), never one request, or the report would have a group per request."""


def check_label(label: object) -> str:
    """An operation label: a non-empty printable str of at most :data:`MAX_LABEL_CHARS`."""
    if not isinstance(label, str):
        raise TypeError(f"an operation label must be a str, got {type(label).__name__}")
    if not label or len(label) > MAX_LABEL_CHARS or not label.isprintable():
        raise ValueError(
            f"an operation label must be 1-{MAX_LABEL_CHARS} printable characters (it names a "
            f"kind of wait in the event log, such as '/orders/{{id}}/status'), got {label[:60]!r}"
            f"{'...' if len(label) > 60 else ''} ({len(label)} characters)"
        )
    return label


class ValueReached(DelayedOperation[float | None]):
    """Completes when the value of ``key`` reaches ``threshold`` in any process.

    Its result is the value reached, or None if it expired first. Watch it with
    :meth:`Fanout.watch_threshold` (or use :meth:`Fanout.wait_for_value`). The event
    log names it ``ValueReached``; ``ValueReached.labelled(label)`` is the same class
    under another name.
    """

    __slots__ = ("fanout", "key", "reached", "threshold")

    # The classes made by labelled(), one per (class, label). The library reads op_type off
    # the class (one attribute read per settled operation, no slot per operation), so a
    # label is a subclass with nothing but its op_type.
    _labelled: ClassVar[dict[tuple[type[ValueReached], str], type[ValueReached]]] = {}

    @classmethod
    def labelled(cls, label: str | None) -> type[ValueReached]:
        """This class under the name ``label`` in the event log and the report (its
        ``op_type``); ``cls`` itself for None. Made once per label and reused.

        Raises:
            TypeError, ValueError: a label that is not 1-:data:`MAX_LABEL_CHARS` printable
                characters, or more than :data:`MAX_LABELS` distinct labels in this process
                (a label names a kind of wait, not one request).
        """
        if label is None:
            return cls
        made = ValueReached._labelled
        found = made.get((cls, label)) if type(label) is str else None
        if found is not None:
            return found
        check_label(label)
        if len(made) >= MAX_LABELS:
            raise ValueError(
                f"more than {MAX_LABELS} distinct operation labels in this process: a label "
                "names a kind of wait (a route template such as '/orders/{id}/status'), not "
                f"one request; refused {label[:60]!r}"
            )
        namespace = {
            "__slots__": (),
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "op_type": label,
        }
        labelled = made[cls, label] = type(cls.__name__, (cls,), namespace)
        return labelled

    def __init__(self, fanout: Fanout, key: str, threshold: SupportsFloat, timeout: float) -> None:
        super().__init__(timeout)
        if not isinstance(fanout, Fanout):
            raise TypeError(f"fanout must be a Fanout, got {fanout!r}")
        self.fanout = fanout
        self.key = check_key(key, fanout.backend.max_key_bytes)
        self.threshold = check_value(threshold, "threshold")
        self.reached: float | None = None

    def try_complete(self) -> bool:
        value = self.fanout.value(self.key)
        if value is not None and value >= self.threshold:
            self.reached = value
            return self.force_complete()
        return False

    def on_complete(self) -> float | None:
        return self.reached


__all__ = ["MAX_LABELS", "MAX_LABEL_CHARS", "ValueReached", "check_label"]
