"""agentd.procs.run_kept: a short runtime command under the keeper (``claude auth status``, ``logout``):
its output and status, and on a timeout nothing of it left, its record dropped."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio

from agentd import procs


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for us
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


async def test_output_and_status_come_back_and_the_record_goes(tmp_path: Path) -> None:
    status, out, err = await procs.run_kept(["sh", "-c", "echo out; echo err >&2; exit 3"], state_dir=tmp_path,
                                            what="test", env=dict(os.environ), timeout_s=30)
    assert (status, out, err) == (3, b"out\n", b"err\n")
    assert list(procs.records_dir(tmp_path).glob("*.json")) == []


async def test_past_its_deadline_the_command_and_its_children_are_ended(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $! > {pids}; echo $$ >> {pids}; wait"
    with pytest.raises(trio.TooSlowError):
        await procs.run_kept(["sh", "-c", script], state_dir=tmp_path, what="test", env=dict(os.environ),
                             timeout_s=1.5)
    started = [int(x) for x in pids.read_text().split()]
    assert len(started) == 2
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in started) and time.monotonic() < deadline:
        await trio.sleep(0.05)
    assert not any(_alive(p) for p in started)
    assert list(procs.records_dir(tmp_path).glob("*.json")) == []


async def test_a_missing_command_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await procs.run_kept(["no-such-command-here"], state_dir=tmp_path, what="test", env=dict(os.environ),
                             timeout_s=5)
