"""A full disk, a read-only state dir, a failing fsync: the turn fails with the reason,
the journal stays valid, the daemon keeps serving reads and recovers when the disk does.

The disk is real where root allows it: a small tmpfs mounted over the state dir's
``conversations`` (the journals and records), a read-only bind mount over it.
The failing fsync is injected in-process (no file system fails fsync on demand).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import trio

from agentd import contract as c
from agentd import wire
from agentd.config import parse_config
from agentd.conversations import JOURNAL_WRITE_FAILED, ConversationService
from agentd.hub import Hub, Subscription
from agentd.journal import FsyncPolicy, Journal
from agentd.store.file import FileLeases, FileStore
from agentd.leases import FileLeaseStore
from agentd.runtimes import Runtimes
from daemon_harness import Daemon
from environment import unavailable
from inprocess import RecordingOutbox

from .conftest import ECHO, FAST, SCRIPTS, fast_daemon, log_events, new, run_turn, turn_state, wait_for
from .figures import FAULTS

LONG = SCRIPTS / "long.toml"


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """``<tmp>/state/conversations`` on a 3 MB tmpfs; skips where mounting is not allowed."""
    conv = tmp_path / "state" / "conversations"
    conv.mkdir(parents=True)
    try:
        _mount("-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(conv))
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        unavailable(f"cannot mount a tmpfs here: {exc}")
    try:
        yield conv
    finally:
        _umount(conv)


def _fill(directory: Path) -> Path:
    """Fill the file system of ``directory`` to the last byte; returns the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 16, 1 << 10, 1):  # big blocks, then the last partial page
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def _check_journal(d: Daemon, cid: str) -> list[dict]:
    journal = d.journal(cid)  # every line parses
    assert [r["seq"] for r in journal] == list(range(1, len(journal) + 1)), "gap or duplicate"
    raw = (d.state_dir / "conversations" / cid / "events.jsonl").read_bytes()
    assert raw.endswith(b"\n"), "a torn line was left behind"
    return journal


def test_a_disk_filling_up_mid_turn_fails_the_turn_with_the_reason_and_reads_go_on(
    tmp_path: Path, small_disk: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    d = fast_daemon(tmp_path).start()
    try:
        with d.client() as client, d.client() as reader:
            other = new(client, work, ECHO)
            client.subscribe(other)
            run_turn(client, other, "before the disk fills")
            cid = new(client, work, LONG)
            client.subscribe(cid)
            run = client.request(wire.Send, conversation=cid, text="a long turn")["run"]
            wait_for(lambda: len(d.journal(cid)) > 8)
            filler = _fill(small_disk)
            FAULTS["disk full mid-turn"] += 1
            records = client.follow(run, timeout=20)
            end = msgspec.json.decode(records[-1].data)
            assert end["state"] == "failed" and end["reason"] == JOURNAL_WRITE_FAILED
            assert "No space left on device" in end["error"]
            # The journal is valid; the daemon serves reads of every conversation.
            _check_journal(d, cid)
            assert reader.request(wire.Show, conversation=cid)["record"].get("state", "idle") == "idle"
            sub = reader.subscribe(other, after=0)
            replay = []
            for frame in reader.frames(timeout=5):
                if isinstance(frame, wire.SnapshotFrame):
                    break
                assert isinstance(frame, wire.EventFrame) and frame.sub == sub
                replay.append(msgspec.json.decode(frame.record)["seq"])
            assert replay == [r["seq"] for r in d.journal(other)]
            # A new turn while the disk is full: refused with the reason, nothing half-done.
            with pytest.raises(c.InternalError, match="No space left on device"):
                client.request(wire.Send, conversation=cid, text="while full")
            assert reader.request(wire.Show, conversation=cid)["record"].get("state", "idle") == "idle"
            assert reader.request(wire.Status)["running"] == 0
            # Space comes back: so does the conversation.
            filler.unlink()
            assert turn_state(run_turn(client, cid, "after")[-1]) in ("completed", "failed")
            journal = _check_journal(d, cid)
            assert journal[-1]["type"] == "turn"
        events = [e for e in log_events(d) if e.get("conversation") == cid]
        failures = [e for e in events if e.get("event") == "journal.write_failed"]
        assert 1 <= len(failures) <= 3, "a full disk must not flood the log"
        assert any(e.get("event") == "turn.failing" and e.get("reason") == JOURNAL_WRITE_FAILED for e in events)
    finally:
        d.stop()


def test_a_full_disk_refuses_new_conversations_with_the_reason_and_leaves_nothing_behind(
    tmp_path: Path, small_disk: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    d = fast_daemon(tmp_path).start()
    try:
        with d.client() as client:
            filler = _fill(small_disk)
            FAULTS["disk full at create"] += 1
            with pytest.raises(c.InternalError, match="No space left on device"):
                new(client, work, ECHO)
            assert client.request(wire.List) == []
            filler.unlink()
            cid = new(client, work, ECHO)
            client.subscribe(cid)
            assert turn_state(run_turn(client, cid, "room again")[-1]) == "completed"
        # (dot names are not conversations: the leases' heartbeat lives in one)
        assert sorted(p.name for p in small_disk.iterdir() if not p.name.startswith(".")) == [cid]
    finally:
        d.stop()


def test_a_read_only_state_dir_refuses_turns_with_the_reason_and_serves_reads(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    d = fast_daemon(tmp_path).start()
    with d.client() as client:
        cids = [new(client, work, ECHO) for _ in range(2)]
        for cid in cids:
            client.subscribe(cid)
            run_turn(client, cid, "hello")
    d.stop()
    d.start()  # nothing loaded yet: opening the journals meets the read-only file system
    conv_dir = d.state_dir / "conversations"
    try:
        _mount("--bind", str(conv_dir), str(conv_dir))
        _mount("-o", "remount,bind,ro", str(conv_dir))
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        d.stop()
        unavailable(f"cannot bind-mount read-only here: {exc}")
    FAULTS["read-only state dir"] += 1
    try:
        before = {cid: d.journal(cid) for cid in cids}
        with d.client() as client:
            with pytest.raises(c.InternalError, match="Read-only file system"):
                client.request(wire.Send, conversation=cids[0], text="while read-only")
            with pytest.raises(c.InternalError, match="Read-only file system"):
                new(client, work, ECHO)
            # Reads: every record of a conversation never opened for writing.
            sub = client.subscribe(cids[1], after=0)
            seqs = []
            for frame in client.frames(timeout=5):
                if isinstance(frame, wire.SnapshotFrame):
                    break
                assert isinstance(frame, wire.EventFrame) and frame.sub == sub
                seqs.append(msgspec.json.decode(frame.record)["seq"])
            assert seqs == [r["seq"] for r in before[cids[1]]]
            assert client.request(wire.Show, conversation=cids[0])["record"].get("state", "idle") == "idle"
            assert [r["id"] for r in client.request(wire.List)] == sorted(cids, key=lambda x: cids.index(x))
        _umount(conv_dir)
        with d.client() as client:
            for cid in cids:
                client.subscribe(cid, after=len(before[cid]))
                assert turn_state(run_turn(client, cid, "writable again")[-1]) == "completed"
        for cid in cids:
            journal = _check_journal(d, cid)
            assert journal[: len(before[cid])] == before[cid]
        assert any(e.get("event") == "lease.acquire_failed" for e in log_events(d))
    finally:
        _umount(conv_dir)
        d.stop()


# --------------------------------------------------------------------------- injected fsync failure


async def test_a_failing_fsync_fails_the_turn_not_the_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync ``batch``: JournalStore.run() used to raise and take the daemon down with it."""
    work = tmp_path / "work"
    work.mkdir()
    config = parse_config(FAST)
    root = tmp_path / "state" / "conversations"
    store = FileStore(root, fsync=FsyncPolicy.BATCH, batch_ms=1)
    leases = FileLeases(FileLeaseStore(root, owner="test", ttl_s=30))
    hub = Hub()
    runtimes = Runtimes(config, tmp_path / "state")
    service = ConversationService(store=store, leases=leases, runtimes=runtimes, hub=hub, fsync=FsyncPolicy.BATCH,
                                  owner="test")
    real_fsync = os.fsync
    failing: set[int] = set()

    def fsync(fd: int) -> None:
        if os.fstat(fd).st_ino in failing:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await nursery.start(runtimes.run)
        await nursery.start(service.run)
        record = await service.create(provider="script", workdir=str(work), model=str(LONG))
        bystander = await service.create(provider="script", workdir=str(work), model=str(ECHO))
        outbox = RecordingOutbox()
        sub = Subscription(1, record.id, outbox)
        sub.live = True
        hub.add(sub)
        sent = await service.send(record.id, "go")
        with trio.fail_after(10):
            while len(outbox.records) < 6:
                await trio.sleep(0.01)
        failing.add(os.stat(root / record.id / "events.jsonl").st_ino)
        FAULTS["fsync error"] += 1
        with trio.fail_after(15):
            while not any(r.type == "turn" and r.run == sent.run and turn_state(r) != "working"
                          for r in outbox.records):
                await trio.sleep(0.01)
        end = [msgspec.json.decode(r.data) for r in outbox.records if r.type == "turn" and r.run == sent.run][-1]
        assert end["state"] == "failed" and end["reason"] == JOURNAL_WRITE_FAILED
        assert "could not be synced" in end["error"] and "Input/output error" in end["error"]
        # The store's task is still running (it used to raise), and the other conversation writes on.
        sent2 = await service.send(bystander.id, "still fine")
        with trio.fail_after(10):
            while service.record(bystander.id).active_run:
                await trio.sleep(0.01)
        assert not service.record(bystander.id).error
        # The failed journal refuses appends with the reason, and is still read.
        with pytest.raises(c.InternalError, match="could not be synced"):
            await service.send(record.id, "again")
        live = await service.live(record.id)
        assert await live.journal.read_after(0, limit=3)
        failing.clear()
        nursery.cancel_scope.cancel()
    await store.aclose()
    # Reopened (a daemon restart), every line is a record and the seq runs on.
    j = Journal(root / record.id / "events.jsonl")
    lines = j.read_after(0)
    assert [json.loads(x)["seq"] for x in lines] == list(range(1, j.last_seq + 1))
    j.close()
    assert sent2.run
