"""The PostgreSQL fan-out's schema under the team's control: the DDL printed for a migration
tool, a chosen schema, ``create=False``, and a least-privilege role holding only the grants
the docs list, against the real server."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import asyncpg
import pytest
from fanout_support import until
from pg_support import PostgresServer, admin, fresh

from purgatory_aio import Purgatory
from purgatory_aio.fanout import FanoutUnavailable, PostgresFanout, fanout_from_url
from purgatory_aio.fanout.postgres_schema import PostgresSchema, main, schema_ddl

PATIENCE = 15.0

HOSTILE_NAMES = [
    'app"; DROP TABLE orders; --',
    "app; DROP TABLE orders",
    "App",
    "1app",
    "pg_catalog",
    "",
    " app",
    "app\x00",
    "a" * 64,
    "é",
    "app.other",
    5,
]


async def least_privileged(conn: Any, server: PostgresServer, schema: str, prefix: str) -> str:
    """A role that may log in and do nothing else, given exactly the printed DDL's grants (the
    DDL applied by the superuser, as a migration would); its URL."""
    role, password = fresh("member"), secrets.token_hex(8)
    await conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    await conn.execute(schema_ddl(schema=schema, prefix=prefix, role=role))
    assert not await conn.fetchval(
        "SELECT has_database_privilege($1, current_database(), 'CREATE') "
        "OR has_schema_privilege($1, 'public', 'CREATE') OR has_schema_privilege($1, $2, 'CREATE')",
        role,
        schema,
    )
    return f"postgresql://{role}:{password}@127.0.0.1:{server.port}/postgres"


def test_the_ddl_names_the_schema_the_table_its_index_and_the_grants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = schema_ddl(schema="app", prefix="acks", role="app user")
    assert text.splitlines()[1:] == [
        'CREATE SCHEMA IF NOT EXISTS "app";',
        'CREATE TABLE IF NOT EXISTS "app"."acks_values" (',
        "    key text PRIMARY KEY,",
        "    value double precision NOT NULL,",
        "    updated_at timestamptz NOT NULL DEFAULT now()",
        ");",
        'CREATE INDEX IF NOT EXISTS "acks_values_updated_at" ON "app"."acks_values" (updated_at);',
        'GRANT USAGE ON SCHEMA "app" TO "app user";',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON "app"."acks_values" TO "app user";',
    ]
    assert "public.purgatory_aio_values" in schema_ddl()
    assert PostgresSchema().channel == "purgatory_aio_events"
    assert PostgresSchema("app", "acks").channel == "app.acks_events"
    assert main(["--schema", "app", "--prefix", "acks", "--role", "app user"]) == 0
    assert capsys.readouterr().out == text
    with pytest.raises(SystemExit) as exited:
        main(["--schema", 'x"; DROP TABLE t; --'])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert len(error.splitlines()) == 1 and "schema must be" in error
    with pytest.raises(ValueError, match="role must be"):
        schema_ddl(role="r\x00")
    with pytest.raises(ValueError, match="at most 63"):
        PostgresSchema("s" * 40, "p" * 40)


def test_the_guide_shows_the_ddl_the_command_prints() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs/guide/fanout.md").read_text()
    shown = guide.split("```sql\n", 1)[1].split("```", 1)[0]
    assert shown == schema_ddl(schema="app", role="app_user")


def test_the_ddl_command_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "purgatory_aio.fanout.postgres_schema", "--schema", "app"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == schema_ddl(schema="app")


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_a_hostile_schema_name_is_refused_before_anything_connects(name: object) -> None:
    url = "postgresql://u:pw@127.0.0.1:1/db"
    expected = ValueError
    with pytest.raises(expected, match="schema must be"):
        PostgresFanout(url, schema=name)  # type: ignore[arg-type]
    if isinstance(name, str):
        query = urlencode({"schema": name}, quote_via=quote)
        with pytest.raises(expected, match="schema must be"):
            fanout_from_url(f"{url}?{query}")


def test_the_url_options_are_checked_and_must_agree_with_the_arguments() -> None:
    url = "postgresql://u:pw@127.0.0.1:1/db"
    fanout = PostgresFanout(f"{url}?schema=app&create=false&sslmode=disable")
    assert (fanout.schema, fanout.backend.create) == ("app", False)  # type: ignore[attr-defined]
    assert fanout.url == f"{url}?sslmode=disable"  # what asyncpg is given: not our options
    assert PostgresFanout(url).schema == "public"
    for bad, error in [
        ("?create=maybe", "must be true or false"),
        ("?schema=a&schema=b", "twice"),
    ]:
        with pytest.raises(ValueError, match=error):
            PostgresFanout(url + bad)
    with pytest.raises(ValueError, match="disagrees"):
        PostgresFanout(f"{url}?schema=app", schema="other")
    with pytest.raises(ValueError, match="disagrees"):
        PostgresFanout(f"{url}?create=true", create=False)
    with pytest.raises(TypeError, match="create must be"):
        PostgresFanout(url, create="no")  # type: ignore[arg-type]


async def test_a_least_privileged_role_runs_members_on_the_migrated_table(
    postgres: PostgresServer,
) -> None:
    """Only USAGE on the schema and SELECT, INSERT, UPDATE, DELETE on the table: members
    wait and advance across processes, expire old values and advance in a transaction."""
    schema, prefix = fresh("app"), "acks"
    async with admin(postgres) as conn:
        url = await least_privileged(conn, postgres, schema, prefix)
    a, b = Purgatory("a"), Purgatory("b")
    fa = PostgresFanout(f"{url}?schema={schema}&create=false", a, prefix=prefix)
    fb = PostgresFanout(url, b, prefix=prefix, schema=schema, create=False, value_ttl=0.2)
    async with a, b, fa, fb:
        wait = asyncio.create_task(fa.wait_for_value(a, "job:1", 2, 60))
        await until(lambda: a.num_delayed == 1)
        await fb.advance_confirmed("job:1", 1)
        user = await asyncpg.connect(url, timeout=10)
        try:
            async with user.transaction():
                await fb.advance_in(user, "job:1", 2)
        finally:
            user.terminate()
        async with asyncio.timeout(PATIENCE):
            assert await wait == 2.0
        await asyncio.sleep(0.4)
        await fb.advance_confirmed("new", 1)  # and the expired value is deleted
    async with admin(postgres) as conn:
        keys = await conn.fetch(f"SELECT key FROM {schema}.{prefix}_values")
    assert [row["key"] for row in keys] == ["new"]


async def test_create_false_names_the_missing_table_or_privilege_and_creates_nothing(
    postgres: PostgresServer,
) -> None:
    schema, prefix = fresh("app"), "acks"
    async with admin(postgres) as conn:
        url = await least_privileged(conn, postgres, schema, prefix)
        role = url.split("//")[1].split(":")[0]

        async def refused(match: str, **options: Any) -> None:
            fanout = PostgresFanout(url, prefix=options.pop("prefix", prefix), **options)
            with pytest.raises(FanoutUnavailable, match=match) as caught:
                await fanout.start()
            assert "\n" not in str(caught.value) and "password" not in str(caught.value)

        missing = fresh("nothing")
        await refused(f"the table {schema}.{missing}_values does not exist", prefix=missing,
                      schema=schema, create=False)  # fmt: skip
        await refused(f"the schema {missing} does not exist", schema=missing, create=False)
        # The role may create neither the schema nor the table: create=True says so.
        await refused("may not create it \\(CREATE on the database\\)", schema=missing)
        await refused(f"may not create it \\(CREATE on the schema {schema}\\)",
                      prefix=missing, schema=schema)  # fmt: skip
        await conn.execute(f"REVOKE DELETE, UPDATE ON {schema}.{prefix}_values FROM {role}")
        await refused(f"lacks UPDATE, DELETE on the table {schema}.{prefix}_values: GRANT",
                      schema=schema, create=False)  # fmt: skip
        await conn.execute(f"REVOKE USAGE ON SCHEMA {schema} FROM {role}")
        await refused(f"lacks USAGE on the schema {schema}", schema=schema, create=False)
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_class WHERE relname LIKE $1", f"{missing}%"
        ) == 0  # fmt: skip
        assert not await conn.fetchval(
            "SELECT count(*) FROM pg_namespace WHERE nspname = $1", missing
        )


async def test_two_schemas_with_one_prefix_never_hear_each_other(
    postgres: PostgresServer,
) -> None:
    first, second = fresh("one"), fresh("two")
    a, b = Purgatory("a"), Purgatory("b")
    fa = PostgresFanout(postgres.url, a, schema=first)
    fb = PostgresFanout(postgres.url, b, schema=second)
    async with a, b, fa, fb:
        wait = asyncio.create_task(fb.wait_for_value(b, "k", 1, 60))
        await until(lambda: b.num_delayed == 1)
        await fa.advance_confirmed("k", 1)
        await asyncio.sleep(0.2)
        assert not wait.done()
        await fb.advance_confirmed("k", 1)
        async with asyncio.timeout(PATIENCE):
            assert await wait == 1.0
    async with admin(postgres) as conn:
        for schema in (first, second):
            assert await conn.fetchval(f"SELECT value FROM {schema}.purgatory_aio_values") == 1
