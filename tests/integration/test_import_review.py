"""``agentctl import`` through a real daemon, against what a runtime's own store or agent may hold:
sessions recorded for another folder, titles with odd bytes, FIFOs and endless files where a
transcript belongs, lines nested too deeply, times at the edge of datetime's range, and one
session id in two project folders."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon_harness import Daemon

#: A minimal ACP agent: session/list answers what $LIST_JSON holds; "read PATH" asks the client for a file.
ACP_AGENT = textwrap.dedent('''
    import json, os, sys
    def send(m): sys.stdout.write(json.dumps(m) + "\\n"); sys.stdout.flush()
    listing = json.load(open(os.environ["LIST_JSON"]))
    for line in sys.stdin:
        msg = json.loads(line); method, rid, p = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1, "agentInfo": {"name": "lister", "version": "0"},
                  "agentCapabilities": {"loadSession": True, "sessionCapabilities": {"list": {}}}}})
        elif method == "session/list":
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessions": listing}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": "new-1"}})
        elif method == "session/load":
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "session/prompt":
            sid = p["sessionId"]
            text = "".join(b.get("text", "") for b in p.get("prompt", []) if b.get("type") == "text")
            out = "echo:" + text
            if text.startswith("read "):
                send({"jsonrpc": "2.0", "id": 9000, "method": "fs/read_text_file", "params": {"sessionId": sid, "path": text[5:]}})
                while True:
                    ans = json.loads(sys.stdin.readline())
                    if ans.get("id") == 9000 and "method" not in ans:
                        break
                out = "ok:" + ans["result"]["content"] if "result" in ans else "refused"
            send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": {
                "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": out}}}})
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no " + str(method)}})
''')

NO_OTHERS = "[providers.copilot]\nenabled = false\n[providers.codex]\nenabled = false\n"


def _slug(path: Path | str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "-", str(path))


def _prompt(cwd: Path | str, text: str, timestamp: str = "2024-01-01T00:00:00Z") -> str:
    return json.dumps({"type": "user", "cwd": str(cwd), "timestamp": timestamp, "uuid": "u1",
                       "message": {"role": "user", "content": text}}) + "\n"


def _ok(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


@pytest.fixture
def claude(tmp_path: Path) -> Iterator[tuple[Daemon, Path]]:
    """A daemon with the claude provider reading ``<tmp>/claude`` (its ``projects`` made)."""
    home = tmp_path / "claude"
    (home / "projects").mkdir(parents=True)
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", NO_OTHERS + f"[providers.claude]\nenabled = true\nconfig_dir = {json.dumps(str(home))}\n")
    d.start()
    try:
        yield d, home
    finally:
        d.stop()


def test_an_acp_agent_cannot_hand_an_adopted_conversation_another_folder(tmp_path: Path, workdir: Path) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(ACP_AGENT)
    listing = tmp_path / "list.json"
    (tmp_path / "link").symlink_to(workdir)
    secret = tmp_path / "outside.txt"
    secret.write_text("OUTSIDE")
    listing.write_text(json.dumps([{"sessionId": "s-root", "cwd": "/", "title": "mine, honest"},
                                   {"sessionId": "s-home", "cwd": str(tmp_path), "title": "also mine"},
                                   {"sessionId": "s-link", "cwd": str(tmp_path / "link"), "title": "via a link"},
                                   {"sessionId": "s-none", "title": "no folder said"}]))
    config = (NO_OTHERS + "[providers.claude]\nenabled = false\n[providers.acp.lister]\n"
              f"command = {json.dumps([sys.executable, str(agent)])}\nenv = {{ LIST_JSON = {json.dumps(str(listing))} }}\n")
    (tmp_path / "d").mkdir()
    d = Daemon(tmp_path / "d", config).start()
    try:
        listed = _ok(d.agentctl("import", "-p", "acp:lister", "--cwd", str(workdir), "--json"))["sessions"]
        assert sorted(s["id"] for s in listed) == ["s-link", "s-none"]
        assert {s["workdir"] for s in listed} == {str(workdir)}
        for foreign in ("s-root", "s-home"):
            refused = d.agentctl("import", "-p", "acp:lister", "--cwd", str(workdir), foreign)
            assert refused.returncode == 6 and "no session" in refused.stderr, refused.stderr
        assert _ok(d.agentctl("ls", "--json"))["conversations"] == []
        for sid in ("s-link", "s-none"):
            record = _ok(d.agentctl("import", "-p", "acp:lister", "--cwd", str(workdir), sid, "--json"))["conversation"]
            assert record["workdir"] == str(workdir)
        # and so its files stay confined to that folder
        sent = d.agentctl("send", record["id"], f"read {secret}", "--follow", timeout=60)
        assert sent.returncode == 0 and "refused" in sent.stdout and "OUTSIDE" not in sent.stdout, sent.stdout
    finally:
        d.stop()


def test_a_claude_title_with_a_lone_surrogate_is_listed_and_adopted_cleaned(claude: tuple[Daemon, Path], workdir: Path) -> None:
    d, home = claude
    assert d.agentctl("new", "-p", "script", "--cwd", str(workdir), "--title", "unrelated").returncode == 0
    (home / "projects" / _slug(workdir)).mkdir()
    sid = str(uuid.uuid4())
    (home / "projects" / _slug(workdir) / f"{sid}.jsonl").write_text(
        _prompt(workdir, "hello") + '{"type":"custom-title","customTitle":"nice \\ud83d title\\nFAKE ROW"}\n')
    [listed] = _ok(d.agentctl("import", "-p", "claude", "--cwd", str(workdir), "--json"))["sessions"]
    assert listed["title"] == "nice \ufffd title FAKE ROW"
    record = _ok(d.agentctl("import", "-p", "claude", "--cwd", str(workdir), sid, "--json"))["conversation"]
    assert record["title"] == "nice \ufffd title FAKE ROW"
    assert len(_ok(d.agentctl("ls", "--json"))["conversations"]) == 2


def test_the_claude_listing_skips_a_fifo_and_shuts_down(claude: tuple[Daemon, Path], workdir: Path) -> None:
    d, home = claude
    folder = home / "projects" / _slug(workdir)
    folder.mkdir()
    good = str(uuid.uuid4())
    (folder / f"{good}.jsonl").write_text(_prompt(workdir, "the good one"))
    os.mkfifo(folder / f"{uuid.uuid4()}.jsonl")
    os.mkfifo(tmp_fifo := home / "elsewhere.fifo")
    (folder / f"{uuid.uuid4()}.jsonl").symlink_to(tmp_fifo)
    listed = _ok(d.agentctl("import", "-p", "claude", "--cwd", str(workdir), "--json", timeout=20))["sessions"]
    assert [s["id"] for s in listed] == [good]
    assert d.stop(timeout=10) == 0  # no worker thread left waiting on a FIFO


def test_the_claude_listing_reads_no_endless_file_whole(claude: tuple[Daemon, Path], workdir: Path) -> None:
    d, home = claude
    folder = home / "projects" / _slug(workdir)
    folder.mkdir()
    good = str(uuid.uuid4())
    (folder / f"{good}.jsonl").write_text(_prompt(workdir, "the good one"))
    (folder / f"{uuid.uuid4()}.jsonl").symlink_to("/dev/zero")
    # a regular file that is one line of 3 GB (sparse): only its head and tail are read
    with open(folder / f"{uuid.uuid4()}.jsonl", "wb") as f:
        f.truncate(3 << 30)
    # the daemon may not take more than 2 GiB: reading one of those whole would fail
    subprocess.run(["prlimit", f"--pid={d.proc.pid}", f"--as={2 << 30}"], check=True)
    started = time.monotonic()
    listed = _ok(d.agentctl("import", "-p", "claude", "--cwd", str(workdir), "--json", timeout=20))["sessions"]
    assert [s["id"] for s in listed] == [good] and time.monotonic() - started < 10


def test_an_adopted_claude_session_gets_the_folder_asked_for(claude: tuple[Daemon, Path], workdir: Path) -> None:
    d, home = claude
    link = workdir.parent / "link"
    link.symlink_to(workdir)
    (home / "projects" / _slug(workdir)).mkdir()
    sid = str(uuid.uuid4())
    (home / "projects" / _slug(workdir) / f"{sid}.jsonl").write_text(_prompt(link, "recorded through a link"))
    record = _ok(d.agentctl("import", "-p", "claude", "--cwd", str(workdir), sid, "--json"))["conversation"]
    assert record["workdir"] == str(workdir)


def test_claude_json_nested_too_deeply_counts_as_a_malformed_line(claude: tuple[Daemon, Path], workdir: Path) -> None:
    d, home = claude
    folder = home / "projects" / _slug(workdir)
    folder.mkdir()
    sid = str(uuid.uuid4())
    (folder / f"{sid}.jsonl").write_text(_prompt(workdir, "hello") + "[" * 200_000 + "\n")
    (folder / f"{uuid.uuid4()}.jsonl").write_text("[" * 200_000 + "\n")
    (home / "sessions").mkdir()
    (home / "sessions" / f"{os.getpid()}.json").write_text("[" * 60_000)  # the in-use check reads these
    listed = _ok(d.agentctl("import", "-p", "claude", "--cwd", str(workdir), "--json"))["sessions"]
    assert [(s["id"], s["in_use"]) for s in listed] == [(sid, False)]
    adopted = _ok(d.agentctl("import", "-p", "claude", "--cwd", str(workdir), sid, "--json"))
    assert adopted["items"] == 1


def test_claude_times_at_the_edge_of_datetimes_range(claude: tuple[Daemon, Path], workdir: Path) -> None:
    d, home = claude
    folder = home / "projects" / _slug(workdir)
    folder.mkdir()
    sid = str(uuid.uuid4())
    (folder / f"{sid}.jsonl").write_text(
        _prompt(workdir, "hello", "0001-01-01T00:00:00+01:00")
        + json.dumps({"type": "assistant", "timestamp": "9999-12-31T23:00:00-05:00", "uuid": "a1",
                      "message": {"id": "m1", "content": [{"type": "text", "text": "hi"}]}}) + "\n")
    [listed] = _ok(d.agentctl("import", "-p", "claude", "--cwd", str(workdir), "--json"))["sessions"]
    assert listed["id"] == sid and not listed.get("created_at")  # no UTC value: not said
    cid = _ok(d.agentctl("import", "-p", "claude", "--cwd", str(workdir), sid, "--json"))["conversation"]["id"]
    for fmt in ("md", "json", "html"):
        out = d.agentctl("export", cid, "--format", fmt)
        assert out.returncode == 0 and "hi" in out.stdout, (fmt, out.stderr)
    assert d.agentctl("history", cid).returncode == 0


def test_claude_adoption_reads_the_transcript_the_listing_showed(claude: tuple[Daemon, Path], workdir: Path) -> None:
    d, home = claude
    sid = str(uuid.uuid4())
    # other project folders holding the same id, named to come first in any order
    for i in range(6):
        (home / "projects" / f"-a{i}").mkdir()
        (home / "projects" / f"-a{i}" / f"{sid}.jsonl").write_text(_prompt("/nowhere", f"DECOY {i}"))
    (home / "projects" / _slug(workdir)).mkdir()
    (home / "projects" / _slug(workdir) / f"{sid}.jsonl").write_text(_prompt(workdir, "the real prompt"))
    [listed] = _ok(d.agentctl("import", "-p", "claude", "--cwd", str(workdir), "--json"))["sessions"]
    assert listed["title"] == "the real prompt"
    cid = _ok(d.agentctl("import", "-p", "claude", "--cwd", str(workdir), sid, "--json"))["conversation"]["id"]
    history = d.agentctl("history", cid)
    assert "the real prompt" in history.stdout and "DECOY" not in history.stdout, history.stdout
