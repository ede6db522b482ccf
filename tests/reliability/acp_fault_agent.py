"""A tiny ACP agent that misbehaves on demand, for the fault tests.

Run as ``python acp_fault_agent.py``; speaks ACP (JSON-RPC 2.0, one object per
line) on stdio. Each prompt's first word says what to do:

* ``crash``        -> one message chunk, then the process exits with status 3 mid-turn
* ``crash-start``  -> (as argv[1]) the process exits before answering ``initialize``
* ``hang``         -> one message chunk, then silence: no answer, no update, cancel ignored
* ``flood N``      -> N message chunks of 1 KB as fast as it can, then ``end_turn``
* ``bigline``      -> one line of 80 MB without a newline, then silence
* ``garbage``      -> a line that is not JSON, then silence
* ``notrpc``       -> a JSON line that is not a JSON-RPC message, then silence
* ``badresult``    -> answers the prompt with a result of the wrong shape
* ``read PATH`` / ``write PATH CONTENT`` -> fs/read_text_file / fs/write_text_file,
  answering ``ok:<content>`` or ``error:<message>``
* anything else    -> ``echo:<prompt>``, then ``end_turn``

Every start appends a line to ``$FAULT_AGENT_LOG`` (when set), so a test can
count restarts and see when they happened. Standard library only.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time

_ids = itertools.count(1000)
_sessions = itertools.count(1)
_out = sys.stdout


def send(msg: dict) -> None:
    _out.write(json.dumps(msg) + "\n")
    _out.flush()


def read() -> dict | None:
    line = sys.stdin.readline()
    if not line:
        return None
    return json.loads(line)


def call(method: str, params: dict) -> dict:
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
    while True:
        time.sleep(3600)


def prompt(session: str, rid: int, text: str) -> None:
    cmd, _, rest = text.partition(" ")
    if cmd == "crash":
        say(session, "about to crash")
        sys.exit(3)
    if cmd == "hang":
        say(session, "thinking forever")
        silence()
    if cmd == "flood":
        chunk = "x" * 1023 + "\n"
        for _ in range(int(rest or "1000")):
            say(session, chunk)
    elif cmd == "bigline":
        block = "y" * (1 << 20)
        _out.write('{"jsonrpc": "2.0", "method": "session/update", "params": {"text": "')
        for _ in range(80):
            _out.write(block)
        _out.flush()
        silence()
    elif cmd == "garbage":
        say(session, "about to break the protocol")
        _out.write("this is not JSON-RPC at all\n")
        _out.flush()
        silence()
    elif cmd == "notrpc":
        say(session, "about to send JSON that is not JSON-RPC")
        send({"hello": "world", "id": [1, 2]})
        silence()
    elif cmd == "badresult":
        send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": 42}})
        return
    elif cmd == "read":
        answer = call("fs/read_text_file", {"sessionId": session, "path": rest})
        say(session, f"ok:{answer['result']['content']}" if "result" in answer else f"error:{answer['error']['message']}")
    elif cmd == "write":
        path, _, content = rest.partition(" ")
        answer = call("fs/write_text_file", {"sessionId": session, "path": path, "content": content})
        say(session, "ok" if "result" in answer else f"error:{answer['error']['message']}")
    else:
        say(session, f"echo:{text}")
    send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})


def main() -> None:
    log = os.environ.get("FAULT_AGENT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{time.time():.3f} {os.getpid()} {' '.join(sys.argv[1:])}\n")
    if sys.argv[1:] == ["crash-start"]:
        sys.exit(4)
    while True:
        msg = read()
        if msg is None:
            return
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": 1, "agentInfo": {"name": "fault", "version": "0"},
                "agentCapabilities": {"loadSession": True}}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": f"fault-{os.getpid()}-{next(_sessions)}"}})
        elif method == "session/prompt":
            blocks = params.get("prompt", [])
            text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            prompt(params["sessionId"], rid, text)
        elif method == "session/load":
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "session/cancel":
            pass
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no {method}"}})


if __name__ == "__main__":
    main()
