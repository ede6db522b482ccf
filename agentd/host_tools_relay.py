"""agentd's own MCP server, as a runtime starts it: a stdio relay to the daemon's host tools.

``python -m agentd.host_tools_relay --socket PATH --conversation ID`` speaks MCP (JSON-RPC,
one message per line) on stdin/stdout and the control protocol to agentd on PATH:
``tools/list`` -> ``list_host_tools``, ``tools/call`` -> ``call_host_tool`` (each call in a
thread of its own, so calls run side by side, :data:`MAX_CALLS` at most), and a watcher that long-polls
``list_host_tools`` and sends ``notifications/tools/list_changed`` when the tools change.
It ends when stdin closes. Standard library, msgspec and agentd.wire only (no trio), so it
starts fast.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
from typing import Any

import msgspec

from . import __version__, wire

PROTOCOL = "2025-06-18"
#: calls in flight at once, each on a connection of its own to agentd (as many as the daemon
#: takes per conversation, agentd.host_tools.MAX_CALLS_IN_FLIGHT): more are answered an error at once
MAX_CALLS = 16
_lock = threading.Lock()


def _write(msg: dict[str, Any]) -> None:
    # ASCII: an id or text holding a lone surrogate (the runtime's JSON allows one) is escaped, not fatal.
    data = json.dumps(msg) + "\n"
    with _lock:
        sys.stdout.write(data)
        sys.stdout.flush()


def _tool_result(rid: Any, text: str, *, error: bool) -> None:
    """Answer ``tools/call`` ``rid`` with ``text`` (MCP's CallToolResult)."""
    _write({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": text}], "isError": error}})


class _Client:
    """One blocking connection to agentd (hello done)."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.file = self.sock.makefile("rb")
        self.next_id = 1
        self._read()  # the daemon's hello frame
        self.request(wire.Hello, protocol=wire.PROTOCOL_VERSION, client="agentd-host-tools-relay")

    def _read(self) -> Any:
        line = self.file.readline()
        if not line:
            raise ConnectionError("agentd closed the connection")
        return wire.decode_server_frame(line.rstrip(b"\n"))

    def request(self, op: type, **fields: Any) -> Any:
        rid = self.next_id
        self.next_id += 1
        self.sock.sendall(wire.encode(op(id=rid, **fields)))
        while True:
            frame = self._read()
            if isinstance(frame, wire.ErrorFrame) and frame.id == rid:
                raise wire.error_from_body(frame.error)
            if isinstance(frame, wire.ResultFrame) and frame.id == rid:
                return msgspec.json.decode(frame.result)

    def close(self) -> None:
        try:
            self.file.close()
            self.sock.close()
        except OSError:
            pass


class Relay:
    def __init__(self, path: str, conversation: str) -> None:
        self.path = path
        self.conversation = conversation
        self._watching = False
        self._calls = threading.BoundedSemaphore(MAX_CALLS)

    def _tools(self, client: _Client, after: int = -1, wait_s: float = 0.0) -> dict[str, Any]:
        return client.request(wire.ListHostTools, conversation=self.conversation, after=after, wait_s=wait_s)

    def watch(self) -> None:
        """Tell the runtime whenever the tools change (long-polls agentd)."""
        try:
            client = _Client(self.path)
            version = self._tools(client).get("version", 0)
            while True:
                now = self._tools(client, after=version, wait_s=30.0).get("version", 0)
                if now != version:
                    version = now
                    _write({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        except Exception as exc:  # agentd gone or refusing: no more change notices
            print(f"agentd-host-tools-relay: watching the tools stopped: {exc!r}", file=sys.stderr, flush=True)

    def handle(self, msg: dict[str, Any]) -> None:
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if not isinstance(params, dict):
            if rid is not None:
                _write({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "params must be an object"}})
            return
        try:
            if method == "initialize":
                result: Any = {"protocolVersion": params.get("protocolVersion") or PROTOCOL,
                               "capabilities": {"tools": {"listChanged": True}},
                               "serverInfo": {"name": "agentd", "version": __version__},
                               "instructions": "Tools served by the programs attached to this agentd conversation."}
            elif method == "notifications/initialized":
                if not self._watching:
                    self._watching = True
                    threading.Thread(target=self.watch, daemon=True).start()
                return
            elif method == "ping":
                result = {}
            elif method == "tools/list":
                client = _Client(self.path)
                try:
                    listed = client.request(wire.ListHostTools, conversation=self.conversation, listing=True)
                finally:
                    client.close()
                result = {"tools": [{"name": t["name"], "description": t.get("description", ""),
                                     "inputSchema": t.get("input_schema") or {"type": "object"}}
                                    for t in listed.get("tools", [])]}
            elif method == "tools/call":
                if not self._calls.acquire(blocking=False):
                    _tool_result(rid, f"agentd: {MAX_CALLS} host tool calls are in flight already; call again once "
                                      "one has ended", error=True)
                    return
                threading.Thread(target=self.call, args=(rid, params), daemon=True).start()
                return
            elif rid is None:
                return  # another notification
            else:
                _write({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}})
                return
        except Exception as exc:  # agentd unreachable or refusing: the runtime sees why
            if rid is not None:
                _write({"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": f"agentd: {exc}"}})
            return
        if rid is not None:
            _write({"jsonrpc": "2.0", "id": rid, "result": result})

    def call(self, rid: Any, params: dict[str, Any]) -> None:
        try:
            self._call(rid, params)
        finally:
            self._calls.release()

    def _call(self, rid: Any, params: dict[str, Any]) -> None:
        try:
            client = _Client(self.path)
            try:
                res = client.request(wire.CallHostTool, conversation=self.conversation, name=str(params.get("name", "")),
                                     arguments=params.get("arguments") or {})
            finally:
                client.close()
            text, error = str(res.get("output", "")), bool(res.get("error", False))
        except Exception as exc:
            text, error = f"agentd: {exc}", True
        _tool_result(rid, text, error=error)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="agentd-host-tools-relay")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--conversation", required=True)
    args = parser.parse_args(argv)
    relay = Relay(args.socket, args.conversation)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested too deeply to read
            continue
        if isinstance(msg, dict):
            relay.handle(msg)


if __name__ == "__main__":
    main()
