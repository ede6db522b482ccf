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

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from ._dsn import StoreUnavailable, describe, masked, read_dsn_file, resolve
from ._leases import Host, PgLease, PgLeaseStore
from ._listen import Listener, Notification, Watch, notify
from ._mailbox import COMMANDS_CHANNEL, REPLIES_CHANNEL, Command, HolderSilent, Mailbox, NoHolder, SiteDown
from ._migrate import MigrationReport, SchemaMismatch, migrate
from ._pool import Pool, connect
from ._tasks import TASKS_CHANNEL, PgTaskStore, TaskRecovery

if TYPE_CHECKING:
    from ...config import Config, Paths
    from ...journal import FsyncPolicy
    from .. import Store

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
    "SiteDown",
    "StoreUnavailable",
    "TASKS_CHANNEL",
    "TaskRecovery",
    "Watch",
    "connect",
    "describe",
    "masked",
    "migrate",
    "notify",
    "open_shared",
    "read_dsn_file",
    "resolve",
]


async def open_shared(config: Config, paths: Paths, owner: str, *, fsync: FsyncPolicy) -> Store:
    """The ``postgres`` store, connected and migrated: journals and records, leases by the database's
    clock (site ``<hostname>:<state dir>``), and the :class:`agentd.hosts.Peers` through which this
    host follows and serves the others (a LISTEN connection, the commands mailbox).

    Raises :class:`StoreUnavailable` (its ``exit_code`` says whether a restart can help), SchemaMismatch.
    """
    from ...hosts import Peers
    from ...hosts.tasks import SharedTasks
    from .. import Store
    from .journal import CHANNEL, RECORDS_CHANNEL, open_postgres

    conversations, close, dsn = await open_postgres(config, paths.state_dir / "conversations", fsync=fsync)
    site = f"{socket.gethostname()}:{paths.state_dir}"
    leases = PgLeaseStore(conversations.pool, owner=owner, ttl_s=config.leases.ttl_s, site=site)
    listener = Listener(dsn, [CHANNEL, RECORDS_CHANNEL, COMMANDS_CHANNEL, REPLIES_CHANNEL, TASKS_CHANNEL])
    tasks = SharedTasks(PgTaskStore(conversations.pool, owner=owner, site=site), listener, TASKS_CHANNEL,
                        interval_s=max(config.leases.ttl_s / 3, 0.1))
    peers = Peers(conversations=conversations, leases=leases, listener=listener,
                  mailbox=Mailbox(conversations.pool, listener, owner=owner), owner=owner, site=site,
                  journal_channel=CHANNEL, records_channel=RECORDS_CHANNEL, tasks=tasks)

    async def close_all() -> None:
        try:
            await leases.retire()
        except Exception:
            pass  # the row expires by itself
        await close()

    return Store(conversations, leases, closers=(close_all,), peers=peers)
