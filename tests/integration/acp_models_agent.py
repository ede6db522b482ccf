"""A tiny ACP agent that offers a model list: each session starts on ``small`` and
``session/set_model`` switches it; every prompt is answered ``model:<current>``.

Every model request it gets is appended to ``$MODELS_AGENT_LOG`` as one line
(``set_model <id>`` or ``prompt <model>``), so a test sees what reached the runtime.
Standard library only.
"""

from __future__ import annotations

import itertools
import json
import os
import sys

MODELS = [{"modelId": "small", "name": "Small"}, {"modelId": "large", "name": "Large"}]
_sessions = itertools.count(1)


def _send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _log(line: str) -> None:
    path = os.environ.get("MODELS_AGENT_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def main() -> None:
    current: dict[str, str] = {}
    for raw in sys.stdin:
        msg = json.loads(raw)
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            _send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1, "agentInfo": {"name": "models"},
                                                            "agentCapabilities": {"loadSession": True}}})
        elif method in ("session/new", "session/load"):
            sid = params.get("sessionId") or f"m-{next(_sessions)}"
            current.setdefault(sid, "small")
            _send({"jsonrpc": "2.0", "id": rid, "result": {
                "sessionId": sid, "models": {"availableModels": MODELS, "currentModelId": current[sid]}}})
        elif method == "session/set_model":
            current[params["sessionId"]] = params["modelId"]
            _log(f"set_model {params['modelId']}")
            _send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "session/prompt":
            sid = params["sessionId"]
            _log(f"prompt {current[sid]}")
            _send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": {
                "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": f"model:{current[sid]}"}}}})
            _send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif rid is not None:
            _send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no {method}"}})


if __name__ == "__main__":
    main()
