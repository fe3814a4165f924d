"""The mini broker over HTTP (examples/), served by FastAPI and by aiohttp on loopback."""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from http_support import HANG_GUARD, Served, serve_aiohttp, serve_asgi, wait_until
from minikafka.records import TopicPartition

from examples import aiohttp_broker, fastapi_broker
from examples.http_broker_common import HttpBroker, Settings, SettingsError

RECORDS = "/topics/t/partitions/0/records"
TP = TopicPartition("t", 0)
#: A single replica: the fetch purgatory then holds consumer polls only.
SOLO = Settings(partitions=1, replication_factor=1, brokers=1, topics=("t",))
#: Three replicas that stay in the ISR however long a test stalls them.
TRIO = Settings(partitions=1, replication_factor=3, replica_lag_time_max=3600.0, topics=("t",))


@pytest.fixture(params=["fastapi", "aiohttp"])
def server_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def broker_server(kind: str, settings: Settings) -> AsyncIterator[tuple[Served, HttpBroker]]:
    if kind == "fastapi":
        app = fastapi_broker.make_app(settings)
        async with serve_asgi(app) as served:
            yield served, app.state.broker
    else:
        aio_app = aiohttp_broker.make_app(settings)
        async with serve_aiohttp(aio_app) as served:
            yield served, aio_app[aiohttp_broker.BROKER]


def client(served: Served) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=served.url, timeout=HANG_GUARD)


def produce(http: httpx.AsyncClient, *values: str, **params: Any) -> asyncio.Future[httpx.Response]:
    body = {"records": [{"key": None, "value": v} for v in values]}
    return asyncio.ensure_future(http.post(RECORDS, params=params, json=body))


def poll(http: httpx.AsyncClient, **params: Any) -> asyncio.Future[httpx.Response]:
    return asyncio.ensure_future(http.get(RECORDS, params=params))


def stall_followers(broker: HttpBroker) -> None:
    for follower in (1, 2):
        fetcher = broker.cluster.fetcher(follower, 0)
        assert fetcher is not None
        fetcher.stall()


def resume_followers(broker: HttpBroker) -> None:
    for follower in (1, 2):
        fetcher = broker.cluster.fetcher(follower, 0)
        assert fetcher is not None
        fetcher.resume()


# -- long polls ----------------------------------------------------------------------------------


async def test_a_long_poll_answers_when_a_record_is_produced(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, broker), client(served) as http:
        waiting = poll(http, offset=0, max_wait_ms=300_000)
        await wait_until(lambda: broker.fetch_purgatory.num_delayed == 1, "the poll to wait")
        assert (await produce(http, "hello", acks=1)).json() == {"base_offset": 0}
        response = await waiting
    assert response.status_code == 200
    assert response.json() == {
        "records": [{"offset": 0, "key": None, "value": "hello"}],
        "high_watermark": 1,
    }


async def test_a_long_poll_answers_empty_after_max_wait(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, _), client(served) as http:
        response = await http.get(RECORDS, params={"offset": 0, "max_wait_ms": 20})
    assert response.status_code == 200
    assert response.json() == {"records": [], "high_watermark": 0}


async def test_a_long_poll_waits_for_min_bytes(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, broker), client(served) as http:
        # Each record costs its value plus 16 bytes of overhead: three are needed.
        waiting = poll(http, offset=0, min_bytes=50, max_wait_ms=300_000)
        await wait_until(lambda: broker.fetch_purgatory.num_delayed == 1)
        for value in ("a", "b"):
            assert (await produce(http, value, acks=1)).status_code == 200
        assert not waiting.done() and broker.fetch_purgatory.num_delayed == 1
        assert (await produce(http, "c", acks=1)).status_code == 200
        records = (await waiting).json()["records"]
    assert [r["value"] for r in records] == ["a", "b", "c"]


async def test_records_round_trip_with_keys(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, _), client(served) as http:
        body = {"records": [{"key": "k1", "value": "v1"}, {"value": "v2"}]}
        assert (await http.post(RECORDS, json=body)).json() == {"base_offset": 0}
        response = await http.get(RECORDS, params={"offset": 1, "max_wait_ms": 0})
    assert response.json()["records"] == [{"offset": 1, "key": None, "value": "v2"}]


async def test_consumers_see_a_record_once_the_followers_have_it(server_kind: str) -> None:
    async with broker_server(server_kind, TRIO) as (served, broker), client(served) as http:
        stall_followers(broker)
        assert (await produce(http, "x", acks=1)).json() == {"base_offset": 0}
        early = await http.get(RECORDS, params={"offset": 0, "max_wait_ms": 0})
        assert early.json() == {"records": [], "high_watermark": 0}
        waiting = poll(http, offset=0, max_wait_ms=300_000)
        resume_followers(broker)
        assert [r["value"] for r in (await waiting).json()["records"]] == ["x"]


async def test_a_client_disconnecting_mid_poll_leaves_nothing_pending(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, broker), client(served) as http:
        purgatory = broker.fetch_purgatory
        waiting = poll(http, offset=0, max_wait_ms=300_000)
        await wait_until(lambda: purgatory.num_delayed == 1, "the poll to wait")
        before = purgatory.stats()
        waiting.cancel()
        await wait_until(lambda: purgatory.num_delayed == 0, "the poll to be withdrawn")
        after = purgatory.stats()
    assert after.cancelled == before.cancelled + 1
    # on_complete never ran: nothing completed or expired.
    assert (after.completed, after.expired) == (before.completed, before.expired)


async def test_server_shutdown_answers_every_pending_poll(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, broker), client(served) as http:
        polls = [poll(http, offset=0, max_wait_ms=300_000) for _ in range(20)]
        await wait_until(lambda: broker.fetch_purgatory.num_delayed == 20)
        await served.stop()
        answers = await asyncio.gather(*polls)
    assert {(r.status_code, str(r.json())) for r in answers} == {
        (200, str({"records": [], "high_watermark": 0}))
    }


def ensure_file_descriptors(needed: int) -> None:
    """Raise the soft descriptor limit if it is below ``needed`` (client and server
    sockets both live in this process), or skip when the hard limit forbids it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


@pytest.mark.slow
async def test_a_thousand_long_polls_all_answer_after_one_produce(server_kind: str) -> None:
    count = 1000
    ensure_file_descriptors(2 * count + 256)
    async with broker_server(server_kind, SOLO) as (served, broker):
        connector = aiohttp.TCPConnector(limit=count + 10)
        async with aiohttp.ClientSession(served.url, connector=connector) as session:

            async def long_poll() -> Any:
                params = {"offset": "0", "max_wait_ms": "300000"}
                async with session.get(RECORDS, params=params) as response:
                    return response.status, await response.json()

            polls = [asyncio.ensure_future(long_poll()) for _ in range(count)]
            await wait_until(lambda: broker.fetch_purgatory.num_delayed == count, "1000 polls")
            body = {"records": [{"value": "for everyone"}]}
            async with session.post(RECORDS, params={"acks": "1"}, json=body) as produced:
                assert produced.status == 200
            answers = await asyncio.wait_for(asyncio.gather(*polls), HANG_GUARD)
    expected = {"records": [{"offset": 0, "key": None, "value": "for everyone"}]}
    assert all(status == 200 for status, _ in answers)
    assert all(body["records"] == expected["records"] for _, body in answers)
    assert broker.fetch_purgatory.stats().cancelled == 0


# -- acks=all ------------------------------------------------------------------------------------


async def test_acks_all_answers_only_after_replication(server_kind: str) -> None:
    async with broker_server(server_kind, TRIO) as (served, broker), client(served) as http:
        stall_followers(broker)
        produce_purgatory = broker.cluster.purgatories["produce"]
        answer = produce(http, "durable", acks="all", timeout_ms=300_000)
        await wait_until(lambda: produce_purgatory.num_delayed == 1, "the write to wait")
        partition = broker.cluster.partition(TP)
        assert not answer.done() and partition.high_watermark == 0
        resume_followers(broker)
        response = await answer
        assert (response.status_code, response.json()) == (200, {"base_offset": 0})
        assert partition.high_watermark == 1
        fetchers = [broker.cluster.fetcher(f, 0) for f in (1, 2)]
        assert all(f is not None and f.offsets[TP] == 1 for f in fetchers)


async def test_acks_all_times_out_with_504(server_kind: str) -> None:
    async with broker_server(server_kind, TRIO) as (served, broker), client(served) as http:
        stall_followers(broker)
        response = await produce(http, "x", acks="all", timeout_ms=20)
    assert response.status_code == 504
    assert response.json()["error"] == "REQUEST_TIMED_OUT"
    assert "within timeout_ms=20; they may still be committed" in response.json()["message"]


async def test_acks_all_without_enough_in_sync_replicas_is_refused_with_503(
    server_kind: str,
) -> None:
    settings = Settings(
        partitions=1,
        replication_factor=3,
        min_insync_replicas=2,
        replica_lag_time_max=0.05,
        topics=("t",),
    )
    async with broker_server(server_kind, settings) as (served, broker), client(served) as http:
        stall_followers(broker)
        partition = broker.cluster.partition(TP)
        await wait_until(lambda: partition.isr == (0,), "the followers to leave the ISR")
        response = await produce(http, "x", acks="all")
    assert response.status_code == 503
    assert response.json()["error"] == "NOT_ENOUGH_REPLICAS"
    assert "min.insync.replicas=2; nothing was appended" in response.json()["message"]


async def test_a_client_leaving_an_acks_all_write_withdraws_it(server_kind: str) -> None:
    async with broker_server(server_kind, TRIO) as (served, broker), client(served) as http:
        stall_followers(broker)
        produce_purgatory = broker.cluster.purgatories["produce"]
        answer = produce(http, "x", acks="all", timeout_ms=300_000)
        await wait_until(lambda: produce_purgatory.num_delayed == 1)
        answer.cancel()
        await wait_until(lambda: produce_purgatory.num_delayed == 0, "the write to be withdrawn")
        stats = produce_purgatory.stats()
    assert (stats.cancelled, stats.completed, stats.expired) == (1, 0, 0)


async def test_acks_0_is_accepted_at_once(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, _), client(served) as http:
        response = await produce(http, "x", acks=0)
    assert (response.status_code, response.json()) == (202, {"base_offset": 0})


# -- bad requests --------------------------------------------------------------------------------

BAD_FETCHES = [
    ("/topics/t/partitions/x/records", {}, 400, "INVALID_REQUEST"),
    ("/topics/t/partitions/1.5/records", {}, 400, "INVALID_REQUEST"),
    ("/topics/t/partitions/7/records", {}, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
    ("/topics/t/partitions/-1/records", {}, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
    ("/topics/a%20b/partitions/0/records", {}, 400, "INVALID_TOPIC"),
    ("/topics/" + "x" * 250 + "/partitions/0/records", {}, 400, "INVALID_TOPIC"),
    (RECORDS, {"offset": "abc"}, 400, "INVALID_REQUEST"),
    (RECORDS, {"offset": "-5"}, 400, "INVALID_REQUEST"),
    (RECORDS, {"offset": "99999999999999999999"}, 400, "INVALID_REQUEST"),
    ("/topics/unknown/partitions/0/records", {}, 404, "UNKNOWN_TOPIC_OR_PARTITION"),
    (RECORDS, {"min_bytes": "1.5"}, 400, "INVALID_REQUEST"),
    (RECORDS, {"max_wait_ms": "300001"}, 400, "INVALID_REQUEST"),
    (RECORDS, {"max_wait_ms": ""}, 400, "INVALID_REQUEST"),
    (RECORDS, {"max_bytes": "0"}, 400, "INVALID_REQUEST"),
    (RECORDS, {"ofset": "1"}, 400, "INVALID_REQUEST"),
    (RECORDS, {"offset": "5", "max_wait_ms": "0"}, 416, "OFFSET_OUT_OF_RANGE"),
]

BAD_PRODUCES: list[tuple[dict[str, Any], Any, int, str]] = [
    ({"acks": "2"}, {"records": [{"value": "x"}]}, 400, "INVALID_REQUIRED_ACKS"),
    ({"acks": "ALL"}, {"records": [{"value": "x"}]}, 400, "INVALID_REQUIRED_ACKS"),
    ({"timeout_ms": "-1"}, {"records": [{"value": "x"}]}, 400, "INVALID_REQUEST"),
    ({"timeout_ms": "soon"}, {"records": [{"value": "x"}]}, 400, "INVALID_REQUEST"),
    ({}, b"not json", 400, "INVALID_REQUEST"),
    ({}, b"\xff\xfe", 400, "INVALID_REQUEST"),
    ({}, b"", 400, "INVALID_REQUEST"),
    ({}, {}, 400, "INVALID_REQUEST"),
    ({}, [], 400, "INVALID_REQUEST"),
    ({}, {"records": []}, 400, "INVALID_REQUEST"),
    ({}, {"records": "x"}, 400, "INVALID_REQUEST"),
    ({}, {"records": [{"value": 1}]}, 400, "INVALID_REQUEST"),
    ({}, {"records": [{"key": "k"}]}, 400, "INVALID_REQUEST"),
    ({}, {"records": [{"value": "x", "key": 5}]}, 400, "INVALID_REQUEST"),
    ({}, {"records": [{"value": "x", "headers": {}}]}, 400, "INVALID_REQUEST"),
    ({}, {"records": ["x"]}, 400, "INVALID_REQUEST"),
    ({}, b"x" * (1024 * 1024 + 1), 413, "INVALID_REQUEST"),
    ({"acks": ["1", "all"]}, {"records": [{"value": "x"}]}, 400, "INVALID_REQUEST"),
]


async def test_bad_fetch_parameters_get_a_4xx_with_a_message(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, _), client(served) as http:
        for path, params, status, error in BAD_FETCHES:
            response = await http.get(path, params=params)
            assert response.status_code == status, (path, params, response.text)
            body = response.json()
            assert body["error"] == error and body["message"], (path, params, body)


async def test_bad_produce_parameters_get_a_4xx_with_a_message(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, _), client(served) as http:
        for params, body, status, error in BAD_PRODUCES:
            if isinstance(body, bytes):
                response = await http.post(RECORDS, params=params, content=body)
            else:
                response = await http.post(RECORDS, params=params, json=body)
            shown = (params, str(body)[:40])
            assert response.status_code == status, (shown, response.text[:200])
            answer = response.json()
            if status == 413:
                # aiohttp refuses an oversized body itself, before the route sees it.
                assert answer["error"] in (error, "REQUEST_ENTITY_TOO_LARGE"), answer
                assert "1,048,576 bytes" in answer["message"], answer
            else:
                assert answer["error"] == error and answer["message"], (shown, answer)


MESSAGES: list[tuple[str, str, dict[str, Any], str]] = [
    ("GET", RECORDS, {"offset": "9" * 20}, "offset is out of range: it must be from 0 to 2^62"),
    ("GET", RECORDS, {"max_wait_ms": "300001"}, "from 0 to 300,000, got 300001"),
    ("GET", RECORDS, {"offset": "1.5"}, "offset must be a whole number, got '1.5'"),
    ("GET", "/topics/nope/partitions/0/records", {}, "topic 'nope' does not exist"),
    ("POST", RECORDS, {"acks": ["1", "all"]}, "'acks' is given more than once ('1' and 'all')"),
    ("POST", RECORDS, {}, "the request body is empty"),
]


async def test_error_messages_say_what_is_wrong_and_what_is_accepted(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, _), client(served) as http:
        for method, path, params, message in MESSAGES:
            response = await http.request(method, path, params=params)
            assert message in response.json()["message"], (path, params, response.json())


async def test_a_fetch_never_creates_a_topic(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, broker), client(served) as http:
        response = await http.get("/topics/nope/partitions/0/records")
        assert response.status_code == 404
        assert broker.cluster.metadata("nope") is None


async def test_framework_errors_use_the_json_error_shape(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, _), client(served) as http:
        missing = await http.get("/nowhere")
        wrong_method = await http.delete(RECORDS)
    assert missing.status_code == 404
    assert missing.json() == {"error": "NOT_FOUND", "message": "no route GET /nowhere"}
    assert wrong_method.status_code == 405
    body = wrong_method.json()
    assert body["error"] == "METHOD_NOT_ALLOWED"
    # The body names the methods the Allow header lists, in full.
    allowed = sorted(m.strip() for m in wrong_method.headers["allow"].split(","))
    assert "POST" in allowed
    assert body["message"] == f"DELETE is not allowed on {RECORDS}; use {', '.join(allowed)}"


# -- health and metrics --------------------------------------------------------------------------


async def test_healthz_reports_the_purgatories(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, broker), client(served) as http:
        waiting = poll(http, offset=0, max_wait_ms=300_000)
        await wait_until(lambda: broker.fetch_purgatory.num_delayed == 1)
        health = await http.get("/healthz")
        waiting.cancel()
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok"
    assert body["purgatories"]["fetch"] == {"delayed": 1, "watched": 1}


async def test_metrics_expose_the_broker_purgatories(server_kind: str) -> None:
    async with broker_server(server_kind, SOLO) as (served, broker), client(served) as http:
        waiting = poll(http, offset=0, max_wait_ms=300_000)
        await wait_until(lambda: broker.fetch_purgatory.num_delayed == 1)
        text = (await http.get("/metrics")).text
        waiting.cancel()
    assert 'purgatory_delayed_operations{purgatory="fetch"} 1.0' in text
    assert 'purgatory_delayed_operations{purgatory="produce"} 0.0' in text
    assert "purgatory_expirations_total" in text


# -- settings ------------------------------------------------------------------------------------


def test_settings_come_from_the_environment() -> None:
    settings = Settings.from_env(
        {
            "MINIKAFKA_PARTITIONS": "4",
            "MINIKAFKA_REPLICATION_FACTOR": "5",
            "MINIKAFKA_FOLLOWER_LAG_MS": "20",
        }
    )
    assert settings == Settings(partitions=4, replication_factor=5, brokers=5, follower_lag=0.02)


@pytest.mark.parametrize(
    "environ",
    [
        {"MINIKAFKA_PARTITIONS": "many"},
        {"MINIKAFKA_PARTITIONS": "0"},
        {"MINIKAFKA_REPLICATION_FACTOR": "4", "MINIKAFKA_BROKERS": "3"},
        {"MINIKAFKA_FOLLOWER_LAG_MS": "-1"},
        {"MINIKAFKA_FOLLOWER_LAG_MS": "nan"},
        {"MINIKAFKA_TOPICS": "a,b c"},
    ],
)
def test_bad_settings_in_the_environment_are_refused_naming_the_variable(
    environ: dict[str, str],
) -> None:
    with pytest.raises(SettingsError) as error:
        Settings.from_env(environ)
    # The variable the user set, never an internal field name.
    assert str(error.value).startswith(("MINIKAFKA_", "MINIKAFKA_REPLICATION_FACTOR="))
    assert "replication_factor " not in str(error.value) and "follower_lag " not in str(error.value)


def test_a_bad_environment_variable_stops_uvicorn_with_one_line() -> None:
    env = {**os.environ, "MINIKAFKA_PARTITIONS": "many"}
    done = subprocess.run(
        [sys.executable, "-m", "uvicorn", "examples.fastapi_broker:app", "--port", "1"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "examples.fastapi_broker: MINIKAFKA_PARTITIONS='many': "
        "expected a whole number from 1 to 999999"
    ]
