"""Set-up for the adversarial lifecycle suite."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def collect_garbage_after_each_test() -> Iterator[None]:
    """Run finalizers here, not at a random allocation inside pytest's reporting.

    On a broken core a reaper or callback task dies with an exception nobody
    retrieves; its finalizer logs it whenever the collector runs. On CPython 3.11
    that can happen inside ``ast.parse`` while pytest formats a failure, which then
    aborts the whole session with "AST constructor recursion depth mismatch".
    """
    yield
    gc.collect()
