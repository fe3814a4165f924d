"""The fan-out's wire format, and what a process does with each event it receives.

Every message a subscriber receives is parsed and applied here, in every
process, so this module is compiled with the core (it imports only the core and
the standard library: the engine-specific code stays in ``purgatory_aio.fanout``).
A message is ``kind|origin|value|key``: the kind (``a`` advance, ``c`` check,
``x`` cancel), the publishing fan-out's id, the value (advances only; ``repr``
of a finite float) and the key, last, so it may contain the separator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, final

from . import _build
from ._logging import get_logger
from ._native import i64, mypyc_attr
from ._purgatory import Purgatory

_log = get_logger("purgatory_aio.fanout")

CHECK: Final = "c"
ADVANCE: Final = "a"
CANCEL: Final = "x"

_INF: Final = float("inf")
_NAN: Final = float("nan")

#: Compiled, :meth:`Receiver.deliver` parses an advance with :func:`parse_advance`, finds
#: and a digit loop (:func:`_plain_decimal` reads a value in 18 ns where ``float()`` takes
#: 165). Interpreted, those are more bytecodes than :func:`decode`'s ``split()`` and
#: ``float()`` (20.9k against 18.8k instructions a delivered advance, callgrind), so the
#: pure build's receiver parses every message with :func:`decode`. Both builds' tests
#: compare the two parsers (``tests/test_relay_parsers.py``).
_COMPILED: Final = _build.COMPILED

#: Powers of ten that are exact doubles, for :func:`_plain_decimal`.
_POWERS: Final = tuple(float(10**k) for k in range(16))


# An ordinary Python class on both builds (a compiled one would show another signature).
@mypyc_attr(native_class=False)
class MalformedMessage(ValueError):
    """A message on the fan-out channel that is not an event this library sends."""


def encode(kind: str, key: str, value: float = 0.0, origin: str = "") -> str:
    """One event as a channel message: ``kind|origin|value|key`` (the key last, so it may
    contain the separator)."""
    return f"{kind}|{origin}|{value!r}|{key}" if kind == ADVANCE else f"{kind}|{origin}||{key}"


def decode(message: str) -> tuple[str, str, float, str]:
    """``(kind, origin, value, key)`` of a channel message; :class:`MalformedMessage` if it is
    not one."""
    parts = message.split("|", 3)
    if len(parts) != 4 or parts[0] not in (CHECK, ADVANCE, CANCEL) or not parts[3]:
        raise MalformedMessage(f"not a fan-out event: {message[:200]!r}")
    kind, origin, raw, key = parts
    value = 0.0
    if kind == ADVANCE:
        try:
            value = float(raw)
        except ValueError:
            raise MalformedMessage(f"advance with a non-numeric value: {message[:200]!r}") from None
        if not -_INF < value < _INF:
            raise MalformedMessage(f"advance with a non-finite value: {message[:200]!r}")
    return kind, origin, value, key


def _plain_decimal(text: str, start: i64, end: i64) -> float:
    """The number ``text[start:end]`` if it is a plain decimal of at most 15 digits
    (``-12``, ``12.0``, ``0.25``), else NaN (the caller then asks ``float()``).

    Exact: the digits form an integer below 2**53 and the power of ten is an exact
    double, so the one division is correctly rounded, as ``float()`` rounds.
    """
    # Machine ints (i64), not Python ints: 30 -> 18 ns a value, compiled.
    i = start
    negative = i < end and ord(text[i]) == 45  # "-"
    if negative:
        i += 1
    number: i64 = 0
    digits: i64 = 0
    point: i64 = -1
    while i < end:
        code = ord(text[i])
        if 48 <= code <= 57:
            number = number * 10 + (code - 48)
            digits += 1
        elif code == 46 and point < 0:  # "."
            point = digits
        else:
            return _NAN
        i += 1
    if digits == 0 or digits > 15:
        return _NAN
    value = float(number)
    if point >= 0:
        value /= _POWERS[digits - point]
    return -value if negative else value


def parse_advance(text: str) -> tuple[i64, float]:
    """The fast parser of an advance: ``(last, value)`` with the key at ``text[last + 1:]``,
    or ``(-1, 0.0)`` to leave the message to :func:`decode`.

    Reads what :func:`decode` reads, without building the parts: two finds and the digit
    loop. Anything it does not take (another kind, a value ``float()`` refuses or finds
    not finite, an empty key) goes to :func:`decode`, which says what is wrong. Compiled,
    the pair comes back unboxed (no tuple is allocated).
    """
    size: i64 = len(text)
    if size > 5 and ord(text[0]) == 97 and ord(text[1]) == 124:  # "a|"
        bar: i64 = text.find("|", 2)
        last: i64 = text.find("|", bar + 1) if bar > 0 else -1
        if 0 < last < size - 1:
            value = _plain_decimal(text, bar + 1, last)
            if value != value:  # not a plain decimal: float() decides
                try:
                    value = float(text[bar + 1 : last])
                except ValueError:
                    return -1, 0.0
            if -_INF < value < _INF:
                return last, value
    return -1, 0.0


@final
class Receiver:
    """Applies events to the purgatories of one fan-out, and counts what it applied.

    ``purgatories`` is the fan-out's own list (it attaches more). ``revive`` is set
    while the fan-out holds its engine for down: a message received proves it is
    back, so each one calls ``revive`` until the fan-out clears it.
    """

    def __init__(self, origin: str, purgatories: list[Purgatory]) -> None:
        self.origin = origin
        self.purgatories = purgatories
        self.revive: Callable[[], object] | None = None
        self._last_key = ""  # the key of the last advance received
        self.received = 0
        self.applied_checks = 0
        self.applied_advances = 0
        self.applied_cancels = 0
        self.apply_errors = 0
        self.completed = 0
        self.malformed = 0

    def counts(self) -> dict[str, int]:
        """The counters, by their names in the fan-out's stats."""
        return {
            "received": self.received,
            "applied_checks": self.applied_checks,
            "applied_advances": self.applied_advances,
            "applied_cancels": self.applied_cancels,
            "apply_errors": self.apply_errors,
            "completed": self.completed,
            "malformed": self.malformed,
        }

    def deliver(self, message: str | bytes) -> None:
        """Apply one channel message; a malformed one is logged, counted and skipped."""
        self.received += 1
        revive = self.revive
        if revive is not None:
            revive()
        if isinstance(message, str):
            text = message
        else:
            try:
                text = message.decode("utf-8")
            except UnicodeDecodeError as exc:
                self.count_malformed(f"not UTF-8: {exc}")
                return
        # The advance, nearly every message, is parsed by parse_advance() (no list of parts,
        # no tuple, no origin string); anything else, or anything odd, goes through
        # decode(), which says what is wrong. Compiled, a delivered advance that reaches
        # nothing costs 0.25 us against advance_key's 0.17 (it was 0.87 through split()
        # and float()), python -m bench fanout. Calling parse_advance() rather than a copy
        # of it here costs 43 instructions of 2,739 a delivered advance (1.6 %, callgrind,
        # one purgatory, compiled), and buys one parser that both builds' tests compare
        # with decode().
        if _COMPILED:
            last, value = parse_advance(text)
            if last >= 0:
                # A run of advances to one key (a partition's high watermark, a job's
                # progress) reuses the key of the previous message: no new string to
                # allocate and hash in every lookup (285 -> 205 ns a delivered advance).
                key = self._last_key
                size: i64 = len(text)
                if len(key) != size - last - 1 or not text.endswith(key):
                    key = self._last_key = text[last + 1 :]
                try:
                    self.apply_advance(key, value)
                except Exception as exc:
                    self.apply_failed(key, exc)
                return
        try:
            kind, origin, value, key = decode(text)
        except MalformedMessage as exc:
            self.count_malformed(f"{exc}")
            return
        try:
            if kind == ADVANCE:
                # Our own advances too: a watch that began after we applied it locally may
                # have read the store before the value got there.
                self.apply_advance(key, value)
            elif origin == self.origin:
                return  # applied when it was published
            elif kind == CHECK:
                self.apply_check(key)
            else:
                self.apply_cancel(key)
        except Exception as exc:
            self.apply_failed(key, exc)

    def count_malformed(self, error: str) -> None:
        """A message, or a stored value, that is not the fan-out's: logged and counted."""
        self.malformed += 1
        _log.warning("fanout_malformed_message", error=error[:200])

    def apply_failed(self, key: str, exc: Exception) -> None:
        """Applying an event to ``key`` raised ``exc``: logged and counted."""
        self.apply_errors += 1
        _log.error("fanout_apply_failed", key=key, error=repr(exc))

    def apply_advance(self, key: str, value: float) -> int:
        """``advance_key`` on every purgatory; returns how many operations completed.

        ``advance_key`` alone: it records the value for the key's ``try_complete``
        calls and visits only the operations it reaches, O(log n + k) (a
        ``check_and_complete`` would sort the key's whole threshold index: 22 ms at
        100k watchers, against 16 us). A shut-down purgatory watches nothing:
        ``advance_key`` returns 0 there.
        """
        self.applied_advances += 1
        completed = 0
        for purgatory in self.purgatories:
            completed += purgatory.advance_key(key, value)
        if completed:
            self.completed += completed
        return completed

    def apply_check(self, key: str) -> int:
        """``check_and_complete`` on every open purgatory; returns how many completed."""
        self.applied_checks += 1
        completed = 0
        for purgatory in self.purgatories:
            if not purgatory.closed:
                completed += purgatory.check_and_complete(key)
        self.completed += completed
        return completed

    def apply_cancel(self, key: str) -> int:
        """``cancel_for_key`` on every open purgatory; returns how many were cancelled."""
        self.applied_cancels += 1
        cancelled = 0
        for purgatory in self.purgatories:
            if not purgatory.closed:
                cancelled += len(purgatory.cancel_for_key(key))
        return cancelled
