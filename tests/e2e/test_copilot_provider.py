"""The copilot provider on the real Copilot CLI, offline against the scripted model server.

Each test drives :class:`CopilotProvider` directly under trio with a list
sink; the CLI runs with bring-your-own-key (openai) pointed at 127.0.0.1 and
a COPILOT_HOME of its own. Only the model is scripted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest
import trio

from agentd import contract as c
from agentd.providers.copilot import CopilotProvider
from agentd.providers.copilot._bridge import AsyncioBridge
import provider_sinks

pytestmark = pytest.mark.e2e

TURN_TIMEOUT = 45.0


class ListSink(provider_sinks.ListSink):
    """The shared event sink (tests/provider_sinks.py), waiting up to TURN_TIMEOUT."""

    timeout = TURN_TIMEOUT


async def start_provider(nursery: trio.Nursery, config: Any, state_dir: Any) -> tuple[CopilotProvider, trio.CancelScope]:
    """A running provider and the scope that stops it."""
    provider = CopilotProvider(config, state_dir=state_dir, name="copilot")
    scope = trio.CancelScope()

    async def serve(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await provider.run(task_status=task_status)

    await nursery.start(serve)
    return provider, scope


@pytest.fixture
async def provider(copilot_config: Any, tmp_path: Any, nursery: trio.Nursery) -> CopilotProvider:
    p, _ = await start_provider(nursery, copilot_config, tmp_path / "state")
    return p


def user_texts(request_body: dict[str, Any]) -> str:
    """Everything the runtime sent as message content in one model request."""
    parts = []
    for msg in request_body.get("messages") or []:
        content = msg.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


# --------------------------------------------------------------------------- 1. text turn


async def test_text_turn_streams_deltas_and_completes(provider: CopilotProvider, model_server: Any, workdir: Any) -> None:
    answer = "Hello from the scripted model, streamed word by word."
    model_server.answer_text_only(answer)
    sink = ListSink()
    conv = await provider.open(c.OpenRequest(workdir=str(workdir), title="text turn"), sink)
    assert conv.id

    await conv.send(c.Prompt(text="Say hello, please."))
    turn = await sink.wait_turns(1)

    assert turn.state is c.TurnState.COMPLETED, turn
    assert sink.turns()[0].state is c.TurnState.WORKING
    assert len(sink.terminal_turns()) == 1
    assert sink.deltas() == answer
    users = sink.items(c.ItemKind.USER)
    assistants = sink.items(c.ItemKind.ASSISTANT)
    assert [u.text for u in users] == ["Say hello, please."]
    assert [a.text for a in assistants] == [answer]
    # order: working, the user item, the streamed deltas, the assistant item, the end
    kinds = [type(e).__name__ for e in sink.events if isinstance(e, (c.TurnEvent, c.DeltaEvent, c.ItemEvent))]
    assert kinds[0] == "TurnEvent" and kinds[-1] == "TurnEvent"
    first_user = next(i for i, e in enumerate(sink.events) if isinstance(e, c.ItemEvent) and e.item.kind is c.ItemKind.USER)
    first_delta = next(i for i, e in enumerate(sink.events) if isinstance(e, c.DeltaEvent))
    assistant_item = next(i for i, e in enumerate(sink.events) if isinstance(e, c.ItemEvent) and e.item.kind is c.ItemKind.ASSISTANT)
    assert first_user < first_delta < assistant_item
    assert "Say hello, please." in user_texts(model_server.model_requests[-1])
    assert sink.thread_ok, "the sink was called from a thread other than trio's"
    assert any(isinstance(e, c.TokensEvent) for e in sink.events)
    assert any(isinstance(e, c.ContextEvent) for e in sink.events)

    await conv.close()
    with pytest.raises(c.Closed):
        await conv.send(c.Prompt(text="after close"))


# --------------------------------------------------------------------------- 2. bash + permission


async def _bash_turn(provider: CopilotProvider, model_server: Any, workdir: Any, decision: str, key_env: str = "UNUSED") -> tuple[ListSink, c.Interaction]:
    target = workdir / "made-by-bash.txt"
    model_server.call_tool("bash", command=f"echo made > {target} && echo tool-output-line key=${{{key_env}:-unset}}")
    sink = ListSink()
    conv = await provider.open(c.OpenRequest(workdir=str(workdir)), sink)
    await conv.send(c.Prompt(text="Write the file."))
    inter = await sink.wait_interaction(c.InteractionKind.PERMISSION)
    assert str(target) in inter.title
    allow = [o for o in inter.options if o.allow_once]
    deny = [o for o in inter.options if o.reject]
    assert [o.id for o in allow] == ["allow_once"] and [o.id for o in deny] == ["reject"]
    assert inter.tool_call_id
    assert not target.exists(), "the command ran before it was allowed"
    with pytest.raises(c.Invalid):
        await conv.respond(inter.id, c.Answer(decision="no-such-option"))
    await conv.respond(inter.id, c.Answer(decision=decision))
    with pytest.raises(c.InteractionGone):
        await conv.respond(inter.id, c.Answer(decision=decision))
    await sink.wait_turns(1)
    return sink, inter


async def test_bash_permission_allowed_runs_the_command(provider: CopilotProvider, model_server: Any, workdir: Any, model_key_env: str) -> None:
    sink, inter = await _bash_turn(provider, model_server, workdir, "allow_once", model_key_env)
    turn = sink.terminal_turns()[0]
    assert turn.state is c.TurnState.COMPLETED, turn
    assert (workdir / "made-by-bash.txt").read_text().strip() == "made"
    tools = sink.items(c.ItemKind.TOOL)
    assert len(tools) == 1
    tool = tools[0].tool
    assert tool is not None and tool.name == "bash"
    assert tool.status is c.ToolStatus.COMPLETED
    assert tool.exit_code == 0
    assert "tool-output-line" in tool.output
    assert "key=unset" in tool.output, "the BYOK key variable reached the agent's shell"
    assert "made-by-bash.txt" in tool.input
    assert tools[0].id == inter.tool_call_id
    states = [e.interaction.state for e in sink.of(c.InteractionEvent) if e.interaction.id == inter.id]
    assert states == [c.InteractionState.PENDING, c.InteractionState.ANSWERED]
    assert sink.items(c.ItemKind.ASSISTANT)[-1].text == model_server.final_text
    # the second model call carried the tool's result
    assert "tool-output-line" in user_texts(model_server.model_requests[-1])


async def test_bash_permission_denied_does_not_run_the_command(provider: CopilotProvider, model_server: Any, workdir: Any) -> None:
    sink, inter = await _bash_turn(provider, model_server, workdir, "reject")
    turn = sink.terminal_turns()[0]
    assert not (workdir / "made-by-bash.txt").exists()
    assert turn.state is c.TurnState.CANCELLED and turn.reason == "permission_denied", turn
    tool = sink.items(c.ItemKind.TOOL)[0].tool
    assert tool is not None and tool.status is c.ToolStatus.FAILED
    states = [e.interaction.state for e in sink.of(c.InteractionEvent) if e.interaction.id == inter.id]
    assert states == [c.InteractionState.PENDING, c.InteractionState.REJECTED]


async def test_ask_user_becomes_a_question_and_the_answer_reaches_the_agent(provider: CopilotProvider, model_server: Any, workdir: Any) -> None:
    model_server.call_tool("ask_user", arguments={"question": "Which colour?", "choices": ["red", "blue"]})
    sink = ListSink()
    conv = await provider.open(c.OpenRequest(workdir=str(workdir)), sink)
    await conv.send(c.Prompt(text="Ask me something."))
    inter = await sink.wait_interaction(c.InteractionKind.QUESTION)
    assert inter.questions[0].text == "Which colour?"
    assert inter.questions[0].choices == ["red", "blue"]
    await conv.respond(inter.id, c.Answer(answers=[["blue"]]))
    turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.COMPLETED, turn
    tool = sink.items(c.ItemKind.TOOL)[0].tool
    assert tool is not None and tool.name == "ask_user" and "blue" in tool.output
    assert "blue" in user_texts(model_server.model_requests[-1])


async def test_subagents_report_their_lifecycle_and_own_items(provider: CopilotProvider, model_server: Any, workdir: Any) -> None:
    # Each agent's model call asks for another `task`; the CLI stops the nesting at depth 4.
    model_server.call_tool("task", arguments={"description": "Look around", "prompt": "List the files", "agent_type": "general-purpose", "name": "looker"})
    sink = ListSink()
    conv = await provider.open(c.OpenRequest(workdir=str(workdir)), sink)
    await conv.send(c.Prompt(text="Delegate it."))
    turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.COMPLETED, turn
    subs: dict[str, c.Subagent] = {}
    for e in sink.of(c.SubagentEvent):
        subs[e.subagent.id] = e.subagent
    assert subs and all(s.status is c.SubagentStatus.COMPLETED for s in subs.values())
    running = [e.subagent for e in sink.of(c.SubagentEvent) if e.subagent.status is c.SubagentStatus.RUNNING]
    assert {s.id for s in running} == set(subs)
    tool_ids = {i.id for i in sink.items(c.ItemKind.TOOL)}
    for sub in subs.values():
        assert sub.name == "looker" and sub.parent_tool_call_id in tool_ids
        own = [i for i in sink.items() if i.agent_id == sub.id]
        assert any(i.kind is c.ItemKind.USER and i.text == "List the files" for i in own)
    main_answer = [i for i in sink.items(c.ItemKind.ASSISTANT) if not i.agent_id]
    assert main_answer and main_answer[-1].text == model_server.final_text
    history = await conv.history()
    assert {s.id for s in history.subagents} == set(subs)


# --------------------------------------------------------------------------- 4. cancel


async def test_cancel_during_a_slow_stream_ends_cancelled_within_a_second(provider: CopilotProvider, model_server: Any, workdir: Any) -> None:
    model_server.answer_text_only(" ".join(f"word{i}" for i in range(400)))
    model_server.stream_slowly(0.05)
    sink = ListSink()
    conv = await provider.open(c.OpenRequest(workdir=str(workdir)), sink)
    await conv.send(c.Prompt(text="Tell a long story."))
    await sink.wait_for(lambda: sink.of(c.DeltaEvent), what="the first streamed delta")

    started = trio.current_time()
    await conv.cancel()
    turn = await sink.wait_turns(1, timeout=5)
    elapsed = trio.current_time() - started

    assert turn.state is c.TurnState.CANCELLED and turn.reason == "cancelled", turn
    assert elapsed < 1.0, f"the turn took {elapsed:.2f} s to end after cancel"
    assert len(sink.terminal_turns()) == 1
    # what streamed before the cancel is kept as an item
    partial = sink.items(c.ItemKind.ASSISTANT)
    assert partial and partial[0].text.startswith("word0")

    # the conversation goes on
    model_server.reset()
    model_server.answer_text_only("after the cancel")
    await conv.send(c.Prompt(text="Again, briefly."))
    turn = await sink.wait_turns(2)
    assert turn.state is c.TurnState.COMPLETED


# --------------------------------------------------------------------------- 5. reopen


async def test_new_provider_reopens_by_id_with_history_and_context(
    copilot_config: Any, model_server: Any, workdir: Any, tmp_path: Any, nursery: trio.Nursery
) -> None:
    model_server.answer_text_only("The first answer.")
    first, scope = await start_provider(nursery, copilot_config, tmp_path / "state")
    sink = ListSink()
    conv = await first.open(c.OpenRequest(workdir=str(workdir), title="reopen me"), sink)
    await conv.send(c.Prompt(text="The first question."))
    assert (await sink.wait_turns(1)).state is c.TurnState.COMPLETED
    cid = conv.id
    old_pid = first.runtime_pid
    listed = await first.previous(str(workdir))
    assert [p.id for p in listed] == [cid] and listed[0].title == "reopen me"
    await conv.close()
    scope.cancel()
    await trio.sleep(0)
    await _wait_gone(old_pid)

    second, _ = await start_provider(nursery, copilot_config, tmp_path / "state")
    stored = await second.history(cid)  # read from the CLI's store, no runtime needed
    assert [(i.kind, i.text) for i in stored.items if i.kind in (c.ItemKind.USER, c.ItemKind.ASSISTANT)] == [
        (c.ItemKind.USER, "The first question."),
        (c.ItemKind.ASSISTANT, "The first answer."),
    ]
    with pytest.raises(c.ConversationNotFound):
        await second.open(c.OpenRequest(workdir=str(workdir), conversation_id="0b1e4c2a-0000-4000-8000-000000000000"), ListSink())

    sink2 = ListSink()
    reopened = await second.open(c.OpenRequest(workdir=str(workdir), conversation_id=cid), sink2)
    assert reopened.id == cid
    assert second.runtime_pid != old_pid
    history = await reopened.history()
    texts = [i.text for i in history.items]
    assert "The first question." in texts and "The first answer." in texts

    model_server.answer_text_only("The second answer.")
    before = len(model_server.model_requests)
    await reopened.send(c.Prompt(text="The second question."))
    assert (await sink2.wait_turns(1)).state is c.TurnState.COMPLETED
    sent = user_texts(model_server.model_requests[before])
    assert "The first question." in sent and "The first answer." in sent and "The second question." in sent


async def _wait_gone(pid: int | None, timeout: float = 15.0) -> None:
    if pid is None:
        return
    with trio.fail_after(timeout):
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            # a zombie still answers kill(0); its state says it is gone
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(")")[-1].split()[0] == "Z":
                        return
            except OSError:
                return
            await trio.sleep(0.05)


# --------------------------------------------------------------------------- 6. the CLI dies


async def test_killed_cli_fails_the_turn_and_a_new_runtime_serves_the_next_prompt(provider: CopilotProvider, model_server: Any, workdir: Any) -> None:
    model_server.answer_text_only(" ".join(f"w{i}" for i in range(400)))
    model_server.stream_slowly(0.05)
    sink = ListSink()
    conv = await provider.open(c.OpenRequest(workdir=str(workdir)), sink)
    await conv.send(c.Prompt(text="Stream for a while."))
    await sink.wait_for(lambda: sink.of(c.DeltaEvent), what="the first streamed delta")
    pid = provider.runtime_pid
    assert pid is not None

    os.kill(pid, signal.SIGKILL)
    turn = await sink.wait_turns(1, timeout=10)

    assert turn.state is c.TurnState.FAILED and turn.reason == "runtime_exit", turn
    assert "SIGKILL" in turn.error, turn.error
    exits = sink.of(c.ExitEvent)
    assert len(exits) == 1 and exits[0].error == turn.error
    assert sink.events.index(exits[0]) > sink.events.index(next(e for e in sink.of(c.TurnEvent) if e.turn.state.terminal))
    with pytest.raises(c.Closed):
        await conv.send(c.Prompt(text="to a dead runtime"))

    model_server.reset()
    model_server.answer_text_only("Back again.")
    sink2 = ListSink()
    reopened = await provider.open(c.OpenRequest(workdir=str(workdir), conversation_id=conv.id), sink2)
    assert provider.runtime_pid not in (None, pid)
    await reopened.send(c.Prompt(text="Are you there?"))
    turn = await sink2.wait_turns(1)
    assert turn.state is c.TurnState.COMPLETED, turn
    assert sink2.items(c.ItemKind.ASSISTANT)[-1].text == "Back again."


# --------------------------------------------------------------------------- 7. the model fails


@pytest.mark.parametrize("failure", ["http_500", "dropped_stream"])
async def test_model_failure_fails_the_turn_with_the_runtime_error(provider: CopilotProvider, model_server: Any, workdir: Any, failure: str) -> None:
    if failure == "http_500":
        model_server.fail_with(500, retry_after=0)  # Retry-After: 0 keeps the CLI's retries short
    else:
        model_server.answer_text_only("this stream is cut short " * 5)
        model_server.drop_stream(after_chunks=3)
    sink = ListSink()
    conv = await provider.open(c.OpenRequest(workdir=str(workdir)), sink)
    await conv.send(c.Prompt(text="This will fail."))
    turn = await sink.wait_turns(1, timeout=60)

    assert turn.state is c.TurnState.FAILED and turn.reason == "error", turn
    assert "Failed to get response from the AI model" in turn.error, turn.error
    if failure == "http_500":
        assert "500" in turn.error
    assert len(sink.terminal_turns()) == 1
    notices = sink.items(c.ItemKind.NOTICE)
    assert any(turn.error in n.text for n in notices)

    model_server.reset()
    model_server.answer_text_only("Recovered.")
    await conv.send(c.Prompt(text="Try again."))
    assert (await sink.wait_turns(2)).state is c.TurnState.COMPLETED


# --------------------------------------------------------------------------- the bridge


async def test_bridge_runs_coroutines_and_cancels_them_from_trio() -> None:
    bridge = AsyncioBridge("test-bridge")
    await bridge.start()
    try:
        async def add(a: int, b: int) -> int:
            await asyncio.sleep(0.01)
            return a + b

        assert await bridge.run(add, 2, 3) == 5

        async def boom() -> None:
            raise ValueError("from asyncio")

        with pytest.raises(ValueError, match="from asyncio"):
            await bridge.run(boom)

        cancelled = asyncio.Event()  # set on the asyncio loop when the task sees its cancellation

        async def forever() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        started = time.monotonic()
        with trio.move_on_after(0.1):
            await bridge.run(forever)
        assert time.monotonic() - started < 1.0

        async def was_cancelled() -> bool:
            await asyncio.wait_for(cancelled.wait(), 5)
            return True

        assert await bridge.run(was_cancelled)

        seen: list[str] = []
        bridge.call_soon(lambda: bridge.to_trio(seen.append, "round trip"))
        with trio.fail_after(5):
            while not seen:
                await trio.sleep(0.01)
        assert seen == ["round trip"]
    finally:
        await bridge.stop()
    assert not bridge.running
