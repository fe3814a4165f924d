"""What a purgatory tells a relay of key events: its watched keys, their values, their changes."""

from __future__ import annotations

from collections.abc import Hashable

import pytest

from purgatory_aio import DelayedOperation, Purgatory
from purgatory_aio.testing import ManualClock


class Never(DelayedOperation[None]):
    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        return None


class AtValue(DelayedOperation[float | None]):
    """Completes once the purgatory's recorded value of its key reaches its threshold."""

    def __init__(self, p: Purgatory, key: str, threshold: float, timeout: float = 10) -> None:
        super().__init__(timeout)
        self.p, self.key, self.threshold = p, key, threshold
        self.seen: float | None = None

    def try_complete(self) -> bool:
        value = self.p.key_value(self.key)
        if value is not None and value >= self.threshold:
            self.seen = value
            return self.force_complete()
        return False

    def on_complete(self) -> float | None:
        return self.seen


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Hashable, bool]] = []

    def __call__(self, key: Hashable, held: bool) -> None:
        self.calls.append((key, held))


async def test_watched_keys_lists_keys_however_they_were_watched() -> None:
    async with Purgatory("p") as p:
        await p.try_complete_else_watch(Never(10), ["a", "b"])
        await p.watch_threshold(Never(10), "c", 5)
        assert sorted(p.watched_keys()) == ["a", "b", "c"]  # type: ignore[type-var]


async def test_a_listener_hears_the_first_and_the_last_watcher_of_each_key() -> None:
    clock = ManualClock()
    async with Purgatory("p", clock=clock, purge_interval=1) as p:
        heard = Recorder()
        p.add_key_listener(heard)
        p.add_key_listener(heard)  # twice: heard once
        first, second = Never(1), Never(1)
        await p.try_complete_else_watch(first, ["k"])
        await p.try_complete_else_watch(second, ["k"])
        assert heard.calls == [("k", True)]
        first.cancel()
        second.cancel()
        await clock.advance(0)
        assert heard.calls == [("k", True), ("k", False)]
        assert p.watched_keys() == []


async def test_a_threshold_key_is_released_when_an_advance_completes_its_last_operation() -> None:
    async with Purgatory("p") as p:
        heard = Recorder()
        p.add_key_listener(heard)
        op = AtValue(p, "hw", 3)
        await p.watch_threshold(op, "hw", 3)
        assert p.advance_key("hw", 2) == 0
        assert p.key_value("hw") == 2.0
        assert p.advance_key("hw", 1) == 0
        assert p.key_value("hw") == 2.0  # the highest value, not the latest
        assert p.advance_key("hw", 4) == 1
        assert op.result() == 4.0
        assert heard.calls == [("hw", True), ("hw", False)]
        assert p.key_value("hw") is None  # forgotten with the last watcher
        assert p.watched_keys() == []


async def test_an_unwatched_key_keeps_no_value() -> None:
    async with Purgatory("p") as p:
        assert p.advance_key("nobody", 7) == 0
        assert p.key_value("nobody") is None


async def test_a_new_watcher_reads_the_value_recorded_while_the_key_was_held() -> None:
    async with Purgatory("p") as p:
        await p.watch_threshold(AtValue(p, "hw", 100), "hw", 100)
        p.advance_key("hw", 5)
        late = AtValue(p, "hw", 4)
        assert await p.watch_threshold(late, "hw", 4)  # completes at admission
        assert late.result() == 5.0


async def test_cancel_for_key_and_shutdown_release_the_keys() -> None:
    p = Purgatory("p")
    heard = Recorder()
    async with p:
        p.add_key_listener(heard)
        await p.watch_threshold(Never(10), "a", 1)
        await p.try_complete_else_watch(Never(10), ["b"])
        p.cancel_for_key("a")
        assert heard.calls == [("a", True), ("b", True), ("a", False)]
    assert heard.calls[-1] == ("b", False)


async def test_a_removed_listener_is_not_called() -> None:
    async with Purgatory("p") as p:
        heard = Recorder()
        p.add_key_listener(heard)
        p.remove_key_listener(heard)
        p.remove_key_listener(heard)  # unknown: ignored
        await p.try_complete_else_watch(Never(10), ["k"])
        assert heard.calls == []


async def test_a_failing_listener_leaves_the_watch_lists_whole() -> None:
    def broken(key: Hashable, held: bool) -> None:
        raise RuntimeError("listener bug")

    async with Purgatory("p") as p:
        p.add_key_listener(broken)
        op = Never(10)
        assert not await p.try_complete_else_watch(op, ["k"])
        assert p.watched_keys() == ["k"] and p.num_delayed == 1
        op.cancel()
        assert p.check_and_complete("k") == 0 and p.watched_keys() == []


def test_a_listener_must_be_callable() -> None:
    with pytest.raises(TypeError, match="callable"):
        Purgatory("p").add_key_listener(42)  # type: ignore[arg-type]
