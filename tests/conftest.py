"""Shared test set-up: both event loops, quiet logging, small helpers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping

import pytest
import structlog

from purgatory_aio.testing import ManualClock

try:
    import uvloop
except ImportError:  # pragma: no cover - the test extra installs it
    uvloop = None

# The tests are the application here: they configure logging, the library never does.
structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
    cache_logger_on_first_use=False,
)

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
if uvloop is not None:
    LOOPS["uvloop"] = uvloop.new_event_loop


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "one_loop: run this async test on the standard asyncio loop only"
    )
    if uvloop is None and not config.getoption("--no-uvloop-ok", default=False):
        raise pytest.UsageError("uvloop is missing: install the test extra (make install)")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-uvloop-ok",
        action="store_true",
        help="allow running without uvloop (tests then use the asyncio loop only)",
    )


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Every async test runs on asyncio and uvloop unless marked ``one_loop``."""
    if item.get_closest_marker("one_loop") is not None:
        return {"asyncio": asyncio.new_event_loop}
    return LOOPS


@pytest.fixture
def clock() -> ManualClock:
    """A fresh virtual clock for the test."""
    return ManualClock()


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    """For tests of CLIs, which configure structlog as an application does: undo it."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
