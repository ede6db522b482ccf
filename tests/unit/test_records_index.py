"""The records index: one file a clean close writes, so start-up reads one file instead of one per conversation."""

from __future__ import annotations

from pathlib import Path

import trio

from agentd.journal import INDEX_FILE, JournalStore


def _store(root: Path) -> JournalStore:
    return JournalStore(root / "conversations")


async def test_a_clean_close_leaves_an_index_the_next_start_reads_instead_of_every_record(tmp_path: Path) -> None:
    store = _store(tmp_path)
    assert store.read_records() == {}
    store.write_record("c1", b'{"v":1}')
    store.write_record("c2", b'{"v":2}')
    await store.aclose()
    assert (store.root / INDEX_FILE).is_file()
    # Prove the index is what is read: a record.json changed behind agentd's back is not looked at.
    (store.root / "c1" / "record.json").write_bytes(b'{"v":"changed behind our back"}')
    assert _store(tmp_path).read_records() == {"c1": b'{"v":1}', "c2": b'{"v":2}'}


async def test_the_first_record_change_removes_the_index_so_a_crash_never_reads_a_stale_one(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.read_records()
    store.write_record("c1", b'{"v":1}')
    await store.aclose()
    again = _store(tmp_path)
    again.read_records()
    again.write_record("c1", b'{"v":2}')
    assert not (again.root / INDEX_FILE).exists()
    # No close: as after a crash. The next start reads the records themselves.
    assert _store(tmp_path).read_records() == {"c1": b'{"v":2}'}


async def test_a_removed_conversation_leaves_the_index_and_the_records(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.read_records()
    store.write_record("c1", b'{"v":1}')
    store.write_record("c2", b'{"v":2}')
    await store.aclose()
    again = _store(tmp_path)
    again.read_records()
    again.remove("c1")
    assert not (again.root / INDEX_FILE).exists()
    await again.aclose()
    assert _store(tmp_path).read_records() == {"c2": b'{"v":2}'}


async def test_an_unreadable_index_is_dropped_and_the_records_are_read(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.read_records()
    store.write_record("c1", b'{"v":1}')
    await store.aclose()
    (store.root / INDEX_FILE).write_bytes(b"{not json")
    again = _store(tmp_path)
    assert again.read_records() == {"c1": b'{"v":1}'}
    assert not (again.root / INDEX_FILE).exists()


async def test_a_close_after_an_unchanged_run_keeps_the_index_as_it_is(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.read_records()
    store.write_record("c1", b'{"v":1}')
    await store.aclose()
    index = store.root / INDEX_FILE
    before = index.stat().st_mtime_ns
    await trio.sleep(0.01)
    again = _store(tmp_path)
    again.read_records()
    await again.aclose()
    assert index.stat().st_mtime_ns == before
