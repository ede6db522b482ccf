"""How each real runtime is installed, configured and pointed at the scripted model server.

A :class:`Runtime` gives the conformance suite everything runtime-specific:
the agentd.toml that selects and configures the provider, the environment,
and how to make "the model" answer text, call a tool, or stream slowly. For
the ``script`` provider, which has no model, the same wishes are written as a
TOML script instead.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
from collections.abc import Iterator
from typing import Any

from environment import unavailable
from modelserver import ModelServer

HERE = pathlib.Path(__file__).resolve().parent
MODEL = "scripted-model"
KEY_ENV = "AGENTD_E2E_MODEL_KEY"
DUMMY_KEY = "sk-agentd-e2e-dummy-key"

RUNTIMES = ["script", "copilot", "claude", "codex", "acp:claude", "acp:gemini", "acp:copilot", "acp:codex"]

#: Of the conformance scenarios that reload a conversation and check it with
#: :meth:`Runtime.check_reload` (restart, runtime_killed), the one whose session is always made early
#: in a minute: its reload always meets a runtime that needs a later minute (LOAD_NEEDS_A_NEW_MINUTE),
#: so agentd's wait is checked in every run. runtime_killed's reload meets it when it happens to fall
#: in its session's minute (most runs); waiting for that too cost a worker a minute or more a run.
MINUTE_WAIT_SCENARIO = "restart"

LONG_TEXT = " ".join(f"word{i}" for i in range(400))
q = json.dumps  # a JSON string is a valid TOML basic string


class Runtime:
    """One runtime under test; subclasses fill in the runtime-specific parts."""

    name = ""
    provider = ""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.config_toml = ""
        self.env: dict[str, str] = {}
        self.server: ModelServer | None = None
        #: wall-clock time the scenario's conversation was created
        self.created = 0.0

    def model_for(self, scenario: str) -> str:
        return ""

    # What the model should do next.
    def text_only(self, text: str) -> None:
        assert self.server is not None
        self.server.reset()
        self.server.answer_text_only(text)

    def call_tool(self, command: str) -> None:
        assert self.server is not None
        self.server.reset()
        self.server.command = command

    def slow_text(self) -> None:
        assert self.server is not None
        self.server.reset()
        self.server.answer_text_only(LONG_TEXT)
        self.server.stream_slowly(0.1)

    def new_cell(self) -> None:
        """A runtime shared by several conformance cells starts each afresh: the model server's
        default answers, none of the earlier cells' requests, and not a cell's own ``decide``."""
        if self.server is not None:
            self.server.__dict__.pop("decide", None)  # set on the instance by test_conformance_mcp.py
            self.server.reset()
            self.server.forget()
        self.created = 0.0

    def before_create(self, scenario: str) -> None:
        """Called right before ``scenario`` creates its conversation."""

    def emit_unknown(self, type_name: str) -> None:
        """Make the next turn emit an event of a kind agentd does not know, where that can be made."""

    def check_unknown_mapping(self) -> None:
        """The provider's mapping turns an event of a new type, in this runtime's real shape, into ``unknown``."""
        raise AssertionError(f"{self.name}: no unknown kind was sent, and there is no mapping check for it")

    def check_reload(self, daemon: Any, reloaded_at: float) -> None:
        """Called after a prompt sent at ``reloaded_at`` (wall clock) made the runtime load the conversation anew."""

    def saw_earlier_turn(self, daemon: Any, cid: str, earlier: str, later: str) -> bool:
        """Whether the model request of ``later`` carried the earlier prompt (the runtime kept history)."""
        assert self.server is not None
        bodies = [json.dumps(r) for r in self.server.requests if later in json.dumps(r)]
        return bool(bodies) and earlier in bodies[-1]

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


class ScriptRuntime(Runtime):
    """The in-process script provider: 'the model' is a TOML script written per scenario."""

    name = provider = "script"

    def __init__(self, root: pathlib.Path) -> None:
        super().__init__(root)
        self.config_toml = "[providers.copilot]\nenabled = false\n[providers.claude]\nenabled = false\n[providers.codex]\nenabled = false\n"
        self.script = root / "conformance-script.toml"

    def model_for(self, scenario: str) -> str:
        return str(self.script)

    def _write(self, steps: str) -> None:
        self.script.write_text(f'model = "conformance"\n[[turn]]\n{steps}')

    def text_only(self, text: str) -> None:
        self._write(f'[[turn.step]]\nkind = "text"\ntext = {q(text + " You said: {prompt}. Earlier: {history}")}\nchunk = 8\ndelay_ms = 5\n')

    def call_tool(self, command: str) -> None:
        self._write(
            f'[[turn.step]]\nkind = "tool"\nname = "bash"\ncommand = {q(command)}\npermission = true\n'
            '[[turn.step]]\nkind = "text"\ntext = "Done."\n'
        )

    def slow_text(self) -> None:
        # The provider reads the script when the conversation opens, so a text_only() made after
        # that (the prompt that follows a cancelled slow turn) cannot change it: the script's
        # second turn is that quick text answer, else the follow-up replays the slow one (~40 s).
        self._write(
            f'[[turn.step]]\nkind = "text"\ntext = {q(LONG_TEXT)}\nchunk = 4\ndelay_ms = 50\n'
            f'[[turn]]\n[[turn.step]]\nkind = "text"\ntext = {q("Back again. You said: {prompt}. Earlier: {history}")}\n'
            'chunk = 8\ndelay_ms = 5\n'
        )

    def saw_earlier_turn(self, daemon: Any, cid: str, earlier: str, later: str) -> bool:
        items = [r["data"] for r in daemon.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "assistant"]
        return earlier in items[-1]["text"]

    def emit_unknown(self, type_name: str) -> None:
        with self.script.open("a") as f:
            f.write(f'[[turn.step]]\nkind = "unknown_event"\ntype = {q(type_name)}\n[turn.step.data]\nlevel = 7\n')


class CopilotRuntime(Runtime):
    """GitHub Copilot CLI (npm @github/copilot, pinned in tests/e2e), bring-your-own-key to the model server."""

    name = provider = "copilot"

    def __init__(self, root: pathlib.Path) -> None:
        super().__init__(root)
        from installs import install_copilot_cli

        try:
            cli = install_copilot_cli()
        except (RuntimeError, OSError) as exc:
            unavailable(f"the Copilot CLI could not be installed: {exc}")
        self.server = ModelServer(root / "model-requests.jsonl", model=MODEL)
        self.server.start()
        home = root / "copilot-home"
        home.mkdir()
        self.env = {KEY_ENV: DUMMY_KEY}
        self.config_toml = (
            "[providers.claude]\nenabled = false\n[providers.codex]\nenabled = false\n"
            "[providers.copilot]\n"
            f"cli_path = {q(str(cli))}\ncopilot_home = {q(str(home))}\n"
            "[providers.copilot.byok]\n"
            f'type = "openai"\nbase_url = {q(self.server.url)}\napi_key_env = {q(KEY_ENV)}\nmodel = {q(MODEL)}\n'
            f'models = {q([MODEL + "-b"])}\n'  # a second model the endpoint serves (set_model)
        )

    def check_unknown_mapping(self) -> None:
        # A session.event as the CLI sends it (the SDK's own from_dict), of a type no SDK knows.
        from copilot.generated.session_events import SessionEvent

        from agentd.contract import UnknownEvent
        from agentd.providers.copilot._mapping import EventMapper

        event = SessionEvent.from_dict({"id": "0b9e2f4e-5c1a-4d7e-9a43-1f6f5b2c9d10", "timestamp": "2026-12-01T10:00:00.000Z",
                                        "parentId": None, "type": "session.future_kind", "data": {"level": 7}})
        out = EventMapper().map(event)
        assert len(out) == 1 and isinstance(out[0], UnknownEvent), out
        assert out[0].unknown.type == "session.future_kind" and out[0].unknown.data == {"level": 7}


class ClaudeRuntime(Runtime):
    """Claude Code, the binary bundled in the claude-agent-sdk wheel, pointed at the Anthropic flavour."""

    name = provider = "claude"

    def __init__(self, root: pathlib.Path) -> None:
        super().__init__(root)
        import shutil

        from agentd.providers.claude import bundled_cli

        cli = bundled_cli() or shutil.which("claude")
        if not cli:
            unavailable("Claude Code is not installed: `pip install claude-agent-sdk` bundles it")
        self.server = ModelServer(root / "model-requests.jsonl", model=MODEL)
        self.server.start()
        config_dir, home = root / "claude-config", root / "claude-home"
        config_dir.mkdir()
        home.mkdir()
        self.env = {KEY_ENV: DUMMY_KEY}
        self.config_toml = (
            "[providers.copilot]\nenabled = false\n[providers.codex]\nenabled = false\n"
            "[providers.claude]\n"
            f"cli_path = {q(str(cli))}\nmodel = {q(MODEL)}\napi_key_env = {q(KEY_ENV)}\n"
            f"base_url = {q(self.server.url.removesuffix('/v1'))}\nconfig_dir = {q(str(config_dir))}\n"
            "[providers.claude.env]\n"
            f"HOME = {q(str(home))}\nCLAUDE_CODE_MAX_RETRIES = \"0\"\nCLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK = \"1\"\n"
        )

    def check_unknown_mapping(self) -> None:
        # A stream-json line as Claude Code writes it, of a type the SDK skips, through the SDK's parser.
        from claude_agent_sdk._internal.message_parser import parse_message

        from agentd.contract import UnknownEvent
        from agentd.providers.claude._mapping import unknown_message

        for data, name in (({"type": "future_kind", "uuid": "u1", "session_id": "s1", "level": 7}, "future_kind"),
                           ({"type": "system", "subtype": "future_subtype", "uuid": "u2", "session_id": "s1"},
                            "system/future_subtype")):
            event = unknown_message(data, parse_message(data))
            assert isinstance(event, UnknownEvent) and event.unknown.type == name, event


class CodexRuntime(Runtime):
    """OpenAI Codex CLI (npm @openai/codex, pinned in tests/e2e) as `codex app-server`, on the Responses API."""

    name = provider = "codex"

    def __init__(self, root: pathlib.Path, overrides: tuple[str, ...] = ()) -> None:
        super().__init__(root)
        from acp_agents import CODEX_OFFLINE
        from installs import install_codex_cli

        try:
            cli = install_codex_cli()
        except (RuntimeError, OSError) as exc:
            unavailable(f"the Codex CLI could not be installed: {exc}")
        self.server = ModelServer(root / "model-requests.jsonl", model=MODEL)
        self.server.start()
        home = root / "codex-home"
        home.mkdir()
        self.env = {KEY_ENV: DUMMY_KEY}
        self.config_toml = (
            "[providers.copilot]\nenabled = false\n[providers.claude]\nenabled = false\n"
            "[providers.codex]\n"
            f"cli_path = {q(str(cli))}\ncodex_home = {q(str(home))}\nmodel = {q(MODEL)}\n"
            f"overrides = {q(CODEX_OFFLINE + list(overrides))}\n"
            "[providers.codex.model_provider]\n"
            f"base_url = {q(self.server.url)}\napi_key_env = {q(KEY_ENV)}\n"
            "request_max_retries = 0\nstream_max_retries = 0\n"
        )

    def call_tool(self, command: str) -> None:
        assert self.server is not None
        self.server.reset()
        import acp_agents

        self.server.call_tool("exec_command", arguments=acp_agents.codex_shell_arguments(command))

    def check_unknown_mapping(self) -> None:
        # A server notification and a thread item as the app-server sends them, of kinds 0.171.0 does not have.
        from agentd.contract import UnknownEvent
        from agentd.providers.codex._mapping import unknown_item, unknown_notification

        event = unknown_notification(self.provider, "thread/futureThing/updated", {"threadId": "t1", "level": 7})
        assert isinstance(event, UnknownEvent) and event.unknown.type == "thread/futureThing/updated", event
        assert event.unknown.data == {"threadId": "t1", "level": 7}
        item = unknown_item(self.provider, {"type": "futureItem", "id": "i1", "detail": "x"})
        assert isinstance(item, UnknownEvent) and item.unknown.type == "item/futureItem", item
        for known in ("turn/completed", "account/rateLimits/updated", "turn/diff/updated"):
            assert unknown_notification(self.provider, known, {}) is None, known
        assert unknown_item(self.provider, {"type": "contextCompaction", "id": "i2"}) is None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)  # strings and lists of strings: JSON is valid TOML here


def acp_toml(name: str, config: Any) -> str:
    """``[providers.acp.<name>]`` tables for an AcpAgentConfig."""
    import msgspec

    fields = msgspec.structs.asdict(config)
    env = fields.pop("env", {})
    lines = [f"[providers.acp.{name}]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in fields.items() if value is not None]
    lines.append(f"[providers.acp.{name}.env]")
    lines += [f"{key} = {json.dumps(value)}" for key, value in env.items()]
    return "\n".join(lines) + "\n"


class AcpRuntime(Runtime):
    """A real Agent Client Protocol agent over its stdio, pointed at the model server."""

    def __init__(self, root: pathlib.Path, agent: str) -> None:
        super().__init__(root)
        import acp_agents

        self.agent = agent
        self.name = self.provider = f"acp:{agent}"
        try:
            if agent == "copilot":
                from installs import install_copilot_cli

                cli = str(install_copilot_cli())
            else:
                bins = acp_agents.install_acp_agents()
        except (RuntimeError, OSError) as exc:
            unavailable(f"the ACP agent {agent} could not be installed: {exc}")
        self.server = ModelServer(root / "model-requests.jsonl", model=MODEL)
        self.server.start()
        base = self.server.url.removesuffix("/v1")
        if agent == "copilot":
            config = acp_agents.copilot_config(cli, root, self.server.url, MODEL)
        elif agent == "claude":
            config = acp_agents.claude_config(bins, root, base)
        elif agent == "codex":
            config = acp_agents.codex_config(bins, root, self.server.url, MODEL, KEY_ENV)
        else:
            config = acp_agents.gemini_config(bins, root, base)
        self.config_toml = "[providers.copilot]\nenabled = false\n[providers.claude]\nenabled = false\n[providers.codex]\nenabled = false\n" + acp_toml(agent, config)

    def call_tool(self, command: str) -> None:
        import acp_agents

        assert self.server is not None
        self.server.reset()
        acp_agents.call_shell(self.server, self.agent, command)

    def check_unknown_mapping(self) -> None:
        # A session/update notification's update as ACP defines it, of a kind no agent sends yet.
        from agentd.contract import UnknownEvent
        from agentd.providers.acp._mapping import unknown_update

        event = unknown_update(self.provider, {"sessionUpdate": "future_kind", "detail": {"level": 7}})
        assert isinstance(event, UnknownEvent) and event.unknown.type == "future_kind", event
        assert unknown_update(self.provider, {"sessionUpdate": "agent_message_chunk",
                                              "content": {"type": "text", "text": "x"}}) is None

    def before_create(self, scenario: str) -> None:
        import acp_agents

        # Only for the scenario that always checks the reload's wait; others would only wait.
        if self.agent in acp_agents.LOAD_NEEDS_A_NEW_MINUTE and scenario == MINUTE_WAIT_SCENARIO:
            import time

            # Early enough in a minute that the reload (5-10 s later, more on a loaded machine) falls
            # within it and agentd must wait; check_reload judges by the minutes it really saw.
            into = time.time() % 60
            if into > 40:
                print(f"\nwaiting {60.5 - into:.1f} s for a new UTC minute ({self.name}: session/load)")
                time.sleep(60.5 - into)

    def check_reload(self, daemon: Any, reloaded_at: float) -> None:
        import acp_agents

        if self.agent in acp_agents.LOAD_NEEDS_A_NEW_MINUTE and self.created // 60 == reloaded_at // 60:
            assert "acp.load_waits_for_a_later_minute" in daemon.log_text(), (
                "the reload came in the session's creation minute, yet agentd did not wait it out"
            )


_PROFILES: dict[str, Any] = {
    "script": ScriptRuntime,
    "copilot": CopilotRuntime,
    "claude": ClaudeRuntime,
    "codex": CodexRuntime,
    "acp:claude": lambda root: AcpRuntime(root, "claude"),
    "acp:gemini": lambda root: AcpRuntime(root, "gemini"),
    "acp:copilot": lambda root: AcpRuntime(root, "copilot"),
    "acp:codex": lambda root: AcpRuntime(root, "codex"),
}


@contextlib.contextmanager
def runtime_profile(name: str, root: pathlib.Path) -> Iterator[Runtime]:
    rt = _PROFILES[name](root)
    try:
        yield rt
    finally:
        rt.close()
