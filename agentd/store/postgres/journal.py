"""Journals and conversation records as PostgreSQL rows: the ``postgres`` conversation store.

Tables (migration 0002): ``journal (conversation_id, seq, ts, type, run, data)`` with primary key
``(conversation_id, seq)``, and ``conversations (id, record)``.

How it keeps the journal's rules (agentd.store):

* seq: :meth:`PgJournal.append` assigns ``last_seq + 1`` on the trio thread, as the file journal
  does; the row waits in this process's memory for the group commit. The primary key refuses a
  seq another writer already took, so two hosts can never both write seq n of one conversation
  (only the lease holder appends; this is the backstop).
* Group commit: :meth:`PgConversationStore.run` writes every pending row and record, of every
  conversation, in **one transaction** (rows by ``COPY``), with one ``NOTIFY agentd_journal``
  payload ``<conversation>:<last seq>`` per conversation, delivered by PostgreSQL only when that
  transaction commits. A commit starts as soon as someone awaits :meth:`PgJournal.sync` and none is
  in flight; rows appended meanwhile go in the next one. Record writes alone wait ``batch_ms``.
* Published only once committed: ``capabilities.crash_safe_append`` is False, so the service
  awaits ``sync()`` before it publishes any durable record; no subscriber on any host sees a record
  a crash of this process could take back.
* Durability of a commit is PostgreSQL's ``synchronous_commit``: the server's setting (normally
  ``on``: the WAL is flushed before COMMIT returns) for journal fsync ``always`` and ``batch``;
  ``SET LOCAL synchronous_commit = off`` for ``never`` (a crash of the database server may lose the
  last few hundred ms of commits; a crash of agentd loses nothing committed).
* A failed commit (the database unreachable, a refused row) marks the journals in it broken: they
  refuse appends with the reason while reads go on. The rows already appended are retried with
  backoff; once they are committed the journal takes records again (``on_recovered``: a failed
  commit was rolled back, so nothing is lost, unlike a failed fsync). Rows the database refused
  outright (a seq another writer took) are dropped and logged, and that journal takes no more
  records until agentd restarts.
* Reads after a seq use the primary key (an index range scan from ``seq > after``); the last
  :data:`TAIL` records of a journal this host writes are answered from memory, so a subscriber
  catching up on recent records costs no round trip.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable
from typing import Any

import msgspec
import structlog
import trio

from ... import _fsutil
from ...contract import Invalid
from ...journal import FsyncPolicy, JournalCorrupt, _format_ms
from .. import StorageCapabilities

__all__ = ["CAPABILITIES", "CHANNEL", "RECORDS_CHANNEL", "PgConversationStore", "PgJournal"]

CAPABILITIES = StorageCapabilities(backend="postgres", shared=True, crash_safe_append=False, notify=True,
                                   blocking_records=False)
#: the NOTIFY channel of committed journal rows; payload ``<conversation id>:<last seq>``
CHANNEL = "agentd_journal"
#: the NOTIFY channel of conversation records written or deleted; payload ``<conversation id>``
RECORDS_CHANNEL = "agentd_record"
#: records of a written journal kept in memory for reads (committed ones; pending ones are all kept)
TAIL = 1024
#: rows per read round trip when no limit is given
READ_CHUNK = 2048
#: retry delays after a failed commit, seconds
BACKOFF_S = (0.1, 30.0)

_encode = msgspec.json.Encoder().encode
_Row = tuple[int, int, str, str, bytes]  # (seq, ts in unix ms, type, run, data)


def _log() -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("agentd.store")


def line_of(seq: int, ms: int, type_: str, run: str, data: bytes) -> bytes:
    """The encoded wire.Record, byte for byte what the file journal writes for it (without newline)."""
    tail = b',"run":%s}' % _encode(run) if run else b"}"
    return b'{"type":%s,"ts":"%s","data":%s,"seq":%d%s' % (_encode(type_), _format_ms(ms).encode(), data, seq, tail)


class PgJournal:
    """One conversation's journal in the ``journal`` table; see the module docstring.

    ``last_seq``: the last appended seq (committed or not); ``durable_seq``: the last committed.
    """

    __slots__ = ("conversation_id", "last_seq", "durable_seq", "_store", "_pending", "_lines", "_first",
                 "_broken", "_retrying", "_closed")

    def __init__(self, store: PgConversationStore, conversation_id: str, last_seq: int) -> None:
        self.conversation_id = conversation_id
        self.last_seq = self.durable_seq = last_seq
        self._store = store
        #: rows appended, not committed yet, in seq order
        self._pending: list[_Row] = []
        #: lines of seq _first .. last_seq (the committed tail and every pending row)
        self._lines: list[bytes] = []
        self._first = last_seq + 1
        #: why appends are refused ("" = they are not)
        self._broken = ""
        #: its rows failed to commit (the database was unreachable) and are being retried: once they
        #: are committed it takes records again
        self._retrying = False
        self._closed = False

    @property
    def size(self) -> int:
        return self.last_seq

    def append(self, type: str, data: bytes, *, run: str = "") -> tuple[int, bytes]:
        """See :meth:`agentd.store.Journal.append`; the row is committed by the store's group commit."""
        if self._closed:
            raise trio.ClosedResourceError(f"journal of {self.conversation_id} is closed")
        if self._broken:
            raise OSError(5, f"journal of {self.conversation_id} {self._broken}")
        if 10 in data:
            raise ValueError("journal payload contains a raw newline")
        ms = time.time_ns() // 1_000_000
        seq = self.last_seq + 1
        line = line_of(seq, ms, type, run, data)
        self._pending.append((seq, ms, type, run, data))
        self._lines.append(line)
        self.last_seq = seq
        if len(self._pending) == 1:
            self._store._mark_dirty(self)
        return seq, line

    async def sync(self) -> None:
        """Return once every row appended before the call is committed; raises OSError when the commit failed."""
        if self._closed:
            raise trio.ClosedResourceError(f"journal of {self.conversation_id} is closed")
        await self._store._commit_through(self, self.last_seq)

    async def read_after(self, after: int, limit: int | None = None, max_bytes: int | None = None) -> list[bytes]:
        """See :meth:`agentd.store.Journal.read_after`: from memory where it holds them, else the database."""
        if self._closed:
            raise trio.ClosedResourceError(f"journal of {self.conversation_id} is closed")
        after = max(after, 0)
        end = self.last_seq if limit is None else min(self.last_seq, after + max(limit, 0))
        out: list[bytes] = []
        room = max_bytes  # what max_bytes leaves (None: no bound)
        nxt = after + 1
        while nxt <= end:
            if nxt >= self._first:
                for line in self._lines[nxt - self._first:end - self._first + 1]:
                    if room is not None:
                        if len(line) > room and out:
                            break
                        room = max(room - len(line), 0)
                    out.append(line)
                break
            # Below the tail every row is committed; the tail only moves up meanwhile, so loop.
            hi = min(end, self._first - 1, nxt + READ_CHUNK - 1)
            rows = await self._store._read_rows(self.conversation_id, nxt - 1, hi, room, first=not out)
            for seq, line in rows:
                if seq != nxt:
                    raise JournalCorrupt(self._store.where(self.conversation_id), nxt,
                                         f"seq {seq} where {nxt} was expected")
                out.append(line)
                nxt += 1
                if room is not None:
                    room = max(room - len(line), 0)
            if nxt <= hi and room is not None and out:
                break  # the next row is over max_bytes
            if not rows:
                raise JournalCorrupt(self._store.where(self.conversation_id), nxt, f"no record {nxt}")
        return out

    def adopt(self, rows: list[tuple[int, bytes]]) -> None:
        """Take ``rows`` (seq, line), committed by the host that writes this conversation, as the
        journal's next records: ``last_seq`` moves to the last of them. For a journal this host does
        not write (no pending row); raises ValueError for a gap or when rows are pending."""
        if not rows:
            return
        if self._pending:
            raise ValueError(f"journal of {self.conversation_id} has rows of its own pending")
        if rows[0][0] != self.last_seq + 1 or rows[-1][0] != self.last_seq + len(rows):
            raise ValueError(f"journal of {self.conversation_id}: rows {rows[0][0]}..{rows[-1][0]} "
                             f"do not follow seq {self.last_seq}")
        self.last_seq = self.durable_seq = rows[-1][0]
        self._lines += [line for _, line in rows]
        excess = len(self._lines) - TAIL
        if excess > 0:
            del self._lines[:excess]
        self._first = self.last_seq + 1 - len(self._lines)

    # ------------------------------------------------------------------ the store's side

    def _committed(self, upto: int) -> None:
        n = upto - self.durable_seq
        if n > 0:
            del self._pending[:n]
            self.durable_seq = upto
        # Trim the tail, never past what is committed.
        excess = len(self._lines) - TAIL - len(self._pending)
        if excess > 0:
            del self._lines[:excess]
            self._first += excess

    def _fail(self, why: str) -> None:
        self._broken = why

    def _drop_pending(self) -> None:
        """The database refused these rows for good: forget them (appends are refused from now on)."""
        self._lines = self._lines[: len(self._lines) - len(self._pending)]
        self.last_seq = self.durable_seq
        self._pending.clear()

    def __repr__(self) -> str:
        return f"<PgJournal {self.conversation_id} last_seq={self.last_seq} durable={self.durable_seq}>"


class PgConversationStore:
    """Every conversation's journal and record in PostgreSQL, through ``pool`` (agentd.store.postgres.Pool).

    ``root`` is the host-local directory (tool outputs, attachments). Use from the trio thread only.
    """

    capabilities = CAPABILITIES
    records_from_index = False

    def __init__(self, pool: Any, root: pathlib.Path, *, fsync: FsyncPolicy = FsyncPolicy.BATCH,
                 batch_ms: float = 5.0) -> None:
        self.pool = pool
        self.root = pathlib.Path(root)
        self.fsync = FsyncPolicy(fsync)
        self.batch_ms = batch_ms
        self._journals: dict[str, PgJournal] = {}
        self.refused: dict[str, Exception] = {}  # rows are never symlinks: stays empty
        #: journals with pending rows, in the order they got them (a dict: an ordered set)
        self._dirty: dict[PgJournal, None] = {}
        #: records written, not committed yet: id -> bytes (the last write wins)
        self._records: dict[str, bytes] = {}
        #: records of the commit in flight: still this host's to read until it ends (read your writes)
        self._committing: dict[str, bytes] = {}
        #: journal heads read at start-up (read_records), for journal_size
        self._heads: dict[str, int] = {}
        self._dirty_since = 0.0
        self._wake = trio.Event()
        #: set when the commit in flight (or the next one) ends
        self._done = trio.Event()
        self._waiting = 0
        self._error: BaseException | None = None
        self._lock = trio.Lock()  # one commit (or removal) at a time
        self._failures = 0
        #: how many run() tasks commit (0: sync() commits itself)
        self._running = 0
        #: called with a conversation id when its journal takes records again after failed commits
        self.on_recovered: Callable[[str], None] | None = None
        #: on hosts sharing the database (agentd.hosts), this host's lease owner: journal rows commit
        #: only for conversations it holds the lease of (checked in the commit itself)
        self.fence = ""

    def where(self, conversation_id: str) -> pathlib.Path:
        """How errors name a journal: ``postgres:<target>/journal/<id>``."""
        return pathlib.Path(f"postgres:{getattr(self.pool, 'target', '')}/journal/{conversation_id}")

    # ------------------------------------------------------------------ group commit

    def _mark_dirty(self, journal: PgJournal) -> None:
        if not self._dirty and not self._records:
            self._dirty_since = time.monotonic()
        self._dirty[journal] = None
        self._wake.set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Group commit until cancelled, then a final shielded one; see the module docstring."""
        self._running += 1
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                if not self._waiting:
                    delay = self.batch_ms / 1000 - (time.monotonic() - self._dirty_since)
                    if delay > 0:
                        with trio.move_on_after(delay):
                            while not self._waiting:  # a sync() cuts the wait short
                                self._wake = trio.Event()
                                await self._wake.wait()
                if not await self._commit() and self._failures:
                    await trio.sleep(min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** min(self._failures, 10)))
        finally:
            self._running -= 1
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + 10
                await self._commit()

    async def _commit_through(self, journal: PgJournal, seq: int) -> None:
        while journal.durable_seq < seq:
            if journal._broken:
                raise OSError(5, f"journal of {journal.conversation_id} {journal._broken}")
            if journal._closed:
                raise trio.ClosedResourceError(f"journal of {journal.conversation_id} is closed")
            self._dirty[journal] = None  # rows appended while a commit was in flight are in the next
            if not self._running:  # no group-commit task (a tool, a test): commit here
                with trio.CancelScope(shield=True):
                    await self._commit()
                continue
            done = self._done
            self._waiting += 1
            self._wake.set()
            try:
                with trio.CancelScope(shield=True):  # the row is on its way: wait for the outcome
                    await done.wait()
            finally:
                self._waiting -= 1
        await trio.lowlevel.checkpoint_if_cancelled()

    async def _commit(self) -> bool:
        """One transaction of everything pending; True when it committed (or nothing was pending)."""
        async with self._lock:
            self._wake = trio.Event()
            done, self._done = self._done, trio.Event()
            try:
                return await self._commit_locked()
            finally:
                done.set()

    async def _commit_locked(self) -> bool:
        journals = [j for j in self._dirty if j._pending and not j._closed]
        self._dirty = {}
        records = self._records
        self._records = {}
        if not journals and not records:
            return True
        batch = [(j, list(j._pending)) for j in journals]
        self._committing = records
        try:
            await self.pool.run(_write, [(j.conversation_id, rows) for j, rows in batch], records,
                                self.fsync is FsyncPolicy.NEVER, self.fence)
        except Exception as exc:
            return await self._commit_failed(batch, records, exc)
        finally:
            self._committing = {}
        for j, rows in batch:
            self._done_with(j, rows)
        if self._failures:
            _log().info("store.commit_recovered", journals=len(batch))
            self._failures = 0
        return True

    async def _commit_failed(self, batch: list[tuple[PgJournal, list[_Row]]], records: dict[str, bytes],
                             exc: Exception) -> bool:
        import psycopg

        self._failures += 1
        for cid, data in records.items():
            self._records.setdefault(cid, data)  # retried, unless written again meanwhile
        refused = isinstance(exc, psycopg.IntegrityError)
        if refused and len(batch) > 1:
            # Find which journal the database refused: each alone, once.
            ok = True
            for j, rows in batch:
                try:
                    await self.pool.run(_write, [(j.conversation_id, rows)], {}, self.fsync is FsyncPolicy.NEVER,
                                        self.fence)
                except Exception as one:
                    ok = await self._commit_failed([(j, rows)], {}, one) and ok
                else:
                    self._done_with(j, rows)
            return ok
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        for j, rows in batch:
            if refused:
                _log().error("store.commit_refused", conversation=j.conversation_id, seqs=[rows[0][0], rows[-1][0]],
                             error=why)
                j._drop_pending()
                j._retrying = False
                j._fail(f"was refused by the database ({why}): another host may hold this conversation; "
                        "it takes no more records until agentd restarts")
            else:
                j._fail(f"could not be committed ({why}); it takes records again once its rows are committed")
                j._retrying = True
                self._dirty[j] = None  # its rows are retried
        if not refused:
            _log().error("store.commit_failed", journals=[j.conversation_id for j, _ in batch], records=len(records),
                         error=why)
            self._wake.set()
        return False

    def _done_with(self, j: PgJournal, rows: list[_Row]) -> None:
        j._committed(rows[-1][0])
        if j._pending:  # appended while this commit was in flight: the next one takes them
            self._mark_dirty(j)
        elif j._retrying and not j._closed:
            # A failed commit is rolled back, unlike a failed fsync: with its rows in the database at
            # last, the journal is whole again and takes records.
            j._retrying, j._broken = False, ""
            _log().info("store.journal_recovered", conversation=j.conversation_id, seq=j.durable_seq)
            if self.on_recovered is not None:
                self.on_recovered(j.conversation_id)

    # ------------------------------------------------------------------ conversations

    def _check(self, conversation_id: str) -> None:
        if not _fsutil.is_safe_name(conversation_id):
            raise Invalid(f"invalid conversation id {conversation_id!r}")

    async def open(self, conversation_id: str) -> PgJournal:
        j = self._journals.get(conversation_id)
        if j is not None:
            return j
        self._check(conversation_id)
        rows = await self.pool.run(_head, conversation_id)
        j = self._journals.get(conversation_id)  # opened by another task meanwhile
        if j is None:
            j = self._journals[conversation_id] = PgJournal(self, conversation_id, rows)
        return j

    def forget(self, conversation_id: str) -> None:
        """This host lost the conversation's lease (another host took it over): its rows not committed
        are dropped (the new holder's seqs may be in the database by now), and its journal starts
        again, unbroken, at the last seq this host committed, for :meth:`PgJournal.adopt` to bring
        up to the new holder's head."""
        j = self._journals.pop(conversation_id, None)
        if j is None:
            return
        self._dirty.pop(j, None)
        j._closed = True  # an append through it now raises; a commit in flight skips it after
        j._drop_pending()
        fresh = PgJournal(self, conversation_id, j.durable_seq)
        fresh._lines = j._lines[-TAIL:]
        fresh._first = fresh.last_seq + 1 - len(fresh._lines)
        self._journals[conversation_id] = fresh

    async def ids(self) -> list[str]:
        pending = {**self._committing, **self._records}  # committed meanwhile: not in what is read
        ids = set(await self.pool.run(_ids)) | set(pending) | set(self._committing) | set(self._records)
        return sorted(ids)

    async def read_records(self) -> dict[str, bytes]:
        pending = {**self._committing, **self._records}  # committed meanwhile: not in what is read
        rows = await self.pool.run(_records_and_heads)
        self._heads = {cid: head or 0 for cid, _, head in rows}
        out = {cid: bytes(data) for cid, data, _ in rows}
        out.update(pending)
        out.update(self._committing)
        out.update(self._records)
        return out

    async def read_record(self, conversation_id: str) -> bytes | None:
        # This host's own writes first, committed or not: the database has them only once committed.
        if conversation_id in self._records:
            return self._records[conversation_id]
        if conversation_id in self._committing:
            return self._committing[conversation_id]
        if not _fsutil.is_safe_name(conversation_id):
            return None
        data = await self.pool.run(_record, conversation_id)
        # Written meanwhile: the database's copy may predate it (or not be committed yet).
        return self._records.get(conversation_id) or self._committing.get(conversation_id) or data

    def write_record(self, conversation_id: str, data: bytes) -> None:
        self._check(conversation_id)
        if not self._dirty and not self._records:
            self._dirty_since = time.monotonic()
        self._records[conversation_id] = data
        self._wake.set()

    async def write_record_async(self, conversation_id: str, data: bytes) -> None:
        self.write_record(conversation_id, data)  # a buffer for the group commit: nothing blocks

    def drop_index(self) -> None:
        pass  # no records index: every start catches records up with their journals

    async def journal_size(self, conversation_id: str) -> int:
        j = self._journals.get(conversation_id)
        if j is not None:
            return j.durable_seq
        if conversation_id in self._heads:
            return self._heads[conversation_id]
        self._check(conversation_id)
        return await self.pool.run(_head, conversation_id)

    async def remove(self, conversation_id: str) -> None:
        self._check(conversation_id)
        j = self._journals.pop(conversation_id, None)
        if j is not None:
            j._closed = True
        self._records.pop(conversation_id, None)
        self._heads.pop(conversation_id, None)
        async with self._lock:  # not while a commit holding its rows is in flight
            await self.pool.run(_delete, conversation_id)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._commit()
        for j in self._journals.values():
            j._closed = True
        self._journals.clear()

    async def _read_rows(self, conversation_id: str, after: int, upto: int, max_bytes: int | None = None, *,
                         first: bool = True) -> list[tuple[int, bytes]]:
        """Rows ``after < seq <= upto``; with ``max_bytes``, the first of them whose lines fit in it
        (and with ``first`` the first row whatever its size). Rows left out are never fetched."""
        return await self.pool.run(_rows, conversation_id, after, upto, max_bytes, first)

    async def committed_after(self, conversation_id: str, after: int, limit: int = READ_CHUNK) -> list[tuple[int, bytes]]:
        """Up to ``limit`` committed rows ``(seq, line)`` of the conversation with ``seq > after``, from the
        database (whoever wrote them), in seq order."""
        self._check(conversation_id)
        return await self.pool.run(_rows, conversation_id, after, after + limit)


# ---------------------------------------------------------------------- SQL (worker threads)


def _write(conn: Any, journals: list[tuple[str, list[_Row]]], records: dict[str, bytes], lazy: bool,
           fence: str = "") -> None:
    import psycopg

    from . import notify

    if lazy:
        conn.execute("SET LOCAL synchronous_commit = off")
    if journals and fence:
        # Fencing: a host that stalled past its TTL must not commit rows after another host took the
        # conversation over and read its head. The share lock holds a takeover (SELECT ... FOR UPDATE)
        # until this commits, so the new holder reads these rows; a lease taken already refuses them.
        cids = sorted({cid for cid, _ in journals})
        held = {r[0] for r in conn.execute("SELECT key FROM leases WHERE owner = %s AND key = ANY(%s) "
                                            "ORDER BY key FOR SHARE", (fence, cids))}
        lost = [cid for cid in cids if cid not in held]
        if lost:
            raise psycopg.IntegrityError(f"this host no longer holds the lease of {', '.join(lost)}")
    if journals:
        with conn.cursor() as cur:
            with cur.copy("COPY journal (conversation_id, seq, ts, type, run, data) FROM STDIN") as copy:
                for cid, rows in journals:
                    for seq, ms, type_, run, data in rows:
                        copy.write_row((cid, seq, _timestamp(ms), type_, run, data))
    if records:
        conn.cursor().executemany(
            "INSERT INTO conversations (id, record, updated_at) VALUES (%s, %s, now()) "
            "ON CONFLICT (id) DO UPDATE SET record = excluded.record, updated_at = excluded.updated_at",
            list(records.items()))
    for cid, rows in journals:
        notify(conn, CHANNEL, f"{cid}:{rows[-1][0]}")
    for cid in records:
        notify(conn, RECORDS_CHANNEL, cid)


def _timestamp(ms: int) -> str:
    return _format_ms(ms)


def _head(conn: Any, cid: str) -> int:
    row = conn.execute("SELECT max(seq) FROM journal WHERE conversation_id = %s", (cid,)).fetchone()
    return int(row[0] or 0)


#: The length of a row's line (line_of) in SQL, from octet_length: it reads a TOASTed value's
#: header, not the value. Exact while type and run need no JSON escapes (agentd's own names and ids).
_LINE_BYTES = ("octet_length(data) + octet_length(type) + length(seq::text) + 58"
               " + CASE WHEN run = '' THEN 0 ELSE octet_length(run) + 9 END")


def _rows(conn: Any, cid: str, after: int, upto: int, max_bytes: int | None = None,
          first: bool = True) -> list[tuple[int, bytes]]:
    if max_bytes is None:
        cur = conn.execute(
            "SELECT seq, (extract(epoch FROM ts) * 1000)::bigint, type, run, data FROM journal "
            "WHERE conversation_id = %s AND seq > %s AND seq <= %s ORDER BY seq", (cid, after, upto))
    else:
        cur = conn.execute(
            "SELECT j.seq, (extract(epoch FROM j.ts) * 1000)::bigint, j.type, j.run, j.data FROM journal j JOIN ("
            f"  SELECT seq, sum({_LINE_BYTES}) OVER (ORDER BY seq) AS upto_bytes FROM journal"
            "  WHERE conversation_id = %s AND seq > %s AND seq <= %s) s ON s.seq = j.seq "
            "WHERE j.conversation_id = %s AND (s.upto_bytes <= %s OR (%s AND s.seq = %s)) ORDER BY j.seq",
            (cid, after, upto, cid, max_bytes, first, after + 1))
    return [(seq, line_of(seq, ms, type_, run, bytes(data))) for seq, ms, type_, run, data in cur]


def _ids(conn: Any) -> list[str]:
    return [r[0] for r in conn.execute("SELECT id FROM conversations ORDER BY id")]


def _records_and_heads(conn: Any) -> list[tuple[str, bytes, int | None]]:
    return conn.execute(
        "SELECT c.id, c.record, (SELECT max(seq) FROM journal j WHERE j.conversation_id = c.id) "
        "FROM conversations c ORDER BY c.id").fetchall()


def _record(conn: Any, cid: str) -> bytes | None:
    row = conn.execute("SELECT record FROM conversations WHERE id = %s", (cid,)).fetchone()
    return bytes(row[0]) if row else None


def _delete(conn: Any, cid: str) -> None:
    from . import notify

    conn.execute("DELETE FROM journal WHERE conversation_id = %s", (cid,))
    conn.execute("DELETE FROM conversations WHERE id = %s", (cid,))
    notify(conn, RECORDS_CHANNEL, cid)


async def open_postgres(config: Any, root: pathlib.Path, *, fsync: FsyncPolicy) -> tuple[PgConversationStore, Any, str]:
    """The conversation store on ``[store] dsn``/``dsn_file`` (or libpq's environment), connected and
    migrated, the coroutine function that closes its pool, and the DSN (for a LISTEN connection).

    Raises :class:`~agentd.store.postgres.StoreUnavailable` naming the target and the cause (its
    ``exit_code`` 78 when a restart cannot help), SchemaMismatch for a schema this agentd does not know.
    """
    from . import Pool, describe, migrate, resolve

    dsn = resolve(config.store.dsn, config.store.dsn_file)
    pool = Pool(dsn)
    await pool.open()
    try:
        await migrate(pool)
    except BaseException:
        await pool.aclose()
        raise
    _log().info("store.opened", backend="postgres", target=describe(dsn))
    return PgConversationStore(pool, root, fsync=fsync, batch_ms=config.journal.batch_ms), pool.aclose, dsn
