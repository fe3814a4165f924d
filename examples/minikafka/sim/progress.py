"""Progress display on stderr: a rich bar when available, plain text otherwise."""

from __future__ import annotations

import sys
from typing import Any, Protocol, TextIO


class Progress(Protocol):
    def update(self, done: float, status: str) -> None: ...

    def close(self) -> None: ...


class PlainProgress:
    """A status line per tenth of the run; on a terminal, one line rewritten in place."""

    def __init__(self, total: float, stream: TextIO) -> None:
        self._total = total
        self._stream = stream
        self._live = stream.isatty()
        self._next_tenth = 1

    def update(self, done: float, status: str) -> None:
        percent = 100.0 * done / self._total if self._total else 100.0
        line = f"[{percent:5.1f}%] {done:8.2f}/{self._total:g} s  {status}"
        if self._live:
            self._stream.write("\r" + line)
            self._stream.flush()
        elif percent >= 10 * self._next_tenth - 1e-9:
            self._next_tenth = int(percent // 10) + 1
            self._stream.write(line + "\n")

    def close(self) -> None:
        if self._live:
            self._stream.write("\n")
            self._stream.flush()


class RichProgress:
    """A rich progress bar with the run's status line."""

    def __init__(self, total: float, stream: TextIO) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self._progress: Any = Progress(
            TextColumn("[bold]simulating"),
            BarColumn(bar_width=24),
            TextColumn("{task.completed:>7.1f}/{task.total:g} s"),
            TextColumn("{task.fields[status]}"),
            console=Console(file=stream),
            transient=False,
        )
        self._task = self._progress.add_task("sim", total=total, status="")
        self._progress.start()

    def update(self, done: float, status: str) -> None:
        self._progress.update(self._task, completed=done, status=status)

    def close(self) -> None:
        self._progress.stop()


class NoProgress:
    def update(self, done: float, status: str) -> None:
        return None

    def close(self) -> None:
        return None


def make_progress(total: float, *, enabled: bool = True, stream: TextIO | None = None) -> Progress:
    """The best available display for ``stream`` (stderr by default).

    rich is optional (the ``sim`` extra): without it, or when ``stream`` is not a
    terminal, progress is plain text.
    """
    stream = stream if stream is not None else sys.stderr
    if not enabled:
        return NoProgress()
    if stream.isatty():
        try:
            return RichProgress(total, stream)
        except ImportError:
            pass
    return PlainProgress(total, stream)
