"""agentctl's human output never passes a control sequence from agentd's answers to the terminal.

Provider errors and fixes, account logins, device codes, model names, task errors, subagent
names, session ids, paths: a runtime, an agent, another client or a file on disk chooses them.
Each command here gets answers (wire structs, from a stand-in client) that carry terminal
escapes (retitle the window, clear the screen, set the clipboard, a C1 CSI) and a newline; no
ESC, BEL or C1 byte may reach stdout or stderr, and the text must still be shown, escaped.
agentctl's own colours stay (only its data is made visible).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from click.testing import CliRunner

from agentctl import cli as cli_module
from agentctl import exitcodes
from agentctl.cli import cli
from agentd import contract as c
from agentd import wire

CONV = "c0ffee1234567"
#: OSC 0 (window title), ED (clear screen), OSC 52 (clipboard), a newline, C1 CSI
HOSTILE = "evil\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07\nsecond line\x9b2J"
FORBIDDEN = re.compile("[\x1b\x07\x9b]")
#: agentctl's own styling: SGR sequences only
SGR = re.compile(r"\x1b\[[0-9;]*m")


class FakeClient:
    """Answers each request type from ``replies`` (as tests/unit/test_agentctl_commands.py does)."""

    def __init__(self, replies: dict[type, Any]) -> None:
        self.replies = replies

    def call(self, cls: type, result_type: Any = Any, **fields: Any) -> Any:
        reply = self.replies[cls]
        if isinstance(reply, BaseException):
            raise reply
        return reply


def invoke(monkeypatch: pytest.MonkeyPatch, replies: dict[type, Any], *args: str) -> Any:
    """Run agentctl ARGS as on a terminal: agentctl styles its output, and click strips no ANSI
    sequence from it (off a terminal click.echo drops CSI sequences such as ``\\x1b[2J``, not OSC)."""
    from agentctl import render

    client = FakeClient(replies)
    monkeypatch.setattr(cli_module.Opts, "client", lambda self: client)
    monkeypatch.setattr(render, "use_color", lambda stream: True)
    return CliRunner().invoke(cli, list(args), prog_name="agentctl", color=True)


def assert_safe(res: Any, exit_code: int = 0) -> None:
    out = res.stdout + res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == exit_code, out
    assert FORBIDDEN.search(SGR.sub("", out)) is None, repr(out)  # agentctl's own colours only
    assert "\\x1b]0;pwned\\x07" in out, out  # shown, escaped, not dropped


def record(**kw: Any) -> wire.ConversationRecord:
    return wire.ConversationRecord(**{"id": CONV, "provider": "script", "workdir": "/w", "created_at": "t",
                                      "updated_at": "t", **kw})


def provider(**kw: Any) -> wire.ProviderInfo:
    fields: dict[str, Any] = dict(name="acp:x", display_name=HOSTILE, capabilities=c.Capabilities(), available=False,
                                  error=HOSTILE, state="needs_sign_in", fix="login " + HOSTILE,
                                  account=c.Account(signed_in=True, login=HOSTILE, source="env", env_var="K",
                                                    message=HOSTILE))
    fields.update(kw)
    return wire.ProviderInfo(**fields)


# ---------------------------------------------------------------------- providers, accounts


def test_providers_shows_a_hostile_why_and_fix_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    res = invoke(monkeypatch, {wire.Providers: [provider(fix="f " + HOSTILE[:30])]}, "providers")
    assert_safe(res)
    assert "why: evil\\x1b]0;pwned\\x07" in res.stdout and "fix: f evil\\x1b]0;pwned" in res.stdout


def test_providers_falls_back_to_show_with_an_escaped_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # a fix too long for the line is behind `providers show NAME`: the name is escaped too
    res = invoke(monkeypatch, {wire.Providers: [provider(name="acp:" + HOSTILE, fix=HOSTILE * 3)]}, "providers")
    assert_safe(res)
    assert "fix: agentctl providers show acp:evil\\x1b]0;pwned" in res.stdout


def test_providers_keeps_its_own_colours_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    res = invoke(monkeypatch, {wire.Providers: [provider()]}, "providers")
    assert res.exit_code == 0, res.output
    assert SGR.search(res.stdout) is not None  # the header bold, the why dimmed
    assert FORBIDDEN.search(SGR.sub("", res.stdout + res.stderr)) is None, repr(res.stdout)


def test_providers_show_escapes_every_runtime_value(monkeypatch: pytest.MonkeyPatch) -> None:
    res = invoke(monkeypatch, {wire.Providers: [provider()]}, "providers", "show", "acp:x")
    assert_safe(res)
    out = res.stdout
    assert "runtime:      evil\\x1b]0;pwned" in out
    assert "fix:          login evil\\x1b]0;pwned" in out
    assert "account:      evil\\x1b]0;pwned" in out and "\\nsecond line" in out  # a login stays on its line


def test_account_escapes_the_message_and_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    info = wire.AccountInfo(provider="copilot", account=c.Account(signed_in=False, message=HOSTILE), fix=HOSTILE)
    res = invoke(monkeypatch, {wire.AccountRequest: [info]}, "account")
    assert_safe(res, exitcodes.NEEDS_ACTION)
    assert "copilot: fix: evil\\x1b]0;pwned" in res.stdout


def test_login_device_flow_escapes_the_code_url_and_login(monkeypatch: pytest.MonkeyPatch) -> None:
    started = wire.LoginResult(provider="copilot", device=c.DeviceCode(url="https://x/" + HOSTILE, code=HOSTILE),
                               flow="f1")
    done = wire.LoginResult(provider="copilot", done=True,
                            account=c.Account(signed_in=True, login=HOSTILE, source=HOSTILE))
    res = invoke(monkeypatch, {wire.Login: started, wire.LoginWait: done}, "login", "copilot", "--device")
    assert_safe(res)
    assert "one-time code: evil\\x1b]0;pwned" in res.stdout and "signed in as evil\\x1b" in res.stdout


def test_login_escapes_the_command_a_runtime_names(monkeypatch: pytest.MonkeyPatch) -> None:
    res = invoke(monkeypatch, {wire.Login: wire.LoginResult(provider="claude", command=HOSTILE, message=HOSTILE)},
                 "login", "claude")
    assert_safe(res)


# ---------------------------------------------------------------------- models, tasks, restart, history


def test_set_model_escapes_the_model_and_effort(monkeypatch: pytest.MonkeyPatch) -> None:
    res = invoke(monkeypatch, {wire.SetModel: record(model=HOSTILE, effort=HOSTILE, context_tier=HOSTILE)},
                 "set-model", CONV, "m")
    assert_safe(res)
    res = invoke(monkeypatch, {wire.SetModel: record(next_model=wire.ModelChoice(model=HOSTILE, effort=HOSTILE))},
                 "set-model", CONV, "m", "--after-turn")
    assert_safe(res)


def test_task_wait_escapes_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    task = wire.TaskRecord(id="t1", provider="script", workdir="/w", input="x", created_at="t", updated_at="t",
                           status=wire.TaskStatus.FAILED, error=HOSTILE)
    res = invoke(monkeypatch, {wire.TaskShow: wire.TaskInfo(task=task)}, "task", "wait", "t1")
    assert_safe(res, exitcodes.FAILED)
    assert "task t1: failed: evil\\x1b]0;pwned" in res.stdout


def test_task_comment_escapes_why_it_was_only_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    task = wire.TaskRecord(id="t1", provider="script", workdir="/w", input="x", created_at="t", updated_at="t")
    comment = wire.TaskComment(id="k1", text="hi", created_at="t", note=HOSTILE)
    res = invoke(monkeypatch, {wire.TaskAddComment: wire.TaskCommentResult(task=task, comment=comment)},
                 "task", "comment", "t1", "hi")
    assert_safe(res)


def test_restart_escapes_a_provider_error_and_the_env_file(monkeypatch: pytest.MonkeyPatch) -> None:
    status = wire.StatusResult(version="v", protocol=1, pid=1, uptime_s=1, state_dir="/s", socket="/s/a.sock",
                               conversations=0, running=0, providers=[])
    restarted = wire.RestartResult(pid=2, config="/c/" + HOSTILE, env_file="/e/" + HOSTILE, env_changed=[HOSTILE],
                                   providers=[provider(available=False)])
    res = invoke(monkeypatch, {wire.Status: status, wire.Restart: restarted}, "restart")
    assert_safe(res)
    assert "acp:x: unavailable: evil\\x1b]0;pwned" in res.stdout


def test_history_escapes_a_subagent_name(monkeypatch: pytest.MonkeyPatch) -> None:
    item = c.Item(id="r1.a", kind=c.ItemKind.ASSISTANT, text="hello", agent_id="agent-1")
    page = wire.HistoryPage(conversation=CONV, items=[wire.HistoryEntry(seq=3, run="r1", item=item)])
    subs = wire.SubagentList(conversation=CONV, subagents=[
        c.Subagent(id="agent-1", name=HOSTILE, status=c.SubagentStatus.RUNNING)])
    res = invoke(monkeypatch, {wire.History: page, wire.ListSubagents: subs}, "history", CONV)
    assert_safe(res)
    assert "hello" in res.stdout


# ---------------------------------------------------------------------- import, status, hosts, commands


def test_import_escapes_the_session_and_workdir(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    listed = wire.ImportListResult(provider="claude", workdir="/w/" + HOSTILE)
    res = invoke(monkeypatch, {wire.ImportList: listed}, "import", "-p", "claude", "--cwd", str(tmp_path))
    assert_safe(res)
    adopted = wire.ImportResult(conversation=record(), session=HOSTILE, in_use=False)
    res = invoke(monkeypatch, {wire.ImportSession: adopted}, "import", "-p", "claude", "--cwd", str(tmp_path), "s1")
    assert_safe(res)


def test_status_and_hosts_escape_paths_names_and_providers(monkeypatch: pytest.MonkeyPatch) -> None:
    status = wire.StatusResult(version="v", protocol=1, pid=1, uptime_s=1, state_dir="/s/" + HOSTILE,
                               socket="/s/" + HOSTILE, conversations=0, running=0, providers=["acp:" + HOSTILE])
    assert_safe(invoke(monkeypatch, {wire.Status: status}, "status"))
    host = wire.HostInfo(owner="o", hostname=HOSTILE, pid=1, site=HOSTILE, started_at="t", alive=True,
                         providers=[HOSTILE])
    res = invoke(monkeypatch, {wire.Hosts: wire.HostsResult(hosts=[host])}, "hosts")
    assert_safe(res)
    assert len(res.stdout.splitlines()) == 2  # a newline in a host name forges no row


def test_commands_escapes_the_provider_name(monkeypatch: pytest.MonkeyPatch) -> None:
    res = invoke(monkeypatch, {wire.ListCommands: wire.CommandList(conversation=CONV, provider="acp:" + HOSTILE)},
                 "commands", CONV)
    assert_safe(res)


def test_attach_and_run_escape_the_provider_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from agentctl.commands import conversations

    monkeypatch.setattr(conversations, "_follow", lambda *a, **kw: 0)  # the header line only, no stream
    rec = record(provider="acp:" + HOSTILE)
    assert_safe(invoke(monkeypatch, {wire.Show: wire.ConversationInfo(record=rec)}, "attach", CONV))
    assert_safe(invoke(monkeypatch, {wire.New: rec}, "run", "--cwd", str(tmp_path), "hi"))
