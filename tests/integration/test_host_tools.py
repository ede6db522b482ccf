"""Host tools through the real daemon: `agentctl tool serve` registers and serves a tool, and
agentd's own MCP server (the relay, started here exactly as a runtime starts it, from what an
ACP agent was handed) lists it, announces the change, and calls it; a call whose client has gone
fails after the timeout with a clear error; refused names and providers."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import pytest

from agentd import contract as c
from agentd import wire
from daemon_harness import Daemon

AGENT = Path(__file__).with_name("acp_mcp_agent.py")
STAMP = "import json, sys\nargs = json.load(sys.stdin)\nprint('stamped ' + args['text'])\n"


@pytest.fixture
def d(tmp_path: Path) -> Iterator[Daemon]:
    q = json.dumps
    log = tmp_path / "agent-mcp.jsonl"
    config = (
        "[providers.copilot]\nenabled = false\n[providers.claude]\nenabled = false\n[providers.codex]\nenabled = false\n"
        f"[providers.acp.rec]\ncommand = {q([sys.executable, str(AGENT)])}\n"
        f"[providers.acp.rec.env]\nMCP_AGENT_LOG = {q(str(log))}\n"
        "[mcp]\nhost_tools = true\nhost_tool_timeout_s = 1.5\nhost_tool_result_bytes = 256\n"
    )
    daemon = Daemon(tmp_path, config).start()
    daemon.agent_log = log  # type: ignore[attr-defined]
    try:
        yield daemon
    finally:
        daemon.stop()


class Relay:
    """agentd's MCP server as the runtime was told to start it; MCP messages in and out."""

    def __init__(self, server: dict[str, Any], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([server["command"], *server["args"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.out: Queue[dict[str, Any]] = Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 1

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.out.put(json.loads(line))

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def wait_for(self, pred: Any, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.out.get(timeout=max(0.01, deadline - time.monotonic()))
            except Empty:
                raise TimeoutError("no such MCP message from the relay") from None
            if pred(msg):
                return msg

    def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = 20.0) -> dict[str, Any]:
        rid = self.next_id
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        return self.wait_for(lambda m: m.get("id") == rid, timeout)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(10)


def _host_items(d: Daemon, cid: str) -> list[dict[str, Any]]:
    return [r["data"] for r in d.journal(cid) if r["type"] == "item" and r["data"]["id"].startswith("host-")]


def test_served_tool_is_listed_announced_and_called_through_agentds_mcp_server(d: Daemon, tmp_path: Path) -> None:
    rec = json.loads(d.agentctl("new", "-p", "acp:rec", "--cwd", str(tmp_path), "--json").stdout)
    cid = rec["id"]
    (session,) = [json.loads(line) for line in d.agent_log.read_text().splitlines()]  # type: ignore[attr-defined]
    (server,) = [s for s in session["mcpServers"] if s["name"] == "agentd"]
    assert server["args"][:2] == ["-m", "agentd.host_tools_relay"] and cid in server["args"]
    relay = Relay(server, d.env)
    serve: subprocess.Popen[str] | None = None
    try:
        init = relay.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
        assert init["result"]["capabilities"]["tools"]["listChanged"] is True
        relay.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert relay.request("tools/list")["result"]["tools"] == []
        stamp = tmp_path / "stamp.py"
        stamp.write_text(STAMP)
        schema = tmp_path / "schema.json"
        schema.write_text(json.dumps({"type": "object", "properties": {"text": {"type": "string"}}}))
        serve = subprocess.Popen(
            [sys.executable, "-m", "agentctl", "--socket", str(d.socket), "tool", "serve", cid, "--name", "stamp",
             "--description", "Stamp text.", "--schema", str(schema), "--json", "--", sys.executable, str(stamp)],
            env=d.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        relay.wait_for(lambda m: m.get("method") == "notifications/tools/list_changed")
        (tool,) = relay.request("tools/list")["result"]["tools"]
        assert tool == {"name": "stamp", "description": "Stamp text.",
                        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}
        deadline = time.monotonic() + 20  # served once the registration is done
        while not json.loads(d.agentctl("tool", "ls", cid, "--json").stdout)["tools"][0]["served"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        done = relay.request("tools/call", {"name": "stamp", "arguments": {"text": "x" * 400}})
        assert done["result"] == {"content": [{"type": "text", "text": "stamped " + "x" * 400 + "\n"}], "isError": False}
        item = _host_items(d, cid)[-1]
        assert item["tool"]["status"] == "completed" and "x" * 400 in item["tool"]["input"]
        assert len(item["tool"]["output"]) == 256 and item["tool"]["cut"] > 0  # bounded in the journal
        line = json.loads(serve.stdout.readline())  # type: ignore[union-attr]
        assert line["name"] == "stamp" and line["exit_code"] == 0 and line["arguments"] == {"text": "x" * 400}
        # The serving client goes away: the next call fails after host_tool_timeout_s, clearly.
        serve.terminate()
        serve.wait(10)
        started = time.monotonic()
        failed = relay.request("tools/call", {"name": "stamp", "arguments": {"text": "y"}})
        assert failed["result"]["isError"] is True
        text = failed["result"]["content"][0]["text"]
        assert "host tool 'stamp'" in text and "no answer" in text and "1.5 s" in text, text
        assert 1.0 < time.monotonic() - started < 10
        assert _host_items(d, cid)[-1]["tool"]["status"] == "failed"
        assert json.loads(d.agentctl("tool", "ls", cid, "--json").stdout)["tools"][0]["served"] is False
        # The conversation goes on.
        run = d.agentctl("send", cid, "still there?", "--follow", "--json")
        assert run.returncode == 0, run.stderr
    finally:
        if serve is not None and serve.poll() is None:
            serve.kill()
        relay.close()


def test_names_that_shadow_a_runtimes_tools_and_providers_without_mcp_are_refused(d: Daemon, tmp_path: Path) -> None:
    cid = json.loads(d.agentctl("new", "-p", "acp:rec", "--cwd", str(tmp_path), "--json").stdout)["id"]
    shadow = d.agentctl("tool", "serve", cid, "--name", "Bash", "--", "true")
    assert shadow.returncode == 8 and "runtime's own tool" in shadow.stderr
    bad = d.agentctl("tool", "serve", cid, "--name", "has space", "--", "true")
    assert bad.returncode == 8
    script = json.loads(d.agentctl("new", "-p", "script", "--cwd", str(tmp_path), "--json").stdout)["id"]
    refused = d.agentctl("tool", "serve", script, "--name", "stamp", "--", "true")
    assert refused.returncode == 1 and "cannot take MCP servers" in refused.stderr
    gone = d.agentctl("tool", "serve", "cnope", "--name", "stamp", "--", "true")
    assert gone.returncode == 6
    empty = d.agentctl("tool", "ls", cid, "--json")
    assert json.loads(empty.stdout)["tools"] == []


def test_with_host_tools_off_a_provider_without_mcp_is_named_as_the_reason(tmp_path: Path) -> None:
    # It said "host tools are off"; turning them on (and a stop and start) only led to the real refusal.
    daemon = Daemon(tmp_path, "").start()
    try:
        script = json.loads(daemon.agentctl("new", "-p", "script", "--cwd", str(tmp_path), "--json").stdout)["id"]
        refused = daemon.agentctl("tool", "serve", script, "--name", "stamp", "--", "true")
        assert refused.returncode == 1 and "cannot take MCP servers" in refused.stderr, refused.stderr
        assert "host_tools" not in refused.stderr
    finally:
        daemon.stop()


def test_registrations_are_bounded_and_end_with_their_conversation(d: Daemon, tmp_path: Path) -> None:
    # They outlive the client that made them (it may come back) and every listing carries them all.
    cid = json.loads(d.agentctl("new", "-p", "acp:rec", "--cwd", str(tmp_path), "--json").stdout)["id"]
    with d.client() as client:
        with pytest.raises(c.Invalid, match="8192"):
            client.request(wire.RegisterTool, conversation=cid, name="wordy", description="d" * 8193)
        big = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100}
                                                for i in range(700)}}
        with pytest.raises(c.LimitExceeded, match="input_schema"):
            client.request(wire.RegisterTool, conversation=cid, name="huge", input_schema=big)
        for i in range(64):
            client.request(wire.RegisterTool, conversation=cid, name=f"t{i}", description="d" * 8192)
        with pytest.raises(c.LimitExceeded, match="64 host tools"):
            client.request(wire.RegisterTool, conversation=cid, name="one_more")
        client.request(wire.RegisterTool, conversation=cid, name="t7", description="taken over")  # not a new one
    listed = json.loads(d.agentctl("tool", "ls", cid, "--json").stdout)["tools"]
    assert len(listed) == 64 and not any(t["served"] for t in listed)  # their client is gone
    assert d.agentctl("rm", cid).returncode == 0
    with d.client() as client:
        with pytest.raises(c.NotFound):
            client.request(wire.ListHostTools, conversation=cid)


def _relay_for(d: Daemon, tmp_path: Path) -> tuple[str, Relay]:
    cid = json.loads(d.agentctl("new", "-p", "acp:rec", "--cwd", str(tmp_path), "--json").stdout)["id"]
    sessions = [json.loads(line) for line in d.agent_log.read_text().splitlines()]  # type: ignore[attr-defined]
    (server,) = [s for s in sessions[-1]["mcpServers"] if s["name"] == "agentd"]
    relay = Relay(server, d.env)
    relay.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}})
    return cid, relay


def test_an_agents_host_tool_calls_are_bounded_and_a_call_taken_but_never_answered_fails_at_the_timeout(
        d: Daemon, tmp_path: Path) -> None:
    from agentd import wire
    from agentd.host_tools import MAX_CALLS_IN_FLIGHT

    cid, relay = _relay_for(d, tmp_path)
    try:
        with d.client() as serving:
            serving.request(wire.RegisterTool, conversation=cid, name="slow")
            # Taken, then never answered by a client that stays connected: it fails at the timeout (1.5 s).
            started = time.monotonic()
            relay.send({"jsonrpc": "2.0", "id": 900, "method": "tools/call",
                        "params": {"name": "slow", "arguments": {"blob": "b" * 100_000}}})
            taken = serving.request(wire.NextToolCall, conversation=cid, name="slow", wait_s=10)
            assert taken["arguments"] == {"blob": "b" * 100_000}  # the serving client gets the whole input
            failed = relay.wait_for(lambda m: m.get("id") == 900)
            assert 1.0 < time.monotonic() - started < 10
            text = failed["result"]["content"][0]["text"]
            assert failed["result"]["isError"] and "did not answer within 1.5 s" in text, text
            item = _host_items(d, cid)[-1]
            assert item["tool"]["status"] == "failed" and len(item["tool"]["input"]) <= 16 * 1024  # cut, as all tool input

            # A flood of calls: those past the bound are answered an error at once, and the daemon
            # keeps serving everyone else (each call in flight holds a connection).
            for n in range(60):
                relay.send({"jsonrpc": "2.0", "id": 1000 + n, "method": "tools/call", "params": {"name": "slow"}})
            refused = [relay.wait_for(lambda m: str(m.get("id", "")).startswith("10"), timeout=5) for _ in range(60 - MAX_CALLS_IN_FLIGHT)]
            assert all(m["result"]["isError"] and "in flight" in m["result"]["content"][0]["text"] for m in refused)
            status = d.agentctl("status", "--json")
            assert status.returncode == 0, status.stderr
            for _ in range(MAX_CALLS_IN_FLIGHT):  # the others end at the timeout
                assert relay.wait_for(lambda m: str(m.get("id", "")).startswith("10"), timeout=10)["result"]["isError"]
    finally:
        relay.close()


def test_a_call_the_agent_gave_up_on_is_taken_by_no_client_and_a_closed_conversation_takes_no_host_tool(
        d: Daemon, tmp_path: Path) -> None:
    from agentd import contract as c
    from agentd import wire

    cid, relay = _relay_for(d, tmp_path)
    with d.client() as serving:
        serving.request(wire.RegisterTool, conversation=cid, name="later")
        relay.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "later"}})
        deadline = time.monotonic() + 10
        while not [i for i in _host_items(d, cid) if i["tool"].get("status", "running") == "running"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        relay.proc.kill()  # the runtime went away mid-call
        relay.proc.wait(10)
        while not [i for i in _host_items(d, cid) if i["tool"].get("status") == "failed"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Journaled as cancelled, and so never run by the client after.
        assert serving.request(wire.NextToolCall, conversation=cid, name="later", wait_s=0.5) is None

        assert d.agentctl("close", cid).returncode == 0
        with pytest.raises(c.Closed):
            serving.request(wire.RegisterTool, conversation=cid, name="again")
        closed = serving.request(wire.CallHostTool, conversation=cid, name="later")
        assert closed["error"] is True and "is closed" in closed["output"]


def test_arguments_nested_past_the_bound_are_refused_and_take_no_call_slot(d: Daemon, tmp_path: Path) -> None:
    # Arguments that decode near the interpreter's recursion limit failed to encode again inside
    # the call, and each such call kept its slot: MAX_CALLS_IN_FLIGHT of them disabled the host
    # tools of every conversation on that runtime until a restart.
    from agentd.contract import MAX_JSON_NESTING
    from agentd.host_tools import MAX_CALLS_IN_FLIGHT

    def nested(levels: int) -> str:
        return '{"a":' * levels + "1" + "}" * levels

    cid, relay = _relay_for(d, tmp_path)
    assert relay.proc.stdin is not None
    try:
        with d.client() as serving:
            serving.request(wire.RegisterTool, conversation=cid, name="stamp")
            for n, levels in enumerate([977] * MAX_CALLS_IN_FLIGHT + [950, MAX_JSON_NESTING + 1]):
                # Written out as text: this test's own json would recurse as deep.
                relay.proc.stdin.write('{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"stamp",'
                                       '"arguments":%s}}\n' % (500 + n, nested(levels)))
                relay.proc.stdin.flush()
                answer = relay.wait_for(lambda m: m.get("id") == 500 + n, timeout=10)
                text = answer["result"]["content"][0]["text"]
                assert answer["result"]["isError"] and f"more than {MAX_JSON_NESTING} levels" in text, text
            # Straight to the socket as well: refused as invalid, the connection goes on.
            with pytest.raises(c.Invalid, match="nests more than"):
                serving.request(wire.CallHostTool, conversation=cid, name="stamp",
                                arguments=json.loads(nested(MAX_JSON_NESTING + 1)))
            # A call at the bound still goes to the serving client.
            relay.send({"jsonrpc": "2.0", "id": 77, "method": "tools/call",
                        "params": {"name": "stamp", "arguments": json.loads(nested(MAX_JSON_NESTING))}})
            taken = serving.request(wire.NextToolCall, conversation=cid, name="stamp", wait_s=10)
            assert taken is not None and taken["arguments"] == json.loads(nested(MAX_JSON_NESTING))
            serving.request(wire.ToolResult, conversation=cid, call_id=taken["call_id"], output="ok")
            assert relay.wait_for(lambda m: m.get("id") == 77)["result"]["content"][0]["text"] == "ok"
        assert "Traceback" not in d.log_text()
    finally:
        relay.close()
