"""What a failure of PostgreSQL or of its connection means for the fan-out, and how it is said."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any, Final

import asyncpg

from ._base import (
    FanoutUnavailable,
)

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


class EngineUnreachable(ConnectionError):
    """The connection to PostgreSQL failed or was closed (the fan-out retries)."""


class NoHostAnswered(ConnectionError):
    """No host of a multi-host URL gave a usable connection; ``failures`` says why, per host."""

    def __init__(
        self, failures: list[tuple[str, BaseException]], timeout: float, tls: bool
    ) -> None:
        super().__init__(
            "; ".join(f"{host}: {describe(exc, timeout, tls)}" for host, exc in failures)
        )
        self.failures = failures


def connection_lost(exc: BaseException, conn: Any) -> bool:
    """Whether ``exc`` means the connection ``conn`` is not to be used again."""
    return (
        isinstance(exc, (*_CONNECTION_ERRORS, asyncio.CancelledError))
        or conn is None
        or conn.is_closed()
    )


def give_up_if_lost(exc: BaseException, conn: Any, drop: Callable[[], None], doing: str) -> None:
    """After ``exc`` on ``conn``: if the connection is not to be used again, ``drop()`` it and
    raise (the cancellation itself, or :class:`EngineUnreachable`, which the fan-out retries);
    otherwise return (the server refused the statement)."""
    if connection_lost(exc, conn):
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


#: SQLSTATEs of a missing table (undefined_table) and of a missing schema (invalid_schema_name).
MISSING_TABLE: Final = frozenset({"42P01", "3F000"})


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver's error, also when SQLAlchemy wraps it (``orig``)."""
    for candidate in (exc, getattr(exc, "orig", None), exc.__cause__):
        state = getattr(candidate, "sqlstate", None)
        if isinstance(state, str):
            return state
    return None


__all__ = [
    "MISSING_TABLE",
    "EngineUnreachable",
    "NoHostAnswered",
    "connection_lost",
    "describe",
    "give_up_if_lost",
    "sqlstate",
]
