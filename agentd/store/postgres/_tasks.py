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
* A host that dies leaves its claims: :meth:`PgTaskStore.requeue_dead` puts the ``pending`` ones it
  had claimed back in the queue (they never started, so nothing is resent). Its ``running`` ones are
  for whoever takes over their conversation's lease, which records them ``run_interrupted``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import psycopg
import structlog

from ... import wire
from ._pool import Pool

__all__ = ["PgTaskStore"]

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


class PgTaskStore:
    """Task records in the database behind ``pool``; ``owner`` is this daemon instance (its claims)."""

    def __init__(self, pool: Pool, *, owner: str) -> None:
        self.pool = pool
        self.owner = owner

    async def save(self, task: wire.TaskRecord) -> None:
        """Insert or replace ``task``'s record (one transaction). Raises :class:`StoreUnavailable`."""
        await self.pool.execute(
            "INSERT INTO tasks (id, provider, status, created_at, record) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET provider = EXCLUDED.provider, status = EXCLUDED.status, "
            "record = EXCLUDED.record, updated_at = now()",
            (task.id, task.provider, task.status.value, task.created_at, _encode(task)))

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

    async def requeue_dead(self) -> list[str]:
        """Put back in the queue the ``pending`` tasks claimed by hosts whose heartbeat expired; their ids."""
        rows = await self.pool.execute(
            "UPDATE tasks t SET claimed_by = '', updated_at = now() WHERE t.status = 'pending' AND t.claimed_by <> '' "
            "AND t.claimed_by <> %s AND NOT EXISTS (SELECT 1 FROM hosts h WHERE h.owner = t.claimed_by "
            "AND h.expires_at > now()) RETURNING t.id", (self.owner,))
        return sorted(r[0] for r in rows)
