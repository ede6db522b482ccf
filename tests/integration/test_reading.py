"""Reading a conversation leaves it as it is: no lease, no load, nothing appended."""

from __future__ import annotations

from pathlib import Path

from agentd import wire
from daemon_harness import Daemon

from .conftest import SCRIPTS


def test_tailing_an_idle_conversation_takes_no_lease_and_appends_nothing(tmp_path: Path, workdir: Path) -> None:
    d = Daemon(tmp_path).start()
    try:
        with d.client() as client:
            cid = client.request(wire.New, provider="script", workdir=str(workdir), model=str(SCRIPTS / "steps.toml"))["id"]
            client.subscribe(cid)
            run = client.request(wire.Send, conversation=cid, text="go")["run"]
            client.follow(run)
    finally:
        d.stop()
    before = d.journal(cid)
    lease = d.state_dir / "conversations" / cid / "lease.json"
    assert not lease.exists()
    d.start()
    try:
        with d.client() as client:
            client.subscribe(cid, after=0)
            got = []
            for frame in client.frames(timeout=10):
                if isinstance(frame, wire.SnapshotFrame):
                    assert frame.snapshot.last_seq == len(before) and not frame.snapshot.run
                    break
                if isinstance(frame, wire.EventFrame):
                    got.append(wire.decode_record(frame.record).seq)
            assert got == [r["seq"] for r in before]
            assert not lease.exists()
            # Sending loads it as before: lease, and the conversation goes on.
            run = client.request(wire.Send, conversation=cid, text="again")["run"]
            records = client.follow(run)
            assert records[-1].type == "turn"
            assert lease.exists()
    finally:
        d.stop()
    assert d.journal(cid)[: len(before)] == before
