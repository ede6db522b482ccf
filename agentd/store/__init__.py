"""The store: everything agentd persists about conversations, behind one interface.

Two implementations, chosen by ``[store] backend`` (:func:`open_store`):

* ``file`` (the default): ``<state_dir>/conversations/<id>/events.jsonl`` and ``record.json``
  (:mod:`agentd.journal`), leases as files beside them (:mod:`agentd.leases`);
* ``postgres``: the same journals and records as rows of a PostgreSQL database
  (:mod:`agentd.store.postgres`), through which several hosts can share their conversations.

The daemon, the conversation service and the server see only the Protocols below; what a
backend can do is said by its :class:`StorageCapabilities` (named after the agent-server
seed's ``StorageCapabilities``), never by its type.

Rules every implementation keeps (the journal's, from DESIGN.md):

* seq is 1..n per conversation with no gap and no duplicate; only the conversation's lease
  holder appends, and :meth:`Journal.append` assigns the seq, synchronously, on the trio thread;
* a record appended is made durable by the store's group commit (:meth:`ConversationStore.run`),
  or at once by ``await journal.sync()``. Where an appended record does not survive a crash of
  this process until then (``capabilities.crash_safe_append`` False: PostgreSQL, whose rows wait
  in this process's memory), the service syncs before it publishes, so no subscriber ever sees a
  record that a crash could take back;
* reads are ``async``: a database read must not block the trio loop. The file store answers
  them inline (no thread hop: it is every subscriber's path), so awaiting one is not even a
  schedule point there; callers must not rely on either.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import trio

if TYPE_CHECKING:
    from ..config import Config, Paths
    from ..leases import Lease, LeaseOutcome

__all__ = ["ConversationStore", "Journal", "Leases", "StorageCapabilities", "Store", "open_store", "read_published",
           "scan"]


class StorageCapabilities(msgspec.Struct, frozen=True, kw_only=True):
    """What a store really does; the daemon decides by these, never by the backend's type."""

    #: "file" | "postgres"
    backend: str
    #: per-conversation journals with seq (``subscribe`` from a seq works)
    events: bool = True
    #: conversation leases (one owner per open conversation)
    leases: bool = True
    #: several hosts may share this store (each reads every conversation; the lease holder writes)
    shared: bool = False
    #: an appended record survives a crash of this process before its sync (file: the kernel has it)
    crash_safe_append: bool = True
    #: other processes are woken when records commit (PostgreSQL LISTEN/NOTIFY)
    notify: bool = False
    #: ``write_record`` blocks on the disk (the file store: two fsyncs on the calling thread), so a
    #: save the journal can rebuild (a turn's end) is written behind, off the event loop
    blocking_records: bool = True


class Journal(Protocol):
    """One conversation's append-only journal, as the service and the server use it.

    ``last_seq``: the seq of the last appended record (0: none). ``size``: a position past the
    last appended record, growing with every append, comparable with
    :meth:`ConversationStore.journal_size` (bytes for files, the seq for PostgreSQL); a record
    checkpoint keeps it to know whether the journal grew past it.
    """

    last_seq: int

    @property
    def size(self) -> int: ...

    def append(self, type: str, data: bytes, *, run: str = "") -> tuple[int, bytes]:
        """Append one record (``data``: its JSON payload, no raw newline) and return ``(seq, line)``,
        the line being the encoded ``wire.Record``. Synchronous, not a checkpoint. Raises ValueError
        for a raw newline, OSError when the journal cannot take it (then ``last_seq`` is unchanged),
        ``trio.ClosedResourceError`` when closed."""
        ...

    async def sync(self) -> None:
        """Return once every record appended before the call is durable (fsync policy permitting).
        Raises OSError when that failed (the journal then refuses appends)."""
        ...

    async def read_after(self, after: int, limit: int | None = None, max_bytes: int | None = None) -> list[bytes]:
        """The lines of the records with ``seq > after``, in seq order, at most ``limit`` and at
        most ``max_bytes`` of lines (the first one always); never a scan from the start, and never
        more than that bound in memory. Raises JournalCorrupt for a line that is not the expected record."""
        ...


class ConversationStore(Protocol):
    """Every conversation's journal and record (the record: ``wire.ConversationRecord`` JSON bytes,
    already masked). Used from the trio thread only.

    ``root`` is the host-local directory for what stays on this host whatever the backend
    (whole tool outputs, attachments: ``root/<id>/...``). ``records_from_index`` is True after
    :meth:`read_records` when every record is known to be up to date with its journal (a clean
    stop), so recovery need not read any journal.
    """

    capabilities: StorageCapabilities
    root: pathlib.Path
    records_from_index: bool
    #: conversations whose record agentd would not read (a symlink or a FIFO at its path), by id,
    #: with the error a request naming one gets (``refused``: it names the path and what is there)
    refused: dict[str, Exception]

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Group commit until cancelled, then a final shielded commit. Never raises but Cancelled:
        a failed commit is logged and the journals concerned refuse further appends."""
        ...

    async def open(self, conversation_id: str) -> Journal:
        """The conversation's journal (cached), created empty on first use. Raises Invalid for an
        id that cannot be one, JournalCorrupt, OSError."""
        ...

    async def ids(self) -> list[str]:
        """The ids of the conversations that have a record, sorted."""
        ...

    async def read_records(self) -> dict[str, bytes]:
        """Every record by id (once, at start-up)."""
        ...

    async def read_record(self, conversation_id: str) -> bytes | None:
        """One record, or None when there is none."""
        ...

    def write_record(self, conversation_id: str, data: bytes) -> None:
        """Replace the conversation's record. Synchronous: the file store writes it atomically at once;
        PostgreSQL buffers it into the next group commit (with every journal row appended before it).
        Raises Invalid, OSError."""
        ...

    async def write_record_async(self, conversation_id: str, data: bytes) -> None:
        """``write_record`` without blocking the event loop on it: the file store writes in a
        worker thread, and a ``write_record`` or ``remove`` of the same record made meanwhile wins
        (this one is then skipped); PostgreSQL buffers it as ``write_record`` does. Raises Invalid,
        OSError."""
        ...

    def drop_index(self) -> None:
        """Before a journal holds what no record says (a turn's start): forget any "records are up
        to date" mark (the file store's records index). A no-op where there is none."""
        ...

    async def journal_size(self, conversation_id: str) -> int:
        """The journal's durable ``size`` (see :class:`Journal`), 0 when there is none."""
        ...

    async def remove(self, conversation_id: str) -> None:
        """Delete the conversation's journal and record; no error when absent."""
        ...

    async def aclose(self) -> None:
        """Commit what is pending, close every journal; the store may be used again afterwards."""
        ...


class Leases(Protocol):
    """The conversation leases as the service uses them (keys are conversation ids); async because a
    shared store's lease is a database round trip. The file store answers inline (``FileLeases``).
    """

    async def acquire(self, key: str) -> "LeaseOutcome":
        """Lease ``key`` to this daemon instance; raises :class:`~agentd.leases.LeaseHeld` when a live
        other owner holds it, OSError (file) or StoreUnavailable (database) when it cannot be known."""
        ...

    async def release(self, key: str) -> None:
        """Give up our lease; idempotent, never touches another owner's lease."""
        ...

    async def get(self, key: str) -> "Lease | None":
        """The lease on ``key`` whoever holds it, expired or not."""
        ...

    def held(self) -> list[str]:
        """Keys held by this instance, sorted (in memory)."""
        ...

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Renew every held lease until cancelled."""
        ...


class Store:
    """What :func:`open_store` gives: the conversation store and the lease store of one backend.

    ``run`` runs both background loops (group commit, lease renewal) until cancelled;
    ``aclose`` commits what is pending and closes connections.
    """

    def __init__(self, conversations: ConversationStore, leases: Leases, *, closers: tuple[Any, ...] = (),
                 peers: Any = None) -> None:
        self.conversations = conversations
        self.leases = leases
        self.capabilities = conversations.capabilities
        #: on a shared store, what this host does with the others (agentd.hosts.Peers); None on files
        self.peers = peers
        self._closers = closers

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.conversations.run)
            await nursery.start(self.leases.run)
            task_status.started()

    async def aclose(self) -> None:
        try:
            await self.conversations.aclose()
        finally:
            for close in self._closers:
                await close()


async def open_store(config: "Config", paths: "Paths", owner: str) -> Store:
    """The store ``[store] backend`` names, opened: for ``postgres`` connected and migrated.

    ``owner`` is this daemon instance (its leases' owner). Raises
    :class:`agentd.store.postgres.StoreUnavailable` when the database cannot be reached or used
    (its ``exit_code`` says whether a restart can help).
    """
    from ..journal import FsyncPolicy

    conversations_dir = paths.state_dir / "conversations"
    fsync = FsyncPolicy(config.journal.fsync)
    if config.store.backend == "postgres":
        from .postgres import open_shared

        return await open_shared(config, paths, owner, fsync=fsync)
    from ..leases import FileLeaseStore
    from .file import FileLeases, FileStore

    leases = FileLeaseStore(conversations_dir, owner=owner, ttl_s=config.leases.ttl_s, exclusive=True)
    return Store(FileStore(conversations_dir, fsync=fsync, batch_ms=config.journal.batch_ms), FileLeases(leases))


#: a :func:`scan` holds at most this many bytes of lines at a time (and always one line)
SCAN_BYTES = 4 << 20


async def scan(journal: Journal, upto: int | None = None, *, after: int = 0) -> AsyncIterator[list[bytes]]:
    """The journal's lines with ``after`` < seq <= ``upto`` (None: to its end), oldest first, in
    chunks of at most :data:`SCAN_BYTES`, a schedule point between two: a fold over a whole
    journal (a step's runtime diff, a task's replay) holds one chunk at a time and lets the
    daemon serve everyone else meanwhile. Raises what ``read_after`` raises."""
    while upto is None or after < upto:
        lines = await journal.read_after(after, limit=None if upto is None else upto - after, max_bytes=SCAN_BYTES)
        if not lines:
            return
        yield lines
        after += len(lines)
        await trio.lowlevel.checkpoint()


async def read_published(journal: Journal, target: int, *, chunk: int = 512) -> list[bytes]:
    """The journal's lines with seq 1..``target`` (what was published so far), read ``chunk`` at a time."""
    lines: list[bytes] = []
    while len(lines) < target:
        got = await journal.read_after(len(lines), limit=min(chunk, target - len(lines)))
        if not got:
            break
        lines += got
        await trio.lowlevel.checkpoint()
    return lines
