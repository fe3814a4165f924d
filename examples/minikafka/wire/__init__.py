"""The Kafka wire protocol in front of the example's :class:`~minikafka.broker.Cluster`.

Real Kafka clients (librdkafka, aiokafka, kafka-python) connect to one listener per
broker; requests are decoded with ``kio`` and record batches with ``aiokafka.record``,
and every wait is one of the cluster's purgatories.
"""

from .server import WireCluster

__all__ = ["WireCluster"]
