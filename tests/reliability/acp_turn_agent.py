"""A tiny ACP agent for the turn-hygiene tests: silence, late ends, ignored cancels, reused ids.

Run as ``python acp_turn_agent.py``; it is ``acp_fault_agent.py`` (which is
``tests/e2e/acp_fake_agent.py`` with loadSession) with these prompt commands:

* ``silent``          -> nothing at all: no update, no answer, cancel ignored, until killed
* ``late S``          -> silent for S seconds (cancel ignored), then answers the prompt ``end_turn``
  (an end that comes after agentd ended the turn itself)
* ``ask``             -> session/request_permission, waits for the answer as long as it takes,
  then says ``answered:<option id>`` and ends the turn
* ``ask-none``        -> session/request_permission offering no option, then says what it got
* ``tool ID TEXT``    -> a tool call with the id ID (pending, then in_progress), its output TEXT
  (completed), then ``end_turn``: the same ID in two turns is a reused runtime id
* ``reannounce ID``   -> the tool call ID announced, announced again while still open (a new
  title), then completed, then ``end_turn``
* ``twice ID``        -> ``tool ID one`` then ``tool ID two`` in the same turn (an id reused after
  its call ended), then ``end_turn``

Standard library only.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

import acp_fake_agent as fake  # noqa: E402
import acp_fault_agent as fault  # noqa: E402
from acp_fake_agent import call, say, send, silence  # noqa: E402


def _update(session: str, update: dict[str, Any]) -> None:
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": session, "update": update}})


def silent(session: str, rid: Any, rest: str) -> bool:
    silence()
    return True


def late(session: str, rid: Any, rest: str) -> bool:
    # Reads nothing meanwhile: the session/cancel notification waits unread in the pipe.
    time.sleep(float(rest or "3"))
    send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
    return True


def ask(session: str, rid: Any, rest: str) -> bool:
    answer = call("session/request_permission", {
        "sessionId": session,
        "toolCall": {"toolCallId": "perm-1", "title": "touch a file", "kind": "edit", "status": "pending"},
        "options": [{"optionId": "allow", "name": "Allow", "kind": "allow_once"},
                    {"optionId": "deny", "name": "Deny", "kind": "reject_once"}]})
    outcome = (answer.get("result") or {}).get("outcome") or {}
    say(session, f"answered:{outcome.get('optionId', outcome.get('outcome', '?'))}")
    return False


def ask_none(session: str, rid: Any, rest: str) -> bool:
    answer = call("session/request_permission", {
        "sessionId": session,
        "toolCall": {"toolCallId": "perm-0", "title": "rm -rf build", "kind": "execute", "status": "pending"},
        "options": []})
    outcome = (answer.get("result") or {}).get("outcome") or {}
    say(session, f"answered:{outcome.get('optionId', outcome.get('outcome', '?'))}")
    return False


def tool(session: str, rid: Any, rest: str) -> bool:
    tool_id, _, text = rest.partition(" ")
    _update(session, {"sessionUpdate": "tool_call", "toolCallId": tool_id, "title": f"print {text}",
                      "kind": "execute", "status": "pending", "rawInput": {"command": f"echo {text}"}})
    _update(session, {"sessionUpdate": "tool_call_update", "toolCallId": tool_id, "status": "in_progress"})
    _update(session, {"sessionUpdate": "tool_call_update", "toolCallId": tool_id, "status": "completed",
                      "content": [{"type": "content", "content": {"type": "text", "text": f"out:{text}"}}]})
    say(session, f"ran {tool_id}")
    return False


def reannounce(session: str, rid: Any, rest: str) -> bool:
    tool_id = rest.strip()
    _update(session, {"sessionUpdate": "tool_call", "toolCallId": tool_id, "title": "first announcement",
                      "kind": "execute", "status": "in_progress", "rawInput": {"command": "echo once"}})
    _update(session, {"sessionUpdate": "tool_call", "toolCallId": tool_id, "title": "announced again",
                      "kind": "execute", "status": "in_progress", "rawInput": {"command": "echo once"}})
    _update(session, {"sessionUpdate": "tool_call_update", "toolCallId": tool_id, "status": "completed",
                      "content": [{"type": "content", "content": {"type": "text", "text": "out:reannounced"}}]})
    return False


def twice(session: str, rid: Any, rest: str) -> bool:
    tool(session, rid, f"{rest.strip()} one")
    tool(session, rid, f"{rest.strip()} two")
    return False


COMMANDS = {**fault.COMMANDS, "silent": silent, "late": late, "ask": ask, "ask-none": ask_none, "tool": tool,
            "reannounce": reannounce, "twice": twice}


if __name__ == "__main__":
    fake.serve(name="turns", load_session=True, session_prefix=f"turns-{os.getpid()}", commands=COMMANDS)
