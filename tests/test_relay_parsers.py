"""The wire format's two parsers read every message alike, on both builds.

The compiled receiver parses an advance with :func:`parse_advance` and everything else
with :func:`decode`; the pure receiver uses :func:`decode` alone. This test is a core test
(``tests/conftest.py``), so it runs on each implementation: the pure pass exercises the
fast parser's pure source, the compiled pass its compiled code, and both compare it with
:func:`decode` on hostile input. Whatever the fast parser takes, ``decode`` must read as
the same advance (the same key, the same float bit for bit, ``-0.0`` included); whatever
``decode`` refuses, the fast parser must leave to it.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import purgatory_aio
from purgatory_aio import Purgatory
from purgatory_aio._relay import (
    ADVANCE,
    MalformedMessage,
    Receiver,
    decode,
    encode,
    parse_advance,
)

#: Characters the wire format gives meaning to, digits, and what float() reads otherwise.
ALPHABET = "acx|0123456789.-+eE_ infINFnaNj\u0661\u00e9\x00\t"

HOSTILE = [
    "",
    "a",
    "a|",
    "a||",
    "a|||",
    "a||||",
    "a|||k",
    "a||1|",
    "a||1|k",
    "a|o|1|k",
    "a|o|1|k|with|bars",
    "a|o|1||",
    "a|o||k",
    "a|o|-0|k",
    "a|o|-0.0|k",
    "a|o|0.|k",
    "a|o|.5|k",
    "a|o|.|k",
    "a|o|-|k",
    "a|o|+1|k",
    "a|o|--1|k",
    "a|o|1.2.3|k",
    "a|o|1e308|k",
    "a|o|1e309|k",
    "a|o|-1e309|k",
    "a|o|nan|k",
    "a|o|inf|k",
    "a|o|-Infinity|k",
    "a|o| 1 |k",
    "a|o|1_000|k",
    "a|o|0x10|k",
    "a|o|\u0661\u0662|k",  # Arabic-Indic digits: float() reads them
    "a|o|\u00bd|k",
    "a|o|1\x00|k",
    "a|o|123456789012345|k",  # 15 digits: the digit loop's
    "a|o|1234567890123456|k",  # 16: float()'s
    "a|o|0.000000000000001|k",
    "a|o|9007199254740993|k",
    "a|o|99999999999999999999999|k",
    "a|\udc80|1|\udc80",
    "a|o|1|\U0001f600",
    "A|o|1|k",
    "b|o|1|k",
    "a-o|1|k",
    "c|o||k",
    "c|o|1|k",
    "c|o||",
    "x|o||k",
    "x||||",
    "zz",
]


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _agree(text: str) -> None:
    last, value = parse_advance(text)
    try:
        decoded: tuple[str, str, float, str] | None = decode(text)
    except MalformedMessage:
        decoded = None
    if last < 0:
        assert (last, value) == (-1, 0.0), text
        return
    assert decoded is not None, f"the fast parser took {text!r}, which decode refuses"
    kind, _, number, key = decoded
    assert kind == ADVANCE, text
    assert text[last + 1 :] == key, text
    assert _bits(value) == _bits(number), (text, value, number)


def test_the_fast_parser_is_the_build_s_own() -> None:
    # Compiled, it is the extension's function; pure, the source's.
    assert hasattr(parse_advance, "__code__") is (not purgatory_aio.compiled)


@pytest.mark.parametrize("text", HOSTILE)
def test_both_parsers_read_hostile_messages_alike(text: str) -> None:
    _agree(text)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=16))
@example("a|o|1|k")
def test_both_parsers_read_random_text_alike(text: str) -> None:
    _agree(text)
    _agree("a|" + text)
    _agree("a|o|" + text + "|k")


@settings(max_examples=300, deadline=None)
@given(
    st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(10**20), 10**20),
    st.text(min_size=1, max_size=12),
    st.text(alphabet="0123456789abcdef", max_size=12),
)
def test_every_advance_encode_writes_takes_the_fast_path_to_the_same_value(
    value: float, key: str, origin: str
) -> None:
    number = float(value)
    text = encode(ADVANCE, key, number, origin)
    last, read = parse_advance(text)
    assert last >= 0 and text[last + 1 :] == key
    assert _bits(read) == _bits(number) and _bits(decode(text)[2]) == _bits(number)


async def test_a_receiver_applies_what_either_parser_reads() -> None:
    # Delivered, each message is counted once: applied as an advance or malformed, as
    # decode judges it, whichever parser read it.
    p = Purgatory("relay")
    async with p:
        receiver = Receiver("me", [p])
        for text in HOSTILE:
            receiver.deliver(text)
    expected_advances = expected_malformed = 0
    for text in HOSTILE:
        try:
            kind = decode(text)[0]
        except MalformedMessage:
            expected_malformed += 1
            continue
        expected_advances += kind == ADVANCE
    assert receiver.received == len(HOSTILE)
    assert receiver.applied_advances == expected_advances
    assert receiver.malformed == expected_malformed
    assert receiver.apply_errors == 0
