"""Operation event log writers: sinks for ``Purgatory(event_sink=...)``.

Both writers queue records without blocking the event loop and write them on a
worker thread; :class:`ParquetWriter` needs pyarrow (the ``parquet`` extra),
which is imported only when one is created.

Examples:
    >>> from purgatory_aio.eventlog import ParquetWriter
    >>> with ParquetWriter("events/", roll_seconds=60) as sink:   # doctest: +SKIP
    ...     async with Purgatory("fetch", event_sink=sink) as p:
    ...         ...
"""

from purgatory_aio.eventlog._base import QueuedEventWriter as QueuedEventWriter
from purgatory_aio.eventlog._jsonl import JsonLinesWriter as JsonLinesWriter
from purgatory_aio.eventlog._parquet import ParquetWriter as ParquetWriter
from purgatory_aio.eventlog._parquet import arrow_schema as arrow_schema

__all__ = ["JsonLinesWriter", "ParquetWriter", "QueuedEventWriter", "arrow_schema"]
