"""``agentctl fork`` and ``agentctl rewind`` through a real daemon, on the script provider (agentd.branching).

The script provider forks and rewinds its own record natively; its replies echo the history
it holds (``{history}``), which is what a model request would carry. The conformance
columns run the same two operations on every real runtime.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from daemon_harness import Daemon

SCRIPT = '''
model = "branching"
[[turn]]
match = "slow"
[[turn.step]]
kind = "text"
text = "a long answer that takes a while to stream, word by word, on and on"
chunk = 2
delay_ms = 200
[[turn]]
[[turn.step]]
kind = "text"
text = "You said: {prompt}. Earlier: {history}"
'''


def _ok(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else proc.stdout


def _conversation(d: Daemon, workdir: Path) -> str:
    script = workdir.parent / "branching.toml"
    script.write_text(SCRIPT)
    return _ok(d.agentctl("new", "-p", "script", "--cwd", str(workdir), "-m", str(script), "--json"))["id"]


def _turn(d: Daemon, cid: str, text: str) -> str:
    proc = d.agentctl("send", cid, text, "--follow", "--json")
    assert proc.returncode == 0, proc.stderr
    return [r for r in d.journal(cid) if r["type"] == "turn" and r["data"]["state"] != "working"][-1]["run"]


def _last_reply(d: Daemon, cid: str) -> str:
    return [r["data"]["text"] for r in d.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "assistant"][-1]


def _lines(proc: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_rewind_drops_later_turns_from_every_view_and_the_next_turn(daemon: Daemon, workdir: Path) -> None:
    d = daemon
    cid = _conversation(d, workdir)
    r1, r2, r3 = (_turn(d, cid, t) for t in ("alpha", "beta", "gamma"))
    journal = d.journal(cid)

    preview = _ok(d.agentctl("rewind", cid, "--to", r1, "--preview", "--json"))
    assert preview["preview"] and preview["kept"]["run"] == r1 and preview["kept"]["prompt"] == "alpha"
    assert [t["run"] for t in preview["dropped"]] == [r2, r3]
    assert d.journal(cid) == journal and not d.record(cid).get("dropped"), "a preview changed something"
    assert _ok(d.agentctl("rewind", cid, "--to", "1", "--preview", "--json")) == preview  # turn number 1
    assert d.agentctl("rewind", cid, "--to", "4", "--preview").returncode == 6
    human = _ok(d.agentctl("rewind", cid, "--to", r1[:6], "--preview"))
    assert "would drop 2 turn(s)" in human and "'beta'" in human and "nothing changed" in human

    done = _ok(d.agentctl("rewind", cid, "--to", r1, "--json"))
    assert [t["run"] for t in done["dropped"]] == [r2, r3] and done["seq"] == len(journal) + 1
    after = d.journal(cid)
    assert after[: len(journal)] == journal, "the journal was rewritten"
    assert after[-1]["type"] == "rewind" and after[-1]["data"] == {"kept": r1, "seq": preview["kept"]["seq"],
                                                                   "dropped": [r2, r3]}
    assert d.record(cid)["dropped"] == [r2, r3]
    assert "2 turn(s) dropped" in _ok(d.agentctl("show", cid))

    # history, tail and export show the rewound view; --all shows the dropped part, marked.
    items = _ok(d.agentctl("history", cid, "--json"))["items"]
    assert [e["item"]["text"] for e in items if e["item"]["kind"] == "user"] == ["alpha"]
    everything = _ok(d.agentctl("history", cid, "--all", "--json"))["items"]
    dropped = [e for e in everything if e.get("dropped")]
    assert {e["run"] for e in dropped} == {r2, r3} and not any(e.get("dropped") for e in everything if e["run"] == r1)
    assert "[dropped]" in _ok(d.agentctl("history", cid, "--all"))
    tail = _lines(d.agentctl("tail", cid, "--no-follow", "--json"))
    assert not any(r.get("run") in (r2, r3) for r in tail) and any(r["type"] == "rewind" for r in tail)
    tail_all = _lines(d.agentctl("tail", cid, "--all", "--no-follow", "--json"))
    marked = [r for r in tail_all if r.get("run") in (r2, r3)]
    assert marked and all(r.get("dropped") for r in marked)
    md = _ok(d.agentctl("export", cid, "--json"))["text"]
    assert "alpha" in md and "beta" not in md and "gamma" not in md
    md_all = _ok(d.agentctl("export", cid, "--all", "--json"))["text"]
    assert "beta" in md_all and "(dropped)" in md_all

    # Refusals, each with its exit code; nothing recorded for them.
    again = d.agentctl("rewind", cid, "--to", r3, "--json")
    assert again.returncode == 8 and "dropped by a rewind" in again.stderr
    last = d.agentctl("rewind", cid, "--to", r1, "--json")
    assert last.returncode == 8 and "nothing to rewind" in last.stderr
    unknown = d.agentctl("rewind", cid, "--to", "r-none", "--json")
    assert unknown.returncode == 6, unknown.stderr
    assert len(d.journal(cid)) == len(after)

    # The next turn sees only the kept history.
    _turn(d, cid, "delta")
    reply = _last_reply(d, cid)
    assert "Earlier: alpha" in reply and "beta" not in reply and "gamma" not in reply


def test_rewind_is_refused_busy_while_a_turn_runs(daemon: Daemon, workdir: Path) -> None:
    d = daemon
    cid = _conversation(d, workdir)
    r1 = _turn(d, cid, "alpha")
    _turn(d, cid, "beta")
    _ok(d.agentctl("send", cid, "slow please", "--json"))
    busy = d.agentctl("rewind", cid, "--to", r1, "--json")
    assert busy.returncode == 7 and "busy" in busy.stderr, busy.stderr
    _ok(d.agentctl("cancel", cid, "--json"))
    assert not d.record(cid).get("dropped") and not any(r["type"] == "rewind" for r in d.journal(cid))


def test_fork_copies_the_history_up_to_its_turn_and_goes_its_own_way(daemon: Daemon, workdir: Path) -> None:
    d = daemon
    cid = _conversation(d, workdir)
    r1, r2 = _turn(d, cid, "alpha"), _turn(d, cid, "beta")

    # Default: the last completed turn.
    whole = _ok(d.agentctl("fork", cid, "--json"))
    assert whole["run"] == r2 and [t["run"] for t in whole["turns"]] == [r1, r2]
    source_title = d.record(cid)["title"]
    assert source_title and whole["conversation"]["title"] == source_title + " (fork)"
    # At the first turn: the new journal names where it came from, then the copies, marked.
    res = _ok(d.agentctl("fork", cid, "--at", r1, "--title", "branch", "--json"))
    fork = res["conversation"]["id"]
    assert res["conversation"]["forked_from"] == cid and res["conversation"]["forked_at"] == r1
    assert res["conversation"]["title"] == "branch"
    journal = d.journal(fork)
    head = journal[0]
    assert head["seq"] == 1 and head["type"] == "forked"
    assert head["data"]["source"] == cid and head["data"]["run"] == r1
    assert head["data"]["seq"] == [r for r in d.journal(cid) if r.get("run") == r1][-1]["seq"]
    copies = [r for r in journal if isinstance(r["data"], dict) and "copied" in r["data"]]
    assert copies and {r["run"] for r in copies} == {r1} and res["copied"] == len(copies)
    source = {r["seq"]: r for r in d.journal(cid)}
    for r in copies:
        original = source[r["data"]["copied"]["seq"]]
        assert original["type"] == r["type"] and original["run"] == r["run"]
        assert {k: v for k, v in r["data"].items() if k != "copied"} == original["data"]
    assert not any(r["type"] == "prompt" and r["data"]["text"] == "beta" for r in journal)
    shown = _ok(d.agentctl("history", fork, "--json"))["items"]
    assert [e["item"]["text"] for e in shown if e["item"]["kind"] == "user"] == ["alpha"]
    assert all(e.get("copied") for e in shown)
    assert "forked from" in _ok(d.agentctl("tail", fork, "--no-follow"))
    assert f"from {cid} at run {r1}" in _ok(d.agentctl("show", fork))

    # Each goes its own way: the fork's next turn sees alpha only, the source keeps both.
    _turn(d, fork, "gamma")
    reply = _last_reply(d, fork)
    assert "Earlier: alpha" in reply and "beta" not in reply
    _turn(d, cid, "delta")
    assert "Earlier: alpha | beta" in _last_reply(d, cid)

    # A fork of the fork, at its copied turn (by number), and at its own.
    again = _ok(d.agentctl("fork", fork, "--at", "1", "--json"))
    assert again["run"] == r1
    assert again["source"] == fork and again["copied"] == len(copies)
    human = _ok(d.agentctl("fork", fork))
    assert "forked from " + fork in human

    # Refusals: a run that is not there, a run a rewind dropped.
    assert d.agentctl("fork", cid, "--at", "r-none").returncode == 6
    _ok(d.agentctl("rewind", cid, "--to", r1, "--json"))
    refused = d.agentctl("fork", cid, "--at", r2, "--json")
    assert refused.returncode == 8 and "dropped by a rewind" in refused.stderr


def test_a_fork_keeps_its_sources_mcp_choice(daemon: Daemon, workdir: Path) -> None:
    # A fork of a conversation made with --no-mcp had mcp null: the provider's default servers.
    d = daemon
    script = workdir.parent / "branching.toml"
    script.write_text(SCRIPT)
    cid = _ok(d.agentctl("new", "-p", "script", "--cwd", str(workdir), "-m", str(script), "--no-mcp", "--json"))["id"]
    assert d.record(cid)["mcp"] == []
    _turn(d, cid, "alpha")
    fork = _ok(d.agentctl("fork", cid, "--json"))["conversation"]
    assert fork["mcp"] == [] and d.record(fork["id"])["mcp"] == []


def test_fork_and_rewind_are_unsupported_where_the_provider_cannot(tmp_path: Path, workdir: Path) -> None:
    # An ACP agent that advertises no session fork (the small agent of the models tests).
    agent = Path(__file__).resolve().parent / "acp_models_agent.py"
    config = ("[providers.copilot]\nenabled = false\n[providers.claude]\nenabled = false\n"
              "[providers.codex]\nenabled = false\n"
              f"[providers.acp.fake]\ncommand = {json.dumps([sys.executable, str(agent)])}\n")
    d = Daemon(tmp_path, config).start()
    try:
        providers = {p["name"]: p for p in _ok(d.agentctl("providers", "--json"))["providers"]}
        caps = providers["acp:fake"]["capabilities"]
        assert caps.get("fork") is False and caps.get("rewind") is False, caps
        cid = _ok(d.agentctl("new", "-p", "acp:fake", "--cwd", str(workdir), "--json"))["id"]
        for args in (("fork", cid), ("rewind", cid, "--to", "r1")):
            proc = d.agentctl(*args, "--json")
            assert proc.returncode == 1 and "unsupported" in proc.stderr, (args, proc.stderr)
    finally:
        d.stop()



def test_a_fork_diffs_and_reverts_the_turns_it_copied(tmp_path: Path, workdir: Path) -> None:
    # The fork listed its copied turns and shared their working directory, but had no checkpoints of them.
    script = tmp_path / "write.toml"
    script.write_text('model = "w"\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\nkind = "tool"\nname = "bash"\n'
                      'command = "echo made > made.txt && echo done"\n[[turn.step]]\nkind = "text"\ntext = "ok"\n')
    (tmp_path / "agentd").mkdir()
    d = Daemon(tmp_path / "agentd", "[checkpoints]\ntimeout_s = 30\n").start()
    try:
        cid = _ok(d.agentctl("new", "-p", "script", "--cwd", str(workdir), "-m", str(script), "--json"))["id"]
        run = _turn(d, cid, "write it")
        fork = _ok(d.agentctl("fork", cid, "--json"))["conversation"]["id"]
        diff = _ok(d.agentctl("diff", fork, "--run", run, "--stat", "--json"))
        assert [f["path"] for f in diff["files"]] == ["made.txt"] and diff["after"] == "checkpoint"
        _ok(d.agentctl("revert", fork, "--run", run, "--yes", "--json"))
        assert not (workdir / "made.txt").exists()
    finally:
        d.stop()
