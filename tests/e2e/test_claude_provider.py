"""The claude provider on the real Claude Code binary, offline against the scripted model server.

Each test drives :class:`ClaudeProvider` directly under trio with a list
sink. The CLI is the one bundled in the claude-agent-sdk wheel; it talks the
Anthropic Messages API to the scripted server on 127.0.0.1, with a
CLAUDE_CONFIG_DIR and HOME of its own and retries off, so failures fail
fast. Only the model is scripted.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import time
import uuid
from typing import Any

import pytest
import trio

from agentd import contract as c
from agentd.config import ClaudeConfig
from agentd.providers.claude import ClaudeConversation, ClaudeProvider, bundled_cli
import provider_sinks
from environment import unavailable
from modelserver import DEFAULT_FINAL_TEXT, DEFAULT_TEXT, ModelServer

pytestmark = pytest.mark.e2e

MODEL = "scripted-model"
TURN_TIMEOUT = 30.0


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def claude_cli() -> str:
    """The Claude Code binary from the claude-agent-sdk wheel (else `claude` on PATH); skips when absent."""
    exe = bundled_cli() or shutil.which("claude") or ""
    if not exe:
        unavailable("Claude Code is not installed: `pip install claude-agent-sdk` (its wheel bundles the binary)")
    return exe


def claude_config_for(cli: str, server: ModelServer, root: pathlib.Path, key_env: str, **env: str) -> ClaudeConfig:
    """A config pointing Claude Code at ``server``, with its config dir and HOME under ``root``."""
    config_dir, home = root / "claude-config", root / "claude-home"
    config_dir.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    return ClaudeConfig(
        cli_path=cli,
        model=MODEL,
        api_key_env=key_env,
        base_url=server.url.removesuffix("/v1"),
        config_dir=str(config_dir),
        env={"HOME": str(home), "CLAUDE_CODE_MAX_RETRIES": "0", **env},
    )


@pytest.fixture
def claude_config(claude_cli: str, model_server: ModelServer, tmp_path: pathlib.Path, model_key_env: str) -> ClaudeConfig:
    return claude_config_for(claude_cli, model_server, tmp_path, model_key_env)


class ListSink(provider_sinks.ListSink):
    """The shared event sink (tests/provider_sinks.py), waiting up to TURN_TIMEOUT."""

    timeout = TURN_TIMEOUT


async def start_provider(nursery: trio.Nursery, config: ClaudeConfig, state_dir: pathlib.Path) -> tuple[ClaudeProvider, trio.CancelScope]:
    """A running provider and the scope that stops it."""
    provider = ClaudeProvider(config, state_dir=state_dir, name="claude")
    scope = trio.CancelScope()

    async def serve(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await provider.run(task_status=task_status)

    await nursery.start(serve)
    return provider, scope


@pytest.fixture
async def provider(claude_config: ClaudeConfig, tmp_path: pathlib.Path, nursery: trio.Nursery) -> ClaudeProvider:
    p, _ = await start_provider(nursery, claude_config, tmp_path / "state")
    return p


async def open_conv(provider: ClaudeProvider, workdir: pathlib.Path, conversation_id: str = "") -> tuple[ClaudeConversation, ListSink]:
    sink = ListSink()
    conv = await provider.open(c.OpenRequest(workdir=str(workdir), conversation_id=conversation_id), sink)
    return conv, sink


def sent_text(body: dict[str, Any]) -> str:
    """Everything one model request carried as message content (text, tool inputs and results)."""
    return json.dumps(body.get("messages") or [])


# --------------------------------------------------------------------------- 1. text turn


async def test_text_turn_streams_reasoning_and_text_then_completes(
    provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path
) -> None:
    model_server.answer_text_only()
    model_server.think("Weighing the greeting.")
    conv, sink = await open_conv(provider, workdir)
    uuid.UUID(conv.id)  # the Claude Code session id

    await conv.send(c.Prompt(text="Say hello"))
    turn = await sink.wait_turns(1)

    assert turn.state is c.TurnState.COMPLETED, turn
    assert len(sink.terminal_turns()) == 1
    states = [e.turn.state for e in sink.of(c.TurnEvent)]
    assert states[0] is c.TurnState.WORKING
    assert [i.text for i in sink.items(c.ItemKind.USER)] == ["Say hello"]
    assert sink.deltas(c.ItemKind.ASSISTANT) == DEFAULT_TEXT
    assert [i.text for i in sink.items(c.ItemKind.ASSISTANT)] == [DEFAULT_TEXT]
    assert sink.deltas(c.ItemKind.REASONING) == "Weighing the greeting."
    assert [i.text for i in sink.items(c.ItemKind.REASONING)] == ["Weighing the greeting."]
    # Deltas and the finished item share the item id.
    answer = sink.items(c.ItemKind.ASSISTANT)[0]
    assert {e.delta.item_id for e in sink.of(c.DeltaEvent) if e.delta.kind is c.ItemKind.ASSISTANT} == {answer.id}
    tokens = sink.of(c.TokensEvent)
    assert tokens and tokens[-1].tokens.input >= 100 and tokens[-1].tokens.output == 10
    assert tokens[-1].tokens.model == MODEL
    usage = sink.of(c.UsageEvent)
    assert usage and usage[-1].usage.cost_usd is not None and usage[-1].usage.cost_usd > 0
    # The order a client relies on: the user item, working, ..., the one terminal turn last.
    assert isinstance(sink.events[0], c.ItemEvent) and sink.events[0].item.kind is c.ItemKind.USER
    # Claude Code 2.1 reports each prompt's command_lifecycle (queued, started, completed, the last
    # after the result): agentd reads it, so it is no unknown record.
    assert not [e for e in sink.events if isinstance(e, c.UnknownEvent) and e.unknown.type == "command_lifecycle"]
    known = [e for e in sink.events if not isinstance(e, c.UnknownEvent)]
    assert isinstance(known[-1], c.TurnEvent) and known[-1].turn.state is c.TurnState.COMPLETED
    requests = model_server.model_requests
    assert requests and requests[-1]["stream"] is True and "Say hello" in sent_text(requests[-1])


# --------------------------------------------------------------------------- 2. permissions


async def test_allowed_tool_call_runs_the_command(provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path) -> None:
    model_server.call_tool("Bash", command="echo made-by-claude > made.txt")
    conv, sink = await open_conv(provider, workdir)
    await conv.send(c.Prompt(text="Make the file"))

    ask = await sink.wait_interaction(c.InteractionKind.PERMISSION)
    assert [o.id for o in ask.options] == ["allow_once", "allow_always", "reject"]
    assert [o.id for o in ask.options if o.allow_once] == ["allow_once"]
    assert "made.txt" in ask.detail
    assert not (workdir / "made.txt").exists()
    await conv.respond(ask.id, c.Answer(decision="allow_once"))

    turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.COMPLETED, turn
    assert (workdir / "made.txt").read_text().strip() == "made-by-claude"
    [tool] = sink.items(c.ItemKind.TOOL)
    assert tool.id == ask.tool_call_id and tool.tool is not None
    assert tool.tool.name == "Bash" and tool.tool.status is c.ToolStatus.COMPLETED
    assert "made.txt" in tool.tool.input
    answered = [e.interaction for e in sink.of(c.InteractionEvent) if e.interaction.id == ask.id]
    assert answered[-1].state is c.InteractionState.ANSWERED
    assert [i.text for i in sink.items(c.ItemKind.ASSISTANT)] == [DEFAULT_FINAL_TEXT]
    with pytest.raises(c.InteractionGone):
        await conv.respond(ask.id, c.Answer(decision="allow_once"))


async def test_always_allowed_tool_is_not_asked_again(provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path) -> None:
    model_server.call_tool("Bash", command="echo one > one.txt")
    conv, sink = await open_conv(provider, workdir)
    await conv.send(c.Prompt(text="First file"))
    ask = await sink.wait_interaction(c.InteractionKind.PERMISSION)
    await conv.respond(ask.id, c.Answer(decision="allow_always"))
    assert (await sink.wait_turns(1)).state is c.TurnState.COMPLETED

    model_server.call_tool("Bash", command="echo two > two.txt")
    await conv.send(c.Prompt(text="Second file"))
    assert (await sink.wait_turns(2)).state is c.TurnState.COMPLETED
    assert (workdir / "one.txt").exists() and (workdir / "two.txt").exists(), sink.items(c.ItemKind.TOOL)[0].tool.output
    assert len({e.interaction.id for e in sink.of(c.InteractionEvent)}) == 1


async def test_rejected_tool_call_does_not_run(provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path) -> None:
    model_server.call_tool("Bash", command="echo nope > denied.txt")
    conv, sink = await open_conv(provider, workdir)
    await conv.send(c.Prompt(text="Make the file"))

    ask = await sink.wait_interaction(c.InteractionKind.PERMISSION)
    with pytest.raises(c.Invalid):
        await conv.respond(ask.id, c.Answer(decision="maybe"))
    await conv.respond(ask.id, c.Answer(decision="reject"))

    turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.COMPLETED, turn  # the model got the refusal and answered
    assert not (workdir / "denied.txt").exists()
    [tool] = sink.items(c.ItemKind.TOOL)
    assert tool.tool is not None and tool.tool.status is c.ToolStatus.FAILED
    last = [e.interaction for e in sink.of(c.InteractionEvent) if e.interaction.id == ask.id][-1]
    assert last.state is c.InteractionState.REJECTED
    assert "rejected" in sent_text(model_server.model_requests[-1])


async def test_ask_user_question_becomes_a_question_interaction(
    provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path
) -> None:
    model_server.call_tool("AskUserQuestion", arguments={"questions": [{
        "question": "Which colour?", "header": "Colour", "multiSelect": False,
        "options": [{"label": "red", "description": "warm"}, {"label": "blue", "description": "cold"}],
    }]})
    conv, sink = await open_conv(provider, workdir)
    await conv.send(c.Prompt(text="Ask me"))

    ask = await sink.wait_interaction(c.InteractionKind.QUESTION)
    [q] = ask.questions
    assert q.text == "Which colour?" and q.choices == ["red", "blue"] and q.custom
    await conv.respond(ask.id, c.Answer(answers=[["blue"]]))

    turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.COMPLETED, turn
    assert '\\"Which colour?\\"=\\"blue\\"' in sent_text(model_server.model_requests[-1])


# --------------------------------------------------------------------------- 3. cancel


async def test_cancel_during_a_slow_answer_ends_cancelled_within_a_second(
    provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path
) -> None:
    model_server.answer_text_only()
    model_server.stream_slowly(0.25)
    conv, sink = await open_conv(provider, workdir)
    await conv.send(c.Prompt(text="Talk slowly"))
    await sink.wait_for(lambda: sink.of(c.DeltaEvent), what="the first delta")

    started = time.monotonic()
    with trio.fail_after(1.0):
        await conv.cancel()
        turn = await sink.wait_turns(1)
    assert time.monotonic() - started < 1.0
    assert turn.state is c.TurnState.CANCELLED, turn
    assert len(sink.terminal_turns()) == 1
    partial = sink.items(c.ItemKind.ASSISTANT)
    assert partial and DEFAULT_TEXT.startswith(partial[-1].text) and partial[-1].text != DEFAULT_TEXT

    model_server.stream_slowly(0)
    await conv.send(c.Prompt(text="Now quickly"))
    turn = await sink.wait_turns(2)
    assert turn.state is c.TurnState.COMPLETED, turn
    assert sink.items(c.ItemKind.ASSISTANT)[-1].text == DEFAULT_TEXT
    await conv.cancel()  # no turn: a no-op
    assert len(sink.terminal_turns()) == 2


async def test_cancel_withdraws_a_steer_claude_code_holds_and_nothing_runs_it_later(
    provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path
) -> None:
    # Claude Code holds a steer sent during a text answer until that answer ends. A plain
    # interrupt leaves it queued, and the CLI then answers it in a turn of its own that no
    # agentd turn owns: its output came between turns and its result ended the next one.
    late = "STEER-WITHDRAWN-4417"
    model_server.answer_text_only()
    model_server.stream_slowly(0.25)
    conv, sink = await open_conv(provider, workdir)
    await conv.send(c.Prompt(text="Talk slowly"))
    await sink.wait_for(lambda: sink.of(c.DeltaEvent), what="the first delta")
    await conv.steer(c.Prompt(text=late))
    with trio.fail_after(10):
        await conv.cancel()
    assert [t.state for t in sink.terminal_turns()] == [c.TurnState.CANCELLED]
    assert [i.kind for i in sink.items() if late in i.text] == [c.ItemKind.NOTICE]
    ended = len(sink.events)

    model_server.stream_slowly(0)
    await conv.send(c.Prompt(text="Now quickly"))
    turn = await sink.wait_turns(2)
    assert turn.state is c.TurnState.COMPLETED, turn
    later = sink.events[ended:]
    assert isinstance(later[0], c.ItemEvent) and later[0].item.text == "Now quickly", later[:3]
    assert sink.items(c.ItemKind.ASSISTANT)[-1].text == DEFAULT_TEXT
    # The CLI answers what it holds in order: a steer it kept would have reached the model by now.
    assert not [r for r in model_server.requests if late in sent_text(r)]
    assert [i.kind for i in sink.items() if late in i.text] == [c.ItemKind.NOTICE]


async def test_a_steer_queued_when_the_answer_fails_is_answered_in_the_same_turn(
    claude_cli: str, model_server: ModelServer, workdir: pathlib.Path, tmp_path: pathlib.Path, model_key_env: str,
    nursery: trio.Nursery,
) -> None:
    # After a failed answer Claude Code goes on with the steers it holds: that is still this turn.
    config = claude_config_for(claude_cli, model_server, tmp_path, model_key_env,
                               CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK="1")
    provider, _ = await start_provider(nursery, config, tmp_path / "state")
    steer = "STEER-AFTER-FAILURE-2290"
    story = " ".join(f"word{i}" for i in range(60))
    model_server.answer_text_only(story)
    model_server.stream_slowly(0.1)
    model_server.drop_stream(after_chunks=15)  # the answer fails after about 1.5 s
    conv, sink = await open_conv(provider, workdir)
    await conv.send(c.Prompt(text="Hello?"))
    await sink.wait_for(lambda: sink.of(c.DeltaEvent), what="the first delta")
    await conv.steer(c.Prompt(text=steer))
    await sink.wait_for(lambda: [r for r in model_server.requests if steer in sent_text(r)], what="the steer's request")
    model_server.stream_normally()  # the steer's answer streams whole (the story: reset() raced its composing)
    turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.COMPLETED, turn
    assert any("API Error" in i.text for i in sink.items(c.ItemKind.NOTICE)), "the answer did not fail"
    assert [(i.kind, i.delivery) for i in sink.items() if i.text == steer] == [(c.ItemKind.USER, "steer")]
    first, last = [i.text for i in sink.items(c.ItemKind.ASSISTANT)]
    assert story.startswith(first) and first != story and last == story, (first, last)
    assert len(sink.terminal_turns()) == 1


async def test_cancel_while_a_permission_is_pending_expires_it(
    provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path
) -> None:
    model_server.call_tool("Bash", command="echo late > late.txt")
    conv, sink = await open_conv(provider, workdir)
    await conv.send(c.Prompt(text="Make the file"))
    ask = await sink.wait_interaction(c.InteractionKind.PERMISSION)

    with trio.fail_after(2.0):
        await conv.cancel()
        turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.CANCELLED, turn
    last = [e.interaction for e in sink.of(c.InteractionEvent) if e.interaction.id == ask.id][-1]
    assert last.state is c.InteractionState.EXPIRED
    with pytest.raises(c.InteractionGone):
        await conv.respond(ask.id, c.Answer(decision="allow_once"))
    assert not (workdir / "late.txt").exists()


# --------------------------------------------------------------------------- 4. reopen


async def test_new_provider_reopens_the_session_and_the_model_sees_the_earlier_turn(
    claude_config: ClaudeConfig, model_server: ModelServer, workdir: pathlib.Path, tmp_path: pathlib.Path,
    nursery: trio.Nursery,
) -> None:
    model_server.answer_text_only("First answer FOXTROT.")
    state = tmp_path / "state"
    first, stop_first = await start_provider(nursery, claude_config, state)
    conv, sink = await open_conv(first, workdir)
    await conv.send(c.Prompt(text="Remember the word ALPHA"))
    assert (await sink.wait_turns(1)).state is c.TurnState.COMPLETED
    cid, pid = conv.id, conv.runtime_pid
    assert pid is not None
    stop_first.cancel()  # the daemon stops: its CLI processes stop with it
    with trio.fail_after(30):
        while _alive(pid):
            await trio.sleep(0.05)

    second, _ = await start_provider(nursery, claude_config, state)
    model_server.answer_text_only("Second answer.")
    again, sink2 = await open_conv(second, workdir, conversation_id=cid)
    assert again.id == cid
    history = await again.history()
    assert [i.text for i in history.items if i.kind is c.ItemKind.USER] == ["Remember the word ALPHA"]
    assert [i.text for i in history.items if i.kind is c.ItemKind.ASSISTANT] == ["First answer FOXTROT."]
    await again.send(c.Prompt(text="Which word?"))
    assert (await sink2.wait_turns(1)).state is c.TurnState.COMPLETED

    last = sent_text(model_server.model_requests[-1])
    assert "Remember the word ALPHA" in last and "First answer FOXTROT." in last and "Which word?" in last
    usage = sink2.of(c.UsageEvent)[-1].usage
    assert usage.cost_usd is not None and usage.cost_usd > sink.of(c.UsageEvent)[-1].usage.cost_usd  # a running total


async def test_reopening_an_unknown_id_raises_conversation_not_found(provider: ClaudeProvider, workdir: pathlib.Path) -> None:
    for cid in (str(uuid.uuid4()), "not-a-session-id"):
        with pytest.raises(c.ConversationNotFound):
            await open_conv(provider, workdir, conversation_id=cid)


async def test_reopen_needs_the_transcript_once_prompted(
    provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path, claude_config: ClaudeConfig
) -> None:
    model_server.answer_text_only()
    # Never prompted: Claude Code has no transcript yet, agentd's record reopens it.
    quiet, _ = await open_conv(provider, workdir)
    await quiet.close()
    again, sink = await open_conv(provider, workdir, conversation_id=quiet.id)
    await again.send(c.Prompt(text="First words"))
    assert (await sink.wait_turns(1)).state is c.TurnState.COMPLETED
    await again.close()
    # Prompted, then its transcript is gone: never replaced by a fresh session.
    [transcript] = pathlib.Path(claude_config.config_dir).glob(f"projects/*/{quiet.id}.jsonl")
    transcript.unlink()
    with pytest.raises(c.ConversationNotFound):
        await open_conv(provider, workdir, conversation_id=quiet.id)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True


# --------------------------------------------------------------------------- 5. the runtime dies


async def test_killed_cli_fails_the_turn_and_the_next_prompt_works(
    provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path
) -> None:
    model_server.answer_text_only()
    model_server.stream_slowly(0.2)
    conv, sink = await open_conv(provider, workdir)
    await conv.send(c.Prompt(text="Talk slowly"))
    await sink.wait_for(lambda: sink.of(c.DeltaEvent), what="the first delta")
    pid = conv.runtime_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    turn = await sink.wait_turns(1, timeout=10)
    assert turn.state is c.TurnState.FAILED, turn
    assert turn.reason == "runtime_exit"
    assert "SIGKILL" in turn.error, turn.error
    [exit_event] = sink.of(c.ExitEvent)
    assert "SIGKILL" in exit_event.error
    assert sink.events.index(exit_event) > sink.events.index(next(e for e in sink.of(c.TurnEvent) if e.turn.state.terminal))

    model_server.stream_slowly(0)
    await conv.send(c.Prompt(text="Are you back?"))
    turn = await sink.wait_turns(2)
    assert turn.state is c.TurnState.COMPLETED, turn
    assert conv.runtime_pid not in (None, pid)
    assert "Talk slowly" in sent_text(model_server.model_requests[-1])  # the same session, resumed


# --------------------------------------------------------------------------- 6. the model endpoint fails


async def test_http_500_fails_the_turn_with_the_runtimes_error(
    provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path
) -> None:
    model_server.answer_text_only()
    model_server.fail_with(500)
    conv, sink = await open_conv(provider, workdir)
    with trio.fail_after(20):
        await conv.send(c.Prompt(text="Hello?"))
        turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.FAILED, turn
    assert "500" in turn.error and "scripted failure" in turn.error, turn.error
    assert [i.text for i in sink.items(c.ItemKind.NOTICE)] == [turn.error]

    model_server.reset()
    model_server.answer_text_only()
    await conv.send(c.Prompt(text="Hello again"))
    assert (await sink.wait_turns(2)).state is c.TurnState.COMPLETED


async def test_dropped_stream_fails_the_turn_with_the_runtimes_error(
    claude_cli: str, model_server: ModelServer, workdir: pathlib.Path, tmp_path: pathlib.Path, model_key_env: str,
    nursery: trio.Nursery,
) -> None:
    # Without this Claude Code recovers a dropped stream with a non-streaming request.
    config = claude_config_for(claude_cli, model_server, tmp_path, model_key_env,
                               CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK="1")
    provider, _ = await start_provider(nursery, config, tmp_path / "state")
    model_server.answer_text_only()
    model_server.drop_stream(after_chunks=3)
    conv, sink = await open_conv(provider, workdir)
    with trio.fail_after(20):
        await conv.send(c.Prompt(text="Hello?"))
        turn = await sink.wait_turns(1)
    assert turn.state is c.TurnState.FAILED, turn
    assert "API Error" in turn.error and ("ECONNRESET" in turn.error or "lost" in turn.error), turn.error

    model_server.reset()
    model_server.answer_text_only()
    await conv.send(c.Prompt(text="Hello again"))
    assert (await sink.wait_turns(2)).state is c.TurnState.COMPLETED


# --------------------------------------------------------------------------- contract edges


async def test_busy_unsupported_and_close(provider: ClaudeProvider, model_server: ModelServer, workdir: pathlib.Path) -> None:
    model_server.answer_text_only()
    model_server.stream_slowly(0.1)
    conv, sink = await open_conv(provider, workdir)
    await conv.send(c.Prompt(text="one"))
    with pytest.raises(c.Busy):
        await conv.send(c.Prompt(text="two"))
    await conv.steer(c.Prompt(text="three"))  # taken into the running turn
    pid = conv.runtime_pid
    assert pid is not None
    with trio.fail_after(15):
        await conv.close()
    assert sink.terminal_turns()[-1].state is c.TurnState.CANCELLED
    assert len(sink.terminal_turns()) == 1
    # Closed before Claude Code took the steer: a notice says it was not used, nothing runs it later.
    steer = [i for i in sink.items() if "three" in i.text]
    assert [i.kind for i in steer] == [c.ItemKind.NOTICE], steer
    assert not _alive(pid)
    with pytest.raises(c.Closed):
        await conv.send(c.Prompt(text="four"))
    assert provider.capabilities().steer is True and provider.capabilities().reopen is True
