"""The PostgreSQL schema, created and brought up to date by agentd itself at start.

Migrations are the files ``migrations/NNNN_<name>.sql`` of this package, versions 1, 2, 3 ... with
no gap; each is plain SQL (several statements, no parameters). Rules:

* :func:`migrate` applies, in order, every migration the database has not recorded in its
  ``schema_migrations`` table (version, name, sha256 of the file, applied_at), each in its own
  transaction together with its row: a migration is applied whole or not at all, and a failure
  leaves the earlier ones applied (the next start goes on from there).
* Several hosts may start at once: the whole run holds a session advisory lock
  (:data:`LOCK_KEY`), so one host migrates and the others wait, then find nothing to do.
  The lock goes with the session, so a host that dies mid-run blocks nobody.
* Idempotent: a run on an up-to-date database changes nothing.
* A database newer than this code (a version it does not know, put there by a newer agentd) is
  refused: :class:`SchemaMismatch`, permanent (exit 78), since this code would misread it. So is
  an applied migration whose file changed since (its sha256 differs): the schema is not what
  the code assumes.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import re
from typing import Any

import msgspec
import psycopg
import structlog

from ._dsn import StoreUnavailable
from ._pool import Pool

__all__ = ["LOCK_KEY", "Migration", "MigrationReport", "SchemaMismatch", "load_migrations", "migrate",
           "migrate_conn"]

#: pg_advisory_lock key held while migrating ("agentd" in ASCII)
LOCK_KEY = 0x6167656E7464

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_SCHEMA_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    sha256      text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


def _log() -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("agentd.store")


class Migration(msgspec.Struct, frozen=True):
    """One migration file: ``version`` (its number), ``name`` (the rest of the file name), ``sql``."""

    version: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


class MigrationReport(msgspec.Struct, frozen=True):
    """What :func:`migrate` did: the versions it ``applied`` now, and the database's ``version`` after."""

    applied: list[int]
    version: int


class SchemaMismatch(StoreUnavailable):
    """The database's schema is not one this code can use (newer, or an applied migration changed)."""

    def __init__(self, target: str, cause: str) -> None:
        super().__init__(target, cause, permanent=True)


def load_migrations() -> list[Migration]:
    """This package's migrations, by version. Raises RuntimeError for a misnamed file or a gap (a bug)."""
    out = []
    for entry in importlib.resources.files(__package__).joinpath("migrations").iterdir():
        if not entry.name.endswith(".sql"):
            continue
        m = _NAME.match(entry.name)
        if m is None:
            raise RuntimeError(f"migration file {entry.name!r} is not named NNNN_name.sql")
        out.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    out.sort(key=lambda m: m.version)
    versions = [m.version for m in out]
    if versions != list(range(1, len(out) + 1)):
        raise RuntimeError(f"migration versions must be 1..n with no gap or duplicate, not {versions}")
    return out


def migrate_conn(conn: psycopg.Connection[Any], migrations: list[Migration] | None = None, *,
                 target: str = "the database") -> MigrationReport:
    """Bring the database of ``conn`` (autocommit, no transaction open) up to date; blocking.

    ``migrations`` defaults to :func:`load_migrations`. Raises :class:`SchemaMismatch`, and
    psycopg's error for a migration that fails (that migration rolled back, the earlier ones kept).
    """
    migrations = load_migrations() if migrations is None else migrations
    known = {m.version: m for m in migrations}
    newest = max(known, default=0)
    # Waiting for another host's run, and a long migration, are not bounded by the pool's statement_timeout.
    saved = conn.execute("SHOW statement_timeout").fetchone()[0]  # type: ignore[index]
    conn.execute("SELECT set_config('statement_timeout', '0', false)")
    conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
    try:
        conn.execute(_SCHEMA_MIGRATIONS)
        applied = {v: (name, sha) for v, name, sha in
                   conn.execute("SELECT version, name, sha256 FROM schema_migrations").fetchall()}
        db_version = max(applied, default=0)
        if db_version > newest:
            raise SchemaMismatch(target, f"its schema is at version {db_version}, newer than this agentd knows "
                                         f"({newest}): run the newer agentd, or a database of its own")
        for v, (name, sha) in sorted(applied.items()):
            m = known.get(v)
            if m is None or m.sha256 != sha:
                raise SchemaMismatch(target, f"migration {v:04d}_{name} applied there differs from this agentd's "
                                             f"{'(missing)' if m is None else f'{m.version:04d}_{m.name}'}")
        done = []
        for m in migrations:
            if m.version in applied:
                continue
            with conn.transaction():
                conn.execute(m.sql)  # type: ignore[arg-type]  (file text: no parameters, several statements)
                conn.execute("INSERT INTO schema_migrations (version, name, sha256) VALUES (%s, %s, %s)",
                             (m.version, m.name, m.sha256))
            done.append(m.version)
            _log().info("store.migrated", version=m.version, name=m.name)
        return MigrationReport(done, max([db_version, *done]))
    finally:
        if not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
            conn.execute("SELECT set_config('statement_timeout', %s, false)", (saved,))


async def migrate(pool: Pool, migrations: list[Migration] | None = None) -> MigrationReport:
    """:func:`migrate_conn` on one of ``pool``'s connections, in a worker thread."""
    return await pool.run(lambda conn: migrate_conn(conn, migrations, target=pool.target), transaction=False)
