"""Each runtime's environment: agentd's own, minus the keys other enabled providers claim."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentd import runtime_env
from agentd.config import parse_config
from agentd.providers.acp import AcpProvider
from agentd.providers.claude import ClaudeProvider
from agentd.providers.copilot import CopilotProvider

CONFIG = """
[providers.copilot.byok]
type = "openai"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "MY_BYOK"
model = "m"
[providers.claude]
api_key_env = "MY_ANTHROPIC"
[providers.acp.plain]
command = ["agent"]
env = { OWN = "yes" }
[providers.acp.needs_claude_key]
command = ["agent"]
pass_env = ["MY_ANTHROPIC"]
"""


@pytest.fixture
def providers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("MY_BYOK", "byok-secret-value")
    monkeypatch.setenv("MY_ANTHROPIC", "anthropic-secret-value")
    monkeypatch.setenv("UNCLAIMED_TOKEN", "kept-for-everyone")
    cfg = parse_config(CONFIG).providers
    runtime_env.configure(cfg)
    yield cfg, tmp_path
    runtime_env._claims.clear()


def test_an_acp_agent_gets_no_other_providers_key_unless_it_passes_it_on(providers) -> None:
    cfg, tmp = providers
    plain = AcpProvider(cfg.acp["plain"], state_dir=tmp, name="acp:plain").agent_env()
    assert "MY_BYOK" not in plain and "MY_ANTHROPIC" not in plain
    assert plain["OWN"] == "yes" and plain["UNCLAIMED_TOKEN"] == "kept-for-everyone"
    passing = AcpProvider(cfg.acp["needs_claude_key"], state_dir=tmp, name="acp:needs_claude_key").agent_env()
    assert passing["MY_ANTHROPIC"] == "anthropic-secret-value" and "MY_BYOK" not in passing


def test_claude_code_and_the_copilot_cli_get_only_their_own_key(providers) -> None:
    cfg, tmp = providers
    claude = ClaudeProvider(cfg.claude, state_dir=tmp).cli_env()  # added to agentd's environment by the SDK
    assert claude["MY_BYOK"] == "" and claude["ANTHROPIC_API_KEY"] == "anthropic-secret-value"
    copilot = CopilotProvider(cfg.copilot, state_dir=tmp)._cli_env()  # the whole environment
    assert "MY_ANTHROPIC" not in copilot
    assert "MY_BYOK" not in copilot  # its own key goes over the JSON-RPC pipe, never the environment


def test_a_disabled_provider_claims_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MY_ANTHROPIC", "anthropic-secret-value")
    runtime_env.configure(parse_config(CONFIG.replace("[providers.claude]", "[providers.claude]\nenabled = false")).providers)
    try:
        assert runtime_env.environ("acp:plain")["MY_ANTHROPIC"] == "anthropic-secret-value"
    finally:
        runtime_env._claims.clear()
