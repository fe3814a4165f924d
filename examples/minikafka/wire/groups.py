"""Consumer groups for real Kafka clients: the group coordinator of the wire protocol.

The simulator's :class:`~minikafka.broker.group_coordinator.GroupCoordinator` assigns
partitions itself inside JoinGroup. Real clients do that on their side (Kafka's "classic"
group protocol): the coordinator keeps each member's opaque protocol metadata, picks a
protocol every member supports, elects a leader, hands the leader everyone's metadata,
and holds a SyncGroup barrier until the leader sends back the assignments. That is a
different state machine (a third state, a second barrier, pending member IDs), so it lives
here, beside the wire handlers, built the same way as the simulator's and on the same
purgatories of the :class:`~minikafka.broker.Cluster`:

* :class:`DelayedJoin` (``join`` purgatory): the join barrier of a rebalance; completes
  when every member has rejoined, or at the largest rebalance timeout, dropping the
  members still missing;
* :class:`DelayedSync` (``join`` purgatory): the SyncGroup barrier; completes when the
  leader's assignments arrive, or at the rebalance timeout, which removes the members that
  never synced and starts another rebalance;
* :class:`DelayedHeartbeat` (``heartbeat`` purgatory): a member's session; expires after
  ``session.timeout.ms`` without a sign of life and removes the member.

Committed offsets belong to the group and outlive its rebalances.

Static members (KIP-345) name themselves with a ``group.instance.id``. Such a member
that comes back within its session (a restart: it sends no LeaveGroup) takes over its
old member's place and assignment under a new member ID, without a rebalance of the
others; whoever still uses the old member ID is fenced (``FENCED_INSTANCE_ID``). It
leaves by LeaveGroup naming its instance ID, or when its session expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import re
import uuid
import zlib
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import structlog
from kio.schema.errors import ErrorCode as E

from purgatory_aio import DelayedOperation, Purgatory, PurgatoryClosed

from ..broker import Cluster
from ..broker.config import BrokerConfig
from ..broker.delayed_heartbeat import DelayedHeartbeat
from ..records import TopicPartition
from .codec import build, nested, response_schema, seconds

if TYPE_CHECKING:
    from .server import Connection

_log = structlog.get_logger("minikafka.wire.groups")

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14

#: Kafka's ``offset.metadata.max.bytes``.
MAX_OFFSET_METADATA = 4096
#: A ``group.instance.id`` follows Kafka's rules for names (those of topics).
_INSTANCE_ID = re.compile(r"[A-Za-z0-9._-]{1,249}")
_NO_THROTTLE = datetime.timedelta(0)

Protocols = tuple[tuple[str, bytes], ...]


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


@dataclass(frozen=True, slots=True)
class WireGroupKey:
    """Watch key of a group's barriers (``kind`` is ``join`` or ``sync``) or of a member's
    session (``kind`` ``session``). A class of its own, so that it never equals a key of
    the simulator's coordinator, which shares the purgatories."""

    kind: str
    group_id: str
    member_id: str = ""

    def __str__(self) -> str:
        suffix = f"/{self.member_id}" if self.member_id else ""
        return f"wire-{self.kind}:{self.group_id}{suffix}"


@dataclass(frozen=True, slots=True)
class JoinResult:
    """What a JoinGroup request is answered with, whatever its version."""

    error: E
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    #: ``(member_id, group_instance_id, metadata)``: for the leader only.
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: E
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True, eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    session_timeout: float
    rebalance_timeout: float
    protocol_type: str
    protocols: Protocols
    last_heartbeat: float
    assignment: bytes = b""
    join_waiter: asyncio.Future[JoinResult] | None = None
    sync_waiter: asyncio.Future[SyncResult] | None = None
    #: The generation this member last sent SyncGroup for.
    synced_generation: int = -1
    removed: bool = False

    def metadata_for(self, protocol: str) -> bytes:
        return next((meta for name, meta in self.protocols if name == protocol), b"")

    def awaiting(self) -> bool:
        return self.join_waiter is not None or self.sync_waiter is not None


@dataclass(slots=True, eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    #: In join order: with no leader left, the oldest member leads.
    members: dict[str, Member] = field(default_factory=dict)
    #: Member IDs handed out with MEMBER_ID_REQUIRED, not yet used to join.
    pending: dict[str, Member] = field(default_factory=dict)
    #: ``group.instance.id -> member ID`` of the static members.
    static: dict[str, str] = field(default_factory=dict)
    #: ``(topic, partition) -> (offset, leader_epoch, metadata)``.
    offsets: dict[tuple[str, int], tuple[int, int, str | None]] = field(default_factory=dict)

    def all_joined(self) -> bool:
        return not self.pending and all(m.join_waiter is not None for m in self.members.values())

    def rebalance_timeout(self) -> float:
        return max((m.rebalance_timeout for m in self.members.values()), default=0.0)

    def supports(self, protocol_type: str, names: set[str]) -> bool:
        """Could a member with these protocols join (Kafka's ``supportsProtocols``)?"""
        if not protocol_type or not names:
            return False
        if not self.members:
            return True
        return protocol_type == self.protocol_type and bool(names & self.candidates())

    def candidates(self) -> set[str]:
        """The protocols every member supports."""
        common: set[str] | None = None
        for member in self.members.values():
            names = {name for name, _ in member.protocols}
            common = names if common is None else common & names
        return common or set()

    def select_protocol(self) -> str:
        """Each member votes for its most preferred common protocol; the most votes win."""
        candidates = self.candidates()
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = next(name for name, _ in member.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])


# -- delayed operations ------------------------------------------------------------------------


class DelayedJoin(DelayedOperation[None]):
    """The join barrier: every member rejoined (and no handed-out member ID is still
    unused), or the rebalance timeout passed. Either way the next generation starts,
    without the members that did not rejoin."""

    __slots__ = ("_coordinator", "_group")

    def __init__(self, timeout: float, coordinator: WireGroupCoordinator, group: Group) -> None:
        super().__init__(timeout)
        self._coordinator = coordinator
        self._group = group

    def try_complete(self) -> bool:
        return self._group.all_joined() and self.force_complete()

    async def on_complete(self) -> None:
        # Async: it watches the next barrier and the members' sessions.
        await self._coordinator.complete_join(self._group)


class DelayedSync(DelayedOperation[None]):
    """The SyncGroup barrier of one generation: the leader's assignments arrived (or the
    generation is over); at the rebalance timeout, the members that never synced are
    removed and the group rebalances."""

    __slots__ = ("_coordinator", "_generation", "_group", "_missing")

    def __init__(
        self, timeout: float, coordinator: WireGroupCoordinator, group: Group, generation: int
    ) -> None:
        super().__init__(timeout)
        self._coordinator = coordinator
        self._group = group
        self._generation = generation
        self._missing: list[Member] = []

    def try_complete(self) -> bool:
        group = self._group
        done = group.generation != self._generation or (
            group.state is not GroupState.COMPLETING_REBALANCE
        )
        return done and self.force_complete()

    def on_complete(self) -> None:
        self._missing = self._coordinator.complete_sync(self._group, self._generation)

    async def on_expiration(self) -> None:
        await self._coordinator.sync_expired(self._group, self._missing)


# -- the coordinator ---------------------------------------------------------------------------


class WireGroupCoordinator:
    """Every consumer group of a :class:`~minikafka.wire.server.WireCluster`.

    Args:
        cluster: whose clock and ``join``/``heartbeat`` purgatories the groups use.
        config: the session timeout bounds (``group_min/max_session_timeout``).
    """

    def __init__(self, cluster: Cluster, config: BrokerConfig) -> None:
        self._cluster = cluster
        self._config = config
        self._clock = cluster.clock
        self._join: Purgatory = cluster.purgatories["join"]
        self._heartbeat: Purgatory = cluster.purgatories["heartbeat"]
        self.groups: dict[str, Group] = {}

    @property
    def closing(self) -> bool:
        return self._cluster.closed

    def coordinator_node(self, group_id: str, brokers: int) -> int:
        """The broker that coordinates ``group_id`` (a stable hash, like Kafka's partition
        of ``__consumer_offsets``)."""
        return zlib.crc32(group_id.encode()) % max(1, brokers)

    # -- requests ------------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        *,
        group_instance_id: str | None,
        session_timeout: float,
        rebalance_timeout: float,
        protocol_type: str,
        protocols: Protocols,
        require_known_member_id: bool,
    ) -> JoinResult:
        if not group_id:
            return JoinResult(E.invalid_group_id, member_id)
        if group_instance_id is not None and not _INSTANCE_ID.fullmatch(group_instance_id):
            return JoinResult(E.invalid_request, member_id)
        low, high = self._config.group_min_session_timeout, self._config.group_max_session_timeout
        if not low <= session_timeout <= high:
            return JoinResult(E.invalid_session_timeout, member_id)
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        now = self._clock.time()
        names = {name for name, _ in protocols}
        static_id = None if group_instance_id is None else group.static.get(group_instance_id)

        if not member_id and static_id is not None:
            if not group.supports(protocol_type, names):
                return JoinResult(E.inconsistent_group_protocol, member_id)
            return await self._replace_static(
                group,
                group.members[static_id],
                session_timeout=session_timeout,
                rebalance_timeout=rebalance_timeout,
                protocols=protocols,
            )
        if member_id and group_instance_id is not None and static_id != member_id:
            # Another process with this instance ID took the place over (or it never had
            # one): this one must stop.
            return JoinResult(
                E.fenced_instance_id if static_id is not None else E.unknown_member_id, member_id
            )

        if not member_id or member_id in group.pending:
            if not group.supports(protocol_type, names):
                return JoinResult(E.inconsistent_group_protocol, member_id)
            first_join = not member_id
            if first_join:
                member_id = f"member-{uuid.uuid4()}"
            member = Member(
                member_id,
                group_instance_id,
                session_timeout,
                rebalance_timeout,
                protocol_type,
                protocols,
                now,
            )
            if first_join and require_known_member_id and group_instance_id is None:
                # JoinGroup v4+: the client must come back with this ID (so that a
                # retried first join cannot leave a ghost member behind).
                group.pending[member_id] = member
                await self._schedule_session(group, member)
                return JoinResult(E.member_id_required, member_id)
            pending_member = group.pending.pop(member_id, None)
            if pending_member is not None:
                pending_member.removed = True
                self._heartbeat.check_and_complete(self._session_key(group, pending_member))
            if not group.members:
                group.protocol_type = protocol_type
            group.members[member_id] = member
            if group_instance_id is not None:
                group.static[group_instance_id] = member_id
            return await self._wait_join(group, member, f"{member_id} joined")

        member_or_none = group.members.get(member_id)
        if member_or_none is None:
            return JoinResult(E.unknown_member_id, member_id)
        member = member_or_none
        if protocol_type != group.protocol_type or not self._candidates_with(group, member, names):
            return JoinResult(E.inconsistent_group_protocol, member_id)
        same = member.protocols == protocols
        if same and (
            group.state is GroupState.COMPLETING_REBALANCE
            or (group.state is GroupState.STABLE and member_id != group.leader_id)
        ):
            # The member lost our answer (or a follower rejoins without a change): give it
            # the current generation again instead of starting a rebalance, or groups of
            # clients that rejoin eagerly would rebalance forever.
            member.last_heartbeat = now
            return self._join_result(group, member)
        member.protocols = protocols
        member.session_timeout = session_timeout
        member.rebalance_timeout = rebalance_timeout
        return await self._wait_join(group, member, f"{member_id} rejoined")

    async def sync(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        *,
        group_instance_id: str | None = None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> SyncResult:
        group = self.groups.get(group_id)
        if group is not None and self._fenced(group, member_id, group_instance_id):
            return SyncResult(E.fenced_instance_id)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            return SyncResult(E.unknown_member_id)
        if generation != group.generation:
            return SyncResult(E.illegal_generation)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return SyncResult(E.inconsistent_group_protocol)
        if group.state is GroupState.EMPTY:
            return SyncResult(E.unknown_member_id)
        if group.state is GroupState.PREPARING_REBALANCE:
            return SyncResult(E.rebalance_in_progress)
        member.last_heartbeat = self._clock.time()
        if group.state is GroupState.STABLE:
            return SyncResult(E.none, member.assignment, group.protocol_type, group.protocol_name)
        member.synced_generation = generation
        waiter = member.sync_waiter
        if waiter is None or waiter.done():
            waiter = member.sync_waiter = asyncio.get_running_loop().create_future()
        if member_id == group.leader_id:
            for each in group.members.values():
                each.assignment = assignments.get(each.member_id, b"")
            group.state = GroupState.STABLE
            _log.info(
                "group_stable",
                group=group_id,
                generation=group.generation,
                protocol=group.protocol_name,
                members=len(group.members),
            )
            self._join.check_and_complete(self._sync_key(group))
        return await asyncio.shield(waiter)

    async def heartbeat(
        self, group_id: str, member_id: str, generation: int, group_instance_id: str | None = None
    ) -> E:
        group = self.groups.get(group_id)
        if group is not None and self._fenced(group, member_id, group_instance_id):
            return E.fenced_instance_id
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None or group.state is GroupState.EMPTY:
            return E.unknown_member_id
        if generation != group.generation:
            return E.illegal_generation
        member.last_heartbeat = self._clock.time()
        await self._schedule_session(group, member)
        if group.state is GroupState.PREPARING_REBALANCE:
            return E.rebalance_in_progress
        return E.none

    async def leave(self, group_id: str, leaving: list[tuple[str, str | None]]) -> list[E]:
        """Remove members named by ``(member_id, group_instance_id)``; a static member may
        be named by its instance ID alone (an empty member ID)."""
        group = self.groups.get(group_id)
        errors: list[E] = []
        for member_id, instance_id in leaving:
            if group is not None and member_id and self._fenced(group, member_id, instance_id):
                errors.append(E.fenced_instance_id)
                continue
            if group is not None and not member_id and instance_id is not None:
                member_id = group.static.get(instance_id, "")
            member = None if group is None else group.members.get(member_id)
            if group is None or member is None:
                errors.append(E.unknown_member_id)
                continue
            await self._remove_member(group, member, "left the group")
            errors.append(E.none)
        return errors

    def commit_check(
        self, group_id: str, member_id: str, generation: int, group_instance_id: str | None = None
    ) -> E:
        """May this member commit now? (Creates the group of an ``assign()`` consumer.)"""
        group = self.groups.get(group_id)
        if group is not None and self._fenced(group, member_id, group_instance_id):
            return E.fenced_instance_id
        if group is None:
            if generation >= 0:
                return E.illegal_generation
            self.groups[group_id] = Group(group_id)
            return E.none
        if generation < 0 and group.state is GroupState.EMPTY:
            return E.none
        member = group.members.get(member_id)
        if member is None:
            return E.unknown_member_id
        if generation != group.generation:
            return E.illegal_generation
        if group.state is GroupState.COMPLETING_REBALANCE:
            return E.rebalance_in_progress
        member.last_heartbeat = self._clock.time()
        return E.none

    def store_offset(
        self, group_id: str, tp: tuple[str, int], offset: int, epoch: int, metadata: str | None
    ) -> None:
        self.groups[group_id].offsets[tp] = (offset, epoch, metadata)

    def committed(self, group_id: str) -> dict[tuple[str, int], tuple[int, int, str | None]]:
        group = self.groups.get(group_id)
        return {} if group is None else group.offsets

    # -- called by the delayed operations ------------------------------------------------------

    def member_alive(self, member: Member, expires_at: float) -> bool:
        return (
            member.removed
            or member.awaiting()
            or member.last_heartbeat + member.session_timeout > expires_at
        )

    async def session_expired(self, group: Group, member: Member, expires_at: float) -> None:
        if self.closing or member.removed:
            return
        if self.member_alive(member, expires_at):
            # Alive by a sign other than a heartbeat (a commit, a SyncGroup, waiting in a
            # barrier): the session goes on from there.
            await self._schedule_session(group, member)
            return
        if group.pending.get(member.member_id) is member:
            del group.pending[member.member_id]
            member.removed = True
            if group.state is GroupState.PREPARING_REBALANCE:
                self._join.check_and_complete(self._join_key(group))
            return
        await self._remove_member(group, member, "session timed out")

    async def complete_join(self, group: Group) -> None:
        """For :class:`DelayedJoin`: start the next generation with the members that rejoined."""
        if self.closing:
            self._fail_waiters(group, E.coordinator_not_available)
            return
        for member in [m for m in group.members.values() if m.join_waiter is None]:
            self._drop(group, member, "missed the join barrier")
        group.generation += 1
        if not group.members:
            group.state = GroupState.EMPTY
            group.protocol_name = None
            group.protocol_type = None
            group.leader_id = ""
            _log.info("group_empty", group=group.group_id, generation=group.generation)
            return
        group.protocol_name = group.select_protocol()
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.state = GroupState.COMPLETING_REBALANCE
        now = self._clock.time()
        generation = group.generation
        for member in group.members.values():
            waiter, member.join_waiter = member.join_waiter, None
            member.last_heartbeat = now
            if waiter is not None and not waiter.done():
                waiter.set_result(self._join_result(group, member))
        _log.info(
            "rebalance_completed",
            group=group.group_id,
            generation=generation,
            protocol=group.protocol_name,
            leader=group.leader_id,
            members=len(group.members),
        )
        barrier = DelayedSync(group.rebalance_timeout(), self, group, generation)
        try:
            await self._join.try_complete_else_watch(barrier, (self._sync_key(group),))
            for member in list(group.members.values()):
                await self._schedule_session(group, member)
        except PurgatoryClosed:
            self._fail_waiters(group, E.coordinator_not_available)

    def complete_sync(self, group: Group, generation: int) -> list[Member]:
        """For :class:`DelayedSync`: answer the members waiting in SyncGroup. Returns the
        members that never synced when the barrier ran out (the group then rebalances)."""
        missing: list[Member] = []
        stable = group.generation == generation and group.state is GroupState.STABLE
        if self.closing:
            error = E.coordinator_not_available
        elif stable:
            error = E.none
        else:
            error = E.rebalance_in_progress
            if group.generation == generation and group.state is GroupState.COMPLETING_REBALANCE:
                # Timed out: the leader never sent the assignments. Rebalance at once so
                # that no member is answered with this generation again.
                missing = [m for m in group.members.values() if m.synced_generation != generation]
                group.state = GroupState.PREPARING_REBALANCE
                _log.info(
                    "sync_timed_out",
                    group=group.group_id,
                    generation=generation,
                    missing=[m.member_id for m in missing],
                )
        for member in group.members.values():
            if member.synced_generation != generation:
                continue  # waits for another generation's barrier, or for none
            waiter, member.sync_waiter = member.sync_waiter, None
            if waiter is None or waiter.done():
                continue
            if error is E.none:
                waiter.set_result(
                    SyncResult(error, member.assignment, group.protocol_type, group.protocol_name)
                )
            else:
                waiter.set_result(SyncResult(error))
        return missing

    async def sync_expired(self, group: Group, missing: list[Member]) -> None:
        if self.closing or group.state is not GroupState.PREPARING_REBALANCE:
            return
        for member in missing:
            self._drop(group, member, "never synced")
        await self._watch_join(group)

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _fenced(group: Group, member_id: str, group_instance_id: str | None) -> bool:
        """Kafka's ``isStaticMemberFenced``: the instance ID belongs to another member ID."""
        if group_instance_id is None:
            return False
        current = group.static.get(group_instance_id)
        return current is not None and current != member_id

    async def _replace_static(
        self,
        group: Group,
        old: Member,
        *,
        session_timeout: float,
        rebalance_timeout: float,
        protocols: Protocols,
    ) -> JoinResult:
        """A static member came back without its member ID (a restart): a new member ID
        takes the old one's place, assignment and leadership; the old one is fenced.

        In a stable group, with the same protocols, nobody else rebalances: the member
        gets the current generation and then its assignment from SyncGroup.
        """
        instance_id = old.group_instance_id
        assert instance_id is not None
        member_id = f"{instance_id}-{uuid.uuid4()}"
        member = Member(
            member_id,
            instance_id,
            session_timeout,
            rebalance_timeout,
            old.protocol_type,
            protocols,
            self._clock.time(),
            assignment=old.assignment,
            synced_generation=old.synced_generation,
        )
        # The new member takes the old one's place in join order.
        group.members = {
            (member_id if mid == old.member_id else mid): (member if m is old else m)
            for mid, m in group.members.items()
        }
        group.static[instance_id] = member_id
        was_leader = group.leader_id == old.member_id
        if was_leader:
            group.leader_id = member_id
        old.removed = True
        join, old.join_waiter = old.join_waiter, None
        if join is not None and not join.done():
            join.set_result(JoinResult(E.fenced_instance_id, old.member_id))
        sync, old.sync_waiter = old.sync_waiter, None
        if sync is not None and not sync.done():
            sync.set_result(SyncResult(E.fenced_instance_id))
        self._heartbeat.check_and_complete(self._session_key(group, old))
        _log.info(
            "static_member_replaced",
            group=group.group_id,
            instance=instance_id,
            old=old.member_id,
            new=member_id,
        )
        if group.state is GroupState.PREPARING_REBALANCE:
            return await self._wait_join(group, member, f"{instance_id} rejoined")
        if group.state is GroupState.COMPLETING_REBALANCE:
            # The leader may already be assigning to the old member ID: start over.
            return await self._wait_join(group, member, f"{instance_id} rejoined while syncing")
        # As Kafka's coordinator does: the returning member's new subscription is kept, and
        # the group rebalances only if the protocol chosen for it would change. Comparing
        # the metadata instead made every cooperative-sticky restart rebalance the others:
        # that member's metadata lists the partitions it owns, none after a restart.
        if group.select_protocol() != group.protocol_name:
            return await self._wait_join(group, member, f"{instance_id} changed its protocols")
        await self._schedule_session(group, member)
        # The old leader ID is answered, so that a returning leader does not compute an
        # assignment a stable group would never hand out (Kafka does the same).
        return JoinResult(
            E.none,
            member_id,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            old.member_id if was_leader else group.leader_id,
        )

    def _candidates_with(self, group: Group, member: Member, names: set[str]) -> set[str]:
        """The protocols common to the other members and to ``names``."""
        common = set(names)
        for other in group.members.values():
            if other is not member:
                common &= {name for name, _ in other.protocols}
        return common

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        protocol = group.protocol_name or ""
        if member.member_id == group.leader_id:
            members = tuple(
                (m.member_id, m.group_instance_id, m.metadata_for(protocol))
                for m in group.members.values()
            )
        return JoinResult(
            E.none,
            member.member_id,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader_id,
            members,
        )

    async def _wait_join(self, group: Group, member: Member, reason: str) -> JoinResult:
        waiter = member.join_waiter
        if waiter is None or waiter.done():
            waiter = member.join_waiter = asyncio.get_running_loop().create_future()
        member.last_heartbeat = self._clock.time()
        # Waiting in the barrier is a sign of life: settle the pending session expiry.
        self._heartbeat.check_and_complete(self._session_key(group, member))
        if group.state is GroupState.PREPARING_REBALANCE:
            self._join.check_and_complete(self._join_key(group))
        else:
            await self._prepare_rebalance(group, reason)
        return await asyncio.shield(waiter)

    async def _prepare_rebalance(self, group: Group, reason: str) -> None:
        group.state = GroupState.PREPARING_REBALANCE
        _log.info("rebalance_started", group=group.group_id, reason=reason)
        # Members waiting in SyncGroup learn that this generation is over.
        self._join.check_and_complete(self._sync_key(group))
        await self._watch_join(group)

    async def _watch_join(self, group: Group) -> None:
        barrier = DelayedJoin(group.rebalance_timeout(), self, group)
        try:
            await self._join.try_complete_else_watch(barrier, (self._join_key(group),))
        except PurgatoryClosed:
            self._fail_waiters(group, E.coordinator_not_available)

    def _drop(self, group: Group, member: Member, reason: str) -> bool:
        """Take ``member`` out of ``group``, answering its waiting requests."""
        if group.members.get(member.member_id) is not member:
            return False
        del group.members[member.member_id]
        member.removed = True
        instance_id = member.group_instance_id
        if instance_id is not None and group.static.get(instance_id) == member.member_id:
            del group.static[instance_id]
        join, member.join_waiter = member.join_waiter, None
        if join is not None and not join.done():
            join.set_result(JoinResult(E.unknown_member_id, member.member_id))
        sync, member.sync_waiter = member.sync_waiter, None
        if sync is not None and not sync.done():
            sync.set_result(SyncResult(E.unknown_member_id))
        self._heartbeat.check_and_complete(self._session_key(group, member))
        _log.info("member_removed", group=group.group_id, member=member.member_id, reason=reason)
        return True

    async def _remove_member(self, group: Group, member: Member, reason: str) -> None:
        if not self._drop(group, member, reason):
            return
        if group.state is GroupState.PREPARING_REBALANCE:
            self._join.check_and_complete(self._join_key(group))
        elif group.state is not GroupState.EMPTY:
            await self._prepare_rebalance(group, f"{member.member_id} {reason}")

    async def _schedule_session(self, group: Group, member: Member) -> None:
        if self.closing or member.removed:
            return
        key = self._session_key(group, member)
        # The previous expiry sees the newer sign of life and completes without effect.
        self._heartbeat.check_and_complete(key)
        now = self._clock.time()
        # A member waiting in a barrier is alive now; otherwise its session runs from its
        # last sign of life.
        expires_at = (now if member.awaiting() else member.last_heartbeat) + member.session_timeout
        op = DelayedHeartbeat(self, group, member, expires_at, max(0.0, expires_at - now))
        with contextlib.suppress(PurgatoryClosed):
            await self._heartbeat.try_complete_else_watch(op, (key,))

    def _fail_waiters(self, group: Group, error: E) -> None:
        for member in group.members.values():
            join, member.join_waiter = member.join_waiter, None
            if join is not None and not join.done():
                join.set_result(JoinResult(error, member.member_id))
            sync, member.sync_waiter = member.sync_waiter, None
            if sync is not None and not sync.done():
                sync.set_result(SyncResult(error))

    @staticmethod
    def _join_key(group: Group) -> WireGroupKey:
        return WireGroupKey("join", group.group_id)

    @staticmethod
    def _sync_key(group: Group) -> WireGroupKey:
        return WireGroupKey("sync", group.group_id)

    @staticmethod
    def _session_key(group: Group, member: Member) -> WireGroupKey:
        return WireGroupKey("session", group.group_id, member.member_id)


# -- wire handlers -----------------------------------------------------------------------------


def _coordinator_error(conn: Connection, group_id: str) -> E | None:
    """COORDINATOR_NOT_AVAILABLE while shutting down, NOT_COORDINATOR on the wrong broker."""
    wire = conn.wire
    if wire.groups.closing:
        return E.coordinator_not_available
    if wire.groups.coordinator_node(group_id, len(wire.ports)) != conn.node:
        return E.not_coordinator
    return None


async def find_coordinator(conn: Connection, version: int, request: Any) -> Any:
    wire = conn.wire
    schema = response_schema(FIND_COORDINATOR, version)
    # Transactional ids (key type 1) are located too, so that the producer's next
    # request, InitProducerId, is refused at once instead of this lookup being retried.
    key_type = getattr(request, "key_type", 0)
    keys = list(request.coordinator_keys) if version >= 4 else [request.key]

    def locate(key: str) -> dict[str, Any]:
        if key_type not in (0, 1):  # share groups (2) are not implemented
            error, message = E.coordinator_not_available, "only consumer groups are coordinated"
        elif wire.groups.closing:
            error, message = E.coordinator_not_available, "shutting down"
        else:
            node = wire.groups.coordinator_node(key, len(wire.ports))
            return {
                "error_code": E.none,
                "error_message": None,
                "node_id": node,
                "host": wire.config.host,
                "port": wire.ports[node],
            }
        return {
            "error_code": error,
            "error_message": message,
            "node_id": -1,
            "host": "",
            "port": -1,
        }

    if version >= 4:
        item = nested(schema, "coordinators")
        return schema(
            throttle_time=_NO_THROTTLE,
            coordinators=tuple(item(key=key, **locate(key)) for key in keys),
        )
    return build(schema, throttle_time=_NO_THROTTLE, **locate(keys[0]))


async def join_group(conn: Connection, version: int, request: Any) -> Any:
    protocols = tuple((p.name, bytes(p.metadata)) for p in request.protocols)
    session = seconds(request.session_timeout)
    rebalance = seconds(request.rebalance_timeout) if version >= 1 else session
    error = _coordinator_error(conn, request.group_id)
    if error is not None:
        result = JoinResult(error, request.member_id)
    else:
        result = await conn.wire.groups.join(
            request.group_id,
            request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            session_timeout=session,
            rebalance_timeout=rebalance if rebalance > 0 else session,
            protocol_type=request.protocol_type,
            protocols=protocols,
            require_known_member_id=version >= 4,
        )
    schema = response_schema(JOIN_GROUP, version)
    item = nested(schema, "members")
    members = tuple(
        build(item, member_id=mid, group_instance_id=instance, metadata=meta)
        for mid, instance, meta in result.members
    )
    return build(
        schema,
        throttle_time=_NO_THROTTLE,
        error_code=result.error,
        generation_id=result.generation,
        protocol_type=result.protocol_type,
        # Before v7 the name is not nullable: an error answer carries an empty one.
        protocol_name=result.protocol_name if version >= 7 else result.protocol_name or "",
        leader=result.leader,
        skip_assignment=False,
        member_id=result.member_id,
        members=members,
    )


async def sync_group(conn: Connection, version: int, request: Any) -> Any:
    error = _coordinator_error(conn, request.group_id)
    if error is not None:
        result = SyncResult(error)
    else:
        result = await conn.wire.groups.sync(
            request.group_id,
            request.member_id,
            request.generation_id,
            protocol_type=getattr(request, "protocol_type", None),
            protocol_name=getattr(request, "protocol_name", None),
            group_instance_id=getattr(request, "group_instance_id", None),
            assignments={a.member_id: bytes(a.assignment) for a in request.assignments},
        )
    return build(
        response_schema(SYNC_GROUP, version),
        throttle_time=_NO_THROTTLE,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


async def heartbeat(conn: Connection, version: int, request: Any) -> Any:
    error = _coordinator_error(conn, request.group_id)
    if error is None:
        error = await conn.wire.groups.heartbeat(
            request.group_id,
            request.member_id,
            request.generation_id,
            getattr(request, "group_instance_id", None),
        )
    return build(response_schema(HEARTBEAT, version), throttle_time=_NO_THROTTLE, error_code=error)


async def leave_group(conn: Connection, version: int, request: Any) -> Any:
    schema = response_schema(LEAVE_GROUP, version)
    ids: list[tuple[str, str | None]] = (
        [(m.member_id, m.group_instance_id) for m in request.members]
        if version >= 3
        else [(request.member_id, None)]
    )
    error = _coordinator_error(conn, request.group_id)
    if error is not None:
        errors = [error] * len(ids)
        top = error
    else:
        errors = await conn.wire.groups.leave(request.group_id, ids)
        top = errors[0] if version < 3 and errors else E.none
    if version < 3:
        return build(schema, throttle_time=_NO_THROTTLE, error_code=top)
    item = nested(schema, "members")
    return schema(
        throttle_time=_NO_THROTTLE,
        error_code=top,
        members=tuple(
            item(member_id=m.member_id, group_instance_id=m.group_instance_id, error_code=code)
            for m, code in zip(request.members, errors, strict=True)
        ),
    )


async def offset_commit(conn: Connection, version: int, request: Any) -> Any:
    groups = conn.wire.groups
    replicas = conn.cluster.replicas
    group_id = request.group_id
    error = _coordinator_error(conn, group_id)
    if error is None:
        error = (
            groups.commit_check(
                group_id,
                request.member_id,
                request.generation_id_or_member_epoch,
                getattr(request, "group_instance_id", None),
            )
            if group_id
            else E.invalid_group_id
        )
    schema = response_schema(OFFSET_COMMIT, version)
    topic_t = nested(schema, "topics")
    partition_t = nested(topic_t, "partitions")
    topics = []
    for topic in request.topics:
        parts = []
        for part in topic.partitions:
            code = error
            metadata = part.committed_metadata
            if code is E.none:
                if replicas.partition(TopicPartition(topic.name, part.partition_index)) is None:
                    code = E.unknown_topic_or_partition
                elif metadata is not None and len(metadata.encode()) > MAX_OFFSET_METADATA:
                    code = E.offset_metadata_too_large
                else:
                    groups.store_offset(
                        group_id,
                        (topic.name, part.partition_index),
                        part.committed_offset,
                        getattr(part, "committed_leader_epoch", -1),
                        metadata,
                    )
            parts.append(partition_t(partition_index=part.partition_index, error_code=code))
        topics.append(topic_t(name=topic.name, partitions=tuple(parts)))
    return build(schema, throttle_time=_NO_THROTTLE, topics=tuple(topics))


async def offset_fetch(conn: Connection, version: int, request: Any) -> Any:
    schema = response_schema(OFFSET_FETCH, version)
    if version >= 8:
        group_t = nested(schema, "groups")
        topic_t = nested(group_t, "topics")
    else:
        topic_t = nested(schema, "topics")
    partition_t = nested(topic_t, "partitions")

    def answer(group_id: str, wanted: Any) -> tuple[tuple[Any, ...], E]:
        error = _coordinator_error(conn, group_id)
        committed = {} if error is not None else conn.wire.groups.committed(group_id)
        if wanted is None:  # every partition the group committed
            by_topic: dict[str, list[int]] = {}
            for name, index in committed:
                by_topic.setdefault(name, []).append(index)
            asked = [(name, sorted(indexes)) for name, indexes in by_topic.items()]
        else:
            asked = [(t.name, list(t.partition_indexes)) for t in wanted]
        topics = []
        for name, indexes in asked:
            parts = []
            for index in indexes:
                offset, epoch, metadata = committed.get((name, index), (-1, -1, ""))
                parts.append(
                    build(
                        partition_t,
                        partition_index=index,
                        committed_offset=offset,
                        committed_leader_epoch=epoch,
                        metadata=metadata,
                        # v1 has no group-level error: each partition carries it
                        error_code=error if error is not None and version < 2 else E.none,
                    )
                )
            topics.append(topic_t(name=name, partitions=tuple(parts)))
        return tuple(topics), error if error is not None else E.none

    if version >= 8:
        results = []
        for group in request.groups:
            topics, error = answer(group.group_id, group.topics)
            results.append(group_t(group_id=group.group_id, topics=topics, error_code=error))
        return schema(throttle_time=_NO_THROTTLE, groups=tuple(results))
    topics, error = answer(request.group_id, request.topics)
    return build(schema, throttle_time=_NO_THROTTLE, topics=topics, error_code=error)


__all__ = [
    "DelayedHeartbeat",
    "DelayedJoin",
    "DelayedSync",
    "WireGroupCoordinator",
    "find_coordinator",
    "heartbeat",
    "join_group",
    "leave_group",
    "offset_commit",
    "offset_fetch",
    "sync_group",
]
