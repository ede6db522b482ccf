"""``agentctl subagent cancel`` on the real Copilot CLI through the daemon: the CLI's agent task
behind one subagent is cancelled, that subagent ends, the main agent's turn goes on."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from daemon_harness import Daemon

pytestmark = pytest.mark.e2e


def _subagents(d: Daemon, cid: str) -> list[dict[str, Any]]:
    out = d.agentctl("subagents", cid, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["subagents"]


def test_subagent_cancel_stops_one_copilot_subagent(tmp_path: Path, copilot_byok_toml: str, model_server: Any,
                                                     model_key_env: str, workdir: Path) -> None:
    # The main agent's first model call starts one subagent (`task`); the subagent's answers slowly
    # (about 40 s), so it is still running when it is cancelled.
    task = {"description": "Look around", "prompt": "List the files", "agent_type": "general-purpose", "name": "looker"}
    calls = []

    def decide(tools: list[dict[str, Any]], last_is_tool_result: bool) -> tuple[str, Any]:
        if last_is_tool_result:
            return "text", "Main agent done."
        if not tools:
            return "text", "A title"
        calls.append(1)
        if len(calls) == 1:
            return "tool", ("task", task)
        return "text", " ".join(f"word{i}" for i in range(400))

    model_server.decide = decide
    model_server.stream_slowly(0.1)
    d = Daemon(tmp_path, copilot_byok_toml + "\n[providers.claude]\nenabled = false\n[providers.codex]\nenabled = false\n").start()
    try:
        cid = json.loads(d.agentctl("new", "-p", "copilot", "--cwd", str(workdir), "--json", "--yolo").stdout)["id"]
        assert d.agentctl("send", cid, "Delegate it.").returncode == 0
        deadline = time.monotonic() + 60
        running: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            running = [s for s in _subagents(d, cid) if s["status"] == "running"]
            deltas = [r for r in d.journal(cid) if r["type"] == "item" and r["data"].get("agent_id")]
            if running and deltas:
                break
            time.sleep(0.2)
        assert running, f"no subagent ran: {_subagents(d, cid)}"
        target = running[-1]["id"]
        t0 = time.monotonic()
        out = d.agentctl("subagent", "cancel", cid, target, "--json")
        assert out.returncode == 0, out.stderr
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and d.record(cid).get("state", "idle") != "idle":
            time.sleep(0.2)
        ended = time.monotonic() - t0
        subs = {s["id"]: s for s in _subagents(d, cid)}
        print("SUBS", json.dumps(subs)[:1500], "ENDED", ended)
        assert subs[target]["status"] == "cancelled", subs[target]
        assert ended < 30, f"the turn ended {ended:.1f} s after the cancel: the subagent was not stopped"
        turns = [r["data"] for r in d.journal(cid) if r["type"] == "turn"]
        assert turns[-1]["state"] == "completed", turns
        main = [r["data"]["text"] for r in d.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "assistant"
                and not r["data"].get("agent_id")]
        assert main and main[-1] == "Main agent done."
        again = d.agentctl("subagent", "cancel", cid, target)
        assert again.returncode == 8, again.stderr
    finally:
        d.stop()
