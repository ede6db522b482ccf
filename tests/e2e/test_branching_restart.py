"""Fork and rewind outlive a daemon restart on Claude Code, where agentd's provider keeps the
point a session resumes at (Codex reverts and forks in its own durable store; the script
provider's record is its own).

After ``rewind --to`` the first of two turns and a restart, the next model request still
lacks the second turn; a fork made and never prompted before a restart still opens after it
with the first turn only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance import Follower, _json, _turn_ends
from daemon_harness import Daemon
from runtimes_e2e import runtime_profile

pytestmark = pytest.mark.e2e


def _turn(d: Daemon, rt, cid: str, text: str) -> str:
    rt.text_only("Noted.")
    follower = Follower(d, cid, text)
    assert follower.finish() == 0, follower.stderr()
    return _turn_ends(d, cid)[-1]["run"]


def _carried(rt, prompt: str) -> str:
    bodies = [json.dumps(r) for r in rt.server.requests if prompt in json.dumps(r) and r.get("tools")]
    assert bodies, f"no model request carried {prompt!r}"
    return "\n".join(bodies)


@pytest.mark.parametrize("name", ["claude"])
def test_rewind_and_an_unprompted_fork_hold_across_a_daemon_restart(name: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    with runtime_profile(name, tmp_path) as rt:
        d = Daemon(tmp_path, rt.config_toml, env=rt.env).start()
        try:
            cid = _json(d.agentctl("new", "-p", rt.provider, "--cwd", str(work), "--json"))["id"]
            r1 = _turn(d, rt, cid, "Remember: my name is Ada Lovelace.")
            _turn(d, rt, cid, "Remember: my colour is teal-violet.")
            fork = _json(d.agentctl("fork", cid, "--at", r1, "--json"))["conversation"]["id"]
            _json(d.agentctl("rewind", cid, "--to", r1, "--json"))
            d.stop()
            d.start()
            for conv, question in ((cid, "What is my colour, please?"), (fork, "What is my name, please?")):
                _turn(d, rt, conv, question)
                seen = _carried(rt, question)
                kept, leaked = "Ada Lovelace" in seen, "teal-violet" in seen
                assert kept, f"{conv} lost the first turn"
                assert not leaked, f"{conv} carries the dropped turn after the restart"
        finally:
            d.stop()
