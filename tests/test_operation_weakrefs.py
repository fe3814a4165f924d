"""Weak references to operations: they die with the operation, on both builds.

A compiled ``DelayedOperation`` once left a user's weak references pointing at
freed memory (see ``_clear_weakrefs_on_dealloc`` in ``hatch_build.py``): calling
one crashed the interpreter. The checks run in a child interpreter, so that a
regression fails this test instead of killing the test run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import purgatory_aio

SCRIPT = textwrap.dedent(
    """
    import asyncio, gc, weakref
    from purgatory_aio import DelayedOperation, Purgatory

    class Request(DelayedOperation[int]):
        def __init__(self, timeout: float, name: str) -> None:
            super().__init__(timeout)
            self.name = name

        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> int:
            return 1

    # A plain weak reference, and one with a callback.
    died = []
    op = Request(1.0, "a")
    probe = weakref.ref(op, lambda ref: died.append(ref))
    del op
    assert probe() is None and len(died) == 1, (probe(), died)
    op = Request(1.0, "b")
    probe = weakref.ref(op)
    del op
    gc.collect()
    assert probe() is None

    # A WeakSet of requests in flight, through a purgatory.
    in_flight = weakref.WeakSet()

    async def main() -> None:
        async with Purgatory("weak") as p:
            ops = [Request(5.0, str(i)) for i in range(100)]
            for op in ops:
                in_flight.add(op)
                await p.try_complete_else_watch(op, ["k"])
            assert len(in_flight) == 100
            for op in ops[:50]:
                op.force_complete()
            for op in ops[50:]:
                op.cancel()
            del ops, op

    asyncio.run(main())
    gc.collect()
    assert len(in_flight) == 0, len(in_flight)
    print("weakrefs ok", flush=True)
    """
)


def test_weak_references_to_operations_die_with_them() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    build = "compiled" if purgatory_aio.compiled else "pure"
    assert done.returncode == 0, f"{build} build: status {done.returncode}\n{done.stderr}"
    assert done.stdout.strip() == "weakrefs ok"
