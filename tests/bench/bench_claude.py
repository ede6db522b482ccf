"""A real Claude Code turn through agentd, against the same turn driven directly with claude-agent-sdk.

Both sides run Claude Code, the binary bundled in the claude-agent-sdk wheel
(as the e2e tests do), with an API key, ``ANTHROPIC_BASE_URL`` pointed at the
scripted model server of tests/e2e (its Anthropic Messages flavour, in a
process of its own), a config dir and HOME of their own and retries off. Each
side has its CLI started and a session open before the clock runs (one
warm-up turn each); then their turns alternate.

* through agentd: ``send`` on the socket until the turn's terminal ``turn``
  record arrives (:mod:`._turns`);
* directly: a ``ClaudeSDKClient`` in the bench process (an asyncio loop in a
  thread of its own), connected with the options agentd's claude provider
  gives its (same environment, system prompt, partial messages, permission
  callback, replayed user messages, buffer size), ``query`` with the same user
  message until the SDK yields the turn's ``ResultMessage``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from agentd.config import ClaudeConfig

from ._common import Ctx, Result
from ._turns import KEY_ENV, MODEL, PROMPT, Relay, _Cpu, _LoopThread, _ModelServerProcess, _ThroughAgentd, alternate, tree, \
    turn_count, turn_results


def claude_config(url: str, root: Path) -> ClaudeConfig:
    """``[providers.claude]`` for Claude Code on the scripted server at ``url``, its config dir and HOME under
    ``root`` (made here), retries off. Raises RuntimeError when Claude Code is not installed."""
    from agentd.providers.claude import bundled_cli

    cli = bundled_cli()
    if not cli:
        raise RuntimeError("Claude Code is not installed: `pip install claude-agent-sdk` bundles it")
    for d in ("claude-config", "claude-home"):
        (root / d).mkdir(parents=True, exist_ok=True)
    return ClaudeConfig(cli_path=cli, model=MODEL, api_key_env=KEY_ENV, base_url=url.removesuffix("/v1"),
                        config_dir=str(root / "claude-config"),
                        env={"HOME": str(root / "claude-home"), "CLAUDE_CODE_MAX_RETRIES": "0",
                             "CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK": "1"})


def claude_toml(config: ClaudeConfig) -> str:
    """agentd's config text with ``config`` as its only SDK provider (Copilot and Codex off)."""
    q = json.dumps
    return (
        "[providers.copilot]\nenabled = false\n[providers.codex]\nenabled = false\n"
        f"[providers.claude]\ncli_path = {q(config.cli_path)}\nmodel = {q(config.model)}\n"
        f"api_key_env = {q(config.api_key_env)}\nbase_url = {q(config.base_url)}\nconfig_dir = {q(config.config_dir)}\n"
        "[providers.claude.env]\n" + "".join(f"{k} = {q(v)}\n" for k, v in config.env.items())
    )


class _Direct(_LoopThread):
    """claude-agent-sdk driven directly: one ClaudeSDKClient kept connected between turns."""

    def __init__(self, config: ClaudeConfig, home: Path, work: Path, relay: Relay | None = None) -> None:
        super().__init__("bench-claude-sdk")
        from agentd.providers.claude import ClaudeProvider
        from agentd import runtime_output

        self.session_id = str(uuid.uuid4())
        self.options: dict[str, Any] = dict(
            cwd=str(work),
            cli_path=relay.cli(config.cli_path) if relay else config.cli_path,
            # the environment agentd's provider gives the CLI, on top of its own
            env=ClaudeProvider(config, state_dir=home).cli_env(),
            model=config.model or None,
            system_prompt={"type": "preset", "preset": "claude_code"},
            can_use_tool=self._can_use_tool,
            include_partial_messages=True,
            session_id=self.session_id,
            stderr=lambda line: None,
            max_buffer_size=runtime_output.MAX_MESSAGE_BYTES,
            extra_args={"replay-user-messages": None},
            mcp_servers={},
        )
        self.call(self._start())

    @staticmethod
    async def _can_use_tool(tool_name: str, tool_input: dict[str, Any], context: Any) -> Any:
        raise RuntimeError("the bench turn asks no permission")

    async def _start(self) -> None:
        from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient

        self.client = ClaudeSDKClient(ClaudeAgentOptions(**self.options))
        await self.client.connect()

    async def _turn(self) -> float:
        from claude_agent_sdk import ResultMessage

        async def one(message: dict[str, Any]) -> Any:
            yield message

        message = {"type": "user", "message": {"role": "user", "content": PROMPT}, "parent_tool_use_id": None,
                   "session_id": self.session_id, "uuid": str(uuid.uuid4())}
        t0 = time.perf_counter()
        await self.client.query(one(message))
        async for msg in self.client.receive_response():
            if isinstance(msg, ResultMessage):
                if msg.is_error:
                    raise RuntimeError(f"the direct turn failed: {msg.result or msg.errors}")
                return time.perf_counter() - t0
        raise RuntimeError("no end of turn")

    def turn(self) -> float:
        return self.call(self._turn())

    @property
    def pid(self) -> int:
        proc = getattr(getattr(self.client, "_transport", None), "_process", None)
        return int(getattr(proc, "pid", 0) or 0)

    def close(self) -> None:
        try:
            self.call(self.client.disconnect(), timeout=30)
        except Exception:
            pass
        self.stop_loop()


def bench_claude(ctx: Ctx) -> list[Result]:
    name = "Claude Code turn through agentd (real CLI, scripted model)"
    from agentd.providers.claude import bundled_cli

    if not bundled_cli():
        reason = "Claude Code is not installed: `pip install claude-agent-sdk` bundles it"
        ctx.log(f"  SKIP: {reason}")
        return [Result(name, "s", skipped=reason, target="<= 1.02x baseline")]
    root = ctx.scratch("claude")
    turns = turn_count(ctx)
    server = _ModelServerProcess(root / "model-requests.jsonl")
    os.environ[KEY_ENV] = "sk-agentd-bench-dummy-key"
    cpu = _Cpu()
    ours, base = alternate(
        root, server, cpu, turns,
        lambda home, work, **kw: _ThroughAgentd(ctx, work, provider="claude",
                                          config=claude_toml(claude_config(server.url, home)), **kw),
        lambda home, work, **kw: _Direct(claude_config(server.url, home), home, work, **kw),
        lambda direct, daemon: tree(direct.pid))
    return turn_results(ctx, "Claude Code", name, ours, base, cpu,
                        direct="the same turn with claude-agent-sdk directly", cli="Claude Code")


__all__ = ["bench_claude", "claude_config", "claude_toml"]
