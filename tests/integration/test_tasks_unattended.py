"""Tasks that run unattended, through the real daemon and agentctl: --yolo answers the permission a
real tool asks, --max-cost-usd and --model reach its conversation, and a provider that cannot run a
turn is refused at create with what fixes it (nothing is queued)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from daemon_harness import REPO, Daemon

TOOL = str(REPO / "conf" / "scripts" / "tool.toml")


def one_json(cp: subprocess.CompletedProcess[str]) -> Any:
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def test_a_yolo_task_with_a_budget_and_a_model_runs_through_its_permission_request(tmp_path: Path) -> None:
    d = Daemon(tmp_path, '[providers]\ndefault = "script"\n').start()
    try:
        work = tmp_path / "work"
        work.mkdir()
        rec = one_json(d.agentctl("task", "create", "--yolo", "--max-cost-usd", "3", "-m", TOOL, "--cwd", str(work),
                                  "write the file", "--json"))  # no -p: the [providers] default
        assert rec["provider"] == "script" and rec["mode"] == "yolo" and rec["model"] == TOOL
        assert rec["budget"] == {"max_cost_usd": 3.0, "on_reach": "pause"}
        done = d.agentctl("task", "wait", rec["id"], "--timeout", "60", "--exit-on-action", "--json", timeout=90)
        assert done.returncode == 0, done.stdout + done.stderr  # not 4: nobody had to answer
        task = json.loads(done.stdout)
        assert task["status"] == "completed" and task["result"] == "Finished."
        assert (work / "agentd-tool.txt").read_text() == "written by agentd\n"
        conv = one_json(d.agentctl("show", task["conversation"], "--json"))["record"]
        assert conv["mode"] == "yolo" and conv["budget"]["max_cost_usd"] == 3.0 and conv["model"] == TOOL
        answers = [r["data"] for r in d.journal(task["conversation"]) if r["type"] == "answer"]
        assert answers and all(a.get("auto") for a in answers)
        # without --yolo the same task stops at the permission request
        rec = one_json(d.agentctl("task", "create", "-m", TOOL, "--cwd", str(work), "write it again", "--json"))
        assert rec["mode"] == "interactive"
        assert d.agentctl("task", "wait", rec["id"], "--timeout", "60", "--exit-on-action", timeout=90).returncode == 4
    finally:
        d.stop()


def test_a_task_on_a_provider_that_cannot_run_is_refused_at_create_with_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-copilot"
    d = Daemon(tmp_path, f'[providers.copilot]\ncli_path = "{missing}"\n').start()
    try:
        cp = d.agentctl("task", "create", "-p", "copilot", "--yolo", "--cwd", str(tmp_path), "fix it", "--json",
                        timeout=120)
        assert cp.returncode == 1 and cp.stdout == ""
        err = json.loads(cp.stderr.splitlines()[-1])
        assert err["code"] == "unsupported"
        assert "npm install -g @github/copilot" in err["message"] or "cli_path" in err["message"], err
        assert one_json(d.agentctl("task", "ls", "--json"))["tasks"] == []  # nothing queued
        human = d.agentctl("task", "create", "-p", "copilot", "--cwd", str(tmp_path), "fix it", timeout=120)
        assert human.returncode == 1 and "copilot" in human.stderr
    finally:
        d.stop()
