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


def test_agentds_own_variables_reach_no_runtime(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A test suite an agent runs would otherwise start agentd or agentctl on the supervising
    # daemon's socket, state and config; PGPASSWORD opens the database of every host's conversations.
    for name, value in {"AGENTD_SOCKET": "/run/user/1/agentd/agentd.sock", "AGENTD_STATE_DIR": "/state",
                        "AGENTD_CONFIG": "/etc/agentd.toml", "PGPASSWORD": "store-secret", "PGHOST": "db1"}.items():
        monkeypatch.setenv(name, value)
    cfg = parse_config(CONFIG)
    try:
        runtime_env.configure(cfg.providers, "postgres")
        plain = AcpProvider(cfg.providers.acp["plain"], state_dir=tmp_path, name="acp:plain").agent_env()
        assert not runtime_env.AGENTD_VARS & set(plain) and "PGPASSWORD" not in plain
        assert plain["PGHOST"] == "db1" and plain["OWN"] == "yes"
        copilot = CopilotProvider(cfg.providers.copilot, state_dir=tmp_path)._cli_env()
        assert not runtime_env.AGENTD_VARS & set(copilot) and "PGPASSWORD" not in copilot
        claude = ClaudeProvider(cfg.providers.claude, state_dir=tmp_path).cli_env()  # blanked over agentd's own
        assert claude["AGENTD_SOCKET"] == claude["AGENTD_STATE_DIR"] == claude["PGPASSWORD"] == ""
        assert runtime_env.environ("acp:x", pass_env=["PGPASSWORD"])["PGPASSWORD"] == "store-secret"

        runtime_env.configure(cfg.providers, "file")  # then PGPASSWORD is the user's, for their own tools
        assert runtime_env.environ("acp:plain")["PGPASSWORD"] == "store-secret"
        assert "AGENTD_CONFIG" not in runtime_env.environ("acp:plain")
    finally:
        runtime_env.configure(parse_config("").providers)
        runtime_env._claims.clear()


def test_every_agentd_variable_the_code_reads_is_withheld() -> None:
    # A new AGENTD_* variable must join AGENTD_VARS, or runtimes would see it.
    import re

    root = Path(runtime_env.__file__).resolve().parents[1]
    named = {m for pkg in ("agentd", "agentctl") for path in (root / pkg).rglob("*.py")
             for m in re.findall(r'"(AGENTD_[A-Z_]+)"', path.read_text())}
    named.discard("AGENTD_VARS")  # the name of the set itself (runtime_env.__all__)
    assert named and named <= runtime_env.AGENTD_VARS, named - runtime_env.AGENTD_VARS
