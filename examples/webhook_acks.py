"""A webhook-acknowledgement service whose long polls are answered by any worker.

A client starts a job elsewhere and long-polls ``GET /jobs/{id}/wait`` until
the job's webhook arrives as ``POST /jobs/{id}/ack``. Under several worker
processes the ack usually lands in another worker than the wait: the fan-out
(Redis pub/sub or PostgreSQL LISTEN/NOTIFY, with the acks stored so nothing is
lost across reconnections)
completes the wait wherever it is parked.

Run it against a local Redis::

    redis-server --port 6379 --save '' --appendonly no &
    PURGATORY_AIO_FANOUT_URL=redis://127.0.0.1:6379/0 \\
        uvicorn examples.webhook_acks:app --workers 4 --port 8000

or against PostgreSQL (the values live in a table the first worker creates)::

    PURGATORY_AIO_FANOUT_URL=postgresql://user:password@127.0.0.1:5432/db \\
        uvicorn examples.webhook_acks:app --workers 4 --port 8000

    curl 'localhost:8000/jobs/42/wait?timeout_ms=30000' &   # parks in some worker
    curl -X POST localhost:8000/jobs/42/ack                 # any worker: the wait returns

An ack is answered ``202`` only once it is stored in Redis, and ``503`` with
``Retry-After`` when it cannot be stored in time (Redis down or frozen), so
the sender retries instead of believing a lost ack was taken.

Progress counters work the same way, for waits on a monotonic value
(``POST /counters/{name}/advance?to=N``, ``GET /counters/{name}/wait?at_least=N``):
advances are merged by max, so duplicated or reordered ones are harmless.
``GET /counters/{name}/events`` streams a counter's successive values as Server-Sent
Events, whichever worker they are advanced in (a reconnecting ``EventSource`` resumes
after its ``Last-Event-ID``). ``GET /fanout/stats`` shows this worker's fan-out counters,
and ``GET /ready`` answers 200 while it can serve its waits (503 naming what is wrong:
for a Kubernetes readiness probe).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import StreamingResponse

from purgatory_aio import Purgatory
from purgatory_aio.fanout import ENV_FANOUT_URL, Fanout, FanoutUnavailable, fanout_from_url
from purgatory_aio.integrations.fastapi import (
    OneLineStartupErrors,
    PurgatoryLifespan,
    purgatory_dependency,
    readiness_endpoint,
    value_events,
    wait_for_value,
)

JobId = Annotated[str, Path(pattern=r"^[A-Za-z0-9._-]{1,128}$")]
TimeoutMs = Annotated[int, Query(ge=0, le=300_000)]
StreamMs = Annotated[int, Query(ge=1, le=3_600_000)]
#: Seconds an ack may take to be stored before it is answered 503 (with Retry-After).
STORE_TIMEOUT = 2.0
# Module level: with postponed annotations FastAPI resolves these names from the module.
PurgatoryDep = Annotated[Purgatory, Depends(purgatory_dependency())]


def make_fanout(url: str | None = None) -> Fanout:
    """The engine ``url`` names: ``redis://...``, ``postgresql://...``, or ``memory`` for one
    process alone. Without one: ``$PURGATORY_AIO_FANOUT_URL``, else
    ``$PURGATORY_AIO_REDIS_URL``, else a Redis on localhost."""
    chosen = (
        url
        or os.environ.get(ENV_FANOUT_URL)
        or os.environ.get("PURGATORY_AIO_REDIS_URL")
        or "redis://127.0.0.1:6379/0"
    )
    return fanout_from_url("memory://" if chosen == "memory" else chosen)


def cannot_start(reason: str) -> FastAPI:
    """An app whose start-up fails with ``reason`` in one line, as an unreachable engine's.

    A malformed URL raised at import would end each uvicorn worker before it started,
    and uvicorn would start it again, and again: reported at start-up instead, each
    worker says so in one line and the server exits.
    """

    @asynccontextmanager
    async def refuse(_app: FastAPI) -> AsyncIterator[None]:
        raise FanoutUnavailable(reason)
        yield  # never reached: it makes this a generator

    app = FastAPI(title="webhook acknowledgements", lifespan=refuse)
    app.add_middleware(OneLineStartupErrors)
    return app


def make_app(fanout: Fanout | None = None) -> FastAPI:
    """The service; every worker process builds its own purgatory and fan-out."""
    purgatory = Purgatory("webhook-acks")
    try:
        fan = make_fanout() if fanout is None else fanout
    except (TypeError, ValueError) as exc:
        return cannot_start(f"the fan-out's URL is not usable: {exc}")
    app = FastAPI(
        title="webhook acknowledgements",
        lifespan=PurgatoryLifespan(purgatory, fanout=fan),
    )
    # An engine that cannot be reached at start-up: one line per worker, not a traceback.
    app.add_middleware(OneLineStartupErrors)
    pid = os.getpid()

    async def wait(request: Request, p: Purgatory, key: str, mark: float, ms: int) -> float | None:
        # Withdrawn when the client goes away, like watch_and_wait.
        return await wait_for_value(request, key, mark, ms / 1000, purgatory=p, fanout=fan)

    async def store(key: str, value: float) -> None:
        # 202 only once the event is stored in Redis: an ack answered 202 is never lost.
        try:
            await fan.advance_confirmed(key, value, timeout=STORE_TIMEOUT)
        except FanoutUnavailable as exc:
            raise HTTPException(
                status_code=503,
                detail=f"not stored, send it again: {exc}",
                headers={"Retry-After": "1"},
            ) from None

    @app.get("/jobs/{job_id}/wait")
    async def wait_for_ack(
        request: Request, job_id: JobId, p: PurgatoryDep, timeout_ms: TimeoutMs = 30_000
    ) -> dict[str, Any]:
        acked = await wait(request, p, f"job:{job_id}", 1, timeout_ms) is not None
        return {"job": job_id, "acked": acked, "worker": pid}

    @app.post("/jobs/{job_id}/ack", status_code=202)
    async def ack(job_id: JobId) -> dict[str, Any]:
        await store(f"job:{job_id}", 1)
        return {"job": job_id, "worker": pid}

    @app.get("/counters/{name}/wait")
    async def wait_for_counter(
        request: Request,
        name: JobId,
        p: PurgatoryDep,
        at_least: Annotated[float, Query(allow_inf_nan=False)],
        timeout_ms: TimeoutMs = 30_000,
    ) -> dict[str, Any]:
        value = await wait(request, p, f"counter:{name}", at_least, timeout_ms)
        return {"counter": name, "value": value, "reached": value is not None, "worker": pid}

    @app.post("/counters/{name}/advance", status_code=202)
    async def advance(
        name: JobId, to: Annotated[float, Query(allow_inf_nan=False)]
    ) -> dict[str, Any]:
        await store(f"counter:{name}", to)
        return {"counter": name, "worker": pid}

    @app.get("/counters/{name}/events")
    async def counter_events(
        request: Request, name: JobId, p: PurgatoryDep, timeout_ms: StreamMs = 300_000
    ) -> StreamingResponse:
        # Released when the client leaves; a reconnecting client resumes after its last id.
        key = f"counter:{name}"
        return await value_events(request, key, timeout=timeout_ms / 1000, purgatory=p, fanout=fan)

    @app.get("/whoami")
    async def whoami() -> dict[str, Any]:
        return {"worker": pid}

    @app.get("/fanout/stats")
    async def fanout_stats(p: PurgatoryDep) -> dict[str, Any]:
        return {"worker": pid, "pending": p.num_delayed, **fan.stats().as_dict()}

    app.add_api_route("/ready", readiness_endpoint(), include_in_schema=False)

    return app


app = make_app()
