"""A stand-in for the Claude Code CLI, speaking just enough of claude-agent-sdk's stream-json protocol.

Run by a shell wrapper set as ``providers.claude.cli_path``. It answers every
``control_request`` (``initialize`` included) with success and each user
message with a ``result`` (``echo:<prompt>``), after noting the prompt in a
transcript ``$CLAUDE_CONFIG_DIR/projects/fake/<session id>.jsonl`` (so that
agentd reopens the session with ``--resume``). A prompt starting with
``crash`` makes it exit with status 3 mid-turn.

Every start appends ``<time> <pid> <args>`` to ``$FAKE_CLAUDE_LOG``; while the
file ``$FAKE_CLAUDE_CRASH_FLAG`` exists it exits with status 4 right after
that, before answering ``initialize``. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def arg(name: str) -> str:
    """The value of ``--name value`` or ``--name=value``, or ""."""
    argv = sys.argv[1:]
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return ""


def main() -> None:
    log = os.environ.get("FAKE_CLAUDE_LOG")
    crash = os.path.exists(os.environ.get("FAKE_CLAUDE_CRASH_FLAG", "/nonexistent"))
    if log:
        with open(log, "a") as f:
            f.write(f"{time.time():.3f} {os.getpid()} {'crash-start' if crash else 'start'}\n")
    if crash:
        sys.stderr.write("fake claude: crashing at start\n")
        sys.exit(4)
    session = arg("--session-id") or arg("--resume") or "unknown"
    transcript = os.path.join(os.environ.get("CLAUDE_CONFIG_DIR", "."), "projects", "fake", f"{session}.jsonl")
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        kind = msg.get("type")
        if kind == "control_request":
            send({"type": "control_response",
                  "response": {"subtype": "success", "request_id": msg.get("request_id"), "response": {}}})
        elif kind == "user":
            content = msg.get("message", {}).get("content")
            text = content if isinstance(content, str) else "".join(
                b.get("text", "") for b in content or [] if isinstance(b, dict))
            os.makedirs(os.path.dirname(transcript), exist_ok=True)
            with open(transcript, "a") as f:
                f.write(json.dumps({"type": "user", "uuid": msg.get("uuid"), "message": {"role": "user", "content": text}}) + "\n")
            if text.startswith("crash"):
                sys.exit(3)
            send({"type": "result", "subtype": "success", "duration_ms": 1, "duration_api_ms": 1, "is_error": False,
                  "num_turns": 1, "session_id": session, "result": f"echo:{text}", "total_cost_usd": 0.0})


if __name__ == "__main__":
    main()
