"""A real Codex turn through agentd, against the same turn driven directly on ``codex app-server``.

Both sides run the real Codex CLI (installed from tests/e2e's lock file, as
the e2e tests do) with the same model endpoint: the scripted model server of
tests/e2e on 127.0.0.1, in a process of its own, answering with plain streamed
text (``_ModelServerProcess`` of tests/bench/_turns.py). Each side has its
app-server started and a thread open before the clock runs (one warm-up turn
each); then their turns alternate.

* through agentd: ``send`` on the socket until the turn's terminal ``turn``
  record arrives on a subscription (what ``agentctl run`` waits for);
* directly: ``turn/start`` written to the app-server's stdin until its
  ``turn/completed`` notification is read from its stdout, by a plain blocking
  client in the bench process (the least a client can do).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ._common import Ctx, Result
from ._turns import E2E, KEY_ENV, MODEL, PROMPT, Relay, _Cpu, _ModelServerProcess, _StdioRpc, _ThroughAgentd, alternate, \
    e2e_path, tree, turn_count, turn_results

#: Codex settings both sides get: its network extras off, no retries
OVERRIDES = ["features.plugins=false", "analytics.enabled=false"]


def _cli() -> str:
    e2e_path()
    from installs import install_codex_cli  # tests/e2e/installs.py

    return str(install_codex_cli(E2E))


def _provider_overrides(url: str) -> list[str]:
    """The same ``-c`` options agentd's codex provider passes for a [providers.codex.model_provider]."""
    base = "model_providers.agentd"
    return ['model_provider="agentd"', f'{base}.name="agentd"', f"{base}.base_url={json.dumps(url)}",
            f'{base}.wire_api="responses"', f"{base}.env_key={json.dumps(KEY_ENV)}",
            f"{base}.request_max_retries=0", f"{base}.stream_max_retries=0", *OVERRIDES]


class _Direct(_StdioRpc):
    """``codex app-server`` spoken to directly: newline-delimited JSON-RPC on its stdio."""

    def __init__(self, cli: str, url: str, home: Path, work: Path, relay: Relay | None = None) -> None:
        argv = [cli, "app-server"]
        for o in _provider_overrides(url):
            argv += ["-c", o]
        super().__init__(relay.argv(argv) if relay else argv, {**os.environ, "CODEX_HOME": str(home)}, work)
        self.request("initialize", {"clientInfo": {"name": "agentd-bench", "version": "0"}})
        self.write({"method": "initialized"})
        started = self.request("thread/start", {"cwd": str(work), "model": MODEL, "approvalPolicy": "on-request",
                                                "sandbox": "workspace-write"})
        self.thread = started["thread"]["id"]

    def turn(self) -> float:
        t0 = time.perf_counter()
        self.start("turn/start", {"threadId": self.thread,
                                  "input": [{"type": "text", "text": PROMPT, "text_elements": []}]})
        for msg in self.lines:
            if msg.get("method") == "turn/completed":
                status = msg["params"]["turn"]["status"]
                if status != "completed":
                    raise RuntimeError(f"the direct turn ended {status}: {msg['params']['turn'].get('error')}")
                return time.perf_counter() - t0
        raise RuntimeError("no end of turn")


def _agentd_config(cli: str, url: str, home: Path) -> str:
    q = json.dumps
    return ("[providers.copilot]\nenabled = false\n[providers.claude]\nenabled = false\n"
            f"[providers.codex]\ncli_path = {q(cli)}\ncodex_home = {q(str(home))}\nmodel = {q(MODEL)}\n"
            f"overrides = {q(OVERRIDES)}\n"
            f"[providers.codex.model_provider]\nbase_url = {q(url)}\napi_key_env = {q(KEY_ENV)}\n"
            "request_max_retries = 0\nstream_max_retries = 0\n")


def bench_codex(ctx: Ctx) -> list[Result]:
    name = "Codex turn through agentd (real app-server, scripted model)"
    try:
        cli = _cli()
    except Exception as exc:
        reason = f"the Codex CLI could not be installed: {exc}"
        ctx.log(f"  SKIP: {reason}")
        return [Result(name, "s", skipped=reason, target="<= 1.02x baseline")]
    turns = turn_count(ctx)
    root = ctx.scratch("codex")
    server = _ModelServerProcess(root / "model-requests.jsonl")
    os.environ[KEY_ENV] = "sk-agentd-bench-dummy-key"
    cpu = _Cpu()
    ours, base = alternate(
        root, server, cpu, turns,
        lambda home, work, **kw: _ThroughAgentd(ctx, work, provider="codex", config=_agentd_config(cli, server.url, home), **kw),
        lambda home, work, **kw: _Direct(cli, server.url, home, work, **kw),
        lambda direct, daemon: tree(direct.proc.pid))
    return turn_results(ctx, "Codex", name, ours, base, cpu, direct="the same turn on codex app-server directly",
                        cli="the app-server")


__all__ = ["bench_codex"]
