"""The ``acp`` provider: any Agent Client Protocol agent, spoken to over its stdio.

One provider per ``[providers.acp.<agent>]`` table, named ``acp:<agent>``. With
``cwd_policy = "workdir"`` (the default) each conversation has its own agent
process started in the conversation's workdir; with ``"shared"`` one process
serves every conversation and the workdir is passed per session only.

A conversation's id here is the agent's ACP session id (agentd's own conversation id maps to it
through the conversation record's ``provider_conversation_id``). agentd keeps, under
``<state_dir>/providers/acp/<agent>/conversations/``, one small record per
conversation (its workdir, title, creation time) so that a later daemon can
reopen it by id alone; the transcript itself stays with the agent.

An agent process that dies is replaced at the next request, which loads (or resumes) the session
into the new one. An agent that never saved the session (Copilot CLI killed during the session's
first turn) answers "not found": :meth:`AcpProvider.open` then raises ConversationNotFound, and so
does ``send`` when the session was open here, before anything is sent. This provider never makes a
replacement session by itself; agentd.lost_sessions decides from the journal whether one may be
made (no turn had completed: a fresh session/new, the conversation goes on with a notice) or the
agent's context is lost (a clear ``not_found``).

Capabilities are what the agent advertised in ``initialize`` (session/load ->
history and reopen, session/resume -> reopen, session/list -> import) and
what its sessions offered (models); ``cancel`` and ``permissions`` are part
of every ACP agent. Nothing is assumed from the agent's name.

Restarts are paced by the shared restart backoff (:mod:`.._restart`), one
slot per conversation with ``cwd_policy = "workdir"`` (its process; a new
conversation's process counts for the provider's slot "" until the session is
open) and the one slot "" with ``"shared"``. A failure is an agent process
that exits on its own, or a process that was spawned but did not come up
(initialize, or the session/new, load or resume that follows, failing or
timing out). The next start of that slot waits 1 s, doubling to 60 s; a
completed turn (and, for slot "", an opened conversation) starts it over.
Stops agentd asks for (close, cancel timeout, restart_after_cancel, hang,
shutdown) are not failures.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import msgspec
import structlog
import trio

from ... import agentfs
from ... import runtime_output
from ..._fsutil import atomic_write, is_safe_name, make_dirs, read_file
from ...config import AcpAgentConfig
from ...contract import (
    Answer,
    Busy,
    Capabilities,
    Command,
    Closed,
    Context,
    ContextEvent,
    ConversationNotFound,
    Delta,
    DeltaEvent,
    Event,
    EventSink,
    ExitEvent,
    HistoryRecord,
    Interaction,
    InteractionEvent,
    InteractionGone,
    InteractionKind,
    InteractionState,
    Invalid,
    Item,
    ItemEvent,
    ItemKind,
    Model,
    ModelSelection,
    ModelSelectionEvent,
    McpServer,
    OpenRequest,
    PreviousConversation,
    Prompt,
    RuntimeUnavailable,
    SessionUnreadable,
    TitleEvent,
    TodosEvent,
    TokenUsage,
    TokensEvent,
    Turn,
    TurnEvent,
    TurnState,
    Unsupported,
    Usage,
    UsageEvent,
    utcnow,
    validate_answer,
)
from .._common import agentd_version as _version
from .._common import check_workdir as _check_workdir
from .._common import keeper_set, runs_under
from .._jsonrpc import AgentProcess, Call, ConnectionLost, RpcError
from .._restart import RestartBackoff, RestartPolicy
from .._mcp import McpStates
from . import _fs
from . import _mapping as m
from . import _schema as s

log = structlog.get_logger("agentd.providers.acp")
_json = runtime_output.encoder

#: Updates for a session the provider does not know yet (they may precede the session/new answer),
#: kept until it is known: at most this many, and this many bytes (JSON) of them, per agent process.
MAX_EARLY_UPDATES = 500
MAX_EARLY_BYTES = 8 << 20
#: Timeout of a session request other than the prompt (set_model, set_mode, list, close).
REQUEST_TIMEOUT_S = 30.0
#: After session/load answers, its replay is complete once no update came for this long (at most
#: LOAD_SETTLE_MAX_S): ACP wants the replay before the answer, but Gemini CLI streams it after.
LOAD_SETTLE_S = 0.15
LOAD_SETTLE_MAX_S = 3.0
#: Agents (by the ``agentInfo.name`` of their initialize answer) whose session/load must wait for
#: a UTC minute after the one the session was created in. Gemini CLI (seen in 0.61.0) begins every
#: load by starting a chat file named after the current UTC minute and the session id; within the
#: creation minute that is the session's own file, which the load empties, and the transcript is
#: lost. A wait of under a minute, in the rare reload that soon (a restart, a runtime that died
#: right after the first prompt), keeps it.
LOAD_IN_A_LATER_MINUTE = frozenset({"gemini-cli"})
#: past the minute's turn, for the agent's clock against ours, s
LOAD_MINUTE_MARGIN_S = 0.5
#: How long ``commands()`` waits for an agent's first available_commands_update, seconds.
COMMANDS_WAIT_S = 3.0


class _Record(msgspec.Struct, omit_defaults=True):
    """``conversations/<id>.json``: what a reopen needs besides the id."""

    id: str
    workdir: str
    title: str = ""
    created_at: _dt.datetime | None = None


# --------------------------------------------------------------------------- agent process + sessions


class _Agent:
    """One agent process and the sessions it serves, routing its messages by sessionId."""

    def __init__(self, provider: AcpProvider, cwd: str, key: str = "") -> None:
        self.provider = provider
        #: the restart-backoff slot this process fills: "" (new, or the shared one) or a conversation id
        self.key = key
        #: trio time of the spawn (None before)
        self.spawned_at: float | None = None
        self._failure_noted = False
        self.proc = AgentProcess(
            list(provider.config.command), env=provider.agent_env(), cwd=cwd, label=provider.name,
            state_dir=provider.state_dir, on_request=self._on_request, on_notification=self._on_notification, on_exit=self._on_exit)
        self.sessions: dict[str, AcpConversation] = {}
        self._early: list[tuple[str, dict[str, Any], int]] = []  # (session id, update, its size)
        self._early_bytes = 0
        self.init = s.InitializeResponse()

    @property
    def alive(self) -> bool:
        return self.proc.alive

    async def start(self, nursery: trio.Nursery, timeout: float) -> None:
        """Spawn and initialize. Raises RuntimeUnavailable; the process is stopped on any failure."""
        cfg = self.provider.config
        try:
            await self.proc.start(nursery)
        except OSError as exc:
            raise RuntimeUnavailable(
                f"{self.provider.name}: cannot start {cfg.command[0]!r}: {exc.strerror or exc}") from None
        self.spawned_at = trio.current_time()
        try:
            raw = await self.proc.request("initialize", {
                "protocolVersion": s.PROTOCOL_VERSION,
                "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": False},
                "clientInfo": {"name": "agentd", "title": "agentd", "version": _version()},
            }, timeout=timeout)
            self.init = msgspec.convert(raw or {}, s.InitializeResponse)
        except BaseException as exc:
            await self.proc.stop()
            raise self.startup_error("initialize", exc, timeout) from None
        if self.init.protocol_version != s.PROTOCOL_VERSION:
            await self.proc.stop()
            raise RuntimeUnavailable(
                f"{self.provider.name} speaks ACP protocol version {self.init.protocol_version}; "
                f"agentd speaks version {s.PROTOCOL_VERSION}")

    def startup_error(self, what: str, exc: BaseException, timeout: float) -> BaseException:
        """The contract error for a failed startup request (cancellation passes through)."""
        if isinstance(exc, msgspec.ValidationError):
            return RuntimeUnavailable(f"{self.provider.name} answered {what} with an invalid result: {exc}")
        return self.proc.request_failure(self.provider.name, what, exc, timeout)

    def note_failure(self, error: str) -> None:
        """Count this process's failure (an exit on its own, or a start that did not come up) once,
        against its restart slot. A process never spawned (not installed) is no failure."""
        if self._failure_noted or self.spawned_at is None:
            return
        self._failure_noted = True
        self.provider._restarts.failed(self.key, uptime=trio.current_time() - self.spawned_at, error=error)

    def register(self, session_id: str, conv: AcpConversation) -> None:
        """Route ``session_id``'s messages to ``conv``, replaying updates that came before."""
        self.sessions[session_id] = conv
        early = [u for sid, u, _ in self._early if sid == session_id]
        self._early = [e for e in self._early if e[0] != session_id]
        self._early_bytes = sum(size for _, _, size in self._early)
        for update in early:
            conv._on_update(update)

    def unregister(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    def _on_notification(self, method: str, params: Any) -> None:
        if method != "session/update":
            # A notification agentd does not know: kept by the session it names, if any.
            sid = params.get("sessionId") if isinstance(params, dict) else None
            conv = self.sessions.get(sid) if isinstance(sid, str) else None
            if conv is not None:
                conv._emit(runtime_output.unknown(self.provider.name, method, params))
            else:
                log.debug("acp.notification_ignored", agent=self.provider.name, method=method)
            return
        try:
            note = msgspec.convert(params, s.SessionNotification)
        except msgspec.ValidationError as exc:
            log.warning("acp.update_invalid", agent=self.provider.name, error=str(exc))
            return
        conv = self.sessions.get(note.session_id)
        if conv is None:
            # Bounded in count and bytes: updates for sessions that never come (say, an agent
            # naming made-up ones) are held until the process ends.
            size = len(_json.encode(note.update))
            if len(self._early) < MAX_EARLY_UPDATES and self._early_bytes + size <= MAX_EARLY_BYTES:
                self._early.append((note.session_id, note.update, size))
                self._early_bytes += size
            else:
                log.warning("acp.early_update_dropped", agent=self.provider.name, session=note.session_id[:80],
                            bytes=size)
            return
        conv._on_update(note.update)

    async def _on_request(self, method: str, params: Any) -> Any:
        sid = params.get("sessionId") if isinstance(params, dict) else None
        conv = self.sessions.get(sid) if isinstance(sid, str) else None
        if method not in ("session/request_permission", "fs/read_text_file", "fs/write_text_file"):
            raise RpcError(s.METHOD_NOT_FOUND, f"agentd does not offer {method}")
        if conv is None:
            raise RpcError(s.INVALID_PARAMS, f"unknown session {sid!r}")
        if method == "session/request_permission":
            return await conv._on_permission(params)
        if method == "fs/read_text_file":
            return await conv._on_read(params)
        return await conv._on_write(params)

    def _on_exit(self, reason: str) -> None:
        self.note_failure(reason)
        for conv in list(self.sessions.values()):
            conv._agent_exited(self, reason)
        self.provider._agent_gone(self)


# --------------------------------------------------------------------------- provider


class AcpProvider:
    """One configured ACP agent; implements contract.Provider and contract.Importer.

    Agent processes are started lazily (``open``, ``models``, ``previous``,
    and ``check`` once, to learn what the agent advertises) as tasks of the
    nursery that :meth:`run` owns; cancelling ``run`` stops every one of them
    (stdin closed, then SIGTERM, then SIGKILL of its process group).
    """

    def __init__(self, config: AcpAgentConfig, *, state_dir: Path, name: str,
                 restart_policy: RestartPolicy | None = None, files: agentfs.Policy | None = None) -> None:
        self.name = name
        #: what fs/* may do for the agent (the daemon's [agent_files] and own paths)
        self.file_policy = files or agentfs.Policy(own_dirs=(str(state_dir),))
        self.agent = name.split(":", 1)[1] if name.startswith("acp:") else name
        self.config = config
        self.display_name = config.display_name or f"ACP: {self.agent}"
        self.dir = Path(state_dir) / "providers" / "acp" / self.agent
        self.state_dir = Path(state_dir)
        self._nursery: trio.Nursery | None = None
        self._open: dict[str, AcpConversation] = {}
        #: what the agent advertised in its latest initialize
        self._init: s.InitializeResponse | None = None
        #: features the agent's sessions showed: models, usage, context, todos
        self._seen: set[str] = set()
        self._models: list[Model] | None = None
        self._shared: _Agent | None = None
        self._shared_lock = trio.Lock()
        self._stopping = False
        #: every agent process started and not yet ended
        self._agents: set[_Agent] = set()
        #: restart backoff: slot "" (new processes; the shared one) and one per conversation (workdir policy)
        self._restarts = RestartBackoff(f"the {name} agent", provider=name, log_prefix="acp", policy=restart_policy)

    # ------------------------------------------------------------------ contract.Provider

    def capabilities(self) -> Capabilities:
        """What the agent advertised (after its first start) plus what every ACP agent does."""
        init = self._init
        load = bool(init and init.agent_capabilities.load_session)
        sc = init.agent_capabilities.session_capabilities if init else s.SessionCapabilities()
        return Capabilities(
            cancel=True,
            permissions=True,
            runtime_process=True,
            model_endpoint=True,
            attachments=True,
            commands=True,
            # Every ACP agent takes stdio MCP servers on session/new and load (the protocol says it must),
            # unless the config says this one refuses them.
            mcp=self.config.mcp_stdio,
            history=load,
            reopen=load or sc.resume is not None,
            # listing alone adopts nothing: the session must also load or resume by id
            import_=sc.list is not None and (load or sc.resume is not None),
            models="models" in self._seen,
            set_model="models" in self._seen,
            usage="usage" in self._seen,
            context_size="context" in self._seen,
            todos="todos" in self._seen,
        )

    @property
    def advertised(self) -> s.InitializeResponse | None:
        """The agent's latest initialize answer; None before it first started."""
        return self._init

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; agent processes and turns live in the nursery owned here.

        On cancellation running turns end cancelled (reason ``shutdown``), every
        open conversation becomes closed and every agent process is stopped.
        """
        if self._nursery is not None:
            raise RuntimeError(f"provider {self.name!r} is already running")
        await trio.to_thread.run_sync(make_dirs, self.dir / "conversations")
        self._stopping = False
        closed: list[AcpConversation] = []
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                try:
                    await trio.sleep_forever()
                finally:
                    self._stopping = True
                    for agent in self._agents:
                        agent.proc.stopping()
                    closed = list(self._open.values())
                    for conv in closed:
                        conv._shutdown()
        except Exception as exc:
            # A crash, not a stop: the provider is run again, and the conversations it closed
            # must be opened anew there (an ExitEvent drops them), not refuse every send.
            for conv in closed:
                conv._emit(ExitEvent(error=f"provider {self.name} failed: {type(exc).__name__}"))
            raise
        finally:
            self._nursery = None
            self._open.clear()
            self._agents.clear()
            self._shared = None

    async def check(self) -> None:
        """Raises RuntimeUnavailable when disabled, not installed, or failing to initialize.

        The first check starts the agent once (initialize only) so that
        ``capabilities()`` reports what it advertises.
        """
        await trio.lowlevel.checkpoint()
        if not self.config.enabled:
            raise RuntimeUnavailable(f"{self.name} is disabled in the config (enabled = false)")
        exe = self.config.command[0]
        path = self.agent_env().get("PATH")
        if shutil.which(exe, path=path) is None:
            raise RuntimeUnavailable(f"{self.name}: {exe!r} is not installed or not executable")
        if self._init is None:
            agent = await self._start_agent(str(self.dir), wait_limit=0.0)
            await agent.proc.stop()
            self._fresh_start_worked("check")

    async def models(self) -> list[Model]:
        """The models the agent's sessions offer; Unsupported when it offers no choice.

        Without a session seen yet, one is started in a scratch directory under
        the provider's state dir to ask, then closed.
        """
        if self._models is None:
            scratch = self.dir / "scratch"
            await trio.to_thread.run_sync(make_dirs, scratch)
            agent = await self._start_agent(str(scratch))
            try:
                raw = await agent.proc.request("session/new", {"cwd": str(scratch), "mcpServers": []},
                                               timeout=self.config.startup_timeout_s)
                setup = msgspec.convert(raw or {}, s.SessionSetup)
                self._learn(setup)
                if self._models is None:
                    self._models = []
            except (RpcError, ConnectionLost, trio.TooSlowError, msgspec.ValidationError) as exc:
                error = agent.startup_error("session/new", exc, self.config.startup_timeout_s)
                if isinstance(error, RuntimeUnavailable):
                    agent.note_failure(error.message)
                raise error from None
            finally:
                await agent.proc.stop()
            self._fresh_start_worked("models")
        if not self._models:
            raise Unsupported(f"{self.name} offers no model selection")
        return list(self._models)

    async def open(self, request: OpenRequest, sink: EventSink) -> AcpConversation:
        """Create a session (empty ``conversation_id``) or reopen exactly that one.

        Reopen uses session/load where advertised (its replay becomes
        ``history()``), else session/resume. Raises ConversationNotFound when
        the agent has no such session (or agentd knows no workdir to look in),
        Unsupported when the agent can do neither, Invalid for a missing
        workdir or unknown model, Busy when that id runs a turn here,
        RuntimeUnavailable when the agent cannot start, Closed when not running.
        """
        if self._nursery is None:
            raise Closed(f"provider {self.name!r} is not running")
        if request.conversation_id:
            return await self._reopen(request, sink)
        files = await self._pin(request.workdir)
        workdir = files.path
        try:
            agent = await self._agent_for(workdir)
        except BaseException:
            files.close()
            raise
        mcp = McpStates(request.mcp_servers)
        # The agent starts the session's MCP servers (agentd's relay among them) during session/new,
        # before the conversation exists: until then it runs in that agent.
        runs_under(sink, lambda: keeper_set(agent.proc.pid if agent.alive else None))
        try:
            try:
                servers, skipped = mcp_servers_param(agent.init.agent_capabilities.mcp_capabilities, mcp.servers,
                                                     stdio=self.config.mcp_stdio)
                raw = await agent.proc.request("session/new", {"cwd": workdir, "mcpServers": servers},
                                               timeout=self.config.startup_timeout_s)
                setup = msgspec.convert(raw or {}, s.SessionSetup)
            except BaseException as exc:
                error = agent.startup_error("session/new", exc, self.config.startup_timeout_s)
                if isinstance(error, RuntimeUnavailable):
                    self._start_failed(agent, error)
                raise error from None
            if not setup.session_id:
                error = RuntimeUnavailable(f"{self.name} answered session/new without a sessionId")
                self._start_failed(agent, error)
                raise error
            conv = AcpConversation(self, agent, setup.session_id, files, sink, title=request.title, created_at=utcnow())
            conv.mcp = mcp
            conv._mcp_skipped(skipped)
            agent.register(setup.session_id, conv)
            conv._apply_setup(setup)
            await conv._select(request.model or self.config.model, request.effort)
            if self.config.mode:
                await conv.set_mode(self.config.mode)
        except BaseException:
            files.close()
            with trio.CancelScope(shield=True):
                await self._release(agent)
            raise
        if agent is not self._shared:
            agent.key = conv.id  # from now on its exits count against the conversation's slot
        self._fresh_start_worked("a conversation opened")
        self._open[conv.id] = conv
        await self._save_record(_Record(id=conv.id, workdir=workdir, title=request.title, created_at=conv.created_at))
        return conv

    async def previous(self, workdir: str) -> list[PreviousConversation]:
        """The agent's sessions for ``workdir`` (session/list); Unsupported unless advertised."""
        workdir = await _check_workdir(workdir)
        if self._init is not None and self._init.agent_capabilities.session_capabilities.list is None:
            raise Unsupported(f"{self.name} does not list its sessions")
        agent = await self._agent_for(workdir)
        out: list[PreviousConversation] = []
        try:
            if agent.init.agent_capabilities.session_capabilities.list is None:
                raise Unsupported(f"{self.name} does not list its sessions")
            cursor: str | None = None
            for _ in range(20):
                params: dict[str, Any] = {"cwd": workdir}
                if cursor:
                    params["cursor"] = cursor
                try:
                    raw = await agent.proc.request("session/list", params, timeout=REQUEST_TIMEOUT_S)
                    page = msgspec.convert(raw or {}, s.ListSessionsResponse)
                except BaseException as exc:
                    error = agent.startup_error("session/list", exc, REQUEST_TIMEOUT_S)
                    if isinstance(error, RuntimeUnavailable):
                        self._start_failed(agent, error)
                    raise error from None
                for info in page.sessions:
                    out.append(PreviousConversation(id=info.session_id, title=info.title or "",
                                                    workdir=info.cwd, updated_at=runtime_output.parse_utc(info.updated_at)))
                cursor = page.next_cursor
                if not cursor:
                    break
        finally:
            with trio.CancelScope(shield=True):
                await self._release(agent)
        self._fresh_start_worked("sessions listed")
        return out  # the agent may name any folder: agentd.adopt lists only this one's

    # ------------------------------------------------------------------ plumbing

    def agent_env(self) -> dict[str, str]:
        """agentd's environment without other providers' secrets (see agentd.runtime_env), then ``env``."""
        from ...runtime_env import environ

        return {**environ(self.name, self.config.pass_env), **self.config.env}

    async def _reopen(self, request: OpenRequest, sink: EventSink) -> AcpConversation:
        cid = request.conversation_id
        record = await self._read_record(cid)
        workdir = request.workdir or (record.workdir if record else "")
        if not workdir:
            raise ConversationNotFound(f"{self.name} has no conversation {cid!r} that agentd knows of")
        workdir = await _check_workdir(workdir)
        old = self._open.get(cid)
        if old is not None:
            if old._turn is not None:
                raise Busy(f"conversation {cid} is running a turn here")
            old._replaced = True  # the same conversation goes on: keep its restart backoff
            await old.close()
        files = await self._pin(workdir)
        try:
            # After an exit the daemon reopens the conversation: this start is its restart.
            agent = await self._agent_for(workdir, cid)
        except BaseException:
            files.close()
            raise
        try:
            caps = agent.init.agent_capabilities
            if not caps.load_session and caps.session_capabilities.resume is None:
                raise Unsupported(f"{self.name} can neither load nor resume a session (it advertises neither)")
            conv = AcpConversation(self, agent, cid, files, sink, title=request.title or (record.title if record else ""),
                                   created_at=record.created_at if record else None)
            conv.mcp = McpStates(request.mcp_servers)
            await conv._attach(agent, "session/load" if caps.load_session else "session/resume")
            # A reloaded session may start on the agent's default: ask for agentd's choice again.
            await conv._select(request.model, request.effort)
        except BaseException as exc:
            files.close()
            if isinstance(exc, RuntimeUnavailable):
                self._start_failed(agent, exc)
            with trio.CancelScope(shield=True):
                await self._release(agent)
            raise
        self._open[cid] = conv
        if record is None or record.workdir != workdir:
            await self._save_record(_Record(id=cid, workdir=workdir, title=conv._title,
                                            created_at=record.created_at if record else utcnow()))
        return conv

    async def _pin(self, workdir: str) -> agentfs.Workdir:
        """The workdir pinned for fs/* (before the agent starts, so it cannot swap it first), within
        agent_files.timeout_s. Raises Invalid when it is no directory or cannot be opened."""
        if not workdir:
            raise Invalid("a workdir is required")
        try:
            return await agentfs.pin(os.path.abspath(os.path.expanduser(workdir)), self.file_policy)
        except (NotADirectoryError, FileNotFoundError):
            raise Invalid(f"workdir {workdir!r} is not a directory") from None
        except (OSError, agentfs.FileAccessError) as exc:
            raise Invalid(f"workdir {workdir!r} cannot be opened: {exc}") from None

    async def _agent_for(self, workdir: str, key: str = "") -> _Agent:
        """A started agent for a session in ``workdir``: the shared one, or a new process there
        (for restart slot ``key``: a conversation id, or "" for a new conversation)."""
        if self.config.cwd_policy != "shared":
            return await self._start_agent(workdir, key)
        async with self._shared_lock:
            if self._shared is None or not self._shared.alive:
                self._shared = await self._start_agent(str(self.dir))
            return self._shared

    async def _start_agent(self, cwd: str, key: str = "", *, wait_limit: float | None = None) -> _Agent:
        """Spawn and initialize an agent process for restart slot ``key``, once its backoff allows.

        Raises Closed, RuntimeUnavailable (RuntimeRestarting while the backoff holds
        more than ``wait_limit`` seconds back).
        """
        if self._nursery is None or self._stopping:
            raise Closed(f"provider {self.name!r} is not running")
        await self._restarts.wait(key, limit=wait_limit)
        if self._nursery is None or self._stopping:
            raise Closed(f"provider {self.name!r} is not running")
        agent = _Agent(self, cwd, key)
        self._agents.add(agent)
        try:
            await agent.start(self._nursery, self.config.startup_timeout_s)
        except BaseException as exc:
            self._agents.discard(agent)
            if isinstance(exc, RuntimeUnavailable):
                agent.note_failure(exc.message)
            raise
        self._init = agent.init
        return agent

    def _start_failed(self, agent: _Agent, error: RuntimeUnavailable) -> None:
        """A process started for a request did not come up (its session setup failed): a failure of
        its restart slot. The shared process, which serves others, is judged by its exit only; a
        session it refused to load (SessionUnreadable) is no failure of the process."""
        if agent is not self._shared and not isinstance(error, SessionUnreadable):
            agent.note_failure(error.message)

    def _fresh_start_worked(self, why: str) -> None:
        """A new process did what it was started for: slot "" starts over (workdir policy; with
        ``shared``, slot "" is the shared process, which a completed turn vouches for)."""
        if self.config.cwd_policy != "shared":
            self._restarts.succeeded("", why=why)

    async def _release(self, agent: _Agent) -> None:
        """Stop ``agent`` unless it is the shared one still serving other sessions. Not cancellable."""
        if agent is self._shared and agent.sessions:
            return
        if agent is self._shared:
            self._shared = None
        await agent.proc.stop()
        self._agents.discard(agent)

    def _turn_completed(self, conv: AcpConversation) -> None:
        """A turn completed: the agent works, so the restart backoff of its slot starts over."""
        key = "" if self.config.cwd_policy == "shared" else conv.id
        self._restarts.succeeded(key, why="a turn completed")

    def _agent_gone(self, agent: _Agent) -> None:
        self._agents.discard(agent)
        if agent is self._shared:
            self._shared = None

    def _learn(self, setup: s.SessionSetup) -> None:
        """Remember the model list a session offered (for ``models()`` and capabilities): its models
        (session/set_model's, else the ``model`` config option's), each with the values of the
        ``thought_level`` config option as its effort levels."""
        efforts: list[str] = []
        for opt in setup.config_options or []:
            if opt.category == "thought_level" and opt.options:
                efforts = opt.values()
        if setup.models is not None and setup.models.available_models:
            self._models = [Model(id=mi.model_id, name=mi.name, efforts=list(efforts))
                            for mi in setup.models.available_models]
            self._seen.add("models")
            return
        for opt in setup.config_options or []:
            if opt.category == "model" and opt.options:
                names = {str(o.get("value")): str(o.get("name", "")) for o in opt.options if "value" in o}
                self._models = [Model(id=v, name=names.get(v, ""), efforts=list(efforts)) for v in opt.values()]
                self._seen.add("models")
                return

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is None:
            raise Closed(f"provider {self.name!r} is not running")
        self._nursery.start_soon(fn, *args)

    def _forget(self, conv: AcpConversation) -> None:
        if self._open.get(conv.id) is conv:
            del self._open[conv.id]

    def _record_path(self, cid: str) -> Path:
        name = cid if is_safe_name(cid) else hashlib.sha256(cid.encode()).hexdigest()
        return self.dir / "conversations" / f"{name}.json"

    async def _read_record(self, cid: str) -> _Record | None:
        try:
            data = await trio.to_thread.run_sync(read_file, self._record_path(cid))
            record = msgspec.json.decode(data, type=_Record)
        except (FileNotFoundError, msgspec.DecodeError):
            return None
        return record if record.id == cid else None

    async def forget_record(self, cid: str) -> None:
        """Delete agentd's record of session ``cid`` (none: nothing happens). Raises OSError."""
        await trio.to_thread.run_sync(lambda: self._record_path(cid).unlink(missing_ok=True))

    async def _save_record(self, record: _Record) -> None:
        path = self._record_path(record.id)

        def write() -> None:
            make_dirs(path.parent)
            atomic_write(path, msgspec.json.encode(record))

        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(write)
            except OSError as exc:
                log.warning("acp.record_not_saved", agent=self.name, conversation=record.id, error=str(exc))


# --------------------------------------------------------------------------- conversation


class _Turn:
    __slots__ = ("key", "model", "done", "cancel_requested", "finished", "answered")

    def __init__(self, model: str) -> None:
        self.key = uuid.uuid4().hex[:8]
        self.model = model
        self.done = trio.Event()
        self.cancel_requested = False
        self.finished = False
        #: the agent answered its session/prompt (or the connection ended): its turn is over there
        self.answered = trio.Event()


class _Pending:
    __slots__ = ("interaction", "done", "option_id")

    def __init__(self, interaction: Interaction) -> None:
        self.interaction = interaction
        self.done = trio.Event()
        self.option_id = ""


class _Segment:
    """Streamed text of one assistant, reasoning or (in a replay) user message."""

    __slots__ = ("id", "kind", "parts", "started", "message_id", "size", "dropped")

    def __init__(self, id: str, kind: ItemKind, message_id: str | None) -> None:
        self.id = id
        self.kind = kind
        #: the chunks so far; joined when read (``text += chunk`` on an attribute copies every time:
        #: a 20 MB answer in 1 KB chunks took minutes)
        self.parts: list[str] = []
        self.started = utcnow()
        self.message_id = message_id
        #: characters kept in parts, and those past runtime_output.MAX_ITEM_TEXT_CHARS left out
        self.size = 0
        self.dropped = 0

    def add(self, text: str) -> str:
        """Keep ``text`` up to the item's bound; returns what was kept ("" once past it)."""
        room = runtime_output.MAX_ITEM_TEXT_CHARS - self.size
        if len(text) > room:
            self.dropped += len(text) - max(room, 0)
            text = text[:max(room, 0)]
        if text:
            self.parts.append(text)
            self.size += len(text)
        return text

    @property
    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts = ["".join(self.parts)]
        kept = self.parts[0] if self.parts else ""
        return kept + runtime_output.cut_note(self.dropped) if self.dropped else kept


_CHUNK_KINDS = {
    "agent_message_chunk": ItemKind.ASSISTANT,
    "agent_thought_chunk": ItemKind.REASONING,
    "user_message_chunk": ItemKind.USER,
}


def mcp_servers_param(caps: s.McpCapabilities, servers: list[McpServer], *,
                      stdio: bool = True) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """``mcpServers`` of session/new, load and resume, and the servers left out with why.

    stdio servers go unless ``stdio`` is false (``mcp_stdio`` in the agent's config); an HTTP
    one only to an agent that advertises ``mcpCapabilities.http``. env and headers are lists
    of {name, value}.
    """
    out: list[dict[str, Any]] = []
    skipped: list[tuple[str, str]] = []
    for server in servers:
        if server.transport == "http":
            if not caps.http:
                skipped.append((server.name, "this agent does not take HTTP MCP servers (no mcpCapabilities.http)"))
                continue
            out.append({"type": "http", "name": server.name, "url": server.url,
                        "headers": [{"name": k, "value": v} for k, v in server.headers.items()]})
        elif not stdio:
            skipped.append((server.name, "this agent does not take stdio MCP servers (mcp_stdio = false)"))
        else:
            out.append({"name": server.name, "command": server.command, "args": list(server.args),
                        "env": [{"name": k, "value": v} for k, v in server.env.items()]})
    return out, skipped


class AcpConversation:
    """One ACP session; implements contract.Conversation.

    While a turn runs, session/update notifications become events; outside a
    turn (a session/load replay, or stragglers after a turn) they only build
    the transcript that :meth:`history` returns. Every method raises Closed
    after :meth:`close` or once the provider stopped.
    """

    def __init__(self, provider: AcpProvider, agent: _Agent, session_id: str, files: agentfs.Workdir, sink: EventSink,
                 *, title: str = "", created_at: _dt.datetime | None = None) -> None:
        self._provider = provider
        #: the workdir pinned at open: fs/* requests resolve beneath it; closed with the conversation
        self.files = files
        self.workdir = files.path
        #: when the session was created (session/new), if agentd knows: see LOAD_IN_A_LATER_MINUTE
        self.created_at = created_at
        self._agent: _Agent | None = agent
        self._id = session_id
        self._sink = sink
        runs_under(sink, lambda: keeper_set(self.pid))
        #: its MCP servers, handed to the agent on every session/new, load and resume
        self.mcp = McpStates([])
        self._title = title
        self._items: list[Item] = []
        self._index: dict[str, int] = {}
        self._turn: _Turn | None = None
        #: a turn ended here (cancel_timeout) that the shared agent still runs: what it streams is
        #: that turn's, dropped, and no prompt is sent until it answers
        self._abandoned: _Turn | None = None
        self._starting = False
        self._pending: dict[str, _Pending] = {}
        self._seg: _Segment | None = None
        self._tools: dict[str, m.ToolState] = {}
        self._prefix = "h" + uuid.uuid4().hex[:6]
        self._counter = 0
        self._models: s.SessionModelState | None = None
        self._modes: s.SessionModeState | None = None
        self._config: list[s.ConfigOption] = []
        self._cost: float | None = None
        self._closed = False
        self._closed_reason = ""
        #: closed because a reopen of the same id replaces this instance (its restart backoff goes on)
        self._replaced = False
        self._revive_lock = trio.Lock()
        #: an agent being stopped after a cancel; a new one starts only once it is gone
        self._retiring: _Agent | None = None
        #: trio time of the latest session/update
        self._last_update = 0.0
        #: the agent's slash commands (its latest available_commands_update)
        self._commands: list[Command] = []
        #: set once the agent sent a list (it may send none)
        self._commands_seen = trio.Event()

    # ------------------------------------------------------------------ properties

    @property
    def id(self) -> str:
        return self._id

    @property
    def pid(self) -> int | None:
        """The agent process's pid while it runs (tests kill it)."""
        agent = self._agent
        return agent.proc.pid if agent is not None and agent.alive else None

    @property
    def model(self) -> str:
        """The session's current model id as the agent reported it ("" when it reports none)."""
        return self._model_id()

    @property
    def modes(self) -> list[str]:
        """Session mode ids the agent offers (empty when none)."""
        return [mode.id for mode in self._modes.available_modes] if self._modes else []

    @property
    def mode(self) -> str:
        return self._modes.current_mode_id if self._modes else ""

    # ------------------------------------------------------------------ contract.Conversation

    async def send(self, prompt: Prompt) -> None:
        """Start a turn: session/prompt is written to the agent, then this returns.

        Emits the user item and TurnEvent(working) first; the turn then runs in
        the provider's nursery and ends with exactly one terminal TurnEvent. If
        the agent process is gone, a fresh one is started first and the session
        loaded (or resumed) into it. Raises Busy while a turn runs, Closed when
        closed or the agent can neither load nor resume, ConversationNotFound
        when the restarted agent no longer has the session (nothing was sent;
        agentd.lost_sessions decides what follows), RuntimeUnavailable when
        the agent cannot start. A prompt that cannot be written fails its turn
        (the agent never saw a whole request); it is never resent.
        """
        self._check_open()
        if self._turn is not None or self._starting:
            raise Busy(f"a turn is running in conversation {self.id}")
        self._starting = True
        try:
            await self._wait_abandoned()
            agent = await self._ensure_agent()
            blocks: list[dict[str, Any]] = [{"type": "text", "text": prompt.text}]
            if prompt.attachments:
                caps = agent.init.agent_capabilities.prompt_capabilities
                blocks = await trio.to_thread.run_sync(m.prompt_blocks, prompt, caps)
                await self.files.allow(a.path for a in prompt.attachments if a.path)  # fs/read_text_file may read them
            with trio.CancelScope(shield=True):
                self._check_open()
                turn = _Turn(self._model_id())
                self._begin(turn)
                self._put(Item(id=f"{turn.key}-0", kind=ItemKind.USER, text=prompt.text, time=utcnow(),
                               attachments=list(prompt.attachments)), emit=True)
                self._emit(TurnEvent(turn=Turn(state=TurnState.WORKING, model=turn.model)))
                assert agent.proc.conn is not None
                try:
                    call = await agent.proc.conn.start("session/prompt", {"sessionId": self.id, "prompt": blocks})
                except ConnectionLost as exc:
                    self._finish(turn, TurnState.FAILED, f"the prompt could not be delivered: {exc.reason}",
                                 "runtime_exit")
                    return
                self._provider._spawn(self._await_turn, turn, call)
        finally:
            self._starting = False

    async def commands(self) -> list[Command]:
        """The commands of the agent's latest available_commands_update.

        Starts the agent when it does not run; waits up to COMMANDS_WAIT_S for a
        first list (agents send it after session/new), then an agent that sent
        none offers none. Raises RuntimeUnavailable, Closed.
        """
        self._check_open()
        await self._ensure_agent()
        with trio.move_on_after(COMMANDS_WAIT_S):
            await self._commands_seen.wait()
        return list(self._commands)

    async def run_command(self, name: str, args: Prompt) -> None:
        """Send the prompt ``/name args``: an ACP agent runs its commands from the prompt text."""
        text = f"/{name} {args.text}" if args.text else f"/{name}"
        await self.send(Prompt(text=text, attachments=list(args.attachments)))

    async def steer(self, prompt: Prompt) -> None:
        """Raises Unsupported: ACP has no way to add to a running prompt turn."""
        await trio.lowlevel.checkpoint()
        raise Unsupported("ACP agents cannot take a message into a running turn; cancel it or queue the prompt")

    async def cancel(self) -> None:
        """Cancel the running turn and return once it ended; no turn: a no-op.

        Pending permission requests are answered ``cancelled`` (and expire),
        session/cancel is sent, and the agent's answer to the prompt ends the
        turn ``cancelled``. An agent that has not ended it after
        ``cancel_timeout_s`` is stopped (the next send starts it again) and the
        turn ends cancelled with reason ``cancel_timeout``.
        """
        self._check_open()
        turn = self._turn
        if turn is None:
            await trio.lowlevel.checkpoint()
            return
        turn.cancel_requested = True
        self._expire_pending("cancelled")
        agent = self._agent
        await self._send_cancel(agent)
        with trio.move_on_after(self._provider.config.cancel_timeout_s):
            await turn.done.wait()
        if not turn.done.is_set():
            log.warning("acp.cancel_timeout", agent=self._provider.name, conversation=self.id)
            self._finish(turn, TurnState.CANCELLED, "", "cancel_timeout")
            if agent is not None and agent is self._provider._shared and not turn.answered.is_set():
                self._abandoned = turn  # the shared agent cannot be restarted for this session alone
            elif agent is not None and agent is not self._provider._shared:
                self._agent = None
                agent.unregister(self.id)
                with trio.CancelScope(shield=True):
                    await self._provider._release(agent)

    async def _send_cancel(self, agent: _Agent | None) -> None:
        """session/cancel to ``agent`` when it runs; an agent gone meanwhile is no error."""
        if agent is not None and agent.alive and agent.proc.conn is not None:
            try:
                await agent.proc.conn.notify("session/cancel", {"sessionId": self.id})
            except ConnectionLost:
                pass

    async def _wait_abandoned(self) -> None:
        """Before a prompt: a turn the shared agent still runs after its cancel timed out is
        cancelled again and waited for (``cancel_timeout_s``); raises Busy when it goes on, as
        the agent would take the prompt into it (its output landed in the next turn)."""
        turn = self._abandoned
        if turn is None:
            return
        await self._send_cancel(self._agent)
        with trio.move_on_after(self._provider.config.cancel_timeout_s):
            await turn.answered.wait()
        if self._abandoned is turn:
            raise Busy(f"the agent has not ended the turn it was asked to cancel in {self.id} (it runs in the "
                       "shared agent process, which agentd does not restart for one conversation); "
                       "try again later, or close the conversation")

    async def respond(self, interaction_id: str, answer: Answer) -> None:
        """Answer a pending permission with one of the agent's options.

        The agent gets ``{outcome: {outcome: "selected", optionId}}``. Raises
        InteractionGone when not pending, Invalid when the option is not offered.
        """
        self._check_open()
        pending = self._pending.get(interaction_id)
        if pending is None:
            raise InteractionGone(f"interaction {interaction_id!r} is not pending")
        validate_answer(pending.interaction, answer)
        option = next(o for o in pending.interaction.options if o.id == answer.decision)
        del self._pending[interaction_id]
        pending.option_id = option.id
        state = InteractionState.REJECTED if option.reject else InteractionState.ANSWERED
        self._emit(InteractionEvent(interaction=msgspec.structs.replace(
            pending.interaction, state=state, resolution=option.id)))
        pending.done.set()
        await trio.lowlevel.checkpoint()

    async def history(self) -> HistoryRecord:
        """The transcript: the agent's session/load replay, then this instance's turns.

        Raises Unsupported when the agent does not advertise loadSession.
        """
        self._check_open()
        await trio.lowlevel.checkpoint()
        if not self._provider.capabilities().history:
            raise Unsupported(f"{self._provider.name} cannot replay a session's history (no loadSession)")
        usage = Usage(cost_usd=self._cost) if self._cost is not None else None
        items = list(self._items)
        seg = self._seg
        if seg is not None and seg.text:  # a message still streaming (or the replay's last one)
            items.append(Item(id=seg.id, kind=seg.kind, text=seg.text, time=seg.started))
        return HistoryRecord(items=items, usage=usage, model=self._model_id())

    async def _select(self, model: str, effort: str) -> None:
        """Apply the model / effort an open request names, where it differs from the session's."""
        if model and model != self._model_id():
            await self.set_model(model, effort)
        elif effort:
            await self.set_model(self._model_id(), effort)

    async def set_model(self, model: str, effort: str = "") -> None:
        """Select ``model`` (session/set_model, or the session's model config option) and ``effort``
        (its thought_level config option) from the next turn on.

        Raises Unsupported when the agent offers no such choice, Invalid for a
        value it does not offer or refuses.
        """
        self._check_open()
        agent = await self._ensure_agent()
        if model and model != self._model_id():
            if self._models is not None and self._models.available_models:
                ids = [mi.model_id for mi in self._models.available_models]
                if model not in ids:
                    raise Invalid(f"{self._provider.name} offers no model {model!r}; choose one of: {', '.join(ids)}")
                await self._request(agent, "session/set_model", {"sessionId": self.id, "modelId": model})
                self._models.current_model_id = model
            elif (opt := self._option("model")) is not None:
                await self._set_option(agent, opt, model)
            else:
                raise Unsupported(f"{self._provider.name} offers no model selection")
        if effort:
            opt = self._option("thought_level")
            if opt is None:
                raise Unsupported(f"{self._provider.name} offers no reasoning effort setting")
            await self._set_option(agent, opt, effort)
        self._emit(ModelSelectionEvent(selection=ModelSelection(model=self._model_id(), effort=effort or None)))

    async def set_mode(self, mode: str) -> None:
        """Switch the session mode (session/set_mode, or the session's mode config option).

        Raises Unsupported when the agent offers no modes, Invalid for a mode it does not offer.
        """
        self._check_open()
        agent = await self._ensure_agent()
        if self._modes is not None and self._modes.available_modes:
            ids = self.modes
            if mode not in ids:
                raise Invalid(f"{self._provider.name} offers no mode {mode!r}; choose one of: {', '.join(ids)}")
            await self._request(agent, "session/set_mode", {"sessionId": self.id, "modeId": mode})
            self._modes.current_mode_id = mode
        elif (opt := self._option("mode")) is not None:
            await self._set_option(agent, opt, mode)
        else:
            raise Unsupported(f"{self._provider.name} offers no session modes")

    async def set_title(self, title: str) -> None:
        """Raises Unsupported: ACP has no client-set session title."""
        await trio.lowlevel.checkpoint()
        raise Unsupported("ACP agents name their sessions themselves")

    async def discard(self) -> None:
        """Close, then delete agentd's record of this never-prompted session (agentd.warm_pool).
        ACP has no session deletion: an agent that keeps sessions of its own keeps this one."""
        cid = self.id
        await self.close()
        await self._provider.forget_record(cid)

    async def close(self) -> None:
        """Cancel a running turn (reason ``closed``), then stop the agent process (or, when
        shared, leave the session with session/close where offered). Idempotent; not cancellable."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        self._closed_reason = f"conversation {self.id} is closed"
        self.files.close()
        with trio.CancelScope(shield=True):
            agent, self._agent = self._agent, None
            turn = self._turn
            if turn is not None:
                turn.cancel_requested = True
                self._expire_pending("closed")
                if agent is not None and agent.alive and agent.proc.conn is not None:
                    try:
                        await agent.proc.conn.notify("session/cancel", {"sessionId": self.id})
                    except ConnectionLost:
                        pass
                self._finish(turn, TurnState.CANCELLED, "", "closed")
            if agent is not None:
                agent.unregister(self.id)
                if agent is self._provider._shared and agent.sessions and agent.alive \
                        and agent.init.agent_capabilities.session_capabilities.close is not None:
                    try:
                        await agent.proc.request("session/close", {"sessionId": self.id}, timeout=5)
                    except (RpcError, ConnectionLost, trio.TooSlowError):
                        pass
                await self._provider._release(agent)
        if not self._replaced:
            self._provider._restarts.forget(self.id)
        self._provider._forget(self)

    # ------------------------------------------------------------------ session setup

    async def _attach(self, agent: _Agent, method: str) -> None:
        """session/load or session/resume this session into ``agent``.

        A load's replay (and anything else until the next turn) builds the
        transcript afresh. Raises ConversationNotFound, SessionUnreadable (an error answer),
        RuntimeUnavailable (no answer in time, the agent gone)."""
        self._agent = agent
        if method == "session/load":
            self._items.clear()
            self._index.clear()
            self._seg = None
            self._tools = {}
        if method == "session/load":
            await self._wait_for_a_later_minute(agent)
        self._last_update = trio.current_time()
        agent.register(self.id, self)
        timeout = self._provider.config.startup_timeout_s
        servers, skipped = mcp_servers_param(agent.init.agent_capabilities.mcp_capabilities, self.mcp.servers,
                                             stdio=self._provider.config.mcp_stdio)
        self._mcp_skipped(skipped)
        try:
            raw = await agent.proc.request(method, {"sessionId": self.id, "cwd": self.workdir, "mcpServers": servers},
                                           timeout=timeout)
            setup = msgspec.convert(raw or {}, s.SessionSetup)
        except RpcError as exc:
            agent.unregister(self.id)
            if m.is_not_found(exc.code, exc.describe()):
                raise ConversationNotFound(f"{self._provider.name} has no session {self.id!r}: {exc.describe()}") from None
            # The agent is up and answered: it cannot read this session back (agentd.lost_sessions decides).
            raise SessionUnreadable(f"{self._provider.name} refused {method} of session {self.id!r}: "
                                    f"{exc.describe()}") from None
        except BaseException as exc:
            agent.unregister(self.id)
            raise agent.startup_error(method, exc, timeout) from None
        self._apply_setup(setup)
        if method == "session/load":
            with trio.move_on_after(LOAD_SETTLE_MAX_S):
                while (quiet := trio.current_time() - self._last_update) < LOAD_SETTLE_S:
                    await trio.sleep(LOAD_SETTLE_S - quiet)

    async def _wait_for_a_later_minute(self, agent: _Agent) -> None:
        """Before session/load: wait out the UTC minute the session was created in, for the agents
        of LOAD_IN_A_LATER_MINUTE (at most a minute, once per session and only that soon)."""
        info = agent.init.agent_info
        if info is None or info.name not in LOAD_IN_A_LATER_MINUTE or self.created_at is None:
            return
        created = self.created_at.timestamp()
        delay = (created // 60 + 1) * 60 + LOAD_MINUTE_MARGIN_S - utcnow().timestamp()
        if delay > 0:
            log.info("acp.load_waits_for_a_later_minute", agent=info.name, version=info.version, session=self.id,
                     wait_s=round(delay, 1), why="a load in the minute the session was created loses its transcript")
            await trio.sleep(delay)

    def _apply_setup(self, setup: s.SessionSetup) -> None:
        self._models = setup.models
        self._modes = setup.modes
        self._config = list(setup.config_options or [])
        self._provider._learn(setup)

    async def _ensure_agent(self) -> _Agent:
        """The live agent of this session, starting a fresh process and loading the session into it
        when the previous one exited. Raises Closed, ConversationNotFound (the new process does not
        have the session), RuntimeUnavailable."""
        agent = self._agent
        if agent is not None and agent.alive and not self._revive_lock.locked():
            return agent  # no checkpoint here: a prompt is written before any other task runs
        async with self._revive_lock:
            agent = self._agent
            if agent is not None and agent.alive:
                return agent
            self._check_open()
            retiring, self._retiring = self._retiring, None
            if retiring is not None:
                await retiring.proc.wait()
            init = self._provider.advertised or s.InitializeResponse()
            caps = init.agent_capabilities
            resume = caps.session_capabilities.resume is not None
            if not caps.load_session and not resume:
                raise Closed(f"the agent process of conversation {self.id} exited and {self._provider.name} "
                             "can neither load nor resume sessions; start a new conversation")
            agent = await self._provider._agent_for(self.workdir, self.id)
            try:
                # resume keeps our transcript; a load replays the agent's own, which then replaces it
                await self._attach(agent, "session/resume" if resume else "session/load")
            except ConversationNotFound as exc:
                # Nothing was sent: the caller may reopen it afresh (agentd.lost_sessions decides).
                with trio.CancelScope(shield=True):
                    await self._provider._release(agent)
                raise ConversationNotFound(f"the agent restarted but no longer has this session: {exc.message}") from None
            except BaseException as exc:
                if isinstance(exc, RuntimeUnavailable):
                    self._provider._start_failed(agent, exc)
                with trio.CancelScope(shield=True):
                    await self._provider._release(agent)
                raise
            log.info("acp.session_restored", agent=self._provider.name, conversation=self.id, pid=agent.proc.pid)
            return agent

    # ------------------------------------------------------------------ turn

    def _begin(self, turn: _Turn) -> None:
        self._close_segment(emit=False)
        self._tools = {}
        self._turn = turn
        self._prefix = turn.key
        self._counter = 0

    async def _await_turn(self, turn: _Turn, call: Call) -> None:
        """The turn task: waits for the session/prompt answer and ends the turn. Never raises."""
        state, error, reason = TurnState.FAILED, "", ""
        try:
            raw = await call.wait()
            resp = msgspec.convert(raw or {}, s.PromptResponse)
            state, error = m.stop_reason(resp.stop_reason)
            if resp.usage is not None and not turn.finished:
                u = resp.usage
                cache_read, cache_write = u.cached_read_tokens or 0, u.cached_write_tokens or 0
                self._emit(TokensEvent(tokens=TokenUsage(
                    model=turn.model, input=u.input_tokens + cache_read + cache_write, output=u.output_tokens,
                    cache_read=cache_read, cache_write=cache_write)))
                self._provider._seen.add("usage")
        except RpcError as exc:
            if turn.cancel_requested:
                state = TurnState.CANCELLED
            else:
                state, error = TurnState.FAILED, exc.describe()
        except ConnectionLost as exc:
            state, error, reason = TurnState.FAILED, exc.reason, "runtime_exit"
        except msgspec.ValidationError as exc:
            state, error = TurnState.FAILED, f"the agent answered session/prompt with an invalid result: {exc}"
        except trio.Cancelled:
            state, reason = TurnState.CANCELLED, "shutdown"
            raise
        except Exception as exc:  # a bug must not take the provider's nursery down
            log.exception("acp.turn_crashed", agent=self._provider.name, conversation=self.id)
            state, error = TurnState.FAILED, f"acp provider error: {exc}"
        finally:
            turn.answered.set()
            if self._abandoned is turn:
                self._abandoned = None
            self._finish(turn, state, error, reason)

    def _finish(self, turn: _Turn, state: TurnState, error: str = "", reason: str = "") -> None:
        """End ``turn`` once: close its streamed items, fail its unfinished tools, expire its
        permissions, then emit its terminal TurnEvent."""
        if turn.finished:
            return
        turn.finished = True
        if self._turn is turn:
            self._close_segment(emit=True)
            why = reason or ("cancelled" if state is TurnState.CANCELLED else error or "the turn ended")
            for st in self._tools.values():
                if not st.terminal:
                    st.status = "failed"
                    self._put_tool(st, emit=True, note=why)
            self._expire_pending(why)
            self._turn = None
        self._emit(TurnEvent(turn=Turn(state=state, error=error, reason=reason, model=turn.model,
                                       inferred=reason == "cancel_timeout")))
        turn.done.set()
        if state is TurnState.COMPLETED:
            self._provider._turn_completed(self)
        if state is TurnState.CANCELLED and not reason and self._provider.config.restart_after_cancel:
            self._retire_agent()

    def _retire_agent(self) -> None:
        """Stop the agent in the background (restart_after_cancel); the next send starts a new one."""
        agent = self._agent
        if agent is None or agent is self._provider._shared:
            return
        caps = agent.init.agent_capabilities
        if not caps.load_session and caps.session_capabilities.resume is None:
            log.warning("acp.restart_after_cancel_impossible", agent=self._provider.name,
                        reason="the agent can neither load nor resume sessions")
            return
        self._agent = None
        agent.unregister(self.id)
        self._retiring = agent
        self._provider._spawn(self._provider._release, agent)

    def _expire_pending(self, why: str) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():
            self._emit(InteractionEvent(interaction=msgspec.structs.replace(
                p.interaction, state=InteractionState.EXPIRED, resolution=why)))
            p.done.set()  # the handler answers the agent {outcome: cancelled}

    def _agent_exited(self, agent: _Agent, reason: str) -> None:
        """The agent process ended on its own: fail the turn (``runtime_exit``), then ExitEvent.

        The conversation stays usable: the next send starts a new process.
        """
        if agent is not self._agent:
            return
        self._agent = None
        if self._closed:
            return
        turn = self._turn
        if turn is not None:
            self._finish(turn, TurnState.FAILED, reason, "runtime_exit")
        self._emit(ExitEvent(error=reason))

    def _shutdown(self) -> None:
        """The provider stops: end a running turn (reason ``shutdown``) and close."""
        if self._turn is not None:
            self._finish(self._turn, TurnState.CANCELLED, "", "shutdown")
        self._closed = True
        self._closed_reason = f"provider {self._provider.name} stopped"
        self.files.close()
        self._agent = None

    # ------------------------------------------------------------------ session/update

    def _on_update(self, raw: dict[str, Any]) -> None:
        if self._turn is None:  # what a load's replay waits on (_attach): no turn runs then
            self._last_update = trio.current_time()
        kind = raw.get("sessionUpdate")
        unknown = m.unknown_update(self._provider.name, raw)
        if unknown is not None:
            self._emit(unknown)
            return
        try:
            u = msgspec.convert({"update": raw}, s.UpdateOf).update
        except msgspec.ValidationError as exc:
            # A known kind in a shape agentd cannot read: kept as unknown, not lost.
            log.warning("acp.update_invalid", agent=self._provider.name, kind=kind, error=str(exc))
            self._emit(runtime_output.unknown(self._provider.name, str(kind), raw))
            return
        live = self._turn is not None
        if self._abandoned is not None and isinstance(
                u, (s.AgentMessageChunk, s.AgentThoughtChunk, s.ToolCallStart, s.ToolCallProgress, s.PlanUpdate)):
            return  # the abandoned turn's, streamed after it ended here: no later turn's
        if isinstance(u, (s.AgentMessageChunk, s.AgentThoughtChunk, s.UserMessageChunk)):
            if live and isinstance(u, s.UserMessageChunk):
                return  # the agent echoing the prompt we sent
            text = m.block_text(u.content)
            if text:
                self._append_text(_CHUNK_KINDS[kind], text, u.message_id, emit=live)
        elif isinstance(u, (s.ToolCallStart, s.ToolCallProgress)):
            self._close_segment(emit=live)
            self._tool_update(u, emit=live)
        elif isinstance(u, s.PlanUpdate):
            self._provider._seen.add("todos")
            if live:
                self._emit(TodosEvent(todos=m.todos(u)))
        elif isinstance(u, s.UsageUpdate):
            if u.size > 0:
                self._provider._seen.add("context")
                self._emit(ContextEvent(context=Context(used=max(u.used, 0), limit=u.size)))
            if u.cost is not None and u.cost.currency.upper() == "USD":
                self._provider._seen.add("usage")
                self._cost = u.cost.amount
                self._emit(UsageEvent(usage=Usage(cost_usd=u.cost.amount)))
        elif isinstance(u, s.AvailableCommandsUpdate):
            self._commands = m.commands(u.available_commands)
            self._commands_seen.set()
            log.debug("acp.commands", agent=self._provider.name, conversation=self.id, count=len(self._commands))
        elif isinstance(u, s.CurrentModeUpdate):
            if self._modes is not None:
                self._modes.current_mode_id = u.current_mode_id
            log.info("acp.mode", agent=self._provider.name, conversation=self.id, mode=u.current_mode_id)
        elif isinstance(u, s.ConfigOptionUpdate):
            before = self._model_id()
            self._config = list(u.config_options)
            log.debug("acp.config_options", agent=self._provider.name, conversation=self.id,
                      options={o.id: o.current_value for o in self._config})
            if self._model_id() != before and self._model_id():
                self._emit(ModelSelectionEvent(selection=ModelSelection(model=self._model_id())))
        elif isinstance(u, s.SessionInfoUpdate):
            if u.title and u.title != self._title:
                self._title = u.title
                self._emit(TitleEvent(title=u.title))

    def _append_text(self, kind: ItemKind, text: str, message_id: str | None, *, emit: bool) -> None:
        seg = self._seg
        if seg is None or seg.kind is not kind or (message_id and seg.message_id and message_id != seg.message_id):
            self._close_segment(emit=emit)
            seg = self._seg = _Segment(self._next_id(), kind, message_id)
        text = seg.add(text)  # past the item's bound neither kept nor streamed on
        if emit and text:
            self._emit(DeltaEvent(delta=Delta(item_id=seg.id, kind=kind, text=text)))

    def _close_segment(self, *, emit: bool) -> None:
        seg, self._seg = self._seg, None
        if seg is not None and seg.text:
            self._put(Item(id=seg.id, kind=seg.kind, text=seg.text, time=seg.started, ended_at=utcnow()), emit=emit)

    def _tool_update(self, fields: s.ToolCallFields, *, emit: bool) -> m.ToolState:
        st = self._tools.get(fields.tool_call_id)
        if st is None:
            st = self._tools[fields.tool_call_id] = m.ToolState(fields.tool_call_id)
        st.merge(fields)
        self._put_tool(st, emit=emit)
        return st

    def _put_tool(self, st: m.ToolState, *, emit: bool, note: str = "") -> None:
        call = st.to_call()
        if note:
            call = msgspec.structs.replace(call, output=f"{call.output}\n{note}" if call.output else note)
        item_id = self._tool_item_id(st.id)
        old = self._index.get(item_id)
        started = self._items[old].time if old is not None else utcnow()
        if st.terminal and emit and len(call.output) >= m.MAX_TOOL_TEXT - 40:  # maybe a display cut
            for event in runtime_output.whole_output(call, st.whole_output(), item_id):
                self._emit(event)
        self._put(Item(id=item_id, kind=ItemKind.TOOL, tool=call, time=started,
                       ended_at=utcnow() if st.terminal else None), emit=emit)

    def _put(self, item: Item, *, emit: bool) -> None:
        """Record ``item`` in the transcript (a later version replaces it) and emit it when ``emit``."""
        at = self._index.get(item.id)
        if at is None:
            self._index[item.id] = len(self._items)
            self._items.append(item)
        else:
            self._items[at] = item
        if emit:
            self._emit(ItemEvent(item=item))

    def _tool_item_id(self, tool_call_id: str) -> str:
        """A tool call's item id: scoped by the turn (or replay), as agents reuse their tool call ids."""
        return f"tool-{self._prefix}-{tool_call_id}"

    def _next_id(self) -> str:
        self._counter += 1
        return f"{self._prefix}-{self._counter}"

    # ------------------------------------------------------------------ agent -> client requests

    async def _on_permission(self, params: Any) -> Any:
        req = msgspec.convert(params, s.RequestPermissionRequest)
        cancelled = {"outcome": {"outcome": "cancelled"}}
        turn = self._turn
        if turn is None or turn.cancel_requested or self._closed:
            return cancelled
        self._close_segment(emit=True)
        st = self._tool_update(req.tool_call, emit=True)
        call = st.to_call()
        if not req.options:
            # Nothing a person could choose: refused at once, and said where they look.
            log.warning("acp.permission_without_options", agent=self._provider.name, conversation=self.id,
                        tool=call.title)
            self._put(Item(id=f"notice-{uuid.uuid4().hex[:12]}", kind=ItemKind.NOTICE, time=utcnow(),
                           text=f"{self._provider.display_name} asked to allow {call.title or 'a tool call'} but "
                                "offered no option to choose; agentd refused it (cancelled)"), emit=True)
            return cancelled
        iid = f"perm-{uuid.uuid4().hex[:12]}"
        pending = _Pending(Interaction(
            id=iid, kind=InteractionKind.PERMISSION, title=f"Allow {call.title}?" if call.title else "Allow the tool call?",
            detail=call.input or call.output, options=m.permission_options(req.options), time=utcnow(),
            tool_call_id=self._tool_item_id(st.id)))
        self._pending[iid] = pending
        self._emit(InteractionEvent(interaction=pending.interaction))
        try:
            await pending.done.wait()
        finally:
            if self._pending.pop(iid, None) is not None:  # the connection went away while waiting
                self._emit(InteractionEvent(interaction=msgspec.structs.replace(
                    pending.interaction, state=InteractionState.EXPIRED, resolution="the agent exited")))
        if pending.option_id:
            return {"outcome": {"outcome": "selected", "optionId": pending.option_id}}
        return cancelled

    def _check_not_abandoned(self, method: str) -> None:
        """Refuse a file request of a turn ended here whose cancel the shared agent ignored: no
        later turn's checkpoint would own what it writes."""
        if self._abandoned is not None:
            log.warning("acp.fs_after_cancel", agent=self._provider.name, conversation=self.id, method=method)
            raise RpcError(s.INVALID_REQUEST, "the turn was cancelled; agentd serves no file request of it")

    async def _on_read(self, params: Any) -> Any:
        self._check_not_abandoned("fs/read_text_file")
        try:
            return await _fs.read_text_file(self.files, params, missing_file=self._provider.config.missing_file)
        except agentfs.Refused as exc:
            raise self._refuse("fs/read_text_file", exc) from None

    async def _on_write(self, params: Any) -> Any:
        self._check_not_abandoned("fs/write_text_file")
        try:
            return await _fs.write_text_file(self.files, params)
        except agentfs.Refused as exc:
            raise self._refuse("fs/write_text_file", exc) from None

    def _refuse(self, method: str, exc: agentfs.Refused) -> RpcError:
        """Journal the refusal (a notice item) and build the error answered to the agent."""
        text = f"Refused {method} of {exc.path}: {exc}"
        log.warning("acp.fs_refused", agent=self._provider.name, conversation=self.id, method=method, path=exc.path,
                    why=exc.kind)
        self._put(Item(id=f"notice-{uuid.uuid4().hex[:12]}", kind=ItemKind.NOTICE, text=text, time=utcnow()), emit=True)
        return RpcError(s.INVALID_PARAMS, f"access denied: {exc}", {"path": exc.path})

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        if self._closed or self._provider._nursery is None:
            raise Closed(self._closed_reason or f"conversation {self.id} is closed")

    def _emit(self, event: Event) -> None:
        self._sink.emit(event)

    def _mcp_skipped(self, skipped: list[tuple[str, str]]) -> None:
        """Servers left out of session/new or load (a transport the agent does not take): a notice each."""
        for name, why in skipped:
            notice = self.mcp.update(name, "failed", error=why)
            if notice is not None:
                self._emit(ItemEvent(item=notice))

    def _model_id(self) -> str:
        if self._models is not None and self._models.current_model_id:
            return self._models.current_model_id
        opt = self._option("model")
        return str(opt.current_value) if opt is not None and opt.current_value is not None else ""

    def _option(self, category: str) -> s.ConfigOption | None:
        return next((o for o in self._config if o.category == category or o.id == category), None)

    async def _request(self, agent: _Agent, method: str, params: dict[str, Any]) -> Any:
        try:
            return await agent.proc.request(method, params, timeout=REQUEST_TIMEOUT_S)
        except RpcError as exc:
            raise Invalid(f"{self._provider.name} refused {method}: {exc.describe()}") from None
        except ConnectionLost as exc:
            raise Closed(f"{self._provider.name} exited during {method}: {exc.reason}") from None
        except trio.TooSlowError:
            raise RuntimeUnavailable(f"{self._provider.name} did not answer {method} within {REQUEST_TIMEOUT_S:g} s") from None

    async def _set_option(self, agent: _Agent, opt: s.ConfigOption, value: str) -> None:
        values = opt.values()
        if values and value not in values:
            raise Invalid(f"{self._provider.name} offers no {opt.name or opt.id} {value!r}; choose one of: {', '.join(values)}")
        raw = await self._request(agent, "session/set_config_option",
                                  {"sessionId": self.id, "configId": opt.id, "value": value})
        try:
            options = msgspec.convert((raw or {}).get("configOptions") or [], list[s.ConfigOption])
        except (msgspec.ValidationError, AttributeError):
            options = []
        if options:
            self._config = options
        else:
            self._config = [msgspec.structs.replace(o, current_value=value) if o.id == opt.id else o for o in self._config]
