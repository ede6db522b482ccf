"""``agentctl subagents`` / ``subagent cancel`` / ``subagent prompt`` through a real daemon on the
script provider: the list with live status from the journal, a cancel that stops only that
subagent while its turn goes on, and refusals (unknown agent, one that ended, no prompts)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from daemon_harness import Daemon

SCRIPT = """model = "subs"
delay_ms = 0
[[turn]]
[[turn.step]]
kind = "subagent"
name = "helper"
description = "look around"
text = "never said"
[[turn.step.step]]
kind = "sleep"
ms = 60000
[[turn.step]]
kind = "text"
text = "parent goes on"
"""


def _subagents(d: Daemon, cid: str) -> list[dict[str, Any]]:
    out = d.agentctl("subagents", cid, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["subagents"]


def test_subagent_cancel_stops_only_that_subagent_and_the_turn_goes_on(daemon: Daemon, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "subs.toml"
    script.write_text(SCRIPT)
    cid = json.loads(daemon.agentctl("--json", "new", "-p", "script", "-m", str(script), "--cwd", str(work)).stdout)["id"]
    assert _subagents(daemon, cid) == []
    assert "no subagents" in daemon.agentctl("subagents", cid).stdout
    follower = subprocess.Popen([sys.executable, "-m", "agentctl", "--socket", str(daemon.socket), "send", cid, "go",
                                 "--follow"], env=daemon.env, cwd=daemon.root, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (subs := _subagents(daemon, cid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [(s["name"], s["status"]) for s in subs] == [("helper", "running")]
        agent = subs[0]["id"]
        assert agent in daemon.agentctl("subagents", cid).stdout
        missing = daemon.agentctl("subagent", "cancel", cid, "agent-nope")
        assert missing.returncode == 6, missing.stderr
        prompted = daemon.agentctl("subagent", "prompt", cid, agent, "more please")
        assert prompted.returncode == 1 and "unsupported" in prompted.stderr, prompted.stderr
        t0 = time.monotonic()
        cancelled = daemon.agentctl("subagent", "cancel", cid, agent, "--json")
        assert cancelled.returncode == 0, cancelled.stderr
        assert json.loads(cancelled.stdout) == {"ok": True, "conversation": cid, "agent": agent}
        assert follower.wait(30) == 0
        assert time.monotonic() - t0 < 20, "the subagent's 60 s sleep was not cut short"
    finally:
        if follower.poll() is None:
            follower.kill()
    assert [(s["name"], s["status"]) for s in _subagents(daemon, cid)] == [("helper", "cancelled")]
    journal = daemon.journal(cid)
    assert journal[-1]["type"] == "turn" and journal[-1]["data"]["state"] == "completed"
    texts = [r["data"]["text"] for r in journal if r["type"] == "item" and r["data"]["kind"] == "assistant"]
    assert texts == ["parent goes on"]
    again = daemon.agentctl("subagent", "cancel", cid, agent)
    assert again.returncode == 8 and "cancelled" in again.stderr, again.stderr
    # With no runtime open (agentd restarted), an ended subagent is still said to have ended.
    daemon.stop()
    daemon.start()
    after = daemon.agentctl("subagent", "cancel", cid, agent)
    assert after.returncode == 8 and "already ended (cancelled)" in after.stderr, after.stderr


def test_history_names_a_subagents_items_as_the_live_view_does(daemon: Daemon, tmp_path: Path) -> None:
    # history showed "[agent-1-2]" where the live view and `subagents` said "helper".
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "named.toml"
    script.write_text('model = "subs"\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\nkind = "subagent"\nname = "helper"\n'
                      'description = "look around"\ntext = "all is well"\n[[turn.step.step]]\nkind = "text"\n'
                      'text = "looking around"\n[[turn.step]]\nkind = "text"\ntext = "parent done"\n')
    cid = json.loads(daemon.agentctl("--json", "new", "-p", "script", "-m", str(script), "--cwd", str(work)).stdout)["id"]
    assert daemon.agentctl("send", cid, "go", "--follow").returncode == 0
    (agent,) = [s["id"] for s in _subagents(daemon, cid)]
    shown = daemon.agentctl("history", cid)
    assert shown.returncode == 0 and "[helper] " in shown.stdout and f"[{agent}]" not in shown.stdout, shown.stdout
