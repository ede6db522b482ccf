"""agentd.hosts.tasks.SharedTasks' record writer: saves are written in order, the last one of a
task wins, ``durable()`` returns only once what was saved before it is in the store, and raises
(nothing counted as written) while the store refuses."""

from __future__ import annotations

import trio

from agentd import contract as c
from agentd import wire
from agentd.hosts.tasks import SharedTasks


class _Store:
    def __init__(self) -> None:
        self.rows: dict[str, wire.TaskRecord] = {}
        self.order: list[tuple[str, str]] = []
        self.failing = False

    async def save(self, task: wire.TaskRecord) -> None:
        await trio.sleep(0.01)
        if self.failing:
            raise c.InternalError("the database is gone")
        self.rows[task.id] = task
        self.order.append((task.id, task.status.value))


def _task(tid: str) -> wire.TaskRecord:
    return wire.TaskRecord(id=tid, provider="script", workdir="/", input="x", created_at="t", updated_at="t")


async def test_durable_waits_for_the_saves_before_it_and_fails_while_the_store_refuses() -> None:
    store = _Store()
    shared = SharedTasks(store, listener=None, channel="agentd_tasks", interval_s=1.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(shared._writer)
        a = _task("a")
        shared.save(a)
        a.status = wire.TaskStatus.RUNNING  # a copy was taken at save: this change is not in it
        await shared.durable()
        assert store.rows["a"].status is wire.TaskStatus.PENDING
        shared.save(a)
        shared.save(_task("b"))
        await shared.durable()
        assert store.order[-2:] == [("a", "running"), ("b", "pending")]

        store.failing = True
        shared.save(_task("c"))
        try:
            await shared.durable()
        except c.InternalError as exc:
            assert "the database is gone" in exc.message
        else:
            raise AssertionError("durable() returned while the store refused the write")
        assert "c" not in store.rows
        store.failing = False
        with trio.fail_after(5):  # retried after the refusal
            while "c" not in store.rows:
                await trio.sleep(0.05)
        await shared.durable()
        nursery.cancel_scope.cancel()
