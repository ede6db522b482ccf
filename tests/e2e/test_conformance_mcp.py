"""Conformance columns ``mcp`` and ``host_tool``: MCP servers and host tools on every runtime.

``host_tool``: ``agentctl tool serve`` offers a command as tool ``stamp`` (through agentd's own
MCP server); the scripted model calls it; the command runs with the call's arguments, its output
reaches the model request that follows, and the journal holds the host tool item.

``mcp``: a real MCP server (tests/e2e/mcp_marker_server.py, built with the ``mcp`` package, on
stdio) is configured as ``[mcp.servers.marker]``; the scripted model calls its one tool, by the
name the runtime offers it under (``mcp__marker__write_marker`` for Claude Code, ...); the tool
writes the marker file, and the journal holds the tool item. A runtime whose capability ``mcp``
is false is ``unsupported``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conformance import Follower, _json, _new, _supported, _turn_ends
from daemon_harness import Daemon
from runtimes_e2e import Runtime

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
MARKER_SERVER = HERE / "mcp_marker_server.py"

#: scenario -> the capabilities it needs
SCENARIOS: dict[str, tuple[str, ...]] = {
    "mcp": ("mcp",),
    "host_tool": ("mcp",),
}


def mcp_toml(marker: Path, name: str = "marker", command: str = "") -> str:
    q = json.dumps
    cmd = command or sys.executable
    args = [] if command else [str(MARKER_SERVER), str(marker)]
    return (f"[mcp.servers.{name}]\ncommand = {q(cmd)}\nargs = {q(args)}\n"
            f"env = {{ MARKER_API_KEY = {q('sk-marker-secret-value-1234')} }}\n")


def runtime_toml(runtime: Runtime) -> str:
    """The runtime's agentd.toml, with Claude Code's tool search off: with it on, Claude Code lists
    MCP tools to the model by name only, to be fetched with ToolSearch first, which the scripted
    model does not do (a real model does)."""
    text = runtime.config_toml
    for table in ("[providers.claude.env]\n", "[providers.acp.claude.env]\n"):
        text = text.replace(table, table + 'ENABLE_TOOL_SEARCH = "false"\n')
    return text


@pytest.fixture(scope="module")
def daemon_config(runtime: Runtime) -> str:
    """The conformance daemon's, with the marker MCP server configured (it writes ``_marker(runtime)``)."""
    return runtime_toml(runtime) + "[mcp]\nhost_tools = true\nhost_tool_timeout_s = 30\n" + mcp_toml(_marker(runtime))


def _marker(runtime: Runtime) -> Path:
    return runtime.root / "marker.txt"


def call_tool_ending_in(runtime: Runtime, suffix: str, arguments: dict[str, Any]) -> list[str]:
    """Make the scripted model call the offered tool whose name ends in ``suffix``; returns the names
    it called (appended as it calls them). Falls back to the server's usual answers otherwise."""
    server = runtime.server
    assert server is not None
    server.reset()
    called: list[str] = []
    plain = type(server).decide

    def decide(tools: list[dict[str, Any]], last_is_tool_result: bool) -> tuple[str, Any]:
        from modelserver import _tool_names

        names = _tool_names(tools)
        match = [n for n in names if n.endswith(suffix)]
        if match and not last_is_tool_result:
            server.tool = match[0]  # the Gemini flavour calls its shell tool unless it is this one
            called.append(match[0])
            return "tool", (match[0], arguments)
        return plain(server, tools, last_is_tool_result)

    server.decide = decide  # type: ignore[method-assign]
    return called


@pytest.mark.parametrize("scenario", ["mcp"])
def test_mcp_server_tool_is_called_and_journaled(runtime: Runtime, daemon: Daemon, workdir: Path,
                                                 scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        return
    marker = _marker(runtime)
    marker.unlink(missing_ok=True)  # what this cell's tool call writes, not an earlier cell's
    called = call_tool_ending_in(runtime, "write_marker", {"text": "from-the-model"})
    cid = _new(daemon, runtime, workdir, scenario, "--yolo")
    assert _json(daemon.agentctl("show", cid, "--json"))["record"]["mcp"] == ["marker"]
    follower = Follower(daemon, cid, "Write the marker")
    assert follower.finish(180) == 0, follower.stderr()
    assert called, "the runtime offered the model no tool named *write_marker"
    request.node.user_properties.append(("note", f"tool {called[0]}"))
    assert "marker" in called[0], called
    assert marker.read_text().strip() == "from-the-model"
    tools = [r["data"] for r in daemon.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "tool"]
    assert any("write_marker" in json.dumps(t) for t in tools), tools
    assert _turn_ends(daemon, cid)[-1]["data"]["state"] == "completed"
    # The configured secret never reaches the journal, and `mcp ls` shows the env name only.
    journal_text = (daemon.state_dir / "conversations" / cid / "events.jsonl").read_text()
    assert "sk-marker-secret-value-1234" not in journal_text
    # Nor a command line agentd gives, which every local user reads (ps): the runtimes run now.
    # (claude-agent-acp's own SDK puts it on Claude Code's command line for the length of a turn:
    # docs/acp.md; after the turn, as here, no process of that cell holds it either.)
    assert daemon.proc is not None
    assert not _command_lines_holding(b"sk-marker-secret-value-1234", below=daemon.proc.pid)
    listed = _json(daemon.agentctl("mcp", "ls", "--json"))
    assert listed["servers"][0]["env"] == ["MARKER_API_KEY"]
    assert "sk-marker-secret" not in json.dumps(listed)
    status = _json(daemon.agentctl("mcp", "status", cid, "--json"))
    servers = {s["name"]: s for s in status["servers"]}
    assert set(servers) == {"marker", "agentd"}  # agentd's own: host tools are on in this module
    server = servers["marker"]
    if status["reported"]:
        assert server["state"] == "connected", server
        assert server.get("tools") is None or any("write_marker" in t for t in server["tools"]), server
    else:
        assert server["state"] == "unknown"


def _command_lines_holding(secret: bytes, *, below: int) -> list[int]:
    """The pids of ``below``'s descendants (and itself) whose /proc/PID/cmdline holds ``secret``
    (other tests' processes may run alongside: xdist)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
                parents[int(entry.name)] = int(stat[stat.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError):
                continue

    def under(pid: int) -> bool:
        for _ in range(64):
            if pid == below:
                return True
            pid = parents.get(pid, 0)
            if pid <= 1:
                return False
        return False

    found = []
    for pid in parents:
        if under(pid):
            try:
                if secret in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
            except OSError:
                continue
    return found


STAMP = """import json, sys
args = json.load(sys.stdin)
open(sys.argv[1], "w").write(args["text"])
print("stamped " + args["text"])
"""


@pytest.mark.parametrize("scenario", ["host_tool"])
def test_host_tool_served_by_a_client_is_called_by_the_agent(runtime: Runtime, daemon: Daemon, workdir: Path,
                                                             tmp_path: Path, scenario: str,
                                                             request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        return
    stamp, out = tmp_path / "stamp.py", tmp_path / "stamped.txt"
    stamp.write_text(STAMP)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}))
    called = call_tool_ending_in(runtime, "stamp", {"text": "host-tool-ran"})
    cid = _new(daemon, runtime, workdir, scenario, "--yolo")
    server = subprocess.Popen(
        [sys.executable, "-m", "agentctl", "--socket", str(daemon.socket), "tool", "serve", cid, "--name", "stamp",
         "--description", "Stamp the given text into the test's file.", "--schema", str(schema), "--json", "--",
         sys.executable, str(stamp), str(out)],
        env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not any(t["served"] for t in _json(daemon.agentctl("tool", "ls", cid, "--json")).get("tools", [])):
            assert time.monotonic() < deadline and server.poll() is None, server.stderr.read() if server.poll() else ""
            time.sleep(0.2)
        follower = Follower(daemon, cid, "Stamp the text")
        assert follower.finish(180) == 0, follower.stderr()
        assert called, "the runtime offered the model no tool named *stamp"
        request.node.user_properties.append(("note", f"tool {called[0]}"))
        assert out.read_text() == "host-tool-ran"
        assert runtime.server is not None
        after = [r for r in runtime.server.requests if "stamped host-tool-ran" in json.dumps(r)]
        assert after, "the tool's result did not reach the model"
        host = [r["data"] for r in daemon.journal(cid) if r["type"] == "item" and r["data"]["id"].startswith("host-")]
        assert host and host[-1]["tool"]["status"] == "completed", host
        assert "host-tool-ran" in host[-1]["tool"]["input"] and "stamped host-tool-ran" in host[-1]["tool"]["output"]
    finally:
        server.terminate()
        server.wait(10)
