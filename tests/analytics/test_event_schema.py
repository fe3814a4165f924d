"""The event log's schema is defined once, by ``OperationEvent``, and derived everywhere else.

Three rules: every schema the writers, the report's readers and the benchmarks use equals
the definition (names, order, types, nullability); no other module spells the column list
itself; and a field added to the definition reaches both writers, the files they write,
the report's readers and its checks (a subprocess runs them on an amended definition).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Annotated, NamedTuple

import pyarrow as pa
import pytest
from purgatory_report import inputs, staging

from bench import pipeline
from purgatory_aio import events
from purgatory_aio.eventlog import arrow_schema
from purgatory_aio.events import COLUMNS, FIELDS, OUTCOMES, REQUIRED, OperationEvent

ROOT = Path(__file__).resolve().parents[2]

#: Where code lives that could spell the schema (tests may: they state expectations).
SOURCES = ("purgatory_aio", "report", "bench", "examples")
#: The definition itself.
DEFINITION = ROOT / "purgatory_aio" / "events.py"

ARROW = {
    "string": pa.string(),
    "int64": pa.int64(),
    "double": pa.float64(),
    "list<string>": pa.list_(pa.string()),
}
SPARK = {"string": "string", "int64": "bigint", "double": "double", "list<string>": "array<string>"}


def test_the_definition_gives_each_column_a_name_type_nullability_and_meaning() -> None:
    assert OperationEvent._fields == COLUMNS
    assert len(FIELDS) == len(COLUMNS)
    for field in FIELDS:
        assert field.kind in ARROW, field
        assert field.meaning.strip(), field
    by_name = {field.name: field for field in FIELDS}
    assert (
        by_name["outcome"].choices == OUTCOMES == ("completed", "expired", "cancelled", "shutdown")
    )
    assert tuple(f.name for f in FIELDS if not f.nullable) == REQUIRED
    assert {f.name for f in FIELDS if f.nullable} == {"error", "producer"}
    assert OperationEvent._field_defaults == {"producer": None}


def test_a_field_without_a_meaning_or_of_an_unknown_type_is_refused() -> None:
    class Bare(NamedTuple):
        name: str

    class Odd(NamedTuple):
        when: Annotated[complex, "a complex time"]

    with pytest.raises(TypeError, match="name has no meaning"):
        events.schema_of(Bare)
    with pytest.raises(TypeError, match="when: the event log holds no"):
        events.schema_of(Odd)


def test_every_derived_schema_equals_the_definition() -> None:
    written = arrow_schema()
    assert written.names == list(COLUMNS)
    for field, column in zip(FIELDS, written, strict=True):
        assert column.type == ARROW[field.kind] and column.nullable == field.nullable, column
    # The report reads with every column nullable, and checks the required ones itself.
    assert staging.ARROW_SCHEMA.names == list(COLUMNS)
    for field, column in zip(FIELDS, staging.ARROW_SCHEMA, strict=True):
        assert column.type == ARROW[field.kind] and column.nullable, column
    assert inputs.EVENT_SCHEMA.names == list(COLUMNS)
    for field, column in zip(FIELDS, inputs.EVENT_SCHEMA.fields, strict=True):
        assert column.dataType.simpleString() == SPARK[field.kind], column
    assert inputs.REQUIRED == REQUIRED
    assert tuple(inputs._FIELD_KINDS) == COLUMNS
    assert tuple(inputs._PARQUET_TYPES) == COLUMNS
    for field in FIELDS:
        expected, accepts = inputs._PARQUET_TYPES[field.name]
        assert expected == field.kind and accepts(ARROW[field.kind])
        assert accepts(pa.null()) == field.nullable
    columns = re.findall(r"(\w+): '([^']+)'", pipeline._JSON_COLUMNS)
    assert columns == [(f.name, pipeline.DUCKDB_TYPES[f.kind]) for f in FIELDS]


def _spellings(path: Path, root: Path = ROOT) -> list[str]:
    """Statements of ``path`` that name most of the columns in string literals."""
    exact_needed = len(COLUMNS) // 2
    distinctive = [name for name in COLUMNS if "_" in name]  # not ordinary words
    word = re.compile(r"\b(" + "|".join(distinctive) + r")\b")
    text = path.read_text(encoding="utf-8")
    quoted = sum(f'"{name}"' in text or f"'{name}'" in text for name in COLUMNS)
    if quoted < exact_needed and len(set(word.findall(text))) < len(distinctive):
        return []  # too few of the names anywhere in the file: no need to parse it
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.stmt) or any(
            isinstance(child, ast.stmt) for child in ast.iter_child_nodes(node)
        ):
            continue  # a compound statement: its own statements are looked at
        exact: set[str] = set()
        words: set[str] = set()
        for leaf in ast.walk(node):
            if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str):
                if leaf.value in COLUMNS:
                    exact.add(leaf.value)
                words.update(word.findall(leaf.value))
        if len(exact) >= exact_needed or len(words) == len(distinctive):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_no_module_but_the_definition_spells_the_column_list() -> None:
    paths = [p for top in SOURCES for p in (ROOT / top).rglob("*.py") if p != DEFINITION]
    paths += sorted(ROOT.glob("*.py"))
    assert len(paths) > 50
    assert [spot for path in paths for spot in _spellings(path)] == []


def test_the_check_finds_a_spelled_out_list(tmp_path: Path) -> None:
    spelled = tmp_path / "spelled.py"
    spelled.write_text(f"SCHEMA = [{', '.join(f'({name!r}, str)' for name in COLUMNS)}]\n")
    assert len(_spellings(spelled, tmp_path)) == 1
    sql = tmp_path / "sql.py"
    sql.write_text(f"COLUMNS = {'{' + ', '.join(f'{n}: VARCHAR' for n in COLUMNS) + '}'!r}\n")
    assert len(_spellings(sql, tmp_path)) == 1


# Run in a fresh interpreter: the definition gains a field before anything derives from it.
_AMENDED = """
import sys, json, tempfile
from pathlib import Path
import purgatory_aio.events as original

source = Path(original.__file__).read_text(encoding="utf-8")
anchor = "    def as_dict(self)"
assert source.count(anchor) == 1
added = '    region: Annotated[str | None, "where it ran"] = None\\n\\n'
amended = type(original)("purgatory_aio.events")
amended.__file__ = original.__file__
sys.modules["purgatory_aio.events"] = amended
exec(compile(source.replace(anchor, added + anchor), original.__file__, "exec"), amended.__dict__)

import pyarrow.json as pajson
import pyarrow.parquet as pq
from purgatory_aio.eventlog import JsonLinesWriter, ParquetWriter, arrow_schema
from purgatory_report import inputs, staging
from bench import pipeline

assert amended.COLUMNS[-1] == "region" and "region" not in amended.REQUIRED
event = amended.OperationEvent(
    "p", "Op", 1, ["k"], 1.7e9, 1.7e9 + 1, 1.7e9 + 0.5, "completed", None, "w", "eu-west"
)
out = Path(tempfile.mkdtemp())
for writer in (ParquetWriter, JsonLinesWriter):
    with writer(out / writer.__name__, partitioned=False) as sink:
        sink.emit(event)
(parquet,) = (out / "ParquetWriter").glob("*.parquet")
(jsonl,) = (out / "JsonLinesWriter").glob("*.jsonl")
table = pq.read_table(parquet)
assert table.column_names == list(amended.COLUMNS) and table["region"].to_pylist() == ["eu-west"]
assert table.schema.equals(arrow_schema())
inputs.check_parquet_files([str(parquet)])  # the report's footer check takes it
options = pajson.ParseOptions(explicit_schema=staging.ARROW_SCHEMA)
rows = pajson.read_json(jsonl, parse_options=options).to_pylist()
assert rows[0]["region"] == "eu-west", rows
assert inputs.EVENT_SCHEMA.names == list(amended.COLUMNS)
assert "region: 'VARCHAR'" in pipeline._JSON_COLUMNS
line = json.dumps({**event.as_dict(), "region": 7})
assert inputs._line_problem(line) == "field region is 7 (an integer), expected a string"
print("reached")
"""


def test_a_field_added_to_the_definition_reaches_the_writers_and_the_readers() -> None:
    code = textwrap.dedent(_AMENDED)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("reached")
