"""The lifecycle against hostile users: a hypothesis state machine on a ManualClock.

Rules watch operations (plain and threshold, 1-3 keys, zero/small/tick-boundary/huge
timeouts), check, advance keys, cancel by key, force-complete and cancel from the loop
and from real threads, await and abandon awaits, move the clock (also exactly to a
deadline, far past every deadline, and out of the float range, which must be refused)
and shut down at any point. The clock starts at zero, below zero or far out, and the
event sink fails (raising Exception, CancelledError or a custom BaseException) whenever
a pattern the machine draws says so. Operations carry callbacks (sync or async
``on_complete``, ``on_expiration``, ``try_complete``) that re-enter every public method
and raise Exception, CancelledError or a custom BaseException.

The machine does not predict who wins a race; it checks that independent observations
agree after every step, once the loop is quiet: each operation's own state and callback
counts, ``num_delayed``, ``watched``, ``stats()`` and the event records, plus what a
direct call must do (``force_complete``/``cancel`` True exactly for a pending operation,
``cancel_for_key`` returning exactly the pending operations under the key, a check or an
advance leaving no satisfied operation pending, nothing expiring early or overdue).
"""

from __future__ import annotations

import asyncio
import collections
import math
import sys
import threading
from collections.abc import Callable, Coroutine, Hashable
from typing import Any, ClassVar

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule
from lc_support import LOOP_FACTORIES, Hostile, ListSink, is_settled

from purgatory_aio import DelayedOperation, OperationEvent, Purgatory, PurgatoryClosed
from purgatory_aio.testing import ManualClock

KEYS = ["a", "b", "c", 1]
STEP_LIMIT = 2.0  # real seconds a step may take before it counts as a hang
ACTIONS = [
    "check",
    "cancel_key",
    "advance_key",
    "force_other",
    "cancel_other",
    "force_self",
    "watch_new",
]
RAISES: list[type[BaseException] | None] = [
    None,
    None,
    RuntimeError,
    asyncio.CancelledError,
    Hostile,
]
STAGES = ["try", "complete", "expire"]
#: Clock readings the machine starts from: zero, below zero (tick index -1 and other
#: negative ones), and far out, where a float's spacing nears the tick.
STARTS = [0.0, -1.0, -0.0015, -0.0005, -1e6 - 0.0005, 4e9 + 0.0003, -4e12]
#: What the sink raises when it fails (a BaseException that is not fatal included).
SINK_ERRORS: list[type[BaseException]] = [RuntimeError, OSError, asyncio.CancelledError, Hostile]
#: The timer places deadlines up to this many ticks of the clock (purgatory_aio's MAX_TICKS).
MAX_TICKS = 2**53


class FlakySink(ListSink):
    """An event sink that fails when its pattern says so (cycled), raising ``error``."""

    def __init__(self) -> None:
        super().__init__()
        self.pattern: list[bool] = [False]
        self.error: type[BaseException] = RuntimeError
        self.calls = 0
        self.refused: list[OperationEvent] = []

    def emit(self, event: OperationEvent) -> None:
        fails = self.pattern[self.calls % len(self.pattern)]
        self.calls += 1
        if fails:
            self.refused.append(event)
            raise self.error(f"sink refused {event.op_id}")
        super().emit(event)


class MachineOp(DelayedOperation[str]):
    """An operation whose callbacks re-enter the purgatory and may raise, once each."""

    def __init__(
        self,
        machine: LifecycleMachine,
        n: int,
        timeout: float,
        actions: dict[str, tuple[str, int]],
        raises: dict[str, type[BaseException] | None],
    ) -> None:
        super().__init__(timeout)
        self.machine = machine
        self.n = n
        self.actions = actions
        self.raises = raises
        self.used: set[str] = set()
        self.completable = False
        self.armed = False  # try_complete raises only once watched, never at the first try
        self.completions = 0
        self.expirations = 0
        self.completed_at: float | None = None
        self.complete_raised = False
        self.try_raised = False

    def _stage(self, stage: str) -> None:
        if stage in self.used:
            return
        if stage == "try" and not self.armed:
            return
        self.used.add(stage)
        action = self.actions.get(stage)
        if action is not None:
            self.machine.reenter(self, *action)
        kind = self.raises.get(stage)
        if kind is not None:
            if stage == "complete":
                self.complete_raised = True
            elif stage == "try":
                self.try_raised = True
            raise kind(f"op{self.n} {stage}")

    def try_complete(self) -> bool:
        self._stage("try")
        if self.completable:
            return self.force_complete()
        return False

    def on_complete(self) -> str:
        self.completions += 1
        self.completed_at = self.machine.clock.time()
        self._stage("complete")
        return "done"

    def on_expiration(self) -> None:
        self.expirations += 1
        self._stage("expire")

    def __repr__(self) -> str:
        return f"op{self.n}:{super().__repr__()}"


class AsyncMachineOp(MachineOp):
    async def on_complete(self) -> str:  # type: ignore[override]
        await asyncio.sleep(0)
        return MachineOp.on_complete(self)

    async def on_expiration(self) -> None:  # type: ignore[override]
        await asyncio.sleep(0)
        MachineOp.on_expiration(self)


class Record:
    """What the machine knows about one operation it created."""

    def __init__(self, op: MachineOp, keys: tuple[Hashable, ...], threshold: float | None):
        self.op = op
        self.keys = keys
        self.threshold = threshold
        self.accepted = False  # handed to the purgatory (not refused)
        self.deadline = 0.0


def ended(op: MachineOp) -> bool:
    return op.is_completed or is_settled(op)


def cancelled(op: MachineOp) -> bool:
    return is_settled(op) and not op.is_completed


timeouts = st.one_of(
    st.sampled_from([0.0, 0.001, 0.002, 0.005, 0.0015, 0.0333, 1e6]),
    st.floats(min_value=0.0, max_value=0.05, allow_nan=False),
)
key_lists = st.lists(st.sampled_from(KEYS), min_size=1, max_size=3)
action_maps = st.dictionaries(
    st.sampled_from(STAGES),
    st.tuples(st.sampled_from(ACTIONS), st.integers(min_value=0, max_value=50)),
    max_size=2,
)
raise_maps = st.dictionaries(st.sampled_from(STAGES), st.sampled_from(RAISES), max_size=2)


class LifecycleMachine(RuleBasedStateMachine):
    loop_factory: ClassVar[Callable[[], asyncio.AbstractEventLoop]]
    records = Bundle("records")

    @initialize(
        tick=st.sampled_from([0.001, 0.005]),
        purge_interval=st.sampled_from([1, 3, 1000]),
        start=st.sampled_from(STARTS),
    )
    def start(self, tick: float, purge_interval: int, start: float) -> None:
        self.loop = type(self).loop_factory()
        self.clock = ManualClock(start=start)
        self.sink = FlakySink()
        self.tick = tick
        self.purge_interval = purge_interval
        self.p = Purgatory(
            "machine",
            clock=self.clock,
            tick=tick,
            purge_interval=purge_interval,
            event_sink=self.sink,
        )
        self.all: list[Record] = []
        self.awaiters: list[asyncio.Task[Any]] = []
        self.spawned: list[asyncio.Task[Any]] = []
        self.escapes: list[str] = []
        self.closed = False
        self.shutdown_at: float | None = None
        self.run(self._bind())

    async def _bind(self) -> None:
        # Bind the purgatory to this loop with a watch that completes at once.
        record = self.new_record(0.0, ("bind",), None, {}, {}, sync=True)
        record.op.completable = True
        assert await self.p.try_complete_else_watch(record.op, record.keys) is True
        record.accepted = True

    def teardown(self) -> None:
        if not hasattr(self, "loop"):
            return
        try:
            self.closed = True
            if self.shutdown_at is None:
                self.shutdown_at = self.clock.time()
            self.run(self._shutdown())
            self.check_everything()
            for record in self.all:
                op = record.op
                if record.accepted:
                    assert is_settled(op), f"shutdown left {op!r} unsettled"
            self.run(self._awaiters_return())
            assert not self.escapes, f"exceptions escaped public calls: {self.escapes}"
        finally:
            for task in [*self.awaiters, *self.spawned]:
                task.cancel()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()

    async def _awaiters_return(self) -> None:
        if self.awaiters:
            _, pending = await asyncio.wait(self.awaiters, timeout=2.0)
            assert not pending, f"{len(pending)} tasks awaiting settled operations never returned"

    # -- plumbing ---------------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run one step's coroutine, then let the loop go quiet; a hang is a failure."""

        async def bounded() -> Any:
            try:
                async with asyncio.timeout(STEP_LIMIT):
                    result = await coro
                    await self.clock.advance(0)
                    return result
            except TimeoutError:
                raise AssertionError(f"a step hung for {STEP_LIMIT}s") from None

        return self.loop.run_until_complete(bounded())

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A public call from a rule: anything it lets out is recorded as a failure."""
        try:
            return fn(*args)
        except BaseException as exc:
            self.escapes.append(f"{what} let {type(exc).__name__}({exc}) escape")
            return None

    def new_record(
        self,
        timeout: float,
        keys: tuple[Hashable, ...],
        threshold: float | None,
        actions: dict[str, tuple[str, int]],
        raises: dict[str, type[BaseException] | None],
        sync: bool,
    ) -> Record:
        cls = MachineOp if sync else AsyncMachineOp
        op = cls(self, len(self.all), timeout, actions, raises)
        record = Record(op, tuple(dict.fromkeys(keys)), threshold)
        self.all.append(record)
        return record

    def pending(self) -> list[Record]:
        return [r for r in self.all if r.accepted and not ended(r.op)]

    def under(self, key: Hashable) -> list[Record]:
        return [r for r in self.pending() if key in r.keys]

    def pick(self, index: int) -> Record | None:
        records = [r for r in self.all if r.accepted]
        return records[index % len(records)] if records else None

    async def watch(self, record: Record) -> None:
        """Hand ``record.op`` to the purgatory, as a rule or a callback would."""
        before = self.clock.time()
        try:
            if record.threshold is None:
                await self.p.try_complete_else_watch(record.op, record.keys)
            else:
                await self.p.watch_threshold(record.op, record.keys[0], record.threshold)
        except PurgatoryClosed:
            assert self.closed, "PurgatoryClosed from a purgatory that was not shut down"
            return
        except ValueError:
            # Refused (a deadline the timer cannot place): nothing may have changed.
            beyond = before + record.op.timeout >= MAX_TICKS * self.tick
            assert record.op.timeout > 1e9 or beyond, f"{record.op!r} refused with ValueError"
            assert not record.op.is_completed
            return
        except BaseException as exc:
            self.escapes.append(f"a watch let {type(exc).__name__}({exc}) escape")
            return
        assert not self.closed, "a watch after shutdown did not raise PurgatoryClosed"
        record.accepted = True
        record.deadline = before + record.op.timeout
        record.op.armed = True

    # -- callbacks re-entering the purgatory ------------------------------------------------

    def reenter(self, op: MachineOp, action: str, arg: int) -> None:
        key = KEYS[arg % len(KEYS)]
        try:
            if action == "check":
                self.p.check_and_complete(key)
            elif action == "cancel_key":
                self.p.cancel_for_key(key)
            elif action == "advance_key":
                self.p.advance_key(key, arg)
            elif action == "force_self":
                op.force_complete()
            elif action in ("force_other", "cancel_other"):
                other = self.pick(arg)
                if other is not None:
                    other.op.force_complete() if action == "force_other" else other.op.cancel()
            elif action == "watch_new":
                record = self.new_record(arg / 1000, (key,), None, {}, {}, sync=arg % 2 == 0)
                record.op.completable = arg % 3 == 0
                self.spawned.append(self.loop.create_task(self.watch(record)))
        except BaseException as exc:
            self.escapes.append(
                f"{action}({key!r}) from a callback of op{op.n} let {type(exc).__name__}({exc}) "
                "escape"
            )

    # -- rules --------------------------------------------------------------------------------

    @rule(
        target=records,
        timeout=timeouts,
        keys=key_lists,
        actions=action_maps,
        raises=raise_maps,
        sync=st.booleans(),
        completable=st.booleans(),
    )
    def watch_op(
        self,
        timeout: float,
        keys: list[Hashable],
        actions: dict[str, tuple[str, int]],
        raises: dict[str, type[BaseException] | None],
        sync: bool,
        completable: bool,
    ) -> Record:
        record = self.new_record(timeout, tuple(keys), None, actions, raises, sync)
        record.op.completable = completable
        self.run(self.watch(record))
        return record

    @rule(
        target=records,
        timeout=timeouts,
        key=st.sampled_from(KEYS),
        threshold=st.integers(min_value=0, max_value=20),
        actions=action_maps,
        raises=raise_maps,
        sync=st.booleans(),
    )
    def watch_threshold(
        self,
        timeout: float,
        key: Hashable,
        threshold: int,
        actions: dict[str, tuple[str, int]],
        raises: dict[str, type[BaseException] | None],
        sync: bool,
    ) -> Record:
        record = self.new_record(timeout, (key,), threshold, actions, raises, sync)
        self.run(self.watch(record))
        return record

    @rule(target=records, timeout=st.sampled_from([1e300, 1e306]), key=st.sampled_from(KEYS))
    def watch_huge(self, timeout: float, key: Hashable) -> Record:
        try:
            record = self.new_record(timeout, (key,), None, {}, {}, sync=True)
        except (ValueError, TypeError):  # refused at construction: the contract allows it
            return self.new_record(0.0, (key,), None, {}, {}, sync=True)
        self.run(self.watch(record))
        return record

    @rule(record=records)
    def make_completable(self, record: Record) -> None:
        record.op.completable = True

    @rule(key=st.sampled_from(KEYS))
    def check(self, key: Hashable) -> None:
        satisfied = [r for r in self.under(key) if r.op.completable]
        before = {id(r) for r in self.pending()}
        count = self.run(
            self._sync(lambda: self.call("check_and_complete", self.p.check_and_complete, key))
        )
        missed = [r.op for r in satisfied if not ended(r.op)]
        assert not missed, (
            f"check_and_complete({key!r}) left satisfied operations pending: {missed}"
        )
        newly = [r for r in self.all if id(r) in before and r.op.is_completed]
        if count is not None:
            assert 0 <= count <= len(newly), f"check_and_complete returned {count}"

    @rule(key=st.sampled_from(KEYS))
    def check_from_thread(self, key: Hashable) -> None:
        satisfied = [r for r in self.under(key) if r.op.completable]
        futures: list[Any] = []

        def from_thread() -> None:
            futures.append(
                self.call(
                    "check_and_complete_threadsafe", self.p.check_and_complete_threadsafe, key
                )
            )

        thread = threading.Thread(target=from_thread)
        thread.start()
        thread.join()
        (future,) = futures
        if future is not None:
            self.run(self._wrapped(future))
        missed = [r.op for r in satisfied if not ended(r.op)]
        assert not missed, f"check_and_complete_threadsafe left satisfied operations: {missed}"

    @rule(key=st.sampled_from(KEYS))
    def cancel_key(self, key: Hashable) -> None:
        expected = {id(r.op) for r in self.under(key)}
        got = self.run(self._sync(lambda: self.call("cancel_for_key", self.p.cancel_for_key, key)))
        got_ids = {id(op) for op in got or ()}
        assert got_ids == expected, (
            f"cancel_for_key({key!r}) returned {sorted(op.n for op in got or ())}, "
            f"pending under it: {sorted(r.op.n for r in self.all if id(r.op) in expected)}"
        )
        assert all(cancelled(r.op) for r in self.all if id(r.op) in expected)

    @rule(key=st.sampled_from(KEYS), value=st.integers(min_value=0, max_value=25))
    def advance_key(self, key: Hashable, value: int) -> None:
        satisfied = [
            r
            for r in self.under(key)
            if r.threshold is not None and r.threshold <= value and r.op.completable
        ]
        self.run(self._sync(lambda: self.call("advance_key", self.p.advance_key, key, value)))
        missed = [r.op for r in satisfied if not ended(r.op)]
        assert not missed, f"advance_key({key!r}, {value}) left satisfied operations: {missed}"

    @rule(record=records)
    def force_complete(self, record: Record) -> None:
        free = not ended(record.op)
        won = self.run(self._sync(lambda: self.call("force_complete", record.op.force_complete)))
        assert won is None or won == free, f"force_complete() on {record.op!r} returned {won}"

    @rule(record=records)
    def cancel(self, record: Record) -> None:
        free = not ended(record.op)
        won = self.run(self._sync(lambda: self.call("cancel", record.op.cancel)))
        assert won is None or won == free, f"cancel() on {record.op!r} returned {won}"

    @rule(record=records, complete=st.booleans())
    def from_thread(self, record: Record, complete: bool) -> None:
        if not record.accepted:
            return  # covered by a regression test: no loop, no purgatory
        free = not ended(record.op)
        what = "force_complete" if complete else "cancel"
        results: list[Any] = []
        thread = threading.Thread(
            target=lambda: results.append(
                self.call(f"{what} from a thread", getattr(record.op, what))
            )
        )
        thread.start()
        thread.join()
        self.run(asyncio.sleep(0))
        assert results[0] is None or results[0] == free, (
            f"{what}() from a thread returned {results}"
        )

    @rule(dt=st.one_of(st.sampled_from([0.0, 0.001, 0.005]), st.floats(0, 0.03)))
    def advance_clock(self, dt: float) -> None:
        self.run(self.clock.advance(dt))
        self.check_expiry()

    @rule(dt=st.sampled_from([1e6, 1e15, 1e300, 1e308, sys.float_info.max]))
    def advance_clock_far(self, dt: float) -> None:
        before = self.clock.time()
        if before + dt == math.inf:
            try:
                self.run(self.clock.advance(dt))
            except ValueError:
                pass
            else:
                raise AssertionError(f"advance({dt}) from {before} moved time out of range")
            assert self.clock.time() == before, "a refused advance moved the clock"
            return
        self.run(self.clock.advance(dt))
        self.check_expiry()

    @rule(
        pattern=st.lists(st.booleans(), min_size=1, max_size=4),
        error=st.sampled_from(SINK_ERRORS),
    )
    def sink_fails(self, pattern: list[bool], error: type[BaseException]) -> None:
        self.sink.pattern = pattern
        self.sink.error = error

    @rule(record=records, extra=st.sampled_from([0.0, 1e-9, 0.001]))
    def advance_to_deadline(self, record: Record, extra: float) -> None:
        target = record.deadline + extra
        if record.accepted and record.op.timeout < 1e3 and target >= self.clock.time():
            self.run(self.clock.advance_to(target))
            self.check_expiry()

    @rule(record=records, abandon=st.booleans())
    def await_op(self, record: Record, abandon: bool) -> None:
        if not record.accepted:
            return  # nothing settles an operation nobody holds

        async def waiter() -> Any:
            try:
                return await record.op
            except BaseException as exc:  # the op's own outcome, whatever it is
                return exc

        async def start() -> None:
            task = self.loop.create_task(waiter())
            await asyncio.sleep(0)
            if abandon:
                task.cancel()
            else:
                self.awaiters.append(task)

        self.run(start())

    @rule()
    def shutdown(self) -> None:
        if self.shutdown_at is None:
            self.shutdown_at = self.clock.time()
        self.closed = True
        self.run(self._shutdown())
        leftover = [r.op for r in self.all if r.accepted and not is_settled(r.op)]
        assert not leftover, f"shutdown() returned with operations unsettled: {leftover}"

    async def _shutdown(self) -> None:
        try:
            await self.p.shutdown()
        except BaseException as exc:
            self.escapes.append(f"shutdown let {type(exc).__name__}({exc}) escape")

    async def _sync(self, fn: Callable[[], Any]) -> Any:
        return fn()

    async def _wrapped(self, future: Any) -> Any:
        return await asyncio.wrap_future(future)

    # -- invariants ---------------------------------------------------------------------------

    def check_expiry(self) -> None:
        now = self.clock.time()
        overdue = [
            r.op for r in self.pending() if r.deadline + self.tick <= now and r.op.timeout < 1e3
        ]
        assert not overdue, f"at {now}, operations more than a tick past their deadline: {overdue}"

    @invariant()
    def books_agree(self) -> None:
        if hasattr(self, "p"):
            self.check_everything()

    def check_everything(self) -> None:
        assert not self.escapes, f"exceptions escaped public calls: {self.escapes}"
        accepted = [r for r in self.all if r.accepted]
        for r in self.all:
            op = r.op
            assert op.completions <= 1, f"on_complete ran {op.completions} times for {op!r}"
            assert op.expirations <= 1, f"on_expiration ran {op.expirations} times for {op!r}"
            if cancelled(op):
                assert op.completions == 0, f"on_complete ran for cancelled {op!r}"
            if not op.expired:
                assert op.expirations == 0, f"on_expiration ran for {op!r}, which did not expire"
        for r in accepted:
            op = r.op
            if op.is_completed:
                assert is_settled(op), f"{op!r} completed but not settled once the loop is quiet"
                # An operation whose try_complete raised is settled with that error.
                assert op.completions == 1 or (op.try_raised and op.completions == 0), (
                    f"on_complete ran {op.completions} times for completed {op!r}"
                )
                if op.expired and not op.complete_raised:
                    assert op.expirations == 1, f"on_expiration never ran for expired {op!r}"
            if op.expired and op.completed_at is not None:
                by_shutdown = self.shutdown_at is not None and op.completed_at >= self.shutdown_at
                assert by_shutdown or op.completed_at >= r.deadline, (
                    f"{op!r} expired at {op.completed_at}, before its deadline {r.deadline}"
                )
        pending = self.pending()
        assert self.p.num_delayed == len(pending), (
            f"num_delayed={self.p.num_delayed}, pending operations: {len(pending)}"
        )
        live = sum(len(r.keys) for r in pending)
        assert live <= self.p.watched <= live + self.purge_interval, (
            f"watched={self.p.watched} with {live} live watch entries "
            f"(purge_interval={self.purge_interval})"
        )
        stats = self.p.stats()
        expected = {
            "completed": sum(1 for r in accepted if r.op.is_completed and not r.op.expired),
            "expired+shutdown": sum(1 for r in accepted if r.op.expired),
            "cancelled": sum(1 for r in accepted if cancelled(r.op)),
            "pending": len(pending),
        }
        actual = {
            "completed": stats.completed,
            "expired+shutdown": stats.expired + stats.shutdown,
            "cancelled": stats.cancelled,
            "pending": stats.pending,
        }
        assert actual == expected, f"stats() {actual} but the operations say {expected}"
        settled = sum(1 for r in accepted if is_settled(r.op))
        assert self.sink.calls == settled, (
            f"{self.sink.calls} event records for {settled} settled operations "
            "(an operation settled twice, or one never recorded)"
        )
        refused = self.sink.refused
        assert stats.events_failed == len(refused), (stats, len(refused))
        outcomes = collections.Counter(e.outcome for e in [*self.sink.events, *refused])
        assert outcomes["cancelled"] == stats.cancelled, (outcomes, stats)
        assert outcomes["shutdown"] == stats.shutdown, (outcomes, stats)


# No shrinking: on a broken core every example fails in its own way and shrinking them
# all takes many minutes; the first failing run is reported, every step listed, and the
# assertion says what broke. To shrink one locally, add Phase.shrink to the phases.
SETTINGS = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class AsyncioLifecycle(LifecycleMachine):
    loop_factory = staticmethod(LOOP_FACTORIES["asyncio"])


class UvloopLifecycle(LifecycleMachine):
    loop_factory = staticmethod(LOOP_FACTORIES["uvloop"])


AsyncioLifecycle.TestCase.settings = SETTINGS
UvloopLifecycle.TestCase.settings = SETTINGS
TestLifecycleOnAsyncio = AsyncioLifecycle.TestCase
TestLifecycleOnUvloop = UvloopLifecycle.TestCase
