"""Every module of the library is small enough to read in one sitting: none is over
:data:`MAX_LINES` physical lines (blank lines, comments and docstrings included). A module
that grows past it is split by concept, each new module named for what it owns."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "purgatory_aio"
MAX_LINES = 600


def _line_count(path: Path) -> int:
    return len(path.read_bytes().splitlines())


def test_the_scan_sees_the_package() -> None:
    found = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")}
    assert {"__init__.py", "fanout/_fanout.py", "integrations/fastapi.py"} <= found


def test_no_module_is_over_the_limit() -> None:
    over = {
        path.relative_to(ROOT).as_posix(): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := _line_count(path)) > MAX_LINES
    }
    assert not over, f"modules over {MAX_LINES} lines (split them by concept): {over}"


def test_the_count_is_physical_lines(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('"""Doc."""\n\n# a comment\n\nx = 1\n', encoding="utf-8")
    assert _line_count(sample) == 5
