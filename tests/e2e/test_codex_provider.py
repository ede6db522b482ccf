"""The codex provider on the real Codex CLI (`codex app-server`), offline against the scripted model server.

Codex is installed from tests/e2e/package-lock.json (npm @openai/codex, its
Linux binary); it calls the Responses API of tests/e2e/modelserver.py on
127.0.0.1 with retries off. Most tests go through the real daemon and
agentctl; history and the thread list (which ``agentctl import`` reads, see
test_conformance_import.py) and attachments are also checked on the provider
itself under trio. Only the model is scripted.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from daemon_harness import Daemon
from modelserver import DEFAULT_FINAL_TEXT
from acp_agents import codex_shell_arguments
from runtimes_e2e import CodexRuntime
from conformance import Follower, _descendants, _json, _pending, _turn_ends

pytestmark = pytest.mark.e2e

FILE = "codex.txt"
COMMAND = f"echo codex-was-here > {FILE}"
#: output, a pause (its first line shows while it runs), more output
OUTPUT_COMMAND = f"echo codex-was-here | tee {FILE}; sleep 1; echo after-the-pause"


@pytest.fixture
def codex(tmp_path: pathlib.Path) -> Iterator[CodexRuntime]:
    rt = CodexRuntime(tmp_path)
    try:
        yield rt
    finally:
        rt.close()


def _daemon(rt: CodexRuntime, root: pathlib.Path) -> Daemon:
    return Daemon(root, rt.config_toml, env=rt.env).start()


@contextlib.contextmanager
def _running(root: pathlib.Path, *overrides: str, extra_toml: str = "") -> Iterator[tuple[CodexRuntime, Daemon]]:
    """Codex with more ``-c`` settings (``overrides``) and its daemon (``extra_toml`` added to its
    config), both stopped afterwards."""
    rt = CodexRuntime(root, overrides=overrides)
    try:
        d = Daemon(root, rt.config_toml + extra_toml, env=rt.env).start()
        try:
            yield rt, d
        finally:
            d.stop()
    finally:
        rt.close()


def _tool_outputs(rt: CodexRuntime) -> list[str]:
    """The tool results Codex sent the model (``function_call_output``), in order."""
    assert rt.server is not None
    return [i["output"] for r in rt.server.requests for i in r.get("input") or []
            if isinstance(i, dict) and i.get("type") == "function_call_output"]


@pytest.fixture
def daemon(codex: CodexRuntime, tmp_path: pathlib.Path) -> Iterator[Daemon]:
    d = _daemon(codex, tmp_path)
    try:
        yield d
    finally:
        d.stop()


def _new(d: Daemon, workdir: pathlib.Path, *extra: str) -> str:
    return _json(d.agentctl("new", "-p", "codex", "--cwd", str(workdir), "--json", *extra))["id"]


def _items(d: Daemon, cid: str, kind: str) -> list[dict[str, Any]]:
    latest: dict[str, dict[str, Any]] = {}
    for r in d.journal(cid):
        if r["type"] == "item" and r["data"]["kind"] == kind:
            latest[r["data"]["id"]] = r["data"]
    return list(latest.values())


def test_a_command_turn_shows_codex_approval_options_the_command_item_and_token_usage(
        codex: CodexRuntime, daemon: Daemon, workdir: pathlib.Path) -> None:
    codex.call_tool(OUTPUT_COMMAND)
    cid = _new(daemon, workdir)
    follower = Follower(daemon, cid, "Write the file")
    inter = _pending(daemon, cid)
    # Codex's own decisions for this command, as the app-server offered them
    options = {o["id"]: o for o in inter["options"]}
    assert set(options) == {"accept", "acceptWithExecpolicyAmendment", "cancel"}, options
    assert options["accept"].get("allow_once") and options["cancel"].get("reject")
    assert "echo codex-was-here" in inter["title"]
    answered = daemon.agentctl("answer", cid, inter["id"], "--allow")
    assert answered.returncode == 0, answered.stderr
    assert follower.finish() == 0, follower.stderr()
    assert (workdir / FILE).read_text().strip() == "codex-was-here"
    tools = _items(daemon, cid, "tool")
    assert len(tools) == 1, tools
    tool = tools[0]["tool"]
    assert tool["name"] == "shell" and "echo codex-was-here" in tool["input"]
    assert tool["status"] == "completed" and tool.get("exit_code", 0) == 0, tool
    # the command's output: its tail while it ran (item/commandExecution/outputDelta; 0.171.0 streams
    # what comes after the first wait, here the line after the pause), then the whole
    running = [r["data"]["tool"] for r in daemon.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "tool"
               and r["data"]["tool"].get("status", "running") == "running"]
    assert any(line["text"] in ("codex-was-here", "after-the-pause") for t in running for line in t.get("tail") or []), running
    assert tool["output"].split() == ["codex-was-here", "after-the-pause"], tool
    assistant = _items(daemon, cid, "assistant")
    assert assistant and assistant[-1]["text"] == DEFAULT_FINAL_TEXT
    tokens = [r["data"] for r in daemon.journal(cid) if r["type"] == "tokens"]
    assert len(tokens) == 2 and all(t["input"] == 100 and t["output"] == 10 for t in tokens), tokens
    usage = _json(daemon.agentctl("show", cid, "--json")).get("usage", {})
    assert usage.get("input_tokens") == 200 and usage.get("output_tokens") == 20, usage


def test_agentctl_run_works_with_the_model_endpoint_configured_as_docs_codex_md_says(
        tmp_path: pathlib.Path, workdir: pathlib.Path) -> None:
    """docs/codex.md's first example as a new user copies it (only base_url pointed at the model server):
    ``codex`` found on the daemon's PATH, Codex's default home, the key in the environment file."""
    from acp_agents import CODEX_OFFLINE
    from installs import install_codex_cli
    from modelserver import ModelServer

    docs = (pathlib.Path(__file__).parents[2] / "docs" / "codex.md").read_text()
    block = docs.split("## Configure a model endpoint", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    assert 'api_key_env = "OPENAI_API_KEY"' in block and "[providers.codex.model_provider]" in block, block
    server = ModelServer(tmp_path / "model-requests.jsonl").start()
    try:
        server.answer_text_only("Codex answers as the docs say.")
        config = block.replace('base_url = "https://api.openai.com/v1"', f"base_url = {json.dumps(server.url)}")
        assert server.url in config, block
        # offline, as the docs' `overrides` note says (no plugin sync, no update check, no analytics)
        config = config.replace("[providers.codex]\n", f"[providers.codex]\noverrides = {json.dumps(CODEX_OFFLINE)}\n", 1)
        key = "sk-docs-env-file-key-5521"
        (tmp_path / "environment").write_text(f"OPENAI_API_KEY={key}\n")
        (tmp_path / "environment").chmod(0o600)
        path = f"{install_codex_cli().parent}{os.pathsep}{os.environ.get('PATH', '')}"
        d = Daemon(tmp_path, config, env={"PATH": path}).start()
        try:
            ran = d.agentctl("run", "-p", "codex", "--cwd", str(workdir), "Explain what main.py does")
            assert ran.returncode == 0, ran.stderr + d.log.read_text()[-3000:]
            assert "Codex answers as the docs say." in ran.stdout
        finally:
            d.stop()
        # CODEX_HOME by default: the daemon's own, under its state dir, where Codex keeps the thread
        home = d.state_dir / "providers" / "codex" / "home"
        assert any(home.rglob("rollout-*.jsonl")), sorted(str(x) for x in home.rglob("*"))[:40]
        calls = [body for method, path, body in server.calls if path.endswith("/responses")]
        assert calls and all(c["model"] == "gpt-5.1-codex" for c in calls), calls
        expected = os.environ.get("OPENAI_API_KEY") or key  # a variable agentd was started with wins
        assert server.authorizations and all(a == f"Bearer {expected}" for a in server.authorizations)
    finally:
        server.stop()


def test_agentctl_run_with_the_codex_provider_prints_the_answer(codex: CodexRuntime, daemon: Daemon, workdir: pathlib.Path) -> None:
    codex.text_only("Codex answers through agentd.")
    ran = daemon.agentctl("run", "-p", "codex", "--cwd", str(workdir), "Say something")
    assert ran.returncode == 0, ran.stderr
    assert "Codex answers through agentd." in ran.stdout


def test_cancel_with_an_approval_pending_expires_it_unanswered_and_runs_nothing(codex: CodexRuntime, daemon: Daemon, workdir: pathlib.Path) -> None:
    codex.call_tool(COMMAND)
    cid = _new(daemon, workdir)
    follower = Follower(daemon, cid, "Write the file")
    inter = _pending(daemon, cid)
    cancelled = daemon.agentctl("cancel", cid)
    assert cancelled.returncode == 0, cancelled.stderr
    assert follower.finish(timeout=30) == 3, follower.stderr()
    states = [r["data"].get("state", "pending") for r in daemon.journal(cid) if r["type"] == "interaction" and r["data"]["id"] == inter["id"]]
    assert states[-1] == "expired", states
    assert not any(r["type"] == "answer" for r in daemon.journal(cid)), "agentd answered for the user"
    time.sleep(0.5)
    assert not (workdir / FILE).exists(), "the command ran although nobody allowed it"
    codex.text_only("Still here.")
    assert Follower(daemon, cid, "Hello again").finish() == 0


def test_accept_for_the_session_is_sent_back_as_codex_defines_it(codex: CodexRuntime, daemon: Daemon, workdir: pathlib.Path) -> None:
    """The amendment decision is an object; agentd returns it as the app-server offered it, and the
    command runs (the app-server would refuse a decision it did not offer)."""
    codex.call_tool(COMMAND)
    cid = _new(daemon, workdir)
    follower = Follower(daemon, cid, "Write the file")
    inter = _pending(daemon, cid)
    answered = daemon.agentctl("answer", cid, inter["id"], "--option", "acceptWithExecpolicyAmendment")
    assert answered.returncode == 0, answered.stderr
    assert follower.finish() == 0, follower.stderr()
    assert (workdir / FILE).exists()
    # Codex now allows the command: the next turn runs it with no question asked
    (workdir / FILE).unlink()
    again = Follower(daemon, cid, "Write it again")
    assert again.finish() == 0, again.stderr()
    assert (workdir / FILE).exists()
    asked = {r["data"]["id"] for r in daemon.journal(cid) if r["type"] == "interaction"}
    assert len(asked) == 1


#: a patch through Codex's shell tool (Codex runs it as its own apply_patch: a fileChange item)
PATCH = "apply_patch <<'EOF'\n*** Begin Patch\n*** Add File: {path}\n+patched by codex\n*** End Patch\nEOF\n"
#: /tmp off Codex's workspace-write roots (it is on them by default), so a patch beside the workdir asks first
OUTSIDE_TMP = ("sandbox_workspace_write.exclude_slash_tmp=true", "sandbox_workspace_write.exclude_tmpdir_env_var=true")


@pytest.fixture
def outside(tmp_path: pathlib.Path) -> Iterator[tuple[CodexRuntime, Daemon, pathlib.Path]]:
    """Codex with /tmp off its writable roots, its daemon, and a file outside the workdir to patch."""
    target = tmp_path / "outside" / "patched.txt"
    target.parent.mkdir()
    with _running(tmp_path, *OUTSIDE_TMP) as (rt, d):
        assert rt.server is not None
        rt.server.call_tool("exec_command", arguments={"cmd": PATCH.format(path=target), "login": False})
        yield rt, d, target


@pytest.mark.parametrize("decision", ["accept", "acceptForSession", "decline", "cancel"])
def test_a_file_change_asks_with_codex_decisions_and_each_does_what_codex_defines(
        outside: tuple[CodexRuntime, Daemon, pathlib.Path], workdir: pathlib.Path, decision: str) -> None:
    """item/fileChange/requestApproval carries no availableDecisions: agentd offers Codex's four, and the
    app-server acts on each (accept once, accept for the session, decline and go on, cancel the turn)."""
    codex, daemon, target = outside
    cid = _new(daemon, workdir)
    follower = Follower(daemon, cid, "Patch the file")
    inter = _pending(daemon, cid)
    assert [o["id"] for o in inter["options"]] == ["accept", "acceptForSession", "decline", "cancel"], inter
    options = {o["id"]: o for o in inter["options"]}
    assert options["accept"].get("allow_once") and options["decline"].get("reject") and options["cancel"].get("reject")
    assert not options["acceptForSession"].get("allow_once") and not options["acceptForSession"].get("reject")
    answered = daemon.agentctl("answer", cid, inter["id"], "--option", decision)
    assert answered.returncode == 0, answered.stderr
    code = follower.finish()
    [patch] = _items(daemon, cid, "tool")
    tool = patch["tool"]
    assert tool["name"] == "apply_patch" and str(target) in tool["title"] and "patched by codex" in tool["input"], tool
    assert patch["id"].endswith(inter["tool_call_id"].split(".", 1)[1]), (patch, inter)
    end = _turn_ends(daemon, cid)[-1]["data"]
    if decision in ("accept", "acceptForSession"):
        assert code == 0 and end["state"] == "completed", (code, end, follower.stderr())
        assert target.read_text() == "patched by codex\n"
        assert tool["status"] == "completed", tool
        assert any(r["type"] == "turn_diff" and "+patched by codex" in r["data"]["diff"] for r in daemon.journal(cid))
    elif decision == "decline":
        # the patch is refused and the agent goes on to its answer
        assert code == 0 and end["state"] == "completed", (code, end, follower.stderr())
        assert not target.exists()
        assert tool["status"] == "failed" and "declined" in tool.get("output", ""), tool
        assert _items(daemon, cid, "assistant")[-1]["text"] == DEFAULT_FINAL_TEXT
    else:
        assert code == 3 and end["state"] == "cancelled", (code, end, follower.stderr())
        assert not target.exists()
    if decision not in ("accept", "acceptForSession"):
        return
    # The next identical patch: asked again after accept, not after accept-for-session.
    target.unlink()
    again = Follower(daemon, cid, "Patch it again")
    if decision == "accept":
        second = _pending(daemon, cid)
        assert second["id"] != inter["id"]
        assert daemon.agentctl("answer", cid, second["id"], "--option", "accept").returncode == 0
    assert again.finish() == 0, again.stderr()
    assert target.exists()
    asked = {r["data"]["id"] for r in daemon.journal(cid) if r["type"] == "interaction"}
    assert len(asked) == (2 if decision == "accept" else 1), asked


@pytest.mark.parametrize("decision", ["accept", "acceptForSession", "decline"])
def test_a_permissions_request_grants_for_the_turn_the_session_or_nothing(
        tmp_path: pathlib.Path, workdir: pathlib.Path, decision: str) -> None:
    """item/permissions/requestApproval (Codex's request_permissions tool): what agentd answers is what
    Codex hands the model as granted."""
    wanted = str(tmp_path / "notes")
    with _running(tmp_path, "features.request_permissions_tool=true") as (codex, d):
        assert codex.server is not None
        codex.server.call_tool("request_permissions", arguments={
            "reason": "write the notes", "permissions": {"file_system": {"write": [wanted]}}})
        cid = _new(d, workdir)
        follower = Follower(d, cid, "Ask for the notes folder")
        inter = _pending(d, cid)
        assert inter["kind"] == "permission" and "write the notes" in inter["detail"] and wanted in inter["detail"]
        assert [o["id"] for o in inter["options"]] == ["accept", "acceptForSession", "decline"], inter
        answered = d.agentctl("answer", cid, inter["id"], "--option", decision)
        assert answered.returncode == 0, answered.stderr
        assert follower.finish() == 0, follower.stderr()
        outputs = _tool_outputs(codex)
        assert outputs, "the tool's result never reached the model"
        granted = json.loads(outputs[-1])
        if decision == "decline":
            assert not any((granted.get("permissions") or {}).values()), granted
        else:
            assert granted["scope"] == ("session" if decision == "acceptForSession" else "turn"), granted
            assert granted["permissions"]["file_system"]["write"] == [wanted], granted


@pytest.mark.parametrize("decision", ["accept", "decline"])
def test_an_mcp_tool_call_is_asked_about_then_kept_as_a_tool_item_with_the_server_s_result(
        tmp_path: pathlib.Path, workdir: pathlib.Path, decision: str) -> None:
    """Codex asks before an MCP tool call (an elicitation marked ``mcp_tool_call``); the call is an
    ``mcpToolCall`` item: tool ``<server>.<tool>``, its arguments, the server's result."""
    from test_conformance_mcp import call_tool_ending_in, mcp_toml

    marker = tmp_path / "marker.txt"
    with _running(tmp_path, extra_toml=mcp_toml(marker)) as (codex, d):
        called = call_tool_ending_in(codex, "write_marker", {"text": "from-the-model"})
        cid = _new(d, workdir)
        follower = Follower(d, cid, "Write the marker")
        inter = _pending(d, cid)
        assert inter["title"] == "Use marker/write_marker?" and "from-the-model" in inter["detail"], inter
        assert [o["id"] for o in inter["options"]] == ["accept", "decline"], inter
        answered = d.agentctl("answer", cid, inter["id"], "--option", decision)
        assert answered.returncode == 0, answered.stderr
        assert follower.finish() == 0, follower.stderr()
        assert called == ["mcp__marker__write_marker"], called
        [call] = _items(d, cid, "tool")
        tool = call["tool"]
        assert tool["name"] == "marker.write_marker" and json.loads(tool["input"]) == {"text": "from-the-model"}, tool
        if decision == "accept":
            assert marker.read_text() == "from-the-model\n"
            assert tool["status"] == "completed" and "marker written: from-the-model" in tool["output"], tool
        else:
            assert not marker.exists()
            assert tool["status"] == "failed", tool


def test_reasoning_streams_as_deltas_and_is_kept_as_a_reasoning_item(
        codex: CodexRuntime, daemon: Daemon, workdir: pathlib.Path) -> None:
    codex.text_only("Reasoned answer.")
    assert codex.server is not None
    codex.server.think("Weighing the question before answering.")
    cid = _new(daemon, workdir)
    follower = Follower(daemon, cid, "Think, then answer")
    assert follower.finish() == 0, follower.stderr()
    reasoning = _items(daemon, cid, "reasoning")
    assert [r["text"] for r in reasoning] == ["Weighing the question before answering."], reasoning
    deltas = "".join(line["data"]["text"] for line in follower.lines
                     if line.get("type") == "delta" and line["data"]["kind"] == "reasoning")
    assert deltas == "Weighing the question before answering.", follower.lines[:20]
    assert _items(daemon, cid, "assistant")[-1]["text"] == "Reasoned answer."


def test_a_question_from_codex_is_answered_with_a_choice(tmp_path: pathlib.Path, workdir: pathlib.Path) -> None:
    """request_user_input (offered outside Plan mode with the feature on) becomes a question."""
    with _running(tmp_path, "features.default_mode_request_user_input=true") as (codex, d):
        assert codex.server is not None
        codex.server.call_tool("request_user_input", arguments={"questions": [{
            "id": "colour", "header": "Colour", "question": "Which colour?",
            "options": [{"label": "Red", "description": "warm"}, {"label": "Blue", "description": "cool"}]}]})
        cid = _new(d, workdir)
        follower = Follower(d, cid, "Ask me")
        inter = _pending(d, cid)
        assert inter["kind"] == "question"
        q = inter["questions"][0]
        assert q["text"] == "Which colour?" and q["choices"] == ["Red", "Blue"] and q.get("custom")
        answered = d.agentctl("answer", cid, inter["id"], "--choice", "Blue")
        assert answered.returncode == 0, answered.stderr
        assert follower.finish() == 0, follower.stderr()
        outputs = _tool_outputs(codex)
        assert outputs and json.loads(outputs[-1]) == {"answers": {"colour": {"answers": ["Blue"]}}}


def test_steer_joins_the_running_turn_and_reaches_the_model(codex: CodexRuntime, daemon: Daemon, workdir: pathlib.Path) -> None:
    assert codex.server is not None
    codex.server.reset()
    codex.server.call_tool("exec_command", arguments=codex_shell_arguments("sleep 2; echo slept"))
    cid = _new(daemon, workdir, "--yolo")
    follower = Follower(daemon, cid, "Take your time")
    follower.wait_for(lambda line: line.get("type") == "item" and (line.get("item") or line.get("data") or {}).get("kind") == "tool"
                      or "tool" in json.dumps(line), timeout=30)
    steered = daemon.agentctl("steer", cid, "Also mention the weather")
    assert steered.returncode == 0, steered.stderr
    assert follower.finish() == 0, follower.stderr()
    users = _items(daemon, cid, "user")
    assert any(u.get("delivery") == "steer" and u["text"] == "Also mention the weather" for u in users), users
    later = [r for r in codex.server.requests if "Also mention the weather" in json.dumps(r.get("input"))]
    assert later, "the steering prompt never reached the model"


def test_the_endpoint_s_rate_limits_become_the_turn_s_quota_and_agentctl_quota(
        codex: CodexRuntime, daemon: Daemon, workdir: pathlib.Path) -> None:
    """Codex reads the endpoint's ``x-codex-*`` rate-limit headers (account/rateLimits/updated): the
    running turn's usage carries them, and ``agentctl quota codex`` shows the windows after it."""
    codex.text_only("Within limits.")
    assert codex.server is not None
    codex.server.stream_headers = {
        "x-codex-primary-used-percent": "42", "x-codex-primary-window-minutes": "300",
        "x-codex-primary-reset-at": "1900000000",
        "x-codex-secondary-used-percent": "7", "x-codex-secondary-window-minutes": "10080"}
    cid = _new(daemon, workdir)
    assert Follower(daemon, cid, "Check the limits").finish() == 0
    carried = [q for r in daemon.journal(cid) if r["type"] == "usage" for q in r["data"].get("quota") or []]
    assert carried, "no usage record carried the rate limits"
    shown = _json(daemon.agentctl("quota", "codex", "--json"))
    [report] = [p for p in shown["quotas"] if p["provider"] == "codex"]
    quotas = {q["type"]: q for q in report["quotas"]}
    primary = quotas["primary (300 min window)"]
    assert primary["used"] == 42 and primary["remaining_percent"] == 58 and primary["unit"] == "percent", primary
    assert primary["reset_at"] == "2030-03-17T17:46:40Z", primary
    assert quotas["secondary (10080 min window)"]["used"] == 7, quotas


def test_title_models_and_the_app_server_process_group(codex: CodexRuntime, daemon: Daemon, workdir: pathlib.Path) -> None:
    codex.text_only("Hi.")
    cid = _new(daemon, workdir)
    titled = daemon.agentctl("title", cid, "Codex thread")
    assert titled.returncode == 0, titled.stderr
    assert "provider_title_failed" not in daemon.log.read_text()
    named = [p for p in (codex.root / "codex-home").rglob("*") if p.is_file() and b"Codex thread" in p.read_bytes()]
    assert named, "Codex did not record the thread's name"
    models = _json(daemon.agentctl("models", "codex", "--json"))
    listed = models.get("models", models)
    assert listed and all(m.get("id") for m in listed), models
    assert daemon.proc is not None
    servers = _app_servers(daemon.proc.pid)
    assert len(servers) == 1, servers
    # its own process group (led by agentd's keeper, agentd.procs): a signal to agentd's group does not
    # reach it, agentd stops it
    assert os.getpgid(servers[0]) != os.getpgid(daemon.proc.pid)
    daemon.stop()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(servers[0]):
        time.sleep(0.05)
    assert not _alive(servers[0]), "the app-server outlived agentd"


def test_a_dead_app_server_is_restarted_after_a_doubling_backoff_and_the_thread_goes_on(
        codex: CodexRuntime, daemon: Daemon, workdir: pathlib.Path) -> None:
    codex.text_only("First answer.")
    cid = _new(daemon, workdir)
    assert Follower(daemon, cid, "My name is Grace Hopper").finish() == 0
    assert daemon.proc is not None
    [server] = _app_servers(daemon.proc.pid)
    os.kill(server, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(r["type"] == "exit" for r in daemon.journal(cid)):
        time.sleep(0.05)
    assert any(r["type"] == "exit" for r in daemon.journal(cid)), "the app-server's death was not reported"
    # The next start waits out the backoff (1 s); that one dying too, before anything worked, doubles it.
    t0 = time.monotonic()
    assert daemon.agentctl("models", "codex", "--json").returncode == 0
    assert time.monotonic() - t0 >= 0.9, "the app-server was started again with no backoff"
    [second] = _app_servers(daemon.proc.pid)
    assert second != server
    os.kill(second, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(_log_events(daemon, "codex.restart_scheduled")) < 2:
        time.sleep(0.05)
    codex.text_only("Second answer.")
    t0 = time.monotonic()
    assert Follower(daemon, cid, "What is my name?").finish() == 0
    assert time.monotonic() - t0 >= 1.9, "the second restart was not held back twice as long"
    [again] = _app_servers(daemon.proc.pid)
    assert again not in (server, second)
    scheduled = [(e["failures"], e["delay_s"]) for e in _log_events(daemon, "codex.restart_scheduled")]
    assert scheduled == [(1, 1.0), (2, 2.0)], scheduled
    # once the thread is back (reopened, its turn completed), the count starts over
    assert [e["failures"] for e in _log_events(daemon, "codex.restart_reset")] == [2]
    bodies = [json.dumps(r) for r in codex.server.requests if "What is my name?" in json.dumps(r)]
    assert bodies and "Grace Hopper" in bodies[-1], "the resumed thread lost its earlier turn"


def _log_events(d: Daemon, event: str) -> list[dict[str, Any]]:
    out = []
    for line in d.log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            out.append(record)
    return out


class _Sink:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, event: Any) -> None:
        self.events.append(event)

    async def turn_end(self, timeout: float = 30.0) -> Any:
        from agentd import contract as c

        with trio.fail_after(timeout):
            while True:
                ends = [e.turn for e in self.events if isinstance(e, c.TurnEvent) and e.turn.state.terminal]
                if ends:
                    return ends[-1]
                await trio.sleep(0.02)


def _on_the_provider(codex: CodexRuntime, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, body: Any) -> None:
    """Run ``body(provider)`` under trio on a CodexProvider configured as the daemon would be."""
    import tomllib

    import msgspec

    from agentd.config import Config
    from agentd.providers.codex import CodexProvider

    config = msgspec.convert(tomllib.loads(codex.config_toml), Config).providers.codex
    for name, value in codex.env.items():
        monkeypatch.setenv(name, value)

    async def main() -> None:
        provider = CodexProvider(config, state_dir=tmp_path / "state")
        async with trio.open_nursery() as nursery:
            await nursery.start(provider.run)
            await body(provider)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_history_the_thread_list_and_an_unknown_thread_on_the_provider(
        codex: CodexRuntime, tmp_path: pathlib.Path, workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """history() and previous() on the provider itself: the items as Codex keeps them, this folder's threads."""
    from agentd import contract as c

    codex.text_only("Remembered answer.")

    async def body(provider: Any) -> None:
        sink = _Sink()
        conv = await provider.open(c.OpenRequest(workdir=str(workdir)), sink)
        await conv.send(c.Prompt(text="Remember the number 42"))
        assert (await sink.turn_end()).state is c.TurnState.COMPLETED
        history = await conv.history()
        kinds = [(i.kind, i.text) for i in history.items]
        assert (c.ItemKind.USER, "Remember the number 42") in kinds, kinds
        assert (c.ItemKind.ASSISTANT, "Remembered answer.") in kinds, kinds
        previous = await provider.previous(str(workdir))
        assert [p.id for p in previous] == [conv.id], previous
        for unknown in ("01a23338-ac07-7e62-8691-f68ed4248d94", "not-a-thread"):
            with pytest.raises(c.ConversationNotFound):
                await provider.open(c.OpenRequest(workdir=str(workdir), conversation_id=unknown), _Sink())

    _on_the_provider(codex, tmp_path, monkeypatch, body)


def test_attachments_reach_the_model_an_image_inline_and_a_file_by_its_path(
        codex: CodexRuntime, tmp_path: pathlib.Path, workdir: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentd import contract as c
    from test_attachments_e2e import stored, tiny_png

    codex.text_only("I looked.")
    image = stored(tmp_path, "dot.png", tiny_png(), "image/png")
    notes = stored(tmp_path, "notes.txt", b"remember the milk\n", "text/plain")

    async def body(provider: Any) -> None:
        assert provider.capabilities().attachments
        sink = _Sink()
        conv = await provider.open(c.OpenRequest(workdir=str(workdir)), sink)
        await conv.send(c.Prompt(text="Look at these.", attachments=[image, notes]))
        assert (await sink.turn_end()).state is c.TurnState.COMPLETED

    _on_the_provider(codex, tmp_path, monkeypatch, body)
    assert codex.server is not None
    sent = codex.server.model_requests[-1]["input"]
    parts = [p for i in sent if isinstance(i, dict) and i.get("role") == "user" for p in i.get("content") or []]
    images = [p for p in parts if p.get("type") == "input_image"]
    assert images and str(images[0].get("image_url", "")).startswith("data:image/png;base64,"), parts
    assert notes.path in json.dumps(sent) and "Look at these." in json.dumps(sent)


def _app_servers(daemon_pid: int) -> list[int]:
    """The `codex app-server` processes under agentd (not the keepers they run under)."""
    out = []
    for pid in _descendants(daemon_pid):
        argv = _cmdline(pid).split(" ")
        if "app-server" in argv and pathlib.Path(argv[0]).name == "codex":
            out.append(pid)
    return out


def _cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
