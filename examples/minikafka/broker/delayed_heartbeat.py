"""DelayedHeartbeat: a group member's session expiration."""

from __future__ import annotations

from typing import Any, Protocol

from purgatory_aio import DelayedOperation


class SessionOwner(Protocol):
    """What a session needs from its coordinator: the in-process one, or the Kafka-wire one
    (each with its own group and member types)."""

    def member_alive(self, member: Any, expires_at: float) -> bool: ...

    async def session_expired(self, group: Any, member: Any, expires_at: float) -> None: ...


class DelayedHeartbeat(DelayedOperation[None]):
    """Expires when a member's session times out without a sign of life.

    One is scheduled per heartbeat, due ``session_timeout`` later. It completes
    quietly as soon as the member shows it is alive (a later heartbeat, waiting
    in a join barrier) or is gone; only if it expires is the member removed from
    the group, which starts a rebalance.
    """

    __slots__ = ("_coordinator", "_expires_at", "_group", "_member")

    def __init__(
        self,
        coordinator: SessionOwner,
        group: Any,
        member: Any,
        expires_at: float,
        timeout: float,
    ) -> None:
        super().__init__(timeout)
        self._coordinator = coordinator
        self._group = group
        self._member = member
        self._expires_at = expires_at

    def try_complete(self) -> bool:
        return self._coordinator.member_alive(self._member, self._expires_at) and (
            self.force_complete()
        )

    def on_complete(self) -> None:
        return None

    async def on_expiration(self) -> None:
        await self._coordinator.session_expired(self._group, self._member, self._expires_at)
