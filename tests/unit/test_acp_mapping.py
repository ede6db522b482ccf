"""The acp provider's pure parts: ACP values to contract values (file access: tests/unit/test_agentfs.py)."""

from __future__ import annotations

import pathlib

import msgspec
import pytest

from agentd import contract as c
from agentd.providers.acp import _mapping as m
from agentd.providers.acp import _schema as s


def update(raw: dict) -> s.SessionUpdate:
    return msgspec.convert(raw, s.SessionUpdate)


def test_a_tool_call_update_changes_only_the_fields_it_carries() -> None:
    st = m.ToolState("t1")
    st.merge(update({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "Terminal", "kind": "execute",
                     "status": "pending", "rawInput": {}}))
    st.merge(update({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "title": "echo hi > a.txt",
                     "rawInput": {"command": "echo hi > a.txt", "description": "write"}}))
    st.merge(update({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed",
                     "content": [{"type": "content", "content": {"type": "text", "text": "done"}}]}))
    call = st.to_call()
    assert call == c.ToolCall(name="execute", status=c.ToolStatus.COMPLETED, title="echo hi > a.txt",
                              input="echo hi > a.txt", output="done")


def test_diffs_are_summarized_and_terminals_named() -> None:
    content = msgspec.convert([
        {"type": "diff", "path": "/w/a.py", "oldText": "a\nb\nc\n", "newText": "a\nB\nc\nd\n"},
        {"type": "diff", "path": "/w/new.py", "newText": "x\ny\n"},
        {"type": "terminal", "terminalId": "term-1"},
    ], list[s.ToolCallContent])
    assert m.render_content(content) == "edit /w/a.py: +2 -1 lines\ncreate /w/new.py: +2 lines\n[terminal term-1]"


def test_a_large_diff_is_summarized_in_linear_time_and_counted_right() -> None:
    # difflib's matcher, on the event loop and again per update: 20,000 similar lines took 5 s a render.
    import time

    old = "\n".join(f"line {i} {'a' * (i % 7)}" for i in range(200_000))
    new = "\n".join(f"line {i} {'a' * ((i * 3) % 7)}" for i in range(200_000))
    t0 = time.perf_counter()
    assert m.summarize_diff("x", old, new) == "edit x: +171428 -171428 lines"  # 6 of each 7 lines changed
    assert time.perf_counter() - t0 < 5  # ~0.4 s; quadratic, hours
    # One line changed in a long file: the shared head and tail are not compared.
    lines = [f"row {i}" for i in range(100_000)]
    edited = lines[:50_000] + ["changed", "added"] + lines[50_001:]
    assert m.summarize_diff("f", "\n".join(lines), "\n".join(edited)) == "edit f: +2 -1 lines"
    # A middle within DIFF_LINES is diffed line by line: a moved line is removed and added.
    assert m.summarize_diff("g", "a\nb\nc\nd", "a\nc\nb\nd") == "edit g: +1 -1 lines"


def test_a_tool_shown_again_renders_its_diff_once_until_its_content_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = m.summarize_diff
    monkeypatch.setattr(m, "summarize_diff", lambda path, old, new: calls.append(path) or real(path, old, new))
    st = m.ToolState("t1")
    st.merge(update({"sessionUpdate": "tool_call", "toolCallId": "t1", "kind": "edit", "status": "in_progress",
                     "content": [{"type": "diff", "path": "a.py", "oldText": "a", "newText": "b"}]}))
    for _ in range(3):
        assert st.to_call().output == "edit a.py: +1 -1 lines"
        st.merge(update({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "in_progress"}))
    assert st.whole_output() == "edit a.py: +1 -1 lines"
    assert calls == ["a.py", "a.py"]  # to_call's cut render and the whole one, once each
    st.merge(update({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed",
                     "content": [{"type": "diff", "path": "b.py", "oldText": "a", "newText": "a\nb"}]}))
    assert st.to_call().output == "edit b.py: +1 -0 lines" and calls[-1] == "b.py"


def test_raw_output_is_the_fallback_output() -> None:
    assert m.render_content(None, "(Bash completed with no output)") == "(Bash completed with no output)"
    assert m.render_content([], {"content": "from raw", "other": 1}) == "from raw"


def test_permission_options_pass_through_in_the_agents_order() -> None:
    options = msgspec.convert([
        {"optionId": "proceed_always", "name": "Allow for this session", "kind": "allow_always"},
        {"optionId": "proceed_once", "name": "Allow", "kind": "allow_once"},
        {"optionId": "cancel", "name": "Reject", "kind": "reject_once"},
        {"optionId": "never", "name": "Never", "kind": "reject_always"},
    ], list[s.PermissionOption])
    assert m.permission_options(options) == [
        c.Option(id="proceed_always", label="Allow for this session"),
        c.Option(id="proceed_once", label="Allow", allow_once=True),
        c.Option(id="cancel", label="Reject", reject=True),
        c.Option(id="never", label="Never", reject=True),
    ]


@pytest.mark.parametrize(("reason", "state"), [
    ("end_turn", c.TurnState.COMPLETED), ("cancelled", c.TurnState.CANCELLED), ("max_tokens", c.TurnState.FAILED),
    ("max_turn_requests", c.TurnState.FAILED), ("refusal", c.TurnState.FAILED), ("something_new", c.TurnState.FAILED),
])
def test_stop_reasons(reason: str, state: c.TurnState) -> None:
    got, error = m.stop_reason(reason)
    assert got is state
    assert bool(error) == (state is c.TurnState.FAILED)


def test_a_plan_is_the_whole_todo_list() -> None:
    plan = update({"sessionUpdate": "plan", "entries": [
        {"content": "read", "priority": "high", "status": "completed"},
        {"content": "write", "priority": "medium", "status": "in_progress"},
        {"content": "test", "priority": "low", "status": "pending"}]})
    assert isinstance(plan, s.PlanUpdate)
    assert m.todos(plan) == c.TodoList(todos=[
        c.Todo(id="1", title="read", status="done", note="priority high"),
        c.Todo(id="2", title="write", status="in_progress"),
        c.Todo(id="3", title="test", status="pending", note="priority low"),
    ])


def test_an_odd_entry_of_the_command_list_is_skipped_not_the_whole_list() -> None:
    u = update({"sessionUpdate": "available_commands_update", "availableCommands": [
        {"name": "review", "description": "Review", "input": {"hint": "a path"}}, "odd", 7, None,
        {"name": ""}, {"description": "no name"}, {"name": "/plan"}]})
    assert isinstance(u, s.AvailableCommandsUpdate)
    assert m.commands(u.available_commands) == [
        c.Command(name="review", description="Review", input_hint="a path"), c.Command(name="plan")]


def test_not_found_answers_of_the_agents() -> None:
    assert m.is_not_found(-32002, "Resource not found: abc")
    assert m.is_not_found(-32603, 'Internal error: Invalid session identifier "abc".')
    assert m.is_not_found(-32603, "Internal error: No previous sessions found for this project.")
    assert not m.is_not_found(-32603, "Internal error: API Error: 500")


def test_attachments_become_blocks_the_agent_advertises(tmp_path: pathlib.Path) -> None:
    png = tmp_path / "a.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 8)
    txt = tmp_path / "b.txt"
    txt.write_text("hello")
    pdf = tmp_path / "c.pdf"
    pdf.write_bytes(b"%PDF-1.4")
    prompt = c.Prompt(text="look", attachments=[
        c.Attachment(name="a.png", mime="image/png", size=16, path=str(png)),
        c.Attachment(name="b.txt", mime="text/plain", size=5, path=str(txt)),
        c.Attachment(name="c.pdf", mime="application/pdf", size=8, path=str(pdf)),
    ])
    rich = m.prompt_blocks(prompt, s.PromptCapabilities(image=True, embedded_context=True))
    assert [b["type"] for b in rich] == ["text", "image", "resource", "resource_link"]
    assert rich[2]["resource"] == {"uri": txt.as_uri(), "mimeType": "text/plain", "text": "hello"}
    plain = m.prompt_blocks(prompt, s.PromptCapabilities())
    assert [b["type"] for b in plain] == ["text", "resource_link", "resource_link", "resource_link"]
    assert plain[3] == {"type": "resource_link", "uri": pdf.as_uri(), "name": "c.pdf", "mimeType": "application/pdf", "size": 8}
