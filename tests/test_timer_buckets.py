"""The timer's buckets are intrusive lists: linked, unlinked and carried without losing
an entry, firing one twice, or keeping one alive through its neighbours."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory_aio import Timer
from purgatory_aio._timer import CASCADE_CHUNK, TimerEntry, TimerHandle
from purgatory_aio._wheels import CARRY_LEVEL, Bucket
from purgatory_aio.testing import ManualClock


class Entry(TimerEntry):
    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self._bucket = None
        self._deadline = 5.0  # what it is added at: set by whoever adds an entry
        self.n = n


def unlinked(entry: TimerEntry) -> bool:
    return entry._bucket is None and entry._prev is None and entry._next is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["append", "remove", "take", "peek"]), st.integers(0, 40)),
        max_size=120,
    )
)
def test_a_bucket_behaves_as_an_ordered_list(steps: list[tuple[str, int]]) -> None:
    # Entries are linked by the timer's add_entry alone (at one deadline: one bucket),
    # and unlinked by the bucket's remove and take.
    asyncio.run(_bucket_steps(steps))


async def _bucket_steps(steps: list[tuple[str, int]]) -> None:
    timer = Timer(clock=ManualClock())
    bucket: Bucket | None = None
    model: list[Entry] = []
    gone: list[TimerEntry] = []
    made = 0
    for action, n in steps:
        if action == "append":
            made += 1
            entry = Entry(made)
            timer.add_entry(entry, 5.0)
            assert bucket is None or entry._bucket is bucket
            bucket = entry._bucket
            model.append(entry)
        elif bucket is None:
            continue
        elif action == "remove" and model:
            entry = model.pop(n % len(model))
            bucket.remove(entry)
            gone.append(entry)
        elif action == "take":
            limit = n % 5 - 1  # -1 takes everything
            taken = bucket.take(limit)
            expected = model if limit < 0 else model[:limit]
            assert taken == expected
            del model[: len(taken)]
            gone.extend(taken)
        elif action == "peek":
            assert bucket.entries() == model
        assert len(bucket) == len(model)
        assert bucket.entries() == model
        assert (bucket.head, bucket.tail) == ((model[0], model[-1]) if model else (None, None))
        assert all(entry._bucket is bucket for entry in model)
        assert all(unlinked(entry) for entry in gone)
    timer.close()


async def test_a_carried_cascade_survives_cancels_and_reschedules() -> None:
    """More than a chunk of entries in one high-level slot: the slot is cascaded as a
    carry over several reaper passes, while callbacks cancel and reschedule entries
    still in the carry. Each survivor fires once, never early, in deadline order."""
    clock = ManualClock()
    timer = Timer(clock=clock)  # 1 ms tick, 20 slots: a level-3 slot spans 8 s
    rng = random.Random(3)
    count = 5 * CASCADE_CHUNK
    # A few due as the slot comes due (their callbacks run while the carry is fresh),
    # the rest spread over the slot, most of them beyond the cascade's lead.
    deadlines = [8.0 + 0.0004 * rng.random() for _ in range(200)]
    deadlines += [8.0 + 1.6 * rng.random() for _ in range(count - 200)]
    fired: list[tuple[int, float]] = []
    cancelled: set[int] = set()
    handles: list[TimerHandle] = []
    seen = {"carried": 0}

    def in_carry() -> list[int]:
        return [
            i
            for i, h in enumerate(handles)
            if h._bucket is not None and h._bucket.level == CARRY_LEVEL
        ]

    def fire(i: int) -> None:
        fired.append((i, clock.time()))
        if i % 7 == 0:
            carried = in_carry()
            if carried:
                seen["carried"] += 1
                for j in rng.sample(carried, min(4, len(carried))):
                    if j % 2:
                        assert handles[j].cancel()
                        cancelled.add(j)
                    else:  # due sooner than where the carry would have placed it
                        deadlines[j] = clock.time() + 0.05
                        handles[j].reschedule(0.05)

    for i, deadline in enumerate(deadlines):
        handles.append(timer.call_at(deadline, fire, i))
    await clock.advance(7.999)
    while clock.time() < 9.7:
        await clock.advance(0.0005)
    assert seen["carried"], "no callback ran while the cascade was carried"
    assert len(timer) == 0
    assert not timer._carries
    order = [i for i, _ in fired]
    assert len(order) == len(set(order)), "an entry fired twice"
    assert set(order) == set(range(count)) - cancelled
    for i, at in fired:
        assert deadlines[i] <= at <= deadlines[i] + 0.0015
    assert [deadlines[i] for i in order] == sorted(deadlines[i] for i in order)
    assert all(unlinked(h) for h in handles)


async def test_close_during_a_carry_drops_everything_and_the_timer_works_again() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    fired: list[int] = []
    handles = [timer.call_at(8.0 + 1.6 * i / 5000, fired.append, i) for i in range(5000)]
    carried = []

    def close_in_the_carry() -> None:
        carried.append(len(timer._carries))
        timer.close()

    timer.call_at(8.0, close_in_the_carry)
    await clock.advance(7.999)
    pending = len(timer)
    await clock.advance(0.002)
    assert carried == [1], "close() did not run during the carry"
    assert pending == 5001 and len(timer) == 0 and not timer._carries
    assert all(h.cancelled() or not h.pending() for h in handles)
    assert all(unlinked(h) for h in handles)
    before = len(fired)
    await clock.advance(1.0)
    assert len(fired) == before
    timer.call_later(0.01, fired.append, -1)
    await clock.advance(0.02)
    assert fired[-1] == -1 and len(timer) == 0


async def test_fired_and_cancelled_entries_hold_no_neighbours() -> None:
    clock = ManualClock()
    timer = Timer(clock=clock)
    handles = [timer.call_later(0.01 * (i % 3), lambda: None) for i in range(30)]
    for handle in handles[::4]:
        handle.cancel()
    await clock.advance(0.05)
    assert len(timer) == 0
    assert all(unlinked(h) for h in handles)
