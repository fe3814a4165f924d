"""Every snippet of the README and of the documentation (``docs/**/*.md``) runs as written.

Conventions for authors:

* Each ```` ```python ```` block is complete on its own: it runs by itself, in a fresh
  namespace, exactly as a reader would paste it. A block that defines ``test_*``
  functions is also a test to run: each one is called (``async def`` ones with
  ``asyncio.run``) after the block, as pytest would.
* ``<!-- docs-test: skip: <why> -->`` on the line directly above a block leaves it out;
  ``<!-- docs-test: needs: the purgatory-broker command above -->`` runs it with the
  example broker started by exactly the ``purgatory-broker`` command of the nearest shell
  block above it in the same file (and stopped after).
* ```` ```bash ```` / ```` ```sh ```` blocks are not run (they install, serve, run for
  minutes), but every command they name must exist: ``make`` targets in the Makefile,
  ``.venv/bin/`` programs, ``python -m`` modules, ``uvicorn`` applications and repository
  files.
* Every relative link of the README leads to a file of the repository.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import re
import shlex
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import purgatory_broker

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: The pages whose blocks run: the README and every page of the site (the generated
#: benchmark summary, linked into the site from bench/results/, has no code).
SOURCES = [
    README,
    *sorted(p for p in DOCS.rglob("*.md") if not p.is_symlink() and "results" not in p.parts),
]
MARKER = re.compile(r"<!--\s*(?:docs|readme)-test:.*?-->")
SKIP = re.compile(r"<!--\s*(?:docs|readme)-test:\s*skip:\s*(?P<why>.+?)\s*-->")
NEEDS = re.compile(
    r"<!--\s*(?:docs|readme)-test:\s*needs:\s*the purgatory-broker command above\s*-->"
)
#: Programs a command may name that this project does not provide.
OUTSIDE_PROGRAMS = frozenset({"curl", "pip", "redis-server", "java"})
SHELLS = ("bash", "sh", "shell")


@dataclass(frozen=True)
class Block:
    path: Path
    language: str
    line: int
    code: str
    skip: str | None
    #: The arguments of the purgatory-broker command the block needs, if it needs one.
    broker_args: tuple[str, ...] | None = None

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _commands(code: str) -> list[list[str]]:
    joined = code.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            words.pop(0)  # VAR=value before the program
        if words:
            commands.append(words)
    return commands


def _broker_command(blocks: list[Block], path: Path) -> tuple[str, ...]:
    for block in reversed(blocks):
        if block.language in SHELLS:
            for words in _commands(block.code):
                if words[0].endswith("purgatory-broker"):
                    return tuple(words[1:])
    raise AssertionError(f"{path}: a block needs the purgatory-broker command above, but none is")


def _blocks(path: Path) -> list[Block]:
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = re.fullmatch(r"```(\w+)\s*", lines[i])
        if opening is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        above = lines[start - 1].strip() if start > 0 else ""
        marker = SKIP.fullmatch(above)
        needs = NEEDS.fullmatch(above)
        blocks.append(
            Block(
                path,
                opening.group(1),
                start + 1,
                "\n".join(body),
                marker and marker["why"],
                _broker_command(blocks, path) if needs else None,
            )
        )
        i += 1
    return blocks


BLOCKS = [block for source in SOURCES for block in _blocks(source)]
PYTHON = [b for b in BLOCKS if b.language == "python"]
BASH = [b for b in BLOCKS if b.language in SHELLS]


def _run(block: Block, namespace: dict[str, Any]) -> None:
    before = set(namespace)
    exec(compile(block.code, str(block), "exec"), namespace)
    for name in sorted(set(namespace) - before):
        test = namespace[name]
        if name.startswith("test_") and callable(test):
            result = test()
            if inspect.iscoroutine(result):
                asyncio.run(result)


def test_the_readme_and_the_docs_have_python_blocks() -> None:
    assert any(b.path == README for b in PYTHON), "the README's example is gone"
    assert len(PYTHON) >= 15, "few python blocks found: is the fence format unchanged?"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_markers_are_only_used_as_documented(source: Path) -> None:
    text = source.read_text(encoding="utf-8")
    for marker in MARKER.findall(text):
        assert SKIP.fullmatch(marker) or NEEDS.fullmatch(marker), (
            f"{source.relative_to(ROOT)}: unknown docs-test marker {marker!r}"
        )


@pytest.mark.parametrize("block", PYTHON, ids=str)
def test_python_block_runs_as_written(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if block.skip:
        pytest.skip(f"{block}: {block.skip}")
    # Snippets may write files (an event log): into a scratch directory.
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "snippet"}
    if block.broker_args is None:
        _run(block, namespace)
        return
    with _purgatory_broker(block.broker_args, tmp_path / "broker.log"):
        try:
            _run(block, namespace)
        finally:
            namespace.clear()  # the snippet's clients go before their broker does


@contextmanager
def _purgatory_broker(args: tuple[str, ...], log_path: Path) -> Iterator[None]:
    """The example broker started with exactly ``args``, for one block."""
    port = int(args[args.index("--port") + 1]) if "--port" in args else 9092
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            pytest.skip(f"port {port} is in use here: the snippet needs it for its broker")
    with purgatory_broker(log_path, *args):
        yield


def test_the_readme_links_only_to_files_of_the_repository() -> None:
    text = README.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        assert (ROOT / target).exists(), f"README.md links to {target}, which is not here"


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, flags=re.MULTILINE))


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _problems(words: list[str], targets: set[str]) -> list[str]:
    program, args = words[0], words[1:]
    found = []
    if program == "make":
        found += [f"no make target {a!r}" for a in args if not a.startswith("-") and "=" not in a]
        found = [p for p in found if p.split("'")[1] not in targets]
    elif program.startswith(".venv/bin/"):
        name = program.removeprefix(".venv/bin/")
        if not (Path(sys.executable).parent / name).exists():
            found.append(f"{program} is not installed by the project")
        if name == "python" and "-m" in args:
            module = args[args.index("-m") + 1]
            if not _module_exists(module):
                found.append(f"no module {module!r}")
    elif program == "uvicorn":
        app = next(a for a in args if ":" in a)
        if not _module_exists(app.split(":")[0]):
            found.append(f"no module for the application {app!r}")
    elif program not in OUTSIDE_PROGRAMS:
        found.append(f"{program!r} is neither a project command nor a known outside program")
    for arg in args:
        if arg.endswith(".py") and not (ROOT / arg).exists():
            found.append(f"no file {arg}")
    return found


@pytest.mark.parametrize("block", BASH, ids=str)
def test_bash_block_names_only_commands_that_exist(block: Block) -> None:
    targets = _make_targets()
    problems = [
        f"{' '.join(words)}: {problem}"
        for words in _commands(block.code)
        for problem in _problems(words, targets)
    ]
    assert not problems, f"{block}: " + "; ".join(problems)
