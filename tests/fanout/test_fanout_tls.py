"""The Redis backend over TLS (rediss://) against a redis-server with a certificate the tests
made: delivery, and one clear line for a wrong CA, a wrong host name, a wrong port."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fanout_support import RedisServer, assert_unavailable, until
from tls_support import make_ca, make_certificate

from purgatory_aio import Purgatory
from purgatory_aio.fanout import FanoutUnavailable, RedisFanout


@dataclass
class TlsRedis:
    server: RedisServer
    ca: Path  # the CA that signed the server's certificate
    other_ca: Path  # a CA that did not

    def url(self, host: str = "localhost", ca: Path | None = None) -> str:
        return f"rediss://{host}:{self.server.port}/0?ssl_ca_certs={ca or self.ca}"


@pytest.fixture(scope="module")
def tls_redis() -> Iterator[TlsRedis]:
    """A redis-server taking TLS only, with a certificate for the name ``localhost`` alone."""
    with tempfile.TemporaryDirectory(prefix="purgatory-tls-") as where:
        folder = Path(where)
        ca = make_ca(folder, "ca")
        other_ca, _ = make_ca(folder, "other-ca")
        cert, key = make_certificate(folder, "redis", ca, ["DNS:localhost"])
        server = RedisServer()
        server.args = [
            "--tls-port", str(server.port), "--port", "0",
            "--tls-cert-file", str(cert), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(ca[0]), "--tls-auth-clients", "no",
        ]  # fmt: skip
        with server:
            yield TlsRedis(server, ca[0], other_ca)


async def test_two_processes_over_tls(tls_redis: TlsRedis) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    url, prefix = tls_redis.url(), f"t{uuid.uuid4().hex[:10]}"  # each loop's run its own keys
    async with (
        a,
        b,
        RedisFanout(url, a, prefix=prefix) as fa,
        RedisFanout(url, b, prefix=prefix) as fb,
    ):
        waiting = asyncio.create_task(fa.wait_for_value(a, "job:tls", 1, 30))
        await until(lambda: a.num_delayed == 1)
        await fb.advance_confirmed("job:tls", 1, timeout=5)
        async with asyncio.timeout(10):
            assert await waiting == 1.0


@pytest.mark.parametrize(
    ("host", "other_ca", "says"),
    [
        ("127.0.0.1", False, "its TLS certificate does not name the host in the URL"),
        ("localhost", True, "its TLS certificate is not trusted"),
    ],
)
async def test_a_wrong_certificate_is_one_clear_line(
    tls_redis: TlsRedis, host: str, other_ca: bool, says: str
) -> None:
    url = tls_redis.url(host, tls_redis.other_ca if other_ca else None)
    await assert_unavailable(url, says, connect_timeout=1.0)


async def test_plain_redis_to_a_tls_port_is_one_clear_line(tls_redis: TlsRedis) -> None:
    fanout = RedisFanout(f"redis://localhost:{tls_redis.server.port}/0", connect_timeout=1.0)
    with pytest.raises(FanoutUnavailable, match=r"takes TLS only\? rediss://"):
        await fanout.start()
    await fanout.stop()


async def test_tls_to_a_plain_port_is_one_clear_line(
    tls_redis: TlsRedis, redis_shared: RedisServer
) -> None:
    url = f"rediss://localhost:{redis_shared.port}/0?ssl_ca_certs={tls_redis.ca}"
    fanout = RedisFanout(url, connect_timeout=0.3)
    with pytest.raises(FanoutUnavailable, match=r"a server without TLS\? redis://"):
        await fanout.start()
    await fanout.stop()
