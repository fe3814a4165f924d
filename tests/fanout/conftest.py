from __future__ import annotations

from collections.abc import Iterator

import pytest
from fanout_support import RedisServer
from pg_support import PostgresServer


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server per test (the outage tests kill it)."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (initdb costs seconds); use ``postgres``."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres(postgres_cluster: PostgresServer) -> PostgresServer:
    """The session's PostgreSQL, running (a test before may have frozen or killed it)."""
    postgres_cluster.ensure_running()
    return postgres_cluster
