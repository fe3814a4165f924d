"""The repository speaks only of itself: nothing in it sends a reader to a document or a
numbered work item they cannot open (design notes kept elsewhere, a tracker's issue
numbers). The reasons such notes gave are written where they apply instead."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What a reference to something outside reads like: a design note by its file name, the
#: directory such notes live in, or a numbered issue.
#: (The notes' names are upper case: this site's own pages, like fanout.md, are not.)
OUTSIDE = re.compile(
    r"\b(?:API|WORKLOADS|STYLE|KAFKA_WIRE|FANOUT)\.md\b|shared[/]design|\b[Ii]ssues?\s+#?\d+"
)
SCANNED = ("purgatory_aio", "tests", "bench", "examples", "docs")
SUFFIXES = {".py", ".md", ".c", ".toml", ".yml", ".cfg", ".txt", ".properties"}


def _files() -> list[Path]:
    found = [ROOT / name for name in ("README.md", "Makefile", "pyproject.toml", "mkdocs.yml")]
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_symlink() or any(p.is_symlink() for p in path.parents):
                continue
            if path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                found.append(path)
    return found


def test_the_scan_sees_the_repository() -> None:
    files = _files()
    assert ROOT / "README.md" in files and ROOT / "purgatory_aio" / "__init__.py" in files


def test_nothing_points_outside_the_repository() -> None:
    hits = []
    for path in _files():
        if path == Path(__file__):
            continue  # the pattern itself
        text = path.read_text(encoding="utf-8", errors="replace")
        hits += [
            f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
            for m in OUTSIDE.finditer(text)
        ]
    assert not hits, "refers outside the repository: " + "; ".join(hits)
