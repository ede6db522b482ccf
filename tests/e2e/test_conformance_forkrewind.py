"""Conformance columns ``fork`` and ``rewind`` (agentd.branching), on every runtime.

fork: two turns, then ``agentctl fork --at`` the first; the forked conversation's next model
request carries the first turn but not the second, and its journal begins with the
``forked`` record, its copies marked ``copied``. rewind: two turns, ``--preview`` changes
nothing, ``rewind --to`` the first; history leaves the second out (``--all`` shows it,
marked) and the next model request lacks the second turn's text. Where a runtime cannot do
it natively its capability is false (checked) and the op answers ``unsupported``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conformance import Follower, _json, _new, _supported, _turn_ends
from daemon_harness import Daemon
from runtimes_e2e import Runtime

pytestmark = pytest.mark.e2e

#: scenario -> the capabilities it needs
SCENARIOS: dict[str, tuple[str, ...]] = {
    "fork": ("fork",),
    "rewind": ("rewind",),
}

FIRST, FIRST_FACT = "Remember: my name is Ada Lovelace.", "Ada Lovelace"
SECOND, SECOND_FACT = "Remember: my colour is teal-violet.", "teal-violet"


def _turn(d: Daemon, runtime: Runtime, cid: str, text: str) -> str:
    runtime.text_only(f"Noted, answer {len(text)}.")
    follower = Follower(d, cid, text)
    assert follower.finish() == 0, follower.stderr()
    return _turn_ends(d, cid)[-1]["run"]


def _seen(d: Daemon, runtime: Runtime, cid: str, prompt: str) -> str:
    """What 'the model' was given for ``prompt`` in ``cid``: the model requests that carry it (the
    runtime's turn requests, with tools), or for the script provider its reply, which echoes the
    history it holds."""
    if runtime.server is None:
        items = [r["data"] for r in d.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "assistant"]
        return items[-1]["text"]
    bodies = [json.dumps(r) for r in runtime.server.requests if prompt in json.dumps(r) and _has_tools(r)]
    assert bodies, f"no model request carried {prompt!r}"
    return "\n".join(bodies)


def _has_tools(request: dict[str, Any]) -> bool:
    tools = request.get("tools")
    if tools:
        return True
    # Gemini: tools are under generationConfig / request
    return "functionDeclarations" in json.dumps(request)


@pytest.mark.parametrize("scenario", ["fork"])
def test_fork_carries_the_earlier_turn_and_not_the_later(runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        runtime.text_only("Unused.")
        cid = _new(daemon, runtime, workdir, scenario)
        refused = daemon.agentctl("fork", cid, "--json")
        assert refused.returncode == 1 and "unsupported" in refused.stderr, refused.stderr
        return
    runtime.text_only("Noted.")  # the script provider reads its script when the conversation opens
    cid = _new(daemon, runtime, workdir, scenario)
    run1 = _turn(daemon, runtime, cid, FIRST)
    _turn(daemon, runtime, cid, SECOND)
    res = _json(daemon.agentctl("fork", cid, "--at", run1, "--json"))
    fork = res["conversation"]["id"]
    assert fork != cid and res["source"] == cid and res["run"] == run1
    journal = daemon.journal(fork)
    assert journal[0]["type"] == "forked" and journal[0]["seq"] == 1, journal[0]
    assert journal[0]["data"]["source"] == cid and journal[0]["data"]["run"] == run1
    copies = [r for r in journal if isinstance(r["data"], dict) and "copied" in r["data"]]
    assert copies and all(r["data"]["copied"]["conversation"] == cid for r in copies)
    assert {r["run"] for r in copies} == {run1}, "only the first turn is copied"
    assert not any(SECOND_FACT in json.dumps(r) for r in journal), "the later turn was copied"
    question = "What is my name, please?"
    _turn(daemon, runtime, fork, question)
    seen = _seen(daemon, runtime, fork, question)
    kept, leaked = FIRST_FACT in seen, SECOND_FACT in seen  # (the bodies are too long for a report)
    assert kept, "the fork lost the earlier turn"
    assert not leaked, "the fork carries the later turn"
    # The source goes on with both turns.
    info = _json(daemon.agentctl("show", cid, "--json"))
    assert info["record"]["state"] == "idle"


@pytest.mark.parametrize("scenario", ["rewind"])
def test_rewind_drops_the_later_turn_from_the_next_request(runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        runtime.text_only("Unused.")
        cid = _new(daemon, runtime, workdir, scenario)
        refused = daemon.agentctl("rewind", cid, "--to", "r0", "--json")
        assert refused.returncode == 1 and "unsupported" in refused.stderr, refused.stderr
        return
    runtime.text_only("Noted.")  # the script provider reads its script when the conversation opens
    cid = _new(daemon, runtime, workdir, scenario)
    run1 = _turn(daemon, runtime, cid, FIRST)
    run2 = _turn(daemon, runtime, cid, SECOND)
    preview = _json(daemon.agentctl("rewind", cid, "--to", run1, "--preview", "--json"))
    assert preview["preview"] and [t["run"] for t in preview["dropped"]] == [run2]
    assert not any(r["type"] == "rewind" for r in daemon.journal(cid)), "a preview was recorded"
    assert not daemon.record(cid).get("dropped"), "a preview dropped turns"
    done = _json(daemon.agentctl("rewind", cid, "--to", run1, "--json"))
    assert not done.get("preview") and [t["run"] for t in done["dropped"]] == [run2]
    # the last rewind record (a runtime may report more after it: Copilot's own rewind events)
    rec = [r for r in daemon.journal(cid) if r["type"] == "rewind"][-1]
    assert rec["type"] == "rewind" and rec["data"]["kept"] == run1 and rec["data"]["dropped"] == [run2]
    shown = _json(daemon.agentctl("history", cid, "--json"))["items"]
    assert not any(SECOND_FACT in json.dumps(e) for e in shown), "history shows the dropped turn"
    everything = _json(daemon.agentctl("history", cid, "--all", "--json"))["items"]
    assert any(e.get("dropped") and e["run"] == run2 for e in everything), "history --all hides the dropped turn"
    question = "What is my colour, please?"
    _turn(daemon, runtime, cid, question)
    seen = _seen(daemon, runtime, cid, question)
    kept, leaked = FIRST_FACT in seen, SECOND_FACT in seen
    assert kept, "the rewind lost the kept turn"
    assert not leaked, "the next request still carries the dropped turn"
