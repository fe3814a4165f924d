"""A miniature Kafka broker built on purgatory_aio.

The broker model (:mod:`minikafka.broker`) serves plain request objects
(:mod:`minikafka.protocol`) and holds every wait in a purgatory: ``acks=all``
produces, long-poll fetches, group join barriers, session expiry and topic
creation. :mod:`minikafka.clients` has a producer and a group consumer;
:mod:`minikafka.sim` and the ``purgatory-sim`` command run them together with
injected faults, in real or virtual time.
"""

# One import name per module: from a checkout, examples/minikafka is also reachable
# as examples.minikafka, which would load every file a second time as different
# classes. The installed distribution (examples/pyproject.toml) is the one name.
if __name__ != "minikafka":
    raise ImportError(
        f"import the example broker as 'minikafka', not {__name__!r}: it is its own "
        "distribution (pip install ./examples, or make install)"
    )

from .broker import BrokerConfig as BrokerConfig
from .broker import Cluster as Cluster
from .clients import Consumer as Consumer
from .clients import ConsumerConfig as ConsumerConfig
from .clients import Producer as Producer
from .clients import ProducerConfig as ProducerConfig
from .errors import ErrorCode as ErrorCode
from .errors import KafkaError as KafkaError
from .protocol import ACKS_ALL as ACKS_ALL
from .protocol import CONSUMER_REPLICA_ID as CONSUMER_REPLICA_ID
from .protocol import CreateTopicsRequest as CreateTopicsRequest
from .protocol import CreateTopicsResponse as CreateTopicsResponse
from .protocol import FetchRequest as FetchRequest
from .protocol import FetchResponse as FetchResponse
from .protocol import HeartbeatResponse as HeartbeatResponse
from .protocol import JoinGroupResponse as JoinGroupResponse
from .protocol import PartitionFetchResult as PartitionFetchResult
from .protocol import PartitionProduceResult as PartitionProduceResult
from .protocol import ProduceRequest as ProduceRequest
from .protocol import ProduceResponse as ProduceResponse
from .protocol import ProducerIdentity as ProducerIdentity
from .protocol import TopicMetadata as TopicMetadata
from .protocol import TopicSpec as TopicSpec
from .records import RECORD_OVERHEAD as RECORD_OVERHEAD
from .records import Record as Record
from .records import TopicPartition as TopicPartition

__all__ = [
    "ACKS_ALL",
    "CONSUMER_REPLICA_ID",
    "RECORD_OVERHEAD",
    "BrokerConfig",
    "Cluster",
    "Consumer",
    "ConsumerConfig",
    "CreateTopicsRequest",
    "CreateTopicsResponse",
    "ErrorCode",
    "FetchRequest",
    "FetchResponse",
    "HeartbeatResponse",
    "JoinGroupResponse",
    "KafkaError",
    "PartitionFetchResult",
    "PartitionProduceResult",
    "ProduceRequest",
    "ProduceResponse",
    "Producer",
    "ProducerConfig",
    "ProducerIdentity",
    "Record",
    "TopicMetadata",
    "TopicPartition",
    "TopicSpec",
]
