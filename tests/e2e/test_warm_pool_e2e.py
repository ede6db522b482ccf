"""The warm pool on real runtimes (agentd.warm_pool): ``agentctl run`` takes the session made
ahead of time, the pool refills, another workdir starts cold, and a stop leaves no process.

What the daemon did is read from its own view (the record's provider conversation id) and its
log (``warm_pool.*``), never from timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from daemon_harness import Daemon
from runtimes_e2e import runtime_profile

pytestmark = pytest.mark.e2e


def _log(d: Daemon, event: str) -> list[dict[str, Any]]:
    out = []
    for line in d.log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("event") == event:
            out.append(entry)
    return out


def _wait_log(d: Daemon, event: str, count: int, timeout: float = 90.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _log(d, event)
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(f"no {count} x {event} in the daemon's log:\n{d.log.read_text()[-4000:]}")


def _run(d: Daemon, provider: str, cwd: Path, text: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(d.socket), "run", "-p", provider,
                           "--cwd", str(cwd), "--json", text],
                          env=d.env, capture_output=True, text=True, timeout=180, cwd=d.root)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["state"] == "completed", proc.stdout[-2000:]
    return result


def _processes_under(root: Path) -> list[int]:
    """Processes (not this one) whose command line or environment names ``root``."""
    needle = str(root).encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes() or needle in (entry / "environ").read_bytes():
                out.append(int(entry.name))
        except OSError:
            continue
    return out


@pytest.mark.parametrize("name", ["copilot", "claude", "codex", "acp:gemini"])
def test_run_takes_the_warm_session_the_pool_refills_a_mismatch_starts_cold_and_stop_leaves_nothing(
        tmp_path: Path, name: str) -> None:
    work, other = tmp_path / "work", tmp_path / "other"
    work.mkdir()
    other.mkdir()
    with runtime_profile(name, tmp_path) as rt:
        config = (f'[providers]\ndefault = "{name}"\n' + rt.config_toml
                  + f'[runtimes]\nwarm = 1\nwarm_workdir = "{work}"\n')
        d = Daemon(tmp_path, config, env=rt.env).start()
        try:
            rt.text_only("Warm hello.")
            [ready] = _wait_log(d, "warm_pool.ready", 1)
            pooled = ready["provider_conversation"]
            result = _run(d, name, work, "Say hello")
            record = json.loads(d.agentctl("show", result["conversation"], "--json").stdout)["record"]
            # The daemon's view: the conversation runs on the session made ahead of time.
            assert record["provider_conversation_id"] == pooled
            assert [e["provider_conversation"] for e in _log(d, "warm_pool.taken")] == [pooled]
            texts = [r["data"].get("text", "") for r in d.journal(result["conversation"]) if r["type"] == "item"]
            assert any("Warm hello." in t for t in texts), texts
            # The pool refills with a new session, never the one taken.
            refilled = _wait_log(d, "warm_pool.ready", 2)[1]["provider_conversation"]
            assert refilled != pooled
            # Another workdir: a cold start on a session of its own, not the pooled one.
            cold = _run(d, name, other, "Say hello")
            cold_record = json.loads(d.agentctl("show", cold["conversation"], "--json").stdout)["record"]
            assert cold_record["provider_conversation_id"] not in (pooled, refilled)
            assert [m["reason"] for m in _log(d, "warm_pool.miss")] == ["shape"]
            assert len(_log(d, "warm_pool.taken")) == 1
            # ...and the pool moves to that shape: the work-dir session is discarded, one for `other` made.
            _wait_log(d, "warm_pool.discarded", 1)
            _wait_log(d, "warm_pool.ready", 3)
        finally:
            d.stop()
        deadline = time.monotonic() + 15
        while _processes_under(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_under(tmp_path) == [], "a runtime outlived agentd"
        assert not list((d.state_dir / "runtimes").glob("*.json")), "a runtime record was left"
        # The sessions made ahead and never used were discarded: only the two prompted ones are kept.
        used = {pooled, cold_record["provider_conversation_id"]}
        if name == "copilot":
            kept = {p.name for p in (tmp_path / "copilot-home" / "session-state").iterdir() if not p.name.startswith(".")}
            assert kept == used
        if name == "claude":
            assert {p.stem for p in (d.state_dir / "providers" / "claude").glob("*.json")} == used


def test_a_killed_agentd_leaves_no_warm_runtime_behind(tmp_path: Path) -> None:
    """SIGKILL: nothing closes the pooled session, the keeper (agentd.procs) ends its runtime."""
    work = tmp_path / "work"
    work.mkdir()
    with runtime_profile("claude", tmp_path) as rt:
        config = '[providers]\ndefault = "claude"\n' + rt.config_toml + f'[runtimes]\nwarm = 2\nwarm_workdir = "{work}"\n'
        d = Daemon(tmp_path, config, env=rt.env).start()
        try:
            _wait_log(d, "warm_pool.ready", 2)
            assert _processes_under(tmp_path) and len(list((d.state_dir / "runtimes").glob("*.json"))) == 2
        finally:
            d.kill()
        deadline = time.monotonic() + 20
        while _processes_under(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_under(tmp_path) == [], "a warm runtime outlived a killed agentd"
