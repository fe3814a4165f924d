"""Broker settings, scaled down from Kafka's defaults so that effects show within minutes."""

from __future__ import annotations

from dataclasses import dataclass

from ..validation import check_int, check_seconds

#: Kafka's default ``message.max.bytes``: 1 MiB of records plus a batch header.
MESSAGE_MAX_BYTES = 1024 * 1024 + 12


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Cluster-wide broker settings.

    Args:
        brokers: brokers in the cluster; a topic's replication factor cannot exceed it.
        min_insync_replicas: in-sync replicas an ``acks=all`` write needs.
        replica_lag_time_max: seconds a follower may go without catching up to the
            leader's log end before it is dropped from the ISR.
        replica_fetch_wait_max: long-poll time of follower fetches.
        replica_fetch_min_bytes: bytes that end a follower's long poll early.
        replica_fetch_max_bytes: cap on one follower fetch response.
        leader_election_delay: seconds the controller takes to elect each new
            partition's leader (partitions are elected one after another).
        group_min_session_timeout: smallest session timeout a consumer may ask for.
        group_max_session_timeout: largest session timeout a consumer may ask for.
        message_max_bytes: the largest record batch a producer may send (Kafka's
            ``message.max.bytes``); a topic's ``max.message.bytes`` overrides it.
        tick: timing-wheel tick of the broker's purgatories and timer.
        wheel_size: timing-wheel slots per level.
    """

    brokers: int = 3
    min_insync_replicas: int = 1
    replica_lag_time_max: float = 10.0
    replica_fetch_wait_max: float = 0.5
    replica_fetch_min_bytes: int = 1
    replica_fetch_max_bytes: int = 1024 * 1024
    leader_election_delay: float = 0.01
    group_min_session_timeout: float = 1.0
    group_max_session_timeout: float = 300.0
    message_max_bytes: int = MESSAGE_MAX_BYTES
    tick: float = 0.001
    wheel_size: int = 20

    def __post_init__(self) -> None:
        for name in (
            "brokers",
            "min_insync_replicas",
            "replica_fetch_max_bytes",
            "wheel_size",
        ):
            check_int(name, getattr(self, name), 1)
        check_int("replica_fetch_min_bytes", self.replica_fetch_min_bytes, 0)
        check_int("message_max_bytes", self.message_max_bytes, 0)
        for name in (
            "replica_lag_time_max",
            "replica_fetch_wait_max",
            "leader_election_delay",
            "group_min_session_timeout",
            "group_max_session_timeout",
        ):
            check_seconds(name, getattr(self, name))
        check_seconds("tick", self.tick)
        if self.tick <= 0:
            raise ValueError(f"tick must be a positive number of seconds, got {self.tick!r}")
        if self.group_min_session_timeout > self.group_max_session_timeout:
            raise ValueError(
                "group_min_session_timeout must not exceed group_max_session_timeout, got "
                f"{self.group_min_session_timeout!r} > {self.group_max_session_timeout!r}"
            )
