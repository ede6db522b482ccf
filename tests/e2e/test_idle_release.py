"""Idle release on a real runtime: Claude Code's process goes after ``idle_release_s``, and the next
prompt reopens the same session with its history, nothing resent (agentd.idle_release)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon_harness import Daemon
from runtimes_e2e import runtime_profile

pytestmark = pytest.mark.e2e


def _claude_processes(root: Path) -> list[int]:
    """Pids of Claude Code processes started for this test (their config dir is under ``root``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if f"CLAUDE_CONFIG_DIR={root / 'claude-config'}".encode() in environ:
            out.append(int(entry.name))
    return out


def _run(d: Daemon, cid: str, text: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(d.socket), "send", cid, text, "--follow", "--json"],
                          env=d.env, capture_output=True, text=True, timeout=120, cwd=d.root)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["state"] == "completed", proc.stdout[-2000:]


def test_an_idle_claude_conversation_lets_its_process_go_and_the_next_prompt_resumes_it(tmp_path: Path) -> None:
    with runtime_profile("claude", tmp_path) as rt:
        d = Daemon(tmp_path, rt.config_toml + "[runtimes]\nidle_release_s = 2.0\n", env=rt.env).start()
        try:
            rt.text_only("Nice to meet you.")
            work = tmp_path / "work"
            work.mkdir()
            cid = json.loads(d.agentctl("new", "-p", "claude", "--cwd", str(work), "--json").stdout)["id"]
            _run(d, cid, "My name is Ada Lovelace")
            assert _claude_processes(tmp_path), "no Claude Code process ran the turn"
            deadline = time.monotonic() + 30
            while _claude_processes(tmp_path) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not _claude_processes(tmp_path), "the idle conversation kept its Claude Code process"
            # Logged once close() returns, which can be a moment after the process is gone.
            while "conversation.runtime_released" not in d.log.read_text() and time.monotonic() < deadline + 10:
                time.sleep(0.1)
            assert "conversation.runtime_released" in d.log.read_text()
            _run(d, cid, "What is my name?")
            assert rt.saw_earlier_turn(d, cid, "My name is Ada Lovelace", "What is my name?")
            prompts = [r for r in d.journal(cid) if r["type"] == "prompt"]
            assert [p["data"]["text"] for p in prompts] == ["My name is Ada Lovelace", "What is my name?"]
            record = json.loads(d.agentctl("show", cid, "--json").stdout)["record"]
            assert record["provider_conversation_id"]  # the same session, reopened by id
        finally:
            d.stop()
