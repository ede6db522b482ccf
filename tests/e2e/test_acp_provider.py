"""The acp provider on real ACP agents, offline against the scripted model server.

Each scenario runs on ``acp:claude`` (@zed-industries/claude-agent-acp),
``acp:gemini`` (Gemini CLI ``--acp``) and ``acp:copilot`` (Copilot CLI
``--acp``), driving :class:`AcpProvider` directly under trio with a list sink.
The agents are installed from ``tests/e2e/acp-agents/package-lock.json``
(Copilot from ``tests/e2e/package-lock.json``), run with HOME and their config
dirs in the test's tmp dir, and talk only to the model server on 127.0.0.1.
What an agent cannot do is decided from its reported capabilities.

fs confinement and protocol violations use ``acp_fake_agent.py``: no real
agent sends fs requests for paths a test chooses.

A matrix (agent x scenario -> pass / unsupported / fail, with seconds) is
printed at the end of the module.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import trio

from agentd import contract as c
from agentd.config import AcpAgentConfig
from agentd.providers.acp import AcpConversation, AcpProvider
from acp_agents import (
    LOAD_NEEDS_A_NEW_MINUTE,
    call_shell,
    claude_config,
    copilot_config,
    gemini_config,
    install_acp_agents,
)

pytestmark = pytest.mark.e2e

HERE = pathlib.Path(__file__).resolve().parent
FAKE_AGENT = HERE / "acp_fake_agent.py"
TURN_TIMEOUT = 60.0
AGENTS = ["claude", "gemini", "copilot"]
SCENARIOS = ["text", "permission", "cancel", "reopen", "kill", "model_failure"]


# --------------------------------------------------------------------------- installing the agents


@pytest.fixture(scope="session")
def acp_bin() -> pathlib.Path:
    try:
        return install_acp_agents()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        reason = f"the ACP agents could not be installed: {exc}"
        print(f"\nSKIP: {reason}", file=sys.stderr)
        pytest.skip(reason)


async def after_the_minute_of(created: float) -> None:
    """Sleep until the UTC minute that wall-clock time ``created`` fell in is over."""
    delay = (int(created // 60) + 1) * 60 + 0.5 - time.time()
    if delay > 0:
        print(f"\nwaiting {delay:.1f} s for the next UTC minute (Gemini CLI session/load)")
        await trio.sleep(delay)


@pytest.fixture(params=AGENTS)
def agent(request: pytest.FixtureRequest, model_server: Any, tmp_path: pathlib.Path) -> tuple[str, AcpAgentConfig]:
    """(agent name, its AcpAgentConfig pointing at ``model_server``)."""
    name = request.param
    base = model_server.url.removesuffix("/v1")
    if name == "copilot":
        return name, copilot_config(request.getfixturevalue("copilot_cli"), tmp_path, model_server.url, model_server.model)
    bins = request.getfixturevalue("acp_bin")
    make = claude_config if name == "claude" else gemini_config
    return name, make(bins, tmp_path, base)


# --------------------------------------------------------------------------- harness


class ListSink:
    """Collects a conversation's events; ``emit`` is called on the trio thread only."""

    def __init__(self) -> None:
        self.events: list[c.Event] = []

    def emit(self, event: c.Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def terminal_turns(self) -> list[c.Turn]:
        return [e.turn for e in self.of(c.TurnEvent) if e.turn.state.terminal]

    def items(self, kind: c.ItemKind | None = None) -> list[c.Item]:
        latest: dict[str, c.Item] = {}
        for e in self.of(c.ItemEvent):
            latest[e.item.id] = e.item
        return [i for i in latest.values() if kind is None or i.kind is kind]

    def deltas(self) -> str:
        return "".join(e.delta.text for e in self.of(c.DeltaEvent) if e.delta.kind is c.ItemKind.ASSISTANT)

    async def wait_for(self, predicate: Callable[[], Any], what: str, timeout: float = TURN_TIMEOUT) -> Any:
        with trio.move_on_after(timeout):
            while True:
                found = predicate()
                if found:
                    return found
                await trio.sleep(0.01)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; "
                             f"events: {[type(e).__name__ for e in self.events][-30:]}")

    async def wait_turns(self, count: int = 1, timeout: float = TURN_TIMEOUT) -> c.Turn:
        await self.wait_for(lambda: len(self.terminal_turns()) >= count, f"{count} terminal turn(s)", timeout)
        return self.terminal_turns()[count - 1]

    async def wait_permission(self) -> c.Interaction:
        def pending() -> c.Interaction | None:
            for e in reversed(self.of(c.InteractionEvent)):
                if e.interaction.kind is c.InteractionKind.PERMISSION and e.interaction.state is c.InteractionState.PENDING:
                    if not any(x.interaction.id == e.interaction.id and x.interaction.state is not c.InteractionState.PENDING
                               for x in self.of(c.InteractionEvent)):
                        return e.interaction
            return None

        return await self.wait_for(pending, "a pending permission")


class Running:
    """A provider serving in the test's nursery, and the scope that stops it."""

    def __init__(self, provider: AcpProvider, scope: trio.CancelScope, stopped: trio.Event) -> None:
        self.provider = provider
        self.scope = scope
        self.stopped = stopped


async def start_provider(nursery: trio.Nursery, config: AcpAgentConfig, state: pathlib.Path, name: str) -> Running:
    provider = AcpProvider(config, state_dir=state, name=f"acp:{name}")
    scope = trio.CancelScope()
    stopped = trio.Event()

    async def serve(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with scope:
                await provider.run(task_status=task_status)
        finally:
            stopped.set()

    await nursery.start(serve)
    return Running(provider, scope, stopped)


async def stop_provider(running: Running) -> None:
    running.scope.cancel()
    await running.stopped.wait()


async def open_conv(provider: AcpProvider, workdir: pathlib.Path, sink: ListSink, conversation_id: str = "",
                    pass_workdir: bool = True) -> AcpConversation:
    request = c.OpenRequest(workdir=str(workdir) if pass_workdir else "", conversation_id=conversation_id)
    with trio.fail_after(TURN_TIMEOUT):
        return await provider.open(request, sink)


def mentions(body: Any, text: str) -> bool:
    return text in json.dumps(body)


def option(interaction: c.Interaction, *, allow: bool) -> str:
    for o in interaction.options:
        if (o.allow_once if allow else o.reject):
            return o.id
    raise AssertionError(f"no {'allow_once' if allow else 'reject'} option in {interaction.options}")


# --------------------------------------------------------------------------- the matrix

_MATRIX: dict[tuple[str, str], tuple[str, float, str]] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_matrix(request: pytest.FixtureRequest):
    yield
    if not _MATRIX:
        return
    width = 16
    lines = ["", "acp provider matrix (agent x scenario -> outcome, seconds):",
             f"{'':<12}" + "".join(f"{s:>{width}}" for s in SCENARIOS)]
    notes = []
    for a in AGENTS:
        row = f"{'acp:' + a:<12}"
        for s in SCENARIOS:
            outcome, took, note = _MATRIX.get((a, s), ("-", 0.0, ""))
            row += f"{outcome + (f' {took:.1f}s' if outcome != '-' else ''):>{width}}"
            if note:
                notes.append(f"  acp:{a} {s}: {note}")
        lines.append(row)
    lines += notes
    if any(s == "model_failure" for _, s in _MATRIX):
        lines.append("  (model_failure: failed = the turn failed with the agent's error; text = the agent answered its "
                     "error as text with stopReason end_turn; silent = it ended the turn with no answer at all)")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print("\n".join(lines), file=sys.stderr)
        return
    with capture.global_and_fixture_disabled():
        for line in lines:
            reporter.write_line(line)


@pytest.fixture
def record():
    """``record(agent, scenario, outcome, note)``: a test notes "fail" first and its real outcome at
    its end, so a test that stops midway stays "fail" in the matrix."""
    started = time.monotonic()
    noted: dict[str, Any] = {}

    def note(agent: str, scenario: str, outcome: str = "pass", detail: str = "") -> None:
        noted["key"] = (agent, scenario)
        noted["value"] = (outcome, detail)

    yield note
    if "key" in noted:
        outcome, detail = noted["value"]
        _MATRIX[noted["key"]] = (outcome, time.monotonic() - started, detail)


# --------------------------------------------------------------------------- 1. text turn


async def test_text_turn_streams_and_completes(agent, model_server, workdir, tmp_path, nursery, record) -> None:
    name, config = agent
    record(name, "text", "fail")
    model_server.answer_text_only("Hello from the scripted model, streamed word by word to agentd.")
    running = await start_provider(nursery, config, tmp_path / "state", name)
    sink = ListSink()
    conv = await open_conv(running.provider, workdir, sink)

    await conv.send(c.Prompt(text="say hello"))
    turn = await sink.wait_turns(1)

    assert turn.state is c.TurnState.COMPLETED, turn
    states = [e.turn.state for e in sink.of(c.TurnEvent)]
    assert states == [c.TurnState.WORKING, c.TurnState.COMPLETED]
    assert len(sink.of(c.DeltaEvent)) > 1, "the answer was not streamed"
    assert sink.deltas() == model_server.text
    assistant = sink.items(c.ItemKind.ASSISTANT)
    assert [i.text for i in assistant] == [model_server.text]
    users = sink.items(c.ItemKind.USER)
    assert [i.text for i in users] == ["say hello"]
    # the ItemEvent of the user comes before the turn starts working
    kinds = [type(e).__name__ for e in sink.events]
    assert kinds.index("ItemEvent") < kinds.index("TurnEvent")
    assert any(mentions(b, "say hello") for b in model_server.requests)
    caps = running.provider.capabilities()
    assert caps.cancel and caps.permissions
    record(name, "text")
    await conv.close()


# --------------------------------------------------------------------------- 2. permission


async def test_permission_allow_runs_the_tool_and_deny_does_not(agent, model_server, workdir, tmp_path, nursery, record) -> None:
    name, config = agent
    record(name, "permission", "fail")
    running = await start_provider(nursery, config, tmp_path / "state", name)
    sink = ListSink()
    conv = await open_conv(running.provider, workdir, sink)

    call_shell(model_server, name, "echo allowed > allowed.txt")
    await conv.send(c.Prompt(text="write allowed.txt"))
    perm = await sink.wait_permission()
    assert perm.tool_call_id and any(o.allow_once for o in perm.options) and any(o.reject for o in perm.options)
    assert "allowed.txt" in perm.detail or "allowed.txt" in perm.title
    await conv.respond(perm.id, c.Answer(decision=option(perm, allow=True)))
    turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.COMPLETED, turn
    assert (workdir / "allowed.txt").read_text().strip() == "allowed"
    tool = next(i for i in sink.items(c.ItemKind.TOOL) if i.id == perm.tool_call_id)
    assert tool.tool is not None and tool.tool.status is c.ToolStatus.COMPLETED, tool
    answered = [e.interaction for e in sink.of(c.InteractionEvent) if e.interaction.id == perm.id][-1]
    assert answered.state is c.InteractionState.ANSWERED

    call_shell(model_server, name, "echo denied > denied.txt")
    await conv.send(c.Prompt(text="write denied.txt"))
    perm2 = await sink.wait_permission()
    assert perm2.id != perm.id
    await conv.respond(perm2.id, c.Answer(decision=option(perm2, allow=False)))
    turn2 = await sink.wait_turns(2)
    assert turn2.state in (c.TurnState.COMPLETED, c.TurnState.CANCELLED), turn2
    assert not (workdir / "denied.txt").exists()
    rejected = [e.interaction for e in sink.of(c.InteractionEvent) if e.interaction.id == perm2.id][-1]
    assert rejected.state is c.InteractionState.REJECTED
    denied_tool = next(i for i in sink.items(c.ItemKind.TOOL) if i.id == perm2.tool_call_id)
    assert denied_tool.tool is not None and denied_tool.tool.status is not c.ToolStatus.COMPLETED, denied_tool
    record(name, "permission")
    await conv.close()


# --------------------------------------------------------------------------- 3. cancel


async def test_cancel_during_a_slow_answer_ends_cancelled_within_a_second(agent, model_server, workdir, tmp_path, nursery,
                                                                          record) -> None:
    name, config = agent
    record(name, "cancel", "fail")
    running = await start_provider(nursery, config, tmp_path / "state", name)
    sink = ListSink()
    conv = await open_conv(running.provider, workdir, sink)

    model_server.answer_text_only(" ".join(f"word{i}" for i in range(60)))
    model_server.stream_slowly(0.2)
    await conv.send(c.Prompt(text="tell me a long story"))
    await sink.wait_for(lambda: sink.of(c.DeltaEvent), "the first streamed text")
    started = time.monotonic()
    with trio.fail_after(5):
        await conv.cancel()
    took = time.monotonic() - started
    turn = sink.terminal_turns()[0]
    assert turn.state is c.TurnState.CANCELLED, turn
    assert took < 1.0, f"cancel took {took:.2f} s"

    model_server.reset()
    model_server.answer_text_only("Back again after the cancel.")
    await conv.send(c.Prompt(text="are you there?"))
    turn2 = await sink.wait_turns(2)
    assert turn2.state is c.TurnState.COMPLETED, turn2
    assert sink.items(c.ItemKind.ASSISTANT)[-1].text.endswith("Back again after the cancel."), sink.events
    record(name, "cancel", "pass", f"cancel() returned after {took:.2f} s")
    await conv.close()


# --------------------------------------------------------------------------- 4. reopen


async def test_reopen_by_id_in_a_new_provider_carries_the_earlier_turn(agent, model_server, workdir, tmp_path, nursery,
                                                                       record) -> None:
    name, config = agent
    record(name, "reopen", "fail")
    state = tmp_path / "state"
    marker = f"PAPAYA-{uuid.uuid4().hex[:8]}"
    model_server.answer_text_only("Noted.")
    first = await start_provider(nursery, config, state, name)
    sink = ListSink()
    conv = await open_conv(first.provider, workdir, sink)
    created = time.time()  # session/new is answered by now: its chat file's minute is at most this one
    caps = first.provider.capabilities()
    await conv.send(c.Prompt(text=f"remember the word {marker}"))
    assert (await sink.wait_turns(1)).state is c.TurnState.COMPLETED
    cid = conv.id
    await stop_provider(first)

    second = await start_provider(nursery, config, state, name)
    sink2 = ListSink()
    if caps.reopen:  # an id the agent never had is not found, and nothing replaces it
        with pytest.raises(c.ConversationNotFound):
            await open_conv(second.provider, workdir, ListSink(), conversation_id=str(uuid.uuid4()))
    if name in LOAD_NEEDS_A_NEW_MINUTE:
        await after_the_minute_of(created)
    if not caps.reopen:
        with pytest.raises(c.Unsupported):
            await open_conv(second.provider, workdir, sink2, conversation_id=cid, pass_workdir=False)
        print(f"\n{name}: reopen unsupported (the agent advertises neither loadSession nor session/resume)")
        record(name, "reopen", "unsupported", "advertises neither loadSession nor session/resume")
        return
    # the record kept the workdir: the id alone reopens it
    conv2 = await open_conv(second.provider, workdir, sink2, conversation_id=cid, pass_workdir=False)
    assert conv2.id == cid
    if caps.history:
        history = await conv2.history()
        assert any(marker in i.text for i in history.items if i.kind is c.ItemKind.USER), history.items
        assert any(i.text == "Noted." for i in history.items if i.kind is c.ItemKind.ASSISTANT), history.items
    else:
        with pytest.raises(c.Unsupported):
            await conv2.history()
    before = len(model_server.requests)
    model_server.answer_text_only("I remember.")
    await conv2.send(c.Prompt(text="which word did I ask you to remember?"))
    turn = await sink2.wait_turns(1)
    assert turn.state is c.TurnState.COMPLETED, turn
    later = model_server.requests[before:]
    assert any(mentions(b, marker) and mentions(b, "which word") for b in later), \
        "the follow-up request does not carry the earlier turn"
    record(name, "reopen")
    await conv2.close()


# --------------------------------------------------------------------------- 5. kill the agent


async def test_killed_agent_fails_the_turn_and_the_next_prompt_works(agent, model_server, workdir, tmp_path, nursery,
                                                                     record) -> None:
    name, config = agent
    record(name, "kill", "fail")
    running = await start_provider(nursery, config, tmp_path / "state", name)
    sink = ListSink()
    conv = await open_conv(running.provider, workdir, sink)
    created = time.time()  # see the reopen test
    caps = running.provider.capabilities()

    model_server.answer_text_only(" ".join(f"word{i}" for i in range(60)))
    model_server.stream_slowly(0.2)
    await conv.send(c.Prompt(text="a slow answer please"))
    await sink.wait_for(lambda: sink.of(c.DeltaEvent), "the first streamed text")
    pid = conv.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    turn = await sink.wait_turns(1, timeout=10)
    assert turn.state is c.TurnState.FAILED and turn.reason == "runtime_exit", turn
    assert "SIGKILL" in turn.error, turn.error
    exits = sink.of(c.ExitEvent)
    assert len(exits) == 1 and "SIGKILL" in exits[0].error
    assert sink.events.index(exits[0]) > sink.events.index(next(e for e in sink.of(c.TurnEvent) if e.turn.state.terminal))

    model_server.reset()
    model_server.answer_text_only("Alive again.")
    if not caps.reopen:
        with pytest.raises(c.Closed):
            await conv.send(c.Prompt(text="still there?"))
        record(name, "kill", "unsupported", "cannot load or resume, so the session cannot come back")
        return
    if name in LOAD_NEEDS_A_NEW_MINUTE:
        await after_the_minute_of(created)
    with trio.fail_after(TURN_TIMEOUT):
        await conv.send(c.Prompt(text="still there?"))
    turn2 = await sink.wait_turns(2)
    assert turn2.state is c.TurnState.COMPLETED, turn2
    assert conv.pid is not None and conv.pid != pid
    assert sink.items(c.ItemKind.ASSISTANT)[-1].text == "Alive again."
    record(name, "kill")
    await conv.close()


# --------------------------------------------------------------------------- 6. model failures


async def test_model_endpoint_failure_ends_the_turn_with_the_agents_error(agent, model_server, workdir, tmp_path, nursery,
                                                                         record) -> None:
    """HTTP 500, then a stream cut mid-answer: each turn ends (no hang) without the scripted answer.

    Agents differ in how they say it: a JSON-RPC error (the turn fails with its
    message) or an error text with stopReason end_turn (the turn completes and
    the text is the answer). Both are the agent's own report; the matrix says which.
    """
    name, config = agent
    record(name, "model_failure", "fail")
    running = await start_provider(nursery, config, tmp_path / "state", name)
    sink = ListSink()
    conv = await open_conv(running.provider, workdir, sink)
    outcomes = []
    # Pin a concrete model where the agent offers a choice: no routing call (Gemini's "auto"
    # asks a classifier model first, with retries of its own) stands before the failing call.
    try:
        offered = [m.id for m in await running.provider.models()]
    except c.Unsupported:
        offered = []
    concrete = [m for m in offered if m not in (conv.model, "auto", "default")]
    if concrete:
        await conv.set_model(concrete[0])
        assert conv.model == concrete[0]
        assert sink.of(c.ModelSelectionEvent)[-1].selection.model == concrete[0]

    for n, (mode, needle) in enumerate([("500", "500"), ("drop", "")], 1):
        model_server.reset()
        model_server.answer_text_only("This scripted answer must never arrive whole.")
        if mode == "500":
            model_server.fail_with(500, retry_after=0)
        else:
            model_server.drop_stream(after_chunks=2)
        await conv.send(c.Prompt(text=f"this will fail ({mode})"))
        turn = await sink.wait_turns(n, timeout=45)
        answer = " ".join(i.text for i in sink.items(c.ItemKind.ASSISTANT)
                          if i.id.startswith(sink.items(c.ItemKind.USER)[-1].id.split("-")[0]))
        assert model_server.text not in answer
        if turn.state is c.TurnState.FAILED:
            assert turn.error and needle in turn.error, turn
            outcomes.append(f"{mode}:failed")
        else:
            assert turn.state is c.TurnState.COMPLETED, turn
            outcomes.append(f"{mode}:{'text' if answer.strip() else 'silent'}")
            if needle and answer.strip():
                assert needle in answer, answer

    model_server.reset()
    model_server.answer_text_only("Recovered.")
    await conv.send(c.Prompt(text="and now?"))
    turn = await sink.wait_turns(3)
    assert turn.state is c.TurnState.COMPLETED, turn
    print(f"\n{name}: model failures -> {', '.join(outcomes)}")
    record(name, "model_failure", "pass", ", ".join(outcomes))
    await conv.close()


# --------------------------------------------------------------------------- fs confinement (fake peer)


@pytest.fixture
def fake_config(tmp_path: pathlib.Path) -> AcpAgentConfig:
    return AcpAgentConfig(command=[sys.executable, str(FAKE_AGENT)])


async def _fake_turn(conv: AcpConversation, sink: ListSink, text: str) -> str:
    count = len(sink.terminal_turns())
    await conv.send(c.Prompt(text=text))
    turn = await sink.wait_turns(count + 1, timeout=10)
    assert turn.state is c.TurnState.COMPLETED, turn
    return sink.items(c.ItemKind.ASSISTANT)[-1].text


async def test_fs_requests_are_confined_to_the_workdir(fake_config, workdir, tmp_path, nursery) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("top secret")
    (workdir / "inside.txt").write_text("line1\nline2\nline3\n")
    (workdir / "link").symlink_to(outside)
    (workdir / "linkdir").symlink_to(tmp_path)
    running = await start_provider(nursery, fake_config, tmp_path / "state", "fake")
    sink = ListSink()
    conv = await open_conv(running.provider, workdir, sink)

    assert await _fake_turn(conv, sink, f"read {workdir / 'inside.txt'}") == "ok:line1\nline2\nline3\n"
    assert await _fake_turn(conv, sink, f"write {workdir / 'sub' / 'new.txt'} fresh") == "ok"
    assert (workdir / "sub" / "new.txt").read_text() == "fresh"

    escapes = [
        f"read {workdir / '..' / 'secret.txt'}",
        f"read {workdir / 'link'}",
        f"read {workdir / 'linkdir' / 'secret.txt'}",
        "read /etc/passwd",
        f"write {workdir / 'link'} overwritten",
        f"write {workdir / '..' / 'escaped.txt'} x",
        f"write {workdir / 'linkdir' / 'escaped2.txt'} x",
    ]
    for command in escapes:
        answer = await _fake_turn(conv, sink, command)
        assert answer.startswith("error:") and "outside the conversation's workdir" in answer, (command, answer)
    assert outside.read_text() == "top secret"
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "escaped2.txt").exists()
    notices = [i for i in sink.items(c.ItemKind.NOTICE)]
    assert len(notices) == len(escapes)
    assert all(n.text.startswith("Refused fs/") for n in notices)
    assert "/etc/passwd" in notices[3].text
    await conv.close()


async def test_missing_file_is_an_error_or_empty_as_configured(fake_config, workdir, tmp_path, nursery) -> None:
    import msgspec

    missing = workdir / "missing.txt"
    running = await start_provider(nursery, fake_config, tmp_path / "state", "fake")
    sink = ListSink()
    conv = await open_conv(running.provider, workdir, sink)
    answer = await _fake_turn(conv, sink, f"read {missing}")
    assert answer.startswith("error:") and "not found" in answer.lower()
    await conv.close()

    empty = msgspec.structs.replace(fake_config, missing_file="empty")
    running2 = await start_provider(nursery, empty, tmp_path / "state2", "fake2")
    conv2 = await open_conv(running2.provider, workdir, sink)
    assert await _fake_turn(conv2, sink, f"read {missing}") == "ok:"
    await conv2.close()


async def test_invalid_jsonrpc_mid_turn_fails_the_turn_and_a_fresh_process_is_needed(fake_config, workdir, tmp_path,
                                                                                    nursery) -> None:
    running = await start_provider(nursery, fake_config, tmp_path / "state", "fake")
    sink = ListSink()
    conv = await open_conv(running.provider, workdir, sink)
    caps = running.provider.capabilities()
    assert not caps.reopen and not caps.history  # the fake advertises no loadSession

    await conv.send(c.Prompt(text="garbage"))
    turn = await sink.wait_turns(1, timeout=10)
    assert turn.state is c.TurnState.FAILED and turn.reason == "runtime_exit", turn
    assert "invalid JSON-RPC" in turn.error and "this is not JSON-RPC" in turn.error
    assert len(sink.of(c.ExitEvent)) == 1
    assert conv.pid is None  # the agent process was stopped
    # without load or resume the session cannot come back; the provider says so instead of faking it
    with pytest.raises(c.Closed, match="neither load nor resume"):
        await conv.send(c.Prompt(text="hello"))
    with pytest.raises(c.Unsupported):
        await conv.history()
    with pytest.raises(c.Unsupported):
        await open_conv(running.provider, workdir, ListSink(), conversation_id=conv.id)


async def test_shared_cwd_policy_serves_every_conversation_from_one_process(fake_config, tmp_path, nursery) -> None:
    import msgspec

    shared = msgspec.structs.replace(fake_config, cwd_policy="shared")
    running = await start_provider(nursery, shared, tmp_path / "state", "fake")
    work_a, work_b = tmp_path / "a", tmp_path / "b"
    work_a.mkdir()
    work_b.mkdir()
    (work_a / "f.txt").write_text("from a")
    (work_b / "f.txt").write_text("from b")
    sink_a, sink_b = ListSink(), ListSink()
    conv_a = await open_conv(running.provider, work_a, sink_a)
    conv_b = await open_conv(running.provider, work_b, sink_b)
    assert conv_a.id != conv_b.id and conv_a.pid == conv_b.pid is not None

    assert await _fake_turn(conv_a, sink_a, f"read {work_a / 'f.txt'}") == "ok:from a"
    assert await _fake_turn(conv_b, sink_b, f"read {work_b / 'f.txt'}") == "ok:from b"
    # each session is confined to its own workdir, even in one process
    assert "outside the conversation's workdir" in await _fake_turn(conv_a, sink_a, f"read {work_b / 'f.txt'}")
    assert [i.text for i in sink_a.items(c.ItemKind.USER)][-1].endswith("f.txt")
    assert all("from a" not in i.text for i in sink_b.items())

    pid = conv_a.pid
    await conv_a.close()
    assert conv_b.pid == pid  # still serving b
    assert await _fake_turn(conv_b, sink_b, "hello") == "echo:hello"
    await conv_b.close()


async def test_attachments_are_linked_and_readable_but_nothing_else_outside(fake_config, workdir, tmp_path, nursery) -> None:
    stored = tmp_path / "uploads" / "notes.txt"
    stored.parent.mkdir()
    stored.write_text("attached text")
    (tmp_path / "uploads" / "other.txt").write_text("not attached")
    running = await start_provider(nursery, fake_config, tmp_path / "state", "fake")
    assert running.provider.capabilities().attachments
    sink = ListSink()
    conv = await open_conv(running.provider, workdir, sink)

    attachment = c.Attachment(name="notes.txt", mime="text/plain", size=13, id="abc", path=str(stored))
    await conv.send(c.Prompt(text="hello", attachments=[attachment]))
    await sink.wait_turns(1, timeout=10)
    assert sink.items(c.ItemKind.ASSISTANT)[-1].text == f"links:{stored.as_uri()};echo:hello"
    assert await _fake_turn(conv, sink, f"read {stored}") == "ok:attached text"
    assert "outside" in await _fake_turn(conv, sink, f"read {tmp_path / 'uploads' / 'other.txt'}")
    assert "outside" in await _fake_turn(conv, sink, f"write {stored} changed")
    assert stored.read_text() == "attached text"
    await conv.close()
