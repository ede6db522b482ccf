"""The journal: seq continuity, crash recovery, paging without scanning, fsync policies, errors."""

from __future__ import annotations

import errno
import os
import pathlib
import queue
import re
import stat
import threading
import time

import msgspec
import pytest
import structlog
import trio
import trio.testing

from agentd import journal as journal_mod
from agentd.journal import FsyncPolicy, Journal, JournalCorrupt, JournalStore
from agentd import wire
from agentd.wire import decode_record

TS_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\Z")


def payload(i: int) -> bytes:
    return msgspec.json.encode({"i": i, "text": "x" * 40})


def seqs(lines: list[bytes]) -> list[int]:
    return [decode_record(line).seq for line in lines]


def fill(j: Journal, n: int) -> None:
    for i in range(n):
        j.append("item", payload(i), run="r1")


@pytest.fixture
def store(tmp_path: pathlib.Path) -> JournalStore:
    return JournalStore(tmp_path / "conversations", fsync=FsyncPolicy.NEVER)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts os.fsync calls (the worker threads look it up through the os module too)."""
    calls: list[int] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


# --------------------------------------------------------------------------- append / reopen


async def test_seq_continues_across_close_and_reopen(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "conversations"
    store = JournalStore(root)
    j = store.open("c1")
    assert j.last_seq == 0
    assert [j.append("item", payload(i), run="r1")[0] for i in range(3)] == [1, 2, 3]
    await store.aclose()

    store = JournalStore(root)
    j = store.open("c1")
    assert j.last_seq == 3
    seq, line = j.append("turn", b'{"state":"completed"}')
    assert seq == 4
    lines = j.read_after(0)
    assert seqs(lines) == [1, 2, 3, 4]
    assert lines[-1] == line
    rec = decode_record(line)
    assert (rec.type, rec.run, bytes(rec.data)) == ("turn", "", b'{"state":"completed"}')
    assert TS_RE.match(rec.ts)
    first = decode_record(lines[0])
    assert (first.type, first.run, msgspec.json.decode(first.data)["i"]) == ("item", "r1", 0)
    await store.aclose()


def test_append_returns_the_line_written_to_the_file(store: JournalStore) -> None:
    j = store.open("c1")
    _, line = j.append("item", payload(1), run="r9")
    assert j.path.read_bytes() == line + b"\n"


def test_lines_are_the_bytes_msgspec_makes_of_the_record_across_seq_digits_runs_and_reopen(
    tmp_path: pathlib.Path,
) -> None:
    """append builds each line from cached pieces (the seq's last two digits from a table, the rest
    formatted per hundred): every line is still what msgspec encodes, at 9/10, 99/100/101, 999/1000,
    with runs and types changing, and after a reopen in the middle of a hundred."""
    path = tmp_path / "events.jsonl"
    j = Journal(path)
    lines: list[bytes] = []

    def add(n: int) -> None:
        for _ in range(n):
            seq = j.last_seq + 1
            type_, run = ("item", "r1") if seq % 3 else ("turn", "" if seq % 2 else "r-2")
            data = payload(seq)
            got_seq, line = j.append(type_, data, run=run)
            assert got_seq == seq
            rec = decode_record(line)
            assert line == msgspec.json.encode(wire.Record(type=type_, ts=rec.ts, data=msgspec.Raw(data), seq=seq, run=run))
            lines.append(line)

    add(150)
    j.close()
    j = Journal(path)  # reopened at seq 150: the next, 151, is formatted from the file's last seq
    add(1100)
    assert path.read_bytes() == b"".join(line + b"\n" for line in lines)
    assert j.read_after(99, limit=2) == lines[99:101]
    assert j.read_after(999, limit=1) == [lines[999]]
    j.close()


def test_payload_with_a_raw_newline_is_refused(store: JournalStore) -> None:
    j = store.open("c1")
    with pytest.raises(ValueError):
        j.append("item", b'{\n"a": 1}')
    assert j.last_seq == 0 and j.path.read_bytes() == b""


def test_torn_tail_is_cut_and_logged(store: JournalStore, tmp_path: pathlib.Path) -> None:
    j = store.open("c1")
    fill(j, 2)
    path = j.path
    j.close()
    torn = b'{"type":"item","ts":"2024-01-01T00:00:00.000Z","data":{"i":'
    with open(path, "ab") as f:
        f.write(torn)

    with structlog.testing.capture_logs() as logs:
        j = Journal(path)
    assert j.last_seq == 2
    assert path.read_bytes().endswith(b"\n")
    cut = [e for e in logs if e["event"] == "journal.torn_tail_cut"]
    assert len(cut) == 1
    assert cut[0]["bytes"] == len(torn) and cut[0]["path"] == str(path) and cut[0]["log_level"] == "warning"

    assert j.append("item", payload(3))[0] == 3
    assert seqs(j.read_after(0)) == [1, 2, 3]
    j.close()


def test_torn_first_line_leaves_an_empty_journal(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"type":"it')
    with structlog.testing.capture_logs() as logs:
        j = Journal(path)
    assert j.last_seq == 0 and path.read_bytes() == b""
    assert [e["event"] for e in logs] == ["journal.torn_tail_cut"]
    assert j.append("item", b"{}")[0] == 1
    j.close()


def test_open_reads_only_the_tail(store: JournalStore, monkeypatch: pytest.MonkeyPatch) -> None:
    j = store.open("c1")
    fill(j, 20_000)
    size = j.path.stat().st_size
    j.close()
    read = count_reads(monkeypatch)
    j = Journal(j.path)
    assert j.last_seq == 20_000
    assert 0 < sum(read) < size // 50
    j.close()


# --------------------------------------------------------------------------- read_after


@pytest.mark.parametrize("reopen", [False, True], ids=["indexed", "reopened"])
@pytest.mark.parametrize(
    ("after", "limit"),
    [(0, None), (0, 1), (0, 7), (1, None), (63, 2), (64, 3), (1234, 10), (2999, None), (2999, 5), (3000, None), (4000, None), (-5, 2), (10, 0)],
)
def test_read_after_returns_the_records_after_seq_up_to_limit(
    store: JournalStore, reopen: bool, after: int, limit: int | None
) -> None:
    # 3000 records of ~110 bytes: several bisection steps over ~330 KB once the index is gone.
    j = store.open("c1")
    fill(j, 3000)
    if reopen:
        j.close()
        j = Journal(j.path)
    lines = j.read_after(after, limit)
    expected = list(range(max(after, 0) + 1, 3001))
    if limit is not None:
        expected = expected[:limit]
    assert seqs(lines) == expected
    j.close()


def test_paging_forward_reads_every_record_once(store: JournalStore) -> None:
    j = store.open("c1")
    fill(j, 1000)
    j.close()
    j = Journal(j.path)
    got: list[int] = []
    after = 0
    while page := j.read_after(after, 37):
        got += seqs(page)
        after = got[-1]
    assert got == list(range(1, 1001))
    j.close()


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes returned by every os.read / os.pread from now on."""
    read: list[int] = []
    real_pread, real_read = os.pread, os.read

    def pread(fd: int, n: int, off: int) -> bytes:
        data = real_pread(fd, n, off)
        read.append(len(data))
        return data

    def read_(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        read.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "read", read_)
    return read


def test_read_after_does_not_read_the_whole_file(store: JournalStore, monkeypatch: pytest.MonkeyPatch) -> None:
    j = store.open("c1")
    fill(j, 200_000)
    size = j.path.stat().st_size
    j.close()
    j = Journal(j.path)  # fresh: no index but the last line, so this bisects
    read = count_reads(monkeypatch)

    assert seqs(j.read_after(199_990)) == list(range(199_991, 200_001))
    assert sum(read) < size // 100, (sum(read), size)

    read.clear()
    assert seqs(j.read_after(100_000, 5)) == list(range(100_001, 100_006))
    assert seqs(j.read_after(1, 2)) == [2, 3]
    assert sum(read) < size // 100, (sum(read), size)
    j.close()


# --------------------------------------------------------------------------- corruption


def corrupt_line(path: pathlib.Path, line_no: int, junk: bytes = b"@@ not json @@") -> None:
    lines = path.read_bytes().split(b"\n")
    lines[line_no - 1] = junk
    path.write_bytes(b"\n".join(lines))


def test_corrupt_middle_line_raises_with_its_line_number_and_earlier_records_stay_readable(store: JournalStore) -> None:
    j = store.open("c1")
    fill(j, 10)
    path = j.path
    j.close()
    corrupt_line(path, 5)

    j = Journal(path)  # the last line is fine, so opening works and nothing is rewritten
    before = path.read_bytes()
    assert j.last_seq == 10
    assert seqs(j.read_after(0, 4)) == [1, 2, 3, 4]
    with pytest.raises(JournalCorrupt) as info:
        j.read_after(0)
    assert info.value.line == 5
    assert "line 5" in info.value.message and str(path) in info.value.message
    assert info.value.code == "internal"
    with pytest.raises(JournalCorrupt):
        j.read_after(4, 1)
    assert seqs(j.read_after(5)) == [6, 7, 8, 9, 10]
    assert path.read_bytes() == before
    j.close()


def test_corrupt_line_in_a_large_journal_is_found_by_line_number(store: JournalStore) -> None:
    j = store.open("c1")
    fill(j, 6000)
    path = j.path
    j.close()
    corrupt_line(path, 3000)
    corrupt_line(path, 3001, b'{"type":"item","ts":"x","seq":77}')  # valid JSON, wrong seq

    j = Journal(path)
    assert seqs(j.read_after(3001, 3)) == [3002, 3003, 3004]
    assert seqs(j.read_after(2990, 9)) == list(range(2991, 3000))
    with pytest.raises(JournalCorrupt) as info:
        j.read_after(2990)
    assert info.value.line == 3000
    with pytest.raises(JournalCorrupt) as info:
        j.read_after(3000)
    assert info.value.line == 3001
    j.close()


def test_open_refuses_a_journal_whose_last_line_is_corrupt(store: JournalStore) -> None:
    j = store.open("c1")
    fill(j, 3)
    path = j.path
    j.close()
    with open(path, "ab") as f:
        f.write(b"garbage\n")
    with pytest.raises(JournalCorrupt) as info:
        Journal(path)
    assert info.value.line == 4


# --------------------------------------------------------------------------- write errors


def test_write_error_leaves_the_file_valid_and_last_seq_unchanged(
    store: JournalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = store.open("c1")
    fill(j, 3)
    size = j.path.stat().st_size
    real_write = os.write
    failures = [1]

    def failing_write(fd: int, data: bytes) -> int:
        if failures:
            failures.pop()
            real_write(fd, bytes(data)[: len(data) // 2])  # a torn half line reaches the file first
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(journal_mod, "_write", failing_write)  # append's own alias of os.write
    with pytest.raises(OSError) as info:
        j.append("item", payload(99))
    assert info.value.errno == errno.ENOSPC
    assert j.last_seq == 3
    assert j.path.stat().st_size == size

    assert j.append("item", payload(4))[0] == 4
    j.close()
    with structlog.testing.capture_logs() as logs:
        j = Journal(j.path)
    assert logs == []
    assert seqs(j.read_after(0)) == [1, 2, 3, 4]
    j.close()


def test_short_writes_are_completed(store: JournalStore, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    short = lambda fd, data: real_write(fd, bytes(data)[:7])  # noqa: E731
    monkeypatch.setattr(journal_mod, "_write", short)  # append's first write
    monkeypatch.setattr(os, "write", short)  # and _fsutil.write_all's
    j = store.open("c1")
    _, line = j.append("item", payload(1))
    assert j.path.read_bytes() == line + b"\n"


def test_closed_journal_refuses_appends(store: JournalStore) -> None:
    j = store.open("c1")
    j.close()
    j.close()
    with pytest.raises(trio.ClosedResourceError):
        j.append("item", b"{}")


# --------------------------------------------------------------------------- fsync policies


async def test_always_syncs_once_per_sync_call(tmp_path: pathlib.Path, fsyncs: list[int]) -> None:
    store = JournalStore(tmp_path, fsync=FsyncPolicy.ALWAYS)
    j = store.open("c1")
    fsyncs.clear()  # creating the file synced its directory
    for i in range(3):
        j.append("item", payload(i))
        await j.sync()
        assert len(fsyncs) == i + 1
    await j.sync()  # nothing new since: nothing to sync
    await store.aclose()
    assert len(fsyncs) == 3


@pytest.fixture
def fsync_timer(monkeypatch: pytest.MonkeyPatch) -> journal_mod._FsyncTimer:
    """A fresh fsync timer for the test, so what earlier tests measured does not decide."""
    timer = journal_mod._FsyncTimer()
    monkeypatch.setattr(journal_mod, "_fsync_timer", timer)
    return timer


def fsync_threads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records each hand-off of an fsync to a worker thread."""
    calls: list[object] = []
    real = trio.to_thread.run_sync

    async def counting(fn, *args, **kw):  # type: ignore[no-untyped-def]
        calls.append(fn)
        return await real(fn, *args, **kw)

    monkeypatch.setattr(trio.to_thread, "run_sync", counting)
    return calls


async def test_always_fsyncs_on_the_loop_only_while_fsyncs_are_fast(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fsync_timer: journal_mod._FsyncTimer, fsyncs: list[int]
) -> None:
    threads = fsync_threads(monkeypatch)
    j = JournalStore(tmp_path, fsync=FsyncPolicy.ALWAYS).open("c1")
    fsyncs.clear()
    # Nothing measured yet: the first fsync goes to a worker thread, which times it.
    j.append("item", payload(0))
    await j.sync()
    assert len(threads) == 1 and len(fsyncs) == 1
    assert fsync_timer.mean_s is not None
    # Fast fsyncs: on the trio thread, no hand-off, still one fsync per sync and the end marked synced.
    # (The mean is pinned: on a loaded machine a real fsync can take more than the bound.)
    fsync_timer.mean_s = 0.0001
    monkeypatch.setattr(fsync_timer, "add", lambda seconds: None)
    for i in range(1, 4):
        j.append("item", payload(i))
        await j.sync()
    assert len(threads) == 1 and len(fsyncs) == 4
    assert j._synced == j._end
    # One slow fsync (a busy disk) moves the mean over the bound: back to the worker thread.
    monkeypatch.setattr(fsync_timer, "add", journal_mod._FsyncTimer.add.__get__(fsync_timer))
    fsync_timer.add(0.05)
    assert not fsync_timer.inline
    j.append("item", payload(4))
    await j.sync()
    assert len(threads) == 2 and len(fsyncs) == 5
    j.close()


async def test_inline_fsync_is_a_cancel_point_but_not_a_schedule_point(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fsync_timer: journal_mod._FsyncTimer
) -> None:
    j = JournalStore(tmp_path, fsync=FsyncPolicy.ALWAYS).open("c1")
    fsync_timer.mean_s = 0.0001
    monkeypatch.setattr(fsync_timer, "add", lambda seconds: None)
    ran: list[int] = []

    async def other() -> None:
        ran.append(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        j.append("item", payload(0))
        await j.sync()
        # The other task did not run: the pump, not the fsync, decides when to yield.
        assert ran == [] and j._synced == j._end
    assert ran == [1]
    j.append("item", payload(1))
    with trio.CancelScope() as scope:
        scope.cancel()
        await j.sync()  # the fsync is done before the cancel point
    assert scope.cancelled_caught and j._synced == j._end
    j.close()


async def test_inline_fsync_error_refuses_further_appends(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fsync_timer: journal_mod._FsyncTimer
) -> None:
    j = JournalStore(tmp_path, fsync=FsyncPolicy.ALWAYS).open("c1")
    fsync_timer.mean_s = 0.0001

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    j.append("item", payload(0))
    with pytest.raises(OSError):
        await j.sync()
    with pytest.raises(OSError, match="could not be synced"):
        j.append("item", payload(1))
    assert j.last_seq == 1
    monkeypatch.undo()
    j.close()


async def test_always_runs_one_fsync_of_a_journal_at_a_time_and_a_failed_one_fails_every_later_sync(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fsync_timer: journal_mod._FsyncTimer
) -> None:
    # Linux reports a writeback error to one fsync of the file only: a second fsync running while
    # the first fails could report success over the dropped pages. So a sync that finds one running
    # waits for its outcome, and after a failure no sync succeeds (nor does an append).
    j = JournalStore(tmp_path, fsync=FsyncPolicy.ALWAYS).open("c1")
    assert not fsync_timer.inline  # the worker-thread path
    running: list[int] = []
    overlapped: list[bool] = []
    release = threading.Event()
    started = threading.Event()

    def fsync_fds(jobs: list[tuple[Journal, int]]) -> None:
        overlapped.append(bool(running))
        running.append(1)
        started.set()
        try:
            release.wait(5)
            jobs[0][0]._sync_failed = True  # as _fsync_journal marks it
            raise OSError(errno.EIO, "Input/output error")
        finally:
            running.pop()
            for _, fd in jobs:
                os.close(fd)

    monkeypatch.setattr(journal_mod, "_timed_fsync_fds", fsync_fds)
    errors: list[str] = []

    async def sync() -> None:
        try:
            await j.sync()
        except OSError as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as nursery:
        j.append("item", payload(0))
        nursery.start_soon(sync)
        with trio.fail_after(5):
            while not started.is_set():
                await trio.sleep(0.001)
        j.append("item", payload(1))  # after the first fsync began: it is not known to cover this
        nursery.start_soon(sync)
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(0.05)  # a second fsync, were one started, would be running by now
        assert overlapped == [False]  # the second sync waits; no second fsync runs meanwhile
        release.set()
    assert overlapped == [False]  # nor after the failure: the second sync fails without one
    assert len(errors) == 2 and all("could not be synced" in e for e in errors[1:])
    with pytest.raises(OSError, match="could not be synced"):
        await j.sync()
    with pytest.raises(OSError, match="could not be synced"):
        j.append("item", payload(2))
    j.close()


async def test_a_sync_never_succeeds_over_a_failed_fsync_of_the_group_commit_thread(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fsync batch: the group-commit thread's fsync of x fails, and the thread goes on to y's (slow)
    # before its failure reaches the trio thread. A sync of x meanwhile (what unload does before it
    # lets the lease go) ran an fsync of its own, which succeeded: the error is reported to one
    # fsync of the file only. The journal's fsync lock (_fsync_journal) keeps that from happening.
    monkeypatch.setattr(journal_mod, "_fsync_timer", journal_mod._FsyncTimer())  # worker-thread path
    store = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH, batch_ms=1)
    x = store.open("x")
    y = store.open("y")
    ino_x, ino_y = os.fstat(x._fd).st_ino, os.fstat(y._fd).st_ino
    real = os.fsync
    x_failed, release = threading.Event(), threading.Event()

    def fsync(fd: int) -> None:
        ino = os.fstat(fd).st_ino
        if threading.current_thread().name == "agentd-journal-sync":
            if ino == ino_x:
                x_failed.set()
                raise OSError(errno.EIO, "Input/output error")  # later fsyncs of x would succeed
            if ino == ino_y:
                release.wait(5)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        x.append("item", b'{"n":1}')  # both dirty, in one batch: x first
        y.append("item", b'{"n":2}')
        with trio.fail_after(5):
            while not x_failed.is_set():
                await trio.sleep(0.001)
        try:
            with pytest.raises(OSError):
                await x.sync()
        finally:
            release.set()
            nursery.cancel_scope.cancel()
    await store.aclose()


async def test_always_without_an_fd_to_hand_over_syncs_on_the_trio_thread(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fsync_timer: journal_mod._FsyncTimer, fsyncs: list[int]
) -> None:
    # os.dup failing (EMFILE) is no failed sync: the fsync runs on the trio thread instead, and the
    # journal goes on taking records (a sync that raised would leave them not known to be durable).
    j = JournalStore(tmp_path, fsync=FsyncPolicy.ALWAYS).open("c1")
    assert not fsync_timer.inline

    def dup(fd: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(journal_mod.os, "dup", dup)
    fsyncs.clear()
    j.append("item", payload(0))
    await j.sync()
    assert fsyncs == [j._fd] and j._synced == j._end
    j.append("item", payload(1))
    assert j.last_seq == 2
    j.close()


async def test_batch_syncs_many_appends_once_within_batch_ms(tmp_path: pathlib.Path, fsyncs: list[int]) -> None:
    batch_s = 0.05
    store = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH, batch_ms=batch_s * 1000)
    a, b = store.open("a"), store.open("b")
    fsyncs.clear()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        t0 = trio.current_time()
        for i in range(1000):
            a.append("item", payload(i))
            b.append("item", payload(i))
        with trio.fail_after(5):
            while len(fsyncs) < 2:
                await trio.sleep(0.001)
        elapsed = trio.current_time() - t0
        assert batch_s * 0.9 <= elapsed < batch_s + 0.5  # waited to group, then did not dawdle
        await trio.sleep(batch_s * 3)
        assert len(fsyncs) == 2  # one per journal for 2000 appends, none while clean

        a.append("item", payload(0))
        nursery.cancel_scope.cancel()  # the final flush still syncs it
    assert len(fsyncs) == 3
    await store.aclose()
    assert len(fsyncs) == 3


async def test_batch_flusher_survives_a_journal_removed_while_dirty(tmp_path: pathlib.Path) -> None:
    store = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH, batch_ms=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        store.open("a").append("item", b"{}")
        store.write_record("a", b"{}")
        store.remove("a")
        await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    assert store.ids() == []


def _inode(fd: int) -> int:
    return os.fstat(fd).st_ino


async def test_batch_fsyncs_in_the_group_commit_thread_and_an_append_during_an_fsync_is_synced_next(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH, batch_ms=5)
    j = store.open("a")
    real = os.fsync
    release = threading.Event()
    calls: list[tuple[str, int]] = []  # (thread, file size when the fsync started)

    def fsync(fd: int) -> None:
        calls.append((threading.current_thread().name, os.fstat(fd).st_size))
        if len(calls) == 1:
            release.wait(5)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        fill(j, 10)
        first_end = j.size
        with trio.fail_after(5):
            while not calls:
                await trio.sleep(0.001)
        fill(j, 5)  # while the first fsync is under way: not covered by it, so queued again
        assert j._synced < first_end
        release.set()
        with trio.fail_after(5):
            while j._synced < j.size:
                await trio.sleep(0.001)
        assert [size for _, size in calls] == [first_end, j.size]
        assert {name for name, _ in calls} == {"agentd-journal-sync"}
        nursery.cancel_scope.cancel()
    await store.aclose()
    assert len(calls) == 2


async def test_batch_fsync_error_refuses_that_journals_appends_and_the_others_go_on(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH, batch_ms=1)
    a, b = store.open("a"), store.open("b")
    bad = _inode(a._fd)
    real = os.fsync

    def fsync(fd: int) -> None:
        if _inode(fd) == bad:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            a.append("item", payload(1))
            b.append("item", payload(1))
            with trio.fail_after(5):
                while not a._broken or b._synced < b.size:
                    await trio.sleep(0.001)
            with pytest.raises(OSError, match="could not be synced") as info:
                a.append("item", payload(2))
            assert info.value.errno == errno.EIO and a.last_seq == 1
            b.append("item", payload(2))  # the group commit still runs for the others
            with trio.fail_after(5):
                while b._synced < b.size:
                    await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    failed = [e for e in logs if e["event"] == "journal.fsync_failed"]
    assert len(failed) == 1 and failed[0]["paths"] == [str(a.path)]
    monkeypatch.undo()
    await store.aclose()


async def test_group_commit_never_syncs_a_journal_again_once_its_fsync_failed(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later fsync may report success over the pages the kernel dropped: the thread does not try
    one, even before the trio thread has marked the journal (a batch may come first)."""
    j = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH).open("a")
    j.append("item", payload(1))
    calls: list[int] = []

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    commit = journal_mod._GroupCommit(queue.SimpleQueue(), trio.lowlevel.current_trio_token())
    commit._sync([(0.0, j, os.dup(j._fd))])
    j.append("item", payload(2))  # not refused yet: the failure reaches the trio thread by run_sync_soon
    commit._sync([(0.0, j, os.dup(j._fd))])
    assert len(calls) == 1 and j._synced == 0
    await trio.sleep(0.01)
    with pytest.raises(OSError, match="could not be synced"):
        j.append("item", payload(3))
    monkeypatch.undo()
    j.close()


async def test_batch_without_an_fd_to_hand_over_syncs_on_the_trio_thread(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fsyncs: list[int]
) -> None:
    store = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH)
    j = store.open("a")
    fsyncs.clear()

    def no_dup(fd: int) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "dup", no_dup)
    with structlog.testing.capture_logs() as logs:
        seq, _ = j.append("item", payload(1))  # the record is written: the append succeeds
    assert seq == 1 and j._synced == j.size and fsyncs == [j._fd]
    assert [e["event"] for e in logs] == ["journal.dup_failed"]
    monkeypatch.undo()
    j.append("item", payload(2))  # and the next one is queued again
    assert store._queue.qsize() == 1
    await store.aclose()
    assert store._queue.qsize() == 0


class _RecordingQueue(queue.SimpleQueue):  # type: ignore[type-arg]
    """The group commit's queue, saying when each item was put (monotonic seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.puts: list[tuple[float, object]] = []

    def put(self, item: object, block: bool = True, timeout: float | None = None) -> None:
        self.puts.append((time.monotonic(), item))
        super().put(item, block, timeout)


async def test_batch_wakes_the_sync_thread_only_once_the_appending_task_yields(tmp_path: pathlib.Path) -> None:
    """An append's hand-off to the group-commit thread (which then takes the GIL) waits until the task
    that appended reaches a checkpoint, so a turn's start and end run on without it; the deadline
    still counts from the append, and every journal dirtied in that step goes in one hand-off."""
    store = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH, batch_ms=1)
    store._queue = recording = _RecordingQueue()
    a, b = store.open("a"), store.open("b")
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        before = time.monotonic()
        a.append("item", payload(1))
        a.append("item", payload(2))
        b.append("item", payload(1))
        appended = time.monotonic()
        assert recording.puts == []  # this task has not yielded yet
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        assert [item[1] for _, item in recording.puts] == [a, b]  # type: ignore[index]
        for _, (deadline, _j, _fd) in recording.puts:  # type: ignore[misc]
            assert before + 0.001 <= deadline <= appended + 0.001
        with trio.fail_after(5):
            while (a._synced, b._synced) != (a.size, b.size):
                await trio.sleep(0.001)
        a.append("item", payload(3))  # dirty again: handed off again
        await trio.lowlevel.checkpoint()
        await trio.lowlevel.checkpoint()
        assert len(recording.puts) == 3
        nursery.cancel_scope.cancel()
    assert a._synced == a.size  # what was appended before the cancel is on disk once run() returned
    await store.aclose()


async def test_batch_an_append_off_the_trio_thread_is_put_on_the_queue_at_once(tmp_path: pathlib.Path) -> None:
    """Only the trio thread's appends wait for run() to hand them off (a trio Event is set only there)."""
    store = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH, batch_ms=1)
    store._queue = recording = _RecordingQueue()
    a = store.open("a")
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await trio.to_thread.run_sync(a.append, "item", payload(1))
        assert len(recording.puts) == 1 and store._handoff._items == []
        with trio.fail_after(5):
            while a._synced < a.size:
                await trio.sleep(0.001)
        nursery.cancel_scope.cancel()
    await store.aclose()


async def test_batch_hands_off_what_was_appended_right_before_the_cancel(tmp_path: pathlib.Path) -> None:
    store = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH, batch_ms=1000)
    a = store.open("a")
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        a.append("item", payload(1))
        nursery.cancel_scope.cancel()  # before run() took the append: it syncs it on its way out
    assert a._synced == a.size and store._handoff._items == []
    await store.aclose()


async def test_batch_shutdown_waits_for_the_fsync_under_way_and_syncs_the_rest(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH, batch_ms=1)
    a, b = store.open("a"), store.open("b")
    real = os.fsync
    started, release = threading.Event(), threading.Event()
    synced: list[int] = []

    def fsync(fd: int) -> None:
        started.set()
        release.wait(5)
        real(fd)
        synced.append(_inode(fd))

    monkeypatch.setattr(os, "fsync", fsync)
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            a.append("item", payload(1))
            with trio.fail_after(5):
                await trio.to_thread.run_sync(started.wait)
            b.append("item", payload(1))  # queued behind the fsync under way
            outer.start_soon(trio.to_thread.run_sync, lambda: (time.sleep(0.05), release.set()))
            nursery.cancel_scope.cancel()  # run() returns only once both are on disk
        assert release.is_set()
        assert (a._synced, b._synced) == (a.size, b.size)
        assert sorted(synced) == sorted([_inode(a._fd), _inode(b._fd)])
    monkeypatch.undo()
    await store.aclose()


async def test_batch_run_raises_when_its_thread_dies(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: object, batch: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(journal_mod._GroupCommit, "_sync", broken)
    store = JournalStore(tmp_path, fsync=FsyncPolicy.BATCH, batch_ms=1)
    store.open("a").append("item", payload(1))  # queued before run() starts: its thread takes it first
    with pytest.raises(RuntimeError, match="group-commit thread ended") as info:
        with trio.fail_after(5):
            await store.run()
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    await store.aclose()


async def test_never_does_not_fsync(tmp_path: pathlib.Path, fsyncs: list[int]) -> None:
    store = JournalStore(tmp_path, fsync=FsyncPolicy.NEVER, batch_ms=1)
    j = store.open("c1")
    fsyncs.clear()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        fill(j, 100)
        await j.sync()
        await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    await store.aclose()
    assert fsyncs == []


# --------------------------------------------------------------------------- records and the store


def test_record_write_is_atomic(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "conversations"
    store = JournalStore(root)
    store.write_record("c1", b'{"v":1}')
    conv = root / "c1"
    assert stat.S_IMODE(conv.stat().st_mode) == 0o700
    assert stat.S_IMODE((conv / "record.json").stat().st_mode) == 0o600

    # A crash before the rename: the old record is intact, no temporary file is left.
    def crash(src: object, dst: object) -> None:
        raise OSError(errno.EIO, "simulated crash")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.write_record("c1", b'{"v":2}')
    assert store.read_record("c1") == b'{"v":1}'
    assert sorted(p.name for p in conv.iterdir()) == ["record.json"]
    monkeypatch.undo()

    # The new content is fsynced before the rename and the directory after it.
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync_dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync_file")
        real_fsync(fd)

    def replace(src: object, dst: object) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    store.write_record("c1", b'{"v":2}')
    assert events == ["fsync_file", "rename", "fsync_dir"]
    assert store.read_record("c1") == b'{"v":2}'


def test_ids_exists_and_remove(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "conversations"
    store = JournalStore(root, fsync=FsyncPolicy.NEVER)
    assert store.ids() == []
    store.open("b").append("item", b"{}")  # a journal without a record is not listed
    store.write_record("c", b"{}")
    store.write_record("a", b"{}")
    assert store.ids() == ["a", "c"]
    assert store.exists("a") and not store.exists("b") and not store.exists("zz")
    assert store.read_record("zz") is None

    j = store.open("a")
    j.append("item", b"{}")
    store.remove("a")
    store.remove("a")  # idempotent
    assert not (root / "a").exists()
    assert store.ids() == ["c"] and not store.exists("a")
    with pytest.raises(trio.ClosedResourceError):
        j.append("item", b"{}")
    assert store.open("a").last_seq == 0  # a new conversation under the same id starts over
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []


def test_store_caches_journals_and_rejects_unsafe_ids(store: JournalStore) -> None:
    assert store.open("c1") is store.open("c1")
    for bad in ("", "..", ".hidden", "a/b", "../x"):
        with pytest.raises(journal_mod.Invalid):
            store.open(bad)
        assert not store.exists(bad)


def test_lines_longer_than_many_read_chunks_are_read_back_whole_from_any_point(tmp_path: pathlib.Path) -> None:
    # A long line spans many reads (16 KiB growing to 1 MiB): it is joined once its end comes
    # (copying the start again per read was quadratic: 1.6 s for one 64 MB line, minutes for 800 MB).
    import random

    rnd = random.Random(5)
    j = Journal(tmp_path / "events.jsonl", fsync=FsyncPolicy.NEVER)
    sizes = [rnd.choice([0, 10, 16_000, 70_000, 1_100_000, 3_500_000]) for _ in range(40)]
    for n, size in enumerate(sizes):
        j.append("item", msgspec.json.encode({"n": n, "text": "x" * size}))
    whole = j.read_after(0)
    assert [msgspec.json.decode(decode_record(line).data)["n"] for line in whole] == list(range(40))
    assert [len(msgspec.json.decode(decode_record(line).data)["text"]) for line in whole] == sizes
    for after in (0, 1, 7, 20, 39):
        for limit in (None, 1, 3):
            got = j.read_after(after, limit=limit)
            assert got == whole[after:after + limit if limit else None]
