"""Conformance columns ``commands`` and ``steer``, through the real daemon and agentctl on every runtime.

commands: the working directory holds one user-defined command in each runtime's own
place (a Claude Code project command, a Gemini CLI custom command, a skill where Copilot
and Codex find skills); the runtime lists it, and running it makes a turn whose user item
is ``/name args`` and whose model request carries the command's own text (the runtime
expanded it, agentd did not).

steer: during a slow model answer a steer is sent; the runtime's next model request
carries its text. A runtime that cannot steer reports ``steer`` false, and ``send
--if-busy steer`` then says so before anything is sent.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conformance import Follower, _json, _new, _supported, _turn_ends
from daemon_harness import Daemon
from runtimes_e2e import Runtime

pytestmark = pytest.mark.e2e

#: scenario -> the capabilities it needs
SCENARIOS: dict[str, tuple[str, ...]] = {
    "commands": ("commands",),
    "steer": ("steer",),
}

NAME = "conform"
#: in the command's own text only: a model request carrying it got it from the runtime's expansion
MARKER = "CONFORM-COMMAND-BODY-7431"
STEER = "STEERED-TEXT-5512 mention the steer"
#: after a steer is accepted, how long the slow answer goes on before the rest comes at once, s
STEER_GRACE_S = 2.0
#: the answer to the prompt after a cancelled turn: any other text in that turn came from an earlier one
NEXT_ANSWER = "The next answer, NEXT-ANSWER-3306."


def _write_commands(workdir: Path) -> None:
    claude = workdir / ".claude" / "commands"
    claude.mkdir(parents=True)
    (claude / f"{NAME}.md").write_text(f"---\ndescription: Conformance command\nargument-hint: WHAT\n---\n"
                                       f"{MARKER}: answer about $ARGUMENTS.\n")
    gemini = workdir / ".gemini" / "commands"
    gemini.mkdir(parents=True)
    (gemini / f"{NAME}.toml").write_text(f'description = "Conformance command"\nprompt = "{MARKER}: answer about {{{{args}}}}."\n')
    skill = workdir / ".agents" / "skills" / NAME
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text(f"---\nname: {NAME}\ndescription: Conformance skill\n---\n{MARKER}: answer briefly.\n")


def _script_command(runtime: Runtime) -> None:
    with runtime.script.open("a") as f:  # type: ignore[attr-defined]
        f.write(f'[[command]]\nname = "{NAME}"\ndescription = "Conformance command"\n')


@pytest.mark.parametrize("scenario", ["commands"])
def test_a_listed_command_runs_as_a_turn_the_runtime_expands(runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        return
    _write_commands(workdir)
    runtime.text_only("Command done.")
    if runtime.name == "script":
        _script_command(runtime)
    cid = _new(daemon, runtime, workdir, scenario)
    listed = _json(daemon.agentctl("commands", cid, "--json", timeout=120))
    names = [c["name"] for c in listed["commands"]]
    assert names, f"{runtime.name} lists no command"
    name, args = NAME, "the tests"
    if NAME not in names:
        # The agent offers only its own commands (its user-defined ones are not offered over
        # its protocol): run one of those that becomes a prompt.
        name, args = ("init" if "init" in names else names[0]), ""
        request.node.user_properties.append(("note", f"lists only its own commands; ran /{name}"))
    ran = daemon.agentctl("command", cid, name, *([args] if args else []), "--follow", "--json", timeout=180)
    assert ran.returncode == 0, ran.stderr
    history = _json(daemon.agentctl("history", cid, "--json"))
    users = [e["item"]["text"] for e in history["items"] if e["item"]["kind"] == "user"]
    assert users == [f"/{name} {args}".strip()], users
    assert _turn_ends(daemon, cid)[-1]["data"]["state"] == "completed"
    if runtime.server is not None and name == NAME:
        bodies = [json.dumps(r) for r in runtime.server.requests]
        assert any(MARKER in b for b in bodies), f"no model request of {runtime.name} carried the command's text"
    refused = daemon.agentctl("send", cid, "/no-such-command-here x")
    assert refused.returncode == 8 and f"/{name}" in refused.stderr, refused.stderr


@pytest.mark.parametrize("scenario", ["steer"])
def test_a_steer_during_a_slow_answer_reaches_the_next_model_request(runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        cid = _new(daemon, runtime, workdir, scenario)
        refused = daemon.agentctl("send", cid, "steer me", "--if-busy", "steer")
        assert refused.returncode == 1 and "steer" in refused.stderr, refused.stderr
        assert not [r for r in daemon.journal(cid) if r["type"] == "prompt"], "a prompt was journaled"
        return
    if runtime.name == "script":  # its turn waits for the steer, then answers with it
        runtime.script.write_text('model = "conformance"\n[[turn]]\n[[turn.step]]\nkind = "text"\ntext = "Once upon"\n'  # type: ignore[attr-defined]
                                  '[[turn.step]]\nkind = "wait"\nuntil = "steer"\n'
                                  '[[turn.step]]\nkind = "text"\ntext = "then {steer}"\n')
    else:
        _slowish(runtime)
    cid = _new(daemon, runtime, workdir, scenario)
    follower = Follower(daemon, cid, "Tell me a long story")
    follower.wait_for(lambda line: line.get("type") == "delta", timeout=120)
    steered = daemon.agentctl("steer", cid, STEER, "--json")
    assert steered.returncode == 0, steered.stderr
    assert json.loads(steered.stdout)["disposition"] == "steered"
    if runtime.server is not None:
        _hurry(runtime)
    code = follower.finish(timeout=180)
    assert code == 0, follower.stderr()
    assert _steer_outcome(daemon, cid, STEER) == "used"
    if runtime.server is None:  # script: no model; its turn went on with the steer
        return
    assert any(STEER in json.dumps(r) for r in runtime.server.requests), f"no model request of {runtime.name} carried the steer"
    # A steer the turn never gets to use (cancelled right after): a notice says so, or the runtime used it.
    late = "LATE-STEER-8820"
    _slowish(runtime)
    follower = Follower(daemon, cid, "Another long story")
    follower.wait_for(lambda line: line.get("type") == "delta", timeout=120)
    assert daemon.agentctl("steer", cid, late).returncode == 0
    # A runtime may carry the steer to the model at once: then its own report of that must be
    # journaled as used before the cancel, which would otherwise race that report.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not _carried(runtime, late):
        time.sleep(0.05)
    if _carried(runtime, late):
        runtime.server.stream_slowly(0)  # it has the steer: the rest of the answer need not take its time
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
                r["type"] == "item" and late in r["data"].get("text", "") for r in daemon.journal(cid)):
            time.sleep(0.1)
    carried = _carried(runtime, late)  # judged at the cancel; what comes after is checked below
    assert daemon.agentctl("cancel", cid).returncode in (0, 9)
    follower.finish(timeout=60)
    outcome = _steer_outcome(daemon, cid, late)
    assert outcome == "used" or not carried, f"a model request carried the steer, yet it is journaled {outcome}"
    # Whatever the runtime still does with the steer shows before its next prompt is answered
    # (it answers what it holds first): that prompt's turn is the next one and ends once, its
    # answer is its own, nothing came between the turns, and a steer journaled as not
    # delivered reached no model request, then or later.
    runtime.server.reset()
    runtime.server.answer_text_only(NEXT_ANSWER)
    sent = daemon.agentctl("send", cid, "One more thing", "--follow", "--json", timeout=180)
    assert sent.returncode == 0, sent.stderr
    journal = daemon.journal(cid)
    start = max(n for n, r in enumerate(journal) if r["type"] == "prompt")
    ended = max(n for n, r in enumerate(journal[:start]) if r["type"] == "turn" and r["data"]["state"] != "working")
    between = [r for r in journal[ended + 1:start] if r["type"] in ("item", "delta", "turn")]
    assert not between, f"{runtime.name} went on after the cancelled turn's end: {between}"
    after = journal[start:]
    assert [r["data"]["state"] for r in after if r["type"] == "turn"] == ["working", "completed"], after
    answers = [r["data"]["text"] for r in after if r["type"] == "item" and r["data"]["kind"] == "assistant"]
    assert answers == [NEXT_ANSWER], answers
    assert outcome == ("used" if _carried(runtime, late) else "notice"), (outcome, carried)


def _carried(runtime: Runtime, text: str) -> bool:
    """Whether a model request the scripted server got so far carries ``text``."""
    assert runtime.server is not None
    return any(text in json.dumps(r) for r in list(runtime.server.requests))


def _slowish(runtime: Runtime) -> None:
    """An answer streamed over about 16 s: time to steer on a loaded machine, not much longer."""
    assert runtime.server is not None
    runtime.server.reset()
    runtime.server.answer_text_only(" ".join(f"word{i}" for i in range(160)))
    runtime.server.stream_slowly(0.1)


def _hurry(runtime: Runtime) -> None:
    """The rest of a slow answer at full speed, once the runtime has had a moment (STEER_GRACE_S)
    to take in a steer it accepted: the slow stream only had to leave time to send it."""
    assert runtime.server is not None
    time.sleep(STEER_GRACE_S)
    runtime.server.stream_slowly(0)


def _steer_outcome(d: Daemon, cid: str, text: str) -> str:
    """'used' (a user item of delivery steer), 'notice' (a notice item naming it), exactly one of them."""
    items = [r["data"] for r in d.journal(cid) if r["type"] == "item" and text in r["data"].get("text", "")]
    used = any(i["kind"] == "user" and i.get("delivery") == "steer" for i in items)
    notice = any(i["kind"] == "notice" for i in items)
    assert used != notice, f"steer {text!r}: used={used} notice={notice}: {items}"
    return "used" if used else "notice"
