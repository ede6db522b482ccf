"""agentd.toml as msgspec Structs, and the paths the daemon uses.

The schema is the Structs below: every section forbids unknown keys, so a typo
is an error naming the key, never a silently ignored setting. ``conf/agentd.toml``
in the repository lists every key at its default.

Import-light: msgspec, platformdirs and the standard library only, so a
client may import it to find the socket.

Paths: every path key left empty takes a platformdirs default, and the
environment variables ``AGENTD_STATE_DIR``, ``AGENTD_RUNTIME_DIR`` and
``AGENTD_SOCKET`` override the file (see :meth:`Config.resolved_paths`).
Paths written in the file must be absolute or start with ``~``.

Secrets never appear in the config: ``providers.copilot.byok.api_key_env``
names the environment variable that holds the key.
"""

from __future__ import annotations

import datetime
import difflib
import enum
import json
import os
import pathlib
import re
import tomllib
import types
import typing
import warnings
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
import platformdirs

from . import _trust

__all__ = [
    "APP_NAME",
    "EXIT_CONFIG",
    "AcpAgentConfig",
    "AttachmentsConfig",
    "BudgetConfig",
    "PricingConfig",
    "ByokConfig",
    "ClaudeConfig",
    "CodexConfig",
    "CodexModelProviderConfig",
    "Config",
    "ConfigError",
    "CopilotConfig",
    "DaemonConfig",
    "InteractionsConfig",
    "JournalConfig",
    "LeasesConfig",
    "StoreConfig",
    "LogConfig",
    "McpConfig",
    "McpServerConfig",
    "Paths",
    "ProvidersConfig",
    "RuntimesConfig",
    "ScriptConfig",
    "ServerConfig",
    "TasksConfig",
    "WebSocketConfig",
    "default_config_path",
    "load_config",
    "parse_config",
]

APP_NAME = "agentd"

#: Process exit status for a configuration that cannot be loaded, or a path agentd may not use
#: (sysexits EX_CONFIG). The systemd unit lists it in RestartPreventExitStatus: a restart cannot fix it.
EXIT_CONFIG = _trust.EXIT_UNUSABLE

#: Environment variables that override the file's paths.
ENV_STATE_DIR = "AGENTD_STATE_DIR"
ENV_RUNTIME_DIR = "AGENTD_RUNTIME_DIR"
ENV_SOCKET = "AGENTD_SOCKET"

#: The largest number a float setting takes (seconds, milliseconds, dollars): finite, so `inf`
#: or 1e308 is a config error, not a crash of the first thread that waits that long.
FLOAT_MAX = 1e9
NonNegFloat = Annotated[float, msgspec.Meta(ge=0, le=FLOAT_MAX)]
PosFloat = Annotated[float, msgspec.Meta(gt=0, le=FLOAT_MAX)]
EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
Environment = dict[EnvName, str]


class ConfigError(Exception):
    """agentd.toml cannot be read, parsed or validated.

    ``str(err)`` is one line naming the file and the key path, e.g.
    ``agentd.toml: journal.fsync: "sometimes" is not one of "always", "batch", "never"`` or
    ``agentd.toml: unknown key server.max_frame_byte``; TOML syntax errors read
    ``agentd.toml:3:9: TOML syntax error: ...``. Attributes: ``path`` (the file,
    or None), ``key`` (dotted key path, "" when not about one key), ``reason``,
    and ``line`` / ``column`` (1-based, syntax errors only). A daemon exits with
    :data:`EXIT_CONFIG` on it.
    """

    def __init__(
        self,
        reason: str,
        *,
        path: pathlib.Path | None = None,
        key: str = "",
        line: int | None = None,
        column: int | None = None,
        unknown: bool = False,
    ) -> None:
        self.path = path
        self.key = key
        self.reason = reason
        self.line = line
        self.column = column
        where = str(path) if path is not None else "config"
        if line is not None:
            where = f"{where}:{line}:{column}"
        if unknown:
            text = f"{where}: unknown key {key}" + (f" ({reason})" if reason else "")
        elif key:
            text = f"{where}: {key}: {reason}"
        else:
            text = f"{where}: {reason}"
        super().__init__(text)


def _check_path(value: str, key: str) -> None:
    if value and not (value.startswith("~") or os.path.isabs(value)):
        raise ValueError(f"{key} must be an absolute path or start with ~, not {value!r}")


# --------------------------------------------------------------------------- sections


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class DaemonConfig(_Section):
    """[daemon]: where the daemon keeps its state and socket, and how it stops."""

    #: journal, conversation records and the lock file; "" = platformdirs user_state_dir("agentd")
    state_dir: str = ""
    #: socket and WebSocket token; "" = platformdirs user_runtime_dir("agentd")
    runtime_dir: str = ""
    #: control socket path; "" = <runtime_dir>/agentd.sock
    socket: str = ""
    #: seconds a stopping daemon gives runtimes to exit before killing them
    shutdown_grace_s: NonNegFloat = 5.0

    def __post_init__(self) -> None:
        _check_path(self.state_dir, "state_dir")
        _check_path(self.runtime_dir, "runtime_dir")
        _check_path(self.socket, "socket")


class JournalConfig(_Section):
    """[journal]: durability of the per-conversation event journal."""

    #: always = fsync each record; batch = group commit every batch_ms; never = leave it to the OS
    fsync: Literal["always", "batch", "never"] = "batch"
    #: group-commit window in milliseconds (fsync = "batch" only)
    batch_ms: NonNegFloat = 5.0
    #: bytes of whole tool outputs kept per conversation beside the journal, whose records carry
    #: only a display cut (agentd.tool_outputs); the oldest go first. 0 = keep none
    tool_output_quota_bytes: Annotated[int, msgspec.Meta(ge=0)] = 256 << 20


class LeasesConfig(_Section):
    """[leases]: conversation leases held by the running daemon."""

    #: seconds a lease lives without renewal. The file store renews nothing: the daemon lock keeps
    #: the running daemon's leases (agentd.leases). postgres renews every ttl_s / 3
    ttl_s: PosFloat = 30.0


class StoreConfig(_Section):
    """[store]: where journals and conversation records live (agentd.store)."""

    #: file = under <state_dir>/conversations (one host); postgres = a PostgreSQL database
    #: several hosts may share (docs/scale-out.md)
    backend: Literal["file", "postgres"] = "file"
    #: libpq connection string or postgresql:// URI (postgres only); "" = dsn_file, else libpq's
    #: environment (PGHOST, ...) and ~/.pgpass. Its password is never logged or shown
    dsn: str = ""
    #: a file holding the DSN (0600, owned by agentd's user), instead of dsn
    dsn_file: str = ""

    def __post_init__(self) -> None:
        _check_path(self.dsn_file, "dsn_file")
        if self.dsn and self.dsn_file:
            raise ValueError("give dsn or dsn_file, not both")


class ServerConfig(_Section):
    """[server]: the control socket front."""

    #: largest incoming frame in bytes; a bigger one is an error and closes that connection.
    #: A prompt's attachments travel in its frame, base64-encoded (4/3 of their size)
    max_frame_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 16 << 20
    #: frames queued per connection before the subscriber gets `lagged` and must resubscribe
    #: (an empty outbox takes one burst of events of any size, up to 1024 frames)
    subscriber_buffer: Annotated[int, msgspec.Meta(ge=1)] = 4096
    #: concurrent client connections (socket and WebSocket together)
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 1024
    #: bytes queued per connection (responses wait for room; a subscriber past it gets `lagged`);
    #: an empty outbox takes one frame of any size. With a batch being written, a connection
    #: that never reads holds about twice this
    outbox_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 32 << 20
    #: requests of one connection running at once; past it agentd stops reading that connection
    max_requests_in_flight: Annotated[int, msgspec.Meta(ge=1)] = 64
    #: subscriptions one connection may hold; past it `subscribe` answers `limit`
    max_subscriptions: Annotated[int, msgspec.Meta(ge=1)] = 256
    #: seconds a new connection has to send `hello` before it is closed
    hello_timeout_s: PosFloat = 5.0


class WebSocketConfig(_Section):
    """[websocket]: the optional WebSocket gateway (same frames, bearer token)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    #: TCP port; 0 = any free port (the daemon logs the one it got)
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8765
    #: file holding the bearer token, created 0600 if missing; "" = <runtime_dir>/ws-token
    token_file: str = ""
    #: browser Origins allowed besides http://127.0.0.1:<port> and http://localhost:<port>;
    #: a request with any other Origin header is refused (clients without one are not browsers)
    allowed_origins: list[str] = []
    #: connections that have not yet passed the token check, in total and per peer (per local
    #: user on loopback, agentd.gateway.loopback_peer_socket, else per address); past either cap a
    #: new connection is closed at once
    max_unauthenticated: Annotated[int, msgspec.Meta(ge=1)] = 128
    max_unauthenticated_per_peer: Annotated[int, msgspec.Meta(ge=1)] = 16
    #: seconds a connection has to send its WebSocket handshake (with the token) before it is closed
    handshake_timeout_s: PosFloat = 5.0

    def __post_init__(self) -> None:
        _check_path(self.token_file, "token_file")
        if self.host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError("the WebSocket gateway listens on loopback only (127.0.0.1, ::1 or localhost)")


class LogConfig(_Section):
    """[log]: logging to stderr."""

    level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    #: auto = JSON lines when stderr is not a terminal or under systemd, else console
    format: Literal["auto", "json", "console"] = "auto"


class InteractionsConfig(_Section):
    """[interactions]: pending permission requests, questions and plan reviews."""

    #: seconds an interaction may stay pending; 0 = never expires
    timeout_s: NonNegFloat = 0.0
    #: deny = answer with the reject option on timeout; leave = keep it pending (only logged)
    on_timeout: Literal["deny", "leave"] = "deny"


class RuntimesConfig(_Section):
    """[runtimes]: supervision of provider runtime processes."""

    #: first delay before restarting a runtime that exited, doubled on each failure
    restart_backoff_initial_s: NonNegFloat = 1.0
    #: ceiling of that delay
    restart_backoff_max_s: NonNegFloat = 60.0
    #: seconds a running turn may go without any event before its runtime counts as hung; 0 = off
    hang_timeout_s: NonNegFloat = 0.0
    #: seconds a running turn whose runtime reports nothing, and which waits on nobody, lasts before
    #: it ends failed (reason runtime_silent, inferred); 0 = off
    silence_timeout_s: NonNegFloat = 600.0
    #: seconds a cancelled turn may take to end before it ends cancelled (reason cancel_timeout)
    cancel_timeout_s: PosFloat = 10.0
    #: seconds an open conversation may sit idle before its runtime conversation is closed (and
    #: reopened on the next prompt; agentd.idle_release); 0 = never
    idle_release_s: NonNegFloat = 300.0
    #: fresh runtime conversations kept ready per provider in use (agentd.warm_pool); 0 = none
    warm: Annotated[int, msgspec.Meta(ge=0, le=16)] = 0
    #: the workdir the default provider's warm conversations start in ("" = its newest conversation's)
    warm_workdir: str = ""

    def __post_init__(self) -> None:
        if self.restart_backoff_max_s < self.restart_backoff_initial_s:
            raise ValueError("restart_backoff_max_s must be >= restart_backoff_initial_s")
        if self.warm_workdir and not self.warm_workdir.startswith("/"):
            raise ValueError("warm_workdir must be an absolute path")


class TasksConfig(_Section):
    """[tasks]: queued non-interactive jobs and their result callbacks."""

    #: tasks of one provider running at once (pending ones wait their turn, oldest first)
    concurrency: Annotated[int, msgspec.Meta(ge=1)] = 2
    #: per-provider limits that replace `concurrency`, e.g. { claude = 1 }
    provider_concurrency: dict[str, Annotated[int, msgspec.Meta(ge=1)]] = {}
    #: seconds one callback POST may take, all told: connect, send and the answer (not per read)
    callback_timeout_s: PosFloat = 10.0
    #: seconds after the task ended during which a failing callback is retried
    callback_retry_window_s: NonNegFloat = 600.0
    #: first delay between callback attempts, doubled after each failure
    callback_backoff_initial_s: PosFloat = 1.0
    #: ceiling of that delay
    callback_backoff_max_s: PosFloat = 60.0

    def __post_init__(self) -> None:
        if self.callback_backoff_max_s < self.callback_backoff_initial_s:
            raise ValueError("callback_backoff_max_s must be >= callback_backoff_initial_s")


#: [attachments] allowed_types by default: text, common images, PDF, structured text.
DEFAULT_ATTACHMENT_TYPES = (
    "text/*", "image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf",
    "application/json", "application/xml", "application/toml", "application/yaml",
)


class AttachmentsConfig(_Section):
    """[attachments]: files sent with a prompt (``agentctl send --attach``)."""

    #: largest file in bytes; a prompt's files travel base64-encoded in one frame, so keep
    #: server.max_frame_bytes above 4/3 of what one prompt may carry
    max_bytes: Annotated[int, msgspec.Meta(ge=1)] = 10 << 20
    #: files one prompt may carry
    max_files: Annotated[int, msgspec.Meta(ge=1)] = 10
    #: MIME types accepted (``type/subtype`` or ``type/*``); empty = any. The daemon decides a
    #: file's type from its content and name, never from what the client claims.
    allowed_types: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_ATTACHMENT_TYPES))
    #: days a stored file is kept; swept at start-up and daily. 0 = until its conversation is removed
    retention_days: NonNegFloat = 30.0


class AgentctlConfig(_Section):
    """``[agentctl]``: what agentctl does on a terminal when an interaction waits for a person.

    agentd itself does not use it (agentctl reads the same file).
    """

    #: ring the terminal bell
    bell: bool = True
    #: send a desktop notification with ``notify-send`` where it is installed
    notify: bool = True


class AgentFilesConfig(_Section):
    """[agent_files]: files agentd reads and writes for an agent (ACP fs/*), beneath its workdir."""

    #: largest file read or written, bytes; a bigger one is refused (at most this + 1 bytes are read)
    max_bytes: Annotated[int, msgspec.Meta(ge=1)] = 10 << 20
    #: seconds one file request may take (a hung file system), waiting for a thread included
    timeout_s: PosFloat = 30.0
    #: worker threads for file requests, all conversations together
    threads: Annotated[int, msgspec.Meta(ge=1, le=256)] = 4


class CheckpointsConfig(_Section):
    """[checkpoints]: agentd's own record of a conversation's working directory around each turn
    (agentd.checkpoints), on every provider: ``agentctl diff`` and ``agentctl revert``."""

    #: record the working directory before and after each turn
    enabled: bool = True
    #: largest file recorded, bytes; a bigger one is left out (and named in the checkpoint record)
    max_file_bytes: Annotated[int, msgspec.Meta(ge=1)] = 10 << 20
    #: longest a turn waits for each of its checkpoints (before, after), seconds; past it the
    #: checkpoint is skipped (the journal says so) and the turn goes on, while the recording
    #: finishes in the background
    timeout_s: PosFloat = 0.15
    #: longest one recording may run at all, seconds (a first checkpoint of a big tree, a revert,
    #: a diff of a running turn); past it the git process is stopped
    max_run_s: PosFloat = 120.0
    #: skip git for a checkpoint when inotify saw nothing change in the working directory since
    #: the last one (Linux, local file systems, up to 1,024 directories; agentd._tree_watch says
    #: what it cannot see: writes through a shared mmap, a hard link written from outside)
    watch: bool = True


class PricingConfig(_Section, kw_only=True):
    """[pricing."<model>"]: USD per million tokens, for providers that report no cost.

    The key is a model id, or a prefix of model ids (the longest matching key wins).
    """

    input_per_mtok: NonNegFloat
    output_per_mtok: NonNegFloat
    #: cache reads; unset = the input price
    cached_per_mtok: NonNegFloat | None = None


class BudgetConfig(_Section, kw_only=True):
    """[budgets.<provider>]: the budget new conversations of a provider get when none is given."""

    max_cost_usd: NonNegFloat
    #: pause = wait for a raise and `agentctl continue`; stop = close the conversation
    on_reach: Literal["pause", "stop"] = "pause"


# --------------------------------------------------------------------------- providers


class ScriptConfig(_Section):
    """[providers.script]: the in-process script provider.

    ``scripts_dir``: where bare script names are looked up after the workdir
    ("" = ``<state_dir>/scripts``). ``default_script``: the script of a
    conversation opened with an empty model ("" = the built-in echo).
    """

    enabled: bool = True
    scripts_dir: str = ""
    default_script: str = ""
    #: extra environment for the commands a script's tools run (agentd's own, less other providers' keys)
    env: Environment = {}

    def __post_init__(self) -> None:
        _check_path(self.scripts_dir, "scripts_dir")


class ByokConfig(_Section, kw_only=True):
    """[providers.copilot.byok]: bring-your-own-key model provider (no GitHub account needed).

    ``api_key_env`` is the NAME of the environment variable holding the key;
    the key itself is read at runtime start and never stored, logged or echoed.
    """

    type: Literal["openai", "azure", "anthropic"]
    base_url: Annotated[str, msgspec.Meta(min_length=1)]
    #: "" = the endpoint needs no key (a local model server)
    api_key_env: Annotated[str, msgspec.Meta(pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")] = ""
    wire_api: Literal["completions", "responses"] = "completions"
    model: Annotated[str, msgspec.Meta(min_length=1)]
    #: more model names the endpoint serves, offered by `agentctl models copilot` besides ``model``
    models: list[Annotated[str, msgspec.Meta(min_length=1)]] = []


class CopilotConfig(_Section):
    """[providers.copilot]: GitHub Copilot CLI through github-copilot-sdk."""

    enabled: bool = True
    #: path of the `copilot` executable; "" = `copilot` on PATH (the SDK is never allowed to download one)
    cli_path: str = ""
    #: default model for new conversations; "" = the runtime's default
    model: str = ""
    #: extra environment for the CLI process
    env: Environment = {}
    #: COPILOT_HOME for the CLI (its config and session state); "" = the CLI's default
    copilot_home: str = ""
    byok: ByokConfig | None = None

    def __post_init__(self) -> None:
        _check_path(self.copilot_home, "copilot_home")


class ClaudeConfig(_Section):
    """[providers.claude]: Claude Code through claude-agent-sdk."""

    enabled: bool = True
    #: path of the `claude` executable; "" = the one bundled in the SDK wheel
    cli_path: str = ""
    #: default model for new conversations; "" = the runtime's default
    model: str = ""
    #: more model names to offer besides Claude Code's aliases (full names, e.g. "claude-sonnet-4-5-20250929")
    models: list[Annotated[str, msgspec.Meta(min_length=1)]] = []
    #: extra environment for the CLI process
    env: Environment = {}
    #: NAME of the environment variable holding the Anthropic API key ("" = none: the CLI's own login);
    #: the key is passed to the CLI as ANTHROPIC_API_KEY and never logged, journaled or shown
    api_key_env: Annotated[str, msgspec.Meta(pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")] = "ANTHROPIC_API_KEY"
    #: ANTHROPIC_BASE_URL for the CLI (a gateway or proxy); "" = Anthropic's API
    base_url: str = ""
    #: CLAUDE_CONFIG_DIR for the CLI (its settings and session transcripts); "" = the CLI's default (~/.claude)
    config_dir: str = ""

    def __post_init__(self) -> None:
        _check_path(self.config_dir, "config_dir")


class CodexModelProviderConfig(_Section, kw_only=True):
    """[providers.codex.model_provider]: the model endpoint Codex calls (a ``[model_providers.<id>]`` of Codex).

    agentd passes it to ``codex app-server`` as ``-c`` overrides, so Codex's
    own config.toml is never written. ``api_key_env`` is the NAME of the
    environment variable holding the key (Codex's ``env_key``); the key is
    read by Codex from its environment and never stored or logged by agentd.
    """

    #: the provider id in Codex's config ("model_provider = <id>")
    id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]+$")] = "agentd"
    #: e.g. "https://api.openai.com/v1" or a local server's "http://127.0.0.1:8000/v1"
    base_url: Annotated[str, msgspec.Meta(min_length=1)]
    #: "" = the endpoint needs no key
    api_key_env: Annotated[str, msgspec.Meta(pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$")] = ""
    #: Codex speaks only the Responses API to a custom endpoint
    wire_api: Literal["responses"] = "responses"
    #: retries of a failed request / a dropped stream; None = Codex's defaults
    request_max_retries: Annotated[int, msgspec.Meta(ge=0)] | None = None
    stream_max_retries: Annotated[int, msgspec.Meta(ge=0)] | None = None


class CodexConfig(_Section):
    """[providers.codex]: OpenAI Codex CLI, spoken to as ``codex app-server`` over its stdio."""

    enabled: bool = True
    #: path of the `codex` executable; "" = `codex` on PATH
    cli_path: str = ""
    #: CODEX_HOME for the app-server (its settings, threads and logs); "" = <state_dir>/providers/codex/home,
    #: so the daemon never shares state with an interactive Codex by accident
    codex_home: str = ""
    #: default model for new conversations; "" = Codex's default (or the endpoint's, with model_provider)
    model: str = ""
    #: when Codex asks before running a command or changing files: on-request (Codex's default) or never
    approval_policy: Literal["on-request", "never"] = "on-request"
    #: Codex's sandbox for commands: read-only, workspace-write, danger-full-access
    sandbox: Literal["read-only", "workspace-write", "danger-full-access"] = "workspace-write"
    #: extra environment for the app-server process
    env: Environment = {}
    #: more Codex settings as `-c` overrides, each "dotted.key=<TOML value>", e.g. "features.plugins=false"
    overrides: list[Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.-]+=")]] = []
    #: seconds the app-server gets to start: initialize plus thread/start or thread/resume
    startup_timeout_s: PosFloat = 60.0
    #: seconds cancel waits for Codex to end the turn after turn/interrupt before ending it itself
    cancel_timeout_s: PosFloat = 5.0
    model_provider: CodexModelProviderConfig | None = None

    def __post_init__(self) -> None:
        _check_path(self.codex_home, "codex_home")


class AcpAgentConfig(_Section):
    """[providers.acp.<name>]: one Agent Client Protocol agent, spoken to over its stdio."""

    #: argv of the agent, e.g. ["gemini", "--experimental-acp"]
    command: Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(min_length=1)]
    #: extra environment for the agent process
    env: Environment = {}
    #: variables of agentd's environment the agent gets although another provider claims them as its key
    #: (providers.claude.api_key_env, providers.copilot.byok.api_key_env); by default they are withheld
    pass_env: list[EnvName] = []
    #: workdir = start the agent process in the conversation's working directory;
    #: shared = one process for all conversations, cwd passed per session only
    cwd_policy: Literal["workdir", "shared"] = "workdir"
    enabled: bool = True
    #: name shown by `agentctl providers`; "" = the agent's own name, else "ACP: <name>"
    display_name: str = ""
    #: fs/read_text_file of a missing file: error = a JSON-RPC error; empty = empty content (Gemini CLI needs it)
    missing_file: Literal["error", "empty"] = "error"
    #: seconds the agent gets to start: initialize plus session/new, session/load or session/resume
    startup_timeout_s: PosFloat = 60.0
    #: seconds cancel waits for the agent to end the turn after session/cancel before ending it itself
    cancel_timeout_s: PosFloat = 5.0
    #: stop the agent after a cancelled turn; the next prompt starts it again and loads or resumes the
    #: session (for agents whose next turn after a cancel is out of step, like claude-agent-acp 0.23.1)
    restart_after_cancel: bool = False
    #: session mode to set on new conversations (an id the agent offers, e.g. "yolo"); "" = the agent's default
    mode: str = ""
    #: model for new conversations when the open request names none; "" = the agent's default
    model: str = ""
    #: the agent takes stdio MCP servers, as ACP says every agent must; false for one that refuses them
    #: (copilot --acp 1.0.102 takes only HTTP and SSE): its conversations then get HTTP servers only
    #: (where it advertises mcpCapabilities.http), and capability mcp is false
    mcp_stdio: bool = True


class ProvidersConfig(_Section):
    """[providers]: one table per provider; acp holds one table per configured agent."""

    #: the provider of `agentctl new` / `run` / `task create` without -p: script, copilot, claude,
    #: codex or acp:<name>; "" = -p is required
    default: str = ""

    script: ScriptConfig = msgspec.field(default_factory=ScriptConfig)
    copilot: CopilotConfig = msgspec.field(default_factory=CopilotConfig)
    claude: ClaudeConfig = msgspec.field(default_factory=ClaudeConfig)
    codex: CodexConfig = msgspec.field(default_factory=CodexConfig)
    acp: dict[Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]+$")], AcpAgentConfig] = {}


# --------------------------------------------------------------------------- mcp


McpName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class McpServerConfig(_Section):
    """[mcp.servers.<name>]: one MCP server agentd hands to conversations' runtimes (agentd.mcp).

    Either ``command`` (with ``args``, ``env``: a stdio server the runtime starts) or ``url``
    (with ``headers``: a streamable HTTP server), not both. Values in ``env`` under a secret's
    name (``*_TOKEN``, ``*_KEY``, ...) and every ``headers`` value are secrets: masked wherever
    agentd writes or sends text, never journaled, shown or logged.
    """

    command: str = ""
    args: list[str] = []
    env: Environment = {}
    url: str = ""
    headers: dict[Annotated[str, msgspec.Meta(min_length=1)], str] = {}
    #: the providers whose new conversations get this server by default (e.g. ["claude", "acp:gemini"]);
    #: [] = every provider; a conversation may still name it with `agentctl new --mcp` on any MCP-capable one
    providers: list[Annotated[str, msgspec.Meta(min_length=1)]] = []
    #: false = given only to conversations that name it (`--mcp NAME`), never by default
    default: bool = True

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.url):
            raise ValueError("set either command (a stdio server) or url (an HTTP server)")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} is not http:// or https://")
        if self.command and self.headers:
            raise ValueError("headers are for an HTTP server (url), not a stdio one")
        if self.url and (self.args or self.env):
            raise ValueError("args and env are for a stdio server (command), not an HTTP one")


class McpConfig(_Section):
    """[mcp]: MCP servers and host tools (agentd.mcp, agentd.host_tools)."""

    servers: dict[McpName, McpServerConfig] = {}
    #: per provider, the servers its new conversations get when `agentctl new` names none
    #: (overrides each server's `providers`/`default`), e.g. `claude = ["github"]`
    defaults: dict[Annotated[str, msgspec.Meta(min_length=1)], list[McpName]] = {}
    #: offer host tools (`agentctl tool serve`) to every conversation on an MCP-capable runtime, through
    #: agentd's own MCP server "agentd" (a stdio relay each runtime starts; agentd.host_tools)
    host_tools: bool = False
    #: seconds a host tool call waits for the client serving the tool before it fails
    host_tool_timeout_s: PosFloat = 60.0
    #: UTF-8 bytes of a host tool's result kept in its journaled tool item (the agent gets it whole)
    host_tool_result_bytes: Annotated[int, msgspec.Meta(ge=256)] = 16384


# --------------------------------------------------------------------------- root


class Paths(msgspec.Struct, frozen=True):
    """Absolute paths with defaults and environment overrides applied."""

    state_dir: pathlib.Path
    runtime_dir: pathlib.Path
    socket: pathlib.Path
    token_file: pathlib.Path


def _env_path(environ: Mapping[str, str], name: str) -> pathlib.Path | None:
    value = environ.get(name, "")
    return pathlib.Path(value).expanduser().absolute() if value else None


def _file_path(value: str) -> pathlib.Path | None:
    return pathlib.Path(value).expanduser() if value else None


class Config(_Section):
    """The whole agentd.toml; ``Config()`` is every default."""

    daemon: DaemonConfig = msgspec.field(default_factory=DaemonConfig)
    journal: JournalConfig = msgspec.field(default_factory=JournalConfig)
    leases: LeasesConfig = msgspec.field(default_factory=LeasesConfig)
    store: StoreConfig = msgspec.field(default_factory=StoreConfig)
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    websocket: WebSocketConfig = msgspec.field(default_factory=WebSocketConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    interactions: InteractionsConfig = msgspec.field(default_factory=InteractionsConfig)
    runtimes: RuntimesConfig = msgspec.field(default_factory=RuntimesConfig)
    tasks: TasksConfig = msgspec.field(default_factory=TasksConfig)
    providers: ProvidersConfig = msgspec.field(default_factory=ProvidersConfig)
    attachments: AttachmentsConfig = msgspec.field(default_factory=AttachmentsConfig)
    agent_files: AgentFilesConfig = msgspec.field(default_factory=AgentFilesConfig)
    checkpoints: CheckpointsConfig = msgspec.field(default_factory=CheckpointsConfig)
    mcp: McpConfig = msgspec.field(default_factory=McpConfig)
    pricing: dict[Annotated[str, msgspec.Meta(min_length=1)], PricingConfig] = {}
    budgets: dict[Annotated[str, msgspec.Meta(min_length=1)], BudgetConfig] = {}
    agentctl: AgentctlConfig = msgspec.field(default_factory=AgentctlConfig)

    def resolved_paths(self, environ: Mapping[str, str] | None = None) -> Paths:
        """The daemon's paths, absolute, ``~`` expanded; creates nothing.

        Precedence per path: environment (``AGENTD_STATE_DIR``,
        ``AGENTD_RUNTIME_DIR``, ``AGENTD_SOCKET``; empty = unset; relative values
        are taken from the current directory), then the file, then the default:
        state_dir = platformdirs user_state_dir("agentd"), runtime_dir =
        user_runtime_dir("agentd"), socket = <runtime_dir>/agentd.sock,
        token_file = <runtime_dir>/ws-token. ``environ`` defaults to os.environ.
        """
        env = os.environ if environ is None else environ
        d = self.daemon
        state = _env_path(env, ENV_STATE_DIR) or _file_path(d.state_dir)
        if state is None:
            state = pathlib.Path(platformdirs.user_state_dir(APP_NAME))
        runtime = _env_path(env, ENV_RUNTIME_DIR) or _file_path(d.runtime_dir)
        if runtime is None:
            runtime = pathlib.Path(_trust.user_runtime_dir(APP_NAME))
        sock = _env_path(env, ENV_SOCKET) or _file_path(d.socket) or runtime / "agentd.sock"
        token = _file_path(self.websocket.token_file) or runtime / "ws-token"
        return Paths(state_dir=state, runtime_dir=runtime, socket=sock, token_file=token)


# --------------------------------------------------------------------------- loading


def default_config_path() -> pathlib.Path:
    """<platformdirs user_config_dir("agentd")>/agentd.toml, e.g. ~/.config/agentd/agentd.toml."""
    return pathlib.Path(platformdirs.user_config_dir(APP_NAME)) / "agentd.toml"


def load_config(path: pathlib.Path | None = None) -> Config:
    """Read and validate agentd.toml.

    ``path`` None means :func:`default_config_path` when that file exists, else
    ``Config()`` (all defaults). An explicit path must exist. Raises
    :class:`ConfigError` for a missing or unreadable file, invalid UTF-8, a TOML
    syntax error (with line and column), an unknown key, or a value of the
    wrong type or out of range (with its dotted key path), and for a file
    or directory that breaks the trust rule of :mod:`agentd._trust` (a symlink,
    another user's, writable by group or others).
    """
    if path is None:
        path = default_config_path()
        if not os.path.lexists(path):
            return Config()
    path = pathlib.Path(path)
    try:
        raw = _trust.check_config_file(path)
    except FileNotFoundError:
        raise ConfigError("file not found", path=path) from None
    except _trust.Untrusted as e:
        raise ConfigError(f"its directory {e.path}: {e.problem}" if e.what == "config dir" else e.problem,
                          path=path) from None
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror or e}", path=path) from None
    return parse_config(raw, path=path)


_SYNTAX_AT = re.compile(r"^(?P<msg>.*) \(at line (?P<line>\d+), column (?P<col>\d+)\)$", re.S)


def parse_config(text: bytes | str, *, path: pathlib.Path | None = None) -> Config:
    """Validate TOML text as a :class:`Config`; ``path`` only names it in errors.

    Equivalent to ``msgspec.toml.decode(text, type=Config)``, with errors turned
    into :class:`ConfigError`.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"not UTF-8 (byte {e.start})", path=path) from None
    if text.startswith("\ufeff"):
        raise ConfigError("starts with a byte order mark (U+FEFF, as some Windows editors write): save it as "
                          "UTF-8 without one", path=path, line=1, column=1)
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise ConfigError("TOML nested too deeply to read", path=path) from None
    except tomllib.TOMLDecodeError as e:
        m = _SYNTAX_AT.match(str(e))
        if m:
            raise ConfigError(
                f"TOML syntax error: {m['msg']}", path=path, line=int(m["line"]), column=int(m["col"])
            ) from None
        raise ConfigError(f"TOML syntax error: {e}", path=path) from None
    try:
        config = msgspec.convert(data, Config)
    except msgspec.ValidationError as e:
        raise _validation_error(str(e), data, path) from None
    _check_references(config, path)
    return config


# --------------------------------------------------------------------------- values that must name something


def provider_names(providers: ProvidersConfig) -> list[str]:
    """Every provider the config declares (enabled or not): the built-in ones and ``acp:<name>``."""
    return ["script", "copilot", "claude", "codex", *(f"acp:{n}" for n in providers.acp)]


def _did_you_mean(value: str, known: list[str]) -> str:
    close = difflib.get_close_matches(value, known, n=1, cutoff=0.6)
    return f"did you mean {_show(close[0])}? " if close else ""


def _known_mime_types() -> set[str]:
    """MIME types agentd's attachment sniffing can give a file (agentd.attachments)."""
    import mimetypes

    mimetypes.init()
    known = {t.lower() for t in mimetypes.types_map.values()}
    known |= {t.lower() for t in mimetypes.common_types.values()}
    known |= set(DEFAULT_ATTACHMENT_TYPES) | {"text/plain", "application/octet-stream", "image/webp",
                                              "application/x-yaml", "application/sql", "image/svg+xml"}
    return known


#: top-level MIME types (RFC 6838) a ``type/*`` pattern may name
_MIME_TOP = ("application", "audio", "font", "image", "message", "model", "multipart", "text", "video")


def _check_references(config: Config, path: pathlib.Path | None) -> None:
    """Names and values that must exist somewhere else: a typo would silently turn a setting off
    (a budget that applies to no provider, an attachment type nothing ever has). Raises ConfigError
    with the key path, what is known, and the closest match."""
    names = provider_names(config.providers)
    listed = ", ".join(names)

    def no_provider(name: str) -> str:
        return f"no provider {_show(name)}: {_did_you_mean(name, names)}providers: {listed}"

    for key, table in (("budgets", config.budgets), ("tasks.provider_concurrency", config.tasks.provider_concurrency)):
        for name in table:
            if name not in names:
                raise ConfigError(no_provider(name), path=path, key=f"{key}.{_toml_key(name)}")
    servers = list(config.mcp.servers)
    if "agentd" in config.mcp.servers:
        raise ConfigError("the name is agentd's own (its host-tool server)", path=path, key="mcp.servers.agentd")
    for provider, chosen in config.mcp.defaults.items():
        if provider not in names:
            raise ConfigError(no_provider(provider), path=path, key=f"mcp.defaults.{_toml_key(provider)}")
        for i, name in enumerate(chosen):
            if name not in config.mcp.servers:
                raise ConfigError(f"no MCP server {_show(name)}: {_did_you_mean(name, servers)}servers: "
                                  f"{', '.join(servers) or 'none'}", path=path,
                                  key=f"mcp.defaults.{_toml_key(provider)}[{i}]")
    for server_name, server in config.mcp.servers.items():
        for i, provider in enumerate(server.providers):
            if provider not in names and not any(ch in provider for ch in "*?["):  # a glob (acp:*) may match later
                raise ConfigError(no_provider(provider), path=path, key=f"mcp.servers.{_toml_key(server_name)}.providers[{i}]")
    default = config.providers.default
    if default and default not in names:
        raise ConfigError(f"{_show(default)} is not a provider: {_did_you_mean(default, names)}providers: {listed}",
                          path=path, key="providers.default")
    known: set[str] | None = None
    for i, pattern in enumerate(config.attachments.allowed_types):
        p = pattern.strip().lower()
        if p in ("*", "*/*"):
            continue
        top, slash, sub = p.partition("/")
        if slash and sub == "*":
            if top in _MIME_TOP:
                continue
            hint = _did_you_mean(top, list(_MIME_TOP)).replace('"?', '/*"?')
            raise ConfigError(f"{_show(pattern)} names no MIME type: {hint}a pattern is type/* with a type of "
                              f"{', '.join(_MIME_TOP)}", path=path, key=f"attachments.allowed_types[{i}]")
        if known is None:
            known = _known_mime_types()
        if p not in known:
            raise ConfigError(f"{_show(pattern)} is not a MIME type agentd knows: "
                              f"{_did_you_mean(p, sorted(known))}write type/subtype (e.g. \"text/markdown\"), "
                              "type/* or */*", path=path, key=f"attachments.allowed_types[{i}]")


# --------------------------------------------------------------------------- error paths

_AT = re.compile(r"^(?P<msg>.*?) - at (?:`key` in )?`(?P<path>\$[^`]*)`$", re.S)
_KEY_IN = re.compile(r" - at `key` in `")
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\.\.\.|\d+)\]")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]*)`$")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(name: str) -> str:
    return name if _BARE_KEY.match(name) else '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _unwrap(tp: Any) -> Any:
    """Strip Annotated and Optional from a type annotation."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _choices(tp: Any) -> tuple[Any, ...] | None:
    """The allowed values of a Literal or Enum type (or a union of them), else None."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return tuple(a.value if isinstance(a, enum.Enum) else a for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tuple(m.value for m in tp)
    if origin is Annotated:
        return _choices(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            sub = _choices(arg)
            if sub is None:
                return None
            out.extend(v for v in sub if v not in out)
        return tuple(out) or None
    return None


def _show(value: Any) -> str:
    """A value as written in TOML (strings double-quoted), or what kind of value it is."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return repr(value)


def _not_one_of(value: Any, choices: tuple[Any, ...], *, known: bool = True) -> str:
    """``"x" is not one of "a", "b"``; for a table or array ``must be one of "a", "b", not a table``."""
    allowed = ", ".join(_show(c) for c in choices)
    if not known:
        return f"must be one of {allowed}"
    if isinstance(value, (dict, list)):
        return f"must be one of {allowed}, not {_show(value)}"
    return f"{_show(value)} is not one of {allowed}"


_MISSING_NODE: Any = object()


def _fails(value: Any, tp: Any) -> bool:
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError:
        return True
    return False


def _validation_error(message: str, data: Any, path: pathlib.Path | None) -> ConfigError:
    """Turn msgspec's ``... - at `$.a[...].b``` into a ConfigError with a TOML key path.

    msgspec writes dict keys as ``[...]``; they are found again by validating
    each entry of that table against its value type. A value (or table key) that
    must be one of a fixed set (a Literal or Enum type) is reported with that set:
    ``"sometimes" is not one of "always", "batch", "never"``.
    """
    in_key = bool(_KEY_IN.search(message))
    m = _AT.match(message)
    reason, jpath = (m["msg"], m["path"]) if m else (message, "$")
    parts: list[str] = []
    node: Any = data
    tp: Any = Config
    for seg in _SEGMENT.finditer(jpath[1:]):
        name, index = seg.group(1), seg.group(2)
        if name is not None:
            parts.append(_toml_key(name))
            node = node.get(name, _MISSING_NODE) if isinstance(node, dict) else _MISSING_NODE
            hints = typing.get_type_hints(tp, include_extras=True) if isinstance(tp, type) else {}
            tp = _unwrap(hints.get(name, Any))
        elif index == "...":
            args = typing.get_args(tp)
            vtype = args[1] if len(args) == 2 else Any
            found = None
            if isinstance(node, dict):
                found = next((k for k, v in node.items() if _fails(v, vtype)), None)
            parts.append(_toml_key(found) if found is not None else "<?>")
            node = node.get(found, _MISSING_NODE) if isinstance(node, dict) and found is not None else _MISSING_NODE
            tp = _unwrap(vtype)
        else:
            parts[-1] += f"[{index}]"
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else _MISSING_NODE
            args = typing.get_args(tp)
            tp = _unwrap(args[0]) if args else Any
    if in_key:
        # The offending item is a key of the table at the path: find it.
        args = typing.get_args(tp)
        ktype = args[0] if args else str
        bad = next((k for k in node if _fails(k, ktype)), None) if isinstance(node, dict) else None
        if bad is not None:
            parts.append(_toml_key(bad))
            choices = _choices(_unwrap(ktype))
            detail = _not_one_of(bad, choices) if choices else reason.replace("Expected `str` matching", "must match")
            reason = f"invalid key name ({detail})"
        return ConfigError(reason, path=path, key=".".join(parts))
    u = _UNKNOWN.match(reason)
    if u:
        parts.append(_toml_key(u["name"]))
        hint = ""
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            close = difflib.get_close_matches(u["name"], tp.__struct_fields__, n=1)
            hint = f"did you mean {close[0]}?" if close else ""
        return ConfigError(hint, path=path, key=".".join(parts), unknown=True)
    if parts and parts[-1] == "api_key_env":
        reason = "must be the NAME of the environment variable holding the key (e.g. OPENAI_API_KEY), not the key"
    choices = _choices(tp)
    mm = _MISSING.match(reason)
    if choices:
        # msgspec says "Invalid enum value 'x'" or "Expected `str`, got `int`": name the allowed values instead.
        reason = _not_one_of(node, choices, known=node is not _MISSING_NODE)
    elif mm:
        parts.append(_toml_key(mm["name"]))
        reason = "missing required key"
    elif isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        # A __post_init__ rule ("state_dir must be ..."): name the key it is about, not just its section.
        first = reason.split(" ", 1)[0]
        if first in tp.__struct_fields__:
            parts.append(_toml_key(first))
    return ConfigError(reason, path=path, key=".".join(parts))
