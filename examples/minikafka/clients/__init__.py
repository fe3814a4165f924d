"""Clients of the mini broker: a producer and a group consumer."""

from .accumulator import RecordAccumulator as RecordAccumulator
from .config import ConsumerConfig as ConsumerConfig
from .config import ProducerConfig as ProducerConfig
from .config import acks_name as acks_name
from .config import parse_acks as parse_acks
from .consumer import Consumer as Consumer
from .consumer import ConsumerRecord as ConsumerRecord
from .metadata import RecordMetadata as RecordMetadata
from .partitioner import Partitioner as Partitioner
from .producer import Producer as Producer

__all__ = [
    "Consumer",
    "ConsumerConfig",
    "ConsumerRecord",
    "Partitioner",
    "Producer",
    "ProducerConfig",
    "RecordAccumulator",
    "RecordMetadata",
    "acks_name",
    "parse_acks",
]
