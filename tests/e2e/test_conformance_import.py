"""Conformance column ``import``: a session made with the runtime directly is listed, adopted, continued.

The session is made outside agentd, by the runtime's own SDK or CLI, in the same runtime
home agentd is configured with and against the same scripted model server. Then, through
the real daemon and agentctl:

1. ``agentctl import -p P --cwd DIR --json`` lists it (while the outside client still holds
   it, ``in_use`` is true where the runtime can tell, and adopting it is refused ``busy``);
   (``--force`` adopts it all the same; that conversation is removed again);
2. ``agentctl import -p P --cwd DIR SESSION --json`` adopts it once the outside client let go:
   the history shows the earlier prompt and answer, marked imported, journaled once;
3. the next prompt continues the same runtime session: the model request carries the earlier
   prompt's text;
4. the session is no longer offered and adopting it again is refused ``invalid``; adopting an
   id the runtime does not have (first of all, before the runtime ever started) is ``not_found``
   and creates nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conformance import Follower, _json, _supported
from daemon_harness import Daemon
from runtimes_e2e import DUMMY_KEY, MODEL, Runtime

SCENARIOS = {"import": ["import"]}


# --------------------------------------------------------------------------- sessions made outside agentd


class _Loop:
    """An asyncio loop in a thread, for an SDK client that must stay open while the test goes on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Any, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@contextlib.contextmanager
def _copilot(runtime: Runtime, workdir: Path, prompt: str) -> Iterator[str]:
    """A Copilot session made with github-copilot-sdk, held open (the CLI runs) while in the block."""
    from installs import install_copilot_cli

    assert runtime.server is not None
    cli, home, loop = str(install_copilot_cli()), runtime.root / "copilot-home", _Loop()

    async def start() -> tuple[Any, str]:
        from copilot import CopilotClient, RuntimeConnection
        from copilot.generated.session_events import SessionEventType

        client = CopilotClient(connection=RuntimeConnection.for_stdio(path=cli), working_directory=str(workdir),
                               env=dict(os.environ), base_directory=str(home), use_logged_in_user=False)
        await client.start()
        idle = asyncio.Event()

        def on_event(event: Any) -> None:
            if event.type is SessionEventType.SESSION_IDLE:
                idle.set()

        session = await client.create_session(
            on_event=on_event, on_permission_request=lambda *a: {"kind": "denied-interactively-by-user"},
            working_directory=str(workdir), model=MODEL,
            provider={"type": "openai", "base_url": runtime.server.url, "api_key": DUMMY_KEY})
        await session.send(prompt)
        await asyncio.wait_for(idle.wait(), 90)
        return client, session.session_id

    client, sid = loop.call(start())
    try:
        yield sid
    finally:
        try:
            loop.call(client.stop(), timeout=30)
        finally:
            loop.close()


@contextlib.contextmanager
def _claude(runtime: Runtime, workdir: Path, prompt: str) -> Iterator[str]:
    """A Claude Code session made with claude-agent-sdk, its CLI process running while in the block."""
    import anyio

    from agentd.providers.claude import bundled_cli

    assert runtime.server is not None
    env = {"ANTHROPIC_BASE_URL": runtime.server.url.removesuffix("/v1"), "ANTHROPIC_API_KEY": DUMMY_KEY,
           "CLAUDE_CONFIG_DIR": str(runtime.root / "claude-config"), "HOME": str(runtime.root / "claude-home"),
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
           "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_MAX_RETRIES": "0"}
    started, release, done = threading.Event(), threading.Event(), threading.Event()
    out: dict[str, Any] = {}

    async def run() -> None:
        from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, ResultMessage

        options = ClaudeAgentOptions(cwd=str(workdir), cli_path=bundled_cli(), env=env, model=MODEL)
        async with ClaudeSDKClient(options) as client:
            await client.query(prompt)
            async for msg in client.receive_response():
                if isinstance(msg, ResultMessage):
                    out["sid"] = msg.session_id
            started.set()
            await anyio.to_thread.run_sync(release.wait)

    def thread() -> None:
        try:
            anyio.run(run)
        except BaseException as exc:  # reported to the test below
            out["error"] = exc
        finally:
            started.set()
            done.set()

    threading.Thread(target=thread, daemon=True).start()
    started.wait(120)
    try:
        assert "sid" in out, f"the outside Claude Code session failed: {out.get('error')!r}"
        yield out["sid"]
    finally:
        release.set()
        done.wait(60)


@contextlib.contextmanager
def _codex(runtime: Runtime, workdir: Path, prompt: str) -> Iterator[str]:
    """A Codex thread made with ``codex exec`` (same CODEX_HOME and model provider as agentd's); Codex
    tells no one whether a thread is open elsewhere, so nothing is held in the block."""
    from agentd.config import CodexConfig
    from agentd.providers.codex._provider import CodexProvider
    import msgspec

    section = tomllib.loads(runtime.config_toml)["providers"]["codex"]
    config = msgspec.convert(section, CodexConfig)
    argv = CodexProvider(config, state_dir=runtime.root / "outside-state").argv()
    overrides = argv[2:]  # [codex, app-server, -c, ..., -c, ...]
    env = {**os.environ, **runtime.env, "CODEX_HOME": str(runtime.root / "codex-home")}
    proc = subprocess.run([argv[0], "exec", "--skip-git-repo-check", "--json", "-C", str(workdir), "-m", MODEL,
                           *overrides, prompt], env=env, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"codex exec failed: {proc.stderr[-2000:]}"
    sid = next(json.loads(line)["thread_id"] for line in proc.stdout.splitlines()
               if line.startswith("{") and json.loads(line).get("type") == "thread.started")
    yield sid


@contextlib.contextmanager
def _acp(runtime: Runtime, workdir: Path, prompt: str) -> Iterator[str]:
    """A session made by a minimal ACP client of our own, speaking to the agent over its stdio
    (initialize, session/new, session/prompt), ended before the block (ACP does not say who holds one)."""
    agent = runtime.name.split(":", 1)[1]
    section = tomllib.loads(runtime.config_toml)["providers"]["acp"][agent]
    # A group of its own: an npm shim's native child is ended with it
    proc = subprocess.Popen(section["command"], cwd=workdir, env={**os.environ, **section.get("env", {})},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None
    ids = iter(range(1, 1000))

    def call(method: str, params: dict[str, Any]) -> Any:
        rid = next(ids)
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            msg = json.loads(line)
            if "method" in msg and "id" in msg:  # the agent asks: nothing here is granted
                if msg["method"] == "fs/read_text_file":
                    reply: dict[str, Any] = {"result": {"content": ""}}
                elif msg["method"] == "session/request_permission":
                    reply = {"result": {"outcome": {"outcome": "cancelled"}}}
                else:
                    reply = {"error": {"code": -32601, "message": "not offered"}}
                proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], **reply}) + "\n")
                proc.stdin.flush()
            elif msg.get("id") == rid:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return msg.get("result")
        raise AssertionError(f"{runtime.name} exited during {method}")

    try:
        call("initialize", {"protocolVersion": 1, "clientCapabilities": {
            "fs": {"readTextFile": True, "writeTextFile": False}}})
        sid = call("session/new", {"cwd": str(workdir), "mcpServers": []})["sessionId"]
        call("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": prompt}]})
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the whole group is gone
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    yield sid


def _outside(runtime: Runtime, workdir: Path, prompt: str) -> contextlib.AbstractContextManager[str]:
    if runtime.name == "copilot":
        return _copilot(runtime, workdir, prompt)
    if runtime.name == "claude":
        return _claude(runtime, workdir, prompt)
    if runtime.name == "codex":
        return _codex(runtime, workdir, prompt)
    assert runtime.name.startswith("acp:"), f"{runtime.name} reports import but the test makes no session for it"
    return _acp(runtime, workdir, prompt)


#: runtimes whose in_use is a real check (agentd.providers._inuse); the others answer "unknown"
_TELLS_IN_USE = {"copilot", "claude"}


# --------------------------------------------------------------------------- the cell


def _listed(d: Daemon, runtime: Runtime, workdir: Path) -> dict[str, dict[str, Any]]:
    out = _json(d.agentctl("import", "-p", runtime.provider, "--cwd", str(workdir), "--json"))
    assert out["workdir"] == str(workdir) and out["in_use_check"]
    stamps = [s["updated_at"] or s["created_at"] for s in out["sessions"]]
    assert stamps == sorted(stamps, reverse=True), f"not newest first: {stamps}"
    return {s["id"]: s for s in out["sessions"]}


@pytest.mark.parametrize("scenario", ["import"])
@pytest.mark.own_daemon  # it starts on a daemon that never ran the runtime, with no conversation
def test_import(runtime: Runtime, daemon: Daemon, tmp_path: Path, scenario: str, request: pytest.FixtureRequest) -> None:
    d = daemon
    workdir = tmp_path / "imported-work"
    workdir.mkdir()
    # First, before anything started the runtime (an ACP agent's capabilities are known once it
    # ran): a session the runtime does not have is not found, and nothing is created.
    gone = d.agentctl("import", "-p", runtime.provider, "--cwd", str(workdir), str(uuid.uuid4()), "--json")
    if not _supported(d, runtime, scenario, request):
        # ... and the op says so too
        assert gone.returncode == 1 and "cannot list or resume" in gone.stderr, gone.stderr
        return
    assert gone.returncode == 6, f"exit {gone.returncode}: {gone.stderr}"
    assert _json(d.agentctl("ls", "--json"))["conversations"] == []
    word = f"kumquat{uuid.uuid4().hex[:6]}"
    earlier = f"Remember the word {word}."
    runtime.text_only(f"Noted, the word is {word}.")

    with _outside(runtime, workdir, earlier) as sid:
        if runtime.name in _TELLS_IN_USE:
            held = _listed(d, runtime, workdir)
            assert held[sid]["in_use"] is True, held
            refused = d.agentctl("import", "-p", runtime.provider, "--cwd", str(workdir), sid, "--json")
            assert refused.returncode == 7, f"exit {refused.returncode}: {refused.stderr}"
            assert "--force" in refused.stderr
            # --force adopts it all the same (and says so); removing that conversation leaves the session
            forced = _json(d.agentctl("import", "-p", runtime.provider, "--cwd", str(workdir), sid, "--force", "--json"))
            marks = [r["data"] for r in d.journal(forced["conversation"]["id"]) if r["type"] == "import"]
            assert forced["in_use"] is True and marks and marks[0]["forced"] is True, marks
            assert d.agentctl("rm", forced["conversation"]["id"]).returncode == 0
    if runtime.name in _TELLS_IN_USE:
        deadline = time.monotonic() + 30  # the outside process lets go as it exits
        while _listed(d, runtime, workdir)[sid]["in_use"] is not False and time.monotonic() < deadline:
            time.sleep(0.2)
    listed = _listed(d, runtime, workdir)
    assert sid in listed, f"{sid} not listed: {list(listed)}"
    if runtime.name in _TELLS_IN_USE:  # the table a person reads
        table = d.agentctl("import", "-p", runtime.provider, "--cwd", str(workdir))
        row = next(line for line in table.stdout.splitlines() if line.startswith(sid))
        assert " no " in row and word in row, table.stdout
    assert listed[sid]["in_use"] == (False if runtime.name in _TELLS_IN_USE else "unknown"), listed[sid]

    # Two adoptions at once: exactly one binds a conversation, the other is refused (busy or invalid).
    argv = [sys.executable, "-m", "agentctl", "--socket", str(d.socket), "import", "-p", runtime.provider,
            "--cwd", str(workdir), sid, "--json"]
    racing = [subprocess.Popen(argv, env=d.env, cwd=d.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    outcomes = [(p.wait(180), *p.communicate()) for p in racing]
    assert sorted(code for code, _, _ in outcomes)[0] == 0 and sorted(code for code, _, _ in outcomes)[1] in (7, 8), outcomes
    adopted = json.loads(next(out for code, out, _ in outcomes if code == 0))
    cid = adopted["conversation"]["id"]
    assert adopted["session"] == sid and adopted["conversation"]["provider_conversation_id"] == sid
    # Journaled once, after one import record: the earlier prompt, marked imported.
    journal = d.journal(cid)
    assert [r["type"] for r in journal].count("import") == 1
    page = _json(d.agentctl("history", cid, "--json"))
    imported = [e for e in page["items"] if e.get("imported")]
    if adopted["history"]:
        assert adopted["items"] == len(imported) >= 1
        assert any(word in e["item"]["text"] for e in imported if e["item"]["kind"] == "user"), imported
    assert not any(r["type"] == "prompt" for r in journal), "adopting sent a prompt"

    # The next prompt continues the same runtime session: the model sees the earlier turn.
    later = "Which word did I ask you to remember?"
    runtime.text_only("It was the word you gave me.")
    follow = Follower(d, cid, later)
    assert follow.finish(180) == 0, follow.stderr()
    assert runtime.saw_earlier_turn(d, cid, earlier, later), "the continued model request lacks the earlier turn"
    assert _json(d.agentctl("show", cid, "--json"))["record"]["provider_conversation_id"] == sid

    # Adopted once: no longer offered, refused again.
    assert sid not in _listed(d, runtime, workdir)
    again = d.agentctl("import", "-p", runtime.provider, "--cwd", str(workdir), sid, "--json")
    assert again.returncode == 8 and cid in again.stderr, again.stderr
    assert [r["id"] for r in _json(d.agentctl("ls", "--json"))["conversations"]] == [cid]
