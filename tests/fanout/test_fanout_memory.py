"""The fan-out seam with the in-memory backend: what every backend must do."""

from __future__ import annotations

import asyncio

import pytest
from fanout_support import Flag
from hypothesis import given
from hypothesis import strategies as st

from purgatory_aio import Purgatory
from purgatory_aio._relay import _plain_decimal
from purgatory_aio.fanout import MemoryFanout, MemoryHub, ValueReached
from purgatory_aio.fanout._base import decode, encode


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_check_published_in_one_member_completes_operations_in_another() -> None:
    hub, flags = MemoryHub(), set[str]()
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, MemoryFanout(hub, a) as fa, MemoryFanout(hub, b) as fb:
        op = Flag(flags, "k", 5)
        assert not await fa.watch(a, op, ["k"])
        flags.add("k")
        fb.check("k")
        await settle()
        assert op.done() and op.result() is True


async def test_advances_out_of_order_and_duplicated_complete_each_threshold_once() -> None:
    hub = MemoryHub()
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, MemoryFanout(hub, a) as fa, MemoryFanout(hub, b) as fb:
        ops = [ValueReached(fa, "hw", mark, 5) for mark in range(1, 11)]
        for op in ops:
            await fa.watch_threshold(a, op, "hw", op.threshold)
        for value in (3, 1, 3, 2, 7, 5, 7, 7, 4):
            fb.advance("hw", value)
        await settle()
        assert [op.done() for op in ops] == [True] * 7 + [False] * 3
        assert all(op.threshold <= op.result() <= 7.0 for op in ops[:7])  # type: ignore[operator]
        assert fa.value("hw") == 7.0
        fb.advance("hw", 10)
        await settle()
        assert all(op.done() for op in ops)


async def test_cancel_withdraws_operations_in_every_member() -> None:
    hub = MemoryHub()
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, MemoryFanout(hub, a) as fa, MemoryFanout(hub, b):
        op = ValueReached(fa, "j", 1, 5)
        await fa.watch_threshold(a, op, "j", 1)
        hub.members[1].cancel("j")
        await settle()
        assert op.cancelled


async def test_a_member_started_late_catches_up_from_the_store() -> None:
    hub = MemoryHub()
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, MemoryFanout(hub, b) as fb:
        fb.advance("job:1", 1)
        async with MemoryFanout(hub, a) as fa:
            assert await fa.wait_for_value(a, "job:1", 1, 5) == 1.0


async def test_wait_for_value_expires_at_its_deadline_with_none() -> None:
    async with Purgatory("a") as a, MemoryFanout(None, a) as fa:
        assert await fa.wait_for_value(a, "never", 1, 0.02) is None


async def test_malformed_message_is_counted_and_skipped() -> None:
    hub = MemoryHub()
    async with Purgatory("a") as a, MemoryFanout(hub, a) as fa:
        for junk in ("", "zz", "a|o|NaN|k", "a|o|abc|k", "c|o||", b"\xff\xfe"):
            fa.deliver(junk)
        assert fa.stats().malformed == 6
        op = ValueReached(fa, "k", 1, 5)
        await fa.watch_threshold(a, op, "k", 1)
        fa.deliver(encode("a", "k", 1.0, "elsewhere"))
        assert op.done()


def test_messages_round_trip_keys_with_separators() -> None:
    assert decode(encode("a", "a|b|c", 2.5, "o")) == ("a", "o", 2.5, "a|b|c")
    assert decode(encode("c", "k", 0, "o")) == ("c", "o", 0.0, "k")


async def test_a_subclass_that_overrides_deliver_receives_every_message() -> None:
    seen: list[str | bytes] = []

    class Spying(MemoryFanout):
        def deliver(self, message: str | bytes) -> None:
            seen.append(message)
            super().deliver(message)

    hub = MemoryHub()
    async with Purgatory("a") as a, Spying(hub, a) as fa, MemoryFanout(hub) as fb:
        waiting = asyncio.create_task(fa.wait_for_value(a, "k", 1, 5))
        await settle()
        fb.advance("k", 1)
        assert await waiting == 1.0
    assert seen == [encode("a", "k", 1.0, fb.origin)]


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_the_digit_loop_reads_every_value_encode_writes_as_float_does(value: float) -> None:
    text = repr(value)
    read = _plain_decimal(text, 0, len(text))
    assert read != read or (read == float(text) and str(read) == text)  # NaN: float() reads it


@pytest.mark.parametrize(
    "text",
    ["", "-", ".", "1.2.3", "+1", " 1", "1_0", "1e5", "inf", "nan", "0x1", "1234567890123456"],
)
def test_the_digit_loop_leaves_anything_but_a_plain_decimal_to_float(text: str) -> None:
    read = _plain_decimal(text, 0, len(text))
    assert read != read


async def test_advances_to_changing_keys_reach_each_key_once() -> None:
    # The receiver reuses the previous message's key when the next one names the same:
    # keys of one length, keys that end like another, keys with the separator.
    keys = ["k1", "k2", "k1", "xk1", "1", "a|k1", "k1", "k"]
    async with Purgatory("a") as a, MemoryFanout(None, a) as fa:
        ops = {key: ValueReached(fa, key, 100, 5) for key in dict.fromkeys(keys)}
        for key, op in ops.items():
            await fa.watch_threshold(a, op, key, 100)
        for value, key in enumerate(keys):
            fa.deliver(encode("a", key, float(value), "elsewhere"))
        expected = {"k1": 6.0, "k2": 1.0, "xk1": 3.0, "1": 4.0, "a|k1": 5.0, "k": 7.0}
        assert {key: fa.value(key) for key in ops} == expected
        fa.deliver(b"a|elsewhere|-0.5|xk1")
        fa.deliver("a|elsewhere|100.25|xk1")
        assert ops["xk1"].done() and ops["xk1"].result() == 100.25
        assert not any(op.done() for key, op in ops.items() if key != "xk1")
        assert fa.stats().applied_advances == len(keys) + 2 and fa.stats().malformed == 0


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda f: f.check(""), TypeError),
        (lambda f: f.check(3), TypeError),
        (lambda f: f.advance("k", float("nan")), ValueError),
        (lambda f: f.advance("k", "1"), TypeError),
        (lambda f: f.advance("k", True), TypeError),
    ],
)
async def test_bad_input_is_refused_and_nothing_is_published(call: object, error: type) -> None:
    hub = MemoryHub()
    async with MemoryFanout(hub) as fanout:
        with pytest.raises(error):
            call(fanout)  # type: ignore[operator]
        assert fanout.stats().published == 0 and hub.values == {}


def test_the_seam_needs_no_redis_and_the_redis_backend_names_its_extra() -> None:
    import subprocess
    import sys

    # sys.modules[name] = None makes every import of it fail, as if redis-py were absent.
    script = (
        "import sys; sys.modules['redis'] = None\n"
        "import purgatory_aio.fanout as f\n"
        "try:\n    f.RedisFanout\nexcept ImportError as exc:\n    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'purgatory-aio[redis]'" in result.stdout


class SameFlag(Flag):
    """Compares equal to every other wait for the same key, and is unhashable."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SameFlag) and other.key == self.key

    __hash__ = None  # type: ignore[assignment]


async def test_operations_that_compare_equal_are_each_remembered_and_completed() -> None:
    hub, flags = MemoryHub(), set[str]()
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, MemoryFanout(hub, a) as fa, MemoryFanout(hub, b) as fb:
        ops = [SameFlag(flags, "k", 5) for _ in range(3)]
        for op in ops:
            assert not await fa.watch(a, op, ["k"])
        assert fa.stats().watched_keys == 1
        flags.add("k")
        fb.check("k")
        await settle()
        assert all(op.done() and op.result() is True for op in ops)


async def test_recovery_is_logged_at_the_level_of_the_outage(restore_structlog: None) -> None:
    """On-call, who sees "down" under default logging, sees "up" again too."""
    import logging

    import structlog
    from fanout_support import until

    captured = structlog.testing.LogCapture()
    structlog.configure(
        processors=[captured],
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    )
    hub = MemoryHub()
    a, b = Purgatory("a"), Purgatory("b")
    async with a, b, MemoryFanout(hub, a) as fa, MemoryFanout(hub, b) as fb:
        fa.down(ConnectionError("the engine went away"))
        await fb.advance_confirmed("k", 1)  # the next message fa receives says it is back
        await until(lambda: fa.stats().recoveries == 1)
    levels = [
        (entry["event"], entry["log_level"])
        for entry in captured.entries
        if entry["event"].startswith("fanout_engine")
    ]
    assert levels == [("fanout_engine_down", "warning"), ("fanout_engine_recovered", "warning")]
