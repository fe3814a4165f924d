"""The controller: topic creation and leader election."""

from __future__ import annotations

from typing import NamedTuple

import structlog

from purgatory_aio import Clock, Purgatory, Timer

from ..errors import ErrorCode
from ..protocol import CreateTopicsRequest, CreateTopicsResponse, TopicSpec
from ..records import TopicPartition
from .config import BrokerConfig
from .delayed_create_topics import DelayedCreateTopics
from .replica_manager import ReplicaManager

_log = structlog.get_logger("minikafka.controller")


class TopicKey(NamedTuple):
    """Watch key of a topic being created."""

    topic: str

    def __str__(self) -> str:
        return f"topic:{self.topic}"


class Controller:
    """Creates topics and elects their leaders.

    Creation registers leaderless partitions at once; the elections follow one
    partition after another, ``leader_election_delay`` apart, on the cluster's
    timer, the way a controller works through a queue of state changes. A
    :class:`DelayedCreateTopics` holds the request until all are led.
    """

    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        timer: Timer,
        replicas: ReplicaManager,
        purgatory: Purgatory,
    ) -> None:
        self._config = config
        self._clock = clock
        self._timer = timer
        self._replicas = replicas
        self._purgatory = purgatory
        # Elections are serialised: each new one is queued behind those already scheduled.
        self._next_election = 0.0

    async def create_topics(self, request: CreateTopicsRequest) -> CreateTopicsResponse:
        """Create the topics; with ``request.timeout > 0`` wait until their partitions have
        leaders."""
        errors = {name: self._create(name, spec) for name, spec in request.topics.items()}
        started = [name for name, error in errors.items() if error is ErrorCode.NONE]
        if request.timeout <= 0 or not started:
            return CreateTopicsResponse(errors)
        op = DelayedCreateTopics(request.timeout, errors, self.has_leaders)
        return await self._purgatory.watch_and_wait(op, [TopicKey(name) for name in started])

    def has_leaders(self, topic: str) -> bool:
        partitions = self._replicas.topic_partitions(topic)
        return bool(partitions) and all(p.leader is not None for p in partitions)

    def _create(self, name: str, spec: TopicSpec) -> ErrorCode:
        brokers = self._config.brokers
        if not name or not isinstance(name, str):
            return ErrorCode.INVALID_TOPIC
        if self._replicas.has_topic(name):
            return ErrorCode.TOPIC_ALREADY_EXISTS
        if spec.partitions < 1:
            return ErrorCode.INVALID_PARTITIONS
        if not 1 <= spec.replication_factor <= brokers:
            return ErrorCode.INVALID_REPLICATION_FACTOR
        if spec.max_message_bytes is not None and spec.max_message_bytes < 0:
            return ErrorCode.INVALID_CONFIG
        # Kafka's round-robin placement: partition p starts on broker p and wraps around.
        assignment = [
            tuple((p + i) % brokers for i in range(spec.replication_factor))
            for p in range(spec.partitions)
        ]
        partitions = self._replicas.add_topic(name, assignment, spec.max_message_bytes)
        now = self._clock.time()
        delay = self._config.leader_election_delay
        for partition in partitions:
            self._next_election = max(self._next_election, now) + delay
            self._timer.call_at(self._next_election, self._elect, partition.tp)
        _log.info("topic_created", topic=name, partitions=spec.partitions)
        return ErrorCode.NONE

    def _elect(self, tp: TopicPartition) -> None:
        self._replicas.elect_leader(tp)
        self._purgatory.check_and_complete(TopicKey(tp.topic))
