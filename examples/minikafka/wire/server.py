"""Listeners speaking the Kafka protocol, one per broker of an in-process :class:`Cluster`."""

from __future__ import annotations

import asyncio
import datetime
import functools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from kio.schema.errors import ErrorCode as KioErrorCode

from ..broker import Cluster
from ..broker.config import BrokerConfig
from ..errors import ErrorCode
from ..protocol import (
    CONSUMER_REPLICA_ID,
    CreateTopicsRequest,
    FetchRequest,
    ProduceRequest,
    ProducerIdentity,
    TopicSpec,
)
from ..records import Record, TopicPartition
from . import groups
from .codec import (
    MalformedRequest,
    api_versions_error,
    build,
    decode_request,
    encode_response,
    nested,
    peek_header,
    response_schema,
    seconds,
)
from .records import CorruptRecordBatch, ProducedBatch, decode_produced, encode_batch

_log = structlog.get_logger("minikafka.wire")

#: Kafka's error codes that the example's ErrorCode does not name.
CORRUPT_MESSAGE = 2
UNSUPPORTED_VERSION = 35
INVALID_TXN_STATE = 48
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
UNKNOWN_PRODUCER_ID = 59

#: How long :meth:`WireCluster.close` lets busy connections write their last answer.
CLOSE_GRACE_S = 5.0

#: Kafka's default ``socket.request.max.bytes``: a larger frame closes the connection.
MAX_REQUEST_BYTES = 100 * 1024 * 1024

#: Namespace of the stable topic IDs reported in Metadata v10+.
_TOPIC_ID_NAMESPACE = uuid.UUID("6c1b6f0e-6b3a-4d0e-9d8e-7b5b3f0a2c11")


def _err(code: int) -> KioErrorCode:
    """The kio enum member for a Kafka error code."""
    return KioErrorCode(int(code))


def _ms(delta: datetime.timedelta | int) -> float:
    """A request's wait or timeout in seconds, never negative."""
    return max(0.0, seconds(delta))


@dataclass(frozen=True, slots=True)
class WireConfig:
    """The listeners' settings (``host``/``port``: the first broker; the others follow)."""

    host: str = "127.0.0.1"
    port: int = 9092
    partitions: int = 1
    replication_factor: int = 1
    auto_create_topics: bool = True
    max_request_bytes: int = MAX_REQUEST_BYTES


Handler = Callable[["Connection", int, Any], Awaitable[Any]]


class WireCluster:
    """A :class:`Cluster` behind ``config.brokers`` TCP listeners on consecutive ports.

    Use as ``async with WireCluster(broker_config, wire_config) as wire: ...``; the
    actual ports are in :attr:`ports` (``port=0`` picks free ones).
    """

    def __init__(self, broker: BrokerConfig, wire: WireConfig | None = None) -> None:
        self.broker_config = broker
        self.config = wire or WireConfig()
        self.cluster = Cluster(broker)
        self.groups = groups.WireGroupCoordinator(self.cluster, broker)
        self.ports: list[int] = []
        self._servers: list[asyncio.Server] = []
        self._connections: dict[asyncio.Task[None], Connection] = {}
        #: Set by :meth:`close`: connections finish the request in hand, then end.
        self.closing = False
        self._producer_ids = 0

    async def start(self) -> None:
        """Open one listener per broker (consecutive ports from ``config.port``)."""
        for node in range(self.broker_config.brokers):
            port = self.config.port + node if self.config.port else 0
            server = await asyncio.start_server(
                functools.partial(self._serve, node), self.config.host, port
            )
            self._servers.append(server)
            self.ports.append(server.sockets[0].getsockname()[1])
        _log.info("listening", host=self.config.host, ports=self.ports)

    async def close(self) -> None:
        """Stop listening, answer every waiting request (the purgatories settle), then close."""
        self.closing = True
        for server in self._servers:
            server.close()
        # Every operation in a purgatory settles: long polls and acks=all writes are answered.
        await self.cluster.close()
        for conn in self._connections.values():
            conn.close_if_idle()
        if self._connections:
            # Busy connections write the answer in hand, then end; a client that does not
            # read it (a full socket buffer) is not waited for beyond the grace period.
            _, stuck = await asyncio.wait(self._connections, timeout=CLOSE_GRACE_S)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()

    async def __aenter__(self) -> WireCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- connections ---------------------------------------------------------------------------

    async def _serve(
        self, node: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        conn = Connection(self, node, writer)
        self._connections[task] = conn
        try:
            await conn.run(reader)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            if not self.closing:
                raise
            # Cancelled by close() after its grace period: the end of this task, not an
            # error (re-raising would only make asyncio's stream callback log it).
        finally:
            self._connections.pop(task, None)
            writer.close()

    def next_producer_id(self) -> int:
        self._producer_ids += 1
        return self._producer_ids

    def issued_producer_id(self, producer_id: int) -> bool:
        """Whether InitProducerId handed out ``producer_id`` (ids count up from 1)."""
        return 0 < producer_id <= self._producer_ids

    def topic_id(self, topic: str) -> uuid.UUID:
        return uuid.uuid5(_TOPIC_ID_NAMESPACE, topic)

    def auto_create(self, topic: str) -> None:
        """Create ``topic`` with the default layout without waiting for its leaders."""
        # The controller checks the name and the layout; its answer is visible in metadata.
        asyncio.get_running_loop().create_task(
            self.cluster.create_topics(
                CreateTopicsRequest(
                    {topic: TopicSpec(self.config.partitions, self.config.replication_factor)},
                    timeout=0,
                )
            )
        )


class Connection:
    """One client connection: requests are answered one at a time, in order, as Kafka does."""

    def __init__(self, wire: WireCluster, node: int, writer: asyncio.StreamWriter) -> None:
        self.wire = wire
        self.node = node
        self.writer = writer
        self._idle = True
        self.cluster = wire.cluster
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"

    def close_if_idle(self) -> None:
        """End the connection now if it waits for a request (its reader sees the end)."""
        if self._idle:
            self.writer.close()

    async def run(self, reader: asyncio.StreamReader) -> None:
        limit = self.wire.config.max_request_bytes
        while not self.wire.closing:
            self._idle = True
            size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
            if size < 0 or size > limit:
                # Kafka's InvalidReceiveException: the connection is closed, nothing answered.
                _log.warning("request_size_invalid", peer=self.peer, size=size, limit=limit)
                return
            try:
                frame = await reader.readexactly(size)
            except asyncio.IncompleteReadError as exc:
                # The client closed the connection in the middle of a request.
                _log.warning(
                    "request_truncated", peer=self.peer, expected=size, received=len(exc.partial)
                )
                return
            self._idle = False
            try:
                reply = await self._handle(frame)
            except MalformedRequest as exc:
                # Kafka closes a connection whose request does not parse.
                _log.warning("malformed_request", peer=self.peer, error=str(exc))
                return
            except Exception:
                # A bug in one request's handling closes that connection only.
                _log.exception("request_failed", peer=self.peer)
                return
            if reply is None:
                continue
            self.writer.write(reply)
            await self.writer.drain()

    async def _handle(self, frame: bytes) -> bytes | None:
        api_key, version, correlation = peek_header(frame)
        api = APIS.get(api_key)
        if api is None or not api.min_version <= version <= api.max_version:
            if api_key == API_VERSIONS:
                return api_versions_error(correlation, UNSUPPORTED_VERSION, version_table())
            raise MalformedRequest(f"unsupported API key {api_key} version {version}")
        _client_id, request = decode_request(frame, api_key, version)
        response = await api.handler(self, version, request)
        if response is None:
            return None
        return encode_response(correlation, response)


# -- handlers ----------------------------------------------------------------------------------


async def api_versions(conn: Connection, version: int, request: Any) -> Any:
    schema = response_schema(API_VERSIONS, version)
    item = nested(schema, "api_keys")
    keys = tuple(item(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in version_table())
    return build(schema, error_code=_err(0), api_keys=keys, throttle_time=datetime.timedelta(0))


async def metadata(conn: Connection, version: int, request: Any) -> Any:
    wire = conn.wire
    replicas = conn.cluster.replicas
    schema = response_schema(METADATA, version)
    broker_t = nested(schema, "brokers")
    topic_t = nested(schema, "topics")
    partition_t = nested(topic_t, "partitions")
    all_topics = request.topics is None
    names = list(replicas.topics()) if all_topics else [t.name for t in request.topics]
    allow_create = wire.config.auto_create_topics and getattr(
        request, "allow_auto_topic_creation", True
    )
    topics = []
    for name in names:
        topic_id = wire.topic_id(name)  # v10+
        meta = conn.cluster.metadata(name)
        if meta is None:
            if allow_create and name:
                wire.auto_create(name)
                error = ErrorCode.LEADER_NOT_AVAILABLE
            else:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            topics.append(
                build(
                    topic_t,
                    error_code=_err(int(error)),
                    name=name,
                    partitions=(),
                    topic_id=topic_id,
                )
            )
            continue
        partitions = tuple(
            build(
                partition_t,
                error_code=_err(0 if p.leader is not None else int(ErrorCode.LEADER_NOT_AVAILABLE)),
                partition_index=p.partition,
                leader_id=p.leader if p.leader is not None else -1,
                leader_epoch=-1,  # v7+; no epochs: clients then skip OffsetForLeaderEpoch
                replica_nodes=p.replicas,
                isr_nodes=p.isr,
                offline_replicas=(),  # v5+
            )
            for p in meta.partitions
        )
        topics.append(
            build(topic_t, error_code=_err(0), name=name, partitions=partitions, topic_id=topic_id)
        )
    brokers = tuple(
        build(broker_t, node_id=node, host=wire.config.host, port=port, rack=None)
        for node, port in enumerate(wire.ports)
    )
    return build(
        schema,
        brokers=brokers,
        topics=tuple(topics),
        cluster_id="purgatory-aio",  # v2+
        controller_id=0,
        throttle_time=datetime.timedelta(0),  # v3+
    )


async def produce(conn: Connection, version: int, request: Any) -> Any:
    errors: dict[TopicPartition, int] = {}
    records: dict[TopicPartition, list[Record]] = {}
    sizes: dict[TopicPartition, int] = {}
    replicas = conn.cluster.replicas
    producer: ProducerIdentity | None = None
    for topic in request.topic_data:
        for part in topic.partition_data:
            tp = TopicPartition(topic.name, part.index)
            partition = replicas.partition(tp)
            if partition is None:
                if not replicas.has_topic(tp.topic) and conn.wire.config.auto_create_topics:
                    conn.wire.auto_create(tp.topic)
                errors[tp] = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            if partition.leader is not None and partition.leader != conn.node:
                errors[tp] = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                continue
            try:
                batch = decode_produced(part.records or b"")
            except CorruptRecordBatch as exc:
                _log.warning("corrupt_batch", peer=conn.peer, partition=str(tp), error=str(exc))
                errors[tp] = CORRUPT_MESSAGE
                continue
            identity = _batch_producer(conn, batch)
            if isinstance(identity, int):
                errors[tp] = identity
                continue
            if records and identity != producer:
                # Every batch of one request comes from the same producer, or from none.
                errors[tp] = int(ErrorCode.INVALID_RECORD)
                continue
            producer = identity
            records[tp] = batch.records
            sizes[tp] = batch.size
    results: dict[TopicPartition, tuple[int, int]] = {tp: (code, -1) for tp, code in errors.items()}
    if records:
        response = await conn.cluster.produce(
            ProduceRequest(
                records,
                acks=request.acks,
                timeout=_ms(request.timeout),
                producer=producer,
                batch_bytes=sizes,
            )
        )
        for tp, result in response.partitions.items():
            results[tp] = (int(result.error), result.base_offset)
    if request.acks == 0:
        return None
    schema = response_schema(PRODUCE, version)
    topic_t = nested(schema, "responses")
    partition_t = nested(topic_t, "partition_responses")
    by_topic: dict[str, list[Any]] = {}
    for tp, (code, base) in results.items():
        by_topic.setdefault(tp.topic, []).append(
            build(
                partition_t,
                index=tp.partition,
                error_code=_err(code),
                base_offset=base,
                log_append_time=None,  # v2+
                log_start_offset=0,  # v5+
                record_errors=(),  # v8+
                error_message=None,  # v8+
            )
        )
    return build(
        schema,
        responses=tuple(
            topic_t(name=name, partition_responses=tuple(parts)) for name, parts in by_topic.items()
        ),
        throttle_time=datetime.timedelta(0),
    )


def _batch_producer(conn: Connection, batch: ProducedBatch) -> ProducerIdentity | int | None:
    """The idempotent producer of ``batch`` (None for a plain one), or the error code that
    refuses it."""
    if batch.transactional:
        # No transaction can have begun: InitProducerId refuses transactional ids.
        return INVALID_TXN_STATE
    if batch.producer_id < 0:
        return None
    if batch.producer_epoch < 0 or batch.base_sequence < 0:
        return int(ErrorCode.INVALID_RECORD)
    if not conn.wire.issued_producer_id(batch.producer_id):
        return UNKNOWN_PRODUCER_ID
    return ProducerIdentity(batch.producer_id, batch.producer_epoch)


async def fetch(conn: Connection, version: int, request: Any) -> Any:
    replicas = conn.cluster.replicas
    errors: dict[TopicPartition, int] = {}
    offsets: dict[TopicPartition, int] = {}
    partition_max = 0
    for topic in request.topics:
        for part in topic.partitions:
            tp = TopicPartition(topic.topic, part.partition)
            partition = replicas.partition(tp)
            if partition is None:
                errors[tp] = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            elif partition.leader != conn.node:
                errors[tp] = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            else:
                offsets[tp] = part.fetch_offset
                partition_max = max(partition_max, part.partition_max_bytes)
    max_wait = _ms(request.max_wait)
    if errors:
        max_wait = 0.0  # an error to report ends the long poll, as in Kafka
    schema = response_schema(FETCH, version)
    topic_t = nested(schema, "responses")
    partition_t = nested(topic_t, "partitions")
    by_topic: dict[str, list[Any]] = {}
    for tp, code in errors.items():
        by_topic.setdefault(tp.topic, []).append(
            partition_t(
                partition_index=tp.partition,
                error_code=_err(code),
                high_watermark=-1,
                aborted_transactions=None,
                records=None,
            )
        )
    if offsets:
        response = await conn.cluster.fetch(
            FetchRequest(
                offsets,
                max_wait=max_wait,
                min_bytes=max(0, request.min_bytes),
                max_bytes=max(1, getattr(request, "max_bytes", 2**31 - 1)),
                partition_max_bytes=max(1, partition_max),
                replica_id=CONSUMER_REPLICA_ID,
            )
        )
        for tp, result in response.partitions.items():
            by_topic.setdefault(tp.topic, []).append(
                build(
                    partition_t,
                    partition_index=tp.partition,
                    error_code=_err(result.error),
                    high_watermark=result.high_watermark,
                    last_stable_offset=result.high_watermark,  # v4+
                    log_start_offset=0,  # v5+
                    aborted_transactions=None,
                    records=encode_batch(result.fetch_offset, result.records),
                )
            )
    return build(
        schema,
        responses=tuple(
            topic_t(topic=name, partitions=tuple(parts)) for name, parts in by_topic.items()
        ),
        throttle_time=datetime.timedelta(0),
        error_code=_err(0),  # v7+
        session_id=0,  # v7+; no fetch sessions: every fetch is a full one
    )


async def list_offsets(conn: Connection, version: int, request: Any) -> Any:
    replicas = conn.cluster.replicas
    schema = response_schema(LIST_OFFSETS, version)
    topic_t = nested(schema, "topics")
    partition_t = nested(topic_t, "partitions")
    topics = []
    for topic in request.topics:
        parts = []
        for part in topic.partitions:
            tp = TopicPartition(topic.name, part.partition_index)
            partition = replicas.partition(tp)
            code, offset, timestamp = 0, -1, -1
            if partition is None:
                code = int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            elif partition.leader != conn.node:
                code = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            elif part.timestamp == -2:  # EARLIEST
                offset = 0
            elif part.timestamp in (-1, -3):  # LATEST (and MAX_TIMESTAMP, approximated)
                offset = partition.high_watermark
            elif part.timestamp < 0:
                code = int(ErrorCode.INVALID_REQUEST)
            else:
                # The first committed offset whose timestamp is at least the one asked for,
                # with that timestamp; none (-1, -1) when every record is older.
                found = partition.log.offset_for_time(
                    part.timestamp / 1000.0, partition.high_watermark
                )
                if found is not None:
                    offset, timestamp = found[0], round(found[1] * 1000)
            parts.append(
                build(
                    partition_t,
                    partition_index=part.partition_index,
                    error_code=_err(code),
                    timestamp=timestamp,
                    offset=offset,
                    leader_epoch=-1,  # v4+
                )
            )
        topics.append(topic_t(name=topic.name, partitions=tuple(parts)))
    return build(schema, throttle_time=datetime.timedelta(0), topics=tuple(topics))


async def create_topics(conn: Connection, version: int, request: Any) -> Any:
    wire = conn.wire
    specs: dict[str, TopicSpec] = {}
    refused: dict[str, tuple[ErrorCode, str]] = {}
    for topic in request.topics:
        partitions = topic.num_partitions if topic.num_partitions > 0 else wire.config.partitions
        factor = (
            topic.replication_factor
            if topic.replication_factor > 0
            else wire.config.replication_factor
        )
        limit: int | None = None
        for config in topic.configs:
            if config.name != "max.message.bytes":
                continue  # other topic configs are accepted and not applied
            value = config.value or ""
            if not value.isdigit() or int(value) > 2**31 - 1:
                refused[topic.name] = (
                    ErrorCode.INVALID_CONFIG,
                    f"max.message.bytes must be an integer from 0 to 2147483647, got {value!r}",
                )
            else:
                limit = int(value)
        specs[topic.name] = TopicSpec(partitions, factor, limit)
    wanted = {name: spec for name, spec in specs.items() if name not in refused}
    if getattr(request, "validate_only", False):
        errors = {name: ErrorCode.NONE for name in wanted}
    else:
        result = await conn.cluster.create_topics(
            CreateTopicsRequest(wanted, timeout=_ms(request.timeout))
        )
        errors = dict(result.errors)
    messages = {name: error.name for name, error in errors.items() if error is not ErrorCode.NONE}
    for name, (error, message) in refused.items():
        errors[name] = error
        messages[name] = message
    schema = response_schema(CREATE_TOPICS, version)
    topic_t = nested(schema, "topics")
    topics = []
    for name, error in errors.items():
        topics.append(
            build(
                topic_t,
                name=name,
                error_code=_err(error),
                error_message=messages.get(name),  # v1+
                num_partitions=specs[name].partitions,  # v5+
                replication_factor=specs[name].replication_factor,  # v5+
                configs=(),  # v5+
            )
        )
    return build(schema, throttle_time=datetime.timedelta(0), topics=tuple(topics))


async def init_producer_id(conn: Connection, version: int, request: Any) -> Any:
    """Hands out a new producer id (epoch 0) to each idempotent producer, as Kafka does
    for producers without a transactional id (also when they ask to bump an epoch).

    Transactions are not implemented: a transactional id is refused at once with
    ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``, an error every client treats as fatal
    (a retriable one, such as ``COORDINATOR_NOT_AVAILABLE``, keeps some retrying until
    their transaction timeout).
    """
    schema = response_schema(INIT_PRODUCER_ID, version)
    if request.transactional_id is not None:
        _log.info("transactions_refused", peer=conn.peer, transactional_id=request.transactional_id)
        return schema(
            throttle_time=datetime.timedelta(0),
            error_code=_err(TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
            producer_id=-1,
            producer_epoch=-1,
        )
    return schema(
        throttle_time=datetime.timedelta(0),
        error_code=_err(0),
        producer_id=conn.wire.next_producer_id(),
        producer_epoch=0,
    )


@dataclass(frozen=True, slots=True)
class Api:
    min_version: int
    max_version: int
    handler: Handler


PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
API_VERSIONS, CREATE_TOPICS, INIT_PRODUCER_ID = 18, 19, 22

#: What this broker implements; ApiVersions advertises exactly this table.
APIS: dict[int, Api] = {
    PRODUCE: Api(3, 9, produce),
    FETCH: Api(4, 12, fetch),  # v13+ names topics by ID
    LIST_OFFSETS: Api(1, 7, list_offsets),
    METADATA: Api(1, 12, metadata),
    API_VERSIONS: Api(0, 3, api_versions),
    groups.OFFSET_COMMIT: Api(2, 9, groups.offset_commit),
    groups.OFFSET_FETCH: Api(1, 9, groups.offset_fetch),
    groups.FIND_COORDINATOR: Api(0, 6, groups.find_coordinator),
    groups.JOIN_GROUP: Api(0, 9, groups.join_group),
    groups.HEARTBEAT: Api(0, 4, groups.heartbeat),
    groups.LEAVE_GROUP: Api(0, 5, groups.leave_group),
    groups.SYNC_GROUP: Api(0, 5, groups.sync_group),
    CREATE_TOPICS: Api(2, 5, create_topics),
    INIT_PRODUCER_ID: Api(0, 4, init_producer_id),
}


def version_table() -> list[tuple[int, int, int]]:
    return [(key, api.min_version, api.max_version) for key, api in sorted(APIS.items())]
