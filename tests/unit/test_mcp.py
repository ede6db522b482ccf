"""agentd.mcp's choice of servers and agentd.providers._mcp's server states, without a daemon."""

from __future__ import annotations

import pytest

from agentd import contract as c
from agentd import masking
from agentd.config import ConfigError, parse_config
from agentd.mcp import McpRoom
from agentd.providers._mcp import McpStates
from agentd.wire import ConversationRecord

CONFIG = """
[mcp.servers.all]
command = "a"
[mcp.servers.acp_only]
command = "b"
providers = ["acp:*"]
[mcp.servers.optin]
url = "https://x.example/mcp"
headers = { Authorization = "Bearer header-secret-123456" }
default = false
[mcp.servers.keyed]
command = "c"
env = { SERVICE_API_KEY = "env-secret-abcdef", LEVEL = "verbose-level" }
[mcp.defaults]
codex = ["optin"]
"""

MCP = c.Capabilities(mcp=True)


def room() -> McpRoom:
    return McpRoom(parse_config(CONFIG).mcp)


def test_defaults_follow_providers_globs_default_flags_and_the_per_provider_list() -> None:
    r = room()
    assert r.defaults("claude") == ["all", "keyed"]
    assert r.defaults("acp:gemini") == ["all", "acp_only", "keyed"]
    assert r.defaults("codex") == ["optin"]


def test_choose_validates_names_and_capability() -> None:
    r = room()
    assert r.choose("claude", MCP, None) == ["all", "keyed"]
    assert r.choose("claude", MCP, []) == []
    assert r.choose("claude", MCP, ["optin", "all"]) == ["optin", "all"]
    assert r.choose("script", c.Capabilities(), None) == []
    with pytest.raises(c.Invalid, match="unknown MCP server 'nope'"):
        r.choose("claude", MCP, ["nope"])
    with pytest.raises(c.Invalid, match="twice"):
        r.choose("claude", MCP, ["all", "all"])
    with pytest.raises(c.Unsupported):
        r.choose("script", c.Capabilities(), ["all"])


def test_servers_for_a_record_carry_their_settings_and_skip_removed_ones() -> None:
    r = room()
    rec = ConversationRecord(id="c1", provider="claude", workdir="/", created_at="", updated_at="",
                             mcp=["optin", "gone", "keyed"])
    optin, keyed = r.servers_for(rec)
    assert optin == c.McpServer(name="optin", transport="http", url="https://x.example/mcp",
                                headers={"Authorization": "Bearer header-secret-123456"})
    assert keyed.command == "c" and keyed.env["SERVICE_API_KEY"] == "env-secret-abcdef"
    old = ConversationRecord(id="c2", provider="claude", workdir="/", created_at="", updated_at="")
    assert [s.name for s in r.servers_for(old)] == ["all", "keyed"]  # a record from before: the defaults


def test_secret_env_values_and_every_header_value_are_masked() -> None:
    room()
    text = masking.mask_text("env-secret-abcdef header-secret-123456 verbose-level")
    assert "env-secret" not in text and "header-secret" not in text
    assert "verbose-level" in text  # not under a secret's name


def test_listing_shows_names_never_values() -> None:
    listed = room().listing(["claude", "codex"])
    by_name = {s.name: s for s in listed.servers}
    assert by_name["keyed"].env == ["LEVEL", "SERVICE_API_KEY"]
    assert by_name["optin"].headers == ["Authorization"] and by_name["optin"].default_for == ["codex"]
    assert "secret" not in repr(listed)


@pytest.mark.parametrize("text, error", [
    ('[mcp.servers.x]\nargs = ["a"]', "either command"),
    ('[mcp.servers.x]\ncommand = "a"\nurl = "http://x"', "either command"),
    ('[mcp.servers.x]\nurl = "ftp://x"', "not http"),
    ('[mcp.servers.x]\ncommand = "a"\nheaders = { A = "b" }', "headers are for an HTTP server"),
    ('[mcp.servers.agentd]\ncommand = "a"', "agentd's own"),
    ('[mcp.defaults]\nclaude = ["y"]', r"no MCP server \"y\""),
])
def test_bad_server_config_is_a_clear_error(text: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_config(text)


def test_states_give_one_notice_per_failure() -> None:
    states = McpStates([c.McpServer(name="a", command="x"), c.McpServer(name="b", command="y")])
    assert [s.state for s in states.states()] == ["unknown", "unknown"]
    assert states.update("a", "starting") is None and states.starting()
    notice = states.update("a", "failed", error="spawn ENOENT")
    assert notice is not None and notice.kind is c.ItemKind.NOTICE
    assert notice.text == "MCP server 'a' failed to start: spawn ENOENT"
    assert states.update("a", "failed", error="spawn ENOENT") is None  # told once
    assert states.update("b", "ready", tools=["t1"]) is None
    assert states.update("other", "failed") is None  # the runtime's own server, not agentd's
    a, b = states.states()
    assert (a.state, a.error) == ("failed", "spawn ENOENT") and (b.state, b.tools) == ("connected", ["t1"])
    assert not states.starting()
