"""The PostgreSQL store's foundation: DSN handling, a connection pool, LISTEN/NOTIFY, migrations, leases, tasks.

Imported only when ``[store] backend = "postgres"`` (it imports psycopg). The pieces, each with the
contract in its own module's docstring:

* :mod:`._dsn`: where to connect (``dsn``, ``dsn_file``, or libpq's environment and ``.pgpass``),
  said without the password; :class:`StoreUnavailable` (host and cause; exit 78 when a restart
  cannot help);
* :mod:`._pool`: :class:`Pool`, psycopg connections lent to worker threads from trio, one
  transaction per call;
* :mod:`._listen`: :class:`Listener` / :class:`Watch`, notifications that wake trio tasks, and
  :func:`notify`;
* :mod:`._migrate`: :func:`migrate`, the numbered SQL files under ``migrations/`` applied at start.
"""

from ._dsn import StoreUnavailable, describe, masked, read_dsn_file, resolve
from ._listen import Listener, Notification, Watch, notify
from ._migrate import MigrationReport, SchemaMismatch, migrate
from ._pool import Pool, connect

__all__ = [
    "Listener",
    "MigrationReport",
    "Notification",
    "Pool",
    "SchemaMismatch",
    "StoreUnavailable",
    "Watch",
    "connect",
    "describe",
    "masked",
    "migrate",
    "notify",
    "read_dsn_file",
    "resolve",
]
