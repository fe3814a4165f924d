"""Shared test set-up: both event loops, quiet logging, small helpers."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
import structlog

# The suite runs against the INSTALLED package (make test builds a wheel and installs
# it), never the checkout's source. `python -m pytest` puts the checkout first on
# sys.path, where its purgatory_aio would shadow the installed one: move it last
# (tests, bench and examples still import from it), before anything imports the
# package. Subprocesses the tests start get the same rule from PYTHONSAFEPATH.
CHECKOUT = Path(__file__).resolve().parent.parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != CHECKOUT]
sys.path.append(str(CHECKOUT))
os.environ["PYTHONSAFEPATH"] = "1"
# purgatory-report keeps a class archive of Spark's JVM under ~/.cache; the suite's many
# short runs write none (one test covers the archive, in its own directory).
os.environ.setdefault("PURGATORY_REPORT_CLASS_CACHE", "off")

import purgatory_aio
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


def check_installed_package() -> None:
    """Fail the session unless the installed build the Makefile asked for is imported."""
    where = Path(purgatory_aio.__file__ or "").resolve()
    if where.is_relative_to(CHECKOUT / "purgatory_aio"):
        raise pytest.UsageError(
            f"purgatory_aio was imported from the checkout ({where}), not an installed wheel: "
            "run `make test` (or `make install`, then .venv/bin/python -m pytest)"
        )
    expected = os.environ.get("PURGATORY_AIO_EXPECT_BUILD")
    if expected not in (None, "compiled", "pure"):
        raise pytest.UsageError(f"PURGATORY_AIO_EXPECT_BUILD={expected!r}: compiled or pure")
    if expected is not None and purgatory_aio.compiled != (expected == "compiled"):
        raise pytest.UsageError(
            f"the {expected} build was asked for, but {where.parent} has "
            f"purgatory_aio.compiled={purgatory_aio.compiled}"
        )


def pytest_configure(config: pytest.Config) -> None:
    check_installed_package()
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


#: The core's own tests, by path under tests/: marked ``core``, they run on each
#: implementation (compiled, pure) and each supported Python (``-m core``). Every other
#: test exercises code that is the same whichever implementation of the core runs (the
#: fan-out, the integrations, the broker, the report, the docs and the build) and runs
#: once, on the compiled core and the main Python.
CORE_TESTS = (
    "lifecycle/",
    "test_admission.py",
    "test_api.py",
    "test_builds_differential.py",
    "test_callback_placement.py",
    "test_compact.py",
    "test_copy_pickle.py",
    "test_docstrings.py",
    "test_free_threading.py",
    "test_gc_untracking.py",
    "test_hot_path_shape.py",
    "test_interpreters.py",
    "test_lone_key_watch.py",
    "test_operation.py",
    "test_operation_edges.py",
    "test_operation_weakrefs.py",
    "test_outcome.py",
    "test_owners.py",
    "test_purgatory.py",
    "test_purgatory_model.py",
    "test_real_loop.py",
    "test_relay_parsers.py",
    "test_threshold.py",
    "test_timer.py",
    "test_thread_ident.py",
    "test_timer_buckets.py",
    "test_user_answers.py",
    "test_watch_lists.py",
    "test_watched_keys.py",
)
TESTS = Path(__file__).resolve().parent


def _in_core(path: Path) -> bool:
    where = path.resolve()
    if not where.is_relative_to(TESTS):
        return False
    relative = where.relative_to(TESTS).as_posix()
    return any(
        relative.startswith(entry) if entry.endswith("/") else relative == entry
        for entry in CORE_TESTS
    )


def _is_core(item: pytest.Item) -> bool:
    return _in_core(Path(str(item.path)))


#: Test directories whose session-scoped servers (a SparkSession and a Spark cluster; a
#: Redis and a PostgreSQL server) are started once per run: each runs on one worker.
_ONE_WORKER_DIRECTORIES = ("analytics", "fanout")


def _worker_group(item: pytest.Item) -> str:
    """Where ``make test`` runs a test when it spreads the suite over the machine's cores
    (pytest-xdist, ``--dist loadgroup``): a file's tests together, so its module fixtures
    start once, and each directory of :data:`_ONE_WORKER_DIRECTORIES` whole."""
    where = Path(str(item.path)).resolve()
    if not where.is_relative_to(TESTS):
        return where.as_posix()
    relative = where.relative_to(TESTS)
    if relative.parts[0] in _ONE_WORKER_DIRECTORIES:
        return relative.parts[0]
    return relative.as_posix()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m core`` alone (the passes on the pure source and the other Pythons), the
    other test modules are not even imported: their environments may lack the extras
    they need."""
    if config.getoption("markexpr", default="") != "core":
        return None
    where = collection_path.resolve()
    if not where.is_relative_to(TESTS) or where == TESTS:
        return None
    if where.is_dir():
        relative = where.relative_to(TESTS).as_posix() + "/"
        return not any(entry.startswith(relative) for entry in CORE_TESTS)
    if where.suffix == ".py" and where.name.startswith("test_"):
        return not _in_core(where)
    return None


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the core's tests ``core`` (see :data:`CORE_TESTS`)."""
    grouped = config.pluginmanager.hasplugin("xdist")
    for item in items:
        if _is_core(item):
            item.add_marker(pytest.mark.core)
        if grouped:
            item.add_marker(pytest.mark.xdist_group(_worker_group(item)))


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
