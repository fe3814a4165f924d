"""Prometheus metrics of purgatories, the ones Kafka exports for its own.

Needs the ``metrics`` extra (``pip install 'purgatory-aio[metrics]'``).

Per purgatory, labelled ``purgatory="<name>"``:

- ``purgatory_size`` (gauge): watch-list entries, settled ones not yet purged
  included (Kafka's ``PurgatorySize``);
- ``purgatory_delayed_operations`` (gauge): pending operations (Kafka's
  ``NumDelayedOperations``);
- ``purgatory_watch_keys`` (gauge): keys with a watch list;
- ``purgatory_completions_total``: completed before their deadline;
- ``purgatory_expirations_total``: completed by their deadline;
- ``purgatory_cancellations_total``: withdrawn with ``cancel()``;
- ``purgatory_shutdown_expirations_total``: expired by ``shutdown()``;
- ``purgatory_callback_errors_total``: exceptions raised by callbacks.

Example::

    from prometheus_client import CollectorRegistry, generate_latest
    registry = CollectorRegistry()
    collector = register_purgatories([fetch, produce], registry)
    generate_latest(registry)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import REGISTRY, CollectorRegistry
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        "purgatory_aio.metrics needs prometheus-client: install purgatory-aio[metrics]"
    ) from exc

from ._purgatory import Purgatory, PurgatoryStats

__all__ = ["PurgatoryCollector", "register_purgatories"]

_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("size", "watched", "Watch-list entries, including settled ones not yet purged."),
    ("delayed_operations", "pending", "Operations waiting in the purgatory."),
    ("watch_keys", "watched_keys", "Keys with a watch list or a threshold index."),
)
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("completions", "completed", "Operations completed before their deadline."),
    ("expirations", "expired", "Operations completed by their deadline."),
    ("cancellations", "cancelled", "Operations withdrawn with cancel()."),
    ("shutdown_expirations", "shutdown", "Operations expired by shutdown()."),
    ("callback_errors", "callback_errors", "Exceptions raised by operation callbacks."),
)


class PurgatoryCollector:
    """A Prometheus collector reading the ``stats()`` of purgatories at each scrape.

    Args:
        purgatories: iterated at every scrape, so a live collection (a list you
            append to, an :class:`~purgatory_aio.integrations.Purgatories`)
            shows purgatories added later.
        namespace: prefix of the metric names.

    Reading the counters takes no lock: a scrape from another thread may see
    one purgatory a few operations apart from another, as metrics always do.
    """

    def __init__(self, purgatories: Iterable[Purgatory], *, namespace: str = "purgatory") -> None:
        if not namespace.isidentifier():
            raise ValueError(f"namespace must be a valid metric name prefix, got {namespace!r}")
        self._purgatories = purgatories
        self._namespace = namespace

    def describe(self) -> Iterator[Metric]:
        """The metric families, without samples (for the registry's clash check)."""
        # Metric names without samples: lets a registry detect clashes without scraping.
        return self._families([])

    def collect(self) -> Iterator[Metric]:
        """The metric families with every purgatory's current counters and gauges."""
        return self._families([purgatory.stats() for purgatory in self._purgatories])

    def _families(self, stats: list[PurgatoryStats]) -> Iterator[Metric]:
        prefix = self._namespace
        for suffix, field, doc in _GAUGES:
            gauge = GaugeMetricFamily(f"{prefix}_{suffix}", doc, labels=["purgatory"])
            for s in stats:
                gauge.add_metric([s.name], getattr(s, field))
            yield gauge
        for suffix, field, doc in _COUNTERS:
            counter = CounterMetricFamily(f"{prefix}_{suffix}", doc, labels=["purgatory"])
            for s in stats:
                counter.add_metric([s.name], getattr(s, field))
            yield counter


def register_purgatories(
    purgatories: Iterable[Purgatory],
    registry: CollectorRegistry = REGISTRY,
    *,
    namespace: str = "purgatory",
) -> PurgatoryCollector:
    """Register a :class:`PurgatoryCollector` over ``purgatories`` in ``registry``."""
    collector = PurgatoryCollector(purgatories, namespace=namespace)
    registry.register(collector)
    return collector
