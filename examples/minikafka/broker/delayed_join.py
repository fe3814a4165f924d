"""DelayedJoin: the join barrier of a consumer group rebalance."""

from __future__ import annotations

from typing import TYPE_CHECKING

from purgatory_aio import DelayedOperation

if TYPE_CHECKING:
    from .group import Group
    from .group_coordinator import GroupCoordinator


class DelayedJoin(DelayedOperation[int]):
    """Completes when every known member has rejoined, or at the rebalance timeout.

    Watched under the group's key; each join request (and each member leaving or
    expiring) checks it. Completion, early or at the deadline, starts the next
    generation with the members that rejoined: the ones still missing at the
    deadline are dropped. The result is the new generation.
    """

    __slots__ = ("_coordinator", "_group")

    def __init__(self, timeout: float, coordinator: GroupCoordinator, group: Group) -> None:
        super().__init__(timeout)
        self._coordinator = coordinator
        self._group = group

    def try_complete(self) -> bool:
        return self._group.all_members_joined() and self.force_complete()

    async def on_complete(self) -> int:
        # Async because it schedules each member's next session expiration, which
        # means watching new operations in the heartbeat purgatory.
        return await self._coordinator.complete_join(self._group)

    def on_expiration(self) -> None:
        self._coordinator.joins_at_timeout += 1
