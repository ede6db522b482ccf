"""``agentctl set-model`` and ``new --effort`` through a real daemon: checked against the
provider's catalog before anything reaches it, applied from the next turn, busy during a
turn unless queued, journaled, and asked for again after a daemon restart."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agentd import wire
from daemon_harness import Daemon

AGENT = Path(__file__).with_name("acp_models_agent.py")


def _script(path: Path, name: str, *, slow: bool = False) -> Path:
    step = 'kind = "text"\ntext = "from %s"\n' % name
    if slow:  # runs until steered
        step += '[[turn.step]]\nkind = "wait"\nuntil = "steer"\n'
    path.write_text(f'model = "{name}"\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\n{step}')
    return path


def _turn_text(d: Daemon, cid: str, text: str) -> str:
    with d.client() as client:
        client.subscribe(cid, after=d.journal(cid)[-1]["seq"])
        records = client.follow(client.request(wire.Send, conversation=cid, text=text)["run"])
    assert records[-1].type == "turn"
    return "".join(msgspec_item_text(r) for r in records if r.type == "item")


def msgspec_item_text(rec: wire.Record) -> str:
    data = json.loads(bytes(rec.data))
    return data.get("text", "") if data.get("kind") == "assistant" else ""


def test_set_model_switches_the_script_from_the_next_turn_and_survives_a_restart(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    a, b, slow, c = (_script(tmp_path / f"{n}.toml", n, slow=n == "slow") for n in ("a", "b", "slow", "c"))
    d = Daemon(tmp_path).start()
    try:
        cid = json.loads(d.agentctl("--json", "new", "-p", "script", "-m", str(a), "--cwd", str(work)).stdout)["id"]
        assert "from a" in _turn_text(d, cid, "one")
        done = d.agentctl("set-model", cid, str(b))
        assert done.returncode == 0, done.stderr
        assert "from b" in _turn_text(d, cid, "two")
        picks = [r["data"] for r in d.journal(cid) if r["type"] == "model_selection" and r["data"].get("source") == "user"]
        assert picks == [{"model": str(b), "source": "user"}]
        # During a turn: busy, unless queued behind it.
        assert d.agentctl("set-model", cid, str(slow)).returncode == 0
        with d.client() as client:
            client.subscribe(cid, after=d.journal(cid)[-1]["seq"])
            run = client.request(wire.Send, conversation=cid, text="slow one")["run"]
            busy = d.agentctl("set-model", cid, str(c))
            assert busy.returncode == 7 and "--after-turn" in busy.stderr
            queued = d.agentctl("--json", "set-model", cid, str(c), "--after-turn")
            assert queued.returncode == 0, queued.stderr
            assert json.loads(queued.stdout)["next_model"]["model"] == str(c)
            shown = d.agentctl("show", cid)
            assert f"next turn: {c}" in shown.stdout
            client.request(wire.Steer, conversation=cid, text="done")
            records = client.follow(run)
        assert "from slow" in "".join(msgspec_item_text(r) for r in records if r.type == "item")
        assert "from c" in _turn_text(d, cid, "after the queue")
        assert d.record(cid)["model"] == str(c) and "next_model" not in d.record(cid)
    finally:
        d.stop()
    d.start()
    try:
        assert "from c" in _turn_text(d, cid, "after a restart")
        unsupported = d.agentctl("set-model", cid, "--effort", "high")
        assert unsupported.returncode == 1 and "effort" in unsupported.stderr
        gone = d.agentctl("set-model", cid, str(tmp_path / "missing.toml"))
        assert gone.returncode == 8
        assert d.record(cid)["model"] == str(c)
    finally:
        d.stop()


def test_models_are_checked_against_the_catalog_before_the_runtime_sees_them(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "agent.log"
    config = (f'[providers.acp.models]\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(AGENT))}]\n'
              f'env = {{ MODELS_AGENT_LOG = {json.dumps(str(log))} }}\nstartup_timeout_s = 10.0\n')
    d = Daemon(tmp_path, config).start()
    try:
        listed = json.loads(d.agentctl("--json", "models", "acp:models").stdout)
        assert [m["id"] for m in listed["models"]] == ["small", "large"]
        refused = d.agentctl("new", "-p", "acp:models", "-m", "huge", "--cwd", str(work))
        assert refused.returncode == 8 and "small, large" in refused.stderr
        assert json.loads(d.agentctl("--json", "ls").stdout)["conversations"] == []
        cid = json.loads(d.agentctl("--json", "new", "-p", "acp:models", "--cwd", str(work)).stdout)["id"]
        assert "model:small" in _turn_text(d, cid, "hi")
        bad = d.agentctl("set-model", cid, "huge")
        assert bad.returncode == 8 and "small, large" in bad.stderr
        assert "huge" not in log.read_text()
        assert d.agentctl("set-model", cid, "large").returncode == 0
        assert "model:large" in _turn_text(d, cid, "again")
        caps = json.loads(d.agentctl("--json", "providers").stdout)
        assert any(p["name"] == "acp:models" and p["capabilities"].get("set_model") for p in caps["providers"]), caps
    finally:
        d.stop()
    d.start()
    try:
        assert "model:large" in _turn_text(d, cid, "after a restart")  # asked for again on reopen
    finally:
        d.stop()
    assert log.read_text().splitlines()[-1] == "prompt large"


def test_set_model_takes_a_script_path_relative_to_agentctls_directory_as_new_does(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    d = Daemon(tmp_path).start()
    a, b = (_script(d.root / f"{n}.toml", n) for n in ("a", "b"))
    try:
        cid = json.loads(d.agentctl("--json", "new", "-p", "script", "-m", a.name, "--cwd", str(work)).stdout)["id"]
        assert d.record(cid)["model"] == str(a)  # new made it absolute: the daemon has another cwd
        done = d.agentctl("set-model", cid, b.name)
        assert done.returncode == 0, done.stderr
        assert d.record(cid)["model"] == str(b)
        assert "from b" in _turn_text(d, cid, "two")
    finally:
        d.stop()
