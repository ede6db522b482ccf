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
        runtime.slow_text()
    cid = _new(daemon, runtime, workdir, scenario)
    follower = Follower(daemon, cid, "Tell me a long story")
    follower.wait_for(lambda line: line.get("type") == "delta", timeout=120)
    steered = daemon.agentctl("steer", cid, STEER, "--json")
    assert steered.returncode == 0, steered.stderr
    assert json.loads(steered.stdout)["disposition"] == "steered"
    code = follower.finish(timeout=180)
    assert code == 0, follower.stderr()
    if runtime.server is None:  # script: the steer is a user item of the running turn
        items = [r["data"] for r in daemon.journal(cid) if r["type"] == "item"]
        assert any(i["kind"] == "user" and i.get("delivery") == "steer" and STEER in i["text"] for i in items)
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(STEER in json.dumps(r) for r in runtime.server.requests):
        time.sleep(0.2)
    assert any(STEER in json.dumps(r) for r in runtime.server.requests), f"no model request of {runtime.name} carried the steer"
