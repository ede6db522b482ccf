"""A real Gemini CLI turn (ACP over its stdio) through agentd, against the same turn driven directly.

Both sides run Gemini CLI (``gemini --acp``, installed from
tests/e2e/acp-agents' lock file, as the e2e tests do) with the settings and
isolated HOME of tests/e2e/acp_agents.py, ``GOOGLE_GEMINI_BASE_URL`` pointed
at the scripted model server (its Gemini flavour, in a process of its own).
Each side has its agent started and a session open before the clock runs
(one warm-up turn each); then their turns alternate.

* through agentd: ``send`` on the socket until the turn's terminal ``turn``
  record arrives (:mod:`._turns`), agentd's ``acp:gemini`` provider;
* directly: a plain blocking JSON-RPC client in the bench process on the
  agent's stdio: ``initialize`` (the client capabilities agentd offers),
  ``session/new``, then per turn ``session/prompt`` until its result.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ._common import Ctx, Result
from ._turns import PROMPT, Relay, _Cpu, _ModelServerProcess, _StdioRpc, _ThroughAgentd, alternate, e2e_path, tree, \
    turn_count, turn_results


def _gemini(root: Path, url: str) -> Any:
    """The AcpAgentConfig of tests/e2e for Gemini CLI, its HOME under ``root``. Raises what the install raises."""
    e2e_path()
    import acp_agents

    return acp_agents.gemini_config(acp_agents.install_acp_agents(), root, url.removesuffix("/v1"))


def _agentd_config(config: Any) -> str:
    e2e_path()
    from runtimes_e2e import acp_toml

    return ("[providers.copilot]\nenabled = false\n[providers.claude]\nenabled = false\n"
            "[providers.codex]\nenabled = false\n" + acp_toml("gemini", config))


class _Direct(_StdioRpc):
    """The agent spoken to directly: ACP's newline-delimited JSON-RPC 2.0 on its stdio."""

    envelope = {"jsonrpc": "2.0"}

    def __init__(self, config: Any, work: Path, relay: Relay | None = None) -> None:
        argv = list(config.command)
        super().__init__(relay.argv(argv) if relay else argv, {**os.environ, **config.env}, work)
        self.request("initialize", {
            "protocolVersion": 1,
            "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": False},
            "clientInfo": {"name": "agentd-bench", "title": "agentd-bench", "version": "0"},
        })
        self.session = self.request("session/new", {"cwd": str(work), "mcpServers": []})["sessionId"]

    def on_request(self, method: str, params: Any) -> Any:
        if method == "fs/read_text_file":  # what agentd answers Gemini CLI (missing_file = "empty")
            try:
                return {"content": Path(params["path"]).read_text()}
            except FileNotFoundError:
                return {"content": ""}
        return super().on_request(method, params)

    def turn(self) -> float:
        t0 = time.perf_counter()
        result = self.request("session/prompt", {"sessionId": self.session, "prompt": [{"type": "text", "text": PROMPT}]})
        if (result or {}).get("stopReason") != "end_turn":
            raise RuntimeError(f"the direct turn ended {result!r}")
        return time.perf_counter() - t0


def bench_acp(ctx: Ctx) -> list[Result]:
    name = "Gemini CLI turn through agentd (ACP, real agent, scripted model)"
    try:
        e2e_path()
        import acp_agents

        acp_agents.install_acp_agents()
    except Exception as exc:
        reason = f"the ACP agents could not be installed: {exc}"
        ctx.log(f"  SKIP: {reason}")
        return [Result(name, "s", skipped=reason, target="<= 1.02x baseline")]
    turns = turn_count(ctx)
    root = ctx.scratch("acp")
    server = _ModelServerProcess(root / "model-requests.jsonl")
    cpu = _Cpu()
    ours, base = alternate(
        root, server, cpu, turns,
        lambda home, work, **kw: _ThroughAgentd(ctx, work, provider="acp:gemini",
                                          config=_agentd_config(_gemini(home, server.url)), **kw),
        lambda home, work, **kw: _Direct(_gemini(home, server.url), work, **kw),
        lambda direct, daemon: tree(direct.proc.pid))
    return turn_results(ctx, "Gemini CLI (ACP)", name, ours, base, cpu,
                        direct="the same turn on the agent's stdio directly (a blocking JSON-RPC client)",
                        cli="Gemini CLI")


__all__ = ["bench_acp"]
