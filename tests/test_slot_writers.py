"""One writer per slot: the table at the slot declarations of an operation says which
module writes each slot once it is constructed, and the code holds to it.

The table is read from its one place, the comment above ``DelayedOperation.__slots__``
(the slots of ``TimerEntry`` included), and every assignment to one of those names in
the package is found with ``ast``: through any name but ``self``, and through ``self``
inside the operation's own classes. What ``__init__`` sets is initialisation, not a
write. And the timer's one way in: no module outside the timer's own calls a private
method of it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import purgatory_aio
from purgatory_aio import _operation

PACKAGE = Path(purgatory_aio.__file__).resolve().parent
#: The classes whose ``self.<slot> = ...`` are writes to an operation's (or entry's) slots.
ENTRY_CLASSES = {"DelayedOperation", "TimerEntry", "TimerHandle"}
#: The slots the timer's wheels write on every entry, handles and operations alike. A
#: handle's ``_deadline`` is its own (its constructor and ``reschedule`` set it), as its
#: other attributes are; an operation's is the table's.
ENTRY_SLOTS = {"_bucket", "_next", "_prev"}
ROW = re.compile(r"^\s*#\s{3}(_\w+)\s+(\S+(?:, \S+)*)(?:\s{2,}.*)?$")


def declared() -> dict[str, set[str]]:
    """The table: slot -> the modules that may write it (empty: only ``__init__``)."""
    source = (PACKAGE / "_operation.py").read_text()
    table: dict[str, set[str]] = {}
    for line in source.splitlines():
        match = ROW.match(line)
        if match:
            writers = match.group(2).strip()
            table[match.group(1)] = set() if writers == "-" else set(writers.split(", "))
    return table


class _Writes(ast.NodeVisitor):
    def __init__(self, module: str, slots: set[str], found: dict[str, set[str]]) -> None:
        self.module = module
        self.slots = slots
        self.found = found
        self.classes: list[str] = []
        self.functions: list[str] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def _target(self, target: ast.expr) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self._target(element)
            return
        if not (isinstance(target, ast.Attribute) and target.attr in self.slots):
            return
        if isinstance(target.value, ast.Name) and target.value.id == "self":
            cls = self.classes[-1] if self.classes else ""
            own = cls == "TimerHandle" and target.attr not in ENTRY_SLOTS
            if cls not in ENTRY_CLASSES or own:
                return  # another class's own attribute of the same name
            if self.functions and self.functions[-1] == "__init__":
                return  # initialisation
        self.found.setdefault(target.attr, set()).add(self.module)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._target(node.target)
        self.generic_visit(node)


def writers(slots: set[str]) -> dict[str, set[str]]:
    """Slot -> the modules of the package that assign it (outside ``__init__``)."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).with_suffix("").as_posix().replace("/", ".")
        _Writes(module, slots, found).visit(ast.parse(path.read_text(), str(path)))
    return found


def test_the_table_covers_every_slot_of_an_operation() -> None:
    slots = {
        name
        for klass in _operation.DelayedOperation.__mro__
        for name in klass.__dict__.get("__slots__", ())
    }
    if not slots:  # the compiled classes list theirs in __mypyc_attrs__
        slots = {
            name
            for klass in _operation.DelayedOperation.__mro__
            for name in klass.__dict__.get("__mypyc_attrs__", ())
            if name.startswith("_") and not name.startswith("__")
        }
    assert slots, "no slots found"
    assert set(declared()) == slots


def test_every_slot_is_written_only_by_the_modules_the_table_names() -> None:
    table = declared()
    found = writers(set(table))
    for slot, modules in sorted(table.items()):
        assert found.get(slot, set()) == modules, (
            f"{slot} is written by {sorted(found.get(slot, set()))}; "
            f"the table at DelayedOperation.__slots__ says {sorted(modules)}"
        )


def _names_a_timer(node: ast.expr) -> bool:
    """``timer``, ``self._timer``, ``life.timer``...: an expression naming a timer."""
    if isinstance(node, ast.Name):
        return node.id.lstrip("_") == "timer"
    return isinstance(node, ast.Attribute) and node.attr.lstrip("_") == "timer"


def test_no_module_calls_a_private_method_of_the_timer() -> None:
    # The timer's entry API (add_entry, remove_entry, pending_entries, drain_entries) and
    # its reaper's steps are public within the package: nothing outside the timer's own
    # modules reaches for a private name of it.
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ("_timer.py", "_wheels.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and _names_a_timer(node.value)
            ):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert found == []
