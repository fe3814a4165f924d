"""The PostgreSQL backend: a table of latest values, NOTIFY as the hint, LISTEN per process.

Needs the ``postgres`` extra (``pip install 'purgatory-aio[postgres]'``), which
brings **asyncpg**. Chosen over psycopg 3 because it hands each notification to a
callback on the connection as it arrives, with no polling task and no
``notifies()`` generator to keep alive; it tells the application when a
connection ends (termination listeners), which is what a reconnection with
resync hangs on; it needs no libpq, so the wheel installs the same everywhere;
and it is the driver ``broadcaster`` uses too, so ``python -m bench fanout``
compares the two designs on the same driver.

* **The store is the truth.** One table, ``<prefix>_values (key, value,
  updated_at)``, holds the latest value of every advanced key. An advance is
  one statement: an upsert that raises the stored value to the greater of the
  two (a value that is not a number, or NULL, written by someone else is
  replaced) and, only when it raised it, ``pg_notify`` on ``<prefix>_events``.
  Checks and cancels are a ``pg_notify`` alone. A batch is one atomic
  ``executemany``, so its notifications leave at its commit, in order (two
  identical notifications in one transaction are merged by PostgreSQL, which
  is harmless for idempotent events). If the server refuses one statement of a
  batch (a table someone changed), the batch is sent again one event at a time
  and only the refused events are reported.
* **One LISTEN connection per process**, for however many keys it watches,
  beside one that publishes and one that reads stored values (a slow read
  never costs the subscription). PostgreSQL does not reconnect by itself: the
  subscription reconnects with backoff when its connection ends (asyncpg's
  termination listener) or stops answering a health probe, listens again, and
  then the fan-out re-reads every watched key.
* **Bounded waits everywhere.** Connecting, each statement and each probe have
  a timeout; a statement that timed out leaves its connection closed (the next
  use reconnects), so a frozen server never holds a publisher, a read or
  ``stop()``.
* **The schema is the team's.** The table lives in the schema ``public`` unless
  another is chosen (``schema=``, ``?schema=``); a member creates what is missing
  unless ``create=False``, and checks from the catalogs that its role may use the
  table, naming what is missing in one line. The DDL and the grants a member needs
  come from :mod:`purgatory_aio.fanout.postgres_schema`.
* **A primary with standbys.** A URL may name several hosts (``h1:5432,h2:5432``):
  every connection goes to the first that takes writes (``target_session_attrs`` is
  ``read-write`` unless the URL says otherwise), each host with a connect timeout of its
  own, the host that answered last tried first. When the LISTEN connection lands on
  another server than before (a standby promoted), the fan-out is told
  (``BackendHost.switched``), the other connections are reopened there, and every
  watched key is re-read.
* **TLS** as libpq spells it in the URL (``sslmode=verify-full&sslrootcert=...``); a
  certificate that does not check out is one line saying which check failed.
* **Rows do not accumulate.** Values not raised for ``value_ttl`` seconds are
  deleted by whichever member publishes, at most every few minutes (the table
  only grows through publishing).

LISTEN needs a server session of its own: point the URL at the server, or at a
pooler in session mode (a transaction-mode pooler runs the LISTEN on a server
session it then lends to other clients, and its notifications never reach this
process).

Limits of the engine, refused at the call: a key is at most
:data:`MAX_KEY_BYTES` bytes of UTF-8 (the primary key's index entry and the
8000-byte NOTIFY payload must hold it), and PostgreSQL's text cannot hold NUL.
"""

from __future__ import annotations

from typing import Any, SupportsFloat, cast

try:
    import asyncpg  # noqa: F401 - the backend modules import it
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "purgatory_aio.fanout.PostgresFanout needs asyncpg: install the extra: "
        "pip install 'purgatory-aio[postgres]'"
    ) from exc

from .._purgatory import Purgatory
from .._validation import check_positive_seconds
from ._base import (
    ADVANCE,
    encode,
)
from ._checks import check_key, check_value
from ._fanout import Fanout
from ._postgres_backend import (
    LISTEN_APPLICATION,
    READ_APPLICATION,
    WRITE_APPLICATION,
    PostgresBackend,
    driver_of,
)
from ._postgres_urls import ENV_URL, MAX_KEY_BYTES, resolve_url, url_hosts


class PostgresFanout(Fanout):
    """Fan-out through PostgreSQL: values in a table, NOTIFY as the hint, LISTEN per process.

    Args:
        url: ``postgresql://user:password@host:5432/db``, or several hosts for a primary
            and its standbys (``postgresql://user:password@h1:5432,h2:5432/db``); TLS
            parameters as libpq's (``?sslmode=verify-full&sslrootcert=ca.pem``). ``None``
            reads ``$PURGATORY_AIO_POSTGRES_URL``.
        purgatories: the purgatories events apply to (more with :meth:`attach`).
        prefix: names the table (``<prefix>_values``) and the channel
            (``<prefix>_events``), so several applications can share a database.
        schema: the schema of the table (``public`` unless given here or as
            ``?schema=`` in the URL; never the connection's ``search_path``). In any
            other schema the channel is ``<schema>.<prefix>_events``.
        create: False: create nothing at run time (the table comes from a migration,
            see :mod:`purgatory_aio.fanout.postgres_schema`); ``start()`` then raises one
            :class:`FanoutUnavailable` naming the missing schema, table or privilege.
            True by default: the first member creates the schema, table and index if
            missing. Also ``?create=false`` in the URL.
        queue_size: events that may wait to be published; beyond it they are dropped.
        batch: events per round trip (one transaction).
        value_ttl: seconds a stored value outlives its last raise.
        resync_interval: seconds between safety-net resyncs.
        connect_timeout: seconds to wait for a connection (and for a read).
        command_timeout: seconds a statement may take before its connection is
            given up (and reconnected).
        health_interval: seconds between probes of an idle LISTEN connection (how
            soon a server that vanished without closing it is noticed).
        subscribe: False for a process that only publishes: no LISTEN connection.
    """

    def __init__(
        self,
        url: str | None = None,
        *purgatories: Purgatory,
        prefix: str = "purgatory_aio",
        schema: str | None = None,
        create: bool | None = None,
        queue_size: int = 65536,
        batch: int = 512,
        value_ttl: float = 86400.0,
        resync_interval: float = 30.0,
        connect_timeout: float = 2.0,
        command_timeout: float = 5.0,
        health_interval: float = 10.0,
        subscribe: bool = True,
    ) -> None:
        backend = PostgresBackend(
            resolve_url(url),
            prefix=prefix,
            schema=schema,
            create=create,
            value_ttl=check_positive_seconds(value_ttl, "value_ttl"),
            connect_timeout=check_positive_seconds(connect_timeout, "connect_timeout"),
            command_timeout=check_positive_seconds(command_timeout, "command_timeout"),
            health_interval=check_positive_seconds(health_interval, "health_interval"),
        )
        super().__init__(
            backend,
            *purgatories,
            queue_size=queue_size,
            batch=batch,
            resync_interval=resync_interval,
            connect_timeout=connect_timeout,
            subscribe=subscribe,
        )
        self.url = backend.url
        self.schema = backend.schema
        self.table = backend.table
        self.channel = backend.channel

    async def advance_in(self, conn: Any, key: str, value: SupportsFloat) -> None:
        """Advance ``key`` to ``value`` as part of the caller's own transaction on ``conn``.

        ``conn`` is the caller's own connection, usually inside a transaction beside the
        write the value stands for (``UPDATE orders SET version = ...``): an asyncpg
        connection (or a pool's) in ``async with conn.transaction():``, a psycopg 3
        ``AsyncConnection`` (the ``psycopg`` extra), or a SQLAlchemy ``AsyncConnection`` or
        ``AsyncSession`` on PostgreSQL with either driver (the ``sqlalchemy`` extra). The
        stored value and the notification commit with that write, or roll back with it: no
        waiter hears of a change that did not happen, and none misses one that did. Nothing
        applies here at the call: every member of the fan-out, this one included, applies
        the advance when its notification arrives, that is once the transaction commits
        (outside a transaction, at once). The value merges by max as :meth:`advance`'s does.

        Raises:
            TypeError, ValueError: bad ``conn``, ``key`` or ``value``, before anything is
                sent (the caller's transaction is left as it was).
            FanoutUnavailable: the fan-out's table does not exist in that database.
        """
        driver = driver_of(conn)
        key = check_key(key, self._max_key)
        number = check_value(value)
        # No origin: the message is not one this member published and applied already, so
        # every member applies it, this one too.
        message = encode(ADVANCE, key, number)
        backend = cast(PostgresBackend, self.backend)  # the one this class was built with
        await backend.store_and_publish_in(conn, driver, key, number, message)


# The backend's pieces live in _postgres_backend, _postgres_urls and _postgres_errors; the
# names above stay importable from here.
__all__ = [
    "ENV_URL",
    "LISTEN_APPLICATION",
    "MAX_KEY_BYTES",
    "READ_APPLICATION",
    "WRITE_APPLICATION",
    "PostgresBackend",
    "PostgresFanout",
    "driver_of",
    "resolve_url",
    "url_hosts",
]
