"""The core's thread identifier (``_threads.get_ident``) is ``threading.get_ident()``'s on
both builds, from any number of threads asking in turn and at once, and from threads that
end and whose identifiers a later thread reuses."""

from __future__ import annotations

import threading

import purgatory_aio
from purgatory_aio import _threads

#: Threads and calls per thread: enough interleaving to switch between askers often.
THREADS = 16
CALLS = 2_000


def test_it_answers_as_threading_does_from_threads_asking_at_once() -> None:
    wrong: list[tuple[int, int]] = []
    start = threading.Barrier(THREADS)

    def ask() -> None:
        start.wait()
        mine = threading.get_ident()
        for _ in range(CALLS):
            answer = _threads.get_ident()
            if answer != mine:
                wrong.append((answer, mine))

    threads = [threading.Thread(target=ask) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert wrong == []
    assert _threads.get_ident() == threading.get_ident()


def test_threads_that_end_and_reuse_identifiers_get_their_own() -> None:
    seen: list[tuple[int, int]] = []

    def ask() -> None:
        seen.append((_threads.get_ident(), threading.get_ident()))

    for _ in range(200):  # one at a time: the system reuses an ended thread's identifier
        thread = threading.Thread(target=ask)
        thread.start()
        thread.join(timeout=60)
        seen.append((_threads.get_ident(), threading.get_ident()))
    assert all(ours == theirs for ours, theirs in seen)
    assert all(type(ours) is int for ours, _ in seen)


def test_the_compiled_build_answers_one_thread_with_one_object() -> None:
    # What the helper is for: no new int per call while the same thread asks.
    first, second = _threads.get_ident(), _threads.get_ident()
    assert first == second
    if purgatory_aio.compiled:
        assert first is second
    else:
        assert _threads.get_ident is threading.get_ident
