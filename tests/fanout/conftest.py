from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypeVar

import pytest
import structlog
from cluster_support import Cluster
from engines import (
    ENGINES,
    Engine,
    cluster_engine,
    memory_engine,
    postgres_engine,
    redis_engine,
    sentinel_engine,
    standby_engine,
)
from fanout_support import RedisServer
from pg_support import PostgresServer, ReplicatedPair, TlsPostgresServer
from sentinel_support import Sentinels


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


@pytest.fixture(scope="session")
def replicated_pair() -> Iterator[ReplicatedPair]:
    """A PostgreSQL primary with a streaming standby, made once per session; use ``replicated``."""
    with ReplicatedPair() as pair:
        yield pair


@pytest.fixture
def replicated(replicated_pair: ReplicatedPair) -> ReplicatedPair:
    """The session's primary and standby, both running and streaming (asynchronously): a test
    before may have failed the primary over, and its corpse is made the new standby."""
    replicated_pair.ensure(sync=False)
    return replicated_pair


@pytest.fixture(scope="session")
def postgres_tls() -> Iterator[TlsPostgresServer]:
    """A PostgreSQL server with TLS on, its certificates made by the tests (openssl)."""
    with TlsPostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def redis_shared() -> Iterator[RedisServer]:
    """One redis-server for the tests that do not stop it (each under a prefix of its own)."""
    with RedisServer() as server:
        yield server


Topology = TypeVar("Topology", Sentinels, Cluster)


def _running(topology: Topology) -> Iterator[Topology]:
    """A topology started, and stopped (each process by its PID) whatever happens."""
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()


@pytest.fixture(scope="session")
def sentinel_topology() -> Iterator[Sentinels]:
    """One master, one replica and three sentinels for the session; use ``sentinels``."""
    yield from _running(Sentinels())


@pytest.fixture
def sentinels(sentinel_topology: Sentinels) -> Sentinels:
    """The session's Sentinel topology, settled (a test before may have failed it over,
    killed or frozen a node)."""
    sentinel_topology.wait_healthy()
    return sentinel_topology


@pytest.fixture(scope="session")
def cluster_topology() -> Iterator[Cluster]:
    """Three masters with a replica each, for the session; use ``cluster``."""
    yield from _running(Cluster())


@pytest.fixture
def cluster(cluster_topology: Cluster) -> Cluster:
    """The session's Redis Cluster, settled (a test before may have killed a master)."""
    cluster_topology.wait_healthy()
    return cluster_topology


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> Engine:
    """Each engine in turn; its server (or topology) is started on first use and shared by
    the session, and settled before each test (a test before may have failed it over)."""
    if request.param == "redis-sentinel":
        return sentinel_engine(request.getfixturevalue("sentinels"))
    if request.param == "redis-cluster":
        return cluster_engine(request.getfixturevalue("cluster"))
    if request.param == "postgres-standby":
        return standby_engine(request.getfixturevalue("replicated"))
    if request.param == "redis":
        return redis_engine(request.getfixturevalue("redis_shared"))
    if request.param == "postgres":
        return postgres_engine(request.getfixturevalue("postgres"))
    return memory_engine()


@pytest.fixture
def warnings_logged(restore_structlog: None) -> structlog.testing.LogCapture:
    """The library's warnings and errors, captured (structlog's configuration restored after)."""
    captured = structlog.testing.LogCapture()
    structlog.configure(
        processors=[captured], wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING)
    )
    return captured


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What the running loop's exception handler receives ("never retrieved" and friends)."""
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    yield seen
    loop.set_exception_handler(previous)
