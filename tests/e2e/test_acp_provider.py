"""The acp provider against a scripted ACP peer: fs confinement, protocol violations, cwd policy.

The six runtime scenarios on the real agents (acp:claude, acp:gemini,
acp:copilot) run through the daemon in the conformance suite
(test_conformance.py); this module drives :class:`AcpProvider` directly under
trio with a list sink against ``acp_fake_agent.py``, because no real agent
sends fs requests for paths a test chooses or breaks the protocol on demand.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable
from typing import Any

import pytest
import trio

from agentd import contract as c
from agentd.config import AcpAgentConfig
from agentd.providers.acp import AcpConversation, AcpProvider

pytestmark = pytest.mark.e2e

HERE = pathlib.Path(__file__).resolve().parent
FAKE_AGENT = HERE / "acp_fake_agent.py"
TURN_TIMEOUT = 60.0


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
