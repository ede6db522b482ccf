"""Conversations, turns, subscriptions and interactions through the real daemon."""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgspec
import pytest

from agentd import contract as c
from agentd import wire
from daemon_harness import Client, Daemon

from .conftest import SCRIPTS

SLOW = Path(__file__).resolve().parents[2] / "conf" / "scripts" / "slow.toml"
WAIT = Path(__file__).resolve().parents[2] / "conf" / "scripts" / "wait.toml"


def new(client: Client, workdir: Path, script: Path | str, **kw) -> str:
    return client.request(wire.New, provider="script", workdir=str(workdir), model=str(script), **kw)["id"]


def durable_seqs(records: list[wire.Record]) -> list[int]:
    return [r.seq for r in records if r.seq]


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met")


def test_turn_is_journaled_before_it_is_published_and_ends_completed(daemon: Daemon, workdir: Path) -> None:
    with daemon.client() as client:
        cid = new(client, workdir, SCRIPTS / "steps.toml")
        client.subscribe(cid)
        run = client.request(wire.Send, conversation=cid, text="go")["run"]
        records = client.follow(run)
    journal = daemon.journal(cid)
    on_disk = [r["seq"] for r in journal]
    assert on_disk == list(range(1, len(on_disk) + 1))
    seen = durable_seqs(records)
    assert seen == on_disk  # every durable record, in order, once
    assert any(r.type == "delta" and r.seq == 0 for r in records)  # deltas live only
    assert not any(r["type"] == "delta" for r in journal)
    assert journal[-1]["type"] == "turn" and journal[-1]["data"]["state"] == "completed"
    assert [r["type"] for r in journal if r.get("run") == run][0] == "prompt"
    # The record is saved right after the end was sent (see ConversationService._save_after_end).
    wait_for(lambda: daemon.record(cid).get("active_run", "") == "")


def test_subscriber_joining_mid_turn_sees_each_durable_event_once_then_the_snapshot(
    daemon: Daemon, workdir: Path
) -> None:
    with daemon.client() as a, daemon.client() as b:
        cid = new(a, workdir, SCRIPTS / "steps.toml")
        run = a.request(wire.Send, conversation=cid, text="go")["run"]
        time.sleep(0.5)  # the turn is well under way
        sub = b.subscribe(cid, after=0)
        frames = []
        for frame in b.frames(timeout=20):
            frames.append(frame)
            if isinstance(frame, wire.EventFrame):
                rec = wire.decode_record(frame.record)
                if rec.type == "turn" and rec.run == run and msgspec.json.decode(rec.data)["state"] != "working":
                    break
    events = [wire.decode_record(f.record) for f in frames if isinstance(f, wire.EventFrame)]
    seqs = durable_seqs(events)
    assert seqs == list(range(1, seqs[-1] + 1)), "gap or duplicate"
    assert seqs == [r["seq"] for r in daemon.journal(cid)]
    snaps = [i for i, f in enumerate(frames) if isinstance(f, wire.SnapshotFrame)]
    assert len(snaps) == 1
    snap = frames[snaps[0]].snapshot
    before = [wire.decode_record(f.record).seq for f in frames[: snaps[0]] if isinstance(f, wire.EventFrame)]
    after = [wire.decode_record(f.record).seq for f in frames[snaps[0] :] if isinstance(f, wire.EventFrame)]
    assert snap.last_seq == max(before)  # the snapshot follows the replay ...
    assert all(s == 0 or s > snap.last_seq for s in after)  # ... and precedes everything live
    assert snap.run == run and snap.state in ("running", "requires_action")
    assert all(f.sub == sub for f in frames if hasattr(f, "sub"))


def test_replay_after_a_seq_starts_right_after_it(daemon: Daemon, workdir: Path) -> None:
    with daemon.client() as client:
        cid = new(client, workdir, SCRIPTS / "steps.toml")
        client.subscribe(cid)
        run = client.request(wire.Send, conversation=cid, text="go")["run"]
        total = durable_seqs(client.follow(run))[-1]
    with daemon.client() as client:
        client.subscribe(cid, after=total - 5)
        got = []
        for frame in client.frames(timeout=5):
            if isinstance(frame, wire.SnapshotFrame):
                break
            got.append(wire.decode_record(frame.record).seq)
    assert got == list(range(total - 4, total + 1))


def test_slow_subscriber_gets_lagged_while_another_keeps_receiving(tmp_path: Path, workdir: Path) -> None:
    # ~3 MB of deltas, 6000 frames: far more than the socket buffer plus a 1024-frame outbox, so the
    # slow one (never reading) is cut off. The fast one reads, but it is a Python test process:
    # under load it can stall for a few hundred ms (a full GC, the scheduler) while the daemon
    # goes on at a frame a ms. With a 16-frame outbox that was enough to cut the fast one off too
    # (about 0.25 s of stall); 1024 frames lets it stall for a second or more.
    flood = tmp_path / "flood.toml"
    flood.write_text('model = "flood"\n[[turn]]\n[[turn.step]]\nkind = "text"\nchunk = 500\ndelay_ms = 1\n'
                     f'text = "{"x" * 3_000_000}"\n')
    d = Daemon(tmp_path, "[server]\nsubscriber_buffer = 1024\n").start()
    try:
        with d.client() as fast, d.client() as slow:
            cid = new(fast, workdir, flood)
            slow_sub = slow.subscribe(cid)
            fast.subscribe(cid)
            t0 = time.monotonic()
            run = fast.request(wire.Send, conversation=cid, text="go")["run"]
            records = fast.follow(run, timeout=60)
            elapsed = time.monotonic() - t0
            assert records[-1].type == "turn"
            # The slow one only reads now: what it got, then `lagged` telling where to resume.
            lagged = None
            seen: list[int] = []
            for frame in slow.frames(timeout=5):
                if isinstance(frame, wire.LaggedFrame):
                    lagged = frame
                    break
                if isinstance(frame, wire.EventFrame):
                    seq = wire.decode_record(frame.record).seq
                    if seq:
                        seen.append(seq)
            assert lagged is not None and lagged.sub == slow_sub
            assert lagged.resume_after == (seen[-1] if seen else 0)
            # Resubscribing from there fills the gap exactly.
            slow.subscribe(cid, after=lagged.resume_after)
            for frame in slow.frames(timeout=5):
                if isinstance(frame, wire.SnapshotFrame):
                    break
                if isinstance(frame, wire.EventFrame):
                    seq = wire.decode_record(frame.record).seq
                    if seq:
                        seen.append(seq)
        assert seen == [r["seq"] for r in d.journal(cid)]
        assert elapsed < 30, f"the daemon was held up by the slow client ({elapsed:.1f}s)"
    finally:
        d.stop()


def test_busy_send_follows_if_busy(daemon: Daemon, workdir: Path) -> None:
    with daemon.client() as client:
        cid = new(client, workdir, WAIT)
        first = client.request(wire.Send, conversation=cid, text="one")["run"]
        with pytest.raises(c.Busy):
            client.request(wire.Send, conversation=cid, text="two", if_busy="reject")
        queued = client.request(wire.Send, conversation=cid, text="three", if_busy="queue")
        assert queued["disposition"] == "queued"
        assert client.request(wire.Show, conversation=cid)["queued"] == 1
        interrupted = client.request(wire.Send, conversation=cid, text="four", if_busy="interrupt")
        assert interrupted["disposition"] == "interrupted"
        # The interrupting prompt runs next; the queued one still waits behind it.
        show = client.request(wire.Show, conversation=cid)
        assert show["record"]["active_run"] == interrupted["run"]
        assert show["queued"] == 1
    journal = daemon.journal(cid)
    ends = {r["run"]: r["data"]["state"] for r in journal if r["type"] == "turn" and r["data"]["state"] != "working"}
    assert ends[first] == "cancelled"
    prompts = [r["data"]["text"] for r in journal if r["type"] == "prompt"]
    assert prompts == ["one", "three", "four"]


def test_steer_reaches_the_running_turn(daemon: Daemon, workdir: Path) -> None:
    with daemon.client() as client:
        cid = new(client, workdir, WAIT)
        client.subscribe(cid)
        run = client.request(wire.Send, conversation=cid, text="please steer me")["run"]
        steered = client.request(wire.Steer, conversation=cid, text="left")
        assert steered["run"] == run
        records = client.follow(run)
    texts = [msgspec.json.decode(r.data)["text"] for r in records if r.type == "item"]
    assert "Steered: left" in texts
    assert records[-1].type == "turn" and msgspec.json.decode(records[-1].data)["state"] == "completed"


def test_cancel_ends_the_turn_cancelled_quickly_and_the_conversation_goes_on(daemon: Daemon, workdir: Path) -> None:
    with daemon.client() as client:
        cid = new(client, workdir, WAIT)
        client.subscribe(cid)
        run = client.request(wire.Send, conversation=cid, text="wait")["run"]
        time.sleep(0.2)
        t0 = time.monotonic()
        client.request(wire.Cancel, conversation=cid)
        records = client.follow(run, timeout=5)
        assert time.monotonic() - t0 < 1.0
        assert msgspec.json.decode(records[-1].data)["state"] == "cancelled"
        run2 = client.request(wire.Send, conversation=cid, text="again")["run"]
        assert run2 != run


def test_answers_from_another_client_and_invalid_answers_are_refused(daemon: Daemon, workdir: Path) -> None:
    with daemon.client() as watcher, daemon.client() as answerer:
        cid = new(watcher, workdir, SCRIPTS / "ask.toml")
        watcher.subscribe(cid)
        run = watcher.request(wire.Send, conversation=cid, text="go")["run"]
        perm = wait_for(lambda: answerer.request(wire.Show, conversation=cid).get("pending"))[0]
        assert perm["kind"] == "permission"
        assert answerer.request(wire.Show, conversation=cid)["record"]["state"] == "requires_action"
        with pytest.raises(c.Invalid):
            answerer.request(wire.AnswerInteraction, conversation=cid, interaction=perm["id"],
                             answer={"decision": "maybe"})
        answerer.request(wire.AnswerInteraction, conversation=cid, interaction=perm["id"],
                         answer={"decision": "allow_once"})
        with pytest.raises(c.InteractionGone):
            answerer.request(wire.AnswerInteraction, conversation=cid, interaction=perm["id"],
                             answer={"decision": "allow_once"})
        question = wait_for(lambda: answerer.request(wire.Show, conversation=cid).get("pending"))[0]
        with pytest.raises(c.Invalid):
            answerer.request(wire.AnswerInteraction, conversation=cid, interaction=question["id"],
                             answer={"answers": [["red", "blue"]]})
        answerer.request(wire.AnswerInteraction, conversation=cid, interaction=question["id"][:6],
                         answer={"answers": [["teal"]]})
        records = watcher.follow(run)
    assert (workdir / "ran.txt").read_text() == "ran\n"
    answers = [msgspec.json.decode(r.data) for r in records if r.type == "answer"]
    assert [a.get("auto", False) for a in answers] == [False, False]
    assert all(a["by"].startswith("pid ") for a in answers), answers
    assert any("teal" in msgspec.json.decode(r.data).get("text", "") for r in records if r.type == "item")
    # Each answer (who gave it) is journaled before the provider's resolution of its interaction,
    # though the provider resolves it while agentd hands the answer over (the script provider
    # then yields, and trio may run the pump first).
    order = [(r.type, msgspec.json.decode(r.data).get("interaction_id") or msgspec.json.decode(r.data).get("id"))
             for r in records if r.type == "answer" or (r.type == "interaction"
                                                        and msgspec.json.decode(r.data).get("state", "pending") != "pending")]
    assert order == [("answer", perm["id"]), ("interaction", perm["id"]),
                     ("answer", question["id"]), ("interaction", question["id"])], order


def test_yolo_answers_permissions_allow_once_and_the_journal_says_so(daemon: Daemon, workdir: Path) -> None:
    with daemon.client() as client:
        cid = new(client, workdir, SCRIPTS / "perm.toml", mode="yolo")
        client.subscribe(cid)
        run = client.request(wire.Send, conversation=cid, text="go")["run"]
        records = client.follow(run)
    assert (workdir / "ran.txt").exists()
    answers = [msgspec.json.decode(r.data) for r in records if r.type == "answer"]
    assert answers == [{"interaction_id": answers[0]["interaction_id"], "answer": {"decision": "allow_once"},
                        "auto": True, "by": "yolo"}]
    asked = [msgspec.json.decode(r.data) for r in records if r.type == "interaction"]
    assert asked[0]["auto"] is True


def test_yolo_never_answers_questions(daemon: Daemon, workdir: Path) -> None:
    with daemon.client() as client:
        cid = new(client, workdir, SCRIPTS / "ask.toml", mode="yolo")
        client.request(wire.Send, conversation=cid, text="go")
        pending = wait_for(
            lambda: [p for p in client.request(wire.Show, conversation=cid).get("pending", []) if p["kind"] == "question"]
        )
        time.sleep(0.3)
        assert client.request(wire.Show, conversation=cid).get("pending", []) == pending  # still waiting for a person


def test_pending_interaction_expires_by_policy_and_is_denied(tmp_path: Path, workdir: Path) -> None:
    d = Daemon(tmp_path, "[interactions]\ntimeout_s = 0.5\n").start()
    try:
        with d.client() as client:
            cid = new(client, workdir, SCRIPTS / "perm.toml")
            client.subscribe(cid)
            run = client.request(wire.Send, conversation=cid, text="go")["run"]
            records = client.follow(run)
        answers = [msgspec.json.decode(r.data) for r in records if r.type == "answer"]
        assert answers[0]["answer"] == {"decision": "reject"} and answers[0]["by"] == "timeout"
        assert not (workdir / "ran.txt").exists()
    finally:
        d.stop()


def test_conversation_ids_accept_a_unique_prefix(daemon: Daemon, workdir: Path) -> None:
    with daemon.client() as client:
        cid = new(client, workdir, WAIT)
        assert client.request(wire.Show, conversation=cid[:5])["record"]["id"] == cid
        listed = client.request(wire.List)
        assert [r["id"] for r in listed] == [cid]
        client.request(wire.Close, conversation=cid)
        assert client.request(wire.List) == []
        assert [r["id"] for r in client.request(wire.List, all=True)] == [cid]
        with pytest.raises(c.Closed):
            client.request(wire.Send, conversation=cid, text="x")
        client.request(wire.Remove, conversation=cid)
        with pytest.raises(c.NotFound):
            client.request(wire.Show, conversation=cid)
    assert not (daemon.state_dir / "conversations" / cid).exists()


def test_kill_mid_turn_records_run_interrupted_and_never_resends(tmp_path: Path, workdir: Path) -> None:
    d = Daemon(tmp_path).start()
    with d.client() as client:
        cid = new(client, workdir, WAIT)
        run = client.request(wire.Send, conversation=cid, text="wait for me")["run"]
        wait_for(lambda: any(r["type"] == "turn" for r in d.journal(cid)))
    d.kill()
    received = d.state_dir / "providers" / "script" / "received.jsonl"
    before = received.read_text().splitlines()
    d.start()
    try:
        journal = d.journal(cid)
        ends = [r for r in journal if r["type"] == "turn" and r.get("run") == run and r["data"]["state"] != "working"]
        assert len(ends) == 1
        assert ends[0]["data"]["reason"] == c.RUN_INTERRUPTED
        assert any(r["type"] == "lease" and r["data"]["action"] == "taken_over" for r in journal)
        assert d.record(cid).get("active_run", "") == ""
        assert received.read_text().splitlines() == before  # nothing resent
        with d.client() as client:
            client.subscribe(cid, after=journal[-1]["seq"])
            run2 = client.request(wire.Send, conversation=cid, text="steer me then", if_busy="reject")["run"]
            client.request(wire.Cancel, conversation=cid)
            records = client.follow(run2)
        assert msgspec.json.decode(records[-1].data)["state"] == "cancelled"
        prompts = [json.loads(line)["text"] for line in received.read_text().splitlines()]
        assert prompts == ["wait for me", "steer me then"]
    finally:
        d.stop()


def test_a_turn_the_record_does_not_know_is_found_in_the_journal_and_ends_interrupted_once(tmp_path: Path, workdir: Path) -> None:
    # The record is a checkpoint: a turn's start is its prompt record in the journal (issue 18).
    d = Daemon(tmp_path).start()
    with d.client() as client:
        cid = new(client, workdir, WAIT)
        first = client.request(wire.Send, conversation=cid, text="first")["run"]
        wait_for(lambda: any(r["type"] == "turn" and r.get("run") == first for r in d.journal(cid)))
        client.request(wire.Cancel, conversation=cid)
        wait_for(lambda: d.record(cid).get("journal_seq", 0) > 0 and not d.record(cid).get("active_run"))
        run = client.request(wire.Send, conversation=cid, text="wait for me")["run"]
        wait_for(lambda: any(r["type"] == "turn" and r.get("run") == run for r in d.journal(cid)))
    d.kill()
    record = d.record(cid)
    assert not record.get("active_run") and record["journal_seq"] < len(d.journal(cid))
    d.start()
    try:
        ends = [r for r in d.journal(cid) if r["type"] == "turn" and r.get("run") == run and r["data"]["state"] != "working"]
        assert [e["data"]["reason"] for e in ends] == [c.RUN_INTERRUPTED]
        prompts = [r for r in d.journal(cid) if r["type"] == "prompt" and r.get("run") == run]
        assert len(prompts) == 1  # never resent
        after = d.record(cid)
        assert not after.get("active_run") and after.get("state", "idle") == "idle"
    finally:
        d.stop()


def test_turns_that_ended_behind_their_record_are_caught_up_from_the_journal_after_a_kill(
        tmp_path: Path, workdir: Path) -> None:
    # A turn's end does not write the record (agentd.write_behind): after a SIGKILL the record on
    # disk is older than the turns' ends, and recovery brings it up to date from the journal's
    # tail (usage, turn_after, error) without ending any run a second time.
    d = Daemon(tmp_path).start()
    with d.client() as client:
        spent = new(client, workdir, SCRIPTS / "spend.toml")
        failed = new(client, workdir, Path(WAIT).with_name("fail.toml"))
        client.subscribe(spent)
        for text in ("spend one", "spend two"):
            run = client.request(wire.Send, conversation=spent, text=text)["run"]
            client.follow(run)
        client.subscribe(failed)
        boom = client.request(wire.Send, conversation=failed, text="boom")["run"]
        client.follow(boom)
        live = {cid: d.record(cid) for cid in (spent, failed)}  # show: the daemon's own
    d.kill()
    # ``failed`` as a save made mid-turn (a state change) leaves it: its run active, the checkpoint
    # at the prompt. Its end is in the tail; recovery must not end it a second time.
    path = d.state_dir / "conversations" / failed / "record.json"
    lines = (d.state_dir / "conversations" / failed / "events.jsonl").read_bytes().splitlines(keepends=True)
    prompt = next(r["seq"] for r in d.journal(failed) if r["type"] == "prompt" and r["run"] == boom)
    path.write_text(json.dumps({**json.loads(path.read_text()), "active_run": boom, "state": "running",
                                "turn_after": prompt - 1, "journal_seq": prompt,
                                "journal_end": sum(map(len, lines[:prompt]))}))
    for cid in (spent, failed):
        journal = d.journal(cid)
        end = max(r["seq"] for r in journal if r["type"] == "turn" and r["data"]["state"] != "working")
        on_disk = json.loads((d.state_dir / "conversations" / cid / "record.json").read_text())
        assert on_disk["journal_seq"] < end  # the end was not written through
        assert live[cid]["turn_after"] == end
    assert live[spent]["usage"]["cost_usd"] == pytest.approx(0.60)
    assert live[failed]["error"] == "the script says this turn fails"
    d.start()
    try:
        for cid in (spent, failed):
            after = d.record(cid)
            for field in ("usage", "turn_after", "error", "state"):
                assert after.get(field) == live[cid].get(field), (cid, field)
            assert not after.get("active_run") and not after.get("queued")
            ends = [r for r in d.journal(cid) if r["type"] == "turn" and r["data"]["state"] != "working"]
            assert len(ends) == len({r["run"] for r in ends})  # one end a run
            assert not [r for r in ends if r["data"].get("reason") == c.RUN_INTERRUPTED]
        with d.client() as client:
            client.subscribe(spent)
            client.follow(client.request(wire.Send, conversation=spent, text="spend three")["run"])
            assert d.record(spent)["usage"]["cost_usd"] == pytest.approx(0.90)  # on the caught-up total
    finally:
        assert d.stop() == 0
    # A clean stop saved what was owed: the record on disk (the index's too) is the daemon's.
    on_disk = json.loads((d.state_dir / "conversations" / spent / "record.json").read_text())
    assert on_disk["usage"]["cost_usd"] == pytest.approx(0.90)
    assert on_disk["journal_seq"] == len(d.journal(spent))


def test_a_pending_interaction_is_written_behind_and_a_kill_meanwhile_ends_its_run_once(
        tmp_path: Path, workdir: Path) -> None:
    # running -> requires_action is not written through (two fsyncs on the event loop per
    # interaction): the record follows behind the interaction's journal records, and a crash
    # before it is harmless, since recovery ends the active run whatever state the record says.
    d = Daemon(tmp_path).start()
    path = d.state_dir / "conversations"
    with d.client() as client:
        cid = new(client, workdir, SCRIPTS / "perm.toml")
        path = path / cid / "record.json"
        client.subscribe(cid)

        def pending() -> list:
            return client.request(wire.Show, conversation=cid).get("pending") or []

        def on_disk() -> dict:
            return json.loads(path.read_text())

        first = client.request(wire.Send, conversation=cid, text="first")["run"]  # saved at its start
        perm = wait_for(pending)[0]
        client.request(wire.AnswerInteraction, conversation=cid, interaction=perm["id"],
                       answer={"decision": "allow_once"})
        client.follow(first)
        end = len(d.journal(cid))
        wait_for(lambda: on_disk()["journal_seq"] == end and on_disk().get("state", "idle") == "idle")  # its end, behind
        run = client.request(wire.Send, conversation=cid, text="second")["run"]
        wait_for(pending)
        assert client.request(wire.Show, conversation=cid)["record"]["state"] == "requires_action"
        assert on_disk().get("state", "idle") == "idle" and on_disk()["journal_seq"] == end  # not written through
        wait_for(lambda: on_disk().get("state") == "requires_action")  # behind it, within write_behind.DELAY_S
    d.kill()
    d.start()
    try:
        ends = [r for r in d.journal(cid) if r["type"] == "turn" and r["data"]["state"] != "working"]
        assert [(r["run"], r["data"].get("reason")) for r in ends][-1] == (run, c.RUN_INTERRUPTED)
        assert len(ends) == len({r["run"] for r in ends}) == 2  # one end a run
        after = d.record(cid)
        assert after.get("state", "idle") == "idle" and not after.get("active_run")
    finally:
        assert d.stop() == 0


def test_a_run_both_active_and_queued_in_the_record_gets_one_interrupted_end(tmp_path: Path, workdir: Path) -> None:
    # The record as a crash could leave it while a queued prompt was being handed over: the
    # run active, and still listed as queued. Found by the SIGKILL harness (two ends for one run).
    d = Daemon(tmp_path).start()
    with d.client() as client:
        cid = new(client, workdir, WAIT)
        run = client.request(wire.Send, conversation=cid, text="wait for me")["run"]
        wait_for(lambda: any(r["type"] == "turn" for r in d.journal(cid)))
    d.kill()
    path = d.state_dir / "conversations" / cid / "record.json"
    record = json.loads(path.read_text())
    assert "active_run" not in record  # the journal's prompt record is the turn's start, not the record
    path.write_text(json.dumps({**record, "active_run": run, "queued": [run]}))
    d.start()
    try:
        ends = [r for r in d.journal(cid) if r["type"] == "turn" and r.get("run") == run and r["data"]["state"] != "working"]
        assert [e["data"]["reason"] for e in ends] == [c.RUN_INTERRUPTED]
        assert d.record(cid).get("queued", []) == []
    finally:
        d.stop()
