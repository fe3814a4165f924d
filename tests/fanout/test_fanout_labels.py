"""Labels on the fan-out's waits: the event log (and so the report, which groups by purgatory
and op_type) tells one kind of wait from another, and a bad label changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from aiohttp import web
from fanout_support import HANG_GUARD, until
from fastapi import FastAPI, Request
from http_support import serve_aiohttp, serve_asgi

from purgatory_aio import Purgatory
from purgatory_aio.events import OperationEvent
from purgatory_aio.fanout import MAX_LABEL_CHARS, MAX_LABELS, MemoryFanout, ValueReached
from purgatory_aio.fanout import _value_reached as fanout_base
from purgatory_aio.integrations import route_label
from purgatory_aio.integrations.aiohttp import setup_purgatories
from purgatory_aio.integrations.aiohttp import wait_for_value as aiohttp_wait_for_value
from purgatory_aio.integrations.fastapi import PurgatoryLifespan
from purgatory_aio.integrations.fastapi import wait_for_value as fastapi_wait_for_value
from purgatory_aio.testing import ManualClock


class Records:
    """An event sink that keeps the records."""

    def __init__(self) -> None:
        self.events: list[OperationEvent] = []

    def emit(self, event: OperationEvent) -> None:
        self.events.append(event)

    def op_types(self) -> list[tuple[str, str]]:
        return [(event.op_type, event.outcome) for event in self.events]


async def test_a_labelled_wait_is_named_by_its_label_in_the_event_log() -> None:
    records, clock = Records(), ManualClock()
    acks = Purgatory("acks", clock=clock, event_sink=records)
    async with acks, MemoryFanout(None, acks) as fanout:
        status = asyncio.create_task(
            fanout.wait_for_value(acks, "order:1", 2, 30, label="/orders/{id}/status")
        )
        job = asyncio.create_task(fanout.wait_for_value(acks, "job:1", 1, 30, label="/jobs/{id}"))
        plain = asyncio.create_task(fanout.wait_for_value(acks, "job:2", 1, 30))
        await until(lambda: acks.num_delayed == 3)
        fanout.advance("order:1", 2)
        assert await status == 2.0
        await clock.advance(31)
        assert await job is None and await plain is None
    assert records.op_types() == [
        ("/orders/{id}/status", "completed"),
        ("/jobs/{id}", "expired"),
        ("ValueReached", "expired"),
    ]
    # One class per label, reused; still a ValueReached.
    labelled = ValueReached.labelled("/jobs/{id}")
    assert labelled is ValueReached.labelled("/jobs/{id}") and issubclass(labelled, ValueReached)
    assert labelled.__name__ == "ValueReached" and ValueReached.labelled(None) is ValueReached


@pytest.mark.parametrize(
    ("label", "error"),
    [
        (5, TypeError),
        (b"/jobs", TypeError),
        (["/jobs"], TypeError),
        ("", ValueError),
        ("x" * (MAX_LABEL_CHARS + 1), ValueError),
        ("/jobs\n{id}", ValueError),
        ("/jobs\x00", ValueError),
        ("/jobs\x1b[31m", ValueError),
    ],
    ids=repr,
)
async def test_a_bad_label_is_refused_and_nothing_is_watched(label: Any, error: type) -> None:
    acks = Purgatory("acks")
    async with acks, MemoryFanout(None, acks) as fanout:
        with pytest.raises(error, match="operation label must be"):
            await fanout.wait_for_value(acks, "k", 1, 30, label=label)
        assert acks.num_delayed == 0 and fanout.watched_keys() == []
        assert await asyncio.wait_for(_answered(fanout, acks), HANG_GUARD) == 1.0


async def _answered(fanout: MemoryFanout, acks: Purgatory) -> float | None:
    """The fan-out still serves waits."""
    wait = asyncio.create_task(fanout.wait_for_value(acks, "k", 1, 30, label="ok"))
    await until(lambda: acks.num_delayed == 1)
    fanout.advance("k", 1)
    return await wait


def test_labels_name_kinds_of_waits_not_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_LABELS distinct labels, a new one is refused (the known ones still work)."""
    assert MAX_LABELS == 1000
    monkeypatch.setattr(ValueReached, "_labelled", {})
    monkeypatch.setattr(fanout_base, "MAX_LABELS", 3)
    made = [ValueReached.labelled(f"/route/{n}") for n in range(3)]
    with pytest.raises(ValueError, match="not one request"):
        ValueReached.labelled("/orders/12345/status")
    assert ValueReached.labelled("/route/1") is made[1]


def routes() -> list[tuple[str, str]]:
    return [("/orders/{order}/status", "/orders/1/status"), ("/jobs/{job}/wait", "/jobs/1/wait")]


async def answer_each_route(records: Records, fanout: MemoryFanout, base: str) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=HANG_GUARD) as client:
        for n, (_, path) in enumerate(routes()):
            poll = asyncio.ensure_future(client.get(path))
            await until(lambda path=path: fanout.watched_keys() == [path])  # type: ignore[misc]
            fanout.advance(path, 1)
            assert (await poll).json() == 1.0
            await until(lambda n=n: len(records.events) == n + 1)  # type: ignore[misc]
    assert records.op_types() == [(template, "completed") for template, _ in routes()]


async def test_a_wait_in_a_fastapi_handler_is_labelled_with_its_route_template() -> None:
    records = Records()
    purgatory, fanout = Purgatory("acks", event_sink=records), MemoryFanout()
    app = FastAPI(lifespan=PurgatoryLifespan(purgatory, fanout=fanout))
    for template, _ in routes():

        async def wait(request: Request) -> float | None:
            return await fastapi_wait_for_value(request, request.url.path, 1, 30)

        app.get(template)(wait)
    async with serve_asgi(app) as served:
        await answer_each_route(records, fanout, served.url)


async def test_a_wait_in_an_aiohttp_handler_is_labelled_with_its_route_template() -> None:
    records = Records()
    purgatory, fanout = Purgatory("acks", event_sink=records), MemoryFanout()
    app = web.Application()
    setup_purgatories(app, purgatory, fanout=fanout)

    async def wait(request: web.Request) -> web.Response:
        return web.json_response(await aiohttp_wait_for_value(request, request.path, 1, 30))

    for template, _ in routes():
        app.router.add_get(template, wait)
    async with serve_aiohttp(app) as served:
        await answer_each_route(records, fanout, served.url)


def test_a_route_template_that_cannot_be_a_label_leaves_the_wait_unlabelled() -> None:
    """The default label is the application's route, not its choice: it never fails a
    request; the wait is then named by its class."""
    assert route_label("/orders/{id}/status") == "/orders/{id}/status"
    for template in (None, "", "/" + "x" * MAX_LABEL_CHARS, "/a\tb", 7):
        assert route_label(template) is None


async def test_a_wait_on_a_route_too_long_to_be_a_label_still_answers() -> None:
    records = Records()
    purgatory, fanout = Purgatory("acks", event_sink=records), MemoryFanout()
    app = FastAPI(lifespan=PurgatoryLifespan(purgatory, fanout=fanout))
    long_route = "/" + "x" * MAX_LABEL_CHARS + "/{job}"

    @app.get(long_route)
    async def wait(request: Request, job: str) -> float | None:
        return await fastapi_wait_for_value(request, job, 1, 30)

    async with (
        serve_asgi(app) as served,
        httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD) as client,
    ):
        poll = asyncio.ensure_future(client.get(long_route.replace("{job}", "j")))
        await until(lambda: fanout.watched_keys() == ["j"])
        fanout.advance("j", 1)
        assert (await poll).json() == 1.0
        await until(lambda: len(records.events) == 1)
    assert records.op_types() == [("ValueReached", "completed")]
