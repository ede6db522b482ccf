"""The real ``codex app-server`` behind a relay that adds the faults the model alone cannot make it show.

``python codex_fault_proxy.py CONTROL CODEX ARGS...`` runs ``CODEX ARGS...`` (the real
app-server) as its child and relays its JSON-RPC lines both ways, unchanged, except
as the JSON object in the file CONTROL says (read again at every line, so a test can
change it between turns; a missing file means no faults):

* ``"unknown": true``: after each ``turn/started`` Codex sends, a notification of a
  method no Codex has (``thread/futureThing/updated``) and an ``item/completed`` with
  an item type no Codex has (``futureItem``), both naming the thread and the turn;
* ``"big_line": N``: after the next ``turn/started``, one agent-message delta line
  of N bytes (one JSON-RPC message), then the relay goes on;
* ``"drop_interrupt": true``: agentd's ``turn/interrupt`` requests are swallowed,
  neither passed on nor answered: a cancel Codex never confirms.

Stdlib only; its stderr is the app-server's. It ends when the app-server does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading


def _control(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def main(argv: list[str]) -> int:
    control, cmd = argv[0], argv[1:]
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    out = sys.stdout.buffer
    lock = threading.Lock()
    big_sent = False

    def send(data: bytes) -> None:
        with lock:
            out.write(data)
            out.flush()

    def upstream() -> None:  # agentd -> codex
        assert child.stdin is not None
        for line in sys.stdin.buffer:
            if _control(control).get("drop_interrupt"):
                try:
                    if json.loads(line).get("method") == "turn/interrupt":
                        continue
                except ValueError:
                    pass
            child.stdin.write(line)
            child.stdin.flush()
        child.stdin.close()

    threading.Thread(target=upstream, daemon=True).start()
    assert child.stdout is not None
    for line in child.stdout:
        send(line)
        if b'"turn/started"' not in line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("method") != "turn/started":
            continue
        params = msg.get("params") or {}
        thread, turn = params.get("threadId"), (params.get("turn") or {}).get("id")
        faults = _control(control)
        if faults.get("unknown"):
            send(json.dumps({"jsonrpc": "2.0", "method": "thread/futureThing/updated",
                             "params": {"threadId": thread, "turnId": turn, "level": 7}}).encode() + b"\n")
            send(json.dumps({"jsonrpc": "2.0", "method": "item/completed", "params": {
                "threadId": thread, "turnId": turn,
                "item": {"type": "futureItem", "id": "future-1", "detail": "from a newer Codex"}}}).encode() + b"\n")
        if faults.get("big_line") and not big_sent:
            big_sent = True
            head = json.dumps({"jsonrpc": "2.0", "method": "item/agentMessage/delta",
                               "params": {"threadId": thread, "turnId": turn, "itemId": "big", "delta": ""}}).encode()
            head, tail = head[:-3], head[-3:]  # up to the delta's opening quote; `"}}` after it
            filler = int(faults["big_line"]) - len(head) - len(tail) - 1
            with lock:
                out.write(head)
                chunk = b"x" * (1 << 20)
                while filler > 0:
                    out.write(chunk[:filler])
                    filler -= len(chunk)
                out.write(tail + b"\n")
                out.flush()
    return child.wait()


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BrokenPipeError:
        os._exit(0)
