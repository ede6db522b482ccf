"""agentctl's commands against a stand-in client: what they print, and their exit codes.

The real daemon is in tests/integration/test_agentctl.py; here each command
gets the answers it asks for from :class:`FakeClient`, so the wording of
its output and errors can be checked exactly.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from agentctl import cli as cli_module
from agentctl import exitcodes
from agentctl.cli import _describe, cli
from agentd import contract as c
from agentd import wire

CONV = "c0ffee1234567"


def record(**kw: Any) -> wire.ConversationRecord:
    return wire.ConversationRecord(id=CONV, provider="script", workdir="/w", created_at="t", updated_at="t", **kw)


class FakeClient:
    """Answers each request type from ``replies`` (a value, or an exception to raise); records the calls."""

    def __init__(self, replies: dict[type, Any]) -> None:
        self.replies = replies
        self.calls: list[tuple[type, dict[str, Any]]] = []

    def call(self, cls: type, result_type: Any = Any, **fields: Any) -> Any:
        self.calls.append((cls, fields))
        reply = self.replies[cls]
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def sent(self, cls: type) -> list[dict[str, Any]]:
        return [f for k, f in self.calls if k is cls]


def invoke(monkeypatch: pytest.MonkeyPatch, client: FakeClient, *args: str) -> Any:
    monkeypatch.setattr(cli_module.Opts, "client", lambda self: client)
    return CliRunner().invoke(cli, list(args), prog_name="agentctl")


# ---------------------------------------------------------------------- error hints


def test_a_missing_provider_points_at_providers_not_at_conversations() -> None:
    provider = c.NotFound("no provider 'foo'; configured: script, claude")
    assert _describe(provider) == ("not_found: no provider 'foo'; configured: script, claude "
                                   "(agentctl providers lists them)")
    assert _describe(c.NotFound("no conversation 'zz'")) == (
        "not_found: no conversation 'zz' (agentctl ls --all lists conversations)")
    assert _describe(c.NotFound("no task 'tt'")) == "not_found: no task 'tt' (agentctl task ls lists tasks)"
    # a not_found with no obvious next step gets none rather than a wrong one
    assert _describe(c.NotFound("no lease on x")) == "not_found: no lease on x"
    assert _describe(c.Invalid("bad")) == "invalid: bad"


def test_a_busy_error_suggests_if_busy_only_to_the_commands_that_take_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # revert, rm and budget were told to use an --if-busy they do not have.
    from agentctl import cli as cli_mod

    for command, hint in (("send", "(use --if-busy queue|steer|interrupt, or agentctl cancel)"),
                          ("command", "(use --if-busy queue|interrupt, or agentctl cancel)"), ("revert", None)):
        monkeypatch.setattr(cli_mod, "_invoked", [command])
        said = _describe(c.Busy("a turn is running"))
        assert said.endswith(hint) if hint else said == "busy: a turn is running", (command, said)


def test_new_with_an_unknown_provider_exits_6_suggesting_agentctl_providers(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Any) -> None:
    client = FakeClient({wire.New: c.NotFound("no provider 'foo'; configured: script")})
    res = invoke(monkeypatch, client, "new", "-p", "foo", "--cwd", str(tmp_path))
    assert res.exit_code == exitcodes.NOT_FOUND
    assert "agentctl providers" in res.stderr and "ls --all" not in res.stderr


# ---------------------------------------------------------------------- cancel


def test_cancel_with_no_turn_running_says_so_and_sends_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient({wire.Show: wire.ConversationInfo(record=record()), wire.Cancel: None})
    res = invoke(monkeypatch, client, "cancel", "c0f")
    assert res.exit_code == 0
    assert res.stdout == f"nothing to cancel: no turn is running in {CONV}\n"
    assert client.sent(wire.Cancel) == []
    res = invoke(monkeypatch, client, "cancel", "c0f", "--json")
    assert res.exit_code == 0
    assert json.loads(res.stdout) == {"ok": True, "conversation": CONV, "cancelled": False, "run": "",
                                      "state": "", "reason": "", "inferred": False}


def test_cancel_of_a_running_turn_cancels_it(monkeypatch: pytest.MonkeyPatch) -> None:
    running = wire.ConversationInfo(record=record(state=wire.ConversationState.RUNNING, active_run="r9"))
    client = FakeClient({wire.Show: running, wire.Cancel: None})
    res = invoke(monkeypatch, client, "cancel", "c0f")
    assert res.exit_code == 0
    assert res.stdout == f"cancelled run r9 in {CONV}\n"
    assert client.sent(wire.Cancel) == [{"conversation": CONV}]
    res = invoke(monkeypatch, client, "cancel", "c0f", "--json")
    assert json.loads(res.stdout) == {"ok": True, "conversation": CONV, "cancelled": True, "run": "r9",
                                      "state": "", "reason": "", "inferred": False}


# ---------------------------------------------------------------------- answer


COLOUR = c.Interaction(
    id="1-5-question", kind=c.InteractionKind.QUESTION, title="Pick a colour",
    questions=[c.Question(text="Which colour?", choices=["red", "green", "blue"], custom=True)],
)
FORM = c.Interaction(
    id="1-6-form", kind=c.InteractionKind.QUESTION, title="Details", elicitation=c.Elicitation(),
    questions=[c.Question(text="Name", field=c.Field(name="name", type="string")),
               c.Question(text="Lines", field=c.Field(name="lines", type="integer", required=True))],
)


def test_answer_choice_by_number_sends_that_choice_and_echoes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient({wire.Show: wire.ConversationInfo(record=record(), pending=[COLOUR]),
                         wire.AnswerInteraction: None})
    res = invoke(monkeypatch, client, "answer", CONV, "--choice", "2")
    assert res.exit_code == 0, res.output
    assert client.sent(wire.AnswerInteraction)[0]["answer"] == c.Answer(answers=[["green"]])
    assert res.stdout == "answered 1-5-question: green\n"


def test_answer_choice_out_of_range_exits_8_listing_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient({wire.Show: wire.ConversationInfo(record=record(), pending=[COLOUR]),
                         wire.AnswerInteraction: None})
    res = invoke(monkeypatch, client, "answer", CONV, "--choice", "7")
    assert res.exit_code == exitcodes.INVALID
    assert "1) red, 2) green, 3) blue" in res.stderr
    assert client.sent(wire.AnswerInteraction) == []


def test_answer_a_form_with_choice_names_its_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    client = FakeClient({wire.Show: wire.ConversationInfo(record=record(), pending=[FORM]),
                         wire.AnswerInteraction: None})
    res = invoke(monkeypatch, client, "answer", CONV, "--choice", "blue")
    assert res.exit_code == exitcodes.INVALID
    assert "1-6-form is a form: use --field NAME=VALUE (fields: name, lines)" in res.stderr
    assert client.sent(wire.AnswerInteraction) == []
    res = invoke(monkeypatch, client, "answer", CONV, "--field", "lines=3", "--dismiss")
    assert res.exit_code == exitcodes.USAGE
    res = invoke(monkeypatch, client, "answer", CONV, "--dismiss")
    assert res.stdout == "answered 1-6-form: dismissed\n"


# ---------------------------------------------------------------------- task show


def test_task_show_counts_callback_attempts_in_words(monkeypatch: pytest.MonkeyPatch) -> None:
    def task(n: int) -> wire.TaskInfo:
        attempts = [wire.CallbackAttempt(attempt=i + 1, at="t", status=wire.TaskStatus.COMPLETED, status_code=200,
                                         ok=True) for i in range(n)]
        return wire.TaskInfo(task=wire.TaskRecord(
            id="t1", provider="script", workdir="/w", input="x", created_at="t", updated_at="t",
            status=wire.TaskStatus.COMPLETED, callback="http://h/cb", callback_state="delivered",
            callback_attempts=attempts))

    for n, words in ((1, "1 attempt)"), (2, "2 attempts)"), (0, "0 attempts)")):
        res = invoke(monkeypatch, FakeClient({wire.TaskShow: task(n)}), "task", "show", "t1")
        assert res.exit_code == 0, res.output
        assert f"http://h/cb (delivered, {words}" in res.stdout
