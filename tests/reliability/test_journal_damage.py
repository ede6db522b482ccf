"""Torn and corrupt journals: cut and logged, or reported with the line; never rewritten; the daemon serves on."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import msgspec

from agentd import contract as c
from agentd import wire
from daemon_harness import Client, Daemon

from .conftest import WAIT, fast_daemon, log_events, new, run_turn, turn_state, wait_for


def _record_on_disk(d: Daemon, cid: str) -> dict:
    return json.loads((d.state_dir / "conversations" / cid / "record.json").read_bytes())


def _journal_path(d: Daemon, cid: str) -> Path:
    return d.state_dir / "conversations" / cid / "events.jsonl"


def _replay(client: Client, cid: str, after: int = 0) -> tuple[list[bytes], list[object]]:
    """Subscribe from ``after``: raw records until the snapshot (or an error frame), and the other frames."""
    sub = client.subscribe(cid, after=after)
    records: list[bytes] = []
    others: list[object] = []
    for frame in client.frames(timeout=10):
        if isinstance(frame, wire.EventFrame) and frame.sub == sub:
            records.append(bytes(frame.record))
        else:
            others.append(frame)
            if isinstance(frame, (wire.SnapshotFrame, wire.ErrorFrame)):
                break
    return records, others


def _refusals(d: Daemon) -> list[dict[str, object]]:
    return [e for e in log_events(d) if e.get("event") == "journal.refused"]


def _finished_conversation(tmp_path: Path, turns: int = 2) -> tuple[Daemon, str, Path]:
    d = fast_daemon(tmp_path).start()
    work = tmp_path / "work"
    work.mkdir()
    with d.client() as client:
        cid = new(client, work)
        client.subscribe(cid)
        for n in range(turns):
            run_turn(client, cid, f"turn {n}")
    d.stop()
    return d, cid, _journal_path(d, cid)


def test_a_torn_last_line_is_cut_and_logged_and_the_conversation_goes_on(tmp_path: Path) -> None:
    d, cid, path = _finished_conversation(tmp_path)
    intact = path.read_bytes()
    path.write_bytes(intact + b'{"type":"item","ts":"2026-01-01T00:00:00.000Z","data":{"id":"x","ki')
    d.start()
    try:
        with d.client() as client:
            records, others = _replay(client, cid)
            assert isinstance(others[-1], wire.SnapshotFrame)
            n = intact.count(b"\n")
            assert b"".join(r + b"\n" for r in records[:n]) == intact  # every whole record, as written
            assert {msgspec.json.decode(r)["type"] for r in records[n:]} <= {"lease"}  # at most a lease record
            cuts = [e for e in log_events(d) if e.get("event") == "journal.torn_tail_cut"]
            assert len(cuts) == 1 and cuts[0]["path"] == str(path) and cuts[0]["bytes"] > 0
            assert path.read_bytes().startswith(intact)
            # The conversation takes a new prompt; seq goes on from the last whole record.
            client.subscribe(cid, after=len(records))
            new_records = run_turn(client, cid, "after the tear")
            assert turn_state(new_records[-1]) == "completed"
        seqs = [r["seq"] for r in d.journal(cid)]
        assert seqs == list(range(1, len(seqs) + 1))
    finally:
        d.stop()


def test_a_torn_tail_under_an_interrupted_turn_is_cut_before_recovery_appends(tmp_path: Path) -> None:
    d = fast_daemon(tmp_path).start()
    work = tmp_path / "work"
    work.mkdir()
    with d.client() as client:
        cid = new(client, work, WAIT)
        run = client.request(wire.Send, conversation=cid, text="wait")["run"]
        wait_for(lambda: any(r["type"] == "turn" for r in d.journal(cid)))
    d.kill()
    path = _journal_path(d, cid)
    intact = path.read_bytes()
    path.write_bytes(intact + b'{"type":"ite')
    d.start()
    try:
        journal = d.journal(cid)  # every line parses: the tear was cut before anything was appended
        assert path.read_bytes().startswith(intact)
        assert [r["seq"] for r in journal] == list(range(1, len(journal) + 1))
        ends = [r for r in journal if r["type"] == "turn" and r.get("run") == run and r["data"]["state"] != "working"]
        assert [e["data"]["reason"] for e in ends] == [c.RUN_INTERRUPTED]
    finally:
        d.stop()


def test_garbage_mid_journal_is_reported_with_its_line_and_the_records_before_it_are_served(tmp_path: Path) -> None:
    d, cid, path = _finished_conversation(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    bad = 5
    lines[bad - 1] = b"\x00\x00garbage from a bad disk block\n"
    damaged = b"".join(lines)
    path.write_bytes(damaged)
    d.start()
    try:
        with d.client() as client, d.client() as other:
            records, others = _replay(client, cid)
            assert b"".join(r + b"\n" for r in records) == b"".join(lines[: bad - 1])  # readable up to it
            err = others[-1]
            assert isinstance(err, wire.ErrorFrame) and err.id is not None
            assert f"line {bad}" in err.error.message and err.error.details["line"] == bad
            # The records after the damaged line are still there for whoever asks past it.
            after, others = _replay(client, cid, after=bad)
            assert isinstance(others[-1], wire.SnapshotFrame)
            seqs = [msgspec.json.decode(r)["seq"] for r in after]
            assert seqs[: len(lines) - bad] == list(range(bad + 1, len(lines) + 1))  # the rest (and maybe a lease record)
            # The daemon keeps serving, this conversation and the others.
            assert other.request(wire.Status)["conversations"] == 1
            work = tmp_path / "work"
            cid2 = new(other, work)
            other.subscribe(cid2)
            assert turn_state(run_turn(other, cid2, "still here")[-1]) == "completed"
        reported = [e for e in log_events(d) if e.get("event") == "journal.corrupt"]
        assert reported and reported[0]["line"] == bad
        assert path.read_bytes().startswith(damaged)  # no silent rewrite of history (the lease record follows)
    finally:
        d.stop()


def test_a_garbage_last_line_does_not_stop_the_daemon_from_starting_or_serving(tmp_path: Path) -> None:
    d = fast_daemon(tmp_path).start()
    work = tmp_path / "work"
    work.mkdir()
    with d.client() as client:
        healthy = new(client, work)
        cid = new(client, work, WAIT)
        client.request(wire.Send, conversation=cid, text="wait")
        wait_for(lambda: any(r["type"] == "turn" for r in d.journal(cid)))
    d.kill()
    path = _journal_path(d, cid)
    damaged = path.read_bytes() + b"not a record at all\n"
    path.write_bytes(damaged)
    n_lines = damaged.count(b"\n")
    d.start()  # recovery of the damaged conversation fails; the daemon starts anyway
    try:
        failed = [e for e in log_events(d) if e.get("event") == "turn.recovery_failed"]
        assert failed and failed[0]["conversation"] == cid and f"line {n_lines}" in failed[0]["error"]
        with d.client() as client:
            try:
                client.subscribe(cid)
            except c.AgentdError as exc:
                assert f"line {n_lines}" in exc.message
            else:  # pragma: no cover
                raise AssertionError("a damaged journal was served without an error")
            client.subscribe(healthy)
            assert turn_state(run_turn(client, healthy, "fine")[-1]) == "completed"
        assert path.read_bytes() == damaged
    finally:
        d.stop()


def test_a_fifo_where_a_journal_or_a_runtime_record_belongs_is_refused_and_the_daemon_serves_on(
    tmp_path: Path,
) -> None:
    d, cid, path = _finished_conversation(tmp_path, turns=1)
    with d.start().client() as client:
        healthy = new(client, tmp_path / "work")
    d.stop()
    path.unlink()
    os.mkfifo(path, 0o600)  # nobody writes it: a blocking open or read waits for ever
    record = d.state_dir / "runtimes" / "4242.json"
    os.mkfifo(record, 0o600)  # read at start, before any runtime of ours
    started = time.monotonic()
    d.start()
    try:
        assert time.monotonic() - started < 10
        with d.client() as client:
            for op, fields in ((wire.Subscribe, {"conversation": cid}), (wire.Send, {"conversation": cid, "text": "x"})):
                try:
                    client.request(op, **fields)
                except c.AgentdError as exc:
                    assert f"the journal {path} is a FIFO, not a regular file" in exc.message, exc.message
                else:  # pragma: no cover
                    raise AssertionError(f"{op.__name__} of a conversation whose journal is a FIFO succeeded")
            client.subscribe(healthy)
            assert turn_state(run_turn(client, healthy, "fine")[-1]) == "completed"
        assert stat.S_ISFIFO(path.lstat().st_mode)  # left where it is
        assert not record.exists()  # agentd's own runtime records: an unreadable one is dropped
    finally:
        assert d.stop() == 0


def test_a_symlink_planted_where_a_journal_belongs_is_refused_by_name_at_start_and_on_request(tmp_path: Path) -> None:
    # Another user or the agent swaps a conversation's journal for a symlink to a file of theirs
    # (or one of the owner's): agentd never follows it, says so in one warning line, serves the rest.
    d = fast_daemon(tmp_path).start()
    work = tmp_path / "work"
    work.mkdir()
    with d.client() as client:
        healthy = new(client, work)
        done = new(client, work)
        client.subscribe(done)
        run_turn(client, done, "finished")
        later = new(client, work)
        client.subscribe(later)
        run_turn(client, later, "finished too")
        # Its record saved (a turn's end is written behind): nothing sends recovery to its journal.
        wait_for(lambda: _record_on_disk(d, later).get("journal_seq") == len(d.journal(later)))
        stuck = new(client, work, WAIT)
        client.request(wire.Send, conversation=stuck, text="wait")
        wait_for(lambda: any(r["type"] == "turn" for r in d.journal(stuck)))
    d.kill()  # no records index: start-up reads every record, and recovery opens the stuck journal
    outside = tmp_path / "outside.jsonl"
    planted = b'{"type":"item","seq":1}\nsomeone else\'s file\n'
    outside.write_bytes(planted)
    paths = {cid: _journal_path(d, cid) for cid in (done, stuck)}
    for path in paths.values():
        path.unlink()
        path.symlink_to(outside)
    d.start()
    try:
        # Recovery meets both (the stuck one has a run to end): one warning line each.
        refused = wait_for(lambda: len(_refusals(d)) >= 2 and _refusals(d))
        assert sorted(e["conversation"] for e in refused) == sorted(paths)
        assert all(e["level"] == "warning" and e["path"] == str(paths[e["conversation"]]) for e in refused)
        # While agentd runs: planted in a conversation nobody has asked for since the start.
        paths[later] = _journal_path(d, later)
        paths[later].unlink()
        paths[later].symlink_to(outside)
        for cid, path in paths.items():
            why = f"refused: the journal {path} is a symlink (to {outside}), which agentd does not follow"
            for args in (("show", cid), ("tail", cid, "--no-follow"), ("send", cid, "hello")):
                out = d.agentctl(*args)
                assert out.returncode == 1, (args, out.returncode, out.stderr)  # docs/cli.md: an error without a code of its own
                assert why in out.stderr, (args, out.stderr)
        with d.client() as client:
            try:
                client.subscribe(done)
            except c.Refused as exc:
                assert exc.code == "refused" and exc.details["path"] == str(paths[done])
            else:  # pragma: no cover
                raise AssertionError("a journal that is a symlink was served")
            client.subscribe(healthy)
            assert turn_state(run_turn(client, healthy, "still fine")[-1]) == "completed"
        assert outside.read_bytes() == planted  # never written through, never truncated
        assert all(p.is_symlink() for p in paths.values())  # left where it is, for the owner to look at
        events = log_events(d)
        assert not [e for e in events if e.get("event") in ("server.request_failed", "turn.recovery_failed")]
        assert not [e for e in events if "exception" in e or "Traceback" in str(e)]
        assert len(_refusals(d)) >= 2 + 3 * 3
    finally:
        assert d.stop() == 0


def test_a_symlink_planted_where_a_conversation_record_belongs_is_refused_by_name(tmp_path: Path) -> None:
    d = fast_daemon(tmp_path).start()
    work = tmp_path / "work"
    work.mkdir()
    with d.client() as client:
        healthy = new(client, work)
        cid = new(client, work)
    d.kill()  # no records index: start-up reads every record.json
    path = d.state_dir / "conversations" / cid / "record.json"
    outside = tmp_path / "outside.json"
    outside.write_bytes(path.read_bytes())  # a valid record: following it would serve another's file
    planted = outside.read_bytes()
    path.unlink()
    path.symlink_to(outside)
    d.start()
    try:
        why = f"refused: the record {path} is a symlink (to {outside}), which agentd does not follow"
        for args in (("show", cid), ("tail", cid, "--no-follow"), ("send", cid, "hello")):
            out = d.agentctl(*args)
            assert out.returncode == 1 and why in out.stderr, (args, out.returncode, out.stderr)
        with d.client() as client:
            client.subscribe(healthy)
            assert turn_state(run_turn(client, healthy, "still fine")[-1]) == "completed"
        assert outside.read_bytes() == planted and path.is_symlink()
        events = log_events(d)
        refused = _refusals(d)
        assert len(refused) == 1 and refused[0]["level"] == "warning" and refused[0]["path"] == str(path)
        assert not [e for e in events if e.get("event") == "server.request_failed" or "exception" in e]
    finally:
        assert d.stop() == 0
