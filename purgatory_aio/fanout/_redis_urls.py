"""The Redis fan-out's URLs: one server, the sentinels of a service, the nodes of a Cluster;
their checks, and the words for a failure to reach what they name."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from redis.exceptions import (
    AuthenticationError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ._urls import redacted

#: The environment variable read when no URL is given.
ENV_URL = "PURGATORY_AIO_REDIS_URL"
"""The environment variable ``RedisFanout(None)`` reads its Redis URL from."""

# What OpenSSL says when the other end does not speak TLS.
_TLS_MISMATCH: Final = ("wrong version number", "record layer failure", "packet length too long")


def _password(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:
        return None


#: The schemes of a URL naming the sentinels of a service rather than a server.
SENTINEL_SCHEMES: Final = ("redis+sentinel", "rediss+sentinel")
_SENTINEL_PORT: Final = 26379
_TLS_OPTIONS: Final = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
_CERT_REQS: Final = ("required", "optional", "none")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """What a ``redis+sentinel://`` URL names: the sentinels, the service, and the options
    of the connections to the master (``master``) and to the sentinels (``sentinel``)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    master: dict[str, Any] = field(default_factory=dict)
    sentinel: dict[str, Any] = field(default_factory=dict)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Read ``redis+sentinel://[user:password@]host:port[,host:port...]/service[?db=N]``
    (``rediss+sentinel://`` for TLS to the master and the sentinels), or raise a
    ``ValueError`` naming what is wrong.

    The password in the address is the master's; ``sentinel_username`` and
    ``sentinel_password`` in the query are the sentinels' own. Over TLS the query may
    also hold ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``
    (required, optional, none) and ``ssl_check_hostname`` (true, false).
    """
    shown = redacted(url)
    scheme, parts, sentinels = _servers(
        url, SENTINEL_SCHEMES, "Sentinel", "sentinel", _SENTINEL_PORT, "/service[?db=0]"
    )
    form = f"{scheme}://[:password@]host:port[,host:port...]/service[?db=0]"
    service = unquote(parts.path[1:])
    if not service or "/" in service:
        raise ValueError(
            f"Sentinel URL {shown!r} must name one service after the sentinels: expected {form}"
        )
    tls = scheme == "rediss+sentinel"
    allowed = ["db", "sentinel_username", "sentinel_password"]
    if tls:
        allowed += [*_TLS_OPTIONS, "ssl_check_hostname"]
    master: dict[str, Any] = {}
    sentinel: dict[str, Any] = {}
    shared: dict[str, Any] = {"ssl": True} if tls else {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name not in allowed:
            extra = "" if tls else " (the ssl_* options need rediss+sentinel://)"
            raise ValueError(
                f"Sentinel URL {shown!r} has an unknown option {name!r}: expected "
                f"{', '.join(allowed)}{extra}"
            )
        if name == "db":
            if not value.isdigit():
                raise ValueError(
                    f"Sentinel URL {shown!r} has an invalid database {value!r}: "
                    "expected a number (?db=0)"
                )
            master["db"] = int(value)
        elif name.startswith("sentinel_"):
            sentinel[name.removeprefix("sentinel_")] = value
        else:
            shared[name] = _tls_option(name, value, f"Sentinel URL {shown!r}")
    _check_files(parse_qsl(parts.query), shown)
    if parts.username:
        master["username"] = unquote(parts.username)
    if parts.password:
        master["password"] = unquote(parts.password)
    return SentinelTarget(sentinels, service, {**master, **shared}, {**sentinel, **shared})


def _tls_option(name: str, value: str, where: str) -> object:
    """The value of one ``ssl_*`` option of a URL's query, checked."""
    if name == "ssl_check_hostname":
        if value.lower() not in (*_TRUE, *_FALSE):
            raise ValueError(f"{where}: ssl_check_hostname must be true or false, got {value!r}")
        return value.lower() in _TRUE
    if name == "ssl_cert_reqs" and value.lower() not in _CERT_REQS:
        raise ValueError(
            f"{where}: ssl_cert_reqs must be one of {', '.join(_CERT_REQS)}, got {value!r}"
        )
    return value


def _servers(
    url: str, schemes: tuple[str, ...], kind: str, what: str, default_port: int, rest: str
) -> tuple[str, SplitResult, tuple[tuple[str, int], ...]]:
    """The scheme, the parts and the ``host:port`` list of a URL naming several servers
    (``kind`` Sentinel or Cluster, each server a ``what``), checked."""
    shown = redacted(url)
    scheme, separator, _ = url.partition("://")
    scheme = scheme.lower()
    form = f"{schemes[0]}://host:port[,host:port...]{rest}"
    if scheme not in schemes or not separator:
        raise ValueError(f"not a {kind} URL: {shown!r}: expected {form}")
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    if not hosts:
        raise ValueError(f"{kind} URL {shown!r} names no {what}: expected {form}")
    where = f"{kind} URL {shown!r}"
    return (
        scheme,
        parts,
        tuple(_address(item, where, what, default_port) for item in hosts.split(",")),
    )


def _address(item: str, where: str, what: str, default_port: int) -> tuple[str, int]:
    """One ``host[:port]`` of a URL naming several servers."""
    bad_port = f"{where} has an invalid port in {item!r}: expected a number from 1 to 65535"
    try:
        parts = urlsplit(f"//{item}")
        port = parts.port
    except ValueError:
        raise ValueError(bad_port) from None
    if not parts.hostname:
        raise ValueError(
            f"{where} has an empty {what} address in {item!r}: "
            "expected host:port, separated by commas"
        )
    if port == 0:
        raise ValueError(bad_port)
    return parts.hostname, default_port if port is None else port


#: The schemes of a URL naming some nodes of a Redis Cluster.
CLUSTER_SCHEMES: Final = ("redis+cluster", "rediss+cluster")
_REDIS_PORT: Final = 6379


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """What a ``redis+cluster://`` URL names: some nodes of the cluster (the others are
    found through them) and the options of every connection."""

    nodes: tuple[tuple[str, int], ...]
    options: dict[str, Any] = field(default_factory=dict)


def parse_cluster_url(url: str) -> ClusterTarget:
    """Read ``redis+cluster://[user:password@]host:port[,host:port...][/]`` (``rediss+cluster://``
    for TLS, whose query may hold ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
    ``ssl_cert_reqs`` and ``ssl_check_hostname``), or raise a ``ValueError`` naming what is
    wrong. A cluster has one database: the URL names none."""
    shown = redacted(url)
    where = f"Cluster URL {shown!r}"
    scheme, parts, nodes = _servers(url, CLUSTER_SCHEMES, "Cluster", "node", _REDIS_PORT, "")
    if parts.path.strip("/"):
        raise ValueError(
            f"{where} names a database ({parts.path.strip('/')!r}): a Redis Cluster has only "
            "database 0, so the URL ends after the nodes"
        )
    tls = scheme == "rediss+cluster"
    options: dict[str, Any] = {"ssl": True} if tls else {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if not tls or name not in (*_TLS_OPTIONS, "ssl_check_hostname"):
            expected = ", ".join((*_TLS_OPTIONS, "ssl_check_hostname")) if tls else "none"
            extra = "" if tls else " (the ssl_* options need rediss+cluster://)"
            raise ValueError(f"{where} has an unknown option {name!r}: expected {expected}{extra}")
        options[name] = _tls_option(name, value, where)
    _check_files(parse_qsl(parts.query), shown)
    if parts.username:
        options["username"] = unquote(parts.username)
    if parts.password:
        options["password"] = unquote(parts.password)
    return ClusterTarget(nodes, options)


def resolve_url(url: str | None) -> str:
    """The URL to use: ``url``, else ``$PURGATORY_AIO_REDIS_URL``, checked before any
    connection: a clear ``ValueError`` naming what is wrong."""
    chosen = url if url is not None else os.environ.get(ENV_URL)
    if not chosen:
        raise ValueError(f"no Redis URL: pass url='redis://host:6379/0' or set ${ENV_URL}")
    if not isinstance(chosen, str):
        raise TypeError(f"the Redis URL must be a str, got {chosen!r}")
    check_url(chosen)
    return chosen


def check_url(url: str) -> None:
    """Refuse a Redis URL whose scheme, host, port or database is wrong (redis-py would
    quietly use localhost:6379 for a missing host)."""
    shown = redacted(url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url)
        return
    if scheme in CLUSTER_SCHEMES:
        parse_cluster_url(url)
        return
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            f"not a Redis URL: {shown!r}: the scheme must be redis://, rediss://, unix://, "
            "redis+sentinel://, rediss+sentinel://, redis+cluster:// or rediss+cluster://"
        )
    if scheme == "unix":
        if not parts.path:
            raise ValueError(f"Redis URL {shown!r} names no socket path (unix:///path/redis.sock)")
        return
    if not url.lower().startswith(f"{scheme}://"):
        raise ValueError(
            f"Redis URL {shown!r} is malformed: expected {scheme}://host:port/db "
            f"(two slashes after '{scheme}:')"
        )
    if not parts.hostname:
        raise ValueError(f"Redis URL {shown!r} names no host: expected {scheme}://host:port/db")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(
            f"Redis URL {shown!r} has an invalid port: expected a number from 1 to 65535"
        ) from None
    if port == 0:
        raise ValueError(
            f"Redis URL {shown!r} has an invalid port: expected a number from 1 to 65535"
        )
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise ValueError(
            f"Redis URL {shown!r} has an invalid database {db!r}: expected a number (/0)"
        )
    _check_files(parse_qsl(parts.query), shown)


def _check_files(query: list[tuple[str, str]], shown: str) -> None:
    """The certificate and key files a URL names exist (else the error would come at the
    first connection, as an OS error number)."""
    for name, value in query:
        if name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile") and not os.path.isfile(value):
            raise ValueError(f"Redis URL {shown!r}: {name}={value!r} is not a file")


def in_words(exc: BaseException, url: str, where: str | None = None) -> str:
    """Why a connection to Redis failed, in the user's words, on one line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = text.lower()
    where = where or f"Redis at {redacted(url)}"
    signs = ("noauth", "wrongpass", "authentication", "password", "auth ")
    if isinstance(exc, AuthenticationError) or any(sign in lowered for sign in signs):
        if _password(url) is None:
            return (
                f"{where} requires a password: put it in the URL "
                "(redis://:password@host:port/0, or redis://user:password@...)"
            )
        return f"{where} refused the user name or password in the URL"
    if "certificate verify failed" in lowered:
        reason = text.partition("certificate verify failed:")[2].partition("(_ssl")[0].strip(" .")
        if "mismatch" in lowered or "not valid for" in lowered:
            return f"{where}: its TLS certificate does not name the host in the URL ({reason})"
        return (
            f"{where}: its TLS certificate is not trusted ({reason}): name the CA that signed "
            "it with ?ssl_ca_certs=/path/ca.pem"
        )
    if any(sign in lowered for sign in _TLS_MISMATCH):
        return f"{where}: the TLS handshake failed ({text}): does that port speak TLS?"
    if "protocol error" in lowered or type(exc).__name__ == "InvalidResponse":
        return (
            f"{where} did not answer in the Redis protocol: is another service (HTTP?) "
            "listening on that port?"
        )
    if any(sign in lowered for sign in ("connection refused", "connect call failed", "error 111")):
        return f"cannot reach {where}: connection refused (is redis-server running there?)"
    if isinstance(exc, RedisTimeoutError | TimeoutError):
        # A TLS greeting sent to a server without TLS gets no answer at all.
        tls = " (a server without TLS? redis://)" if url.lower().startswith("rediss") else ""
        return f"cannot reach {where}: no answer in time{tls}"
    if "closed by server" in lowered or "connection reset" in lowered:
        tls = "" if url.lower().startswith("rediss") else " (one that takes TLS only? rediss://)"
        return f"{where} closed the connection at once: is it a Redis server{tls}?"
    if isinstance(exc, RedisConnectionError | OSError):
        return f"cannot reach {where}: {text}"
    return f"cannot use {where}: {text}"


__all__ = [
    "CLUSTER_SCHEMES",
    "ENV_URL",
    "SENTINEL_SCHEMES",
    "ClusterTarget",
    "SentinelTarget",
    "check_url",
    "in_words",
    "parse_cluster_url",
    "parse_sentinel_url",
    "resolve_url",
]
