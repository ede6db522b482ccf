"""The real ACP agents the tests drive: how each is installed and configured offline.

Shared by tests/e2e/test_acp_provider.py (provider level) and the conformance
suite (through the daemon). Claude via @zed-industries/claude-agent-acp and
Gemini CLI and Codex via @zed-industries/codex-acp are installed from
tests/e2e/acp-agents/package-lock.json; Copilot's
CLI from tests/e2e/package-lock.json. Each runs with HOME and its config dirs
in the test's tmp dir and talks only to the scripted model server.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from agentd.config import AcpAgentConfig

HERE = pathlib.Path(__file__).resolve().parent
ACP_DIR = HERE / "acp-agents"


def install_acp_agents(root: pathlib.Path = ACP_DIR) -> pathlib.Path:
    """``node_modules/.bin`` of ``root`` with claude-agent-acp, gemini and codex-acp, after ``npm ci`` when needed.

    One process at a time (installs.py's file lock). Raises RuntimeError (with
    npm's output) when npm is missing or fails.
    """
    from installs import npm_installed

    bins = root / "node_modules" / ".bin"
    wanted = [bins / "claude-agent-acp", bins / "gemini", bins / "codex-acp"]
    return npm_installed(root, lambda: bins if all(p.exists() for p in wanted) else None,
                         "ACP agents (claude-agent-acp, gemini, codex-acp)", timeout=900)


def _isolated_env(tmp: pathlib.Path) -> dict[str, str]:
    """HOME, XDG dirs and TMPDIR inside the test's tmp dir."""
    home = tmp / "home"
    env = {"HOME": str(home), "TMPDIR": str(tmp / "tmp")}
    for var, sub in (("XDG_CONFIG_HOME", ".config"), ("XDG_DATA_HOME", ".local/share"),
                     ("XDG_STATE_HOME", ".local/state"), ("XDG_CACHE_HOME", ".cache")):
        env[var] = str(home / sub)
    for path in env.values():
        pathlib.Path(path).mkdir(parents=True, exist_ok=True)
    return env


def claude_config(bins: pathlib.Path, tmp: pathlib.Path, base_url: str) -> AcpAgentConfig:
    env = _isolated_env(tmp)
    env.update(
        ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="sk-agentd-e2e-dummy", CLAUDE_CONFIG_DIR=str(tmp / "claude-config"),
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1", DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1")
    if os.geteuid() == 0:
        env["IS_SANDBOX"] = "1"  # else Claude Code refuses to run as root and session/new fails
    # 0.23.1 answers the prompt after a cancelled turn with that turn's stale result (upstream issue #551)
    return AcpAgentConfig(command=[str(bins / "claude-agent-acp")], env=env, restart_after_cancel=True)


#: ``model.name``: a fixed model. With the default ("auto") Gemini CLI first asks a classifier
#: model which model to use, and both calls follow retry policies of their own that ignore
#: ``general.maxAttempts``: a failing model endpoint then took 90 s of backoff (5 classifier
#: attempts, 3 chat attempts) before the turn failed. With a fixed model one attempt is made.
GEMINI_SETTINGS = {
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False, "maxAttempts": 1},
    "model": {"name": "gemini-2.5-pro"},
    "privacy": {"usageStatisticsEnabled": False},
    "security": {"folderTrust": {"enabled": False}},
    "telemetry": {"enabled": False},
}


def gemini_config(bins: pathlib.Path, tmp: pathlib.Path, base_url: str) -> AcpAgentConfig:
    env = _isolated_env(tmp)
    settings = pathlib.Path(env["HOME"]) / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps(GEMINI_SETTINGS))
    env.update(GOOGLE_GEMINI_BASE_URL=base_url, GEMINI_API_KEY="agentd-e2e-dummy")
    return AcpAgentConfig(command=[str(bins / "gemini"), "--acp"], env=env, missing_file="empty")


def copilot_config(cli: str, tmp: pathlib.Path, openai_url: str, model: str) -> AcpAgentConfig:
    env = _isolated_env(tmp)
    home = tmp / "copilot-home"
    home.mkdir(exist_ok=True)
    env.update(COPILOT_HOME=str(home), COPILOT_PROVIDER_BASE_URL=openai_url, COPILOT_PROVIDER_API_KEY="sk-agentd-e2e-dummy",
               COPILOT_MODEL=model, COPILOT_OFFLINE="true")
    # 1.0.102 refuses stdio MCP servers from the client (its log: "Rejecting non-http/sse MCP server")
    return AcpAgentConfig(command=[cli, "--acp", "--no-auto-update"], env=env, mcp_stdio=False)


#: Codex settings the tests add: no plugin sync from GitHub, no analytics, no update check (all network)
CODEX_OFFLINE = ["features.plugins=false", "analytics.enabled=false", "check_for_update_on_startup=false"]


def codex_shell_arguments(command: str) -> dict[str, Any]:
    """Arguments of Codex's ``exec_command`` tool that run ``command`` outside the sandbox, which
    Codex (approval_policy on-request) asks the user about first.

    ``login`` false: not a login shell, so the command never runs the machine's profile (pyenv's
    rehash there takes a lock that a tool shell killed mid-test leaves behind, and every later
    login shell waits 60 s for it)."""
    return {"cmd": command, "login": False, "sandbox_permissions": "require_escalated",
            "justification": "Run the scripted command"}


def codex_config(bins: pathlib.Path, tmp: pathlib.Path, openai_url: str, model: str, key_env: str) -> AcpAgentConfig:
    """codex-acp on the Responses API of the model server, its CODEX_HOME in ``tmp``.

    approval_policy and sandbox_mode are set outright: with codex-acp 0.16.0's default preset
    ("read-only") a command that asked to leave the sandbox ran without a permission request.
    """
    env = _isolated_env(tmp)
    home = tmp / "codex-acp-home"
    home.mkdir(exist_ok=True)
    env.update(CODEX_HOME=str(home), **{key_env: "sk-agentd-e2e-dummy"})
    base = "model_providers.agentd"
    settings = [f"model={json.dumps(model)}", 'model_provider="agentd"', f'{base}.name="agentd"',
                f"{base}.base_url={json.dumps(openai_url)}", f"{base}.env_key={json.dumps(key_env)}",
                f'{base}.wire_api="responses"', f"{base}.request_max_retries=0", f"{base}.stream_max_retries=0",
                'approval_policy="on-request"', 'sandbox_mode="workspace-write"', *CODEX_OFFLINE]
    command = [str(bins / "codex-acp")]
    for setting in settings:
        command += ["-c", setting]
    return AcpAgentConfig(command=command, env=env)


#: Gemini CLI 0.61.0 begins every session/load by starting a chat file named after the current UTC
#: minute and the session id. In the minute the session was created that is the session's own file:
#: the load resets it and then finds nothing ("No previous sessions found"), and the transcript is
#: lost. agentd waits for the next minute before such a load (LOAD_IN_A_LATER_MINUTE in
#: agentd/providers/acp/_provider.py); the restart cell creates its session early in a minute, so
#: that its reload comes within it and shows that wait keeps the transcript (runtimes_e2e).
LOAD_NEEDS_A_NEW_MINUTE = {"gemini"}


#: the shell tool each agent offers the model, and how its arguments look
SHELL_TOOL = {"claude": "Bash", "gemini": "run_shell_command", "copilot": "bash", "codex": "exec_command"}


def call_shell(server: Any, agent: str, command: str) -> None:
    """Make the scripted model call ``agent``'s shell tool with ``command``."""
    arguments = codex_shell_arguments(command) if agent == "codex" else {
        "command": command, "description": "Run the scripted command"}
    server.call_tool(SHELL_TOOL[agent], command=command, arguments=arguments)


