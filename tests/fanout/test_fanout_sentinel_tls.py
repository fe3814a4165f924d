"""Redis behind Sentinel over TLS (``rediss+sentinel://``): the master, its replica and the
three sentinels take TLS only, with certificates the tests made; the fan-out asks the
sentinels and reaches the master over TLS, follows a failover, and a CA that did not sign
their certificates is one clear line."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fanout_support import assert_unavailable, until
from sentinel_support import Sentinels, Tls
from tls_support import make_ca, make_certificate

from purgatory_aio import Purgatory
from purgatory_aio.fanout import RedisFanout

PATIENCE = 30.0


@pytest.fixture(scope="module")
def tls_sentinels() -> Iterator[tuple[Sentinels, Path]]:
    """The topology (its certificate names 127.0.0.1 alone), and a CA that signed none of
    its certificates."""
    with tempfile.TemporaryDirectory(prefix="purgatory-tls-") as where:
        folder = Path(where)
        ca = make_ca(folder, "ca")
        other_ca, _ = make_ca(folder, "other-ca")
        cert, key = make_certificate(folder, "redis", ca, ["IP:127.0.0.1"])
        topology = Sentinels(Tls(ca[0], cert, key))
        try:
            topology.start()
            yield topology, other_ca
        finally:
            topology.stop()


@pytest.fixture
async def settled(tls_sentinels: tuple[Sentinels, Path]) -> AsyncIterator[Sentinels]:
    topology = tls_sentinels[0]
    await asyncio.to_thread(topology.wait_healthy)
    yield topology


async def test_a_wait_completes_across_members_and_through_a_failover(settled: Sentinels) -> None:
    a, b = Purgatory("a"), Purgatory("b")
    prefix = f"s{uuid.uuid4().hex[:10]}"
    fa = RedisFanout(settled.url, a, prefix=prefix, connect_timeout=1.0)
    fb = RedisFanout(settled.url, b, prefix=prefix, connect_timeout=1.0)
    async with a, b, fa, fb:
        first = asyncio.create_task(fa.wait_for_value(a, "job:before", 1, 60))
        later = asyncio.create_task(fa.wait_for_value(a, "job:after", 1, 60))
        await until(lambda: a.num_delayed == 2)
        await fb.advance_confirmed("job:before", 1, timeout=5)
        async with asyncio.timeout(PATIENCE):
            assert await first == 1.0
        old = await asyncio.to_thread(settled.master)
        new = await asyncio.to_thread(settled.failover)
        assert new is not old
        # Both members follow the new master over TLS: the subscription and the store.
        await until(lambda: fa.stats().failovers >= 1, "the subscription moved")
        await fb.advance_confirmed("job:after", 1, timeout=PATIENCE)
        async with asyncio.timeout(PATIENCE):
            assert await later == 1.0
        raw = await asyncio.to_thread(settled.command, new.port, "GET", f"{prefix}:value:job:after")
        assert float(raw) == 1.0
        assert a.stats().completed == 2 and a.num_delayed == 0


@pytest.mark.parametrize(
    ("host", "other_ca", "says"),
    [
        ("127.0.0.1", True, "its TLS certificate is not trusted"),
        ("localhost", False, "its TLS certificate does not name the host in the URL"),
    ],
)
async def test_a_wrong_certificate_on_the_sentinels_is_one_clear_line(
    tls_sentinels: tuple[Sentinels, Path], host: str, other_ca: bool, says: str
) -> None:
    topology, wrong_ca = tls_sentinels
    assert topology.tls is not None
    url = topology.url.replace("127.0.0.1", host)
    if other_ca:
        url = url.replace(str(topology.tls.ca), str(wrong_ca))
    await assert_unavailable(url, says, connect_timeout=1.0)
