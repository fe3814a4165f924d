"""Engine URLs in messages and logs: the password never shows."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_SECRET_PARAMETERS = frozenset({"password", "sslpassword", "sentinel_password"})


def redacted(url: str) -> str:
    """``url`` with its password (in the address or as a query parameter) replaced."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "<an unparsable URL>"
    if password is None and "@" in url and "@" not in parts.netloc:
        # No //: the parser sees no address, but whatever precedes the @ may be a password.
        scheme, _, rest = url.partition(":")
        return f"{scheme}:***@{rest.rsplit('@', 1)[1]}"
    if password is not None:
        user = parts.username or ""
        parts = parts._replace(netloc=f"{user}:***@{parts.netloc.rsplit('@', 1)[1]}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(name in _SECRET_PARAMETERS for name, _ in query):
        masked = [(name, "***" if name in _SECRET_PARAMETERS else value) for name, value in query]
        parts = parts._replace(query=urlencode(masked, safe="*/:"))
    return urlunsplit(parts)
