"""agentd.toml: defaults, the shipped example file, readable errors, resolved paths."""

from __future__ import annotations

import enum
import json
import pathlib
import tomllib
import types
import typing
from typing import Annotated, Any, Literal

import msgspec
import pytest

import agentd.config as config_module
from agentd.config import (
    EXIT_CONFIG,
    AcpAgentConfig,
    BudgetConfig,
    ByokConfig,
    Config,
    ConfigError,
    PricingConfig,
    default_config_path,
    load_config,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = REPO / "conf" / "agentd.toml"

PATH_VARS = ("AGENTD_STATE_DIR", "AGENTD_RUNTIME_DIR", "AGENTD_SOCKET")


@pytest.fixture(autouse=True)
def _no_path_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in PATH_VARS:
        monkeypatch.delenv(var, raising=False)


def write(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    path = tmp_path / "agentd.toml"
    path.write_text(text, encoding="utf-8")
    return path


def error_of(tmp_path: pathlib.Path, text: str) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value


def leaves(value: Any, prefix: str = "") -> set[str]:
    """Dotted paths of every scalar (and empty inline table) in a nested dict."""
    if isinstance(value, dict) and value:
        out: set[str] = set()
        for k, v in value.items():
            out |= leaves(v, f"{prefix}.{k}" if prefix else k)
        return out
    return set() if value is None else {prefix}


def commented_block(header: str) -> str:
    """The commented-out example table starting at ``# <header>`` in the shipped file."""
    lines = SHIPPED.read_text().splitlines()
    start = lines.index(f"# {header}")
    block = []
    for line in lines[start:]:
        if not line.startswith("# "):
            break
        block.append(line[2:])
    return "\n".join(block) + "\n"


# --------------------------------------------------------------------------- defaults


def test_shipped_file_loads_to_exactly_the_defaults() -> None:
    assert load_config(SHIPPED) == Config()


def test_shipped_file_lists_every_key() -> None:
    shipped = leaves(tomllib.loads(SHIPPED.read_text()))
    defaults = leaves(msgspec.to_builtins(Config()))
    # [providers.acp.<name>] tables and [providers.copilot.byok] are absent by default;
    # the file shows them as commented examples (checked below).
    assert shipped == defaults - {"providers.acp"}


def test_shipped_examples_of_optional_tables_are_valid() -> None:
    byok = msgspec.toml.decode(commented_block("[providers.copilot.byok]"), type=dict)
    acp = msgspec.toml.decode(commented_block("[providers.acp.gemini]"), type=dict)
    cfg = msgspec.convert({"providers": {"copilot": byok["providers"]["copilot"], "acp": acp["providers"]["acp"]}}, Config)
    assert cfg.providers.copilot.byok == ByokConfig(
        type="openai", base_url="https://api.openai.com/v1", api_key_env="OPENAI_API_KEY", model="gpt-4.1"
    )
    assert cfg.providers.acp["gemini"].command == ["gemini", "--acp"]
    assert cfg.providers.acp["gemini"].missing_file == "empty"


def test_defaults_have_the_documented_values() -> None:
    c = Config()
    assert (c.daemon.state_dir, c.daemon.runtime_dir, c.daemon.socket, c.daemon.shutdown_grace_s) == ("", "", "", 5.0)
    assert (c.journal.fsync, c.journal.batch_ms) == ("batch", 5.0)
    assert c.leases.ttl_s == 30.0
    assert (c.server.max_frame_bytes, c.server.subscriber_buffer, c.server.max_connections) == (16 << 20, 4096, 1024)
    assert (c.websocket.enabled, c.websocket.host, c.websocket.port, c.websocket.token_file) == (False, "127.0.0.1", 8765, "")
    assert (c.log.level, c.log.format) == ("info", "auto")
    assert (c.interactions.timeout_s, c.interactions.on_timeout) == (0, "deny")
    assert (c.runtimes.restart_backoff_initial_s, c.runtimes.restart_backoff_max_s, c.runtimes.hang_timeout_s) == (1.0, 60.0, 0)
    assert (c.providers.script.enabled, c.providers.script.scripts_dir, c.providers.script.default_script) == (True, "", "")
    assert (c.providers.copilot.enabled, c.providers.copilot.byok, c.providers.copilot.env) == (True, None, {})
    assert c.providers.acp == {}
    assert (c.attachments.max_bytes, c.attachments.max_files, c.attachments.retention_days) == (10 << 20, 10, 30)
    assert "text/*" in c.attachments.allowed_types and "application/pdf" in c.attachments.allowed_types
    assert (c.agent_files.max_bytes, c.agent_files.timeout_s, c.agent_files.threads) == (10 << 20, 30.0, 4)
    assert (c.pricing, c.budgets) == ({}, {})


def test_shipped_pricing_and_budget_examples_are_valid() -> None:
    pricing = msgspec.toml.decode(commented_block('[pricing."gpt-4.1"]'), type=dict)
    budgets = msgspec.toml.decode(commented_block("[budgets.copilot]"), type=dict)
    cfg = msgspec.convert({**pricing, **budgets}, Config)
    assert cfg.pricing["gpt-4.1"] == PricingConfig(input_per_mtok=2.0, output_per_mtok=8.0, cached_per_mtok=0.5)
    assert cfg.budgets["copilot"] == BudgetConfig(max_cost_usd=5.0, on_reach="pause")


def test_a_budget_with_an_unknown_on_reach_names_its_key(tmp_path: pathlib.Path) -> None:
    err = error_of(tmp_path, '[budgets.script]\nmax_cost_usd = 1\non_reach = "later"\n')
    assert err.key == "budgets.script.on_reach"


def test_sections_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Config().journal.fsync = "never"  # type: ignore[misc]


def test_exit_status_for_a_broken_config_is_ex_config() -> None:
    assert EXIT_CONFIG == 78


# --------------------------------------------------------------------------- loading


def test_values_from_the_file_override_defaults(tmp_path: pathlib.Path) -> None:
    cfg = load_config(
        write(
            tmp_path,
            """
[journal]
fsync = "always"
[interactions]
timeout_s = 300
on_timeout = "leave"
[providers.copilot]
model = "gpt-5"
env = { COPILOT_ALLOW_ALL = "1" }
[providers.copilot.byok]
type = "anthropic"
base_url = "https://api.anthropic.com"
api_key_env = "ANTHROPIC_API_KEY"
model = "claude-sonnet-4"
[providers.acp.gemini]
command = ["gemini", "--experimental-acp"]
env = { GEMINI_API_KEY_FILE = "~/.gemini-key" }
[providers.acp.codex]
command = ["codex-acp"]
cwd_policy = "shared"
enabled = false
""",
        )
    )
    assert cfg.journal.fsync == "always"
    assert cfg.interactions.timeout_s == 300.0
    assert cfg.interactions.on_timeout == "leave"
    assert cfg.providers.copilot.model == "gpt-5"
    assert cfg.providers.copilot.env == {"COPILOT_ALLOW_ALL": "1"}
    assert cfg.providers.copilot.byok is not None
    assert cfg.providers.copilot.byok.type == "anthropic"
    assert cfg.providers.copilot.byok.wire_api == "completions"
    assert cfg.providers.acp == {
        "gemini": AcpAgentConfig(command=["gemini", "--experimental-acp"], env={"GEMINI_API_KEY_FILE": "~/.gemini-key"}),
        "codex": AcpAgentConfig(command=["codex-acp"], cwd_policy="shared", enabled=False),
    }
    # Everything not written keeps its default.
    assert cfg.server == Config().server


def test_without_a_path_the_user_config_file_is_used_when_it_exists(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert default_config_path() == tmp_path / "agentd" / "agentd.toml"
    assert load_config(None) == Config()
    (tmp_path / "agentd").mkdir()
    (tmp_path / "agentd" / "agentd.toml").write_text('[log]\nlevel = "debug"\n')
    assert load_config(None).log.level == "debug"


def test_an_empty_file_gives_the_defaults(tmp_path: pathlib.Path) -> None:
    assert load_config(write(tmp_path, "")) == Config()


# --------------------------------------------------------------------------- errors


def test_invalid_enum_value_names_file_key_and_the_allowed_values(tmp_path: pathlib.Path) -> None:
    err = error_of(tmp_path, '[journal]\nfsync = "sometimes"\n')
    assert str(err) == f'{tmp_path / "agentd.toml"}: journal.fsync: "sometimes" is not one of "always", "batch", "never"'
    assert err.key == "journal.fsync"
    assert err.reason == '"sometimes" is not one of "always", "batch", "never"'
    assert err.path == tmp_path / "agentd.toml"


def literal_keys(tp: Any = Config, prefix: str = "") -> dict[str, tuple[Any, ...]]:
    """Dotted key path -> allowed values of every Literal-valued key in the schema ("<name>" for a named table)."""
    out: dict[str, tuple[Any, ...]] = {}
    for name, hint in typing.get_type_hints(tp, include_extras=True).items():
        key = f"{prefix}.{name}" if prefix else name
        for arg in unwrap_all(hint):
            if typing.get_origin(arg) is Literal:
                out[key] = typing.get_args(arg)
            elif isinstance(arg, type) and issubclass(arg, msgspec.Struct):
                out |= literal_keys(arg, key)
            elif typing.get_origin(arg) is dict:
                for value_type in unwrap_all(typing.get_args(arg)[1]):
                    if isinstance(value_type, type) and issubclass(value_type, msgspec.Struct):
                        out |= literal_keys(value_type, f"{key}.<name>")
    return out


def unwrap_all(tp: Any) -> list[Any]:
    """The member types of an annotation, Annotated and Optional stripped."""
    if typing.get_origin(tp) is Annotated:
        return unwrap_all(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(tp) if arg is not type(None) for t in unwrap_all(arg)]
    return [tp]


#: A minimal file per Literal-valued key, with BOGUS where its value goes (required siblings filled in).
ENUM_KEYS = {
    "journal.fsync": "[journal]\nfsync = BOGUS\n",
    "store.backend": "[store]\nbackend = BOGUS\n",
    "log.level": "[log]\nlevel = BOGUS\n",
    "log.format": "[log]\nformat = BOGUS\n",
    "interactions.on_timeout": "[interactions]\non_timeout = BOGUS\n",
    "budgets.<name>.on_reach": "[budgets.claude]\nmax_cost_usd = 1\non_reach = BOGUS\n",
    "providers.copilot.byok.type": '[providers.copilot.byok]\ntype = BOGUS\nbase_url = "https://x"\nmodel = "m"\n',
    "providers.copilot.byok.wire_api": (
        '[providers.copilot.byok]\ntype = "openai"\nbase_url = "https://x"\nmodel = "m"\nwire_api = BOGUS\n'
    ),
    "providers.acp.<name>.cwd_policy": '[providers.acp.claude]\ncommand = ["a"]\ncwd_policy = BOGUS\n',
    "providers.acp.<name>.missing_file": '[providers.acp.claude]\ncommand = ["a"]\nmissing_file = BOGUS\n',
    "providers.codex.approval_policy": "[providers.codex]\napproval_policy = BOGUS\n",
    "providers.codex.sandbox": "[providers.codex]\nsandbox = BOGUS\n",
    "providers.codex.model_provider.wire_api": (
        '[providers.codex.model_provider]\nbase_url = "https://x"\nwire_api = BOGUS\n'
    ),
}


def test_every_enum_valued_key_has_an_error_message_case() -> None:
    assert set(literal_keys()) == set(ENUM_KEYS)


@pytest.mark.parametrize("key", sorted(ENUM_KEYS))
@pytest.mark.parametrize(
    ("written", "shown"),
    [('"bogus"', '"bogus"'), ("3", "3"), ("true", "true"), ('"Always"', '"Always"')],
)
def test_every_enum_valued_key_lists_its_allowed_values(
    tmp_path: pathlib.Path, key: str, written: str, shown: str
) -> None:
    allowed = ", ".join(json.dumps(v) for v in literal_keys()[key])
    err = error_of(tmp_path, ENUM_KEYS[key].replace("BOGUS", written))
    assert err.key == key.replace("<name>", "claude")
    assert err.reason == f"{shown} is not one of {allowed}"
    assert str(err).endswith(f"agentd.toml: {err.key}: {shown} is not one of {allowed}")


def test_an_array_or_table_for_an_enum_valued_key_lists_the_allowed_values(tmp_path: pathlib.Path) -> None:
    assert str(error_of(tmp_path, '[log]\nlevel = ["info"]\n')).endswith(
        'log.level: must be one of "debug", "info", "warning", "error", "critical", not an array'
    )
    assert str(error_of(tmp_path, "[interactions.on_timeout]\nx = 1\n")).endswith(
        'interactions.on_timeout: must be one of "deny", "leave", not a table'
    )
    # Quotes and backslashes in the value are escaped as in TOML, so the line stays unambiguous.
    assert str(error_of(tmp_path, "[journal]\nfsync = 'a\"b\\c'\n")).endswith(
        'journal.fsync: "a\\"b\\\\c" is not one of "always", "batch", "never"'
    )


def test_allowed_values_come_from_literal_enum_and_union_types() -> None:
    class Colour(enum.Enum):
        RED = "red"
        BLUE = "blue"

    assert config_module._choices(Literal["a", "b"]) == ("a", "b")
    assert config_module._choices(Colour) == ("red", "blue")
    assert config_module._choices(Annotated[Literal[1, 2], msgspec.Meta()]) == (1, 2)
    assert config_module._choices(Literal["a"] | Literal["b", "a"] | None) == ("a", "b")
    assert config_module._choices(Literal["a"] | int) is None
    assert config_module._choices(str) is None


def test_unknown_key_is_reported_as_a_key_path_with_a_suggestion(tmp_path: pathlib.Path) -> None:
    err = error_of(tmp_path, "[server]\nmax_frame_byte = 10\n")
    assert str(err).endswith("agentd.toml: unknown key server.max_frame_byte (did you mean max_frame_bytes?)")
    assert "$" not in str(err) and "Object contains" not in str(err)


def test_unknown_section_is_reported(tmp_path: pathlib.Path) -> None:
    assert str(error_of(tmp_path, "[jounral]\nfsync = 'never'\n")).endswith("unknown key jounral (did you mean journal?)")


def test_errors_inside_named_tables_name_the_table(tmp_path: pathlib.Path) -> None:
    head = '[providers.acp.ok]\ncommand = ["ok"]\n[providers.acp.gemini]\n'
    assert str(error_of(tmp_path, head + 'command = ["g"]\ncwd = "/"\n')).endswith(
        "unknown key providers.acp.gemini.cwd"
    )
    assert str(error_of(tmp_path, head + "enabled = true\n")).endswith(
        "providers.acp.gemini.command: missing required key"
    )
    assert str(error_of(tmp_path, head + "command = [1]\n")).endswith(
        "providers.acp.gemini.command[0]: Expected `str`, got `int`"
    )
    assert str(error_of(tmp_path, head + "command = []\n")).endswith(
        "providers.acp.gemini.command: Expected `array` of length >= 1"
    )
    assert str(error_of(tmp_path, head + 'command = ["g"]\nenv = { HOME = 1 }\n')).endswith(
        "providers.acp.gemini.env.HOME: Expected `str`, got `int`"
    )
    assert "providers.acp.gemini.env.\"not a name\": invalid key name" in str(
        error_of(tmp_path, head + 'command = ["g"]\nenv = { "not a name" = "x" }\n')
    )


def test_wrong_type_and_out_of_range_values(tmp_path: pathlib.Path) -> None:
    assert str(error_of(tmp_path, '[journal]\nbatch_ms = "5"\n')).endswith("journal.batch_ms: Expected `float`, got `str`")
    assert str(error_of(tmp_path, "[leases]\nttl_s = 0\n")).endswith("leases.ttl_s: Expected `float` > 0.0")
    assert str(error_of(tmp_path, "[websocket]\nport = 70000\n")).endswith("websocket.port: Expected `int` <= 65535")
    assert "restart_backoff_max_s must be >= restart_backoff_initial_s" in str(
        error_of(tmp_path, "[runtimes]\nrestart_backoff_initial_s = 10\nrestart_backoff_max_s = 5\n")
    )
    assert "state_dir must be an absolute path" in str(error_of(tmp_path, '[daemon]\nstate_dir = "relative/dir"\n'))


def test_byok_requires_its_endpoint_and_model(tmp_path: pathlib.Path) -> None:
    err = error_of(tmp_path, '[providers.copilot.byok]\ntype = "openai"\nmodel = "m"\n')
    assert str(err).endswith("providers.copilot.byok.base_url: missing required key")


def test_an_api_key_pasted_into_api_key_env_is_rejected_without_echoing_it(tmp_path: pathlib.Path) -> None:
    key = "sk-proj-Zk4s9d8f7g6h5j4k3l2"
    err = error_of(
        tmp_path,
        f'[providers.copilot.byok]\ntype = "openai"\nbase_url = "https://x"\nmodel = "m"\napi_key_env = "{key}"\n',
    )
    assert "providers.copilot.byok.api_key_env: must be the NAME of the environment variable" in str(err)
    assert key not in str(err)
    assert err.__cause__ is None and err.__suppress_context__


def test_toml_syntax_error_gives_line_and_column(tmp_path: pathlib.Path) -> None:
    err = error_of(tmp_path, '[journal]\nfsync = "always"\nbatch_ms = \n')
    assert (err.line, err.column) == (3, 12)
    assert str(err).startswith(f"{tmp_path / 'agentd.toml'}:3:12: TOML syntax error: ")


def test_duplicate_key_is_a_syntax_error(tmp_path: pathlib.Path) -> None:
    err = error_of(tmp_path, "[leases]\nttl_s = 1\nttl_s = 2\n")
    assert err.line == 3
    assert "TOML syntax error" in str(err)


def test_missing_explicit_file_is_an_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: file not found$"):
        load_config(tmp_path / "nope.toml")


def test_unreadable_or_non_utf8_file_is_an_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="a directory, not a regular file"):
        load_config(tmp_path)
    path = tmp_path / "agentd.toml"
    path.write_bytes(b'[log]\nlevel = "\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path)


# --------------------------------------------------------------------------- paths


def test_resolved_paths_default_to_platformdirs(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    p = Config().resolved_paths()
    assert p.state_dir == tmp_path / "state" / "agentd"
    assert p.runtime_dir == tmp_path / "run" / "agentd"
    assert p.socket == tmp_path / "run" / "agentd" / "agentd.sock"
    assert p.token_file == tmp_path / "run" / "agentd" / "ws-token"


def test_resolved_paths_from_the_file_expand_home(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = load_config(
        write(tmp_path, '[daemon]\nstate_dir = "~/st"\nruntime_dir = "/run/x"\n[websocket]\ntoken_file = "~/tok"\n')
    )
    p = cfg.resolved_paths()
    assert p.state_dir == tmp_path / "st"
    assert p.runtime_dir == pathlib.Path("/run/x")
    assert p.socket == pathlib.Path("/run/x/agentd.sock")
    assert p.token_file == tmp_path / "tok"


def test_environment_overrides_the_file(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(write(tmp_path, '[daemon]\nstate_dir = "/a"\nruntime_dir = "/b"\nsocket = "/b/s.sock"\n'))
    monkeypatch.setenv("AGENTD_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AGENTD_RUNTIME_DIR", str(tmp_path / "run"))
    p = cfg.resolved_paths()
    assert (p.state_dir, p.runtime_dir) == (tmp_path / "state", tmp_path / "run")
    assert p.socket == pathlib.Path("/b/s.sock")  # the file's socket still wins over the derived default
    monkeypatch.setenv("AGENTD_SOCKET", str(tmp_path / "x.sock"))
    assert cfg.resolved_paths().socket == tmp_path / "x.sock"
    # The socket default follows an overridden runtime dir.
    assert Config().resolved_paths().token_file == tmp_path / "run" / "ws-token"
    assert Config().resolved_paths(environ={"AGENTD_RUNTIME_DIR": "/r"}).socket == pathlib.Path("/r/agentd.sock")


def test_relative_environment_paths_are_made_absolute(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    p = Config().resolved_paths(environ={"AGENTD_STATE_DIR": "st", "AGENTD_RUNTIME_DIR": ""})
    assert p.state_dir == tmp_path / "st"
    assert p.state_dir.is_absolute() and p.runtime_dir.is_absolute()
