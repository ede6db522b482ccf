"""A conversation whose working directory holds agentd's own files (a person running agents in
~, where agentd's config, environment file, runtime dir and state live): its checkpoints record
the user's files and none of agentd's (agentd.checkpoints, the daemon's own paths)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

from daemon_harness import Daemon

SCRIPT = '''
model = "writer"
delay_ms = 0
[[turn]]
[[turn.step]]
kind = "tool"
name = "bash"
command = "echo mine > mine.txt"
'''


def test_checkpoints_of_a_working_directory_holding_agentds_own_files_leave_them_out(tmp_path: Path) -> None:
    root = tmp_path / "home"
    root.mkdir()
    (root / "environment").write_text("SOME_API_KEY=secret\n")  # beside agentd.toml: the environment file
    (root / "environment").chmod(0o600)
    d = Daemon(root, "").start()
    try:
        (tmp_path / "writer.toml").write_text(SCRIPT)
        out = d.agentctl("--json", "run", "-p", "script", "-m", str(tmp_path / "writer.toml"), "--cwd", str(root),
                         "--yolo", "go", timeout=120)
        assert out.returncode == 0, out.stderr
        cid = json.loads(out.stdout.splitlines()[-1])["conversation"]
        trees = [r["data"]["tree"] for r in d.journal(cid) if r["type"] == "checkpoint" and r["data"].get("tree")]
        assert len(trees) == 2, d.journal(cid)
        git_dir = d.state_dir / "checkpoints" / hashlib.sha256(str(root).encode()).hexdigest()[:24] / "git"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        listed = subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", "-r", "--name-only", trees[-1]],
                                capture_output=True, text=True, env=env, check=True).stdout.split()
        assert (root / "mine.txt").exists(), [r for r in d.journal(cid) if r["type"] in ("item", "checkpoint")]
        assert "mine.txt" in listed
        # agentd.log is the harness's stdout here, not agentd's own file
        assert set(listed) <= {"mine.txt", "agentd.log"}, listed
    finally:
        d.stop()
