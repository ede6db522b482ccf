"""A tiny ACP agent for what no real agent does on demand: fs requests to chosen paths, garbage output.

Run as ``python acp_fake_agent.py``; speaks ACP (JSON-RPC, one object per
line) on stdio. It advertises no loadSession, so it also stands for agents
that cannot reopen. Each prompt is one command:

* ``read PATH``           -> fs/read_text_file; answers "ok:<content>" or "error:<message>"
* ``write PATH CONTENT``  -> fs/write_text_file; answers "ok" or "error:<message>"
* ``garbage``             -> writes a line that is not JSON-RPC and waits
* anything else           -> answers "echo:<prompt>"

A prompt with resource_link blocks (attachments) first answers "links:<uri>,...;".

Every answer is one agent_message_chunk, then the prompt's result ``end_turn``.
Standard library only.
"""

from __future__ import annotations

import itertools
import json
import sys
import time

_ids = itertools.count(1000)
_sessions = itertools.count(1)


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def read() -> dict | None:
    line = sys.stdin.readline()
    if not line:
        return None
    return json.loads(line)


def call(method: str, params: dict) -> dict:
    """Send a request to the client and wait for its answer (other messages are dropped)."""
    rid = next(_ids)
    send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    while True:
        msg = read()
        if msg is None:
            sys.exit(0)
        if msg.get("id") == rid and "method" not in msg:
            return msg


def say(session: str, text: str) -> None:
    send({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": session, "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}})


def prompt(session: str, text: str) -> None:
    cmd, _, rest = text.partition(" ")
    if cmd == "read":
        answer = call("fs/read_text_file", {"sessionId": session, "path": rest})
        say(session, f"ok:{answer['result']['content']}" if "result" in answer else f"error:{answer['error']['message']}")
    elif cmd == "write":
        path, _, content = rest.partition(" ")
        answer = call("fs/write_text_file", {"sessionId": session, "path": path, "content": content})
        say(session, "ok" if "result" in answer else f"error:{answer['error']['message']}")
    elif cmd == "garbage":
        say(session, "about to break the protocol")
        sys.stdout.write("this is not JSON-RPC\n")
        sys.stdout.flush()
        time.sleep(30)
    else:
        say(session, f"echo:{text}")


def main() -> None:
    while True:
        msg = read()
        if msg is None:
            return
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": 1, "agentInfo": {"name": "fake", "version": "0"},
                "agentCapabilities": {"loadSession": False}}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": f"fake-{next(_sessions)}"}})
        elif method == "session/prompt":
            session = params["sessionId"]
            blocks = params.get("prompt", [])
            text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            links = [b["uri"] for b in blocks if b.get("type") == "resource_link"]
            if links:
                say(session, "links:" + ",".join(links) + ";")
            prompt(session, text)
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif method == "session/cancel":
            pass
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no {method}"}})


if __name__ == "__main__":
    main()
