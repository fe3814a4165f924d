"""One fan-out from one URL, whichever engine it names."""

from __future__ import annotations

import os
from typing import Any, Final
from urllib.parse import urlsplit

from .._purgatory import Purgatory
from ._fanout import Fanout
from ._urls import redacted

#: The environment variable :func:`fanout_from_url` reads when no URL is given.
ENV_FANOUT_URL: Final = "PURGATORY_AIO_FANOUT_URL"
"""The environment variable ``fanout_from_url(None)`` reads its engine URL from."""

_REDIS: Final = (
    "redis",
    "rediss",
    "unix",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
)
_POSTGRES: Final = ("postgresql", "postgres")
_MEMORY: Final = "memory"


def fanout_from_url(url: str | None = None, *purgatories: Purgatory, **options: Any) -> Fanout:
    """A fan-out on the engine ``url`` names (``None``: ``$PURGATORY_AIO_FANOUT_URL``).

    * ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://``,
      ``rediss+sentinel://``, ``redis+cluster://``, ``rediss+cluster://``: a
      :class:`RedisFanout` (the ``redis`` extra);
    * ``postgresql://``, ``postgres://``: a :class:`PostgresFanout`
      (the ``postgres`` extra);
    * ``memory://``: a :class:`MemoryFanout` on a hub of its own (one process
      alone; for development and tests).

    ``options`` go to the class (``prefix``, ``queue_size``, ...). The URL is
    checked before anything connects: a ``ValueError`` says what is wrong with
    it. Nothing connects until :meth:`Fanout.start`.
    """
    chosen = url if url is not None else os.environ.get(ENV_FANOUT_URL)
    if not chosen:
        raise ValueError(
            f"no fan-out URL: pass one (redis://..., postgresql://..., memory://) "
            f"or set ${ENV_FANOUT_URL}"
        )
    if not isinstance(chosen, str):
        raise TypeError(f"the fan-out URL must be a str, got {type(chosen).__name__}")
    scheme = chosen.partition(":")[0].lower() if "://" in chosen else ""
    if scheme in _REDIS:
        from ._redis import RedisFanout

        return RedisFanout(chosen, *purgatories, **options)
    if scheme in _POSTGRES:
        from ._postgres import PostgresFanout

        return PostgresFanout(chosen, *purgatories, **options)
    if scheme == _MEMORY:
        if urlsplit(chosen).netloc or urlsplit(chosen).path.strip("/"):
            raise ValueError(f"memory:// takes no address, got {chosen!r}")
        from ._memory import MemoryBackend, MemoryHub

        return Fanout(MemoryBackend(MemoryHub()), *purgatories, **options)
    raise ValueError(
        f"not a fan-out URL: {redacted(chosen)!r} (expected redis://, rediss://, unix://, "
        "redis+sentinel://, rediss+sentinel://, redis+cluster://, rediss+cluster://, "
        "postgresql://, postgres:// or memory://)"
    )
