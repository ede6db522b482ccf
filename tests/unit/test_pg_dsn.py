"""Where the PostgreSQL store connects (agentd.store.postgres._dsn): dsn, dsn_file, libpq's environment,
the password never shown, and start-up errors that name the host and the cause (exit 78 when final)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from agentd import _trust, masking
from agentd.store.postgres import Pool, StoreUnavailable, describe, masked, resolve
from pgcluster import PgCluster, PgDatabase

PASSWORD = "s3cret-horse-battery"


def test_masked_hides_the_password_in_keyword_and_uri_forms() -> None:
    for dsn in (f"host=db1 dbname=agentd user=ann password={PASSWORD}",
                f"postgresql://ann:{PASSWORD}@db1:5433/agentd?sslmode=require"):
        text = masked(dsn)
        assert PASSWORD not in text
        assert "password=[redacted]" in text and "host=db1" in text and "user=ann" in text


def test_masked_never_echoes_a_dsn_libpq_cannot_parse() -> None:
    assert masked(f"host=db1 password={PASSWORD} junk") == "(unparsable DSN)"


def test_describe_names_host_port_database_and_user_but_not_the_password() -> None:
    assert describe(f"postgresql://ann:{PASSWORD}@db1:5433/agentd") == "host db1 port 5433 database agentd user ann"


def test_describe_fills_in_from_libpq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGHOST", "db9")
    monkeypatch.setenv("PGUSER", "bob")
    monkeypatch.delenv("PGPORT", raising=False)
    monkeypatch.delenv("PGDATABASE", raising=False)
    monkeypatch.delenv("PGSERVICE", raising=False)
    assert describe("") == "host db9 port 5432 database bob user bob"


def test_resolve_registers_the_password_for_masking() -> None:
    secret = "registered-pw-" + os.urandom(4).hex()
    resolve(f"host=db1 password={secret}")
    assert masking.mask_text(f"oops {secret} leaked") == f"oops {masking.REDACTED} leaked"


def test_resolve_refuses_dsn_and_dsn_file_together(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable, match="not both") as err:
        resolve("host=db1", tmp_path / "dsn")
    assert err.value.permanent and err.value.exit_code == 78


def test_unparsable_dsn_is_permanent_and_does_not_echo_the_password() -> None:
    with pytest.raises(StoreUnavailable) as err:
        resolve(f"host=db1 password={PASSWORD} {PASSWORD}x")
    assert err.value.exit_code == 78
    assert PASSWORD not in str(err.value)


def _dsn_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    d = tmp_path / "conf"
    d.mkdir(mode=0o700)
    f = d / "dsn"
    f.write_text(text)
    f.chmod(mode)
    return f


def test_dsn_file_is_read_and_stripped(tmp_path: Path) -> None:
    f = _dsn_file(tmp_path, "  host=db1 dbname=agentd\n")
    assert resolve(dsn_file=f) == "host=db1 dbname=agentd"


def test_dsn_file_may_start_with_a_tilde(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = _dsn_file(tmp_path, "host=db2\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve(dsn_file=f"~/{f.relative_to(tmp_path)}") == "host=db2"


def test_dsn_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    f = _dsn_file(tmp_path, f"host=db1 password={PASSWORD}\n", 0o644)
    with pytest.raises(_trust.Untrusted, match="readable by group or others"):
        resolve(dsn_file=f)


def test_dsn_file_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    f = _dsn_file(tmp_path, "host=db1\n")
    link = f.parent / "link"
    link.symlink_to(f)
    with pytest.raises(_trust.Untrusted, match="symlink"):
        resolve(dsn_file=link)


def test_missing_or_empty_dsn_file_is_a_permanent_error(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable, match="no such file") as err:
        resolve(dsn_file=tmp_path / "nope")
    assert err.value.permanent
    with pytest.raises(StoreUnavailable, match="empty"):
        resolve(dsn_file=_dsn_file(tmp_path, "\n"))


# --------------------------------------------------------------------------- against the real server


@pytest.fixture
def role(pg_cluster: PgCluster, pg_db: PgDatabase) -> Iterator[str]:
    name = f"r_{pg_db.name}"
    pg_cluster.create_role(name, PASSWORD, database=pg_db.name)
    yield name
    pg_cluster.drop_database(pg_db.name)
    pg_cluster.execute(f'DROP ROLE "{name}"')


async def _open(dsn: str) -> int:
    async with Pool(dsn, size=1, connect_timeout_s=3) as pool:
        return (await pool.execute("SELECT 1"))[0][0]


async def test_dsn_with_password_connects(pg_cluster: PgCluster, pg_db: PgDatabase, role: str) -> None:
    assert await _open(resolve(pg_cluster.tcp_dsn(pg_db.name, user=role, password=PASSWORD))) == 1


async def test_dsn_file_connects(tmp_path: Path, pg_cluster: PgCluster, pg_db: PgDatabase, role: str) -> None:
    f = _dsn_file(tmp_path, pg_cluster.tcp_dsn(pg_db.name, user=role, password=PASSWORD))
    assert await _open(resolve(dsn_file=f)) == 1


async def test_libpq_environment_and_pgpass_connect(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    pg_cluster: PgCluster, pg_db: PgDatabase, role: str) -> None:
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{pg_cluster.port}:{pg_db.name}:{role}:{PASSWORD}\n")
    pgpass.chmod(0o600)
    for k, v in {"PGHOST": "127.0.0.1", "PGPORT": str(pg_cluster.port), "PGDATABASE": pg_db.name,
                 "PGUSER": role, "PGPASSFILE": str(pgpass)}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    assert await _open(resolve()) == 1


async def test_wrong_password_names_the_host_and_cause_and_is_final(pg_cluster: PgCluster, pg_db: PgDatabase,
                                                                    role: str) -> None:
    wrong = "wrong-password-" + os.urandom(4).hex()
    with pytest.raises(StoreUnavailable) as err:
        await _open(resolve(pg_cluster.tcp_dsn(pg_db.name, user=role, password=wrong)))
    text = str(err.value)
    assert f"host 127.0.0.1 port {pg_cluster.port} database {pg_db.name} user {role}" in text
    assert "password authentication failed" in text
    assert wrong not in text and wrong not in repr(err.value.details)
    assert err.value.permanent and err.value.exit_code == 78


async def test_missing_database_is_final(pg_cluster: PgCluster) -> None:
    with pytest.raises(StoreUnavailable, match='database "no_such_db" does not exist') as err:
        await _open(pg_cluster.dsn("no_such_db"))
    assert err.value.exit_code == 78


async def test_unreachable_server_names_the_host_and_may_pass(pg_cluster: PgCluster) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with trio.fail_after(10), pytest.raises(StoreUnavailable) as err:
            await _open(f"host=127.0.0.1 port={port} dbname=x user=y password={PASSWORD}")
    assert f"host 127.0.0.1 port {port}" in str(err.value) and "refused" in str(err.value)
    assert PASSWORD not in str(err.value)
    assert not err.value.permanent and err.value.exit_code == 1
