"""A tiny ACP agent for what no real agent does on demand: fs requests to chosen paths, garbage output.

Run as ``python acp_fake_agent.py``; speaks ACP (JSON-RPC, one object per
line) on stdio. It advertises no loadSession, so it also stands for agents
that cannot reopen. Each prompt is one command:

* ``read PATH``           -> fs/read_text_file; answers "ok:<content>" or "error:<message>"
* ``write PATH CONTENT``  -> fs/write_text_file; answers "ok" or "error:<message>"
* ``garbage``             -> writes a line that is not JSON-RPC, then silence
* anything else           -> answers "echo:<prompt>"

A prompt with resource_link blocks (attachments) first answers "links:<uri>,...;".

Every answer is one agent_message_chunk, then the prompt's result ``end_turn``.
Standard library only.

It is also the base of ``tests/reliability/acp_fault_agent.py``, which imports
it and calls :func:`serve` with more commands (crashes, hangs, floods, ...), its
own name and loadSession: a command is a function ``(session, request_id,
rest_of_the_prompt) -> bool`` returning True when it answered the prompt itself.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

#: A prompt command: ``(session id, the prompt's request id, the prompt after its first word)``;
#: returns True when it answered the prompt itself, False to end the turn with ``end_turn``.
Command = Callable[[str, Any, str], bool]

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


def silence() -> None:
    """Say nothing more until killed (or until the process that started this one is gone)."""
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)
    sys.exit(0)


# --------------------------------------------------------------------------- commands


def read_file(session: str, rid: Any, path: str) -> bool:
    answer = call("fs/read_text_file", {"sessionId": session, "path": path})
    say(session, f"ok:{answer['result']['content']}" if "result" in answer else f"error:{answer['error']['message']}")
    return False


def write_file(session: str, rid: Any, rest: str) -> bool:
    path, _, content = rest.partition(" ")
    answer = call("fs/write_text_file", {"sessionId": session, "path": path, "content": content})
    say(session, "ok" if "result" in answer else f"error:{answer['error']['message']}")
    return False


def garbage(session: str, rid: Any, rest: str) -> bool:
    say(session, "about to break the protocol")
    sys.stdout.write("this is not JSON-RPC at all\n")
    sys.stdout.flush()
    silence()
    return True


COMMANDS: dict[str, Command] = {"read": read_file, "write": write_file, "garbage": garbage}


# --------------------------------------------------------------------------- the agent


def _saved(path: str) -> set[str]:
    try:
        with open(path) as f:
            return set(f.read().split())
    except FileNotFoundError:
        return set()


def serve(
    *,
    name: str = "fake",
    load_session: bool = False,
    session_prefix: str = "fake",
    commands: Mapping[str, Command] = COMMANDS,
    sessions_file: str | None = None,
    unsaved: str = "not_found",
) -> None:
    """Answer ACP on stdio until stdin closes.

    ``load_session``: advertise loadSession and answer session/load (with an
    empty result) instead of refusing it. A prompt whose first word is not in
    ``commands`` is echoed.

    ``sessions_file``: the agent's session store, like a real agent's, that it
    writes only when a turn ends (``end_turn``): a session id a line. A load of
    a session not in it (the agent died during the session's first turn, or the
    file was removed) answers ACP's "resource not found", as Copilot CLI does;
    with ``unsaved="empty"`` it answers an internal error "empty session file"
    instead, as codex-acp does for a session file it created but never wrote.
    """
    while True:
        msg = read()
        if msg is None:
            return
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": 1, "agentInfo": {"name": name, "version": "0"},
                "agentCapabilities": {"loadSession": load_session}}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": f"{session_prefix}-{next(_sessions)}"}})
        elif method == "session/load" and load_session:
            sid = params.get("sessionId")
            if sessions_file is not None and sid not in _saved(sessions_file):
                error = ({"code": -32603, "message": "Internal error", "data": "empty session file"}
                         if unsaved == "empty" else
                         {"code": -32002, "message": f"Resource not found: Session {sid} not found"})
                send({"jsonrpc": "2.0", "id": rid, "error": error})
            else:
                send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "session/prompt":
            session = params["sessionId"]
            blocks = params.get("prompt", [])
            text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            links = [b["uri"] for b in blocks if b.get("type") == "resource_link"]
            if links:
                say(session, "links:" + ",".join(links) + ";")
            cmd, _, rest = text.partition(" ")
            command = commands.get(cmd)
            if command is None:
                say(session, f"echo:{text}")
            elif command(session, rid, rest):
                continue
            if sessions_file is not None and session not in _saved(sessions_file):
                with open(sessions_file, "a") as f:
                    f.write(session + "\n")
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif method == "session/cancel":
            pass
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no {method}"}})


if __name__ == "__main__":
    serve()
