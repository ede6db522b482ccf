"""MCP servers that fail to start, on the real runtimes that report their servers' states:
the turn goes on, a notice item says which server failed and why, and `agentctl mcp status`
shows it failed."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conformance import Follower, _json, _new
from daemon_harness import Daemon
from runtimes_e2e import Runtime, runtime_profile
from test_conformance_mcp import mcp_toml, runtime_toml

pytestmark = pytest.mark.e2e

MISSING = "/nonexistent/agentd-test-mcp-server"


@pytest.fixture(params=["claude", "copilot", "codex"])
def rt(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runtime]:
    with runtime_profile(request.param, tmp_path) as runtime:
        yield runtime


def test_a_server_that_fails_to_start_is_a_notice_and_failed_in_status(rt: Runtime, tmp_path: Path, workdir: Path) -> None:
    config = runtime_toml(rt) + mcp_toml(tmp_path / "marker.txt") + mcp_toml(tmp_path / "x", name="broken", command=MISSING)
    d = Daemon(tmp_path, config, env=rt.env).start()
    try:
        rt.text_only("Nothing to do.")
        cid = _new(d, rt, workdir, "mcp", "--yolo")
        follower = Follower(d, cid, "Hello")
        assert follower.finish(180) == 0, follower.stderr()
        deadline = time.monotonic() + 60
        while True:
            status = {s["name"]: s for s in _json(d.agentctl("mcp", "status", cid, "--json"))["servers"]}
            if status["broken"]["state"] == "failed" or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert status["broken"]["state"] == "failed", status
        assert status["marker"]["state"] in ("connected", "pending"), status
        notices = [r["data"]["text"] for r in d.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "notice"]
        assert any("MCP server 'broken' failed to start" in n for n in notices), notices
        human = d.agentctl("mcp", "status", cid)
        assert human.returncode == 0 and "failed" in human.stdout, human.stdout
        assert "sk-marker-secret" not in json.dumps(status)
    finally:
        d.stop()
