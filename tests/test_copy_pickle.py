"""copy.copy, copy.deepcopy and pickle: what can be copied, and what a copy is.

A fresh operation (never handed to a purgatory, completed or cancelled) copies as
a new fresh operation of its class: the same timeout, the subclass's own state
(instance dict and slots), none of the library's. Anything live refuses with a
TypeError and is left as it was: an operation handed to a purgatory, completed
or cancelled, and a Purgatory, Timer, TimerHandle or ManualClock.
"""

from __future__ import annotations

import asyncio
import copy
import pickle
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from support import awaiting

from purgatory_aio import DelayedOperation, Purgatory, Timer
from purgatory_aio.testing import ManualClock

# -- operations of every shape, at module level so that pickle finds them ------------------


class Plain(DelayedOperation[str]):
    """No __slots__: its state lives in the instance dict, set in __init__."""

    inits: ClassVar[int] = 0

    def __init__(self, timeout: float, payload: object) -> None:
        super().__init__(timeout)
        type(self).inits += 1
        self.payload = payload
        self.ready = False
        self.completions = 0
        self.expirations = 0

    def try_complete(self) -> bool:
        return self.ready and self.force_complete()

    def on_complete(self) -> str:
        self.completions += 1
        return "expired" if self.expired else "completed"

    def on_expiration(self) -> None:
        self.expirations += 1

    def snapshot(self) -> dict[str, object]:
        return {"payload": self.payload, "ready": self.ready, "counts": self.counts()}

    def counts(self) -> tuple[int, int]:
        return (self.completions, self.expirations)


class Slotted(DelayedOperation[str]):
    """__slots__ only (one of them private and name-mangled), no instance dict."""

    __slots__ = ("__secret", "completions", "expirations", "payload", "ready")

    def __init__(self, timeout: float, payload: object, secret: object = "s") -> None:
        super().__init__(timeout)
        self.payload = payload
        self.ready = False
        self.completions = 0
        self.expirations = 0
        self.__secret = secret

    @property
    def secret(self) -> object:
        return self.__secret

    def try_complete(self) -> bool:
        return self.ready and self.force_complete()

    def on_complete(self) -> str:
        self.completions += 1
        return "expired" if self.expired else "completed"

    def on_expiration(self) -> None:
        self.expirations += 1

    def snapshot(self) -> dict[str, object]:
        return {
            "payload": self.payload,
            "ready": self.ready,
            "counts": self.counts(),
            "secret": self.secret,
        }

    def counts(self) -> tuple[int, int]:
        return (self.completions, self.expirations)


class _Hidden(Slotted):
    """Another private slot of the same name, in a class whose name starts with "_"."""

    __slots__ = ("__secret",)

    def __init__(self, timeout: float, payload: object, secret: object, mine: object) -> None:
        super().__init__(timeout, payload, secret)
        self.__secret = mine

    @property
    def own_secret(self) -> object:
        return self.__secret


class Both(_Hidden):
    """Slots (two private ones of the same name) and, having no __slots__, an instance dict."""

    def __init__(self, timeout: float, payload: object, secret: object, mine: object) -> None:
        super().__init__(timeout, payload, secret, mine)
        self.note = "in the dict"

    def snapshot(self) -> dict[str, object]:
        return {**super().snapshot(), "own_secret": self.own_secret, "note": self.note}


class Stateless(DelayedOperation[int]):
    """No state of its own at all."""

    __slots__ = ()

    def try_complete(self) -> bool:
        return self.force_complete()

    def on_complete(self) -> int:
        return 7


class Caching(Plain):
    """Leaves a cache out of its state, the standard way."""

    def __init__(self, timeout: float, payload: object) -> None:
        super().__init__(timeout, payload)
        self.cache: dict[str, object] = {"warm": True}

    def __getstate__(self) -> object:
        state = super().__getstate__()
        assert isinstance(state, dict)
        return {name: value for name, value in state.items() if name != "cache"}

    def __setstate__(self, state: object) -> None:
        super().__setstate__(state)
        self.cache = {}


class SkipsSuperInit(DelayedOperation[int]):
    def __init__(self, timeout: float) -> None:  # forgets super().__init__(timeout)
        self.timeout_seconds = timeout

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> int:
        return 0


Op = Plain | Slotted


def plain(timeout: float = 5.0) -> Plain:
    return Plain(timeout, ["payload"])


def slotted(timeout: float = 5.0) -> Slotted:
    return Slotted(timeout, ["payload"], secret="hidden")


def both(timeout: float = 5.0) -> Both:
    return Both(timeout, ["payload"], secret="base's", mine="own")


KINDS: dict[str, Callable[..., Op]] = {"plain": plain, "slotted": slotted, "both": both}


def pickled(obj: Any, protocol: int = pickle.HIGHEST_PROTOCOL) -> Any:
    return pickle.loads(pickle.dumps(obj, protocol))


COPIERS: dict[str, Callable[[Any], Any]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": pickled,
}


def dumps_with(protocol: int) -> Callable[[Any], object]:
    return lambda obj: pickle.dumps(obj, protocol)


#: Ways of copying that must be refused: both copies, and pickling with each protocol.
REFUSERS: dict[str, Callable[[Any], object]] = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    **{
        f"pickle-{protocol}": dumps_with(protocol)
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1)
    },
}

with_kinds = pytest.mark.parametrize("kind", list(KINDS.values()), ids=list(KINDS))
with_copiers = pytest.mark.parametrize("copier", list(COPIERS.values()), ids=list(COPIERS))
with_refusers = pytest.mark.parametrize("refuse", list(REFUSERS.values()), ids=list(REFUSERS))


def is_fresh(op: DelayedOperation[Any]) -> bool:
    return not (op.is_completed or op.cancelled or op.done()) and op.deadline is None


# -- a fresh operation copies as a fresh operation -----------------------------------------


@with_kinds
@with_copiers
def test_a_copy_is_a_new_fresh_operation_of_the_same_class_timeout_and_state(
    kind: Callable[..., Op], copier: Callable[[Any], Any]
) -> None:
    op = kind(2.5)
    twin = copier(op)
    assert twin is not op
    assert type(twin) is type(op)
    assert twin.timeout == 2.5
    assert twin.snapshot() == op.snapshot()
    assert is_fresh(twin) and twin.keys == ()


@with_kinds
def test_copy_shares_the_attribute_values(kind: Callable[..., Op]) -> None:
    op = kind()
    assert copy.copy(op).payload is op.payload


@with_kinds
@pytest.mark.parametrize("copier", [copy.deepcopy, pickled], ids=["deepcopy", "pickle"])
def test_deepcopy_and_pickle_copy_the_attribute_values(
    kind: Callable[..., Op], copier: Callable[[Any], Any]
) -> None:
    op = kind()
    twin = copier(op)
    assert twin.payload == op.payload and twin.payload is not op.payload
    twin.payload.append("more")
    assert op.payload == ["payload"]


@pytest.mark.parametrize(
    ("kind", "names"),
    [
        (plain, {"payload", "ready", "completions", "expirations"}),
        (slotted, {"payload", "ready", "completions", "expirations", "_Slotted__secret"}),
        (
            both,
            {"payload", "ready", "completions", "expirations", "_Slotted__secret"}
            | {"_Hidden__secret", "note"},
        ),
    ],
    ids=list(KINDS),
)
def test_the_state_is_the_subclass_own_attributes_only(
    kind: Callable[..., Op], names: set[str]
) -> None:
    state = kind().__getstate__()
    assert isinstance(state, dict)
    assert set(state) == names


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@with_kinds
def test_a_pickle_holds_none_of_the_library_state(kind: Callable[..., Op], protocol: int) -> None:
    data = pickle.dumps(kind(), protocol)
    for internal in (b"_owner", b"_state", b"_store", b"_waiter", b"_bucket", b"_lifecycle"):
        assert internal not in data
    assert pickle.loads(data).snapshot() == kind().snapshot()


def test_private_slots_of_the_same_name_in_two_classes_keep_their_own_values() -> None:
    for twin in (copy.copy(both()), copy.deepcopy(both()), pickled(both())):
        assert (twin.secret, twin.own_secret) == ("base's", "own")


def test_an_unset_slot_stays_unset_in_the_copy() -> None:
    op = slotted()
    del op.payload
    for twin in (copy.copy(op), copy.deepcopy(op), pickled(op)):
        assert not hasattr(twin, "payload")
        assert twin.secret == "hidden"


@with_copiers
def test_an_operation_with_no_state_of_its_own_copies(copier: Callable[[Any], Any]) -> None:
    op = Stateless(1)
    assert op.__getstate__() is None
    twin = copier(op)
    assert type(twin) is Stateless and twin.timeout == 1.0 and is_fresh(twin)
    assert twin.try_complete() and twin.result() == 7
    assert is_fresh(op)


@with_kinds
@pytest.mark.parametrize("copier", [copy.deepcopy, pickled], ids=["deepcopy", "pickle"])
def test_a_reference_to_itself_refers_to_the_copy(
    kind: Callable[..., Op], copier: Callable[[Any], Any]
) -> None:
    op = kind()
    op.payload = [op]
    twin = copier(op)
    assert twin.payload[0] is twin
    assert op.payload[0] is op


@with_copiers
def test_the_subclass_init_does_not_run_again(copier: Callable[[Any], Any]) -> None:
    op = plain()
    before = Plain.inits
    copier(op)
    assert Plain.inits == before


@with_copiers
def test_a_subclass_can_leave_attributes_out_of_its_state(copier: Callable[[Any], Any]) -> None:
    op = Caching(1, "p")
    twin = copier(op)
    assert twin.cache == {} and twin.payload == "p"
    assert op.cache == {"warm": True}


@with_copiers
def test_an_instance_op_type_is_the_subclass_own_state(copier: Callable[[Any], Any]) -> None:
    op = plain()
    op.op_type = "fetch-follower"  # type: ignore[misc]  # read off the class by the library
    assert copier(op).op_type == "fetch-follower"


@with_kinds
def test_an_operation_completed_on_its_own_after_being_copied_leaves_the_copy_fresh(
    kind: Callable[..., Op],
) -> None:
    op = kind()
    twin = copy.copy(op)
    assert op.force_complete()
    assert is_fresh(twin) and twin.counts() == (0, 0)
    assert twin.force_complete() and twin.result() == "completed"
    assert op.counts() == twin.counts() == (1, 0)


# -- a copy is independent: each settles exactly once, in a purgatory ----------------------


@with_kinds
@with_copiers
async def test_the_copy_completes_exactly_once_and_the_original_is_unaffected(
    clock: ManualClock, kind: Callable[..., Op], copier: Callable[[Any], Any]
) -> None:
    op = kind()
    twin = copier(op)
    async with Purgatory("p", clock=clock) as p:
        assert not await p.try_complete_else_watch(twin, ["k"])
        twin.ready = True
        assert p.check_and_complete("k") == 1
        assert p.check_and_complete("k") == 0
        assert await twin == "completed"
        assert twin.counts() == (1, 0)
        assert is_fresh(op) and op.counts() == (0, 0)
        assert p.num_delayed == 0


@with_kinds
@with_copiers
async def test_the_copy_expires_exactly_once_at_its_own_deadline(
    clock: ManualClock, kind: Callable[..., Op], copier: Callable[[Any], Any]
) -> None:
    twin = copier(kind(0.5))
    async with Purgatory("p", clock=clock) as p:
        await p.try_complete_else_watch(twin, ["k"])
        await clock.advance(0.499)
        assert not twin.is_completed
        await clock.advance(0.01)
        assert twin.expired
        await clock.advance(5)
        assert twin.counts() == (1, 1)
        assert await twin == "expired"


@with_kinds
@with_copiers
async def test_the_original_settles_exactly_once_and_the_copy_is_unaffected(
    clock: ManualClock, kind: Callable[..., Op], copier: Callable[[Any], Any]
) -> None:
    op = kind(0.5)
    twin = copier(op)
    async with Purgatory("p", clock=clock) as p:
        await p.try_complete_else_watch(op, ["k"])
        await clock.advance(1)
        assert op.expired and op.counts() == (1, 1)
        assert is_fresh(twin) and twin.counts() == (0, 0)
        # and then the copy has a life of its own in the same purgatory, under the same key
        await p.try_complete_else_watch(twin, ["k"])
        twin.ready = True
        assert p.check_and_complete("k") == 1
        assert await twin == "completed"
        assert op.counts() == (1, 1) and twin.counts() == (1, 0)


@with_kinds
async def test_copies_of_one_operation_settle_independently(
    clock: ManualClock, kind: Callable[..., Op]
) -> None:
    op = kind(1)
    twins = [copy.copy(op), copy.deepcopy(op), pickled(op)]
    async with Purgatory("p", clock=clock) as p:
        for twin in twins:
            await p.try_complete_else_watch(twin, ["k"])
        assert p.num_delayed == 3
        twins[0].ready = True
        assert p.check_and_complete("k") == 1
        twins[1].cancel()
        await clock.advance(1)
        assert [t.counts() for t in twins] == [(1, 0), (0, 0), (1, 1)]
        assert p.num_delayed == 0
    assert is_fresh(op)


async def test_a_fresh_operation_cannot_be_awaited_so_no_copy_shares_awaiters(
    clock: ManualClock,
) -> None:
    # Only a fresh operation copies, and awaiting one (pending in no purgatory) is refused:
    # a copy can never carry the original's awaiters. The refusal leaves it fresh.
    op = plain()
    waiter = asyncio.ensure_future(awaiting(op))
    with pytest.raises(RuntimeError, match="never handed to a purgatory"):
        await waiter
    twin = copy.copy(op)
    assert twin.force_complete()
    assert not op.done()
    assert op.force_complete()
    assert await awaiting(op) == await awaiting(twin) == "completed"
    assert op.counts() == twin.counts() == (1, 0)


async def test_an_operation_a_purgatory_refused_is_still_fresh_and_copies(
    clock: ManualClock,
) -> None:
    op = plain()
    async with Purgatory("p", clock=clock) as p:
        with pytest.raises(ValueError, match="empty"):
            await p.try_complete_else_watch(op, [])
        twin = copy.copy(op)
        assert is_fresh(twin)
        await p.try_complete_else_watch(twin, ["k"])
        await p.try_complete_else_watch(op, ["k"])
        assert p.num_delayed == 2


# -- anything but a fresh operation refuses, and is left as it was -------------------------


@with_kinds
@with_refusers
async def test_copying_an_operation_pending_in_a_purgatory_is_refused(
    clock: ManualClock, kind: Callable[..., Op], refuse: Callable[[Any], object]
) -> None:
    op = kind()
    async with Purgatory("fetch", clock=clock) as p:
        await p.try_complete_else_watch(op, ["k"])
        waiter = asyncio.ensure_future(awaiting(op))
        await asyncio.sleep(0)
        with pytest.raises(TypeError, match="it is pending in purgatory 'fetch'"):
            refuse(op)
        assert not op.is_completed and op.deadline == 5.0 and op.keys == ("k",)
        assert (p.num_delayed, p.watched) == (1, 1)
        op.ready = True
        assert p.check_and_complete("k") == 1
        assert await waiter == "completed"
        assert op.counts() == (1, 0)


@with_kinds
@with_refusers
def test_copying_an_operation_completed_on_its_own_is_refused(
    kind: Callable[..., Op], refuse: Callable[[Any], object]
) -> None:
    op = kind()
    op.force_complete()
    with pytest.raises(TypeError, match="it is completed, and only a fresh operation"):
        refuse(op)
    assert op.result() == "completed" and op.counts() == (1, 0)
    assert op.force_complete() is False


@with_kinds
@with_refusers
async def test_copying_an_operation_completed_in_a_purgatory_is_refused(
    clock: ManualClock, kind: Callable[..., Op], refuse: Callable[[Any], object]
) -> None:
    op = kind()
    op.ready = True
    async with Purgatory("fetch", clock=clock) as p:
        assert await p.try_complete_else_watch(op, ["k"])
        with pytest.raises(TypeError, match="it is completed in purgatory 'fetch'"):
            refuse(op)
        assert await op == "completed" and op.counts() == (1, 0)


@with_kinds
@with_refusers
async def test_copying_an_expired_operation_is_refused(
    clock: ManualClock, kind: Callable[..., Op], refuse: Callable[[Any], object]
) -> None:
    op = kind(0.5)
    async with Purgatory("fetch", clock=clock) as p:
        await p.try_complete_else_watch(op, ["k"])
        await clock.advance(1)
        with pytest.raises(TypeError, match="it is expired in purgatory 'fetch'"):
            refuse(op)
        assert await op == "expired" and op.counts() == (1, 1)
        await clock.advance(1)
        assert op.counts() == (1, 1)


@with_kinds
@with_refusers
def test_copying_a_cancelled_operation_is_refused(
    kind: Callable[..., Op], refuse: Callable[[Any], object]
) -> None:
    op = kind()
    op.cancel()
    with pytest.raises(TypeError, match="it is cancelled, and only a fresh operation"):
        refuse(op)
    assert op.cancelled and op.counts() == (0, 0)


@with_kinds
@with_refusers
async def test_copying_an_operation_cancelled_in_a_purgatory_is_refused(
    clock: ManualClock, kind: Callable[..., Op], refuse: Callable[[Any], object]
) -> None:
    op = kind()
    async with Purgatory("fetch", clock=clock) as p:
        await p.try_complete_else_watch(op, ["k"])
        assert p.cancel_for_key("k") == [op]
        with pytest.raises(TypeError, match="it is cancelled in purgatory 'fetch'"):
            refuse(op)
        with pytest.raises(asyncio.CancelledError):
            await op
        assert p.num_delayed == 0 and op.counts() == (0, 0)


@with_refusers
async def test_copying_an_operation_completed_by_shutdown_is_refused(
    clock: ManualClock, refuse: Callable[[Any], object]
) -> None:
    op = plain()
    async with Purgatory("fetch", clock=clock) as p:
        await p.try_complete_else_watch(op, ["k"])
    with pytest.raises(TypeError, match="completed by shutdown in purgatory 'fetch'"):
        refuse(op)
    assert op.counts() == (1, 1)


@with_refusers
def test_an_operation_whose_init_skipped_super_init_cannot_be_copied(
    refuse: Callable[[Any], object],
) -> None:
    with pytest.raises(TypeError, match=r"must call super\(\).__init__\(timeout\)"):
        refuse(SkipsSuperInit(1))


@with_copiers
async def test_deepcopy_of_an_operation_holding_its_purgatory_is_refused_by_the_purgatory(
    clock: ManualClock, copier: Callable[[Any], Any]
) -> None:
    async with Purgatory("fetch", clock=clock) as p:
        op = plain()
        op.payload = p
        if copier is copy.copy:
            assert copier(op).payload is p
        else:
            with pytest.raises(TypeError, match="cannot copy or pickle <Purgatory 'fetch'"):
                copier(op)
        assert is_fresh(op)
        await p.try_complete_else_watch(op, ["k"])
        await clock.advance(10)
        assert op.counts() == (1, 1)


# -- __setstate__ restores the subclass's attributes, never the library's --------------------


@with_kinds
@pytest.mark.parametrize(
    "name",
    [
        "_state",
        "_owner",
        "_timeout",
        "_waiter",
        "_outcome",
        "_deadline",
        "_bucket",
        "_next",
        "_fire",
        "force_complete",
        "cancel",
        "on_complete",
        "_inline_complete",
        "__class__",
        "__dict__",
    ],
)
async def test_setstate_refuses_the_library_attributes(
    clock: ManualClock, kind: Callable[..., Op], name: str
) -> None:
    op = kind(0.5)
    before = op.snapshot()
    with pytest.raises(ValueError, match=f"cannot set the library's own attribute.*'{name}'"):
        op.__setstate__({"payload": "changed", name: None})
    assert op.snapshot() == before and is_fresh(op)
    async with Purgatory("p", clock=clock) as p:
        await p.try_complete_else_watch(op, ["k"])
        await clock.advance(1)
        assert op.expired and op.counts() == (1, 1)


@with_kinds
@pytest.mark.parametrize(
    "state",
    [["payload", "x"], "payload", 3, None, ("ab", "cd"), ({"payload": "x"}, [("a", 1)]), ({},)],
    ids=["list", "str", "int", "None", "pair-of-str", "dict-and-list", "1-tuple"],
)
def test_setstate_refuses_a_state_that_is_not_a_dict(
    kind: Callable[..., Op], state: object
) -> None:
    op = kind()
    before = op.snapshot()
    with pytest.raises(TypeError, match="takes a dict of attributes"):
        op.__setstate__(state)
    assert op.snapshot() == before and is_fresh(op)


@with_kinds
def test_setstate_refuses_attribute_names_that_are_not_strings(kind: Callable[..., Op]) -> None:
    op = kind()
    before = op.snapshot()
    with pytest.raises(TypeError, match="attribute names as str, not 1"):
        op.__setstate__({"payload": "changed", 1: "one"})
    assert op.snapshot() == before


def test_setstate_takes_the_dict_and_slots_pair_of_object() -> None:
    op = both()
    op.__setstate__(({"note": "n"}, {"payload": "p", "_Slotted__secret": "x"}))
    assert (op.note, op.payload, op.secret, op.own_secret) == ("n", "p", "x", "own")


def test_a_tampered_pickle_cannot_build_anything_but_a_valid_operation() -> None:
    rebuild, args, _ = plain(1).__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    assert args == (Plain, 1.0)
    with pytest.raises(TypeError, match="not a DelayedOperation class"):
        rebuild(dict, 1.0)
    with pytest.raises(ValueError, match="-1"):
        rebuild(Plain, -1.0)
    assert is_fresh(rebuild(Plain, 1.0))


# -- a purgatory, a timer, a timer handle and a clock refuse, and keep working ----------------


@with_refusers
async def test_a_purgatory_refuses_to_be_copied_and_keeps_working(
    clock: ManualClock, refuse: Callable[[Any], object]
) -> None:
    async with Purgatory("fetch", clock=clock) as p:
        op = plain(1)
        await p.try_complete_else_watch(op, ["k"])
        with pytest.raises(
            TypeError, match=r"cannot copy or pickle <Purgatory 'fetch'.*another Purgatory"
        ):
            refuse(p)
        assert (p.num_delayed, p.watched) == (1, 1)
        await clock.advance(1)
        assert op.expired and op.counts() == (1, 1)
        later = plain(1)
        await p.try_complete_else_watch(later, ["k"])
        later.ready = True
        assert p.check_and_complete("k") == 1


@with_refusers
async def test_a_timer_refuses_to_be_copied_and_keeps_working(
    clock: ManualClock, refuse: Callable[[Any], object]
) -> None:
    timer = Timer(clock=clock)
    fired: list[str] = []
    timer.call_later(1, fired.append, "before")
    with pytest.raises(TypeError, match=r"cannot copy or pickle <Timer .*another Timer"):
        refuse(timer)
    assert len(timer) == 1
    timer.call_later(1, fired.append, "after")
    await clock.advance(2)
    assert sorted(fired) == ["after", "before"] and len(timer) == 0
    timer.close()


@with_refusers
async def test_a_timer_handle_refuses_to_be_copied_and_keeps_working(
    clock: ManualClock, refuse: Callable[[Any], object]
) -> None:
    timer = Timer(clock=clock)
    fired: list[str] = []
    handle = timer.call_later(1, fired.append, "fired")
    dropped = timer.call_later(1, fired.append, "dropped")
    for h in (handle, dropped):
        with pytest.raises(TypeError, match="cannot copy or pickle <TimerHandle pending"):
            refuse(h)
    assert handle.pending() and len(timer) == 2
    assert dropped.cancel() and len(timer) == 1
    await clock.advance(2)
    assert fired == ["fired"] and not handle.pending()
    with pytest.raises(TypeError, match="<TimerHandle done"):
        refuse(handle)
    with pytest.raises(TypeError, match="<TimerHandle cancelled"):
        refuse(dropped)
    timer.close()


@with_refusers
async def test_a_manual_clock_refuses_to_be_copied_and_keeps_working(
    clock: ManualClock, refuse: Callable[[Any], object]
) -> None:
    await clock.advance(1)
    with pytest.raises(TypeError, match=r"cannot copy or pickle ManualClock\(now=1.0\)"):
        refuse(clock)
    async with Purgatory("p", clock=clock) as p:
        op = plain(0.5)
        await p.try_complete_else_watch(op, ["k"])
        await clock.advance(0.5)
        assert clock.time() == 1.5 and op.expired
