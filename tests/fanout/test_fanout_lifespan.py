"""A FastAPI lifespan run twice (two TestClient blocks on one application, as a test suite
does): the second start works or fails clearly; it never hands out a member that does not
connect and whose every wait times out."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from pg_support import PostgresServer, fresh

from purgatory_aio import Purgatory, PurgatoryClosed
from purgatory_aio.fanout import PostgresFanout
from purgatory_aio.integrations.fastapi import PurgatoryLifespan, wait_for_value


def app_on(purgatory: Purgatory, fanout: PostgresFanout) -> FastAPI:
    app = FastAPI(lifespan=PurgatoryLifespan(purgatory, fanout=fanout))

    @app.post("/jobs/{job}/ack")
    async def ack(request: Request, job: str) -> None:
        await request.app.state.fanout.advance_confirmed(job, 1)

    @app.get("/jobs/{job}/wait")
    async def wait(request: Request, job: str) -> float | None:
        return await wait_for_value(request, job, 1, 5)

    return app


def test_one_app_whose_lifespan_runs_twice_fails_the_second_start_clearly(
    postgres: PostgresServer,
) -> None:
    fanout = PostgresFanout(postgres.url, prefix=fresh("lifespan"))
    app = app_on(Purgatory("acks"), fanout)
    with TestClient(app) as client:
        assert client.post("/jobs/1/ack").status_code == 200
        assert client.get("/jobs/1/wait").json() == 1.0
    # The purgatory was shut down with the first lifespan: the second start says so.
    with pytest.raises(PurgatoryClosed, match="shut down"), TestClient(app):
        pass
    assert not fanout.stats().connected


def test_a_fanout_shared_by_two_lifespans_refuses_the_second(postgres: PostgresServer) -> None:
    """Fresh purgatories, the same member: the second start raises the fan-out's own error
    (a stopped fan-out cannot be started again) instead of serving waits that never end."""
    fanout = PostgresFanout(postgres.url, prefix=fresh("lifespan"))
    with TestClient(app_on(Purgatory("first"), fanout)) as client:
        assert client.post("/jobs/1/ack").status_code == 200
    second = Purgatory("second")
    with (
        pytest.raises(RuntimeError, match="stopped fan-out cannot be started again"),
        TestClient(app_on(second, fanout)),
    ):
        pass
    assert not fanout.stats().connected


def test_an_app_that_builds_its_member_per_lifespan_works_twice(postgres: PostgresServer) -> None:
    prefix = fresh("lifespan")
    for round_ in range(2):
        fanout = PostgresFanout(postgres.url, prefix=prefix)
        with TestClient(app_on(Purgatory("acks"), fanout)) as client:
            assert client.post(f"/jobs/{round_}/ack").status_code == 200
            assert client.get(f"/jobs/{round_}/wait").json() == 1.0
            assert fanout.stats().connected
