"""The whole path once, as a user drives it: the real agentd, agentctl processes, the demo script.

`agentctl run` follows the demo turn; a second agentctl process answers each of
its interactions (permission, question, form, plan review); the journal on disk
is then checked. Then the daemon is SIGKILLed mid-turn and restarted: the turn
is recorded as interrupted, the prompt is not resent, and the conversation takes
a new prompt.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from daemon_harness import REPO, Daemon

DEMO = REPO / "conf" / "demo.toml"


def _json(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _pending(d: Daemon, cid: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = _json(d.agentctl("show", cid, "--json"))
        if info.get("pending"):
            return info["pending"][0]
        time.sleep(0.05)
    raise TimeoutError("no interaction became pending")


def test_demo_turn_answered_from_a_second_agentctl_then_a_kill_mid_turn(tmp_path: Path) -> None:
    d = Daemon(tmp_path).start()
    workdir = tmp_path / "work"
    workdir.mkdir()
    run = subprocess.Popen(
        [sys.executable, "-m", "agentctl", "--socket", str(d.socket), "run", "-p", "script", "-m", str(DEMO),
         "--cwd", str(workdir), "--json", "show me around"],
        env=d.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not (convs := _json(d.agentctl("ls", "--json"))["conversations"]):
            assert time.monotonic() < deadline and run.poll() is None, run.stderr.read() if run.poll() else ""
            time.sleep(0.05)
        cid = convs[0]["id"]

        answered = []
        for _ in range(4):
            inter = _pending(d, cid)
            kind = "form" if inter.get("elicitation") else inter["kind"]
            if kind == "permission":
                args = ["--allow"]
            elif kind == "question":
                args = ["--choice", "blue"]
            elif kind == "form":
                # A value out of bounds is refused (exit 8) and the form stays pending.
                bad = d.agentctl("answer", cid, inter["id"], "--field", "name=Ada", "--field", "lines=99")
                assert bad.returncode == 8, bad.stderr
                assert "lines" in bad.stderr
                args = ["--field", "name=Ada", "--field", "email=ada@example.com", "--field", "lines=3",
                        "--field", "verbose=yes"]
            else:
                args = ["--action", "autopilot"]
            result = d.agentctl("answer", cid, inter["id"], *args, "--json")
            assert result.returncode == 0, result.stderr
            answered.append(kind)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err
    assert answered == ["permission", "question", "form", "plan_review"]

    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["type"] == "result"  # the stream ends with the outcome
    assert any(line.get("type") == "delta" for line in lines)  # streamed live

    journal = d.journal(cid)
    assert [r["seq"] for r in journal] == list(range(1, len(journal) + 1))
    types = {r["type"] for r in journal}
    assert {"conversation", "prompt", "item", "turn", "interaction", "answer", "subagent", "title", "usage"} <= types
    answers = [r["data"] for r in journal if r["type"] == "answer"]
    assert len(answers) == 4 and not any(a.get("auto") for a in answers)
    assert journal[-1]["type"] == "turn" and journal[-1]["data"]["state"] == "completed"
    assert (workdir / "agentd-demo.txt").read_text() == "hello from agentd\n"

    # A second turn, killed while it waits for its permission.
    sent = _json(d.agentctl("send", cid, "again", "--json"))
    _pending(d, cid)
    d.kill()
    received = d.state_dir / "providers" / "script" / "received.jsonl"
    prompts_before = [json.loads(line)["text"] for line in received.read_text().splitlines()]
    assert prompts_before == ["show me around", "again"]

    d.start()
    try:
        journal = d.journal(cid)
        end = [r for r in journal if r["type"] == "turn" and r.get("run") == sent["run"]][-1]
        assert end["data"]["state"] == "failed" and end["data"]["reason"] == "run_interrupted"
        expired = [r["data"] for r in journal if r["type"] == "interaction" and r.get("run") == sent["run"]]
        assert expired[-1]["state"] == "expired"
        show = _json(d.agentctl("show", cid, "--json"))
        assert show["record"]["state"] == "idle"
        # The conversation takes a new prompt; nothing was resent.
        third = _json(d.agentctl("send", cid, "third", "--json"))
        _pending(d, cid)
        cancel = d.agentctl("cancel", cid)
        assert cancel.returncode == 0, cancel.stderr
        prompts = [json.loads(line)["text"] for line in received.read_text().splitlines()]
        assert prompts == ["show me around", "again", "third"]
        assert third["run"] != sent["run"]
    finally:
        d.stop()


def test_demo_does_what_you_answered_a_rejected_write_is_not_claimed_and_plan_feedback_is_acknowledged(tmp_path: Path) -> None:
    d = Daemon(tmp_path).start()
    try:
        workdir = tmp_path / "work"
        workdir.mkdir()
        cid = _json(d.agentctl("new", "-p", "script", "-m", str(DEMO), "--cwd", str(workdir), "--json"))["id"]
        sent = _json(d.agentctl("send", cid, "show me around", "--json"))
        answers = {
            "permission": ["--deny"],
            "question": ["--choice", "blue"],
            "form": ["--field", "name=Ada", "--field", "lines=3"],
            "plan_review": ["--feedback", "verify with a checksum instead"],
        }
        for _ in range(4):
            inter = _pending(d, cid)
            kind = "form" if inter.get("elicitation") else inter["kind"]
            result = d.agentctl("answer", cid, inter["id"], *answers[kind], "--json")
            assert result.returncode == 0, result.stderr
            answers.pop(kind)
        assert not answers
        deadline = time.monotonic() + 60
        while not [r for r in d.journal(cid) if r["type"] == "turn" and r.get("run") == sent["run"]
                   and r["data"]["state"] != "working"]:
            assert time.monotonic() < deadline, "the demo turn did not end"
            time.sleep(0.1)
        journal = d.journal(cid)
        said = "\n".join(r["data"].get("text", "") for r in journal
                         if r["type"] == "item" and r["data"]["kind"] == "assistant")
        assert not (workdir / "agentd-demo.txt").exists()
        assert "wrote agentd-demo.txt" not in said and "says hello" not in said, said
        assert "did not write agentd-demo.txt" in said, said
        assert "verify with a checksum instead" in said, said  # the feedback, acknowledged
        assert not [r for r in journal if r["type"] == "subagent"], "the verifier ran after the plan was refused"
        assert journal[-1]["type"] == "turn" and journal[-1]["data"]["state"] == "completed"
    finally:
        d.stop()
