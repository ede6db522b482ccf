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
* :mod:`._migrate`: :func:`migrate`, the numbered SQL files under ``migrations/`` applied at start;
* :mod:`._leases`: :class:`PgLeaseStore`, leases expiring by the database's clock, shared by hosts;
* :mod:`._tasks`: :class:`PgTaskStore`, task records and the queue hosts claim them from by provider;
* :mod:`._mailbox`: :class:`Mailbox`, commands carried to a conversation's lease holder and answered.
"""

from ._dsn import StoreUnavailable, describe, masked, read_dsn_file, resolve
from ._leases import Host, PgLease, PgLeaseStore
from ._listen import Listener, Notification, Watch, notify
from ._mailbox import COMMANDS_CHANNEL, REPLIES_CHANNEL, Command, HolderSilent, Mailbox, NoHolder
from ._migrate import MigrationReport, SchemaMismatch, migrate
from ._pool import Pool, connect
from ._tasks import PgTaskStore, TaskRecovery

__all__ = [
    "COMMANDS_CHANNEL",
    "Command",
    "HolderSilent",
    "Host",
    "Listener",
    "Mailbox",
    "MigrationReport",
    "NoHolder",
    "Notification",
    "PgLease",
    "PgLeaseStore",
    "PgTaskStore",
    "Pool",
    "REPLIES_CHANNEL",
    "SchemaMismatch",
    "StoreUnavailable",
    "TaskRecovery",
    "Watch",
    "connect",
    "describe",
    "masked",
    "migrate",
    "notify",
    "read_dsn_file",
    "resolve",
]
