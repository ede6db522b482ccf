"""Tasks on a shared store: records in the database, queued tasks run by a host that offers their provider.

What changes against the file store (agentd.tasks keeps every other rule):

* A task created on any host is saved ``pending`` and claimed by nobody, with ``NOTIFY agentd_tasks``.
  Every host with a free place for that provider (``[tasks] concurrency``) tries to claim the oldest
  such task (``FOR UPDATE SKIP LOCKED``: two hosts never get the same one) and runs it there, in a
  conversation of its own on that host. A host also looks every ``ttl_s / 3`` in case a notification
  was missed. A claimed task whose workdir does not exist on this host is put back for the others
  and not claimed here again.
* Records are written behind, in order, by one writer task (the service's ``_save`` stays
  synchronous); the writes that must be durable before agentd goes on (a task's creation, its
  ``running`` before its prompt is sent) are awaited (:meth:`SharedTasks.durable`).
* A host that died leaves its claims: every ``ttl_s / 3`` each host settles those of dead hosts
  (agentd.store.postgres.PgTaskStore.recover_dead). Queued ones go back to the queue; each running
  one is adopted by exactly one host, which ends its turn ``run_interrupted`` (as the conversation's
  takeover does) and records the task ``failed``, reason ``run_interrupted``, then sends its callback.
  It is never run again.
* ``task ls`` / ``show`` on any host read every task from the database. A queued task can be
  cancelled from any host. A running one is cancelled on the host that runs it, and the error says
  which host that is. ``agentctl cancel`` on its conversation works from any host.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import msgspec
import structlog
import trio

from .. import contract as c
from .. import wire
from ..leases import LeaseHeld

__all__ = ["SharedTasks"]

log = structlog.get_logger("agentd.hosts")

_copy = msgspec.json.Decoder(wire.TaskRecord).decode
_encode = msgspec.json.Encoder().encode


class SharedTasks:
    """The task side of a shared store for one :class:`agentd.tasks.TaskService`.

    ``store``: an agentd.store.postgres.PgTaskStore of this instance; ``listener`` listens on
    ``channel`` (the store's ``TASKS_CHANNEL``); ``interval_s``: how often it looks without a
    notification (claims, dead hosts).
    """

    def __init__(self, store: Any, listener: Any, channel: str, *, interval_s: float) -> None:
        self.store = store
        self.listener = listener
        self.channel = channel
        self.interval_s = interval_s
        self.service: Any = None
        self._unwritten: OrderedDict[str, wire.TaskRecord] = OrderedDict()
        self._saved = 0  # saves asked for
        self._written = 0  # saves done (or failed: _error)
        self._error: BaseException | None = None
        self._wrote = trio.Event()
        self._wake_writer = trio.Event()
        self._wake_claims = trio.Event()
        #: tasks put back because this host cannot run them (their workdir is not here)
        self._not_here: set[str] = set()
        #: running tasks of dead hosts adopted here, not ended yet (their conversation's lease still held)
        self._adopted: dict[str, wire.TaskRecord] = {}

    # ------------------------------------------------------------------ the record store TaskService uses

    def save(self, task: wire.TaskRecord) -> None:
        """Queue ``task``'s record as it is now for the writer (a copy: the task goes on changing)."""
        self._unwritten[task.id] = _copy(_encode(task))
        self._unwritten.move_to_end(task.id)
        self._saved += 1
        self._wake_writer.set()

    def load(self) -> list[wire.TaskRecord]:
        """None at start: a new instance claims nothing; what a previous one left comes back through
        the dead-host recovery (its claims are settled at once: same site)."""
        return []

    async def durable(self) -> None:
        """Return once every save asked for before the call is in the database; raises what the last
        failed write raised (StoreUnavailable)."""
        target = self._saved
        while self._written < target:
            if self._error is not None:
                raise c.InternalError(f"cannot write the task record: {self._error}")
            wrote = self._wrote
            await wrote.wait()
        await trio.lowlevel.checkpoint()

    async def _writer(self) -> None:
        while True:
            if not self._unwritten:
                self._wake_writer = trio.Event()
                await self._wake_writer.wait()
            upto = self._saved
            batch, self._unwritten = list(self._unwritten.values()), OrderedDict()
            try:
                for task in batch:
                    await self.store.save(task)
            except Exception as exc:  # retried; never takes the daemon down
                log.error("task.record_write_failed", tasks=[t.id for t in batch], error=str(exc))
                self._error = exc  # the waiters raise it
                for task in reversed(batch):  # retried first, unless saved again meanwhile
                    if task.id not in self._unwritten:
                        self._unwritten[task.id] = task
                        self._unwritten.move_to_end(task.id, last=False)
                self._wrote.set()
                self._wrote = trio.Event()
                await trio.sleep(1.0)
                continue
            self._error = None
            self._written = upto
            self._wrote.set()
            self._wrote = trio.Event()

    # ------------------------------------------------------------------ claims

    def wake(self) -> None:
        """A place may be free, or a task was queued here: look for work."""
        self._wake_claims.set()

    async def run(self, service: Any, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write records, claim tasks, settle dead hosts' claims, until cancelled."""
        self.service = service
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer)
            await nursery.start(self._notified)
            nursery.start_soon(self._claims)
            task_status.started()

    async def _notified(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.listener.watch(self.channel) as watch:
            task_status.started()
            async for _ in watch:  # a task queued, or some notifications missed: look either way
                self.wake()

    async def _claims(self) -> None:
        while True:
            try:
                await self._settle_dead()
                await self._claim_all()
            except Exception as exc:  # looked at again next round
                log.warning("task.claim_failed", error=str(exc))
            with trio.move_on_after(self.interval_s):
                await self._wake_claims.wait()
            self._wake_claims = trio.Event()

    async def _claim_all(self) -> None:
        service = self.service
        for provider in service.conversations.runtimes.names():
            while service.free_places(provider) > 0:
                task = await self.store.claim([provider])
                if task is None:
                    break
                if task.id in self._not_here or not os.path.isdir(task.workdir):
                    self._not_here.add(task.id)
                    await self.store.unclaim(task.id)
                    log.info("task.not_here", task=task.id, workdir=task.workdir)
                    break  # the oldest queued one again next time: leave the rest for a look later
                log.info("task.claimed", task=task.id, provider=provider)
                service.start_claimed(task)

    async def _settle_dead(self) -> None:
        recovery = await self.store.recover_dead()
        if recovery.requeued:
            log.warning("task.requeued", tasks=recovery.requeued, reason="their host died before starting them")
            self.wake()
        for task in recovery.adopted:
            self._adopted[task.id] = task
        for task_id, task in list(self._adopted.items()):
            if await self._end_adopted(task):
                del self._adopted[task_id]

    async def _end_adopted(self, task: wire.TaskRecord) -> bool:
        """End a dead host's running task ``run_interrupted``: first its turn (taking its conversation
        over), then the task. False while that conversation's lease is still held (tried again)."""
        service = self.service
        conversations = service.conversations
        record = None
        if task.conversation:
            try:
                record = await conversations.recover(task.conversation)
            except LeaseHeld:
                return False
            except c.NotFound:
                record = None
        await service.adopt_interrupted(task)  # reads the turn's end from the journal
        if task.conversation and record is not None and record.site and record.site != conversations.site:
            await conversations.unload(record.id)  # it waits for its own site's agentd
        return True

    # ------------------------------------------------------------------ reads and cancels

    async def refresh(self) -> None:
        """Every task's record from the database into the service (those running here stay its own)."""
        for task in await self.store.load():
            self.service.remote_task(task)

    async def cancel_queued(self, task: wire.TaskRecord) -> bool:
        """Cancel a task queued and claimed by nobody, atomically against claims; False when a host
        claimed it first."""
        ended = _copy(_encode(task))
        ended.status = wire.TaskStatus.CANCELLED
        ended.error, ended.reason = "cancelled before it started", "cancelled"
        return await self.store.cancel_queued(task.id, ended)
