"""Readiness: whether a process can answer its long polls now, for load balancers and probes.

Framework-neutral: the framework modules turn a :class:`Readiness` into a 200 or
503 response (``readiness_endpoint`` for FastAPI, ``readiness_handler`` for
aiohttp). It reads only what the purgatories and the fan-out expose
(:attr:`Purgatory.closed <purgatory_aio.Purgatory.closed>`,
:meth:`Fanout.stats <purgatory_aio.fanout.Fanout.stats>`,
:attr:`Fanout.queue_size <purgatory_aio.fanout.Fanout.queue_size>`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._purgatory import Purgatory
from ..fanout import Fanout

#: The share of the fan-out's publish queue above which a process is not ready.
DEFAULT_QUEUE_LIMIT = 0.9


@dataclass(frozen=True, slots=True)
class Readiness:
    """What :func:`readiness` found: ready or not, and each problem in one line."""

    ready: bool
    problems: tuple[str, ...] = ()
    #: Per purgatory: ``"running"`` or ``"shut down"``.
    purgatories: dict[str, str] = field(default_factory=dict)
    #: The fan-out's gauges (``connected``, ``queued``, ``queue_size``), or None without one.
    fanout: dict[str, int | bool] | None = None

    @property
    def status(self) -> int:
        """The HTTP status a probe expects: 200 when ready, else 503."""
        return 200 if self.ready else 503

    def as_dict(self) -> dict[str, Any]:
        """The response body, ready for ``json.dumps``."""
        return {
            "ready": self.ready,
            "problems": list(self.problems),
            "purgatories": dict(self.purgatories),
            "fanout": None if self.fanout is None else dict(self.fanout),
        }


def check_queue_limit(queue_limit: object) -> float:
    """A share of the publish queue in (0, 1]; raises ValueError naming the argument."""
    if (
        isinstance(queue_limit, bool)
        or not isinstance(queue_limit, int | float)
        or not 0 < queue_limit <= 1
    ):
        raise ValueError(f"queue_limit must be a share of the queue in (0, 1], got {queue_limit!r}")
    return float(queue_limit)


def readiness(
    purgatories: Iterable[Purgatory] | None,
    fanout: Fanout | None = None,
    *,
    queue_limit: float = DEFAULT_QUEUE_LIMIT,
) -> Readiness:
    """Whether the application can serve its waits now.

    Not ready when any of these holds, each named in :attr:`Readiness.problems`:

    * there are no purgatories (``None``: the application's lifespan or
      ``setup_purgatories`` has not run), or one is shut down;
    * the fan-out's engine is not connected (not started yet, stopped, or in an
      outage: events from other processes do not arrive);
    * the fan-out's publish queue holds ``queue_limit`` of its size or more
      (the engine is not keeping up; a full queue drops events).

    Raises:
        ValueError: ``queue_limit`` is not in (0, 1].
    """
    limit = check_queue_limit(queue_limit)
    problems: list[str] = []
    states: dict[str, str] = {}
    if purgatories is None:
        problems.append("the purgatories have not started (the application's startup has not run)")
    else:
        for purgatory in purgatories:
            states[purgatory.name] = "shut down" if purgatory.closed else "running"
            if purgatory.closed:
                problems.append(f"purgatory {purgatory.name!r} is shut down")
        if not states:
            problems.append("the application has no purgatories")
    gauges: dict[str, int | bool] | None = None
    if fanout is not None:
        stats = fanout.stats()
        size = fanout.queue_size
        gauges = {"connected": stats.connected, "queued": stats.queued, "queue_size": size}
        if not stats.connected:
            problems.append("the fan-out's engine is not connected")
        if stats.queued >= limit * size:
            problems.append(
                f"the fan-out's publish queue holds {stats.queued} of {size} events "
                f"(the limit is {limit:.0%})"
            )
    return Readiness(not problems, tuple(problems), states, gauges)
