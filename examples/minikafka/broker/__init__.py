"""The broker model: partitions, replication, groups and the purgatories behind them."""

from .cluster import PURGATORY_NAMES as PURGATORY_NAMES
from .cluster import Cluster as Cluster
from .config import BrokerConfig as BrokerConfig
from .delayed_create_topics import DelayedCreateTopics as DelayedCreateTopics
from .delayed_fetch import DelayedFetch as DelayedFetch
from .delayed_heartbeat import DelayedHeartbeat as DelayedHeartbeat
from .delayed_join import DelayedJoin as DelayedJoin
from .delayed_produce import DelayedProduce as DelayedProduce
from .group import GroupState as GroupState
from .group_coordinator import GroupEvent as GroupEvent
from .partition import Partition as Partition
from .replica_fetcher import ReplicaFetcher as ReplicaFetcher
from .replica_manager import IsrChange as IsrChange

__all__ = [
    "PURGATORY_NAMES",
    "BrokerConfig",
    "Cluster",
    "DelayedCreateTopics",
    "DelayedFetch",
    "DelayedHeartbeat",
    "DelayedJoin",
    "DelayedProduce",
    "GroupEvent",
    "GroupState",
    "IsrChange",
    "Partition",
    "ReplicaFetcher",
]
