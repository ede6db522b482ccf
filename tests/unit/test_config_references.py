"""Config values that must name something that exists: a typo is an error with the key path and the
closest name, never a setting silently not applied (a budget on no provider removes a spending limit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentd.config import EXIT_CONFIG, ConfigError, parse_config


@pytest.mark.parametrize(("text", "key", "hint"), [
    ("[budgets.cluade]\nmax_cost_usd = 5\n", "budgets.cluade", 'did you mean "claude"?'),
    ("[tasks]\nprovider_concurrency = { copliot = 1 }\n", "tasks.provider_concurrency.copliot", 'did you mean "copilot"?'),
    ('[providers]\ndefault = "scrip"\n', "providers.default", 'did you mean "script"?'),
    ('[attachments]\nallowed_types = ["text/*", "image/pgn"]\n', "attachments.allowed_types[1]", 'did you mean "image/png"?'),
    ('[attachments]\nallowed_types = ["imgae/*"]\n', "attachments.allowed_types[0]", 'did you mean "image/*"?'),
    ('[providers.acp.gemini]\ncommand = ["gemini", "--acp"]\n[budgets.gemini]\nmax_cost_usd = 1\n',
     "budgets.gemini", 'did you mean "acp:gemini"?'),
    ('[mcp.servers.gh]\ncommand = "gh-mcp"\n[mcp.defaults]\ncluade = ["gh"]\n', "mcp.defaults.cluade",
     'did you mean "claude"?'),
    ('[mcp.servers.gh]\ncommand = "gh-mcp"\nproviders = ["codex", "cluade"]\n', "mcp.servers.gh.providers[1]",
     'did you mean "claude"?'),
])
def test_a_name_that_names_nothing_is_an_error_with_its_key_and_the_closest_name(text: str, key: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, path=Path("agentd.toml"))
    err = info.value
    assert err.key == key, str(err)
    assert hint in str(err) and str(err).startswith(f"agentd.toml: {key}: ")


def test_names_that_exist_are_accepted() -> None:
    config = parse_config(
        '[providers]\ndefault = "acp:gemini"\n[providers.acp.gemini]\ncommand = ["gemini"]\n'
        '[budgets."acp:gemini"]\nmax_cost_usd = 1\n[budgets.copilot]\nmax_cost_usd = 2\n'
        '[tasks]\nprovider_concurrency = { claude = 1 }\n'
        '[attachments]\nallowed_types = ["text/markdown", "application/toml", "image/*", "*/*"]\n'
    )
    assert set(config.budgets) == {"acp:gemini", "copilot"} and config.providers.default == "acp:gemini"


def test_the_daemon_exits_78_on_such_a_config(tmp_path: Path) -> None:
    (tmp_path / "agentd.toml").write_text("[budgets.cluade]\nmax_cost_usd = 5\n")
    cp = subprocess.run([sys.executable, "-m", "agentd", "check-config", "--config", str(tmp_path / "agentd.toml")],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == EXIT_CONFIG == 78
    assert 'budgets.cluade: no provider "cluade": did you mean "claude"?' in cp.stderr


@pytest.mark.parametrize("text", ['[providers.copilot]\ncopilot_home = "relative/home"\n',
                                  '[providers.script]\nscripts_dir = "relative"\n'])
def test_a_relative_runtime_path_is_an_error_as_for_every_path_key(text: str) -> None:
    with pytest.raises(ConfigError, match="must be an absolute path"):
        parse_config(text, path=Path("agentd.toml"))


@pytest.mark.parametrize(("text", "says"), [
    ("[journal]\nbatch_ms = inf\n", "journal.batch_ms"), ("[leases]\nttl_s = 1e308\n", "leases.ttl_s"),
    ("a = " + "[" * 2000 + "]" * 2000 + "\n", "nested too deeply"), ("\ufeff[journal]\n", "byte order mark"),
])
def test_numbers_past_any_sane_bound_and_unreadable_toml_are_config_errors(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, path=Path("agentd.toml"))
    assert says in str(info.value)


def test_a_config_path_that_is_a_directory_exits_78_so_systemd_does_not_restart_it_in_a_loop(tmp_path: Path) -> None:
    (tmp_path / "agentd.toml").mkdir()
    cp = subprocess.run([sys.executable, "-m", "agentd", "check-config", "--config", str(tmp_path / "agentd.toml")],
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == EXIT_CONFIG and "not a regular file" in cp.stderr, cp.stderr
