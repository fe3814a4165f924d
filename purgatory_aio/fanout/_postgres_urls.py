"""The PostgreSQL fan-out's URLs: their schemes, hosts and options, and the settings taken
from them."""

from __future__ import annotations

import os
from typing import Final
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from ._urls import redacted

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
TLS_REQUIRED: Final = ("require", "verify-ca", "verify-full")


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
    """The ``(host, port)`` pairs ``url`` names, in order: in its address (``h1:p1,h2:p2``)
    or, as libpq also reads them, in its query (``?host=h1,h2&port=p1,p2``, one port for
    every host or one each); empty when it names none, or a socket directory."""
    shown = redacted(url)
    parts = urlsplit(url)
    hostspec = parts.netloc.rpartition("@")[2]
    query = parse_qsl(parts.query, keep_blank_values=True)
    named = [value for name, value in query if name == "host"]
    ported = [value for name, value in query if name == "port"]
    if len(named) > 1 or len(ported) > 1:
        raise ValueError(f"the PostgreSQL URL {shown!r} gives host= or port= twice")
    if hostspec and named:
        raise ValueError(
            f"the PostgreSQL URL {shown!r} names hosts both in its address and in host=: "
            "name them in one place"
        )
    if hostspec:
        return [_address_item(item, hostspec, shown) for item in hostspec.split(",")]
    if not named or named[0].startswith("/"):
        return []  # asyncpg's default host, or a socket directory
    names = named[0].split(",")
    ports = ported[0].split(",") if ported else []
    if len(ports) > 1 and len(ports) != len(names):
        raise ValueError(
            f"the PostgreSQL URL {shown!r} names {len(names)} hosts in host= but {len(ports)} "
            "ports in port=: give one port for every host, or one each"
        )
    hosts: list[tuple[str, int | None]] = []
    for i, name in enumerate(names):
        if not name:
            raise ValueError(f"the PostgreSQL URL {shown!r} has an empty host in {named[0]!r}")
        port = ports[0] if len(ports) == 1 else ports[i] if ports else ""
        hosts.append((name, _port(port, name, shown)))
    return hosts


def _address_item(item: str, hostspec: str, shown: str) -> tuple[str, int | None]:
    """One ``host[:port]`` of a URL's address (``[::1]:5432`` for IPv6)."""
    if item.startswith("["):  # an IPv6 address: [::1]:5432
        host, _, rest = item[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise ValueError(f"the PostgreSQL URL {shown!r} has an empty host in {hostspec!r}")
    return unquote(host), _port(port_text, host, shown)


def _port(text: str, host: str, shown: str) -> int | None:
    """The port of ``host`` as the URL spells it (None: none given), checked."""
    if not text:
        return None
    if not text.isdigit() or int(text) > 65535:
        raise ValueError(
            f"not a usable PostgreSQL URL: {shown!r} (port {text!r} of {host} is "
            "not a number from 1 to 65535)"
        )
    if int(text) == 0:
        raise ValueError(f"the PostgreSQL URL {shown!r} has port 0: expected 1 to 65535")
    return int(text)


def session_target(url: str, hosts: int) -> str | None:
    """The ``target_session_attrs`` to connect with: the URL's, else ``read-write`` when it
    names several hosts (a standby takes neither writes nor LISTEN), else asyncpg's default."""
    chosen = dict(parse_qsl(urlsplit(url).query)).get("target_session_attrs")
    return chosen or ("read-write" if hosts > 1 else None)


def merge_option(name: str, given: object, from_url: str | None, default: object) -> object:
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


__all__ = [
    "DDL_COMMAND",
    "ENV_URL",
    "MAX_KEY_BYTES",
    "SCHEMES",
    "TLS_REQUIRED",
    "URL_OPTIONS",
    "merge_option",
    "resolve_url",
    "session_target",
    "url_hosts",
    "url_options",
]
