"""agentd.write_behind and the file store's records written behind: one save per conversation
however often it was marked, due delay_s after the first mark, none once saved at once; and a
record written behind never lands after a newer write or its conversation's removal."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import trio
import trio.testing

from agentd.store.file import FileStore
from agentd.write_behind import WriteBehind


def test_saves_are_coalesced_per_conversation_and_due_delay_s_after_the_first_mark() -> None:
    saved: list[tuple[str, float]] = []

    async def main() -> None:
        wb = WriteBehind(delay_s=2.0)

        async def save(cid: str) -> None:
            saved.append((cid, trio.current_time()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wb.run, save)
            t0 = trio.current_time()
            wb.mark("c1")
            await trio.sleep(0.5)
            wb.mark("c1")  # already owed: still due at t0 + 2
            wb.mark("c2")
            wb.mark("c3")
            await trio.sleep(0.1)
            wb.discard("c3")  # saved at once meanwhile
            await trio.sleep(5)
            assert [(cid, round(t - t0, 3)) for cid, t in saved] == [("c1", 2.0), ("c2", 2.5)]
            wb.mark("c1")  # owed again after its save
            assert wb.owed() == ["c1"] and not wb.owed()  # shutdown takes what is owed
            await trio.sleep(5)
            assert len(saved) == 2
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def _worker_waits(nursery: trio.Nursery) -> threading.Event:
    """Hold trio's only worker thread (its default limiter cut to one) until the event is set:
    a write behind started now has taken its turn, and reaches its thread only after that."""
    trio.to_thread.current_default_thread_limiter().total_tokens = 1
    gate = threading.Event()
    nursery.start_soon(trio.to_thread.run_sync, gate.wait)
    await trio.sleep(0.05)
    return gate


def test_a_record_written_behind_never_lands_after_a_newer_write_or_a_removal(tmp_path: Path) -> None:
    async def main() -> None:
        store = FileStore(tmp_path / "conversations")
        store.write_record("c1", b'{"v": 1}')
        async with trio.open_nursery() as nursery:
            gate = await _worker_waits(nursery)
            nursery.start_soon(store.write_record_async, "c1", b'{"v": 2}')
            await trio.sleep(0.05)  # it waits for a worker thread
            store.write_record("c1", b'{"v": 3}')  # newer, made at once on the event loop's thread
            gate.set()
        assert json.loads((store.root / "c1" / "record.json").read_bytes()) == {"v": 3}
        async with trio.open_nursery() as nursery:
            gate = await _worker_waits(nursery)
            nursery.start_soon(store.write_record_async, "c1", b'{"v": 4}')
            await trio.sleep(0.05)
            await store.remove("c1")
            gate.set()
        assert not (store.root / "c1").exists()  # not made again by the write that came too late
        assert "c1" not in store.files.read_records()
        async with trio.open_nursery() as nursery:  # with nothing newer, it is written
            nursery.start_soon(store.write_record_async, "c2", b'{"v": 5}')
        assert json.loads((store.root / "c2" / "record.json").read_bytes()) == {"v": 5}

    trio.run(main)
