"""Codex app-server values to contract values (agentd/providers/codex/_mapping.py), on shapes the 0.171.0 binary sends."""

from __future__ import annotations

from agentd.contract import ItemKind, ToolStatus
from agentd.providers.codex import _mapping as m

AMEND = {"acceptWithExecpolicyAmendment": {"execpolicy_amendment": ["/bin/bash", "-lc", "echo hi"]}}


def test_approval_options_are_the_decisions_codex_listed_and_an_object_goes_back_whole() -> None:
    options, values = m.permission_options(["accept", AMEND, "cancel"])
    assert [o.id for o in options] == ["accept", "acceptWithExecpolicyAmendment", "cancel"]
    assert [o.id for o in options if o.allow_once] == ["accept"]
    assert [o.id for o in options if o.reject] == ["cancel"]
    assert values["acceptWithExecpolicyAmendment"] is AMEND


def test_without_a_list_codex_own_four_decisions_are_offered_decline_before_cancel() -> None:
    options, values = m.permission_options(None)
    assert [o.id for o in options] == ["accept", "acceptForSession", "decline", "cancel"]
    assert next(o for o in options if o.reject).id == "decline"  # what `agentctl answer --deny` picks
    assert values["decline"] == "decline"


def test_a_command_item_becomes_a_shell_tool_with_its_exit_code_and_output() -> None:
    item = m.item({"type": "commandExecution", "id": "call_1", "command": "/bin/bash -lc 'ls'", "status": "completed",
                   "exitCode": 2, "aggregatedOutput": "no such file\n", "startedAtMs": 1796155234456,
                   "completedAtMs": 1796155234621})
    assert item is not None and item.kind is ItemKind.TOOL and item.tool is not None
    assert (item.tool.name, item.tool.status, item.tool.exit_code) == ("shell", ToolStatus.COMPLETED, 2)
    assert item.tool.output == "no such file\n" and item.time is not None and item.ended_at is not None
    declined = m.item({"type": "commandExecution", "id": "call_2", "command": "rm -rf x", "status": "declined"})
    assert declined is not None and declined.tool is not None and declined.tool.status is ToolStatus.FAILED


def test_a_running_command_keeps_only_its_newest_output_lines() -> None:
    tail, partial = m.new_tail(), []
    for n in range(30):
        m.push_output(tail, partial, f"line {n}\n")
    m.push_output(tail, partial, "unfinished")
    call = m.tool_call({"type": "commandExecution", "id": "c", "command": "seq", "status": "inProgress"}, tail)
    assert [line.text for line in call.tail] == [f"line {n}" for n in range(20, 30)]
    assert partial == ["unfinished"]


def test_a_file_change_names_its_paths_and_diffs() -> None:
    item = m.item({"type": "fileChange", "id": "p1", "status": "inProgress", "changes": [
        {"path": "a.py", "kind": {"type": "update"}, "diff": "@@ -1 +1 @@\n-x\n+y\n"},
        {"path": "b.py", "kind": {"type": "add"}, "diff": "+z\n"}]})
    assert item is not None and item.tool is not None
    assert item.tool.name == "apply_patch" and item.tool.title == "Edit a.py, b.py"
    assert "M a.py" in item.tool.input and "A b.py" in item.tool.input


def test_user_input_questions_and_their_answer_by_question_id() -> None:
    questions, ids = m.questions({"questions": [
        {"id": "colour", "header": "Colour", "question": "Which colour?", "isOther": True,
         "options": [{"label": "Red", "description": ""}, {"label": "Blue", "description": ""}]},
        {"id": "name", "header": "Name", "question": "Your name?", "options": None}]})
    assert ids == ["colour", "name"]
    assert questions[0].choices == ["Red", "Blue"] and questions[0].custom
    assert questions[1].choices == [] and questions[1].custom  # free text
    assert m.user_input_answer(ids, [["Blue"], ["Ada"]]) == {
        "answers": {"colour": {"answers": ["Blue"]}, "name": {"answers": ["Ada"]}}}


def test_token_usage_reports_the_last_model_call_and_the_context() -> None:
    tokens, context = m.token_usage({"tokenUsage": {
        "total": {"inputTokens": 200, "outputTokens": 20, "cachedInputTokens": 0, "totalTokens": 220, "reasoningOutputTokens": 0},
        "last": {"inputTokens": 100, "outputTokens": 10, "cachedInputTokens": 40, "totalTokens": 110, "reasoningOutputTokens": 0},
        "modelContextWindow": 258400}}, "m")
    assert tokens is not None and (tokens.input, tokens.output, tokens.cache_read, tokens.model) == (100, 10, 40, "m")
    assert context == (110, 258400)


def test_the_runtimes_own_turn_diff_is_kept_as_a_turn_diff_event() -> None:
    # Codex's aggregated diff of the running turn (turn/diff/updated) is the runtime's own record
    # of what the turn changed: kept beside agentd's checkpoints, never dropped.
    from types import SimpleNamespace

    from agentd.contract import TurnDiffEvent
    from agentd.providers.codex._conversation import CodexConversation, _Turn
    from provider_sinks import ListSink

    sink = ListSink()
    conv = CodexConversation(SimpleNamespace(name="codex"), "thread-1", "/tmp", sink)  # type: ignore[arg-type]
    server = object()
    conv._server = server  # type: ignore[assignment]
    conv._turn = _Turn("m")
    diff = "diff --git a/x.txt b/x.txt\nnew file mode 100644\n--- /dev/null\n+++ b/x.txt\n@@ -0,0 +1 @@\n+hi\n"
    conv._on_notification(server, "turn/diff/updated", {"threadId": "thread-1", "turnId": "t1", "diff": diff})  # type: ignore[arg-type]
    events = [e for e in sink.events if isinstance(e, TurnDiffEvent)]
    assert [e.turn_diff.diff for e in events] == [diff]
