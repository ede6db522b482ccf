"""The file store: today's journals and records under ``<state_dir>/conversations``, unchanged on disk.

A thin face of :class:`agentd.journal.JournalStore` giving the async reads of
:mod:`agentd.store`: each answers inline on the trio thread (no worker-thread hop, no
schedule point), exactly as the synchronous reads did, since a subscriber's catch-up is
the hot path and these reads are page-cache reads (see BENCHMARKS.md). Appends and
``sync`` are the file journal's own bound methods, so the append path costs what it did.
"""

from __future__ import annotations

import pathlib
import threading
from typing import Any

import trio

from ..journal import FsyncPolicy, Journal, JournalStore
from . import StorageCapabilities

__all__ = ["FileJournal", "FileLeases", "FileStore"]

CAPABILITIES = StorageCapabilities(backend="file")


class FileJournal:
    """A :class:`agentd.journal.Journal` with the store interface's async ``read_after``."""

    __slots__ = ("journal", "path", "append", "sync")

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.path = journal.path
        # Bound once: append is the daemon's hottest path, and this keeps it one call.
        self.append = journal.append
        self.sync = journal.sync

    @property
    def last_seq(self) -> int:
        return self.journal.last_seq

    @property
    def size(self) -> int:
        return self.journal.size

    async def read_after(self, after: int, limit: int | None = None, max_bytes: int | None = None) -> list[bytes]:
        return self.journal.read_after(after, limit, max_bytes)

    def __repr__(self) -> str:
        return repr(self.journal)


class FileStore:
    """Journals and records as files (see :mod:`agentd.journal` for the layout and the fsync policies)."""

    capabilities = CAPABILITIES

    def __init__(self, root: pathlib.Path, *, fsync: FsyncPolicy = FsyncPolicy.BATCH, batch_ms: float = 5.0) -> None:
        self.files = JournalStore(root, fsync=fsync, batch_ms=batch_ms)
        self.root = self.files.root
        self._journals: dict[str, FileJournal] = {}
        # A record is written by one thread at a time (the trio thread's write_record, or the
        # worker of write_record_async); each write or removal counts, so a write started
        # before a newer one never lands after it.
        self._record_lock = threading.Lock()
        self._record_writes: dict[str, int] = {}

    @property
    def records_from_index(self) -> bool:
        return self.files.records_from_index

    @property
    def refused(self) -> dict[str, Exception]:
        return self.files.refused  # type: ignore[return-value]

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self.files.run(task_status=task_status)

    async def open(self, conversation_id: str) -> FileJournal:
        j = self._journals.get(conversation_id)
        inner = self.files.open(conversation_id)
        if j is None or j.journal is not inner:  # reopened after aclose() or remove()
            j = self._journals[conversation_id] = FileJournal(inner)
        return j

    async def ids(self) -> list[str]:
        return self.files.ids()

    async def read_records(self) -> dict[str, bytes]:
        return self.files.read_records()

    async def read_record(self, conversation_id: str) -> bytes | None:
        return self.files.read_record(conversation_id)

    def write_record(self, conversation_id: str, data: bytes) -> None:
        self._record_writes[conversation_id] = self._record_writes.get(conversation_id, 0) + 1
        with self._record_lock:
            self.files.write_record(conversation_id, data)

    async def write_record_async(self, conversation_id: str, data: bytes) -> None:
        """``write_record`` in a worker thread; skipped when a write or removal of the same record
        came meanwhile (it is newer). Raises Invalid, OSError."""
        ticket = self._record_writes.get(conversation_id, 0)

        def write() -> None:
            with self._record_lock:
                if self._record_writes.get(conversation_id, 0) == ticket:
                    self.files.write_record(conversation_id, data)

        await trio.to_thread.run_sync(write)

    def drop_index(self) -> None:
        self.files.drop_index()

    async def journal_size(self, conversation_id: str) -> int:
        return self.files.journal_size(conversation_id)

    async def remove(self, conversation_id: str) -> None:
        self._journals.pop(conversation_id, None)
        self._record_writes[conversation_id] = self._record_writes.get(conversation_id, 0) + 1
        with self._record_lock:  # a write in flight would make its directory again
            self.files.remove(conversation_id)

    async def aclose(self) -> None:
        self._journals.clear()
        await self.files.aclose()


class FileLeases:
    """:class:`agentd.leases.FileLeaseStore` behind the async :class:`agentd.store.Leases`: its calls
    are short local file operations under the daemon lock, answered inline as the file reads are."""

    __slots__ = ("inner",)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def acquire(self, key: str) -> Any:
        return self.inner.acquire(key)

    async def release(self, key: str) -> None:
        self.inner.release(key)

    async def get(self, key: str) -> Any:
        return self.inner.get(key)

    def held(self) -> list[str]:
        return self.inner.held()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self.inner.run(task_status=task_status)
