"""The group coordinator: membership, join barriers and session expiry of consumer groups."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import structlog

from purgatory_aio import Clock, Purgatory

from ..errors import ErrorCode
from ..protocol import HeartbeatResponse, JoinGroupResponse
from ..records import TopicPartition
from .config import BrokerConfig
from .delayed_heartbeat import DelayedHeartbeat
from .delayed_join import DelayedJoin
from .group import Group, GroupState, Member, MemberKey
from .replica_manager import ReplicaManager

_log = structlog.get_logger("minikafka.group_coordinator")

GroupEventKind = Literal[
    "rebalance_started", "rebalance_completed", "member_expired", "member_dropped", "member_left"
]


@dataclass(frozen=True, slots=True)
class GroupEvent:
    """Something that happened to a group, for reports."""

    time: float
    group_id: str
    kind: GroupEventKind
    member_id: str = ""
    generation: int = -1
    detail: str = ""


class GroupCoordinator:
    """Runs every consumer group of the cluster.

    A rebalance is a :class:`DelayedJoin` in the join purgatory; each member's
    session is a :class:`DelayedHeartbeat` in the heartbeat purgatory, replaced
    on every heartbeat. The coordinator also assigns partitions (round robin
    over the members in join order) and keeps committed offsets.

    Args:
        config: broker settings (session timeout bounds).
        clock: the cluster's clock.
        replicas: where topics' partitions are looked up for assignment.
        join: the purgatory for join barriers.
        heartbeat: the purgatory for session expirations.
    """

    def __init__(
        self,
        config: BrokerConfig,
        clock: Clock,
        replicas: ReplicaManager,
        join: Purgatory,
        heartbeat: Purgatory,
    ) -> None:
        self._config = config
        self._clock = clock
        self._replicas = replicas
        self._join = join
        self._heartbeat = heartbeat
        self._groups: dict[str, Group] = {}
        self._member_ids = itertools.count(1)
        self._closing = False
        #: Join barriers that completed at their deadline rather than because all rejoined.
        self.joins_at_timeout = 0
        #: Everything that happened to groups, oldest first.
        self.events: list[GroupEvent] = []

    def group(self, group_id: str) -> Group | None:
        return self._groups.get(group_id)

    def close(self) -> None:
        """The broker is shutting down: sessions it expires now are not member failures."""
        self._closing = True

    # -- requests ------------------------------------------------------------------------------

    async def join_group(
        self,
        group_id: str,
        member_id: str = "",
        *,
        client_id: str = "consumer",
        topics: Iterable[str] = (),
        session_timeout: float = 10.0,
        rebalance_timeout: float = 30.0,
    ) -> JoinGroupResponse:
        """Join (or rejoin) a group and wait in its join barrier.

        An empty ``member_id`` asks for a new one. Joining a stable group starts a
        rebalance; the response arrives when the barrier completes, with the
        member's assignment for the new generation.
        """
        config = self._config
        if (
            not config.group_min_session_timeout
            <= session_timeout
            <= (config.group_max_session_timeout)
        ):
            return JoinGroupResponse(ErrorCode.INVALID_SESSION_TIMEOUT, member_id=member_id)
        if not group_id:
            return JoinGroupResponse(ErrorCode.INVALID_REQUEST, member_id=member_id)
        now = self._clock.time()
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = Group(group_id)
        if not member_id:
            member_id = f"{client_id}-{next(self._member_ids)}"
            member = Member(
                member_id, client_id, tuple(topics), session_timeout, rebalance_timeout, now
            )
            group.members[member_id] = member
            reason = f"{member_id} joined"
        else:
            existing = group.members.get(member_id)
            if existing is None:
                return JoinGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member_id)
            member = existing
            member.topics = tuple(topics) or member.topics
            member.session_timeout = session_timeout
            member.rebalance_timeout = rebalance_timeout
            reason = f"{member_id} rejoined"
        waiter = member.join_waiter
        if waiter is None or waiter.done():
            waiter = member.join_waiter = asyncio.get_running_loop().create_future()
        member.last_heartbeat = now
        # A member waiting in the barrier is alive: settle its pending session expiration.
        self._heartbeat.check_and_complete(MemberKey(group_id, member_id))
        if group.state is GroupState.PREPARING_REBALANCE:
            self._join.check_and_complete(group.key)
        else:
            await self._prepare_rebalance(group, reason)
        return await asyncio.shield(waiter)

    async def heartbeat(self, group_id: str, member_id: str, generation: int) -> HeartbeatResponse:
        """Keep a member's session alive; tells it when it must rejoin."""
        group = self._groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            return HeartbeatResponse(ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state is GroupState.STABLE and generation != group.generation:
            return HeartbeatResponse(ErrorCode.ILLEGAL_GENERATION)
        member.last_heartbeat = self._clock.time()
        await self._schedule_session_expiry(group, member)
        if group.state is GroupState.PREPARING_REBALANCE:
            return HeartbeatResponse(ErrorCode.REBALANCE_IN_PROGRESS)
        return HeartbeatResponse(ErrorCode.NONE)

    async def leave_group(self, group_id: str, member_id: str) -> ErrorCode:
        """Remove a member at once (a clean shutdown), rebalancing the rest."""
        group = self._groups.get(group_id)
        member = None if group is None else group.members.get(member_id)
        if group is None or member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        await self._remove_member(group, member, "member_left", "left the group")
        return ErrorCode.NONE

    def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        offsets: Mapping[TopicPartition, int],
    ) -> ErrorCode:
        """Store the positions a member has consumed up to.

        Accepted from members of the current generation, also while a rebalance
        is in progress (members commit before rejoining).
        """
        group = self._groups.get(group_id)
        if group is None or member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        group.offsets.update(offsets)
        return ErrorCode.NONE

    def committed(self, group_id: str, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Committed offsets of ``tps`` (partitions never committed are left out)."""
        group = self._groups.get(group_id)
        if group is None:
            return {}
        return {tp: group.offsets[tp] for tp in tps if tp in group.offsets}

    # -- called by the delayed operations ------------------------------------------------------

    def member_alive(self, member: Member, expires_at: float) -> bool:
        """For :class:`DelayedHeartbeat`: has the member shown life since this expiry was set?"""
        return (
            member.removed
            or member.join_waiter is not None
            or member.last_heartbeat + member.session_timeout > expires_at
        )

    async def session_expired(self, group: Group, member: Member, expires_at: float) -> None:
        """For :class:`DelayedHeartbeat`: the session ran out; remove the member if still silent."""
        if not self._closing and not self.member_alive(member, expires_at):
            await self._remove_member(group, member, "member_expired", "session timed out")

    async def complete_join(self, group: Group) -> int:
        """For :class:`DelayedJoin`: start the next generation with the members that rejoined."""
        now = self._clock.time()
        for member in [m for m in group.members.values() if m.join_waiter is None]:
            del group.members[member.member_id]
            member.removed = True
            self._heartbeat.check_and_complete(MemberKey(group.group_id, member.member_id))
            self._event(group, "member_dropped", member.member_id, "missed the join barrier")
        group.generation += 1
        members = list(group.members.values())
        if not members:
            group.state = GroupState.EMPTY
            group.leader_id = ""
        else:
            group.state = GroupState.STABLE
            group.leader_id = members[0].member_id
        assignment = self._assign(members)
        member_ids = tuple(m.member_id for m in members)
        for member in members:
            member.assignment = assignment[member.member_id]
            member.last_heartbeat = now
            waiter, member.join_waiter = member.join_waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(
                    JoinGroupResponse(
                        ErrorCode.NONE,
                        generation=group.generation,
                        member_id=member.member_id,
                        leader_id=group.leader_id,
                        members=member_ids,
                        assignment=member.assignment,
                    )
                )
        self._event(group, "rebalance_completed", detail=f"{len(members)} members")
        if self._closing:
            return group.generation
        for member in members:
            if not member.removed:
                await self._schedule_session_expiry(group, member)
        return group.generation

    # -- internals -----------------------------------------------------------------------------

    async def _prepare_rebalance(self, group: Group, reason: str) -> None:
        group.state = GroupState.PREPARING_REBALANCE
        self._event(group, "rebalance_started", detail=reason)
        timeout = max((m.rebalance_timeout for m in group.members.values()), default=0.0)
        op = DelayedJoin(timeout, self, group)
        await self._join.try_complete_else_watch(op, (group.key,))

    async def _remove_member(
        self, group: Group, member: Member, kind: GroupEventKind, detail: str
    ) -> None:
        if group.members.get(member.member_id) is not member:
            return
        del group.members[member.member_id]
        member.removed = True
        waiter, member.join_waiter = member.join_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(
                JoinGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID, member_id=member.member_id)
            )
        self._heartbeat.check_and_complete(MemberKey(group.group_id, member.member_id))
        self._event(group, kind, member.member_id, detail)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._join.check_and_complete(group.key)
        elif group.state is GroupState.STABLE:
            await self._prepare_rebalance(group, f"{member.member_id} {detail}")

    async def _schedule_session_expiry(self, group: Group, member: Member) -> None:
        key = MemberKey(group.group_id, member.member_id)
        # The previous expiry sees the newer heartbeat and completes without effect.
        self._heartbeat.check_and_complete(key)
        timeout = member.session_timeout
        op = DelayedHeartbeat(self, group, member, member.last_heartbeat + timeout, timeout)
        await self._heartbeat.try_complete_else_watch(op, (key,))

    def _assign(self, members: list[Member]) -> dict[str, tuple[TopicPartition, ...]]:
        assignment: dict[str, list[TopicPartition]] = {m.member_id: [] for m in members}
        topics = sorted({t for m in members for t in m.topics})
        for topic in topics:
            subscribers = [m.member_id for m in members if topic in m.topics]
            for i, partition in enumerate(self._replicas.topic_partitions(topic)):
                assignment[subscribers[i % len(subscribers)]].append(partition.tp)
        return {member_id: tuple(tps) for member_id, tps in assignment.items()}

    def _event(
        self, group: Group, kind: GroupEventKind, member_id: str = "", detail: str = ""
    ) -> None:
        event = GroupEvent(
            self._clock.time(), group.group_id, kind, member_id, group.generation, detail
        )
        self.events.append(event)
        _log.info(
            kind, group=group.group_id, member=member_id, generation=group.generation, detail=detail
        )
