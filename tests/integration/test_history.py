"""``agentctl history`` through a real daemon: pages of items from the journal, nothing opened."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentd import wire
from daemon_harness import Daemon

from .conftest import SCRIPTS


def _expected(journal: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(seq, text) of every entry: prompts, and each item (by run, agent, id) at its last record."""
    last: dict[tuple[str, str, str], tuple[int, str]] = {}
    out = []
    for rec in journal:
        if rec["type"] == "prompt":
            out.append((rec["seq"], rec["data"]["text"]))
        elif rec["type"] == "item" and (rec["data"]["kind"] != "user" or rec["data"].get("delivery") == "steer"):
            d = rec["data"]
            last[(rec.get("run", ""), d.get("agent_id", ""), d["id"])] = (rec["seq"], d.get("text", ""))
    return sorted(out + list(last.values()))


def _page(d: Daemon, cid: str, *args: str) -> dict[str, Any]:
    proc = d.agentctl("--json", "history", cid, *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_history_pages_back_through_every_item_once_without_opening_the_conversation(tmp_path: Path, workdir: Path) -> None:
    d = Daemon(tmp_path).start()
    try:
        with d.client() as client:
            cid = client.request(wire.New, provider="script", workdir=str(workdir), model=str(SCRIPTS / "steps.toml"))["id"]
            client.subscribe(cid)
            for text in ("first", "second", "third"):
                client.follow(client.request(wire.Send, conversation=cid, text=text)["run"])
    finally:
        d.stop()
    journal = d.journal(cid)
    want = _expected(journal)
    assert len(want) > 12
    lease = d.state_dir / "conversations" / cid / "lease.json"
    lease.unlink(missing_ok=True)
    d.start()
    try:
        got: list[tuple[int, str]] = []
        page = _page(d, cid, "--limit", "5")
        assert page["end"] and len(page["items"]) == 5
        while True:
            got = [(e["seq"], e["item"].get("text", "")) for e in page["items"]] + got
            if not page.get("before"):
                assert page["start"]
                break
            page = _page(d, cid, "--limit", "5", "--before", str(page["before"]))
        assert got == want
        # Forward from the start gives the same entries.
        fwd, page = [], _page(d, cid, "--limit", "7", "--after", "0")
        while True:
            fwd += [(e["seq"], e["item"].get("text", "")) for e in page["items"]]
            if not page.get("after"):
                break
            page = _page(d, cid, "--limit", "7", "--after", str(page["after"]))
        assert fwd == want
        # Each tool call appears once, completed: its latest form.
        tools = [e["item"] for e in _page(d, cid, "--limit", "1000")["items"] if e["item"]["kind"] == "tool"]
        tool_ids = {(r["run"], r["data"]["id"]) for r in journal if r["type"] == "item" and r["data"]["kind"] == "tool"}
        assert len(tools) == len(tool_ids) > 3 and all(t["tool"]["status"] == "completed" for t in tools)
        # Human output: each entry tagged with its seq; the cursor of the older page on stderr.
        human = d.agentctl("history", cid, "--limit", "3")
        assert human.returncode == 0, human.stderr
        assert f"#{want[-1][0]}" in human.stdout and want[-1][1] in human.stdout
        assert f"agentctl history {cid} --before {want[-3][0]}" in human.stderr
        # Reading took no lease and loaded nothing: no record was appended.
        assert not lease.exists()
        assert d.journal(cid) == journal
    finally:
        d.stop()


def test_history_errors_are_clear_and_exit_with_their_codes(daemon: Daemon, workdir: Path) -> None:
    missing = daemon.agentctl("history", "nosuchconversation")
    assert missing.returncode == 6 and "nosuchconversation" in missing.stderr
    with daemon.client() as client:
        cid = client.request(wire.New, provider="script", workdir=str(workdir), model=str(SCRIPTS / "steps.toml"))["id"]
    both = daemon.agentctl("history", cid, "--before", "3", "--after", "1")
    assert both.returncode == 2 and "at most one" in both.stderr
    over = daemon.agentctl("history", cid, "--limit", "5000")
    assert over.returncode == 2
    empty = daemon.agentctl("--json", "history", cid)
    assert empty.returncode == 0 and json.loads(empty.stdout)["items"] == []
    with daemon.client() as client:
        for bad in ({"limit": 0}, {"before": 0}, {"before": 3, "after": 1}):
            client.send_raw(json.dumps({"id": 99, "op": "history", "conversation": cid, **bad}).encode() + b"\n")
            frame = client.read()
            assert isinstance(frame, wire.ErrorFrame) and frame.error.code == "invalid", (bad, frame)
