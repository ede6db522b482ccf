"""A tiny ACP agent that misbehaves on demand, for the fault tests.

Run as ``python acp_fault_agent.py``; speaks ACP (JSON-RPC 2.0, one object per
line) on stdio. It is ``tests/e2e/acp_fake_agent.py`` (read, write, garbage,
echo) with loadSession and these commands added; each prompt's first word says
what to do:

* ``crash [S]``    -> one message chunk, then (after S seconds, if given) the process exits
  with status 3 mid-turn
* ``crash-start``  -> (as argv[1]) the process exits before answering ``initialize``
* ``hang``         -> one message chunk, then silence: no answer, no update, cancel ignored
* ``flood N``      -> N message chunks of 1 KB as fast as it can, then ``end_turn``
* ``bigline``      -> one line of 80 MB without a newline, then silence
* ``garbage``      -> a line that is not JSON, then silence
* ``notrpc``       -> a JSON line that is not a JSON-RPC message, then silence
* ``drip N [PATH]`` -> N message chunks ``[old i]`` 0.1 s apart, a cancel ignored meanwhile, then (with
  PATH) fs/write_text_file of PATH, then ``end_turn``
* ``ghosts N S``   -> N message chunks of S characters for sessions that never exist, then ``end_turn``
* ``deep``         -> a session/update nested 200,000 arrays deep (past any decoder's recursion), then silence
* ``badresult``    -> answers the prompt with a result of the wrong shape
* ``oddbytes``     -> a message chunk holding invalid UTF-8, a lone surrogate escape and a NUL,
  a stderr line of invalid UTF-8, then ``end_turn``
* ``unknown``      -> a session/update of a kind no agentd knows (``future_thing``), a known
  chunk with an extra unknown field, then ``end_turn``
* ``orphans PATH`` -> a runtime that will not die: ignores SIGTERM and stdin EOF, announces a
  running tool call, starts two SIGTERM-ignoring children (one in its process group, one
  ``setsid``-ed away like Claude Code's tool shells), writes ``{"agent", "child", "escapee"}``
  pids as JSON to PATH, then sleeps forever
* ``read PATH`` / ``write PATH CONTENT`` -> fs/read_text_file / fs/write_text_file,
  answering ``ok:<content>`` or ``error:<message>``
* ``readlines PATH LINE LIMIT`` -> fs/read_text_file of that line range, answered like ``read``
* ``writemany N PATH PREFIX`` -> N fs/write_text_file requests, one after another (contents
  ``PREFIX-0`` ...), then ``many:<JSON list>`` of their answers ("ok" or "error:<message>")
* ``readmany N PATH`` -> N fs/read_text_file requests at once, then ``many:<JSON list>`` of their
  answers (``ok:<content>`` or ``error:<message>`` each, in the order sent)
* ``leak``         -> each string of the JSON list in ``$FAULT_LEAK_FILE`` echoed every way an
  agent can: in message text split across two chunks (and one character a chunk), in a
  thought, in a tool call's title, input and output, in a plan entry, in the session title
  and on stderr (the secrets tests)
* anything else    -> ``echo:<prompt>``, then ``end_turn``

Every start writes the agent's environment, as a JSON object, to ``$FAULT_ENV_DUMP`` (when
set). Every start appends a line to ``$FAULT_AGENT_LOG`` (when set), so a test can
count restarts and see when they happened; every prompt received appends its
text, JSON-encoded, as a line to ``$FAULT_AGENT_PROMPTS`` (when set), so a test
can tell which prompts reached the agent. With ``$FAULT_SESSIONS`` set, that file is the agent's
session store, written only as a turn ends: a load of a session not in it answers "resource not
found" (a real agent that died before it saved the session), or with ``$FAULT_UNSAVED=empty``
codex-acp's internal error "empty session file". Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

import acp_fake_agent as fake  # noqa: E402  (found through the line above)
from acp_fake_agent import say, send, silence  # noqa: E402


def crash(session: str, rid: Any, rest: str) -> bool:
    say(session, "about to crash")
    if rest.strip():
        time.sleep(float(rest))
    sys.exit(3)


def hang(session: str, rid: Any, rest: str) -> bool:
    say(session, "thinking forever")
    silence()
    return True


def flood(session: str, rid: Any, rest: str) -> bool:
    chunk = "x" * 1023 + "\n"
    for _ in range(int(rest or "1000")):
        say(session, chunk)
    return False


def bigline(session: str, rid: Any, rest: str) -> bool:
    block = "y" * (1 << 20)
    sys.stdout.write('{"jsonrpc": "2.0", "method": "session/update", "params": {"text": "')
    for _ in range(80):
        sys.stdout.write(block)
    sys.stdout.flush()
    silence()
    return True


def drip(session: str, rid: Any, rest: str) -> bool:
    count, _, path = rest.partition(" ")
    for i in range(int(count or "30")):  # a cancel meanwhile is read only afterwards: ignored
        say(session, f"[old {i}]")
        time.sleep(0.1)
    if path:
        answer = fake.call("fs/write_text_file", {"sessionId": session, "path": path, "content": "late"})
        say(session, "[old] wrote" if "result" in answer else f"[old] refused: {answer['error']['message']}")
    return False


def ghosts(session: str, rid: Any, rest: str) -> bool:
    n, size = (int(x) for x in rest.split())
    blob = "g" * size
    for i in range(n):  # updates for sessions that never come
        say(f"ghost-{i}", blob)
        # and this turn's own progress (a thought): the turn's inactivity deadline (HANG_S) is about
        # the agent's silence, not how long agentd takes to read and drop 300 MB on a loaded machine
        send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": {
            "sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": f"ghost {i} sent. "}}}})
    say(session, "ghosts sent")
    return False


def deep(session: str, rid: Any, rest: str) -> bool:
    say(session, "about to send JSON nested 200,000 deep")
    sys.stdout.write('{"jsonrpc": "2.0", "method": "session/update", "params": ' + "[" * 200_000 + "]" * 200_000 + "}\n")
    sys.stdout.flush()
    silence()
    return True


def notrpc(session: str, rid: Any, rest: str) -> bool:
    say(session, "about to send JSON that is not JSON-RPC")
    send({"hello": "world", "id": [1, 2]})
    silence()
    return True


def badresult(session: str, rid: Any, rest: str) -> bool:
    send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": 42}})
    return True


def readlines(session: str, rid: Any, rest: str) -> bool:
    path, line, limit = rest.rsplit(" ", 2)
    answer = fake.call("fs/read_text_file", {"sessionId": session, "path": path, "line": int(line), "limit": int(limit)})
    say(session, f"ok:{answer['result']['content']}" if "result" in answer else f"error:{answer['error']['message']}")
    return False


def readmany(session: str, rid: Any, rest: str) -> bool:
    count, path = rest.split(" ", 1)
    ids = [f"many-{n}" for n in range(int(count))]
    for i in ids:
        send({"jsonrpc": "2.0", "id": i, "method": "fs/read_text_file", "params": {"sessionId": session, "path": path}})
    answers: dict[str, str] = {}
    while len(answers) < len(ids):
        msg = fake.read()
        if msg is None:
            sys.exit(0)
        if msg.get("id") in ids and "method" not in msg:
            answers[msg["id"]] = (f"ok:{msg['result']['content']}" if "result" in msg
                                  else f"error:{msg['error']['message']}")
    say(session, "many:" + json.dumps([answers[i] for i in ids]))
    return False


def writemany(session: str, rid: Any, rest: str) -> bool:
    count, path, prefix = rest.split(" ", 2)
    answers = []
    for n in range(int(count)):  # one after another, each answered before the next, as separate turns would
        answer = fake.call("fs/write_text_file", {"sessionId": session, "path": path, "content": f"{prefix}-{n}"})
        answers.append("ok" if "result" in answer else f"error:{answer['error']['message']}")
    say(session, "many:" + json.dumps(answers))
    return False


def oddbytes(session: str, rid: Any, rest: str) -> bool:
    head = json.dumps({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": session, "update": {"sessionUpdate": "agent_message_chunk",
                                         "content": {"type": "text", "text": "@@"}}}})
    before, after = head.split("@@")
    # Raw bytes: "odd " + invalid UTF-8 (a stray continuation byte, a cut 3-byte sequence)
    # + a lone high surrogate as a JSON escape + NUL + " bytes".
    line = before.encode() + b"odd \x80|\xe2\x82|\\ud800|\\u0000 bytes" + after.encode() + b"\n"
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
    sys.stderr.buffer.write(b"stderr \xff\xfe line\n")
    sys.stderr.buffer.flush()
    return False


def unknown(session: str, rid: Any, rest: str) -> bool:
    send({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": session, "update": {"sessionUpdate": "future_thing", "detail": {"level": 7, "note": "from the future"}}}})
    send({"jsonrpc": "2.0", "method": "session/update", "params": {
        "sessionId": session, "update": {"sessionUpdate": "agent_message_chunk", "futureField": [1, 2],
                                         "content": {"type": "text", "text": "known kind, new field"}}}})
    return False



def update(session: str, update: dict) -> None:
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": update}})


def leak(session: str, rid: Any, rest: str) -> bool:
    values = json.loads(Path(os.environ["FAULT_LEAK_FILE"]).read_text())
    for n, value in enumerate(values):
        half = len(value) // 2
        say(session, f"value {n} is {value[:half]}")
        say(session, f"{value[half:]} and again ")
        for ch in value:
            say(session, ch)
        say(session, ".\n")
        update(session, {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": f"I saw {value}"}})
        call_id = f"leak-{n}"
        update(session, {"sessionUpdate": "tool_call", "toolCallId": call_id, "title": f"print {value}", "kind": "execute",
                         "status": "in_progress", "rawInput": {"command": f"echo {value}"}})
        update(session, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "completed",
                         "content": [{"type": "content", "content": {"type": "text", "text": f"out: {value}"}}],
                         "rawOutput": {"stdout": value}})
        update(session, {"sessionUpdate": "plan", "entries": [{"content": f"rotate {value}", "status": "pending"}]})
        update(session, {"sessionUpdate": "session_info_update", "title": f"about {value}"})
        print(f"debug: using {value}", file=sys.stderr, flush=True)
    return False


def orphans(session: str, rid: Any, rest: str) -> bool:
    import signal
    import subprocess

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the children, across exec too
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": {
        "sessionUpdate": "tool_call", "toolCallId": "build-1", "title": "make build", "kind": "execute",
        "status": "in_progress"}}})
    sleeper = [sys.executable, "-c", "import time; time.sleep(3600)"]
    child = subprocess.Popen(sleeper, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    escapee = subprocess.Popen(sleeper, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
    Path(rest.strip()).write_text(json.dumps({"agent": os.getpid(), "child": child.pid, "escapee": escapee.pid}))
    while True:  # no stdin EOF check, no parent check
        time.sleep(1)


COMMANDS = {**fake.COMMANDS, "readlines": readlines, "readmany": readmany, "writemany": writemany, "oddbytes": oddbytes, "unknown": unknown,
            "orphans": orphans, "crash": crash, "hang": hang, "flood": flood, "bigline": bigline, "deep": deep, "ghosts": ghosts, "drip": drip, "notrpc": notrpc,
            "badresult": badresult, "leak": leak}


def log_prompts(path: str) -> None:
    """Append the text of every ``session/prompt`` read to ``path`` (one JSON string a line)."""
    read = fake.read

    def logged_read() -> dict | None:
        msg = read()
        if msg is not None and msg.get("method") == "session/prompt":
            blocks = (msg.get("params") or {}).get("prompt", [])
            text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
            with open(path, "a") as f:
                f.write(json.dumps(text) + "\n")
        return msg

    fake.read = logged_read  # serve() and call() look it up at each call


def main() -> None:
    dump = os.environ.get("FAULT_ENV_DUMP")
    if dump:
        Path(dump).write_text(json.dumps(dict(os.environ)))
    log = os.environ.get("FAULT_AGENT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{time.time():.3f} {os.getpid()} {' '.join(sys.argv[1:])}\n")
    if sys.argv[1:] == ["crash-start"]:
        sys.exit(4)
    prompts = os.environ.get("FAULT_AGENT_PROMPTS")
    if prompts:
        log_prompts(prompts)
    fake.serve(name="fault", load_session=True, session_prefix=f"fault-{os.getpid()}", commands=COMMANDS,
               sessions_file=os.environ.get("FAULT_SESSIONS"), unsaved=os.environ.get("FAULT_UNSAVED", "not_found"))


if __name__ == "__main__":
    main()
