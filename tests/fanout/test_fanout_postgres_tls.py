"""The PostgreSQL fan-out over TLS (``sslmode=verify-full``), with a CA and a server certificate
the tests make: it works when the certificate checks out, and a wrong CA, a host name the
certificate does not name, or a server without TLS is one clear line, whichever way the
fan-out was made."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from fanout_support import until
from pg_support import PostgresServer, TlsPostgresServer

from purgatory_aio import Purgatory
from purgatory_aio.fanout import Fanout, FanoutUnavailable, PostgresFanout, fanout_from_url
from purgatory_aio.fanout._postgres import LISTEN_APPLICATION, READ_APPLICATION, WRITE_APPLICATION

PATIENCE = 15.0
MAKERS: dict[str, Callable[..., Fanout]] = {
    "constructor": PostgresFanout,
    "fanout_from_url": fanout_from_url,
}


async def test_verify_full_carries_events_over_tls_on_every_connection(
    postgres_tls: TlsPostgresServer,
) -> None:
    url = postgres_tls.url_tls()
    a, b = Purgatory("a"), Purgatory("b")
    prefix = f"tls_{uuid.uuid4().hex[:8]}"
    async with (
        a,
        b,
        PostgresFanout(url, a, prefix=prefix) as fa,
        fanout_from_url(url, b, prefix=prefix) as fb,
    ):
        waiting = asyncio.create_task(fa.wait_for_value(a, "k", 1, PATIENCE))
        await until(lambda: a.num_delayed == 1 and fa.stats().reads_pending == 0)
        await fb.advance_confirmed("k", 1)
        async with asyncio.timeout(PATIENCE):
            assert await waiting == 1.0
        wanted = {LISTEN_APPLICATION, WRITE_APPLICATION, READ_APPLICATION}
        conn = await asyncpg.connect(url, timeout=10)
        try:
            async with asyncio.timeout(PATIENCE):
                while True:  # the server lists a new connection a moment after it opens
                    rows = await conn.fetch(
                        "SELECT a.application_name, s.ssl FROM pg_stat_ssl s "
                        "JOIN pg_stat_activity a USING (pid) WHERE a.application_name = ANY($1)",
                        list(wanted),
                    )
                    if {name for name, _ in rows} == wanted:
                        break
                    await asyncio.sleep(0.05)
        finally:
            conn.terminate()
    assert {name for name, _ in rows} == wanted
    assert all(encrypted for _, encrypted in rows)


@pytest.mark.parametrize("make", MAKERS)
@pytest.mark.parametrize(
    ("case", "cause"),
    [
        ("wrong CA", "TLS certificate could not be verified"),
        ("wrong host", "TLS certificate is not valid for the host in the URL"),
        ("no TLS", "does not offer TLS"),
    ],
)
async def test_a_certificate_that_does_not_check_out_is_one_clear_line(
    postgres_tls: TlsPostgresServer,
    postgres: PostgresServer,
    make: str,
    case: str,
    cause: str,
) -> None:
    url = {
        "wrong CA": postgres_tls.url_tls(ca=postgres_tls.certs.other_ca),
        # localhost is 127.0.0.1 here, but the certificate names only the address.
        "wrong host": postgres_tls.url_tls(host="localhost"),
        "no TLS": f"{postgres.url}?sslmode=verify-full&sslrootcert={postgres_tls.certs.ca}",
    }[case]
    fanout: Any = MAKERS[make](url, connect_timeout=2)
    async with asyncio.timeout(PATIENCE):
        with pytest.raises(FanoutUnavailable, match=cause) as caught:
            await fanout.start()
    message = str(caught.value)
    assert "\n" not in message and caught.value.__cause__ is None, message
    assert postgres_tls.password not in message and postgres.password not in message
    assert message.startswith("cannot use PostgreSQL at postgresql://postgres:***@")
    assert not fanout.stats().connected
