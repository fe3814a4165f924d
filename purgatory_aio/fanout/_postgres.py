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

import asyncio
import contextlib
import os
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, SupportsFloat, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

try:
    import asyncpg
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "purgatory_aio.fanout.PostgresFanout needs asyncpg: install the extra: "
        "pip install 'purgatory-aio[postgres]'"
    ) from exc

from .._logging import get_logger
from .._purgatory import Purgatory
from .._validation import check_positive_seconds
from ._base import (
    ADVANCE,
    BackendHost,
    Event,
    Fanout,
    FanoutBackend,
    FanoutUnavailable,
    check_key,
    check_value,
    encode,
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

#: The environment variable read when no URL is given.
ENV_URL: Final = "PURGATORY_AIO_POSTGRES_URL"

#: The longest key, in UTF-8 bytes: a btree entry holds at most about 2700 bytes, and the
#: NOTIFY payload (the key plus about 40 bytes) at most 7999.
MAX_KEY_BYTES: Final = 2000

SCHEMES: Final = ("postgresql", "postgres")

#: The URL's query parameters that are the fan-out's own (not the driver's): taken out of
#: the URL before it is handed to asyncpg, which would send them as server settings.
URL_OPTIONS: Final = ("schema", "create")
_TRUE: Final = frozenset({"true", "1", "yes", "on"})
_FALSE: Final = frozenset({"false", "0", "no", "off"})

#: The command that prints the DDL, as error messages name it.
DDL_COMMAND: Final = "python -m purgatory_aio.fanout.postgres_schema"

# The fan-out writes and LISTENs: a session that may land on a standby cannot serve it.
_WRITABLE_TARGETS: Final = ("read-write", "primary", "any")
_SSL_MODES: Final = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_TLS_REQUIRED: Final = ("require", "verify-ca", "verify-full")

#: Shown in pg_stat_activity, so an operator (or a test) can tell the connections apart.
LISTEN_APPLICATION: Final = "purgatory_aio fanout listen"
WRITE_APPLICATION: Final = "purgatory_aio fanout write"
READ_APPLICATION: Final = "purgatory_aio fanout read"

# Errors after which a connection is not to be used again (asyncpg's own InterfaceError
# covers "connection is closed"; its DataError, raised before sending, is a PostgresError).
_CONNECTION_ERRORS: Final = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # shutdown, terminated backend, starting up
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,  # credentials changed
)

# At most this many expired rows go per clean-up statement, and clean-ups run at most this
# often (seconds): a publisher never spends long on them.
_EXPIRE_ROWS: Final = 10_000
_EXPIRE_EVERY: Final = 300.0


class EngineUnreachable(ConnectionError):
    """The connection to PostgreSQL failed or was closed (the fan-out retries)."""


def resolve_url(url: str | None) -> str:
    """The URL to use: ``url``, else ``$PURGATORY_AIO_POSTGRES_URL``; checked for the mistakes
    that can be seen without connecting (a clear ``ValueError``)."""
    chosen = url if url is not None else os.environ.get(ENV_URL)
    if not chosen:
        raise ValueError(
            "no PostgreSQL URL: pass url='postgresql://user:password@host:5432/db' "
            f"or set ${ENV_URL}"
        )
    if not isinstance(chosen, str):
        raise TypeError(f"the PostgreSQL URL must be a str, got {type(chosen).__name__}")
    shown = redacted(chosen)
    try:
        parts = urlsplit(chosen)
    except ValueError as exc:
        raise ValueError(f"not a usable PostgreSQL URL: {shown!r} ({exc})") from None
    if parts.scheme.lower() not in SCHEMES or not chosen.lower().startswith(f"{parts.scheme}://"):
        raise ValueError(
            f"not a PostgreSQL URL: {shown!r} (expected postgresql://user:password@host:5432/db"
            " or postgres://...)"
        )
    hosts = url_hosts(chosen)
    query = dict(parse_qsl(parts.query))
    if not hosts and "host" not in query:
        raise ValueError(f"the PostgreSQL URL {shown!r} names no host")
    target = query.get("target_session_attrs")
    if target is not None and target not in _WRITABLE_TARGETS:
        raise ValueError(
            f"the PostgreSQL URL {shown!r} asks for target_session_attrs={target}: the fan-out "
            "writes and LISTENs, which only a primary accepts; use one of "
            f"{', '.join(_WRITABLE_TARGETS)} (read-write is the default with several hosts)"
        )
    mode = query.get("sslmode")
    if mode is not None and mode not in _SSL_MODES:
        raise ValueError(
            f"the PostgreSQL URL {shown!r} has sslmode={mode}: expected one of "
            f"{', '.join(_SSL_MODES)}"
        )
    for name in ("sslrootcert", "sslcert", "sslkey"):
        path = query.get(name)
        if path and path != "system" and not os.access(os.path.expanduser(path), os.R_OK):
            raise ValueError(
                f"the PostgreSQL URL {shown!r} names {name}={path}, which is not a readable file"
            )
    return chosen


def url_options(url: str) -> tuple[str, dict[str, str]]:
    """``url`` without the fan-out's own query parameters (:data:`URL_OPTIONS`), and those
    parameters by name; a parameter given twice is a ``ValueError``."""
    parts = urlsplit(url)
    if not parts.query:
        return url, {}
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    options: dict[str, str] = {}
    for name, value in pairs:
        if name in URL_OPTIONS:
            if name in options:
                raise ValueError(f"the PostgreSQL URL {redacted(url)!r} gives {name}= twice")
            options[name] = value
    if not options:
        return url, {}
    kept = [(name, value) for name, value in pairs if name not in URL_OPTIONS]
    return parts._replace(query=urlencode(kept)).geturl(), options


def url_hosts(url: str) -> list[tuple[str, int | None]]:
    """The ``(host, port)`` pairs in the address of ``url``, in order (``h1:p1,h2:p2`` names
    several); empty when the address names none (a host in the query, or a socket)."""
    shown = redacted(url)
    hostspec = urlsplit(url).netloc.rpartition("@")[2]
    if not hostspec:
        return []
    hosts: list[tuple[str, int | None]] = []
    for item in hostspec.split(","):
        if item.startswith("["):  # an IPv6 address: [::1]:5432
            host, _, rest = item[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else rest
        else:
            host, _, port_text = item.partition(":")
        if not host:
            raise ValueError(f"the PostgreSQL URL {shown!r} has an empty host in {hostspec!r}")
        port: int | None = None
        if port_text:
            if not port_text.isdigit() or int(port_text) > 65535:
                raise ValueError(
                    f"not a usable PostgreSQL URL: {shown!r} (port {port_text!r} of {host} is "
                    "not a number from 1 to 65535)"
                )
            port = int(port_text)
            if port == 0:
                raise ValueError(f"the PostgreSQL URL {shown!r} has port 0: expected 1 to 65535")
        hosts.append((unquote(host), port))
    return hosts


def _target(url: str, hosts: int) -> str | None:
    """The ``target_session_attrs`` to connect with: the URL's, else ``read-write`` when it
    names several hosts (a standby takes neither writes nor LISTEN), else asyncpg's default."""
    chosen = dict(parse_qsl(urlsplit(url).query)).get("target_session_attrs")
    return chosen or ("read-write" if hosts > 1 else None)


class NoHostAnswered(ConnectionError):
    """No host of a multi-host URL gave a usable connection; ``failures`` says why, per host."""

    def __init__(
        self, failures: list[tuple[str, BaseException]], timeout: float, tls: bool
    ) -> None:
        super().__init__(
            "; ".join(f"{host}: {describe(exc, timeout, tls)}" for host, exc in failures)
        )
        self.failures = failures


def _merge_option(name: str, given: object, from_url: str | None, default: object) -> object:
    """A setting given as an argument, in the URL, or neither (the default); both only if
    they agree."""
    if from_url is None:
        return default if given is None else given
    if name == "create":
        lowered = from_url.lower()
        if lowered not in _TRUE | _FALSE:
            raise ValueError(
                f"create= in the PostgreSQL URL must be true or false, got {from_url!r}"
            )
        parsed: object = lowered in _TRUE
    else:
        parsed = from_url
    if given is not None and given != parsed:
        raise ValueError(f"{name}={given!r} disagrees with {name}={from_url!r} in the URL")
    return parsed


def _lost(exc: BaseException, conn: Any) -> bool:
    """Whether ``exc`` means the connection ``conn`` is not to be used again."""
    return (
        isinstance(exc, (*_CONNECTION_ERRORS, asyncio.CancelledError))
        or conn is None
        or conn.is_closed()
    )


def _give_up_if_lost(exc: BaseException, conn: Any, drop: Callable[[], None], doing: str) -> None:
    """After ``exc`` on ``conn``: if the connection is not to be used again, ``drop()`` it and
    raise (the cancellation itself, or :class:`EngineUnreachable`, which the fan-out retries);
    otherwise return (the server refused the statement)."""
    if _lost(exc, conn):
        drop()
        if isinstance(exc, asyncio.CancelledError):
            raise exc
        raise EngineUnreachable(f"{doing}: {exc!r}") from None


def describe(exc: BaseException, timeout: float, tls: bool = False) -> str:
    """What went wrong while connecting, in the words of someone configuring a URL (``tls``:
    the URL's sslmode requires TLS)."""
    if isinstance(exc, FanoutUnavailable | NoHostAnswered):
        return str(exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or exc.reason or "refused"
        if "mismatch" in reason:
            return (
                f"its TLS certificate is not valid for the host in the URL ({reason.rstrip('.')}):"
                " with sslmode=verify-full the URL must name a host the certificate names"
            )
        return (
            f"its TLS certificate could not be verified ({reason}): check sslrootcert in the "
            "URL, the CA that signed the server's certificate"
        )
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {exc.reason or exc}"
    if tls and isinstance(exc, ConnectionError) and "rejected SSL upgrade" in str(exc):
        # asyncpg's words when the server answers the TLS request with anything but "yes"
        # (with sslmode=prefer, a "no" goes on without TLS: then it is not PostgreSQL).
        return (
            "it does not offer TLS (ssl is off there), which the URL's sslmode requires "
            "(or it is not a PostgreSQL server)"
        )
    if isinstance(exc, asyncpg.exceptions.TargetServerAttributeNotMatched):
        return "a standby (read-only), not the primary the fan-out needs"
    if isinstance(exc, asyncpg.exceptions.InvalidAuthorizationSpecificationError):
        return f"it refused the credentials: {exc} (check the user and password in the URL)"
    if isinstance(exc, asyncpg.exceptions.InvalidCatalogNameError):
        return f"{exc} (check the database name in the URL)"
    if isinstance(exc, asyncpg.exceptions.InsufficientPrivilegeError):
        return f"the user may not create or use the fan-out's table: {exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "nothing listens there (connection refused)"
    if isinstance(exc, TimeoutError):
        return f"no PostgreSQL answer within {timeout:g} s (is that a PostgreSQL server?)"
    if isinstance(exc, asyncpg.PostgresError):
        return f"the server refused: {exc}"
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"cannot connect: {exc.strerror or exc}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"the server there does not answer as PostgreSQL does ({text})"


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
        chosen = _merge_option("schema", schema, options.get("schema"), DEFAULT_SCHEMA)
        self.names = PostgresSchema(check_schema(chosen), self.prefix)
        self.schema = self.names.schema
        self.create = bool(_merge_option("create", create, options.get("create"), True))
        self.table = self.names.table_name
        self.channel = self.names.channel
        # Tried in turn, the last one that answered first (see _open).
        self._hosts = url_hosts(self.url)
        self._target = _target(self.url, len(self._hosts))
        self._server: str | None = None  # where the LISTEN connection is, once made
        self._tls = dict(parse_qsl(urlsplit(self.url).query)).get("sslmode") in _TLS_REQUIRED
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
        self._lost: asyncio.Event | None = None
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
            target_session_attrs=self._target,
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
        self._listener, self._lost = conn, lost
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
        if self._lost is not None:
            self._lost.set()  # the subscription notices at once, whoever dropped it

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
            _give_up_if_lost(exc, conn, self._drop_writer, "publishing failed")
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
            if _sqlstate(exc) not in _MISSING_TABLE:
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
                _give_up_if_lost(exc, conn, self._drop_writer, "publishing failed")
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
            if _lost(exc, conn):
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
                _give_up_if_lost(exc, conn, self._drop_reader, "reading failed")
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
        lost = self._lost
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

#: SQLSTATEs of a missing table (undefined_table) and of a missing schema (invalid_schema_name).
_MISSING_TABLE: Final = frozenset({"42P01", "3F000"})


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


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver's error, also when SQLAlchemy wraps it (``orig``)."""
    for candidate in (exc, getattr(exc, "orig", None), exc.__cause__):
        state = getattr(candidate, "sqlstate", None)
        if isinstance(state, str):
            return state
    return None


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
