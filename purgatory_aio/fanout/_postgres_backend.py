"""The PostgreSQL engine: a table of values, NOTIFY as the hint, LISTEN per process."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

import asyncpg

from .._logging import get_logger
from ._base import (
    ADVANCE,
    BackendHost,
    Event,
    FanoutBackend,
    FanoutUnavailable,
)
from ._postgres_errors import (
    MISSING_TABLE,
    EngineUnreachable,
    NoHostAnswered,
    connection_lost,
    describe,
    give_up_if_lost,
    sqlstate,
)
from ._postgres_urls import (
    DDL_COMMAND,
    MAX_KEY_BYTES,
    TLS_REQUIRED,
    merge_option,
    resolve_url,
    session_target,
    url_hosts,
    url_options,
)
from ._urls import redacted
from .postgres_schema import (
    DEFAULT_SCHEMA,
    PRIVILEGES,
    PostgresSchema,
    check_prefix,
    check_schema,
)

_log = get_logger("purgatory_aio.fanout.postgres")


#: Shown in pg_stat_activity, so an operator (or a test) can tell the connections apart.
LISTEN_APPLICATION: Final = "purgatory_aio fanout listen"
WRITE_APPLICATION: Final = "purgatory_aio fanout write"
READ_APPLICATION: Final = "purgatory_aio fanout read"

# often (seconds): a publisher never spends long on them.
_EXPIRE_ROWS: Final = 10_000
_EXPIRE_EVERY: Final = 300.0


class PostgresBackend(FanoutBackend):
    """The PostgreSQL engine of a :class:`PostgresFanout` (see the module docstring)."""

    network_errors = (OSError, TimeoutError)  # EngineUnreachable is a ConnectionError
    max_key_bytes = MAX_KEY_BYTES

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "purgatory_aio",
        schema: str | None = None,
        create: bool | None = None,
        value_ttl: float = 86400.0,
        connect_timeout: float = 2.0,
        command_timeout: float = 5.0,
        health_interval: float = 10.0,
    ) -> None:
        url, options = url_options(resolve_url(url))
        if schema is not None:
            check_schema(schema)
        if create is not None and not isinstance(create, bool):
            raise TypeError(f"create must be True or False, got {create!r}")
        self.url = url
        self.prefix = check_prefix(prefix)
        chosen = merge_option("schema", schema, options.get("schema"), DEFAULT_SCHEMA)
        self.names = PostgresSchema(check_schema(chosen), self.prefix)
        self.schema = self.names.schema
        self.create = bool(merge_option("create", create, options.get("create"), True))
        self.table = self.names.table_name
        self.channel = self.names.channel
        # Tried in turn, the last one that answered first (see _open).
        self._hosts = url_hosts(self.url)
        self.session_target = session_target(self.url, len(self._hosts))
        self._server: str | None = None  # where the LISTEN connection is, once made
        self._tls = dict(parse_qsl(urlsplit(self.url).query)).get("sslmode") in TLS_REQUIRED
        self._ttl = value_ttl
        self._connect_timeout = connect_timeout
        self._command_timeout = command_timeout
        self._health_interval = health_interval
        table = self.names.table
        # One statement for every kind of event, so a batch is one executemany and its
        # notifications keep the order of the events. $1 kind, $2 key, $3 value, $4 message.
        self._publish_sql = _publish_statement(table, self.channel, "$1", "$2", "$3", "$4")
        # The same for the caller's own psycopg connection (advance_in), and for SQLAlchemy's
        # text(), which turns :name into its driver's placeholders.
        self._publish_psycopg = _publish_statement(
            table, self.channel, "%(kind)s", "%(key)s", "%(value)s", "%(message)s"
        )
        self._publish_named = _publish_statement(
            table, self.channel, ":kind", ":key", ":value", ":message"
        )
        self._read_sql = f"SELECT key, value FROM {table} WHERE key = ANY($1::text[])"
        self._expire_sql = f"""
            DELETE FROM {table} WHERE ctid = ANY(ARRAY(
                SELECT ctid FROM {table}
                WHERE updated_at < now() - make_interval(secs => $1::float8) LIMIT {_EXPIRE_ROWS}
            ))
        """
        self._writer: Any = None
        self._reader: Any = None
        self._read_lock = asyncio.Lock()
        self._listener: Any = None
        self.connection_lost: asyncio.Event | None = None
        self._next_expiry = time.monotonic() + min(_EXPIRE_EVERY, value_ttl / 2)

    @property
    def address(self) -> str:
        return f"PostgreSQL at {redacted(self.url)}"

    def _describe(self, exc: BaseException) -> str:
        return describe(exc, self._connect_timeout, self._tls)

    # -- connections -----------------------------------------------------------------------------

    async def _open(self, application: str) -> Any:
        """A connection to the server (with several hosts, the first that is a primary)."""
        if len(self._hosts) < 2:
            return await self._connect(application, None)
        # asyncpg's timeout covers every host together: a frozen first host would spend it
        # all and the others never be tried. libpq gives each host a timeout of its own, and
        # so does this. The host that answered last is tried first, so after a failover a
        # dead or frozen old primary costs one timeout, not one per connection.
        failures: list[tuple[str, BaseException]] = []
        for host in list(self._hosts):
            try:
                conn = await self._connect(application, host)
            except (
                OSError,  # refused, timed out, TLS refused: the next host may do
                asyncpg.exceptions.TargetServerAttributeNotMatched,  # a standby
                asyncpg.exceptions.CannotConnectNowError,  # starting up, shutting down
            ) as exc:
                failures.append((_where(host), exc))
                continue
            if self._hosts[0] != host:
                self._hosts.remove(host)
                self._hosts.insert(0, host)
            return conn
        raise NoHostAnswered(failures, self._connect_timeout, self._tls)

    async def _connect(self, application: str, host: tuple[str, int | None] | None) -> Any:
        where = {} if host is None else {"host": host[0], "port": host[1]}
        return await asyncpg.connect(
            self.url,
            **where,
            timeout=self._connect_timeout,
            command_timeout=self._command_timeout,
            target_session_attrs=self.session_target,
            server_settings={"application_name": application},
        )

    async def connect(self, host: BackendHost | None) -> None:
        try:
            self._writer = await self._open(WRITE_APPLICATION)
            await self._ensure_table(self._writer)
            if host is not None:
                await self._listen(host)
        except asyncio.CancelledError:
            self._terminate_all()
            raise
        except FanoutUnavailable:
            self._terminate_all()
            raise
        except Exception as exc:
            self._terminate_all()
            raise FanoutUnavailable(f"cannot use {self.address}: {self._describe(exc)}") from None

    async def _ensure_table(self, conn: Any) -> None:
        """Check that the schema and the table exist and that this role may use them (with
        ``create``, make what is missing first, one process at a time: concurrent CREATE
        TABLE IF NOT EXISTS can collide); one clear :class:`FanoutUnavailable` otherwise."""
        names = self.names
        # Everything in one transaction that ends here: a statement prepared outside one
        # leaves the session's implicit transaction open (asyncpg sends no Sync after it),
        # and with it a lock on the table that an operator's ALTER, TRUNCATE or DROP would
        # wait behind for as long as this member lives.
        async with conn.transaction():
            state = await conn.fetchrow(_STATE_SQL, names.schema, names.table_name)
            if state["table_oid"] is None and self.create:
                self._may_create(state)
                await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", names.shown)
                if state["schema_oid"] is None:
                    await conn.execute(names.create_schema())
                for statement in names.create_table():
                    await conn.execute(statement)
                state = await conn.fetchrow(_STATE_SQL, names.schema, names.table_name)
            self._may_use(state)
            try:
                statement = await conn.prepare(
                    f"SELECT key, value, updated_at FROM {names.table} LIMIT 0"
                )
            except asyncpg.PostgresError as exc:
                raise FanoutUnavailable(
                    f"cannot use {self.address}: the table {names.shown} exists but is not the "
                    f"fan-out's ({exc}); choose another prefix"
                ) from None
            types = {attr.name: attr.type.name for attr in statement.get_attributes()}
        if types.get("key") != "text" or types.get("value") != "float8":
            raise FanoutUnavailable(
                f"cannot use {self.address}: the table {names.shown} exists with other column "
                f"types ({types}); choose another prefix"
            )

    def _unusable(self, problem: str) -> FanoutUnavailable:
        return FanoutUnavailable(f"cannot use {self.address}: {problem}")

    def _may_create(self, state: Any) -> None:
        """Refuse, naming the privilege, to create what this role may not."""
        names, role = self.names, state["role"]
        ddl = f"{DDL_COMMAND} --schema {names.schema} --prefix {names.prefix}"
        if state["schema_oid"] is None and not state["may_create_schema"]:
            raise self._unusable(
                f"the schema {names.schema} does not exist and the role {role} may not create "
                f"it (CREATE on the database): apply the DDL `{ddl}` prints"
            )
        if state["schema_oid"] is not None and not state["may_create_table"]:
            raise self._unusable(
                f"the table {names.shown} does not exist and the role {role} may not create it "
                f"(CREATE on the schema {names.schema}): apply the DDL `{ddl}` prints"
            )

    def _may_use(self, state: Any) -> None:
        """Refuse, naming what is missing, a schema, table or privilege the member lacks."""
        names, role = self.names, state["role"]
        ddl = f"{DDL_COMMAND} --schema {names.schema} --prefix {names.prefix} --role {role}"
        if state["schema_oid"] is None:
            raise self._unusable(
                f"the schema {names.schema} does not exist (create=False): apply the DDL "
                f"`{ddl}` prints"
            )
        if not state["schema_usage"]:
            raise self._unusable(
                f"the role {role} lacks USAGE on the schema {names.schema}: "
                f"GRANT USAGE ON SCHEMA {names.schema} TO {role}"
            )
        if state["table_oid"] is None:
            raise self._unusable(
                f"the table {names.shown} does not exist (create=False): apply the DDL "
                f"`{ddl}` prints"
            )
        missing = [name for name in PRIVILEGES if not state[f"may_{name.lower()}"]]
        if missing:
            raise self._unusable(
                f"the role {role} lacks {', '.join(missing)} on the table {names.shown}: "
                f"GRANT {', '.join(PRIVILEGES)} ON {names.shown} TO {role}"
            )

    async def _listen(self, host: BackendHost) -> None:
        conn = await self._open(LISTEN_APPLICATION)
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _conn: lost.set())

        def notified(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            host.deliver(payload)

        try:
            await conn.add_listener(self.channel, notified)
            server = await conn.fetchval(_SERVER_SQL, timeout=self._command_timeout)
        except BaseException:
            conn.terminate()
            raise
        # LISTEN is in effect once it returns (autocommit): every later commit reaches us.
        self._listener, self.connection_lost = conn, lost
        previous, self._server = self._server, server
        if previous is not None and previous != server:
            # The other connections may still be held by the old server, frozen rather than
            # dead: the re-read that follows must not wait on it. Each reopens on the next
            # use, where this one landed (the host that answered last is tried first).
            self._drop_reader()
            self._drop_writer()
            host.switched(previous, server)

    def _drop_listener(self) -> None:
        conn, self._listener = self._listener, None
        if conn is not None:
            conn.terminate()
        if self.connection_lost is not None:
            self.connection_lost.set()  # the subscription notices at once, whoever dropped it

    def _drop_writer(self) -> None:
        conn, self._writer = self._writer, None
        if conn is not None:
            conn.terminate()

    def _drop_reader(self) -> None:
        conn, self._reader = self._reader, None
        if conn is not None:
            conn.terminate()

    def _terminate_all(self) -> None:
        self._drop_listener()
        self._drop_reader()
        self._drop_writer()

    async def close(self) -> None:
        """Close both connections at once: terminate() sends nothing and waits for nothing,
        so a frozen server cannot hold it."""
        self._terminate_all()

    # -- publishing ------------------------------------------------------------------------------

    async def store_and_publish(self, events: Sequence[Event]) -> list[BaseException | None]:
        conn = self._writer
        if conn is None or conn.is_closed():
            try:
                conn = self._writer = await self._open(WRITE_APPLICATION)
                # A restored or recreated database may have lost the table: make it again.
                await self._ensure_table(conn)
            except asyncio.CancelledError:
                self._drop_writer()
                raise
            except Exception as exc:
                self._drop_writer()
                raise EngineUnreachable(self._describe(exc)) from None
        rows = [(event.kind, event.key, event.value, event.message) for event in events]
        try:
            await conn.executemany(self._publish_sql, rows, timeout=self._command_timeout)
        except BaseException as exc:
            give_up_if_lost(exc, conn, self._drop_writer, "publishing failed")
            if isinstance(exc, asyncpg.exceptions.UndefinedTableError):
                # Dropped while we were connected: reconnecting makes it again, and the
                # fan-out sends the batch again.
                self._drop_writer()
                raise EngineUnreachable(f"the table {self.names.shown} is gone: {exc}") from None
            if len(rows) > 1:  # which events did the server refuse? One at a time.
                return await self._one_by_one(conn, rows)
            return [exc]
        await self._maybe_expire(conn)
        return [None] * len(rows)

    async def store_and_publish_in(
        self, conn: Any, driver: str, key: str, value: float, message: str
    ) -> None:
        """The advance's statement on the caller's own connection (see
        :meth:`PostgresFanout.advance_in`); ``driver`` as :func:`driver_of` names it."""
        try:
            if driver == "asyncpg":
                await conn.execute(
                    self._publish_sql, ADVANCE, key, value, message, timeout=self._command_timeout
                )
            else:
                params = {"kind": ADVANCE, "key": key, "value": value, "message": message}
                # The caller's driver has no timeout of its own per statement: bounded here,
                # as asyncpg's is (a cancelled statement leaves the caller's transaction to
                # roll back, as any failed statement does).
                async with asyncio.timeout(self._command_timeout):
                    if driver == "psycopg":
                        await conn.execute(self._publish_psycopg, params)
                    else:
                        from sqlalchemy import text

                        await conn.execute(text(self._publish_named), params)
        except Exception as exc:
            if sqlstate(exc) not in MISSING_TABLE:
                raise
            raise FanoutUnavailable(
                f"the table {self.names.shown} does not exist at {self.address}: start a fan-out "
                "with this prefix once (it creates the table) before advancing in a transaction, "
                f"or apply the DDL `{DDL_COMMAND} --schema {self.schema} --prefix {self.prefix}` "
                "prints"
            ) from None

    async def _one_by_one(
        self, conn: Any, rows: list[tuple[str, str, float, str]]
    ) -> list[BaseException | None]:
        results: list[BaseException | None] = []
        for row in rows:
            try:
                await conn.execute(self._publish_sql, *row, timeout=self._command_timeout)
            except BaseException as exc:
                give_up_if_lost(exc, conn, self._drop_writer, "publishing failed")
                results.append(exc)
            else:
                results.append(None)
        return results

    async def _maybe_expire(self, conn: Any) -> None:
        """Delete values not raised for ``value_ttl`` seconds, at most every few minutes."""
        now = time.monotonic()
        if now < self._next_expiry:
            return
        self._next_expiry = now + min(_EXPIRE_EVERY, self._ttl / 2)
        try:
            status = await conn.execute(self._expire_sql, self._ttl, timeout=self._command_timeout)
        except asyncio.CancelledError:
            self._drop_writer()
            raise
        except Exception as exc:
            # The batch before it is stored: report that, and reconnect for the next one.
            if connection_lost(exc, conn):
                self._drop_writer()
            _log.warning("fanout_expiry_failed", address=self.address, error=repr(exc))
            return
        _log.debug("fanout_expired_values", status=status)

    # -- reading ---------------------------------------------------------------------------------

    async def read(self, keys: Sequence[str], host: BackendHost) -> dict[str, float]:
        """On a connection of their own, one read at a time: a slow or cancelled read closes
        that connection (the next read opens another) and never touches the subscription."""
        async with self._read_lock:
            conn = self._reader
            if conn is None or conn.is_closed():
                try:
                    conn = self._reader = await self._open(READ_APPLICATION)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    raise EngineUnreachable(self._describe(exc)) from None
            try:
                rows = await conn.fetch(self._read_sql, list(keys), timeout=self._command_timeout)
            except BaseException as exc:
                give_up_if_lost(exc, conn, self._drop_reader, "reading failed")
                raise
        values: dict[str, float] = {}
        for key, value in rows:
            # Not a float: the column's type was changed under us (text, numeric...).
            if type(value) is not float or not -_INF < value < _INF:
                host.foreign_value(key, value)
            else:
                values[key] = value
        return values

    # -- subscribing -----------------------------------------------------------------------------

    async def subscribe(self, host: BackendHost) -> None:
        # asyncpg honours cancellation; host.listening ends the loop all the same once the
        # fan-out stops, as the interface asks of every backend.
        backoff = 0.05
        while host.listening:
            if self._listener is None or self._listener.is_closed():
                self._drop_listener()
                try:
                    await self._listen(host)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    host.down(EngineUnreachable(self._describe(exc)))
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
                    continue
            backoff = 0.05
            host.subscribed()
            reason = await self._watch()
            self._drop_listener()
            host.down(EngineUnreachable(reason))

    async def _watch(self) -> str:
        """Return (why) once the LISTEN connection ended or stopped answering."""
        lost = self.connection_lost
        assert lost is not None
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._health_interval):
                    await lost.wait()
                return "the LISTEN connection was closed"
            conn = self._listener
            if conn is None or conn.is_closed():
                return "the LISTEN connection was closed"
            try:
                await conn.fetchval("SELECT 1", timeout=self._command_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                return f"the LISTEN connection stopped answering: {exc!r}"


_INF: Final = float("inf")


def _publish_statement(
    table: str, channel: str, kind: str, key: str, value: str, message: str
) -> str:
    """The advance / check / cancel statement, with the driver's placeholders (each used as
    CAST(... AS type): SQLAlchemy's text() would read ``:key::text`` as a parameter ``key:``)."""
    return f"""
        WITH raised AS (
            INSERT INTO {table} AS stored (key, value, updated_at)
            SELECT CAST({key} AS text), CAST({value} AS float8), now()
            WHERE CAST({kind} AS text) = '{ADVANCE}'
            ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = now()
            -- raise to the greater one; replace a NaN, an infinity or a NULL someone
            -- else stored (none is a value this fan-out writes: each is foreign)
            WHERE stored.value < excluded.value OR stored.value IS NULL
                OR stored.value IN (CAST('NaN' AS float8), CAST('Infinity' AS float8))
            RETURNING 1
        )
        SELECT pg_notify({_literal(channel)}, CAST({message} AS text))
        WHERE CAST({kind} AS text) <> '{ADVANCE}' OR EXISTS (SELECT 1 FROM raised)
    """


def driver_of(conn: object) -> str:
    """Which driver's connection ``conn`` is: ``asyncpg`` (a connection or a pool's),
    ``psycopg`` (an ``AsyncConnection``) or ``sqlalchemy`` (an ``AsyncConnection`` or
    ``AsyncSession`` on PostgreSQL); a ``TypeError`` for anything else. The optional drivers
    are imported only when ``conn`` comes from one of them."""
    if isinstance(conn, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
        return "asyncpg"
    module = type(conn).__module__
    if module.startswith("psycopg"):
        import psycopg

        if isinstance(conn, psycopg.AsyncConnection):
            return "psycopg"
    if module.startswith("sqlalchemy"):
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        if isinstance(conn, AsyncConnection | AsyncSession):
            dialect = (conn.get_bind() if isinstance(conn, AsyncSession) else conn).dialect
            if dialect.name != "postgresql":
                raise TypeError(
                    f"conn must be on PostgreSQL, got a SQLAlchemy {dialect.name} connection"
                )
            return "sqlalchemy"
    raise TypeError(
        "conn must be an asyncpg connection (or a pool's), a psycopg AsyncConnection or a "
        f"SQLAlchemy AsyncConnection or AsyncSession, got {type(conn).__name__}"
    )


# Whether the schema and the table exist, and what the connected role may do with them:
# read from the catalogs, never by trying (a refused statement would end the transaction).
# $1 schema, $2 table (both checked identifiers, passed as values all the same).
_STATE_SQL: Final = """
    SELECT current_user AS role, n.oid AS schema_oid, c.oid AS table_oid,
        has_database_privilege(current_database(), 'CREATE') AS may_create_schema,
        n.oid IS NOT NULL AND has_schema_privilege(n.oid, 'CREATE') AS may_create_table,
        n.oid IS NOT NULL AND has_schema_privilege(n.oid, 'USAGE') AS schema_usage,
        c.oid IS NOT NULL AND has_table_privilege(c.oid, 'SELECT') AS may_select,
        c.oid IS NOT NULL AND has_table_privilege(c.oid, 'INSERT') AS may_insert,
        c.oid IS NOT NULL AND has_table_privilege(c.oid, 'UPDATE') AS may_update,
        c.oid IS NOT NULL AND has_table_privilege(c.oid, 'DELETE') AS may_delete
    FROM (SELECT 1) AS one
    LEFT JOIN pg_namespace n ON n.nspname = $1
    LEFT JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = $2
"""

# Which server a connection reached, as the server sees it (whatever name the URL gave it).
_SERVER_SQL: Final = (
    "SELECT coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'a local socket')"
)


def _where(host: tuple[str, int | None]) -> str:
    name = f"[{host[0]}]" if ":" in host[0] else host[0]
    return f"{name}:{host[1] or 5432}"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


__all__ = [
    "LISTEN_APPLICATION",
    "READ_APPLICATION",
    "WRITE_APPLICATION",
    "PostgresBackend",
    "driver_of",
]
