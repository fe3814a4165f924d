"""What a partition leader knows about one of its followers."""

from __future__ import annotations


class FollowerState:
    """A follower's progress as seen by the leader, updated on every follower fetch.

    A fetch at offset ``o`` tells the leader the follower holds everything below
    ``o``. The follower counts as caught up at the time of a fetch that reached
    the leader's log end, or that reached the log end the leader had at the
    follower's previous fetch (it then had everything that existed back then).
    Lag is measured from the last such moment, so a follower that keeps up with
    a busy log never looks behind merely because new records keep arriving.
    """

    __slots__ = (
        "broker_id",
        "last_caught_up",
        "last_fetch_leader_end",
        "last_fetch_time",
        "log_end",
    )

    def __init__(self, broker_id: int, now: float) -> None:
        self.broker_id = broker_id
        self.log_end = 0
        self.last_caught_up = now
        self.last_fetch_time = now
        self.last_fetch_leader_end = 0

    def on_fetch(self, fetch_offset: int, leader_end: int, now: float) -> None:
        if fetch_offset >= leader_end:
            self.last_caught_up = now
        elif fetch_offset >= self.last_fetch_leader_end:
            self.last_caught_up = max(self.last_caught_up, self.last_fetch_time)
        self.log_end = fetch_offset
        self.last_fetch_leader_end = leader_end
        self.last_fetch_time = now

    def lag_time(self, now: float) -> float:
        """Seconds since the follower was last caught up."""
        return now - self.last_caught_up

    def __repr__(self) -> str:
        return f"FollowerState(broker={self.broker_id}, log_end={self.log_end})"
