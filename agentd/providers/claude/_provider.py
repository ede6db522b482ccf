"""The ``claude`` provider: Claude Code driven through ``claude-agent-sdk``.

One CLI process per open conversation (a ``ClaudeSDKClient`` kept open
between turns), started when the conversation opens and again by the next
``send`` after it died. The SDK is anyio-based and runs on the trio thread;
it is imported lazily, in a worker thread, on first use (it takes seconds
to import), so the daemon's start-up does not pay for it.

The CLI runs with the conversation's workdir as its cwd and this
environment, on top of the daemon's: ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``,
``DISABLE_AUTOUPDATER``, ``DISABLE_TELEMETRY`` and ``DISABLE_ERROR_REPORTING``
set to 1, then ``providers.claude.env``, then ``ANTHROPIC_API_KEY`` (read
from the variable ``api_key_env`` names; registered as a secret, never
logged or journaled), ``ANTHROPIC_BASE_URL`` (``base_url``) and
``CLAUDE_CONFIG_DIR`` (``config_dir``) when set.

Conversation ids are Claude Code session ids (UUIDs). A new conversation
starts the CLI with ``--session-id <id>``; a reopen resumes it
(``--resume <id>``) when the CLI's transcript
``<config dir>/projects/*/<id>.jsonl`` exists. ``<state_dir>/providers/<name>/<id>.json``
keeps what the CLI does not (workdir, model, effort, the running cost, tools
allowed for the conversation), so a conversation opened but never prompted
reopens too. An id with neither, or a prompted one whose transcript is gone,
raises ConversationNotFound.

Restarts are paced by the shared restart backoff (:mod:`.._restart`), one
slot per conversation id (a new conversation's first process counts for the
provider's slot "" until it is up): after a CLI process exits on its own, or
fails to start, the next start of that conversation's CLI waits 1 s,
doubling to 60 s; a request with more than 10 s of it left fails at once
with ``RuntimeRestarting``. A completed turn starts it over.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.util
import itertools
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
import trio

from ... import _fsutil, procs, runtime_output
from ..._fsutil import atomic_write, make_dirs, read_file
from ...contract import (
    Account,
    Capabilities,
    ContextTier,
    Closed,
    ConversationNotFound,
    EventSink,
    HistoryRecord,
    Invalid,
    Item,
    Model,
    McpServer,
    OpenRequest,
    PreviousConversation,
    RuntimeUnavailable,
    Usage,
    utcnow,
)
from ...write_behind import WriteBehind
from .._restart import RestartBackoff, RestartPolicy
from . import _mapping as m
from ._conversation import EFFORTS, ClaudeConversation, _Session

if TYPE_CHECKING:
    from ...config import ClaudeConfig

log = structlog.get_logger(__name__)

#: Environment every CLI process gets (``providers.claude.env`` may override it).
DEFAULT_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}

NOT_FOUND_MESSAGE = (
    "Claude Code not found: install it with `pip install claude-agent-sdk` (the wheel bundles it) "
    "or set providers.claude.cli_path"
)


def _register_secret(value: str) -> None:
    from ...logs import register_secret

    register_secret(value)


def bundled_cli() -> str:
    """The Claude Code binary bundled in the installed claude-agent-sdk wheel, or "" (no import)."""
    try:
        spec = importlib.util.find_spec("claude_agent_sdk")
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.submodule_search_locations:
        return ""
    for base in spec.submodule_search_locations:
        exe = Path(base) / "_bundled" / ("claude.exe" if os.name == "nt" else "claude")
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    return ""


def resolve_cli_path(cli_path: str, env: dict[str, str] | None = None) -> str:
    """The Claude Code executable: ``cli_path`` (a path, or a name on PATH), else the
    wheel's bundled binary, else ``claude`` on PATH. Raises RuntimeUnavailable."""
    path_var = (env or {}).get("PATH") or os.environ.get("PATH")
    if cli_path:
        candidate = os.path.expanduser(cli_path)
        if os.sep not in candidate:
            candidate = shutil.which(candidate, path=path_var) or candidate
        if not os.path.isfile(candidate) or not os.access(candidate, os.X_OK):
            raise RuntimeUnavailable(f"providers.claude.cli_path {cli_path!r} is not an executable file")
        return candidate
    found = bundled_cli() or shutil.which("claude", path=path_var) or ""
    if not found:
        raise RuntimeUnavailable(NOT_FOUND_MESSAGE)
    return found


_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
#: The model aliases Claude Code takes (``claude --help``: "an alias for the latest model"), with
#: the context tiers it offers for them (``<alias>[1m]`` selects the 1M-token window) and their
#: relative cost. A full model name works too: name it in providers.claude.models.
ALIASES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "default": ("Default (the account's recommended model)", (), ""),
    "sonnet": ("Claude Sonnet, latest", ("200k", "1m"), "medium"),
    "opus": ("Claude Opus, latest", ("200k", "1m"), "high"),
    "haiku": ("Claude Haiku, latest", ("200k",), "low"),
    "opusplan": ("Opus in plan mode, else Sonnet", (), "high"),
}
_TIER_TOKENS = {"200k": 200_000, "1m": 1_000_000}


def model_for_tier(model: str, tier: str) -> str:
    """The model name Claude Code takes for ``model`` at context tier ``tier`` (``sonnet[1m]``)."""
    base = model.removesuffix("[1m]")
    return f"{base}[1m]" if tier == "1m" else base


def _session_id(value: str) -> str:
    """``value`` as a canonical UUID string; ConversationNotFound when it is none."""
    try:
        return str(uuid.UUID(value))
    except (ValueError, AttributeError, TypeError):
        raise ConversationNotFound(f"{value!r} is not a Claude Code session id (a UUID)") from None


class _Record(msgspec.Struct, omit_defaults=True):
    """``<state_dir>/providers/<name>/<id>.json``: what a reopen needs beyond the CLI's transcript."""

    id: str
    workdir: str
    model: str = ""
    effort: str = ""
    #: the conversation's running cost as reported by Claude Code
    cost_usd: float | None = None
    #: tools the user allowed for the whole conversation (allow_always)
    allowed_tools: list[str] = []
    #: a prompt was handed to the CLI: from then on its transcript must exist for a reopen
    prompted: bool = False
    #: a fork (agentd.branching): the session it was forked from, until its own transcript exists
    fork_from: str = ""
    #: the transcript entry a process resumes at (``resume_session_at``): set by a fork or a
    #: rewind, then moved to each completed turn's last entry
    resume_at: str = ""
    created_at: _dt.datetime | None = None
    updated_at: _dt.datetime | None = None


def _mcp_config(server: McpServer) -> dict[str, Any]:
    """An MCP server as the SDK's ``mcp_servers`` takes it (Claude Code's ``--mcp-config``)."""
    if server.transport == "http":
        return {"type": "http", "url": server.url, "headers": dict(server.headers)}
    return {"type": "stdio", "command": server.command, "args": list(server.args), "env": dict(server.env)}


#: How long a record whose running cost alone changed (every turn's) may wait to be written: the
#: turns ending meanwhile cost one write. A crash loses at most that much of the cost in it (a
#: resumed CLI reports the session's total again; agentd's journal has every turn's usage).
COST_WRITE_DELAY_S = 2.0

_record_decoder = msgspec.json.Decoder(_Record)
_encoder = msgspec.json.Encoder()


class ClaudeProvider:
    """Claude Code as an agentd provider; implements :class:`agentd.contract.Provider`
    (and ``AccountReader``). See the module docstring.

    Build it with the ``[providers.claude]`` section, the daemon's state dir
    and the provider's name; run :meth:`run` in a nursery for its whole life.
    """

    display_name = "Claude Code"
    #: how ``in_use`` is told (agentctl import)
    in_use_check = "true while a live Claude Code process names the session in <config dir>/sessions/<pid>.json"

    def __init__(self, config: ClaudeConfig, *, state_dir: Path, name: str = "claude",
                 restart_policy: RestartPolicy | None = None) -> None:
        self.config = config
        self.name = name
        self.state_dir = Path(state_dir)
        self.dir = self.state_dir / "providers" / name
        self._nursery: trio.Nursery | None = None
        self._open: dict[str, ClaudeConversation] = {}
        self._sdk_loaded = False
        #: each record as last written (without updated_at), by id: an unchanged one is not written again
        self._saved: dict[str, bytes] = {}
        #: the same without cost_usd: a record whose cost alone changed is written later
        self._shapes: dict[str, bytes] = {}
        #: records to write later (their cost alone changed), by id; when each is due is in _behind
        self._later: dict[str, _Record] = {}
        self._behind = WriteBehind(COST_WRITE_DELAY_S)
        #: restart backoff: one slot per conversation id; "" for new conversations' first process
        self._restarts = RestartBackoff("Claude Code", provider=name, log_prefix="claude", policy=restart_policy)

    def capabilities(self) -> Capabilities:
        return Capabilities(
            cancel=True,
            steer=True,
            permissions=True,
            questions=True,
            history=True,
            reopen=True,
            models=True,
            set_model=True,
            usage=True,
            context_size=True,
            account=True,
            import_=True,
            commands=True,
            sign_out=True,
            runtime_process=True,
            model_endpoint=True,
            attachments=True,
            fork=True,
            rewind=True,
            mcp=True,
        )

    # ------------------------------------------------------------------ configuration

    @property
    def config_home(self) -> Path:
        """The CLI's config dir (sessions under ``projects/``): config, env, else ~/.claude."""
        home = (self.config.config_dir or (self.config.env or {}).get("CLAUDE_CONFIG_DIR")
                or os.environ.get("CLAUDE_CONFIG_DIR") or "~/.claude")
        return Path(os.path.expanduser(home))

    def _api_key(self) -> str:
        name = self.config.api_key_env
        key = os.environ.get(name, "") if name else ""
        if key:
            _register_secret(key)
        return key

    def cli_env(self) -> dict[str, str]:
        """The environment the CLI gets on top of the daemon's (holds the API key: never log it)."""
        from ...runtime_env import withheld

        # The SDK adds this to agentd's own environment: other providers' secrets are blanked.
        env = dict.fromkeys(sorted(withheld(self.name)), "")
        env.update(DEFAULT_ENV)
        env.update(self.config.env or {})
        key = self._api_key()
        if key:
            env["ANTHROPIC_API_KEY"] = key
        if self.config.base_url:
            env["ANTHROPIC_BASE_URL"] = self.config.base_url
        if self.config.config_dir:
            env["CLAUDE_CONFIG_DIR"] = os.path.expanduser(self.config.config_dir)
        return env

    # ------------------------------------------------------------------ lifetime

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; every CLI process's runner is a task of the nursery owned here.

        On cancellation every CLI process is stopped (stdin closed, then
        SIGTERM/SIGKILL by the SDK) and running turns end ``cancelled``
        (reason ``shutdown``); open conversations become closed.
        """
        if self._nursery is not None:
            raise RuntimeError(f"provider {self.name!r} is already running")
        await trio.to_thread.run_sync(make_dirs, self.dir)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._behind.run, self._write_pending)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            for conv in list(self._open.values()):
                conv._closed = True
                conv._closed_reason = f"provider {self.name!r} stopped"
            self._open.clear()
            with trio.CancelScope(shield=True):
                await self._write_pending()

    def spawn(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` in the provider's nursery; dropped when the provider stopped."""
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    async def start_task(self, fn: Any, *args: Any) -> Any:
        """``nursery.start(fn, *args)`` in the provider's nursery; Closed when it stopped."""
        if self._nursery is None:
            raise Closed(f"provider {self.name!r} is not running")
        return await self._nursery.start(fn, *args)

    def _forget(self, conv: ClaudeConversation) -> None:
        if self._open.get(conv.id) is conv:
            del self._open[conv.id]

    async def _load_sdk(self) -> None:
        """Import claude_agent_sdk in a worker thread (it takes seconds); RuntimeUnavailable if absent."""
        if self._sdk_loaded:
            return
        try:
            await trio.to_thread.run_sync(importlib.import_module, "claude_agent_sdk")
        except ImportError as exc:
            raise RuntimeUnavailable(f"the claude provider needs claude-agent-sdk: {exc}") from None
        self._sdk_loaded = True

    async def check(self) -> None:
        """Raise :class:`RuntimeUnavailable` when the SDK or the CLI is missing."""
        if importlib.util.find_spec("claude_agent_sdk") is None:
            raise RuntimeUnavailable("the claude provider needs the claude-agent-sdk package (pip install claude-agent-sdk)")
        await trio.to_thread.run_sync(resolve_cli_path, self.config.cli_path, self.config.env or {})

    async def models(self) -> list[Model]:
        """The model aliases Claude Code takes (:data:`ALIASES`), each with its effort levels, context
        tiers and cost tier, then the models the config names (``model``, ``models``) in that order.

        Claude Code lists no models of its own offline; a full model name is selectable once the
        config names it.
        """
        await trio.lowlevel.checkpoint()
        out = [Model(id=alias, name=name, efforts=list(EFFORTS),
                     context_tiers=[ContextTier(id=t, tokens=_TIER_TOKENS[t]) for t in tiers], cost_tier=cost)
               for alias, (name, tiers, cost) in ALIASES.items()]
        for extra in [self.config.model, *self.config.models]:
            if extra and all(m.id != extra for m in out):
                out.append(Model(id=extra, name="configured", efforts=list(EFFORTS)))
        return out

    async def _auth_status(self) -> dict[str, Any] | None:
        """``claude auth status --json`` as the CLI answers it, or None when it cannot (offline, it needs no network)."""
        import json

        try:
            cli = await trio.to_thread.run_sync(resolve_cli_path, self.config.cli_path, self.config.env or {})
        except RuntimeUnavailable:
            return None
        env = {**os.environ, **self.cli_env()}
        for name, value in list(env.items()):
            if value == "":  # withheld: blanked for the CLI as the SDK does
                env.pop(name)
        try:
            _, stdout, _ = await procs.run_kept([cli, "auth", "status", "--json"], state_dir=self.state_dir,
                                                what=f"{self.name} auth status", env=env, timeout_s=15)
            data = json.loads(stdout.decode("utf-8", "replace"))
        except (OSError, ValueError, trio.TooSlowError):
            return None
        return data if isinstance(data, dict) else None

    async def account(self) -> Account:
        """How the CLI authenticates, as ``claude auth status`` says (an API key in the variable it
        names, or the CLI's stored login); never the key itself. Without an answer from the CLI:
        read from agentd's environment and the CLI's credentials file."""
        status = await self._auth_status()
        if status is not None:
            name = self.config.api_key_env
            if status.get("loggedIn"):
                method = str(status.get("authMethod") or "")
                var = str(status.get("apiKeySource") or "")
                if method == "api_key" or var:
                    var = name if var == "ANTHROPIC_API_KEY" and name and os.environ.get(name) else var
                    return Account(signed_in=True, source="api_key", env_var=var,
                                   message=f"API key from ${var}" if var else "API key")
                return Account(signed_in=True, source="stored", login=str(status.get("email") or ""),
                               message=f"Claude Code login ({method or 'stored'}) in {self.config_home}")
            hint = f"set ${name}" if name else "set providers.claude.api_key_env"
            return Account(signed_in=False, env_var=name,
                           message=f"no API key and no Claude Code login: {hint} or run `claude auth login`")
        return await self._account_from_files()

    async def sign_out(self) -> Account:
        """``claude auth logout``: remove the CLI's stored login. Invalid while an API key signs it in
        (the key is agentd's environment's, not the CLI's to forget)."""
        current = await self.account()
        if current.signed_in and current.source == "api_key":
            raise Invalid(f"Claude Code uses the API key in ${current.env_var or 'ANTHROPIC_API_KEY'}; "
                          "unset it in agentd's environment to sign out")
        cli = await trio.to_thread.run_sync(resolve_cli_path, self.config.cli_path, self.config.env or {})
        env = {k: v for k, v in {**os.environ, **self.cli_env()}.items() if v != ""}
        status, _, stderr = await procs.run_kept([cli, "auth", "logout"], state_dir=self.state_dir,
                                                 what=f"{self.name} auth logout", env=env, timeout_s=30)
        if status != 0:
            raise Invalid(f"claude auth logout failed: {stderr.decode('utf-8', 'replace').strip()[-300:]}")
        return await self.account()

    async def _account_from_files(self) -> Account:
        name = self.config.api_key_env
        key_set = bool(name and os.environ.get(name))
        creds = await trio.to_thread.run_sync((self.config_home / ".credentials.json").is_file)
        where = f" at {self.config.base_url}" if self.config.base_url else ""
        if key_set:
            return Account(signed_in=True, source="api_key", env_var=name, message=f"API key from ${name}{where}")
        if creds:
            return Account(signed_in=True, source="login", env_var=name, message=f"Claude Code login in {self.config_home}")
        hint = f"set ${name}" if name else "set providers.claude.api_key_env"
        return Account(signed_in=False, env_var=name, message=f"no API key and no Claude Code login: {hint} or run `claude login`")

    # ------------------------------------------------------------------ sessions on disk

    def _session_file(self, session_id: str) -> Path | None:
        """The first ``projects/*/<id>.jsonl`` (by folder name) that is a file: the CLI resumes it."""
        projects = self.config_home / "projects"
        try:
            for path in sorted(projects.glob(f"*/{session_id}.jsonl")):
                if path.is_file():
                    return path
        except OSError:
            return None
        return None

    def _folders(self, workdir: str) -> list[Path]:
        """The project folders that hold ``workdir``'s transcripts: those Claude Code names after it
        (or its real path), else every one ("" too: every one), in name order (blocking)."""
        projects = self.config_home / "projects"
        if workdir:
            # Claude Code names a project's folder after its cwd with every other character a "-"
            slugs = dict.fromkeys(re.sub(r"[^A-Za-z0-9]", "-", p) for p in (workdir, _fsutil.real_path(workdir) or workdir))
            own = [projects / slug for slug in slugs if (projects / slug).is_dir()]
            if own:
                return own
        try:
            return sorted(projects.iterdir())
        except OSError:
            return []

    def _transcript_file(self, session_id: str, workdir: str) -> Path | None:
        """The transcript of ``session_id`` that the listing for ``workdir`` shows: the first in
        :meth:`_folders` whose recorded cwd is ``workdir``; else (no workdir, or none records it)
        :meth:`_session_file`'s (blocking)."""
        if workdir:
            for folder in self._folders(workdir):
                try:
                    head, _ = _head(folder / f"{session_id}.jsonl")
                except OSError:
                    continue
                if _same_dir(head.cwd, workdir):
                    return folder / f"{session_id}.jsonl"
        return self._session_file(session_id)

    async def previous(self, workdir: str) -> list[PreviousConversation]:
        """The CLI's sessions whose transcript (``<config dir>/projects/<slug>/<id>.jsonl``, see
        :meth:`_folders`) records ``workdir`` (same real path) as its cwd ("" = every session),
        newest first by the transcript's mtime; an id in two folders counts once, the first.

        Only transcripts with a prompt are listed (a session opened and never prompted has
        nothing to adopt); of each, its first 4 MiB and last 1 MiB are read, and only a regular
        file (no symlink, FIFO or device). Raises nothing for a missing or unreadable store: it
        lists nothing.
        """

        def scan() -> list[PreviousConversation]:
            out: list[tuple[float, PreviousConversation]] = []
            seen: set[str] = set()
            for folder in self._folders(workdir):
                try:
                    files = sorted(p for p in folder.glob("*.jsonl") if _UUID.match(p.stem))
                except OSError:
                    continue
                for path in files:
                    try:
                        head, mtime = _head(path)
                    except OSError:
                        continue
                    if (workdir and not _same_dir(head.cwd, workdir)) or path.stem in seen:
                        continue
                    seen.add(path.stem)  # adoption reads this one (_transcript_file)
                    if not head.prompted:
                        continue
                    out.append((mtime, PreviousConversation(
                        id=path.stem, title=head.title, workdir=head.cwd, created_at=head.created_at,
                        updated_at=_dt.datetime.fromtimestamp(mtime, _dt.timezone.utc))))
            out.sort(key=lambda t: t[0], reverse=True)
            return [p for _, p in out]

        return await trio.to_thread.run_sync(scan)

    async def in_use(self, ids: list[str]) -> set[str]:
        """The ids among ``ids`` a live Claude Code process names in ``<config dir>/sessions/<pid>.json``
        (agentd.providers._inuse), other than the processes of conversations open here."""
        from .. import _inuse

        own = {pid for conv in self._open.values() if (pid := conv.runtime_pid) is not None}
        return await trio.to_thread.run_sync(lambda: _inuse.claude(self.config_home, ids, own=own))

    async def session_exists(self, session_id: str) -> bool:
        """Whether the CLI has a transcript for ``session_id`` (so ``--resume`` finds it)."""
        return await trio.to_thread.run_sync(self._session_file, session_id) is not None

    async def transcript(self, session_id: str, workdir: str | None = None) -> list[Item] | None:
        """The items of a session's transcript, or None when the CLI has none.

        Reads the file the listing for ``workdir`` shows (:meth:`_transcript_file`; None: the
        workdir of the conversation open here, if any). A line over runtime_output's
        MAX_MESSAGE_BYTES becomes a notice item. Raises ConversationNotFound when the transcript
        is no regular file (a symlink, a FIFO, a device) or cannot be read.
        """
        if workdir is None:
            conv = self._open.get(session_id)
            workdir = conv.workdir if conv is not None else ""

        def read() -> list[Item] | None:
            path = self._transcript_file(session_id, workdir)
            if path is None:
                return None
            try:
                f, st = _fsutil.open_regular(path)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise ConversationNotFound(f"Claude Code's transcript {path} cannot be read: {exc.strerror or exc}") from None
            with f:
                return m.transcript_items(_fsutil.bounded_lines(f, st.st_size, runtime_output.MAX_MESSAGE_BYTES))

        return await trio.to_thread.run_sync(read)

    async def has_entry(self, session_id: str, entry: str) -> bool:
        """Whether the session's transcript holds an entry with uuid ``entry``."""

        def scan() -> bool:
            path = self._session_file(session_id)
            if path is None:
                return False
            needle = f'"uuid":"{entry}"'.encode("utf-8", "replace")
            try:
                f, st = _fsutil.open_regular(path)
            except OSError:
                return False
            with f:
                return any(not isinstance(line, int) and needle in line.replace(b'": "', b'":"')
                           for line in _fsutil.bounded_lines(f, st.st_size, runtime_output.MAX_MESSAGE_BYTES))

        return await trio.to_thread.run_sync(scan)

    async def fork(self, source: str, marker: str, request: OpenRequest) -> str:
        """A new session id forked off session ``source`` at its transcript entry ``marker``.

        Claude Code makes the fork itself when the new conversation's CLI starts
        (``--resume SOURCE --fork-session --session-id NEW --resume-session-at MARKER``);
        until its own transcript exists the record here says where it comes from, so a
        reopen forks again from the same point. Sends nothing. Raises ConversationNotFound
        (no ``source`` transcript), Invalid (no entry ``marker`` in it).
        """
        sid = _session_id(source)
        if not await self.session_exists(sid):
            raise ConversationNotFound(f"Claude Code has no session {sid} (in {self.config_home / 'projects'})")
        if not await self.has_entry(sid, marker):
            raise Invalid(f"Claude Code session {sid} has no transcript entry {marker}")
        src = await self._read_record(sid)
        record = _Record(id=str(uuid.uuid4()), workdir=request.workdir or (src.workdir if src else ""),
                         model=request.model or (src.model if src else "") or self.config.model,
                         effort=request.effort or (src.effort if src else ""),
                         allowed_tools=list(src.allowed_tools) if src else [],
                         fork_from=sid, resume_at=marker, created_at=utcnow())
        await self.save_record(record)
        log.info("claude.forked", provider=self.name, source=sid, at=marker, conversation=record.id)
        return record.id

    def _record_path(self, session_id: str) -> Path:
        return self.dir / f"{session_id}.json"

    async def _read_record(self, session_id: str) -> _Record | None:
        await self._write_pending(session_id)  # what is to be written later is what it says
        path = self._record_path(session_id)
        try:
            data = await trio.to_thread.run_sync(read_file, path)
        except FileNotFoundError:
            return None
        try:
            return _record_decoder.decode(data)
        except msgspec.DecodeError as exc:
            log.warning("claude.record_damaged", path=str(path), error=str(exc))
            return None

    async def forget_record(self, session_id: str) -> None:
        """Delete agentd's record of ``session_id`` (none: nothing happens). Raises OSError."""
        self._saved.pop(session_id, None)
        self._shapes.pop(session_id, None)
        self._forget_later(session_id)
        await trio.to_thread.run_sync(lambda: self._record_path(session_id).unlink(missing_ok=True))
        with contextlib.suppress(Invalid):
            await trio.to_thread.run_sync(lambda: self._mcp_config_path(session_id).unlink(missing_ok=True))

    async def save_record(self, record: _Record, *, now: bool = False) -> None:
        """Write ``record`` atomically (fsynced), unless it is what this provider last wrote for its id
        (then nothing happens: a turn that changed nothing costs no write). Raises OSError.

        A change of the running cost alone (every turn's) is written up to
        :data:`COST_WRITE_DELAY_S` later, once for the turns that end meanwhile, unless ``now``;
        reading the record (a reopen, ``history``), closing its conversation and the provider's
        stop write it first. A failed later write is logged; the next change tries again.
        """
        if not now and self._spared(record):
            await trio.lowlevel.checkpoint()
            return
        same = _encoder.encode(msgspec.structs.replace(record, updated_at=None))
        if self._saved.get(record.id) == same:
            self._forget_later(record.id)
            await trio.lowlevel.checkpoint()
            return
        shape = _encoder.encode(msgspec.structs.replace(record, updated_at=None, cost_usd=None))
        self._forget_later(record.id)
        record.updated_at = utcnow()
        data = _encoder.encode(record)
        path = self._record_path(record.id)

        def write() -> None:
            try:
                atomic_write(path, data)
            except FileNotFoundError:  # its directory is gone (made by run())
                make_dirs(path.parent)
                atomic_write(path, data)

        await trio.to_thread.run_sync(write)
        self._saved[record.id] = same
        self._shapes[record.id] = shape

    def save_soon(self, record: _Record, save: Any) -> None:
        """What a turn's end does: nothing now when ``record`` is as last written or only its cost
        changed (:meth:`save_record` writes that later), else ``save()`` in a task of its own."""
        if not self._spared(record):
            self.spawn(save)

    def _spared(self, record: _Record) -> bool:
        """True when ``record`` needs no write now: unchanged since the last, or its cost alone
        changed (it is then left for the write-behind, due :data:`COST_WRITE_DELAY_S` after the first
        such change)."""
        last = self._shapes.get(record.id)
        if last is None or self._nursery is None:
            return False
        if _encoder.encode(msgspec.structs.replace(record, updated_at=None, cost_usd=None)) != last:
            return False
        if self._saved.get(record.id) == _encoder.encode(msgspec.structs.replace(record, updated_at=None)):
            self._forget_later(record.id)
        else:
            self._later[record.id] = record
            self._behind.mark(record.id)
        return True

    def _forget_later(self, session_id: str) -> None:
        """``session_id``'s record is written now (or need not be): it owes no later write."""
        self._later.pop(session_id, None)
        self._behind.discard(session_id)

    async def _write_pending(self, session_id: str | None = None) -> None:
        """Write the records waiting to be written later (only ``session_id``'s, when given); logs a failure."""
        for record in [r for i, r in self._later.items() if session_id in (None, i)]:
            try:
                await self.save_record(record, now=True)
            except OSError as exc:
                self._later.pop(record.id, None)
                log.warning("claude.record_not_saved", conversation=record.id, error=str(exc))

    # ------------------------------------------------------------------ conversations

    async def options(self, conv: ClaudeConversation, session: _Session, *, resume: bool) -> Any:
        """The SDK options of one CLI process of ``conv`` (resuming its session, or creating it)."""
        from claude_agent_sdk import ClaudeAgentOptions

        def launcher() -> str:
            cli = resolve_cli_path(self.config.cli_path, self.config.env or {})
            # The SDK spawns [cli_path, args...] itself: cli_path is a script running the CLI under agentd's keeper.
            return procs.launch_script([cli], state_dir=self.state_dir, what=self.name)

        servers = {s.name: _mcp_config(s) for s in conv.mcp.servers}
        mcp_config = await trio.to_thread.run_sync(self._write_mcp_config, conv.id, servers) if servers else ""
        return ClaudeAgentOptions(
            cwd=conv.workdir,
            cli_path=await trio.to_thread.run_sync(launcher),
            env=self.cli_env(),
            model=conv.model or None,
            effort=conv.effort or None,  # type: ignore[arg-type]
            # Claude Code's own system prompt (None would send an empty one).
            system_prompt={"type": "preset", "preset": "claude_code"},
            can_use_tool=conv._can_use_tool,
            include_partial_messages=True,
            **self._resume_options(conv, resume),
            stderr=session.on_stderr,
            # The SDK's reader stops at 1 MiB by default: one large tool result would end the session.
            max_buffer_size=runtime_output.MAX_MESSAGE_BYTES,
            # The CLI echoes each user message when it takes it: how a steer is known to be used.
            extra_args={"replay-user-messages": None},
            # A file, not the JSON itself: the SDK would put it, with the servers' env and headers
            # (tokens), on the command line, which every local user reads (/proc/PID/cmdline).
            mcp_servers=mcp_config or {},
        )

    def _mcp_config_path(self, session_id: str) -> Path:
        if not _fsutil.is_safe_name(session_id):
            raise Invalid(f"session id {session_id!r} cannot name a file")
        return self.dir / "mcp" / f"{session_id}.json"

    def _write_mcp_config(self, session_id: str, servers: dict[str, Any]) -> str:
        """Write Claude Code's ``--mcp-config`` file of ``session_id`` (0600 in a 0700 folder of
        agentd's state dir, replaced atomically); its path. Blocking; raises OSError."""
        path = self._mcp_config_path(session_id)
        make_dirs(path.parent)
        atomic_write(path, _encoder.encode({"mcpServers": servers}), durable=False)
        return str(path)

    @staticmethod
    def _resume_options(conv: ClaudeConversation, resume: bool) -> dict[str, Any]:
        """``resume`` / ``session_id`` / fork options of a CLI process (see :meth:`fork`)."""
        record = conv._record
        if not resume and record.fork_from:
            return {"resume": record.fork_from, "fork_session": True, "session_id": conv.id,
                    "resume_session_at": record.resume_at or None}
        if resume:
            return {"resume": conv.id, "resume_session_at": record.resume_at or None}
        return {"session_id": conv.id}

    def start_error(self, session: _Session, exc: BaseException | str) -> Exception:
        """The contract error for a CLI process that could not start."""
        text = str(exc).strip()
        if "No conversation found" in text:
            return ConversationNotFound(f"Claude Code has no such session: {text.split(': ', 1)[-1]}")
        if not isinstance(exc, str) and type(exc).__name__ == "CLINotFoundError":
            return RuntimeUnavailable(f"{NOT_FOUND_MESSAGE} ({text.splitlines()[0] if text else 'not found'})")
        line = session.last_error_line()
        detail = f" ({line})" if line and line not in text else ""
        return RuntimeUnavailable(f"Claude Code could not start: {text}{detail}")

    async def open(self, request: OpenRequest, sink: EventSink) -> ClaudeConversation:
        """Create a conversation, or reopen exactly ``request.conversation_id``; starts its CLI process.

        Raises :class:`ConversationNotFound` when neither the CLI nor agentd
        knows that id (never creates a replacement), :class:`Invalid` for a
        missing workdir or an unknown effort, :class:`RuntimeUnavailable`
        when the SDK or the CLI is missing or the CLI cannot start,
        :class:`Closed` when :meth:`run` is not serving. A conversation with
        the same id already open here is detached (its process stopped).
        """
        if self._nursery is None:
            raise Closed(f"provider {self.name!r} is not running")
        if request.effort and request.effort not in EFFORTS:
            raise Invalid(f"unknown effort {request.effort!r}; Claude Code takes one of: {', '.join(EFFORTS)}")
        await self._load_sdk()
        await trio.to_thread.run_sync(resolve_cli_path, self.config.cli_path, self.config.env or {})
        if request.conversation_id:
            sid = _session_id(request.conversation_id)
            record = await self._read_record(sid)
            exists = await self.session_exists(sid)
            if not exists and (record is None or record.prompted):
                raise ConversationNotFound(f"Claude Code has no session {sid} (in {self.config_home / 'projects'})")
            if record is None:  # a session started outside agentd
                record = _Record(id=sid, workdir=request.workdir, model=request.model or self.config.model,
                                 effort=request.effort, created_at=utcnow())
            if request.workdir:
                record.workdir = request.workdir
            if request.model:
                record.model = model_for_tier(request.model, request.context_tier)
            if request.effort:
                record.effort = request.effort
            old = self._open.pop(sid, None)
            if old is not None:
                await old.detach("the conversation was reopened")
        else:
            record = _Record(id=str(uuid.uuid4()), workdir=request.workdir,
                             model=model_for_tier(request.model or self.config.model, request.context_tier)
                             if request.context_tier else request.model or self.config.model,
                             effort=request.effort, created_at=utcnow())
        if not record.workdir or not await trio.to_thread.run_sync(os.path.isdir, record.workdir):
            raise Invalid(f"workdir {record.workdir!r} is not a directory")
        conv = ClaudeConversation(self, record, sink, request.mcp_servers)
        if not request.conversation_id:
            conv._restart_key = ""  # a new id has no history: pace it with every new conversation's start
        await conv._ensure_session()
        if not request.conversation_id:
            conv._restart_key = record.id
            self._restarts.succeeded("", why="a conversation opened")
        await conv._save_quietly()
        self._open[record.id] = conv
        log.info("claude.opened", provider=self.name, conversation=record.id, reopened=bool(request.conversation_id))
        return conv

    async def history(self, conversation_id: str) -> HistoryRecord:
        """A session's transcript read from the CLI's store, without opening it or starting the CLI.

        Raises :class:`ConversationNotFound` when the CLI has no transcript for the id.
        """
        sid = _session_id(conversation_id)
        record = await self._read_record(sid)
        items = await self.transcript(sid, record.workdir if record is not None else None)
        if items is None:
            raise ConversationNotFound(f"Claude Code has no session {sid} (in {self.config_home / 'projects'})")
        usage = Usage(cost_usd=record.cost_usd) if record is not None and record.cost_usd is not None else None
        return HistoryRecord(items=items, usage=usage, model=record.model if record else "")


# --------------------------------------------------------------------------- reading transcripts

#: The listing reads a transcript's first 4 MiB (its folder, start and first prompt, which may
#: hold a pasted image) and last 1 MiB (a later /rename title), never all of it
_HEAD_BYTES = 4 << 20
_TAIL_BYTES = 1 << 20


def _same_dir(recorded: str, workdir: str) -> bool:
    """Whether a transcript's recorded cwd is ``workdir`` (the same string or real path; blocking)."""
    if recorded == workdir:
        return True
    real = _fsutil.real_path(workdir)
    return bool(recorded) and real is not None and _fsutil.real_path(recorded) == real


def _head(path: Path) -> tuple[m.SessionHead, float]:
    """What the listing shows of the transcript at ``path`` (its start and end only), and its mtime.
    OSError as :func:`agentd._fsutil.open_regular`; blocking."""
    f, st = _fsutil.open_regular(path)
    with f:
        size = st.st_size
        if size <= _HEAD_BYTES + _TAIL_BYTES:
            return m.session_head(_fsutil.bounded_lines(f, size, max(size, 1))), st.st_mtime
        head = list(_fsutil.bounded_lines(f, _HEAD_BYTES, _HEAD_BYTES))
        f.seek(size - _TAIL_BYTES - 1)
        at_start = f.read(1) == b"\n"
        tail = _fsutil.bounded_lines(f, size, _TAIL_BYTES)
        if not at_start:
            next(tail, None)  # the rest of the line the seek fell into
        return m.session_head(itertools.chain(head, tail)), st.st_mtime
