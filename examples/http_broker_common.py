"""The mini Kafka broker over HTTP: settings, validation, the broker calls and JSON bodies.

Shared by :mod:`examples.fastapi_broker` and :mod:`examples.aiohttp_broker`, which
only plug these into their framework: each route hands its raw inputs to
:class:`HttpBroker` together with the framework's disconnect-aware waits, and
turns the ``(status, body)`` it gets back into a JSON response.

Routes (the same for both servers)::

    POST /topics/{topic}/partitions/{partition}/records?acks=0|1|all&timeout_ms=N
         {"records": [{"key": str | null, "value": str}, ...]}
         -> {"base_offset": int}
    GET  /topics/{topic}/partitions/{partition}/records?offset=N&min_bytes=N&max_wait_ms=N
         -> {"records": [{"offset": int, "key": ..., "value": ...}], "high_watermark": int}
    GET  /healthz
    GET  /metrics

Errors are ``{"error": "<NAME>", "message": "..."}`` with a fitting status: 400
for bad parameters, 404 for a topic or partition that does not exist (a produce
creates its topic; a fetch never does), 503 when replicas are missing, 504 when
replication did not finish in time. ``<NAME>`` is Kafka's error name, or for
errors of HTTP itself (no such route, method not allowed, body too large) the
status in words, e.g. ``NOT_FOUND``; every route and both servers answer this shape.

Settings come from factory arguments or the environment (``MINIKAFKA_*``, see
:meth:`Settings.from_env`).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, fields
from http import HTTPStatus
from typing import Any

from minikafka.broker import BrokerConfig, Cluster, DelayedFetch
from minikafka.errors import ErrorCode
from minikafka.protocol import (
    ACKS_ALL,
    CreateTopicsRequest,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    ProduceResponse,
    TopicSpec,
)
from minikafka.records import Record, TopicPartition
from prometheus_client import CollectorRegistry

from purgatory_aio import Purgatory, PurgatoryClosed
from purgatory_aio.integrations import OperationCancelled
from purgatory_aio.metrics import register_purgatories

__all__ = [
    "HttpBroker",
    "Query",
    "Settings",
    "SettingsError",
    "http_error",
    "settings_from_env_or_exit",
]

Body = dict[str, Any]
Reply = tuple[int, Body]
#: A request's query parameters: best as (name, value) pairs with repeats included
#: (``multi_items()`` in Starlette, ``items()`` of aiohttp's MultiDict), so that a
#: repeated parameter is refused rather than one of its values silently chosen.
Query = Mapping[str, str] | Iterable[tuple[str, str]]
#: The framework's ``watch_and_wait`` bound to the request being served.
WatchAndWait = Callable[[Purgatory, DelayedFetch, Iterable[Hashable]], Awaitable[FetchResponse]]
#: The framework's ``cancel_on_disconnect`` bound to the request being served.
CancelOnDisconnect = Callable[[], AbstractAsyncContextManager[None]]

MAX_WAIT_MS = 300_000
MAX_BODY_BYTES = 1024 * 1024
MAX_RECORDS = 10_000
MAX_FETCH_BYTES = 64 * 1024 * 1024
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_INTEGER = re.compile(r"[+-]?[0-9]+")
#: Offsets are int64 in Kafka; 2**62 leaves room for arithmetic on them.
MAX_OFFSET = 2**62
_ACKS = {"0": 0, "1": 1, "all": ACKS_ALL, "-1": ACKS_ALL}
_PRODUCE_PARAMS = frozenset({"acks", "timeout_ms"})
_FETCH_PARAMS = frozenset({"offset", "min_bytes", "max_wait_ms", "max_bytes"})

_DEFAULT_BROKERS = 3

_STATUS = {
    ErrorCode.NONE: 200,
    ErrorCode.OFFSET_OUT_OF_RANGE: 416,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: 404,
    ErrorCode.RECORD_TOO_LARGE: 413,
    ErrorCode.REQUEST_TIMED_OUT: 504,
    ErrorCode.NOT_ENOUGH_REPLICAS: 503,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: 503,
    ErrorCode.LEADER_NOT_AVAILABLE: 503,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: 503,
    ErrorCode.BROKER_NOT_AVAILABLE: 503,
    ErrorCode.INVALID_TOPIC: 400,
    ErrorCode.INVALID_REQUIRED_ACKS: 400,
    ErrorCode.INVALID_REQUEST: 400,
}


@dataclass(frozen=True, slots=True)
class Settings:
    """How the HTTP broker's cluster is set up.

    Args:
        partitions: partitions of each topic created on first use.
        replication_factor: replicas of each partition (at most ``brokers``).
        brokers: brokers in the in-process cluster.
        min_insync_replicas: in-sync replicas an ``acks=all`` write needs.
        follower_lag: seconds each follower fetch response takes to arrive,
            which is how far behind the leader the followers run.
        replica_lag_time_max: seconds a follower may lag before leaving the ISR.
        topics: topics created at start-up, so that consumers can long-poll them
            before anything is produced (other topics are created by a produce).
    """

    partitions: int = 3
    replication_factor: int = 3
    brokers: int = _DEFAULT_BROKERS
    min_insync_replicas: int = 1
    follower_lag: float = 0.0
    replica_lag_time_max: float = 10.0
    topics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for topic in self.topics:
            _check_topic(topic)
        for name in ("partitions", "replication_factor", "brokers", "min_insync_replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.replication_factor > self.brokers:
            raise ValueError(
                f"replication_factor ({self.replication_factor}) exceeds brokers ({self.brokers})"
            )
        for name in ("follower_lag", "replica_lag_time_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number of seconds, got {value!r}")
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read ``MINIKAFKA_PARTITIONS``, ``MINIKAFKA_REPLICATION_FACTOR``,
        ``MINIKAFKA_BROKERS``, ``MINIKAFKA_MIN_INSYNC_REPLICAS`` (whole numbers >= 1),
        ``MINIKAFKA_FOLLOWER_LAG_MS`` and ``MINIKAFKA_REPLICA_LAG_TIME_MAX_MS``
        (milliseconds >= 0) and ``MINIKAFKA_TOPICS`` (comma-separated names created at
        start-up); unset ones keep their defaults.

        Raises:
            SettingsError: a variable's value is unusable; the message names the
                variable, what it holds and what it should hold.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        topics = env.get("MINIKAFKA_TOPICS")
        if topics is not None:
            values["topics"] = _env_topics(topics)
        for field in fields(cls):
            name = field.name
            if name == "topics":
                continue
            variable = _env_name(name)
            raw = env.get(variable)
            if raw is None:
                continue
            if name in _MILLISECOND_FIELDS:
                values[name] = _env_milliseconds(variable, raw) / 1000
            else:
                values[name] = _env_count(variable, raw)
        if "brokers" not in values and "replication_factor" in values:
            values["brokers"] = max(_DEFAULT_BROKERS, values["replication_factor"])
        defaults = cls()
        replicas = values.get("replication_factor", defaults.replication_factor)
        brokers = values.get("brokers", defaults.brokers)
        if replicas > brokers:
            raise SettingsError(
                f"MINIKAFKA_REPLICATION_FACTOR={replicas} exceeds MINIKAFKA_BROKERS={brokers}: "
                "each replica needs its own broker (raise MINIKAFKA_BROKERS or leave it unset)"
            )
        return cls(**values)


class SettingsError(ValueError):
    """A ``MINIKAFKA_*`` environment variable holds an unusable value."""


_MILLISECOND_FIELDS = ("follower_lag", "replica_lag_time_max")


def _env_name(field: str) -> str:
    suffix = "_MS" if field in _MILLISECOND_FIELDS else ""
    return f"MINIKAFKA_{field.upper()}{suffix}"


def _env_count(variable: str, raw: str) -> int:
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 6 or int(text) < 1:
        raise SettingsError(f"{variable}={raw!r}: expected a whole number from 1 to 999999")
    return int(text)


def _env_topics(raw: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in raw.split(",") if name.strip())
    for name in names:
        try:
            _check_topic(name)
        except BadRequest as exc:
            raise SettingsError(f"MINIKAFKA_TOPICS={raw!r}: {exc}") from None
    return names


def _env_milliseconds(variable: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise SettingsError(
            f"{variable}={raw!r}: expected a number of milliseconds >= 0, e.g. {variable}=20"
        )
    return value


class BadRequest(Exception):
    """A request parameter or body is invalid; answered with ``status`` and a message."""

    def __init__(self, message: str, *, error: str = "INVALID_REQUEST", status: int = 400):
        super().__init__(message)
        self.error = error
        self.status = status

    def reply(self) -> Reply:
        return self.status, {"error": self.error, "message": str(self)}


def http_error(status: int, message: str | None = None) -> Reply:
    """The JSON error of an HTTP-level failure (no such route, method not allowed, body
    too large), in the same shape as the broker's own errors."""
    try:
        known = HTTPStatus(status)
    except ValueError:
        return status, {"error": "HTTP_ERROR", "message": message or f"HTTP status {status}"}
    return status, {"error": known.name, "message": message or known.description}


def method_not_allowed(method: str, path: str, allowed: Iterable[str]) -> Reply:
    """The 405 error: which methods the path takes, as its ``Allow`` header lists them."""
    methods = ", ".join(sorted({m.strip().upper() for m in allowed if m.strip()}))
    return http_error(
        HTTPStatus.METHOD_NOT_ALLOWED,
        f"{method} is not allowed on {path}; use {methods or 'another route'}",
    )


class HttpBroker:
    """An in-process cluster behind the HTTP routes; a topic is created by its first produce.

    The framework modules call :meth:`produce`, :meth:`fetch` and :meth:`health`
    and serve :attr:`metrics`; they run :attr:`purgatories` with the application
    and :meth:`lifespan` inside that.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings = settings or Settings()
        config = BrokerConfig(
            brokers=settings.brokers,
            min_insync_replicas=settings.min_insync_replicas,
            replica_lag_time_max=settings.replica_lag_time_max,
        )
        lag = settings.follower_lag
        self.cluster = Cluster(config, follower_latency=(lambda: lag) if lag > 0 else None)
        self.purgatories: tuple[Purgatory, ...] = tuple(self.cluster.purgatories.values())
        self.metrics = CollectorRegistry()
        register_purgatories(self.purgatories, self.metrics)
        self._topics: dict[str, asyncio.Task[None]] = {}

    @property
    def fetch_purgatory(self) -> Purgatory:
        purgatory: Purgatory = self.cluster.purgatories["fetch"]
        return purgatory

    @asynccontextmanager
    async def lifespan(self, app: object = None) -> AsyncIterator[None]:
        """Runs while the application does: creates :attr:`Settings.topics` first and
        stops replication when it stops."""
        try:
            for topic in self.settings.topics:
                await self._ensure_topic(topic)
            yield
        finally:
            await self.cluster.close()

    # -- routes --------------------------------------------------------------------------------

    async def produce(
        self,
        topic: str,
        partition: str,
        query: Query,
        body: bytes,
        cancel_on_disconnect: CancelOnDisconnect,
    ) -> Reply:
        try:
            tp = self._partition(topic, partition)
            params = _only(query, _PRODUCE_PARAMS)
            acks_text = params.get("acks", "all")
            acks = _ACKS.get(acks_text)
            if acks is None:
                raise BadRequest(
                    f"acks must be 0, 1 or all, got {acks_text!r}", error="INVALID_REQUIRED_ACKS"
                )
            timeout_ms = _int_param(params, "timeout_ms", 30_000, 0, MAX_WAIT_MS)
            records = _records(body)
            await self._ensure_topic(topic)
            request = ProduceRequest({tp: records}, acks=acks, timeout=timeout_ms / 1000)
            if acks == ACKS_ALL:
                # The broker waits with Purgatory.watch_and_wait, which withdraws the
                # DelayedProduce when this task is cancelled by the client leaving.
                async with cancel_on_disconnect():
                    response = await self.cluster.produce(request)
            else:
                response = await self.cluster.produce(request)
        except BadRequest as exc:
            return exc.reply()
        except (PurgatoryClosed, OperationCancelled) as exc:
            return _unavailable(exc)
        return _produce_reply(tp, acks, timeout_ms, self.settings.min_insync_replicas, response)

    async def fetch(
        self,
        topic: str,
        partition: str,
        query: Query,
        watch_and_wait: WatchAndWait,
    ) -> Reply:
        try:
            tp = self._partition(topic, partition)
            params = _only(query, _FETCH_PARAMS)
            offset = _int_param(params, "offset", 0, 0, MAX_OFFSET)
            min_bytes = _int_param(params, "min_bytes", 1, 0, MAX_FETCH_BYTES)
            max_wait_ms = _int_param(params, "max_wait_ms", 500, 0, MAX_WAIT_MS)
            max_bytes = _int_param(params, "max_bytes", 1024 * 1024, 1, MAX_FETCH_BYTES)
            await self._existing_topic(topic)
            request = FetchRequest(
                {tp: offset},
                max_wait=max_wait_ms / 1000,
                min_bytes=min_bytes,
                max_bytes=max_bytes,
                partition_max_bytes=max_bytes,
            )
            replicas = self.cluster.replicas
            if max_wait_ms == 0 or replicas.fetch_satisfied(request):
                # Answerable now: no operation at all, as the broker (and Kafka) do it.
                response = replicas.read(request)
            else:
                op = DelayedFetch(request, replicas)
                response = await watch_and_wait(self.fetch_purgatory, op, [tp])
        except BadRequest as exc:
            return exc.reply()
        except (PurgatoryClosed, OperationCancelled) as exc:
            return _unavailable(exc)
        return _fetch_reply(tp, response)

    def health(self) -> Reply:
        if self.cluster.closed:
            return 503, {"status": "stopping"}
        return 200, {
            "status": "ok",
            "topics": len(self._topics),
            "purgatories": {
                s.name: {"delayed": s.pending, "watched": s.watched}
                for s in (p.stats() for p in self.purgatories)
            },
        }

    # -- helpers -------------------------------------------------------------------------------

    def _partition(self, topic: str, partition: str) -> TopicPartition:
        _check_topic(topic)
        if not _INTEGER.fullmatch(partition):
            raise BadRequest(f"partition must be an integer, got {partition!r}")
        count = self.settings.partitions
        # Compared as text first: int() of thousands of digits is refused (and slow).
        number = int(partition) if len(partition) <= 20 else count
        if not 0 <= number < count:
            raise BadRequest(
                f"topic {topic!r} has partitions 0 to {count - 1}, not {partition}",
                error="UNKNOWN_TOPIC_OR_PARTITION",
                status=404,
            )
        return TopicPartition(topic, number)

    async def _existing_topic(self, topic: str) -> None:
        """Wait for ``topic`` if it is being created; refuse it if it was never produced to."""
        creating = self._topics.get(topic)
        if creating is None:
            raise BadRequest(
                f"topic {topic!r} does not exist; a produce to it creates it",
                error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION.name,
                status=404,
            )
        await asyncio.shield(creating)

    async def _ensure_topic(self, topic: str) -> None:
        creating = self._topics.get(topic)
        if creating is None:
            creating = asyncio.get_running_loop().create_task(self._create_topic(topic))
            self._topics[topic] = creating
        # Shielded: the first request for a topic may be abandoned; creation goes on.
        await asyncio.shield(creating)

    async def _create_topic(self, topic: str) -> None:
        spec = TopicSpec(self.settings.partitions, self.settings.replication_factor)
        try:
            response = await self.cluster.create_topics(
                CreateTopicsRequest({topic: spec}, timeout=30.0)
            )
        except BaseException:
            del self._topics[topic]
            raise
        error = response.errors[topic]
        if error not in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
            del self._topics[topic]
            raise BadRequest(
                f"topic {topic!r} could not be created", error=error.name, status=_status(error)
            )


def _check_topic(topic: str) -> None:
    if not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise BadRequest(
            f"topic must be 1 to 249 of [A-Za-z0-9._-], got {topic!r}", error="INVALID_TOPIC"
        )


def _only(query: Query, allowed: frozenset[str]) -> dict[str, str]:
    """The parameters by name, refusing unknown and repeated ones."""
    params: dict[str, str] = {}
    for name, value in query.items() if isinstance(query, Mapping) else query:
        if name not in allowed:
            raise BadRequest(
                f"unknown parameter {name!r}; expected any of {', '.join(sorted(allowed))}"
            )
        if name in params:
            raise BadRequest(
                f"parameter {name!r} is given more than once ({params[name]!r} and {value!r}); "
                "give it once"
            )
        params[name] = value
    return params


def _int_param(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not _INTEGER.fullmatch(raw):
        raise BadRequest(f"{name} must be a whole number, got {raw!r}")
    # Compared as text first: int() of thousands of digits is refused (and slow).
    if len(raw.lstrip("+-0")) > 20 or not low <= int(raw) <= high:
        shown = raw if len(raw) <= 30 else f"{raw[:24]}... ({len(raw)} characters)"
        raise BadRequest(
            f"{name} is out of range: it must be from {_readable(low)} to {_readable(high)}, "
            f"got {shown}"
        )
    return int(raw)


def _readable(bound: int) -> str:
    """A bound as a reader takes it in: 2**62 as 2^62 (4.6e18), others with separators."""
    if bound >= 2**32 and bound & (bound - 1) == 0:
        return f"2^{bound.bit_length() - 1} ({bound:.2g})"
    return f"{bound:,}"


def _records(body: bytes) -> list[Record]:
    if len(body) > MAX_BODY_BYTES:
        raise BadRequest(
            f"the body is larger than the {MAX_BODY_BYTES:,} bytes accepted ({len(body):,})",
            status=413,
        )
    if not body.strip():
        raise BadRequest(
            'the request body is empty; send {"records": [{"key": str | null, "value": str}]}'
        )
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(document, dict) or not isinstance(document.get("records"), list):
        raise BadRequest('the body must be {"records": [{"key": str | null, "value": str}, ...]}')
    items = document["records"]
    if not 1 <= len(items) <= MAX_RECORDS:
        raise BadRequest(f"records must hold 1 to {MAX_RECORDS} records, got {len(items)}")
    records = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not set(item) <= {"key", "value"}:
            raise BadRequest(f'records[{i}] must be an object with "value" and optional "key"')
        value, key = item.get("value"), item.get("key")
        if not isinstance(value, str):
            raise BadRequest(f"records[{i}].value must be a string, got {value!r}")
        if key is not None and not isinstance(key, str):
            raise BadRequest(f"records[{i}].key must be a string or null, got {key!r}")
        records.append(Record(value.encode(), None if key is None else key.encode()))
    return records


def _status(error: ErrorCode) -> int:
    status = _STATUS.get(error)
    if status is None:
        status = 503 if error.retriable else 500
    return status


def _error(error: ErrorCode, message: str) -> Reply:
    return _status(error), {"error": error.name, "message": message}


def _unavailable(exc: Exception) -> Reply:
    return 503, {"error": ErrorCode.BROKER_NOT_AVAILABLE.name, "message": str(exc)}


#: What a failed produce means for the records, by error: what the client should know
#: to decide whether to retry (a retry after a timeout may write the records twice).
_PRODUCE_FAILURES = {
    ErrorCode.REQUEST_TIMED_OUT: (
        "the records were appended at the leader but not copied to every in-sync replica "
        "within timeout_ms={timeout_ms}; they may still be committed later, so a retry "
        "may write them twice"
    ),
    ErrorCode.NOT_ENOUGH_REPLICAS: (
        "fewer in-sync replicas than min.insync.replicas={min_isr}; nothing was appended. "
        "Retry once the followers catch up, or produce with acks=1"
    ),
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: (
        "the records were appended, then the in-sync replicas fell below "
        "min.insync.replicas={min_isr} before they were copied; they may still be committed"
    ),
}


def _produce_reply(
    tp: TopicPartition, acks: int, timeout_ms: int, min_isr: int, response: ProduceResponse
) -> Reply:
    result = response.partitions[tp]
    if result.error is not ErrorCode.NONE:
        meaning = _PRODUCE_FAILURES.get(result.error, "the broker refused the records")
        return _error(
            result.error,
            f"produce to {tp} failed with {result.error.name}: "
            + meaning.format(timeout_ms=timeout_ms, min_isr=min_isr),
        )
    # acks=0 promises nothing about durability: "accepted" rather than "done".
    return (202 if acks == 0 else 200), {"base_offset": result.base_offset}


def _fetch_reply(tp: TopicPartition, response: FetchResponse) -> Reply:
    result = response.partitions[tp]
    if result.error is not ErrorCode.NONE:
        status, body = _error(result.error, f"fetch from {tp} at {result.fetch_offset} failed")
        if result.high_watermark >= 0:
            body["high_watermark"] = result.high_watermark
        return status, body
    offset = result.fetch_offset
    return 200, {
        "records": [
            {
                "offset": offset + i,
                "key": None if r.key is None else r.key.decode(errors="replace"),
                "value": None if r.value is None else r.value.decode(errors="replace"),
            }
            for i, r in enumerate(result.records)
        ],
        "high_watermark": result.high_watermark,
    }


def settings_from_env_or_exit(program: str) -> Settings:
    """:meth:`Settings.from_env`, a bad variable ending the program with one line naming it.

    Servers read the environment while importing the application, where a traceback
    would bury the one thing the user has to fix.
    """
    try:
        return Settings.from_env()
    except SettingsError as exc:
        raise SystemExit(f"{program}: {exc}") from None
