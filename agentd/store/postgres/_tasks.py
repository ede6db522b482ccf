"""Task records in PostgreSQL, and the queue hosts claim them from.

The rows (migration 0001): ``tasks (id, provider, status, created_at, claimed_by, record, updated_at)``;
``record`` is the :class:`~agentd.wire.TaskRecord` as JSON, the same bytes the file store's
:class:`~agentd.tasks.TaskStore` writes to ``tasks/<id>.json``; the other columns repeat what a
claim or a listing looks at. Rules:

* :meth:`PgTaskStore.save` and :meth:`PgTaskStore.load` are the file store's ``save``/``load``, ``async``.
  A save never changes who claimed the task.
* A task queued on any host (``pending``, ``claimed_by = ''``) runs on a host that offers its provider:
  :meth:`PgTaskStore.claim` takes the oldest such task for the providers given, with
  ``SELECT ... FOR UPDATE SKIP LOCKED``, so hosts claiming at once never get the same task and
  never wait on each other's claims.
* A host that dies leaves its claims: :meth:`PgTaskStore.recover_dead` puts the ``pending`` ones it
  had claimed back in the queue (they never started, so nothing is resent) and hands each of its
  ``running`` ones to exactly one live host, which records it ``run_interrupted`` (never runs it again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import psycopg
import structlog

from ... import wire
from ._pool import Pool

__all__ = ["TASKS_CHANNEL", "PgTaskStore", "TaskRecovery"]

#: NOTIFY channel of tasks queued; payload: their provider
TASKS_CHANNEL = "agentd_tasks"

_encode = msgspec.json.Encoder().encode
_decoder = msgspec.json.Decoder(wire.TaskRecord)


def _log() -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("agentd.tasks")


def _decode(rows: list[tuple[Any, ...]]) -> list[wire.TaskRecord]:
    out = []
    for task_id, record in rows:
        try:
            out.append(_decoder.decode(record))
        except msgspec.DecodeError as exc:
            _log().error("task.record_unreadable", task=task_id, error=str(exc))
    return out


class TaskRecovery(msgspec.Struct, frozen=True):
    """What :meth:`PgTaskStore.recover_dead` did: task ids ``requeued``, task records ``adopted``."""

    requeued: list[str]
    adopted: list[wire.TaskRecord]


#: a task claimed by another owner that is dead: no live heartbeat, or a previous instance of our site
_DEAD = ("t.claimed_by <> '' AND t.claimed_by <> %(me)s AND NOT EXISTS (SELECT 1 FROM hosts h "
         "WHERE h.owner = t.claimed_by AND h.expires_at > now() AND (%(site)s = '' OR h.site <> %(site)s))")


class PgTaskStore:
    """Task records in the database behind ``pool``; ``owner`` is this daemon instance (its claims).

    ``site``: as :class:`~agentd.store.postgres.PgLeaseStore`'s (this state dir): another instance of
    the same site is dead, so its claims are settled at once by :meth:`recover_dead`.
    """

    def __init__(self, pool: Pool, *, owner: str, site: str = "") -> None:
        self.pool = pool
        self.owner = owner
        self.site = site

    def _save(self, conn: psycopg.Connection[Any], task: wire.TaskRecord) -> None:
        from ._listen import notify

        conn.execute(
            "INSERT INTO tasks (id, provider, status, created_at, record) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET provider = EXCLUDED.provider, status = EXCLUDED.status, "
            "record = EXCLUDED.record, updated_at = now()",
            (task.id, task.provider, task.status.value, task.created_at, _encode(task)))
        if task.status is wire.TaskStatus.PENDING:
            notify(conn, TASKS_CHANNEL, task.provider)  # hosts offering it look for work

    async def save(self, task: wire.TaskRecord) -> None:
        """Insert or replace ``task``'s record (one transaction; a ``pending`` one also sends
        ``NOTIFY agentd_tasks, '<provider>'``). Raises :class:`StoreUnavailable`."""
        await self.pool.run(self._save, task)

    async def cancel_queued(self, task_id: str, record: wire.TaskRecord) -> bool:
        """Replace a task still queued and claimed by nobody with ``record`` (its ``cancelled`` end),
        atomically against claims; False when a host claimed it first (or it is not queued)."""
        rows = await self.pool.execute(
            "UPDATE tasks SET status = %s, record = %s, updated_at = now() "
            "WHERE id = %s AND status = 'pending' AND claimed_by = '' RETURNING id",
            (record.status.value, _encode(record), task_id))
        return bool(rows)

    async def load(self, *, claimed_by: str | None = None) -> list[wire.TaskRecord]:
        """Every readable record, oldest first (an unreadable one is logged and skipped).

        ``claimed_by``: only the tasks that owner claimed ("" for those nobody claimed).
        """
        where, params = ("WHERE claimed_by = %s", (claimed_by,)) if claimed_by is not None else ("", ())
        rows = await self.pool.execute(f"SELECT id, record FROM tasks {where} ORDER BY created_at, id", params)
        return _decode(rows)

    def _claim(self, conn: psycopg.Connection[Any], providers: list[str]) -> wire.TaskRecord | None:
        while True:
            row = conn.execute(
                "SELECT id, record FROM tasks WHERE status = 'pending' AND claimed_by = '' AND provider = ANY(%s) "
                "ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED", (providers,)).fetchone()
            if row is None:
                return None
            conn.execute("UPDATE tasks SET claimed_by = %s, updated_at = now() WHERE id = %s", (self.owner, row[0]))
            got = _decode([row])
            if got:
                return got[0]
            # unreadable: claimed (so nobody loops on it) and logged; look at the next one

    async def claim(self, providers: Sequence[str]) -> wire.TaskRecord | None:
        """Claim the oldest queued task for one of ``providers`` for us; None when there is none.

        Never the same task as a host claiming at the same time (SKIP LOCKED). The task stays
        ``pending``: the caller saves it ``running`` when it starts it.
        """
        if not providers:
            return None
        return await self.pool.run(self._claim, list(providers))

    async def unclaim(self, task_id: str) -> bool:
        """Put our claimed, still ``pending`` task back in the queue (we will not run it); True if it was."""
        rows = await self.pool.execute(
            "UPDATE tasks SET claimed_by = '', updated_at = now() "
            "WHERE id = %s AND claimed_by = %s AND status = 'pending' RETURNING id", (task_id, self.owner))
        return bool(rows)

    def _recover(self, conn: psycopg.Connection[Any]) -> TaskRecovery:
        args = {"me": self.owner, "site": self.site}
        requeued = conn.execute(
            f"UPDATE tasks t SET claimed_by = '', updated_at = now() WHERE t.status = 'pending' AND {_DEAD} "
            "RETURNING t.id", args).fetchall()
        adopted = conn.execute(
            f"UPDATE tasks t SET claimed_by = %(me)s, updated_at = now() "
            f"WHERE t.status IN ('running', 'waiting_for_input') AND {_DEAD} RETURNING t.id, t.record", args).fetchall()
        return TaskRecovery(requeued=sorted(r[0] for r in requeued),
                            adopted=sorted(_decode(adopted), key=lambda t: (t.created_at, t.id)))

    async def recover_dead(self) -> TaskRecovery:
        """Settle the claims of dead hosts (heartbeat expired, or a previous instance of our ``site``).

        Their ``pending`` tasks go back to the queue (they never started: nothing is resent). Their
        ``running`` / ``waiting_for_input`` tasks become ours, each adopted by exactly one host (the
        row lock decides), for the caller to end as ``run_interrupted``, never to run again.
        """
        return await self.pool.run(self._recover)
