from __future__ import annotations

from collections.abc import Iterator

import pytest
from fanout_support import RedisServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server per test (the outage tests kill it)."""
    with RedisServer() as server:
        yield server
