"""Consumer groups over the Kafka protocol: the coordinator's rules request by request, then
unmodified librdkafka, kafka-python and aiokafka consumers sharing a topic's partitions."""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import select
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTopicPartition
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode as E
from minikafka.broker.config import BrokerConfig
from minikafka.wire.codec import build, nested
from minikafka.wire.groups import (
    FIND_COORDINATOR,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    SYNC_GROUP,
)
from minikafka.wire.server import WireConfig, version_table

from .conftest import RunningBroker
from .raw import RawConnection

API_VERSIONS = 18
TOPIC = "events"
PARTITIONS = 4

#: Small enough that an expulsion shows within seconds, and within the broker's bounds.
SESSION_MS = 2000
HEARTBEAT_MS = 300
#: For tests where only LeaveGroup can hand partitions over quickly.
LONG_SESSION = {"session.timeout.ms": 30000, "max.poll.interval.ms": 30000}


@pytest.fixture
def groups_broker() -> Iterator[RunningBroker]:
    running = RunningBroker(
        BrokerConfig(brokers=1), WireConfig(port=0, partitions=PARTITIONS), "asyncio"
    )
    yield running
    running.stop()


@pytest.fixture(params=["asyncio", "uvloop"])
def groups_broker_any_loop(request: pytest.FixtureRequest) -> Iterator[RunningBroker]:
    running = RunningBroker(
        BrokerConfig(brokers=1), WireConfig(port=0, partitions=PARTITIONS), request.param
    )
    yield running
    running.stop()


# -- raw requests ------------------------------------------------------------------------------


class Raw(RawConnection):
    """A raw connection with the group requests."""

    # The group requests, in whichever version (fields a version lacks are left out).

    def join(
        self,
        group: str,
        member: str = "",
        *,
        version: int = 5,
        protocol_type: str = "consumer",
        protocols: tuple[tuple[str, bytes], ...] = (("range", b"meta"),),
        session_ms: int = SESSION_MS,
        rebalance_ms: int = 5000,
        instance: str | None = None,
    ) -> Any:
        schema = load_request_schema(JOIN_GROUP, version)
        item = nested(schema, "protocols")
        return self.call(
            JOIN_GROUP,
            version,
            group_id=group,
            session_timeout=datetime.timedelta(milliseconds=session_ms),
            rebalance_timeout=datetime.timedelta(milliseconds=rebalance_ms),
            member_id=member,
            group_instance_id=instance,
            protocol_type=protocol_type,
            protocols=tuple(item(name=n, metadata=m) for n, m in protocols),
            reason=None,
        )

    def join_new(self, group: str, **kwargs: Any) -> Any:
        """Join with a fresh member ID (JoinGroup v4+ first hands one out)."""
        first = self.join(group, **kwargs)
        if first.error_code is E.member_id_required:
            return self.join(group, first.member_id, **kwargs)
        return first

    def sync(
        self,
        group: str,
        member: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        *,
        version: int = 3,
        protocol_name: str | None = None,
        instance: str | None = None,
    ) -> Any:
        schema = load_request_schema(SYNC_GROUP, version)
        item = nested(schema, "assignments")
        return self.call(
            SYNC_GROUP,
            version,
            group_id=group,
            generation_id=generation,
            member_id=member,
            group_instance_id=instance,
            protocol_type="consumer" if protocol_name else None,
            protocol_name=protocol_name,
            assignments=tuple(
                item(member_id=m, assignment=a) for m, a in (assignments or {}).items()
            ),
        )

    def heartbeat(
        self,
        group: str,
        member: str,
        generation: int,
        *,
        version: int = 1,
        instance: str | None = None,
    ) -> E:
        response = self.call(
            HEARTBEAT,
            version,
            group_id=group,
            generation_id=generation,
            member_id=member,
            group_instance_id=instance,
        )
        error: E = response.error_code
        return error

    def leave(self, group: str, member: str, *, version: int = 1, instance: str | None = None) -> E:
        if version < 3:
            response = self.call(LEAVE_GROUP, version, group_id=group, member_id=member)
            error: E = response.error_code
            return error
        item = nested(load_request_schema(LEAVE_GROUP, version), "members")
        response = self.call(
            LEAVE_GROUP,
            version,
            group_id=group,
            members=(build(item, member_id=member, group_instance_id=instance, reason=None),),
        )
        assert response.error_code is E.none
        error = response.members[0].error_code
        return error

    def commit(
        self,
        group: str,
        member: str,
        generation: int,
        offsets: dict[int, int],
        *,
        topic: str = TOPIC,
        version: int = 3,
        instance: str | None = None,
    ) -> list[E]:
        schema = load_request_schema(OFFSET_COMMIT, version)
        topic_t = nested(schema, "topics")
        partition_t = nested(topic_t, "partitions")
        response = self.call(
            OFFSET_COMMIT,
            version,
            group_id=group,
            generation_id_or_member_epoch=generation,
            member_id=member,
            group_instance_id=instance,
            retention_time=datetime.timedelta(milliseconds=-1),
            topics=(
                topic_t(
                    name=topic,
                    partitions=tuple(
                        build(
                            partition_t,
                            partition_index=p,
                            committed_offset=o,
                            committed_leader_epoch=-1,
                            committed_metadata="m",
                        )
                        for p, o in offsets.items()
                    ),
                ),
            ),
        )
        return [p.error_code for t in response.topics for p in t.partitions]

    def fetch_offsets(
        self, group: str, partitions: list[int] | None, *, version: int = 3
    ) -> dict[int, int]:
        schema = load_request_schema(OFFSET_FETCH, version)
        if version >= 8:
            group_t = nested(schema, "groups")
            topic_t = nested(group_t, "topics")
        else:
            topic_t = nested(schema, "topics")
        topics = (
            None
            if partitions is None
            else (topic_t(name=TOPIC, partition_indexes=tuple(partitions)),)
        )
        if version >= 8:
            response = self.call(
                OFFSET_FETCH,
                version,
                groups=(
                    build(group_t, group_id=group, member_id=None, member_epoch=-1, topics=topics),
                ),
                require_stable=False,
            )
            answer = response.groups[0]
        else:
            response = self.call(
                OFFSET_FETCH, version, group_id=group, topics=topics, require_stable=False
            )
            answer = response
        if version >= 2:
            assert answer.error_code is E.none
        return {
            p.partition_index: p.committed_offset
            for t in answer.topics
            for p in t.partitions
            if p.error_code is E.none
        }


def _connector(broker: RunningBroker) -> Iterator[Callable[[], Raw]]:
    opened: list[Raw] = []

    def connect() -> Raw:
        opened.append(Raw(broker))
        return opened[-1]

    produce(broker, {p: 1 for p in range(PARTITIONS)})  # creates the topic
    yield connect
    for conn in opened:
        conn.close()


@pytest.fixture
def raw(groups_broker: RunningBroker) -> Iterator[Callable[[], Raw]]:
    """Opens raw connections to the broker; all are closed afterwards."""
    yield from _connector(groups_broker)


@pytest.fixture
def raw_any_loop(groups_broker_any_loop: RunningBroker) -> Iterator[Callable[[], Raw]]:
    """The same for the broker on each event loop (for barriers and sessions that expire)."""
    yield from _connector(groups_broker_any_loop)


def produce(broker: RunningBroker, per_partition: dict[int, int], topic: str = TOPIC) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1})
    for partition, count in per_partition.items():
        for i in range(count):
            producer.produce(topic, value=b"%d-%d" % (partition, i), partition=partition)
    assert producer.flush(20) == 0


def await_rebalance(conn: Raw, group: str, member: str, generation: int) -> None:
    """Heartbeat until the coordinator answers that the group is rebalancing."""
    deadline = time.monotonic() + 10
    while conn.heartbeat(group, member, generation) is not E.rebalance_in_progress:
        assert time.monotonic() < deadline, "no rebalance started"
        time.sleep(0.05)


def leader_then_joiner(one: Raw, two: Raw, group: str, **join: Any) -> tuple[str, str]:
    """``one`` leads generation 1 alone, then ``two`` joins: both are in generation 2 and wait
    for the leader's SyncGroup. Their member IDs, leader first."""
    a = one.join_new(group, **join).member_id
    one.sync(group, a, 1, {a: b""})
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(two.join_new, group, **join)
        await_rebalance(one, group, a, 1)
        one.join(group, a, **join)
        return a, waiting.result(10).member_id


# -- the coordinator's rules -------------------------------------------------------------------


def test_api_versions_advertise_the_group_apis(groups_broker: RunningBroker) -> None:
    conn = Raw(groups_broker)
    try:
        response = conn.call(API_VERSIONS, 3, client_software_name="t", client_software_version="1")
    finally:
        conn.close()
    advertised = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert advertised == {key: (lo, hi) for key, lo, hi in version_table()}
    assert advertised[OFFSET_COMMIT] == (2, 9)
    assert advertised[OFFSET_FETCH] == (1, 9)
    assert advertised[FIND_COORDINATOR] == (0, 6)
    assert advertised[JOIN_GROUP] == (0, 9)
    assert advertised[HEARTBEAT] == (0, 4)
    assert advertised[LEAVE_GROUP] == (0, 5)
    assert advertised[SYNC_GROUP] == (0, 5)


@pytest.mark.parametrize("join_version", range(10))
def test_every_advertised_version_runs_a_group_round(
    raw: Callable[[], Raw], groups_broker: RunningBroker, join_version: int
) -> None:
    """One member through FindCoordinator, Join, Sync, Heartbeat, OffsetCommit, OffsetFetch
    and LeaveGroup; the other APIs' versions cycle with the JoinGroup version."""
    conn = raw()
    group = f"round-{join_version}"
    find_version = join_version % 7
    if find_version >= 4:
        found = conn.call(FIND_COORDINATOR, find_version, key_type=0, coordinator_keys=(group,))
        coordinator = found.coordinators[0]
    else:
        coordinator = conn.call(FIND_COORDINATOR, find_version, key=group, key_type=0)
    assert coordinator.error_code is E.none
    assert (coordinator.node_id, coordinator.port) == (0, groups_broker.wire.ports[0])

    first = conn.join(group, version=join_version)
    if join_version >= 4:
        assert first.error_code is E.member_id_required
        assert first.member_id
        joined = conn.join(group, first.member_id, version=join_version)
    else:
        joined = first
    assert joined.error_code is E.none
    member = joined.member_id
    assert joined.generation_id == 1
    assert joined.leader == member
    assert joined.protocol_name == "range"
    assert [(m.member_id, m.metadata) for m in joined.members] == [(member, b"meta")]

    sync_version = join_version % 6
    synced = conn.sync(
        group,
        member,
        1,
        {member: b"assignment"},
        version=sync_version,
        protocol_name="range" if sync_version >= 5 else None,
    )
    assert synced.error_code is E.none
    assert synced.assignment == b"assignment"
    assert conn.heartbeat(group, member, 1, version=join_version % 5) is E.none

    commit_version = 2 + join_version % 8
    assert conn.commit(group, member, 1, {0: 5, 1: 7}, version=commit_version) == [E.none] * 2
    fetch_version = 1 + join_version % 9
    assert conn.fetch_offsets(group, [0, 1, 2], version=fetch_version) == {0: 5, 1: 7, 2: -1}
    if fetch_version >= 2:
        assert conn.fetch_offsets(group, None, version=fetch_version) == {0: 5, 1: 7}
    assert conn.leave(group, member, version=join_version % 6) is E.none
    assert conn.heartbeat(group, member, 1) is E.unknown_member_id


def test_errors_like_kafka(raw: Callable[[], Raw]) -> None:
    conn = raw()
    assert conn.join("g", "nobody").error_code is E.unknown_member_id
    assert conn.join("g", session_ms=100).error_code is E.invalid_session_timeout
    assert conn.join("", version=3).error_code is E.invalid_group_id
    assert conn.join("g", protocols=()).error_code is E.inconsistent_group_protocol
    joined = conn.join_new("g")
    member = joined.member_id
    assert conn.join_new("g", protocol_type="connect").error_code is (E.inconsistent_group_protocol)
    assert conn.join_new("g", protocols=(("sticky", b""),)).error_code is (
        E.inconsistent_group_protocol
    )
    assert conn.sync("g", member, 2).error_code is E.illegal_generation
    assert conn.sync("g", "nobody", 1).error_code is E.unknown_member_id
    assert conn.heartbeat("g", member, 7) is E.illegal_generation
    assert conn.heartbeat("g", "nobody", 1) is E.unknown_member_id
    assert conn.heartbeat("unknown-group", member, 1) is E.unknown_member_id
    # Between JoinGroup and the leader's SyncGroup a commit must wait for the assignment.
    assert conn.commit("g", member, 1, {0: 1}) == [E.rebalance_in_progress]
    assert conn.sync("g", member, 1, {member: b"a"}).error_code is E.none
    assert conn.commit("g", member, 0, {0: 1}) == [E.illegal_generation]
    assert conn.commit("g", "nobody", 1, {0: 1}) == [E.unknown_member_id]
    assert conn.commit("g", member, 1, {0: 1}, topic="no-such-topic") == [
        E.unknown_topic_or_partition
    ]
    assert conn.commit("never-joined", "", 3, {0: 1}) == [E.illegal_generation]
    # An assign() consumer (no member, generation -1) stores offsets in an empty group.
    assert conn.commit("standalone", "", -1, {0: 4}) == [E.none]
    assert conn.fetch_offsets("standalone", [0]) == {0: 4}
    # Transactional ids are located (InitProducerId then refuses them at once).
    txn = conn.call(FIND_COORDINATOR, 3, key="txn", key_type=1)
    assert (txn.error_code, txn.node_id) == (E.none, 0)
    share = conn.call(FIND_COORDINATOR, 6, key_type=2, coordinator_keys=("s",))
    assert share.coordinators[0].error_code is E.coordinator_not_available
    assert conn.leave("g", "nobody") is E.unknown_member_id


def test_a_new_member_rebalances_the_group_and_offsets_survive(raw: Callable[[], Raw]) -> None:
    leader, newcomer = raw(), raw()
    first = leader.join_new("r")
    a = first.member_id
    assert leader.sync("r", a, 1, {a: b"all"}).assignment == b"all"
    assert leader.commit("r", a, 1, {0: 3, 1: 9}) == [E.none, E.none]

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(newcomer.join_new, "r", protocols=(("range", b"b"),))
        # The join barrier holds the newcomer until the old member rejoins.
        await_rebalance(leader, "r", a, 1)
        assert not waiting.done()
        # Commits of the ending generation are still accepted while the group rebalances.
        assert leader.commit("r", a, 1, {0: 4}) == [E.none]
        rejoined = leader.join("r", a)
        b_join = waiting.result(10)
    assert rejoined.error_code is b_join.error_code is E.none
    assert rejoined.generation_id == b_join.generation_id == 2
    assert rejoined.leader == b_join.leader == a
    assert {m.member_id: m.metadata for m in rejoined.members} == {
        a: b"meta",
        b_join.member_id: b"b",
    }
    assert b_join.members == ()
    assert leader.fetch_offsets("r", [0, 1]) == {0: 4, 1: 9}


def test_same_protocols_rejoin_gets_the_current_generation_back(raw: Callable[[], Raw]) -> None:
    """Kafka's rule against endless rebalances: a member that rejoins with unchanged protocols
    while the group waits for SyncGroup, or a follower that does so in a stable group,
    gets the current generation again."""
    one, two = raw(), raw()
    a, b = leader_then_joiner(one, two, "same")
    again = two.join("same", b)  # waiting for the leader's SyncGroup
    assert (again.error_code, again.generation_id, again.leader) == (E.none, 2, a)
    assert one.sync("same", a, 2, {a: b"x", b: b"y"}).assignment == b"x"
    assert two.sync("same", b, 2).assignment == b"y"
    stable = two.join("same", b)  # a follower, stable group
    assert (stable.error_code, stable.generation_id) == (E.none, 2)
    assert one.heartbeat("same", a, 2) is E.none
    # New protocol metadata does start a rebalance.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        changed = pool.submit(two.join, "same", b, protocols=(("range", b"changed"),))
        await_rebalance(one, "same", a, 2)
        assert one.join("same", a).generation_id == 3
        assert changed.result(10).generation_id == 3


def test_sync_barrier_holds_followers_until_the_leader_assigns(raw: Callable[[], Raw]) -> None:
    one, two = raw(), raw()
    a, b = leader_then_joiner(one, two, "sync")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        follower = pool.submit(two.sync, "sync", b, 2)
        time.sleep(0.3)
        assert not follower.done(), "the follower waits in the sync barrier"
        assert one.sync("sync", a, 2, {a: b"pa", b: b"pb"}).assignment == b"pa"
        assert follower.result(10).assignment == b"pb"


def test_sync_barrier_times_out_without_the_leader(raw_any_loop: Callable[[], Raw]) -> None:
    """The leader never sends SyncGroup: at the rebalance timeout the waiting follower is told
    to rejoin and the leader is removed."""
    one, two = raw_any_loop(), raw_any_loop()
    a, b = leader_then_joiner(one, two, "lost", rebalance_ms=1000)
    assert two.sync("lost", b, 2).error_code is E.rebalance_in_progress
    assert one.heartbeat("lost", a, 2) is E.unknown_member_id
    alone = two.join("lost", b, rebalance_ms=1000)
    assert (alone.error_code, alone.generation_id, alone.leader) == (E.none, 3, b)


def test_a_silent_member_expires_after_its_session_timeout(
    raw_any_loop: Callable[[], Raw], groups_broker_any_loop: RunningBroker
) -> None:
    """Even one whose last sign of life was a commit, not a heartbeat."""
    conn = raw_any_loop()
    member = conn.join_new("quiet", session_ms=1000).member_id
    conn.sync("quiet", member, 1, {member: b""})
    assert conn.commit("quiet", member, 1, {0: 1}) == [E.none]
    group = groups_broker_any_loop.wire.groups.groups["quiet"]
    deadline = time.monotonic() + 10
    while member in group.members:
        assert time.monotonic() < deadline, "the session never expired"
        time.sleep(0.05)
    assert conn.heartbeat("quiet", member, 1) is E.unknown_member_id
    assert conn.fetch_offsets("quiet", [0]) == {0: 1}


def test_group_requests_to_another_broker_get_not_coordinator() -> None:
    broker = RunningBroker(BrokerConfig(brokers=3), WireConfig(port=0), "asyncio")
    try:
        conn = Raw(broker)  # connected to broker 0
        group = next(g for g in (f"g{i}" for i in range(100)) if zlib.crc32(g.encode()) % 3)
        found = conn.call(FIND_COORDINATOR, 3, key=group, key_type=0)
        assert found.error_code is E.none
        assert (found.node_id, found.port) == (
            zlib.crc32(group.encode()) % 3,
            broker.wire.ports[found.node_id],
        )
        assert conn.join(group).error_code is E.not_coordinator
        assert conn.heartbeat(group, "m", 1) is E.not_coordinator
        assert conn.commit(group, "m", 1, {0: 1}) == [E.not_coordinator]
        conn.close()
    finally:
        broker.stop()


def test_stopping_the_broker_releases_a_waiting_join() -> None:
    """A JoinGroup held in the join barrier does not hold up shutdown: it is answered
    (COORDINATOR_NOT_AVAILABLE) or its connection closes."""
    broker = RunningBroker(BrokerConfig(brokers=1), WireConfig(port=0), "asyncio")
    stopped = False
    try:
        one, two = Raw(broker), Raw(broker)
        a = one.join_new("stop", rebalance_ms=60000).member_id
        one.sync("stop", a, 1, {a: b""})
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(two.join_new, "stop", rebalance_ms=60000)
            await_rebalance(one, "stop", a, 1)
            broker.stop()
            stopped = True
            try:
                answer = waiting.result(10)
            except (ConnectionError, OSError):
                pass
            else:
                assert answer.error_code is E.coordinator_not_available
        one.close()
        two.close()
    finally:
        if not stopped:
            broker.stop()


# -- real clients ------------------------------------------------------------------------------


def librdkafka_consumer(broker: RunningBroker, group: str, **extra: Any) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "max.poll.interval.ms": 10000,
            **extra,
        }
    )


def partitions_of(consumer: Consumer) -> set[int]:
    return {tp.partition for tp in consumer.assignment()}


def poll_until(
    consumers: list[Consumer],
    done: Callable[[], bool],
    seen: list[dict[int, list[int]]],
    timeout: float = 20,
) -> None:
    """Poll every consumer, recording ``partition -> offsets``, until ``done()``."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        for consumer, record in zip(consumers, seen, strict=True):
            message = consumer.poll(0.05)
            if message is not None and message.error() is None:
                record.setdefault(message.partition(), []).append(message.offset())


def test_librdkafka_group_of_two_splits_partitions_and_leave_rebalances_promptly(
    groups_broker: RunningBroker,
) -> None:
    produce(groups_broker, {p: 5 for p in range(PARTITIONS)})
    # A long session: only LeaveGroup can hand the partitions over quickly.
    one = librdkafka_consumer(groups_broker, "pair", **LONG_SESSION)
    two = librdkafka_consumer(groups_broker, "pair", **LONG_SESSION)
    seen: list[dict[int, list[int]]] = [{}, {}]
    try:
        one.subscribe([TOPIC])
        two.subscribe([TOPIC])
        # (Records read in the first generation, before the second member joined, may be
        # read again by the new owner: nothing was committed yet.)
        poll_until(
            [one, two],
            lambda: all(
                partitions_of(c) and all(4 in record.get(p, ()) for p in partitions_of(c))
                for c, record in zip([one, two], seen, strict=True)
            ),
            seen,
        )
        assert partitions_of(one).isdisjoint(partitions_of(two))
        assert partitions_of(one) | partitions_of(two) == set(range(PARTITIONS))
        # The member that leaves committed part of what it read.
        mine = partitions_of(two)
        two.commit(offsets=[CTopicPartition(TOPIC, p, 3) for p in mine], asynchronous=False)
        two.close()  # sends LeaveGroup
        started = time.monotonic()
        seen[0] = {}
        poll_until(
            [one],
            lambda: (
                partitions_of(one) == set(range(PARTITIONS))
                and all(len(seen[0].get(p, [])) == 2 for p in mine)
            ),
            seen[:1],
        )
        assert time.monotonic() - started < 15, "well before the 30 s session timeout"
        # The new owner resumes at the committed offsets: 3 and 4, nothing lost.
        assert {p: seen[0][p] for p in mine} == {p: [3, 4] for p in mine}
    finally:
        one.close()


VICTIM = r"""
import json, sys, time
from confluent_kafka import Consumer, TopicPartition
conf, topic, commit_at, total = json.loads(sys.argv[1])
consumer = Consumer(conf)
consumer.subscribe([topic])
counts = {}
deadline = time.monotonic() + 60
reported = False
while time.monotonic() < deadline:
    message = consumer.poll(0.05)
    if message is not None and message.error() is None:
        counts[message.partition()] = counts.get(message.partition(), 0) + 1
    mine = sorted(tp.partition for tp in consumer.assignment())
    if not reported and mine and all(counts.get(p, 0) == total for p in mine):
        consumer.commit(
            offsets=[TopicPartition(topic, p, commit_at) for p in mine], asynchronous=False
        )
        print(json.dumps(mine), flush=True)
        reported = True
"""


def test_librdkafka_member_killed_is_expelled_after_session_timeout(
    groups_broker_any_loop: RunningBroker,
) -> None:
    """A member killed without leaving: after session.timeout.ms (a DelayedHeartbeat expiring)
    the survivor owns every partition and resumes the dead one's at its committed offsets."""
    broker = groups_broker_any_loop
    produce(broker, {p: 4 for p in range(PARTITIONS)})
    survivor = librdkafka_consumer(broker, "crash")
    survivor.subscribe([TOPIC])
    seen: list[dict[int, list[int]]] = [{}]
    conf = {
        "bootstrap.servers": broker.bootstrap,
        "group.id": "crash",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": HEARTBEAT_MS,
        "max.poll.interval.ms": 10000,
    }
    victim = subprocess.Popen(
        [sys.executable, "-c", VICTIM, json.dumps([conf, TOPIC, 1, 4])],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert victim.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while not line:
            assert time.monotonic() < deadline, "the victim never reported its partitions"
            survivor.poll(0.05)
            if select.select([victim.stdout], [], [], 0)[0]:
                line = victim.stdout.readline()
                assert line, "the victim exited"
        theirs = set(json.loads(line))
        poll_until(
            [survivor], lambda: partitions_of(survivor) == set(range(PARTITIONS)) - theirs, seen
        )
        assert theirs and partitions_of(survivor) == set(range(PARTITIONS)) - theirs

        victim.kill()  # SIGKILL: no LeaveGroup, the session just stops
        victim.wait(10)
        killed = time.monotonic()
        seen[0] = {}
        poll_until(
            [survivor],
            lambda: (
                partitions_of(survivor) == set(range(PARTITIONS))
                and all(len(seen[0].get(p, [])) == 3 for p in theirs)
            ),
            seen,
        )
        # Not before the session ran out (less one heartbeat interval the victim had sent).
        assert time.monotonic() - killed >= (SESSION_MS - HEARTBEAT_MS) / 1000 - 0.2
        # Resumed at the committed offset 1: offsets 1..3 of each partition, none lost.
        assert {p: seen[0][p] for p in theirs} == {p: [1, 2, 3] for p in theirs}
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(10)
        survivor.close()


def test_kafka_python_and_librdkafka_share_a_group(groups_broker: RunningBroker) -> None:
    """A mixed group agrees on a protocol both support and settles (no endless rebalance)."""
    kafka = pytest.importorskip("kafka")
    produce(groups_broker, {p: 3 for p in range(PARTITIONS)})
    rd = librdkafka_consumer(groups_broker, "mixed")
    rd.subscribe([TOPIC])
    kp = kafka.KafkaConsumer(
        TOPIC,
        bootstrap_servers=groups_broker.bootstrap,
        group_id="mixed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
    )
    seen: list[set[tuple[int, int]]] = [set(), set()]
    try:
        deadline = time.monotonic() + 30
        while not (
            partitions_of(rd)
            and kp.assignment()
            and all((p, 2) in seen[0] for p in partitions_of(rd))
            and all((tp.partition, 2) in seen[1] for tp in kp.assignment())
        ):
            assert time.monotonic() < deadline, "timed out"
            message = rd.poll(0.05)
            if message is not None and message.error() is None:
                seen[0].add((message.partition(), message.offset()))
            for tp, records in kp.poll(timeout_ms=50).items():
                seen[1].update((tp.partition, r.offset) for r in records)
        kp_partitions = {tp.partition for tp in kp.assignment()}
        assert partitions_of(rd).isdisjoint(kp_partitions)
        assert partitions_of(rd) | kp_partitions == set(range(PARTITIONS))
        generation = groups_broker.wire.groups.groups["mixed"].generation
        # A few more heartbeats: the generation stays put.
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            rd.poll(0.05)
            kp.poll(timeout_ms=50)
        assert groups_broker.wire.groups.groups["mixed"].generation == generation
    finally:
        kp.close()
        rd.close()


def test_kafka_python_group_takes_over_after_close(groups_broker: RunningBroker) -> None:
    kafka = pytest.importorskip("kafka")
    produce(groups_broker, {p: 3 for p in range(PARTITIONS)})

    def consumer() -> Any:
        return kafka.KafkaConsumer(
            TOPIC,
            bootstrap_servers=groups_broker.bootstrap,
            group_id="kp",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=30000,
            heartbeat_interval_ms=HEARTBEAT_MS,
        )

    one, two = consumer(), consumer()
    got: list[dict[int, list[int]]] = [{}, {}]

    def poll(which: list[Any]) -> None:
        for i, c in enumerate(which):
            for tp, records in c.poll(timeout_ms=50).items():
                got[i].setdefault(tp.partition, []).extend(r.offset for r in records)

    try:
        deadline = time.monotonic() + 30
        while not (
            one.assignment()
            and two.assignment()
            and all(
                2 in got[i].get(tp.partition, ())
                for i, c in enumerate([one, two])
                for tp in c.assignment()
            )
        ):
            assert time.monotonic() < deadline, "timed out"
            poll([one, two])
        mine = {tp.partition for tp in two.assignment()}
        assert {tp.partition for tp in one.assignment()}.isdisjoint(mine)
        assert mine | {tp.partition for tp in one.assignment()} == set(range(PARTITIONS))
        tps = {kafka.TopicPartition(TOPIC, p) for p in mine}
        two.commit({tp: kafka.OffsetAndMetadata(2, "", -1) for tp in tps})
        two.close()  # LeaveGroup
        got[0] = {}
        while not (len(one.assignment()) == PARTITIONS and all(got[0].get(p) == [2] for p in mine)):
            assert time.monotonic() < deadline, "timed out"
            poll([one])
    finally:
        one.close()


def test_aiokafka_group_of_two_splits_partitions(groups_broker: RunningBroker) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer

    produce(groups_broker, {p: 3 for p in range(PARTITIONS)})

    async def run() -> list[set[int]]:
        consumers = [
            AIOKafkaConsumer(
                TOPIC,
                bootstrap_servers=groups_broker.bootstrap,
                group_id="aio",
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=HEARTBEAT_MS,
            )
            for _ in range(2)
        ]
        for c in consumers:
            await c.start()
        try:
            seen: list[set[tuple[int, int]]] = [set(), set()]
            deadline = time.monotonic() + 30
            while not all(
                c.assignment() and all((tp.partition, 2) in got for tp in c.assignment())
                for c, got in zip(consumers, seen, strict=True)
            ):
                assert time.monotonic() < deadline, "timed out"
                for c, got in zip(consumers, seen, strict=True):
                    batch = await c.getmany(timeout_ms=50)
                    got.update((tp.partition, r.offset) for tp, rs in batch.items() for r in rs)
            return [{tp.partition for tp in c.assignment()} for c in consumers]
        finally:
            for c in consumers:
                await c.stop()

    first, second = asyncio.run(asyncio.wait_for(run(), 60))
    assert first.isdisjoint(second) and first | second == set(range(PARTITIONS))


# -- static members (KIP-345) --------------------------------------------------------------------


def test_a_static_member_back_without_its_member_id_takes_its_place_without_a_rebalance(
    raw: Callable[[], Raw],
) -> None:
    first, other, restarted = raw(), raw(), raw()
    joined = first.join("s", version=5, instance="box-1")  # no MEMBER_ID_REQUIRED round
    a = joined.member_id
    assert first.sync("s", a, 1, {a: b"all"}, instance="box-1").assignment == b"all"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(other.join_new, "s", version=5)
        await_rebalance(first, "s", a, 1)
        a_join = first.join("s", a, version=5, instance="box-1")
        b = waiting.result(10).member_id
    generation = a_join.generation_id
    assert a_join.leader == a
    assert first.sync("s", a, generation, {a: b"p0", b: b"p1"}, instance="box-1").assignment == (
        b"p0"
    )
    assert other.sync("s", b, generation).assignment == b"p1"
    # box-1 restarts: a new member ID, the same generation and assignment, and the old
    # leader ID answered so that it does not assign again.
    again = restarted.join("s", version=5, instance="box-1")
    assert again.error_code is E.none
    assert again.generation_id == generation and again.leader == a and again.members == ()
    new = again.member_id
    assert new != a
    synced = restarted.sync("s", new, generation, instance="box-1")
    assert (synced.error_code, synced.assignment) == (E.none, b"p0")
    assert other.heartbeat("s", b, generation) is E.none  # nobody else rebalances
    assert restarted.heartbeat("s", new, generation, version=3, instance="box-1") is E.none
    # The old process is fenced wherever it shows up with its instance ID.
    fenced = E.fenced_instance_id
    assert first.heartbeat("s", a, generation, version=3, instance="box-1") is fenced
    assert first.sync("s", a, generation, instance="box-1").error_code is fenced
    assert first.join("s", a, version=5, instance="box-1").error_code is fenced
    assert first.leave("s", a, version=3, instance="box-1") is fenced
    assert first.commit("s", a, generation, {0: 1}, version=7, instance="box-1") == [fenced]
    assert first.heartbeat("s", a, generation) is E.unknown_member_id
    # LeaveGroup by instance ID alone removes the member; the others rebalance then.
    assert first.leave("s", "", version=3, instance="box-1") is E.none
    assert restarted.heartbeat("s", new, generation, version=3, instance="box-1") is (
        E.unknown_member_id
    )
    assert other.heartbeat("s", b, generation) is E.rebalance_in_progress
    assert first.leave("s", "", version=3, instance="box-1") is E.unknown_member_id


@pytest.mark.parametrize("instance", ["", "x" * 250, "has space", "slash/no", "\u00e9t\u00e9"])
def test_absurd_instance_ids_are_invalid_requests_and_the_broker_goes_on(
    raw: Callable[[], Raw], instance: str
) -> None:
    refused = raw().join("odd", version=5, instance=instance)
    assert refused.error_code is E.invalid_request
    assert raw().join_new("odd", version=5).error_code is E.none


def _stable_pair(
    raw: Callable[[], Raw], group: str, protocols: tuple[tuple[str, bytes], ...]
) -> tuple[Raw, Raw, str, str, int]:
    """A static member (box-1) and a dynamic one, synced in a stable generation."""
    first, other = raw(), raw()
    a = first.join(group, version=5, instance="box-1", protocols=protocols).member_id
    assert first.sync(group, a, 1, {a: b"all"}, instance="box-1").assignment == b"all"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(other.join_new, group, version=5, protocols=protocols)
        await_rebalance(first, group, a, 1)
        a_join = first.join(group, a, version=5, instance="box-1", protocols=protocols)
        b = waiting.result(10).member_id
    generation = a_join.generation_id
    first.sync(group, a, generation, {a: b"p0", b: b"p1"}, instance="box-1")
    assert other.sync(group, b, generation).assignment == b"p1"
    return first, other, a, b, generation


def test_a_cooperative_sticky_static_member_restarting_rebalances_nobody(
    raw: Callable[[], Raw],
) -> None:
    """Its subscription's metadata lists the partitions it owned (none after a restart):
    new metadata under the same chosen protocol keeps the group stable, as in Kafka."""
    owned = (("cooperative-sticky", b"owned: p0"),)
    _, other, _, b, generation = _stable_pair(raw, "coop", owned)
    restarted = raw()
    again = restarted.join("coop", version=5, instance="box-1", protocols=(
        ("cooperative-sticky", b"owned: none"),
    ))  # fmt: skip
    assert (again.error_code, again.generation_id) == (E.none, generation)
    synced = restarted.sync("coop", again.member_id, generation, instance="box-1")
    assert (synced.error_code, synced.assignment) == (E.none, b"p0")
    assert other.heartbeat("coop", b, generation) is E.none  # nobody else rebalances


def test_a_static_member_back_with_another_chosen_protocol_rebalances_the_group(
    raw: Callable[[], Raw],
) -> None:
    both = (("cooperative-sticky", b"m"), ("range", b"m"))
    _, other, _, b, generation = _stable_pair(raw, "switch", both)
    restarted = raw()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        rejoining = pool.submit(
            restarted.join, "switch", version=5, instance="box-1", protocols=(("range", b"m"),)
        )
        await_rebalance(other, "switch", b, generation)
        other.join("switch", b, version=5, protocols=both)
        assert rejoining.result(10).generation_id == generation + 1
