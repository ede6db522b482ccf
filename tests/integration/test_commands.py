"""``agentctl commands`` / ``command`` / ``send "/name args"`` through a real daemon on the script
provider: the offered list, a command run as a turn whose user item is ``/name args``, a name
not offered refused ``invalid`` with the list (nothing journaled), plain text kept as typed."""

from __future__ import annotations

import json
from pathlib import Path

from daemon_harness import Daemon

SCRIPT = """model = "cmds"
delay_ms = 0
[[command]]
name = "review"
kind = "command"
description = "Review the change"
input_hint = "FOCUS"
[[command]]
name = "greet"
kind = "skill"
description = "Greets people"
[[turn]]
[[turn.step]]
kind = "text"
text = "ran {prompt}"
"""


def _new(d: Daemon, tmp_path: Path, script: str = SCRIPT) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    path = tmp_path / "cmds.toml"
    path.write_text(script)
    return json.loads(d.agentctl("--json", "new", "-p", "script", "-m", str(path), "--cwd", str(work)).stdout)["id"]


def _prompts(d: Daemon, cid: str) -> list[str]:
    return [r["data"]["text"] for r in d.journal(cid) if r["type"] == "prompt"]


def test_commands_lists_what_the_runtime_offers_and_command_runs_one_as_a_turn(daemon: Daemon, tmp_path: Path) -> None:
    cid = _new(daemon, tmp_path)
    listed = daemon.agentctl("commands", cid, "--json")
    assert listed.returncode == 0, listed.stderr
    res = json.loads(listed.stdout)
    assert res["provider"] == "script"
    assert [(c["name"], c["kind"]) for c in res["commands"]] == [("review", "command"), ("greet", "skill")]
    assert res["commands"][0]["input_hint"] == "FOCUS"
    human = daemon.agentctl("commands", cid)
    assert "/review" in human.stdout and "Greets people" in human.stdout

    ran = daemon.agentctl("command", cid, "review", "the", "tests", "--follow", "--json")
    assert ran.returncode == 0, ran.stderr
    assert _prompts(daemon, cid) == ["/review the tests"]
    assistant = [r["data"]["text"] for r in daemon.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "assistant"]
    assert assistant == ["ran /review the tests"]
    history = json.loads(daemon.agentctl("history", cid, "--json").stdout)
    users = [e["item"]["text"] for e in history["items"] if e["item"]["kind"] == "user"]
    assert users == ["/review the tests"]

    sent = daemon.agentctl("send", cid, "/greet Bob", "--follow")
    assert sent.returncode == 0, sent.stderr
    assert _prompts(daemon, cid)[-1] == "/greet Bob"


def test_a_command_the_runtime_does_not_offer_is_invalid_with_the_list_and_nothing_is_sent(daemon: Daemon, tmp_path: Path) -> None:
    cid = _new(daemon, tmp_path)
    before = len(daemon.journal(cid))
    for args in (("command", cid, "nope", "x"), ("send", cid, "/nope x")):
        refused = daemon.agentctl(*args)
        assert refused.returncode == 8, refused.stderr
        assert "/nope" in refused.stderr and "/review" in refused.stderr and "/greet" in refused.stderr
    assert len(daemon.journal(cid)) == before
    # A path-like prompt or one starting with a space is plain text.
    plain = daemon.agentctl("send", cid, " /nope is plain text", "--follow")
    assert plain.returncode == 0, plain.stderr
    plain = daemon.agentctl("send", cid, "/usr/bin is a path", "--follow")
    assert plain.returncode == 0, plain.stderr
    assert _prompts(daemon, cid) == [" /nope is plain text", "/usr/bin is a path"]

