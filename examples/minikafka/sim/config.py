"""What a simulation run is asked to do."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..broker.producer_state import BATCHES_KEPT

#: Faults the simulator can inject, in the order they are described.
FAULTS: tuple[str, ...] = ("slow-follower", "dead-follower", "silent-consumer", "producer-burst")

#: The longest run accepted, in simulated seconds: an hour of traffic already takes
#: minutes of CPU in virtual time, and a bound keeps a typo from running for ever.
MAX_DURATION = 3600.0

#: Accepted ``acks`` settings; ``mixed`` cycles producers through all, 1 and 0.
ACKS_CHOICES: tuple[str, ...] = ("0", "1", "all", "mixed")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Parameters of one run. :meth:`problems` lists what is wrong with them.

    Timings of brokers and clients are scaled down from Kafka's defaults
    (replica lag 10 s, session timeout 6 s, produce timeout 5 s) so that faults
    play out within a couple of minutes.
    """

    duration: float = 60.0
    seed: int = 0
    brokers: int = 3
    producers: int = 3
    consumers: int = 2
    partitions: int = 6
    replicas: int = 3
    min_insync: int | None = None
    acks: str = "mixed"
    faults: tuple[str, ...] = ()
    virtual_time: bool = False
    rate: float = 100.0
    record_bytes: int = 200
    keyed_ratio: float = 0.7
    delayed_ratio: float = 0.05
    max_delay: float = 10.0
    max_in_flight: int = 5
    idempotence: bool = False
    network_latency: float = 0.001
    topic: str = "events"
    group: str = "sim-group"
    replica_lag_time_max: float = 10.0
    request_timeout: float = 5.0
    session_timeout: float = 6.0
    heartbeat_interval: float = 1.0
    rebalance_timeout: float = 8.0
    fetch_min_bytes: int = 4096
    fetch_max_wait: float = 0.5

    @property
    def effective_min_insync(self) -> int:
        """``min_insync`` if given, else 2 capped by the replication factor."""
        return self.min_insync if self.min_insync is not None else min(2, self.replicas)

    def problems(self) -> list[str]:
        """Why this configuration cannot run (empty when it can)."""
        found: list[str] = []
        if not (math.isfinite(self.duration) and 0 < self.duration <= MAX_DURATION):
            found.append(
                f"duration must be a positive number of seconds up to {MAX_DURATION:g}, "
                f"got {self.duration:g}"
            )
        counts_ok = True
        for name in ("brokers", "partitions", "replicas", "max_in_flight", "record_bytes"):
            if getattr(self, name) < 1:
                counts_ok = False
                found.append(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("producers", "consumers"):
            if getattr(self, name) < 0:
                found.append(f"{name} must not be negative, got {getattr(self, name)}")
        # The checks relating counts to each other would only repeat an error above.
        if counts_ok and self.replicas > self.brokers:
            found.append(
                f"replicas ({self.replicas}) cannot exceed brokers ({self.brokers}): "
                "each replica of a partition lives on a different broker"
            )
        min_insync = self.effective_min_insync
        if counts_ok and not 1 <= min_insync <= self.replicas:
            found.append(
                f"min-insync must be between 1 and replicas ({self.replicas}), got {min_insync}"
            )
        if self.idempotence and self.max_in_flight > BATCHES_KEPT:
            found.append(
                f"max-in-flight must be at most {BATCHES_KEPT} with idempotence "
                f"(the batches a broker remembers per producer), got {self.max_in_flight}"
            )
        if self.acks not in ACKS_CHOICES:
            found.append(f"acks must be one of {', '.join(ACKS_CHOICES)}, got {self.acks!r}")
        unknown = [f for f in self.faults if f not in FAULTS]
        if unknown:
            found.append(
                f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}, all, none"
            )
        if not (math.isfinite(self.rate) and self.rate > 0):
            found.append(f"rate must be a positive number of records per second, got {self.rate}")
        for name in ("keyed_ratio", "delayed_ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                found.append(f"{name} must be between 0 and 1, got {getattr(self, name)}")
        if not (math.isfinite(self.max_delay) and self.max_delay >= 0):
            found.append(f"max_delay must be >= 0 seconds, got {self.max_delay}")
        if not (math.isfinite(self.network_latency) and self.network_latency >= 0):
            found.append(f"network latency must be >= 0 seconds, got {self.network_latency}")
        return found

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["faults"] = list(self.faults)
        data["min_insync"] = self.effective_min_insync
        return data
