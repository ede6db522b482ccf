"""Conformance column ``checkpoint``: agentd's own per-turn file checkpoints on every runtime.

One turn per cell: the runtime's own shell tool writes a file (yolo answers its permission);
``agentctl diff`` shows the file added, with its line; ``agentctl revert`` takes it away again
and ``diff`` of the revert shows it deleted. agentd records the working directory itself, so
the capability is true on every runtime while ``[checkpoints]`` is on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import Follower, _json, _new, _supported
from daemon_harness import Daemon
from runtimes_e2e import Runtime

pytestmark = pytest.mark.e2e

#: scenario -> the capabilities it needs
SCENARIOS: dict[str, tuple[str, ...]] = {
    "checkpoint": ("checkpoints", "permissions"),
}

@pytest.fixture(scope="module")
def daemon_config(runtime: Runtime) -> str:
    """conftest's, with a checkpoint time bound a loaded test machine never reaches (the
    default, 0.15 s, is what a turn may wait; past it a checkpoint is skipped, which
    tests/integration/test_checkpoints.py covers)."""
    return runtime.config_toml + "\n[checkpoints]\ntimeout_s = 30\n"


FILE = "checkpoint.txt"
COMMAND = f"echo written by a turn > {FILE}"


@pytest.mark.parametrize("scenario", ["checkpoint"])
def test_diff_shows_the_file_a_tool_wrote_and_revert_removes_it(runtime: Runtime, daemon: Daemon, workdir: Path,
                                                                 scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        return
    (workdir / "kept.txt").write_text("there before the turn\n")
    runtime.call_tool(COMMAND)
    cid = _new(daemon, runtime, workdir, scenario, "--yolo")
    follower = Follower(daemon, cid, "Run the command")
    assert follower.finish() == 0, follower.stderr()
    assert (workdir / FILE).read_text() == "written by a turn\n"
    run = follower.result.get("run") or next(line["run"] for line in follower.lines if line.get("run"))

    diff = _json(daemon.agentctl("--json", "diff", cid))
    assert diff["run"] == run and diff["kind"] == "turn", diff
    files = {f["path"]: f for f in diff["files"]}
    assert files[FILE]["status"] == "added", diff["files"]
    assert files[FILE]["hunks"][0]["lines"] == ["+written by a turn"]
    assert "kept.txt" not in files

    reverted = _json(daemon.agentctl("--json", "revert", cid, "--run", run, "--yes"))
    assert {"path": FILE, "action": "delete", "changed_since": False} in reverted["files"]
    assert not (workdir / FILE).exists()
    assert (workdir / "kept.txt").read_text() == "there before the turn\n"
    undo = _json(daemon.agentctl("--json", "diff", cid, "--run", reverted["revert"]))
    assert undo["kind"] == "revert" and {f["path"]: f["status"] for f in undo["files"]}[FILE] == "deleted"
