"""The PostgreSQL fan-out's schema: the names it uses, its DDL, and the grants it needs.

A team that runs its migrations itself prints the DDL once and applies it with its
own tool, then starts every member with ``create=False`` (nothing is created at run
time; a missing table or privilege ends the start-up with one line saying which)::

    python -m purgatory_aio.fanout.postgres_schema --schema app --role app_user

prints the ``CREATE SCHEMA``, ``CREATE TABLE`` and ``CREATE INDEX`` statements
(each ``IF NOT EXISTS``) and, with ``--role``, the ``GRANT`` statements a role needs
to run a member without any right to create: ``USAGE`` on the schema and
``SELECT, INSERT, UPDATE, DELETE`` on the table (``DELETE`` for the expiry of old
values). ``LISTEN`` and ``pg_notify`` need no privilege. The same text comes from
:func:`schema_ddl`.

Names are checked before any of them reaches SQL: a schema and a prefix are
lowercase identifiers (letters, digits, ``_``), so nothing a user passes can become
part of a statement; they are quoted all the same. This module needs no driver.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_SCHEMA",
    "PRIVILEGES",
    "PostgresSchema",
    "check_prefix",
    "check_role",
    "check_schema",
    "main",
    "schema_ddl",
]

DEFAULT_SCHEMA: Final = "public"
"""The schema of the table unless another is chosen (never the ``search_path``'s choice)."""
DEFAULT_PREFIX: Final = "purgatory_aio"
"""The prefix of the table's and the channel's names unless another is chosen."""
PRIVILEGES: Final = ("SELECT", "INSERT", "UPDATE", "DELETE")
"""What a member's role needs on the table: read values, upsert them, delete expired ones."""

#: PostgreSQL truncates identifiers (and refuses channel names) beyond 63 bytes.
_MAX_NAME: Final = 63
_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,39}")
_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def check_prefix(prefix: object) -> str:
    """A prefix: 1-40 lowercase letters, digits or ``_``, not starting with a digit."""
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise ValueError(
            "prefix must be 1-40 lowercase letters, digits or '_' (not starting with a digit): "
            f"it names a table and a channel; got {prefix!r}"
        )
    return prefix


def check_schema(schema: object) -> str:
    """A schema name: 1-63 lowercase letters, digits or ``_``, not starting with a digit or
    ``pg_`` (PostgreSQL keeps those for itself)."""
    if not isinstance(schema, str) or not _SCHEMA.fullmatch(schema) or schema.startswith("pg_"):
        raise ValueError(
            "schema must be 1-63 lowercase letters, digits or '_' (not starting with a digit "
            f"or 'pg_'): it names the schema of the fan-out's table; got {schema!r}"
        )
    return schema


def check_role(role: object) -> str:
    """A role to grant to: a non-empty str of at most 63 bytes without NUL (quoted in SQL)."""
    if (
        not isinstance(role, str)
        or not role
        or "\x00" in role
        or len(role.encode("utf-8", "surrogatepass")) > _MAX_NAME
    ):
        raise ValueError(f"role must be a role name of 1-63 bytes without NUL, got {role!r}")
    return role


def quote(identifier: str) -> str:
    """``identifier`` as a quoted SQL identifier."""
    return '"' + identifier.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class PostgresSchema:
    """Where one fan-out keeps its values and what it notifies on.

    ``<schema>.<prefix>_values`` holds the values (with the index
    ``<prefix>_values_updated_at`` for their expiry); notifications go on the
    channel ``<prefix>_events`` in the schema ``public`` and
    ``<schema>.<prefix>_events`` in any other, since channels are per database,
    not per schema: two schemas never hear each other.
    """

    schema: str = DEFAULT_SCHEMA
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        check_schema(self.schema)
        check_prefix(self.prefix)
        if len(self.channel) > _MAX_NAME:
            raise ValueError(
                f"schema {self.schema!r} and prefix {self.prefix!r} make the channel name "
                f"{self.channel!r}, {len(self.channel)} bytes; PostgreSQL takes at most "
                f"{_MAX_NAME}: choose a shorter schema or prefix"
            )

    @property
    def table_name(self) -> str:
        """The table's name in its schema."""
        return f"{self.prefix}_values"

    @property
    def shown(self) -> str:
        """The table as messages name it: ``schema.table``."""
        return f"{self.schema}.{self.table_name}"

    @property
    def table(self) -> str:
        """The table as SQL names it: quoted and qualified by its schema."""
        return f"{quote(self.schema)}.{quote(self.table_name)}"

    @property
    def index_name(self) -> str:
        """The index on ``updated_at`` (the expiry's)."""
        return f"{self.table_name}_updated_at"

    @property
    def channel(self) -> str:
        """The channel members LISTEN and notify on."""
        if self.schema == DEFAULT_SCHEMA:
            return f"{self.prefix}_events"
        return f"{self.schema}.{self.prefix}_events"

    def create_schema(self) -> str:
        """The statement that makes the schema if it is missing."""
        return f"CREATE SCHEMA IF NOT EXISTS {quote(self.schema)}"

    def create_table(self) -> list[str]:
        """The statements that make the table and its index (what a member runs with
        ``create=True``, and what :meth:`ddl` prints)."""
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.table} (
    key text PRIMARY KEY,
    value double precision NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
)""",
            f"CREATE INDEX IF NOT EXISTS {quote(self.index_name)} ON {self.table} (updated_at)",
        ]

    def grants(self, role: str) -> list[str]:
        """What ``role`` needs to run a member that creates nothing."""
        grantee = quote(check_role(role))
        return [
            f"GRANT USAGE ON SCHEMA {quote(self.schema)} TO {grantee}",
            f"GRANT {', '.join(PRIVILEGES)} ON {self.table} TO {grantee}",
        ]

    def ddl(self, role: str | None = None) -> str:
        """Every statement, each ending with ``;``, for a migration tool."""
        lines = [
            f"-- purgatory_aio fan-out: table {self.shown}, channel {self.channel}",
            f"{self.create_schema()};",
            *(f"{statement};" for statement in self.create_table()),
        ]
        if role is not None:
            lines += [f"{statement};" for statement in self.grants(role)]
        return "\n".join(lines) + "\n"


def schema_ddl(
    *, schema: str = DEFAULT_SCHEMA, prefix: str = DEFAULT_PREFIX, role: str | None = None
) -> str:
    """The DDL of a fan-out's table (and the grants ``role`` needs), as SQL text.

    Raises:
        ValueError: a schema, prefix or role that is not a name the fan-out takes.
    """
    return PostgresSchema(schema, prefix).ddl(role)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m purgatory_aio.fanout.postgres_schema``: print the DDL."""
    parser = argparse.ArgumentParser(
        prog="python -m purgatory_aio.fanout.postgres_schema",
        description="Print the SQL that creates the PostgreSQL fan-out's table, for a "
        "migration tool; with --role, the grants a member needs when it may not create.",
    )
    parser.add_argument("--schema", default=DEFAULT_SCHEMA, help="default: %(default)s")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="default: %(default)s")
    parser.add_argument("--role", help="the role the members connect as (prints its grants)")
    args = parser.parse_args(argv)
    try:
        text = schema_ddl(schema=args.schema, prefix=args.prefix, role=args.role)
    except ValueError as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
