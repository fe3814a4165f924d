"""One local[2] SparkSession for the whole run, and a generated event log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eventlog_reference import generate, write_log

from purgatory_aio.events import OperationEvent


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The run's only SparkSession; fails (never skips) without Java or PySpark."""
    try:
        from purgatory_report.errors import JAVA_MISSING
        from purgatory_report.session import create_session, find_java
    except ImportError as exc:
        pytest.fail(f"analytics tests need the spark extra: {exc}", pytrace=False)
    if find_java() is None:
        pytest.fail(JAVA_MISSING, pytrace=False)
    session = create_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def events() -> list[OperationEvent]:
    """The generated events (see ``eventlog_reference.GROUPS``)."""
    return generate()


@pytest.fixture(scope="session")
def event_log(events: list[OperationEvent], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``events`` written as Parquet files plus JSON Lines files in a subdirectory."""
    directory = tmp_path_factory.mktemp("events")
    write_log(directory, events)
    return directory


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark standalone master and one worker on 127.0.0.1, from pyspark's own jars.

    Yields the master URL. Both JVMs run on free ports and are stopped by PID.
    """
    from bench._cluster import StandaloneCluster

    work = tmp_path_factory.mktemp("spark-cluster")
    with StandaloneCluster(work) as cluster:
        yield cluster.url
