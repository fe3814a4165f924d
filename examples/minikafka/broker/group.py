"""Consumer group metadata held by the coordinator."""

from __future__ import annotations

import asyncio
from enum import Enum
from typing import NamedTuple

from ..protocol import JoinGroupResponse
from ..records import TopicPartition


class GroupKey(NamedTuple):
    """Watch key of a group's join barrier."""

    group_id: str

    def __str__(self) -> str:
        return f"group:{self.group_id}"


class MemberKey(NamedTuple):
    """Watch key of a member's session (heartbeat) expiration."""

    group_id: str
    member_id: str

    def __str__(self) -> str:
        return f"member:{self.group_id}/{self.member_id}"


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    STABLE = "Stable"


class Member:
    """One consumer in a group."""

    __slots__ = (
        "assignment",
        "client_id",
        "join_waiter",
        "last_heartbeat",
        "member_id",
        "rebalance_timeout",
        "removed",
        "session_timeout",
        "topics",
    )

    def __init__(
        self,
        member_id: str,
        client_id: str,
        topics: tuple[str, ...],
        session_timeout: float,
        rebalance_timeout: float,
        now: float,
    ) -> None:
        self.member_id = member_id
        self.client_id = client_id
        self.topics = topics
        self.session_timeout = session_timeout
        self.rebalance_timeout = rebalance_timeout
        self.last_heartbeat = now
        #: Set while the member waits in the join barrier; resolved when it completes.
        self.join_waiter: asyncio.Future[JoinGroupResponse] | None = None
        self.assignment: tuple[TopicPartition, ...] = ()
        self.removed = False

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None

    def __repr__(self) -> str:
        return f"Member({self.member_id!r})"


class Group:
    """A consumer group: its members, generation, state and committed offsets."""

    __slots__ = ("generation", "group_id", "leader_id", "members", "offsets", "state")

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.generation = 0
        self.leader_id = ""
        # Insertion-ordered: the oldest member leads and assignment order is reproducible.
        self.members: dict[str, Member] = {}
        self.offsets: dict[TopicPartition, int] = {}

    @property
    def key(self) -> GroupKey:
        return GroupKey(self.group_id)

    def all_members_joined(self) -> bool:
        return all(m.join_waiter is not None for m in self.members.values())

    def __repr__(self) -> str:
        return (
            f"Group({self.group_id!r}, {self.state.value}, generation={self.generation}, "
            f"members={list(self.members)})"
        )
