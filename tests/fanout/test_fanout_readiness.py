"""Readiness follows the engine itself: a real redis-server killed makes the process not
ready, naming the engine; restarted, it is ready again. PostgreSQL the same."""

from __future__ import annotations

from collections.abc import Callable

from engines import Engine, postgres_engine, redis_engine
from fanout_support import RedisServer, until
from pg_support import PostgresServer

from purgatory_aio import Purgatory
from purgatory_aio.integrations import readiness

NOT_CONNECTED = "the fan-out's engine is not connected"


async def ready_through_an_outage(
    engine: Engine, kill: Callable[[], object], start: Callable[[], object]
) -> None:
    purgatory = Purgatory("acks")
    async with purgatory, engine.make(purgatory) as fanout:
        assert readiness([purgatory], fanout).ready
        kill()
        fanout.advance("job", 1)  # the publisher finds the engine gone, if the subscriber has not
        await until(lambda: not readiness([purgatory], fanout).ready)
        found = readiness([purgatory], fanout)
        assert found.status == 503 and NOT_CONNECTED in found.problems
        assert found.fanout is not None and found.fanout["connected"] is False
        start()
        await until(lambda: readiness([purgatory], fanout).ready)


async def test_readiness_follows_a_redis_killed_and_restarted(redis_server: RedisServer) -> None:
    await ready_through_an_outage(redis_engine(redis_server), redis_server.kill, redis_server.start)


async def test_readiness_follows_postgres_killed_and_restarted(postgres: PostgresServer) -> None:
    await ready_through_an_outage(postgres_engine(postgres), postgres.kill, postgres.start)
