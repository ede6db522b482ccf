"""The PostgreSQL schema migrations (agentd.store.postgres._migrate) against a real server: a fresh
database, a re-run, a run that stopped part way, concurrent starts, and a database newer than the code."""

from __future__ import annotations

import psycopg
import pytest
import trio

from agentd.store.postgres import Pool, SchemaMismatch, migrate
from agentd.store.postgres._migrate import Migration, load_migrations
from pgcluster import PgDatabase

M1 = Migration(1, "one", "CREATE TABLE a (x int); CREATE TABLE b (y int);")
M2 = Migration(2, "two", "ALTER TABLE a ADD COLUMN z text;")
BAD2 = Migration(2, "two", "ALTER TABLE a ADD COLUMN z text; SELECT no_such_function();")
M3 = Migration(3, "three", "CREATE TABLE c (w int);")


def _tables(db: PgDatabase) -> set[str]:
    return {r[0] for r in db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def test_the_shipped_migrations_are_numbered_1_to_n() -> None:
    ms = load_migrations()
    assert [m.version for m in ms] == list(range(1, len(ms) + 1))
    assert ms[0].name == "hosts_leases_tasks_commands"


async def test_a_fresh_database_gets_every_migration_and_a_rerun_changes_nothing(pg_db: PgDatabase) -> None:
    async with Pool(pg_db.dsn, size=1) as pool:
        first = await migrate(pool)
        again = await migrate(pool)
    n = len(load_migrations())
    assert first.applied == list(range(1, n + 1)) and first.version == n
    assert again.applied == [] and again.version == n
    assert {"schema_migrations", "leases", "hosts", "tasks", "commands"} <= _tables(pg_db)
    assert pg_db.execute("SELECT count(*) FROM schema_migrations") == [(n,)]


async def test_a_failed_migration_rolls_back_whole_and_the_next_run_goes_on(pg_db: PgDatabase) -> None:
    async with Pool(pg_db.dsn, size=1) as pool:
        with pytest.raises(psycopg.errors.UndefinedFunction):
            await migrate(pool, [M1, BAD2])
        assert pg_db.execute("SELECT version FROM schema_migrations") == [(1,)]
        # BAD2's first statement was rolled back with it
        assert pg_db.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'a'") == [(1,)]
        report = await migrate(pool, [M1, M2, M3])
    assert report.applied == [2, 3] and report.version == 3
    assert {"a", "b", "c"} <= _tables(pg_db)


async def test_a_database_newer_than_the_code_is_refused(pg_db: PgDatabase) -> None:
    async with Pool(pg_db.dsn, size=1) as pool:
        await migrate(pool, [M1, M2, M3])
        with pytest.raises(SchemaMismatch, match="version 3, newer than this agentd knows \\(2\\)") as err:
            await migrate(pool, [M1, M2])
    assert err.value.permanent and err.value.exit_code == 78


async def test_an_applied_migration_that_changed_is_refused(pg_db: PgDatabase) -> None:
    async with Pool(pg_db.dsn, size=1) as pool:
        await migrate(pool, [M1])
        with pytest.raises(SchemaMismatch, match="0001_one applied there differs"):
            await migrate(pool, [Migration(1, "one", M1.sql + " -- edited"), M2])


async def test_hosts_starting_together_apply_each_migration_once(pg_db: PgDatabase) -> None:
    slow = Migration(1, "slow", "SELECT pg_sleep(0.3); CREATE TABLE a (x int);")
    reports = []

    async def host() -> None:
        async with Pool(pg_db.dsn, size=1) as pool:
            reports.append(await migrate(pool, [slow, M2]))

    async with trio.open_nursery() as n:
        for _ in range(3):
            n.start_soon(host)
    assert sorted(r.applied for r in reports) == [[], [], [1, 2]]
    assert all(r.version == 2 for r in reports)


async def test_the_pool_statement_timeout_is_restored_after_migrating(pg_db: PgDatabase) -> None:
    async with Pool(pg_db.dsn, size=1, statement_timeout_s=5) as pool:
        await migrate(pool, [M1])
        assert await pool.execute("SHOW statement_timeout") == [("5s",)]
