"""The durable event journal: one append-only ``events.jsonl`` per conversation.

Layout under the store's root (``<state_dir>/conversations``)::

    <id>/events.jsonl   one wire.Record per line; seq 1, 2, 3 ... in file order, no gap
    <id>/record.json    the conversation record, replaced atomically

Ownership: the daemon's trio thread owns every :class:`Journal`; ``append``
and ``read_after`` are synchronous and must be called from that thread only
(the group-commit thread shares a few attributes with it, see
``_GroupCommit``). A record is durable once the fsync policy says so:
``always`` after ``await journal.sync()``, ``batch`` within ``batch_ms``
while :meth:`JournalStore.run` runs, ``never`` when the kernel gets to it.
Nothing here rewrites a record; on open, only a torn last line (a crash
mid-write) is cut off.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import errno
import math
import os
import pathlib
import queue
import secrets
import shutil
import stat
import threading
import time
from typing import Callable

import msgspec
import structlog
import trio

from . import _fsutil
from ._after_step import AfterStep
from .contract import AgentdError, Invalid, Refused

__all__ = ["FsyncPolicy", "Journal", "JournalCorrupt", "JournalRefused", "JournalStore"]

EVENTS_FILE = "events.jsonl"
RECORD_FILE = "record.json"

#: Forward reads start with this many bytes and double up to _CHUNK_MAX.
_CHUNK = 16 * 1024
_CHUNK_MAX = 1 << 20
#: Bisection stops and scans forward once the byte range is this small.
_SCAN = 64 * 1024
#: Read size when looking for a line boundary.
_PROBE = 4096
#: Every 100th appended seq is indexed (when its last two digits are formatted anew); at most _INDEX_MAX entries are kept.
_INDEX_MAX = 4096
#: Where recent reads stopped (next seq -> offset), so a subscriber paging forward never bisects.
_CURSORS_MAX = 256

# Leading dot: never a conversation id (see _fsutil.is_safe_name), so ids() skips it.
_TOMBSTONE = ".rm-"
#: Every record.json in one file, written on a clean close, removed before any record changes.
INDEX_FILE = ".records-index.json"
_INDEX_VERSION = 1


class FsyncPolicy(str, enum.Enum):
    """When appended records reach the disk."""

    #: the caller awaits ``Journal.sync()`` after each append, before publishing
    ALWAYS = "always"
    #: group commit: the store's ``run()`` fsyncs within ``batch_ms``
    BATCH = "batch"
    #: the kernel decides; a power loss may lose recent records (a process crash does not)
    NEVER = "never"



def _regular_only(fd: int, path: pathlib.Path) -> None:
    """Refuse anything but a regular file at a journal's path (a FIFO would wedge appends and reads);
    raises :class:`JournalRefused` naming what is there. Clears the O_NONBLOCK the open used."""
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise JournalRefused(path, f"{kind}, not a regular file")
    os.set_blocking(fd, True)


class JournalRefused(Refused):
    """What sits at a journal's (or a ``record.json``'s: ``what``) path is not a file agentd wrote: a
    symlink (never followed, whoever planted it: another user, the agent), a FIFO, a device.
    ``path`` says where, ``problem`` what."""

    def __init__(self, path: pathlib.Path, problem: str, what: str = "journal") -> None:
        super().__init__(
            f"the {what} {path} is {problem}; agentd will not use it",
            details={"path": str(path), "problem": problem},
        )
        self.path = path
        self.problem = problem


def _symlink_problem(path: pathlib.Path) -> str:
    try:
        return f"a symlink (to {os.readlink(path)}), which agentd does not follow"
    except OSError:
        return "a symlink, which agentd does not follow"


class JournalCorrupt(AgentdError):
    """A journal line is not a valid record; ``path`` and ``line`` (1-based) say where."""

    code = "internal"

    def __init__(self, path: pathlib.Path, line: int, reason: str) -> None:
        super().__init__(
            f"journal {path} is corrupt at line {line}: {reason}",
            details={"path": str(path), "line": line},
        )
        self.path = path
        self.line = line


class _Seq(msgspec.Struct):
    seq: int = 0


class _RecordsIndex(msgspec.Struct):
    version: int
    records: dict[str, msgspec.Raw]


_seq_decoder = msgspec.json.Decoder(_Seq)
_index_decoder = msgspec.json.Decoder(_RecordsIndex)
_encode = msgspec.json.Encoder().encode
_time = time.time
_join = b"".join
_write = os.write
#: a seq's last two digits: without a leading zero below 100, with one above
_DIGITS1 = [b"%d" % i for i in range(100)]
_DIGITS2 = [b"%02d" % i for i in range(100)]


def _log() -> structlog.typing.FilteringBoundLogger:
    # Looked up per use (rare paths only), so structlog.testing.capture_logs sees it.
    return structlog.get_logger("agentd.journal")


def _format_ms(ms: int) -> str:
    """Unix milliseconds -> ``2024-05-01T12:00:00.123Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def _fsync_journal(j: Journal, fd: int) -> None:
    """fsync ``fd`` (``j``'s, or a dup of it) holding ``j``'s fsync lock; from any thread.

    Never two fsyncs of one journal at once (the group commit's thread, a :meth:`Journal.sync`,
    a close), and none after one failed: Linux reports a writeback error to one fsync of the
    file only, so another one, alongside or later, could succeed over the pages the kernel
    dropped. A failure marks the journal (``_sync_failed``) before the lock is let go; the trio
    thread refuses its appends once told (_fsync_failed). Raises OSError.
    """
    with j._fsync_lock:
        if j._sync_failed:
            raise OSError(errno.EIO, f"journal {j.path}: an earlier fsync of it failed")
        try:
            os.fsync(fd)
        except OSError:
            j._sync_failed = True
            raise


def _fsync_fds(jobs: list[tuple[Journal, int]]) -> None:
    """fsync then close each journal's fd (dups owned by the caller); raises the first OSError after closing all."""
    error: OSError | None = None
    for j, fd in jobs:
        try:
            _fsync_journal(j, fd)
        except OSError as exc:
            error = error or exc
        finally:
            os.close(fd)
    if error is not None:
        raise error


class _FsyncTimer:
    """How long this process's recent fsyncs took: an exponentially weighted mean, in seconds.

    Decides where :meth:`Journal.sync` runs an fsync. With fsync ``always``
    every record waits for one, and handing it to a worker thread adds a
    thread round trip each time (160-240 us on a 2-core VM, as long as the
    fsync itself; see BENCHMARKS.md). So while fsyncs take under
    ``INLINE_MAX_S`` on average they run on the trio thread: the loop then
    stalls at most about a millisecond, half of the 2 ms p99 delivery
    latency agentd aims for. A slow fsync (a busy disk) stalls it once; the
    mean then moves fsyncs back to the thread, where they are still timed.
    """

    INLINE_MAX_S = 0.001
    _WEIGHT = 0.2

    def __init__(self) -> None:
        #: None until the first fsync (in the thread) has been measured
        self.mean_s: float | None = None

    def add(self, seconds: float) -> None:
        mean = self.mean_s
        self.mean_s = seconds if mean is None else mean + (seconds - mean) * self._WEIGHT

    @property
    def inline(self) -> bool:
        return self.mean_s is not None and self.mean_s < self.INLINE_MAX_S


_fsync_timer = _FsyncTimer()


def _timed_fsync_fds(jobs: list[tuple[Journal, int]]) -> None:
    t0 = time.perf_counter()
    try:
        _fsync_fds(jobs)
    finally:
        _fsync_timer.add((time.perf_counter() - t0) / max(len(jobs), 1))


def _fsync_failed(jobs: list[tuple[Journal, int]], exc: OSError) -> None:
    # After a failed fsync the kernel may have dropped the dirty pages: durability is unknown,
    # and a later fsync could report success over the hole. Those journals take no more appends.
    _log().error("journal.fsync_failed", paths=[str(j.path) for j, _ in jobs], error=str(exc))
    for j, _ in jobs:
        j._fail(exc)


#: the group-commit thread's last item: what was queued before it is synced, then the thread ends
_STOP = object()


class _GroupCommit:
    """fsync ``batch``'s one long-lived thread, fed by a queue (:meth:`JournalStore.run` starts it).

    The trio thread puts ``(deadline, journal, fd)`` when a journal gets its
    first unsynced append (``fd`` a dup of the journal's, owned from then on
    by this thread, so a journal closed meanwhile cannot have its fd number
    reused under the fsync); the thread waits until the first item's deadline
    (monotonic seconds: the append's time + ``batch_ms``), takes every item
    queued by then and fsyncs each journal once. A batch costs the trio thread
    one dup and one ``SimpleQueue.put``, not a task wake-up, a timer and a
    ``trio.to_thread`` job with its thread hand-off (per-turn CPU, issue 18).

    Journal state shared with the trio thread (under the GIL, plain attribute
    loads and stores): this thread clears ``_queued`` *before* it reads
    ``_end``, so an append it misses queues its journal again; it raises
    ``_synced`` to the ``_end`` it read. Anything else it has to say (an
    fsync failed, it stopped) goes to the trio thread by ``run_sync_soon``.
    """

    def __init__(self, queue_: queue.SimpleQueue[object], token: trio.lowlevel.TrioToken) -> None:
        self._queue = queue_
        self._token = token
        #: what ended the thread other than _STOP (a bug): run() raises it
        self.error: BaseException | None = None

    def _to_trio(self, fn: Callable[..., object], *args: object) -> None:
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            fn(*args)  # no trio thread left to race with

    def main(self, ended: Callable[[], None]) -> None:
        """The thread: syncs until it takes _STOP, then calls ``ended`` on the trio thread."""
        try:
            self._loop()
        except BaseException as exc:  # a bug: run() raises it rather than stop syncing quietly
            self.error = exc
        finally:
            self._to_trio(ended)

    def _loop(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is _STOP:
                return
            batch: list[tuple[float, Journal, int]] = [item]  # type: ignore[list-item]
            deadline = batch[0][0]
            stop = False
            while True:
                wait = deadline - time.monotonic()
                try:
                    item = get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop = True  # sync what came before it first
                    break
                batch.append(item)  # type: ignore[arg-type]
            self._sync(batch)
            if stop:
                return

    def _sync(self, batch: list[tuple[float, Journal, int]]) -> None:
        fds: dict[Journal, int] = {}
        for _, j, fd in batch:
            if j in fds or j._sync_failed:
                # queued twice (synced meanwhile, then dirty again): one fsync covers both; or failed before
                os.close(fd)
            else:
                fds[j] = fd
        if not fds:
            return
        for j in fds:
            j._queued = False  # before reading _end: an append after this queues the journal again
        ends = [(j, j._end) for j in fds]
        t0 = time.perf_counter()
        failed: list[tuple[Journal, int]] = []
        error: OSError | None = None
        for j, end in ends:
            try:
                _fsync_journal(j, fds[j])
            except OSError as exc:
                failed.append((j, end))
                error = error or exc
            else:
                if end > j._synced:
                    j._synced = end
            finally:
                os.close(fds[j])
        _fsync_timer.add((time.perf_counter() - t0) / len(ends))
        if error is not None:
            self._to_trio(_fsync_failed, failed, error)


def _fsync_here(j: Journal, dup_error: OSError) -> None:
    """fsync ``j`` on the trio thread: there is no fd to hand a worker thread (``dup_error``,
    EMFILE). Raises OSError when the fsync fails, after refusing the journal (_fsync_failed)."""
    _log().warning("journal.dup_failed", path=str(j.path), error=str(dup_error))
    end = j._end
    try:
        _fsync_journal(j, j._fd)
    except OSError as err:
        _fsync_failed([(j, end)], err)
        raise
    j._synced = max(j._synced, end)


async def _sync_journals(journals: list[Journal]) -> None:
    """fsync every journal with unsynced appends, all in one worker-thread call.

    Works on dup'd fds so a journal closed meanwhile cannot have its fd
    number reused under the fsync. Raises OSError when an fsync fails.
    """
    jobs: list[tuple[Journal, int]] = []
    fds: list[tuple[Journal, int]] = []
    try:
        for j in journals:
            if j._fd < 0 or j._policy is FsyncPolicy.NEVER or j._synced >= j._end or j._sync_failed:
                continue
            try:
                fds.append((j, os.dup(j._fd)))
            except OSError as exc:
                # Rather than fail a sync that can be done: a failed sync leaves what was written
                # not known to be durable, and the journal refusing records.
                _fsync_here(j, exc)
                continue
            jobs.append((j, j._end))
    except OSError:
        for _, fd in fds:
            os.close(fd)
        raise
    if not fds:
        await trio.lowlevel.checkpoint()
        return
    try:
        await trio.to_thread.run_sync(_timed_fsync_fds, fds)
    except OSError as exc:
        _fsync_failed(jobs, exc)
        raise
    for j, end in jobs:  # each fsync held the journal's fsync lock: none ran over a failed one
        if end > j._synced:
            j._synced = end


class Journal:
    """One conversation's append-only ``events.jsonl``.

    ``last_seq`` is the seq of the last appended record, 0 when empty.
    Usually obtained from :meth:`JournalStore.open`; constructing one directly
    opens (creating, mode 0600) ``path``, cuts a torn last line, and raises
    :class:`JournalCorrupt` when the last complete line is not a record.
    """

    # Slots: append is the daemon's hottest path, and slot access is the cheaper attribute lookup.
    __slots__ = (
        "path", "last_seq", "_policy", "_on_dirty", "_queued", "_readonly", "_fd", "_end", "_synced", "_broken",
        "_broken_reason", "_errno", "_idx_seq", "_idx_off", "_cursors", "_ts_lo", "_ts_hi", "_ts", "_ts_mid",
        "_heads", "_run", "_run_tail", "_seq_hi", "_seq_low", "_sync_failed", "_sync_done", "_fsync_lock",
    )

    path: pathlib.Path
    last_seq: int

    def __init__(
        self,
        path: pathlib.Path,
        *,
        fsync: FsyncPolicy = FsyncPolicy.BATCH,
        on_dirty: Callable[[Journal], None] | None = None,
    ) -> None:
        self.path = pathlib.Path(path)
        self._policy = FsyncPolicy(fsync)
        # Called on the first append after each group commit (BATCH only).
        self._on_dirty = on_dirty if self._policy is FsyncPolicy.BATCH else None
        # True while nothing need be told (no on_dirty, or it was told since the last group commit)
        self._queued = self._on_dirty is None
        # O_NONBLOCK: a FIFO put where the journal belongs is refused, not waited on (cleared below).
        flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        #: the file can only be read (a read-only file system): why
        self._readonly: OSError | None = None
        #: an fsync of it failed: nothing written since the last good one is known to be on disk
        self._sync_failed = False
        #: set when the fsync a worker thread runs for :meth:`sync` ends (None: none runs)
        self._sync_done: trio.Event | None = None
        #: held by whichever thread fsyncs it (_fsync_journal)
        self._fsync_lock = threading.Lock()
        try:
            self._fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, _fsutil.FILE_MODE)
            _fsutil.fsync_dir(self.path.parent)  # the new name must survive a crash too
        except FileExistsError:
            try:
                self._fd = os.open(self.path, flags)
            except OSError as exc:
                if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
                    raise JournalRefused(self.path, _symlink_problem(self.path)) from None
                if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                    raise
                # Read-only: the conversation stays readable; appends say why they cannot be made.
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
                self._readonly = exc
        try:
            _regular_only(self._fd, self.path)
            self._end, self.last_seq, last_off = self._recover()
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise
        #: bytes known to be on disk
        self._synced = self._end
        self._broken = False
        #: why appends are refused ("" = they are not): read-only, a torn tail left, a failed fsync
        self._broken_reason = ""
        self._errno = errno.EIO
        if self._readonly is not None:
            self._broken = True
            self._broken_reason = f"is read-only ({self._readonly.strerror}); it is served for reading only"
            self._errno = self._readonly.errno
        self._idx_seq: list[int] = []
        self._idx_off: list[int] = []
        if self.last_seq:
            self._idx_seq.append(self.last_seq)
            self._idx_off.append(last_off)
        self._cursors: dict[int, int] = {}
        # ts string cached for the current millisecond [lo, hi), in unix seconds
        self._ts_lo = self._ts_hi = 0.0
        self._ts = ""
        self._ts_mid = b""
        #: record type -> b'{"type":"<type>","ts":"<ts>","data":' for the current millisecond
        self._heads: dict[str, bytes] = {}
        # the last run appended, and the end of its lines (without the newline)
        self._run: str | None = None
        self._run_tail = b"}"
        self._seq_hi = b""
        self._seq_low: list[bytes] = []
        self._set_seq(self.last_seq + 1)

    # ------------------------------------------------------------------ open

    def _last_newline_before(self, pos: int) -> int:
        """Offset of the last ``\\n`` in ``[0, pos)``, or -1; reads backwards in chunks."""
        while pos > 0:
            lo = max(0, pos - _CHUNK)
            buf = os.pread(self._fd, pos - lo, lo)
            i = buf.rfind(b"\n")
            if i >= 0:
                return lo + i
            pos = lo
        return -1

    def _recover(self) -> tuple[int, int, int]:
        """Cut a torn tail; return (end offset, last seq, offset of the last line)."""
        size = os.fstat(self._fd).st_size
        if size and os.pread(self._fd, 1, size - 1) != b"\n":
            cut = self._last_newline_before(size) + 1
            if self._readonly is not None:
                # Cannot cut it: read up to it; a writable reopen cuts it.
                _log().warning("journal.torn_tail_ignored", path=str(self.path), bytes=size - cut)
            else:
                os.ftruncate(self._fd, cut)
                os.fsync(self._fd)  # else a crash could bring the torn bytes back under new appends
                _log().warning("journal.torn_tail_cut", path=str(self.path), bytes=size - cut)
            size = cut
        if not size:
            return 0, 0, 0
        start = self._last_newline_before(size - 1) + 1
        line = os.pread(self._fd, size - 1 - start, start)
        try:
            seq = _seq_decoder.decode(line).seq
        except msgspec.DecodeError as exc:
            raise JournalCorrupt(self.path, self._count_lines(size), f"last line is not a record ({exc})") from None
        if seq < 1:
            raise JournalCorrupt(self.path, self._count_lines(size), "last line has no seq")
        return size, seq, start

    def _count_lines(self, size: int) -> int:
        # Error path only: the one place the whole file is read.
        n, pos = 0, 0
        while pos < size:
            buf = os.pread(self._fd, min(_CHUNK_MAX, size - pos), pos)
            if not buf:
                break
            n += buf.count(b"\n")
            pos += len(buf)
        return n

    # ------------------------------------------------------------------ append

    def append(self, type: str, data: bytes, *, run: str = "") -> tuple[int, bytes]:
        """Append one record; returns ``(seq, line)``, the line without its newline.

        Synchronous and not a checkpoint. ``data`` is the JSON-encoded payload
        (not validated; it must not contain a raw newline, else ValueError).
        The record gets ``seq = last_seq + 1`` and ``ts`` = now (UTC, ms).
        Durability follows the policy: with ``always`` await :meth:`sync`
        before publishing the line. On OSError (disk full, read-only) the
        file is cut back to its previous end, ``last_seq`` is unchanged and the
        error propagates. Raises ``trio.ClosedResourceError`` when closed.
        """
        now = _time()
        if not self._ts_lo <= now < self._ts_hi:  # also while refusing appends (_ts_lo is inf then)
            self._refresh(now)
        if 10 in data:  # b"\n"; the int form is a plain memchr, several times faster
            raise ValueError("journal payload contains a raw newline")
        # The bytes msgspec makes of Record(type, ts, data, seq, run), put together from pieces
        # encoded once (per type and ms, per run): this is the daemon's hottest path, where every
        # attribute load and call shows (see BENCHMARKS.md), hence `is not`, `[]` over `.get`.
        if run is not self._run:
            self._set_run(run)
        try:
            head = self._heads[type]
        except KeyError:
            head = self._head(type)
        seq = self.last_seq + 1
        low = seq % 100
        if not low:
            self._set_seq(seq)
        line = _join((head, data, self._seq_hi, self._seq_low[low], self._run_tail))
        buf = line + b"\n"  # one copy either way; this one leaves the line to return as it is
        off = self._end
        size = len(buf)
        try:
            n = _write(self._fd, buf)
            if n != size:
                _fsutil.write_all(self._fd, memoryview(buf)[n:])
        except OSError:
            self._rollback(off)
            raise
        self._end = off + size
        self.last_seq = seq
        if not low:
            self._index(seq, off)
        if not self._queued:
            self._queued = True
            self._on_dirty(self)  # type: ignore[misc]  # _queued starts True when there is none
        return seq, line

    @property
    def size(self) -> int:
        """The file's size in bytes: where the next record will start."""
        return self._end

    def _refresh(self, now: float) -> None:
        """append's slow path: refuse while broken (or closed), else cache the ts of ``now``'s ms."""
        if self._broken:
            if not (self._readonly is not None and self._fd >= 0 and self._reopen_writable()):
                self._raise_unusable()
        if not self._ts_lo <= now < self._ts_hi:
            self._set_ts(now)

    def _refuse(self, reason: str) -> None:
        """Refuse appends from now on, saying ``reason``: append's fast check sees the inf."""
        self._broken = True
        self._broken_reason = reason
        self._ts_lo = math.inf

    def _set_ts(self, now: float) -> None:
        ms = int(now * 1000)
        self._ts = _format_ms(ms)
        self._ts_mid = b',"ts":"%s","data":' % self._ts.encode()
        self._ts_lo, self._ts_hi = ms / 1000, (ms + 1) / 1000
        self._heads.clear()

    def _set_seq(self, seq: int) -> None:
        # seq = 100 * hi + low: the digits of hi formatted once per 100 records, low's from a table
        hi = seq // 100
        self._seq_hi = b',"seq":%d' % hi if hi else b',"seq":'
        self._seq_low = _DIGITS2 if hi else _DIGITS1

    def _set_run(self, run: str) -> None:
        # Another str object than the last, often an equal one: encoded again only when it differs.
        if run != self._run:
            self._run_tail = b',"run":%s}' % _encode(run) if run else b"}"
        self._run = run

    def _head(self, type: str) -> bytes:
        head = b'{"type":%s%s' % (_encode(type), self._ts_mid)
        if len(self._heads) < 64:  # the few record types there are; anything past that is not cached
            self._heads[type] = head
        return head

    def _rollback(self, off: int) -> None:
        """Cut a partly written line off after a failed write."""
        try:
            os.ftruncate(self._fd, off)
        except OSError as exc:
            try:
                size = os.fstat(self._fd).st_size
            except OSError:
                size = -1
            if size != off:
                # A torn line stays; appending after it would bury it mid-file. Reopening cuts it.
                self._refuse("has a torn tail that could not be cut; reopen it")
                _log().error("journal.rollback_failed", path=str(self.path), error=str(exc))

    def _reopen_writable(self) -> bool:
        """A journal opened read-only: try again for writing (the file system came back)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            _regular_only(fd, self.path)
            if os.fstat(fd).st_size != self._end:
                os.ftruncate(fd, self._end)  # the torn tail left while read-only
                os.fsync(fd)
        except (OSError, JournalRefused):
            os.close(fd)
            return False
        os.close(self._fd)
        self._fd = fd
        self._readonly = None
        self._broken = False
        self._broken_reason = ""
        self._ts_lo = self._ts_hi = 0.0
        _log().info("journal.writable_again", path=str(self.path))
        return True

    def _fail(self, exc: OSError) -> None:
        """An fsync failed: refuse appends and syncs from now on (reads go on); reopening clears it."""
        self._sync_failed = True
        self._errno = exc.errno or errno.EIO
        self._refuse(
            f"could not be synced ({exc.strerror or exc}); what it holds since is not known to be on disk, "
            "so it takes no more records until agentd restarts"
        )

    def _raise_unusable(self) -> None:
        if self._fd < 0:
            raise trio.ClosedResourceError(f"journal {self.path} is closed")
        if self._sync_failed and not self._broken:  # marked by a worker thread; _fail is on its way
            raise OSError(errno.EIO, f"journal {self.path}: an earlier fsync of it failed")
        raise OSError(self._errno, f"journal {self.path} {self._broken_reason}")

    def _index(self, seq: int, off: int) -> None:
        self._idx_seq.append(seq)
        self._idx_off.append(off)
        if len(self._idx_seq) > _INDEX_MAX:
            del self._idx_seq[: _INDEX_MAX // 2]
            del self._idx_off[: _INDEX_MAX // 2]

    # ------------------------------------------------------------------ sync / close

    async def sync(self) -> None:
        """Return once every record appended before the call is on disk.

        fsyncs only when something is unsynced, in a worker thread, or on the
        trio thread while this process's recent fsyncs took under 1 ms (see
        :class:`_FsyncTimer`); a no-op for ``never``. A cancel point always,
        and a schedule point unless the fsync ran on the trio thread: there
        the caller yields on its own schedule, as the conversation pump does
        every PUMP_SLICE_S (a schedule point right after an fsync costs about
        45 us on a 2-core VM, a fifth of the fsync; see BENCHMARKS.md).
        Cancellation waits for an fsync already started. Raises OSError when
        the fsync fails, and from then on (the journal then refuses appends
        too: what it holds since its last good fsync is not known to be on
        disk), and ``trio.ClosedResourceError`` when closed.

        One fsync of a journal runs at a time: Linux reports a writeback error
        to one fsync of the file only, so a second fsync running meanwhile
        could report success over pages the kernel dropped. A caller that finds
        one running waits for its outcome, then fsyncs what it did not cover.
        """
        if self._fd < 0 or self._sync_failed:
            self._raise_unusable()
        while self._sync_done is not None:
            await self._sync_done.wait()
            if self._fd < 0 or self._sync_failed:
                self._raise_unusable()
        if _fsync_timer.inline and self._policy is not FsyncPolicy.NEVER and self._synced < self._end:
            end = self._end
            t0 = time.perf_counter()
            try:
                _fsync_journal(self, self._fd)
            except OSError as exc:
                _fsync_failed([(self, end)], exc)
                raise
            finally:
                _fsync_timer.add(time.perf_counter() - t0)
            self._synced = end
            await trio.lowlevel.checkpoint_if_cancelled()
            return
        done = self._sync_done = trio.Event()
        try:
            await _sync_journals([self])
        finally:
            self._sync_done = None
            done.set()

    def close(self) -> None:
        """Close the file; idempotent.

        Blocks on an fsync when appends are unsynced (policy ``always`` or
        ``batch``); await :meth:`sync` first to keep that off the trio thread.
        """
        self._close(sync=True)

    def _close(self, *, sync: bool) -> None:
        fd, self._fd = self._fd, -1
        self._broken = True
        self._ts_lo = math.inf  # append's fast check fails, its slow path sees _broken
        if fd < 0:
            return
        try:
            if sync and self._policy is not FsyncPolicy.NEVER and self._synced < self._end and not self._sync_failed:
                _fsync_journal(self, fd)
                self._synced = self._end
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ read

    def read_after(self, after: int, limit: int | None = None, max_bytes: int | None = None) -> list[bytes]:
        """Lines (without newline) of the records with ``seq > after``, in order, at most ``limit``,
        and at most ``max_bytes`` of lines (newlines not counted) but always the first one.

        Synchronous. Never scans from the start: the first line is located by
        an in-memory index of recent offsets or by bisecting the file's byte
        offsets. Each returned line is checked; a line that is not a record
        with the expected seq raises :class:`JournalCorrupt` naming its line
        (ask again with a smaller ``limit`` to get the records before it).
        Raises ``trio.ClosedResourceError`` when closed.
        """
        if self._fd < 0:
            self._raise_unusable()
        after = max(after, 0)
        if after >= self.last_seq or (limit is not None and limit <= 0):
            return []
        line_no, off = self._locate(after + 1)
        return self._read_forward(line_no, off, after, limit, max_bytes)

    def _locate(self, target: int) -> tuple[int, int]:
        """A line start ``(line number, offset)`` at or before the line holding seq ``target``, close to it."""
        off = self._cursors.get(target)
        if off is not None:
            return target, off
        i = bisect.bisect_right(self._idx_seq, target) - 1
        lo_seq, lo_off = (self._idx_seq[i], self._idx_off[i]) if i >= 0 else (1, 0)
        if lo_seq == target:
            return lo_seq, lo_off
        hi_off = self._idx_off[i + 1] if i + 1 < len(self._idx_off) else self._end
        # Bisect byte offsets: seq grows with the offset, so a probed line says which half holds target.
        while hi_off - lo_off > _SCAN:
            mid = (lo_off + hi_off) // 2
            start = self._next_line_start(mid, hi_off)
            seq = None
            while start < hi_off:
                line = self._line_at(start)
                try:
                    seq = _seq_decoder.decode(line).seq
                    break
                except msgspec.DecodeError:
                    # A corrupt line has no usable seq; the next one does. The forward read reports it if needed.
                    start += len(line) + 1
            if seq is None:
                hi_off = mid
                continue
            if seq == target:
                return seq, start
            if seq < target:
                lo_seq, lo_off = seq, start
            else:
                hi_off = start
        return lo_seq, lo_off

    def _next_line_start(self, pos: int, limit: int) -> int:
        """The first line start at or after ``pos``; ``limit`` when none before it."""
        if pos == 0:
            return 0
        p = pos - 1
        while p < limit:
            buf = os.pread(self._fd, min(_PROBE, limit - p), p)
            if not buf:
                break
            j = buf.find(b"\n")
            if j >= 0:
                return p + j + 1
            p += len(buf)
        return limit

    def _line_at(self, start: int) -> bytes:
        """The line starting at ``start``, without its newline."""
        buf = os.pread(self._fd, _PROBE, start)
        j = buf.find(b"\n")
        if j >= 0:
            return buf[:j]
        parts, pos, size = [buf], start + len(buf), _PROBE
        while pos < self._end:
            size = min(size * 2, _CHUNK_MAX)
            chunk = os.pread(self._fd, min(size, self._end - pos), pos)
            if not chunk:
                break
            j = chunk.find(b"\n")
            if j >= 0:
                parts.append(chunk[:j])
                break
            parts.append(chunk)
            pos += len(chunk)
        return b"".join(parts)

    def _read_forward(self, line_no: int, off: int, after: int, limit: int | None,
                      max_bytes: int | None = None) -> list[bytes]:
        """Read lines from ``off`` (holding line ``line_no``) to the end; keep those numbered > after."""
        out: list[bytes] = []
        room = -1 if max_bytes is None else max_bytes  # bytes of lines still to take (-1: no bound)
        fd, end, decode = self._fd, self._end, _seq_decoder.decode
        pos, size, n = off, _CHUNK, line_no
        pending: list[bytes] = []  # the start of a line whose newline is not read yet (no newline in it)
        held = 0  # their length
        while pos < end:
            chunk = os.pread(fd, min(size, end - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            size = min(size * 2, _CHUNK_MAX)
            j = chunk.find(b"\n")
            if j < 0:  # a long line goes on: joined once its end comes, not copied per chunk
                pending.append(chunk)
                held += len(chunk)
                if out and 0 <= room < held:  # over max_bytes already: not read to its end
                    self._remember(n, pos - held)
                    return out
                continue
            data = b"".join((*pending, chunk)) if pending else chunk
            base = pos - len(data)  # file offset of data[0]
            j += held
            pending, held = [], 0
            i = 0
            while j >= 0:
                if n > after:
                    line = data[i:j]
                    try:
                        seq = decode(line).seq
                    except msgspec.DecodeError as exc:
                        raise JournalCorrupt(self.path, n, f"not a record ({exc})") from None
                    if seq != n:
                        raise JournalCorrupt(self.path, n, f"seq {seq} where {n} was expected")
                    if room >= 0:
                        if len(line) > room and out:
                            self._remember(n, base + i)
                            return out
                        room = max(room - len(line), 0)
                    out.append(line)
                    if limit is not None and len(out) >= limit:
                        self._remember(n + 1, base + j + 1)
                        return out
                i = j + 1
                n += 1
                j = data.find(b"\n", i)
            if i < len(data):
                pending, held = [data[i:]], len(data) - i
        return out

    def _remember(self, seq: int, off: int) -> None:
        if seq > self.last_seq:
            return
        cursors = self._cursors
        if len(cursors) >= _CURSORS_MAX:
            del cursors[next(iter(cursors))]
        cursors[seq] = off

    def __repr__(self) -> str:
        return f"<Journal {self.path} last_seq={self.last_seq}>"


class JournalStore:
    """All journals and conversation records under ``root`` (``<state_dir>/conversations``).

    Each conversation is a directory ``root/<id>/`` (mode 0700) holding
    ``events.jsonl`` and ``record.json``. Journals are opened once and cached
    until :meth:`remove` or :meth:`aclose`. Use from the trio thread only.
    """

    def __init__(self, root: pathlib.Path, *, fsync: FsyncPolicy = FsyncPolicy.BATCH, batch_ms: float = 5.0) -> None:
        self.root = pathlib.Path(root)
        self.fsync = FsyncPolicy(fsync)
        self.batch_ms = batch_ms
        self._journals: dict[str, Journal] = {}
        #: conversations whose record.json is refused (see ConversationStore.refused)
        self.refused: dict[str, JournalRefused] = {}
        #: what the group-commit thread is to sync: (deadline, journal, dup'd fd), or _STOP
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        #: puts on ``_queue`` made once the appending task step ends, while :meth:`run` runs (_mark_dirty)
        self._handoff: AfterStep[tuple[float, Journal, int]] = AfterStep(self._put)
        #: the thread run() runs in: only an append there may leave its put to the hand-off
        self._run_thread = 0
        #: every record's bytes by id, kept from read_records() on, for the index aclose() writes
        self._records: dict[str, bytes] | None = None
        #: False once a record write failed half-way: what is on disk is then unknown
        self._records_exact = True
        #: an index file may be on disk: remove it before any record changes
        self._index_on_disk = True
        #: read_records() read the index of a clean stop: every record is up to date with its journal
        self.records_from_index = False

    # ------------------------------------------------------------------ group commit

    def _put(self, item: tuple[float, Journal, int]) -> None:
        self._queue.put(item)

    def _mark_dirty(self, journal: Journal) -> None:
        """A journal's first unsynced append (BATCH): queue it for the group-commit thread.

        While :meth:`run` runs, the item is handed to the thread once the task that appended has
        reached its next checkpoint (agentd._after_step): ``SimpleQueue.put`` wakes the thread, which
        then takes the GIL from the trio thread at its next system call, and a turn's start (its
        prompt journaled, then written to the runtime in the same task step) or end (journaled,
        then sent to its subscribers) would wait for that hand-off. The deadline still counts
        from the append.
        """
        try:
            fd = os.dup(journal._fd)
        except OSError as exc:
            # No fd to hand over (EMFILE): sync here, on the trio thread, rather than not at all.
            journal._queued = False
            with contextlib.suppress(OSError):  # _fsync_failed has refused the journal
                _fsync_here(journal, exc)
            return
        item = (time.monotonic() + self.batch_ms / 1000, journal, fd)
        if threading.get_ident() == self._run_thread:
            self._handoff.defer(item)  # at once when run() is not running
        else:
            self._queue.put(item)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Group commit for ``batch``: runs until cancelled.

        Each dirty journal is fsynced at most ``batch_ms`` after its first
        unsynced append, all journals dirty by then at once, in one thread
        this starts (:class:`_GroupCommit`; the trio thread is not woken for
        it). On cancellation, waits (shielded) until everything dirty so far
        is synced and the thread has ended. Raises only Cancelled (or what
        ended the thread, a bug): when an fsync fails (durability then
        unknown) it is logged (``journal.fsync_failed``) and the journals
        concerned refuse further appends, so their turns fail with that
        reason, while the daemon keeps serving reads and every other
        conversation.
        """
        commit = _GroupCommit(self._queue, trio.lowlevel.current_trio_token())
        ended = trio.Event()
        thread = threading.Thread(target=commit.main, args=(ended.set,), name="agentd-journal-sync", daemon=True)
        thread.start()
        self._run_thread = threading.get_ident()
        try:
            # The hand-off's puts left on a cancel are made as it returns: synced before _STOP.
            async with trio.open_nursery() as nursery:
                await nursery.start(self._handoff.run)
                task_status.started()
                await ended.wait()  # only when the thread died
                nursery.cancel_scope.cancel()
            raise RuntimeError("the journal's group-commit thread ended") from commit.error
        finally:
            if not ended.is_set():
                self._queue.put(_STOP)
                with trio.CancelScope(shield=True):
                    await ended.wait()

    def _drain(self) -> None:
        """Close the fds of what is queued while no group-commit thread runs (aclose syncs those journals)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, tuple):
                os.close(item[2])
                item[1]._queued = False

    # ------------------------------------------------------------------ conversations

    def _dir(self, conversation_id: str) -> pathlib.Path:
        if not _fsutil.is_safe_name(conversation_id):
            raise Invalid(f"invalid conversation id {conversation_id!r}")
        return self.root / conversation_id

    def open(self, conversation_id: str) -> Journal:
        """The conversation's journal, cached; creates its directory (0700) and file on first use.

        Raises :class:`Invalid` for an id that cannot name a directory,
        :class:`JournalCorrupt` when the last line is not a record,
        :class:`JournalRefused` when a symlink or a FIFO sits at the journal's path, OSError.
        """
        j = self._journals.get(conversation_id)
        if j is not None:
            return j
        d = self._dir(conversation_id)
        _fsutil.make_dirs(d)
        try:
            j = Journal(d / EVENTS_FILE, fsync=self.fsync, on_dirty=self._mark_dirty)
        except JournalRefused as exc:
            raise self._refused(conversation_id, exc) from None
        self._journals[conversation_id] = j
        return j

    def exists(self, conversation_id: str) -> bool:
        """Whether the conversation has a ``record.json`` (the same test as :meth:`ids`)."""
        try:
            return (self._dir(conversation_id) / RECORD_FILE).is_file()
        except Invalid:
            return False

    def ids(self) -> list[str]:
        """Ids of the conversations on disk (directories with a ``record.json``), sorted.

        Also deletes what an interrupted :meth:`remove` left behind.
        """
        out = []
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return []
        for e in entries:
            if e.name.startswith(_TOMBSTONE):
                shutil.rmtree(e.path, ignore_errors=True)
            elif _fsutil.is_safe_name(e.name) and e.is_dir() and os.path.isfile(os.path.join(e.path, RECORD_FILE)):
                out.append(e.name)
        return sorted(out)

    def read_records(self) -> dict[str, bytes]:
        """Every conversation's ``record.json`` bytes by id: what :meth:`ids` and :meth:`read_record` give.

        Reads the one index file a clean :meth:`aclose` wrote when there is
        one (no record can have changed since: the first change removes it),
        else every ``record.json`` (and what an interrupted :meth:`remove`
        left behind is deleted). Blocking; call once, at start-up.
        """
        records: dict[str, bytes] | None = None
        self.records_from_index = False
        try:
            data = _fsutil.read_file(self.root / INDEX_FILE)
        except FileNotFoundError:
            self._index_on_disk = False
        else:
            try:
                index = _index_decoder.decode(data)
                if index.version == _INDEX_VERSION:
                    records = {cid: bytes(raw) for cid, raw in index.records.items()}
                    self.records_from_index = True
            except msgspec.DecodeError as exc:
                _log().warning("journal.index_unreadable", path=str(self.root / INDEX_FILE), error=str(exc))
            if records is None:
                self._drop_index()
        if records is None:
            records = {}
            for cid in self.ids():
                data = self.read_record(cid)
                if data is not None:
                    records[cid] = data
        self._records = dict(records)
        return records

    def drop_index(self) -> None:
        """Remove the records index before a journal holds what no record says (a turn's start).

        A no-op once removed. Raises OSError (and then nothing changed).
        """
        self._drop_index()

    def journal_size(self, conversation_id: str) -> int:
        """The size in bytes of the conversation's journal file (0 when there is none); blocking.

        Raises :class:`JournalRefused` when a symlink sits there (its target's size says nothing).
        """
        path = self._dir(conversation_id) / EVENTS_FILE
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return 0
        if stat.S_ISLNK(st.st_mode):
            raise self._refused(conversation_id, JournalRefused(path, _symlink_problem(path)))
        return st.st_size

    @staticmethod
    def _refused(conversation_id: str, exc: JournalRefused) -> JournalRefused:
        # Damage, not a bug: one warning line, no traceback; the caller gets the refusal.
        _log().warning("journal.refused", conversation=conversation_id, path=str(exc.path), problem=exc.problem)
        return exc

    def _drop_index(self) -> None:
        """Remove the index, durably, before a record changes (raises OSError, and then nothing changes)."""
        if self._index_on_disk:
            try:
                os.unlink(self.root / INDEX_FILE)
            except FileNotFoundError:
                pass
            else:
                _fsutil.fsync_dir(self.root)
            self._index_on_disk = False

    def _write_index(self) -> None:
        if self._records is None or not self._records_exact or self._index_on_disk:
            return  # unknown records, or the index on disk is still exact
        index = _RecordsIndex(_INDEX_VERSION, {cid: msgspec.Raw(data) for cid, data in self._records.items()})
        try:
            _fsutil.make_dirs(self.root)
            _fsutil.atomic_write(self.root / INDEX_FILE, _encode(index))
        except OSError as exc:
            _log().warning("journal.index_write_failed", path=str(self.root / INDEX_FILE), error=str(exc))
            return
        self._index_on_disk = True

    def write_record(self, conversation_id: str, data: bytes) -> None:
        """Replace ``record.json`` atomically (write, fsync, rename, fsync dir); blocking. Raises Invalid, OSError."""
        d = self._dir(conversation_id)
        self._drop_index()
        _fsutil.make_dirs(d)
        try:
            _fsutil.atomic_write(d / RECORD_FILE, data)
        except BaseException:
            self._records_exact = False  # the rename may have happened: no index from this run
            raise
        if self._records is not None:
            self._records[conversation_id] = data

    def read_record(self, conversation_id: str) -> bytes | None:
        """The bytes of ``record.json``, or None when there is none (or the id is invalid)."""
        path = None
        try:
            path = self._dir(conversation_id) / RECORD_FILE
            return _fsutil.read_file(path)
        except (FileNotFoundError, NotADirectoryError, Invalid):
            return None
        except OSError as exc:  # a symlink (never followed), a FIFO: not a record agentd wrote
            if exc.errno in (errno.ELOOP, errno.EINVAL):
                problem = _symlink_problem(path) if exc.errno == errno.ELOOP else "not a regular file"
                self.refused[conversation_id] = self._refused(conversation_id, JournalRefused(path, problem, "record"))
            else:
                _log().error("journal.record_unreadable", conversation=conversation_id, error=str(exc))
            return None

    def remove(self, conversation_id: str) -> None:
        """Close the journal and delete the conversation's directory; no error when absent.

        The directory is first renamed to a tombstone, so a crash midway never
        leaves a half-deleted conversation that :meth:`ids` would list.
        """
        d = self._dir(conversation_id)
        self._drop_index()
        if self._records is not None:
            self._records.pop(conversation_id, None)
        j = self._journals.pop(conversation_id, None)
        if j is not None:
            j._close(sync=False)  # about to be deleted: no point in an fsync
        tomb = self.root / f"{_TOMBSTONE}{conversation_id}-{secrets.token_hex(4)}"
        try:
            os.rename(d, tomb)
        except FileNotFoundError:
            return
        _fsutil.fsync_dir(self.root)
        shutil.rmtree(tomb, ignore_errors=True)

    async def aclose(self) -> None:
        """fsync every open journal with unsynced appends (one worker-thread call), then close all.

        The journals are closed even if the fsync fails or is cancelled; the
        store may be used again afterwards (journals reopen on demand). Then,
        when :meth:`read_records` ran, writes the index of every record (in a
        worker thread), so the next start reads one file instead of one per
        conversation.
        """
        journals = list(self._journals.values())
        self._journals.clear()
        self._drain()
        try:
            await _sync_journals(journals)
        finally:
            for j in journals:
                j._close(sync=False)
        if self._records is not None:
            await trio.to_thread.run_sync(self._write_index)
