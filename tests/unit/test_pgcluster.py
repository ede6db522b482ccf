"""The test PostgreSQL (tests/pgcluster.py): a real server, a fresh database per test, passwords over TCP."""

from __future__ import annotations

import os

import psycopg
import pytest

from pgcluster import PgCluster, PgDatabase


def test_each_test_gets_an_empty_database_of_its_own(pg_db: PgDatabase) -> None:
    pg_db.execute("CREATE TABLE t (x int)")
    assert pg_db.execute("SELECT count(*) FROM t") == [(0,)]
    assert pg_db.execute("SELECT current_database()") == [(pg_db.name,)]


def test_a_second_test_does_not_see_the_first_ones_tables(pg_db: PgDatabase) -> None:
    assert pg_db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [(0,)]


def test_the_server_does_not_run_as_root_and_runs_with_fsync_off(pg_cluster: PgCluster) -> None:
    assert pg_cluster.execute("SHOW fsync") == [("off",)]
    owner = os.stat(pg_cluster.data).st_uid
    assert owner != 0
    if os.geteuid() != 0:
        assert owner == os.geteuid()


def test_tcp_needs_the_password(pg_cluster: PgCluster) -> None:
    pg_cluster.create_role("pgcluster_pw", "right-horse-battery")
    try:
        with psycopg.connect(pg_cluster.tcp_dsn(user="pgcluster_pw", password="right-horse-battery")) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("pgcluster_pw",)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(pg_cluster.tcp_dsn(user="pgcluster_pw", password="wrong-password"))
    finally:
        pg_cluster.execute('DROP ROLE "pgcluster_pw"')
