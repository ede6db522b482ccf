"""MCP servers through the real daemon and agentctl: config, choice at `new`, what reaches
the runtime (an ACP agent that records its session/new and session/load), `mcp ls`,
`mcp status`, and secrets that never leave for the journal, the log or the CLI."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon_harness import Daemon

AGENT = Path(__file__).with_name("acp_mcp_agent.py")
TOKEN = "sk-mcp-test-secret-0123456789"
BEARER = "Bearer hdr-secret-abcdef012345"


def _config(log: Path, http: bool) -> str:
    q = json.dumps
    return (
        "[providers.copilot]\nenabled = false\n[providers.claude]\nenabled = false\n[providers.codex]\nenabled = false\n"
        f"[providers.acp.rec]\ncommand = {q([sys.executable, str(AGENT)])}\n"
        f"[providers.acp.rec.env]\nMCP_AGENT_LOG = {q(str(log))}\nMCP_AGENT_HTTP = {q('1' if http else '0')}\n"
        "[mcp.servers.tools]\ncommand = \"/usr/bin/my-mcp\"\nargs = [\"--stdio\"]\n"
        f"env = {{ SERVICE_TOKEN = {q(TOKEN)}, MODE = \"fast\" }}\n"
        "[mcp.servers.remote]\nurl = \"https://mcp.example.com/mcp\"\n"
        f"headers = {{ Authorization = {q(BEARER)} }}\n"
        "[mcp.servers.optin]\ncommand = \"/usr/bin/other-mcp\"\ndefault = false\n"
    )


@contextlib.contextmanager
def _daemon(tmp_path: Path, http: bool) -> Iterator[tuple[Daemon, Path, bool]]:
    log = tmp_path / "agent-mcp.jsonl"
    d = Daemon(tmp_path, _config(log, http)).start()
    try:
        yield d, log, http
    finally:
        d.stop()


@pytest.fixture(params=[False, True], ids=["no-http", "http"])
def both(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Daemon, Path, bool]]:
    """A daemon whose ACP agent does or does not advertise mcpCapabilities.http."""
    with _daemon(tmp_path, request.param) as setup:
        yield setup


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Daemon, Path, bool]]:
    with _daemon(tmp_path, False) as setup:
        yield setup


def _json(cp: Any) -> Any:
    assert cp.returncode == 0, cp.stderr
    return json.loads(cp.stdout)


def _sessions(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_default_servers_reach_the_acp_agent_in_its_form_and_secrets_stay_out(both: tuple[Daemon, Path, bool],
                                                                             tmp_path: Path) -> None:
    d, log, http = both
    rec = _json(d.agentctl("new", "-p", "acp:rec", "--cwd", str(tmp_path), "--json"))
    assert rec["mcp"] == ["tools", "remote"]  # optin has default = false
    (session,) = _sessions(log)
    servers = {s["name"]: s for s in session["mcpServers"]}
    assert servers["tools"] == {"name": "tools", "command": "/usr/bin/my-mcp", "args": ["--stdio"],
                                "env": [{"name": "SERVICE_TOKEN", "value": TOKEN}, {"name": "MODE", "value": "fast"}]}
    if http:
        assert servers["remote"] == {"type": "http", "name": "remote", "url": "https://mcp.example.com/mcp",
                                     "headers": [{"name": "Authorization", "value": BEARER}]}
    else:  # the agent does not advertise mcpCapabilities.http: left out, and a notice says so
        assert "remote" not in servers
    run = d.agentctl("send", rec["id"], "hello", "--follow", "--json")
    assert run.returncode == 0, run.stderr
    notices = [r["data"]["text"] for r in d.journal(rec["id"]) if r["type"] == "item" and r["data"]["kind"] == "notice"]
    assert any("'remote' failed" in n and "HTTP" in n for n in notices) != http, notices
    status = _json(d.agentctl("mcp", "status", rec["id"], "--json"))
    assert [(s["name"], s["state"]) for s in status["servers"]] == [("tools", "unknown"), ("remote", "unknown")]
    assert status["reported"] is False
    human = d.agentctl("mcp", "status", rec["id"])
    assert human.returncode == 0 and "does not report" in human.stderr
    # The secrets went to the runtime only: never the journal, the record, the daemon's log, or agentctl.
    listed = d.agentctl("mcp", "ls", "--json")
    shown = d.agentctl("show", rec["id"], "--json")
    for text in (d.log.read_text(), (d.state_dir / "conversations" / rec["id"] / "events.jsonl").read_text(),
                 json.dumps(d.record(rec["id"])), listed.stdout, shown.stdout):
        assert TOKEN not in text and "hdr-secret" not in text


def test_reopen_after_a_restart_hands_the_same_servers_on_session_load(setup: tuple[Daemon, Path, bool],
                                                                      tmp_path: Path) -> None:
    d, log, http = setup
    rec = _json(d.agentctl("new", "-p", "acp:rec", "--cwd", str(tmp_path), "--mcp", "optin", "--json"))
    assert rec["mcp"] == ["optin"]
    d.stop()
    d.start()
    run = d.agentctl("send", rec["id"], "again", "--follow", "--json")
    assert run.returncode == 0, run.stderr
    new, load = _sessions(log)
    assert new["method"] == "session/new" and load["method"] == "session/load"
    assert [s["name"] for s in load["mcpServers"]] == ["optin"] == [s["name"] for s in new["mcpServers"]]


def test_choosing_servers_at_new(setup: tuple[Daemon, Path, bool], tmp_path: Path) -> None:
    d, log, http = setup
    none = _json(d.agentctl("new", "-p", "acp:rec", "--cwd", str(tmp_path), "--no-mcp", "--json"))
    assert none["mcp"] == []
    assert _sessions(log)[-1]["mcpServers"] == []
    two = _json(d.agentctl("new", "-p", "acp:rec", "--cwd", str(tmp_path), "--mcp", "optin", "--mcp", "tools", "--json"))
    assert two["mcp"] == ["optin", "tools"]
    assert [s["name"] for s in _sessions(log)[-1]["mcpServers"]] == ["optin", "tools"]
    unknown = d.agentctl("new", "-p", "acp:rec", "--cwd", str(tmp_path), "--mcp", "nope")
    assert unknown.returncode == 8 and "unknown MCP server 'nope'" in unknown.stderr
    both = d.agentctl("new", "-p", "acp:rec", "--cwd", str(tmp_path), "--mcp", "tools", "--no-mcp")
    assert both.returncode == 2
    # The script provider cannot take MCP servers: none by default, and asking is unsupported.
    script = _json(d.agentctl("new", "-p", "script", "--cwd", str(tmp_path), "--json"))
    assert script["mcp"] == []
    refused = d.agentctl("new", "-p", "script", "--cwd", str(tmp_path), "--mcp", "tools")
    assert refused.returncode == 1 and "cannot take MCP servers" in refused.stderr


def test_mcp_ls_lists_servers_without_secrets(setup: tuple[Daemon, Path, bool]) -> None:
    d, _, http = setup
    listed = _json(d.agentctl("mcp", "ls", "--json"))
    by_name = {s["name"]: s for s in listed["servers"]}
    assert by_name["tools"]["transport"] == "stdio" and by_name["tools"]["env"] == ["MODE", "SERVICE_TOKEN"]
    assert by_name["remote"]["transport"] == "http" and by_name["remote"]["headers"] == ["Authorization"]
    assert "acp:rec" in by_name["tools"]["default_for"] and "acp:rec" not in by_name["optin"].get("default_for", [])
    assert "script" not in by_name["tools"]["default_for"]  # cannot take them
    human = d.agentctl("mcp", "ls")
    assert human.returncode == 0 and "remote" in human.stdout and TOKEN not in human.stdout
