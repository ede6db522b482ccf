"""A tiny ACP agent that records the MCP servers it is handed.

Every session/new and session/load appends ``{"method", "sessionId", "mcpServers"}`` as one
JSON line to ``$MCP_AGENT_LOG``; prompts are answered "ok". It advertises
``mcpCapabilities.http`` when ``$MCP_AGENT_HTTP`` is "1". Standard library only.
"""

from __future__ import annotations

import itertools
import json
import os
import sys

_sessions = itertools.count(1)


def _send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def main() -> None:
    http = os.environ.get("MCP_AGENT_HTTP") == "1"
    for raw in sys.stdin:
        msg = json.loads(raw)
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            _send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1, "agentInfo": {"name": "mcp-recorder"},
                                                            "agentCapabilities": {"loadSession": True,
                                                                                  "mcpCapabilities": {"http": http}}}})
        elif method in ("session/new", "session/load"):
            sid = params.get("sessionId") or f"s-{next(_sessions)}"
            with open(os.environ["MCP_AGENT_LOG"], "a") as f:
                f.write(json.dumps({"method": method, "sessionId": sid, "mcpServers": params.get("mcpServers")}) + "\n")
            _send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": sid} if method == "session/new" else {}})
        elif method == "session/prompt":
            sid = params["sessionId"]
            _send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": {
                "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "ok"}}}})
            _send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif rid is not None:
            _send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no {method}"}})


if __name__ == "__main__":
    main()
