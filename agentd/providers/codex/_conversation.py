"""One Codex thread as a contract.Conversation: turns, items and deltas, approvals, questions.

Notifications arrive routed by threadId (:class:`._provider.AppServer`), in
order, on the trio thread; they never block. While a turn runs they become
events: ``item/started`` and ``item/completed`` upsert items (a tool item
running, then ended), ``item/agentMessage/delta`` and the reasoning deltas
stream text, ``item/commandExecution/outputDelta`` updates a running
command's output tail (at most every ``TAIL_EMIT_S``), ``thread/tokenUsage/updated``
reports the last model call's tokens and the context, and ``turn/completed``
ends the turn: completed, interrupted -> cancelled, failed -> failed with
Codex's error text.

Server requests (approvals, user input) become pending interactions and wait
for an answer in their own task of the connection. One not answered when its
turn ends (or the conversation closes) is answered for Codex with its
refusal (``cancel``/``decline``, no permissions granted, no answers), and
expires: no answer is ever made up on the user's behalf.
"""

from __future__ import annotations

import datetime as _dt
import math
import uuid
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
import trio

from ...contract import (
    Answer,
    Busy,
    Closed,
    Command,
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
    InternalError,
    Invalid,
    Item,
    ItemEvent,
    McpServerState,
    ItemKind,
    ModelSelection,
    ModelSelectionEvent,
    Prompt,
    SessionUnreadable,
    SubmissionUncertain,
    TitleEvent,
    TokensEvent,
    Turn,
    TurnDiff,
    TurnDiffEvent,
    TurnEvent,
    TurnState,
    Usage,
    UsageEvent,
    utcnow,
    validate_answer,
)
from ... import runtime_output
from ..._quick_lock import QuickLock
from .._common import unused_steer
from .._jsonrpc import Call, ConnectionLost, RpcError
from .._mcp import McpStates
from . import _mapping as m

if TYPE_CHECKING:
    from ._provider import AppServer, CodexProvider

log = structlog.get_logger("agentd.providers.codex")

#: how long mcp_status waits for the app-server's mcpServerStatus/list, s
MCP_STATUS_TIMEOUT_S = 5.0

#: a running command's item is re-emitted with its new output lines at most this often, s
TAIL_EMIT_S = 0.25
#: how long cancel and steer wait for Codex to name the running turn (turn/start's answer), s
TURN_ID_WAIT_S = 5.0


def parse_time(value: Any) -> _dt.datetime | None:
    """Codex's unix seconds as an aware UTC datetime."""
    if isinstance(value, (int, float)) and value > 0:
        return _dt.datetime.fromtimestamp(value, _dt.timezone.utc)
    return None


class _Turn:
    __slots__ = ("key", "codex_id", "named", "model", "done", "cancel_requested", "finished", "error", "steers")

    def __init__(self, model: str) -> None:
        self.key = uuid.uuid4().hex[:8]
        #: Codex's turn id, once turn/start answered or turn/started came
        self.codex_id = ""
        self.named = trio.Event()
        self.model = model
        self.done = trio.Event()
        self.cancel_requested = False
        self.finished = False
        #: the latest error notification Codex will not retry
        self.error = ""
        #: steers Codex accepted and has not used yet (its userMessage item not seen): (item id, text)
        self.steers: list[tuple[str, Prompt]] = []


class _Pending:
    __slots__ = ("interaction", "done", "answer")

    def __init__(self, interaction: Interaction) -> None:
        self.interaction = interaction
        self.done = trio.Event()
        self.answer: Answer | None = None


class _Tool:
    __slots__ = ("raw", "tail", "partial", "emitted_at")

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        self.tail = m.new_tail()
        self.partial: list[str] = []
        self.emitted_at = 0.0


class CodexConversation:
    """One Codex thread; implements contract.Conversation. Methods raise Closed after close.

    Long (past 600 lines) as one piece on purpose: the running turn, its pending interactions and
    its running tools are read and changed by the contract methods (send, steer, cancel, respond,
    close), the app-server's notifications and its server requests alike, and every end of a turn
    goes through :meth:`_finish` so it ends exactly once. What is pure mapping lives in
    :mod:`._mapping`; what is the app-server's, in :mod:`._provider`.
    """

    SERVER_REQUESTS = frozenset({"item/commandExecution/requestApproval", "item/fileChange/requestApproval",
                                 "item/permissions/requestApproval", "item/tool/requestUserInput",
                                 "mcpServer/elicitation/request"})

    def __init__(self, provider: CodexProvider, thread_id: str, workdir: str, sink: EventSink, *,
                 model: str = "", effort: str = "") -> None:
        self._provider = provider
        self._id = thread_id
        self.workdir = workdir
        self._sink = sink
        self._server: AppServer | None = None
        self._attach_lock = QuickLock()
        self._turn: _Turn | None = None
        self._starting = False
        self._pending: dict[str, _Pending] = {}
        self._tools: dict[str, _Tool] = {}
        self._model = model
        #: model and effort asked for the next turn (set_model), "" = unchanged
        self._next_model = ""
        self._effort = effort
        self._closed = False
        self._closed_reason = ""
        #: its MCP servers (the provider sets them at open) and their states
        self.mcp = McpStates([])
        self._mcp_changed = trio.Event()
        self._attached_at = 0.0

    @property
    def id(self) -> str:
        return self._id

    # ------------------------------------------------------------------ MCP servers

    def _on_mcp_startup(self, p: dict[str, Any]) -> None:
        """``mcpServer/startupStatus/updated``: one server's startup state; a failure is a notice."""
        name = p.get("name") or p.get("serverName") or p.get("server")
        status = p.get("status")
        if isinstance(status, dict):  # {"state": ..., "error": ...} in some versions
            error, status = str(status.get("error") or p.get("error") or ""), status.get("state") or status.get("type")
        else:
            error = str(p.get("error") or "")
        if isinstance(name, str) and isinstance(status, str):
            log.info("codex.mcp_server_state", conversation=self.id, server=name, state=status)
            self._mcp_changed.set()
            notice = self.mcp.update(name, status, error=error)
            if notice is not None and not self._closed:
                self._emit(ItemEvent(item=notice))

    async def _wait_for_mcp(self) -> None:
        """Before a turn: wait (at most the startup timeout) for the thread's MCP servers to start.

        Codex 0.171.0 starts a thread's servers in the background and a turn begun meanwhile
        offers the model none of their tools. A server not reported at all within 2 s of the
        thread's start or resume (Codex reports each as starting at once) is not waited for.
        """
        if not self.mcp.servers:
            return
        with trio.move_on_after(self._provider.config.startup_timeout_s):
            while True:
                fresh = trio.current_time() - self._attached_at < 5.0
                if not self.mcp.starting(unknown_too=fresh):
                    return
                self._mcp_changed = trio.Event()
                with trio.move_on_after(0.25 if fresh else math.inf):
                    await self._mcp_changed.wait()

    async def mcp_status(self) -> list[McpServerState]:
        """Each MCP server of the thread with its tools (``mcpServerStatus/list``); raises Closed."""
        self._check_open()
        if not self.mcp.servers:
            return []
        server = await self._attached()
        try:
            page = await server.request("mcpServerStatus/list", {"threadId": self.id}, timeout=MCP_STATUS_TIMEOUT_S)
        except RpcError as exc:  # an app-server without it: the startup states are what is known
            log.debug("codex.mcp_status_list_failed", conversation=self.id, error=exc.describe())
            return self.mcp.states()
        except trio.TooSlowError:
            # The app-server waits on a server that hangs: what agentd learned at start-up (its
            # failure notices) is what is known, and exactly when a server misbehaves it is wanted.
            log.info("codex.mcp_status_list_slow", conversation=self.id, timeout_s=MCP_STATUS_TIMEOUT_S)
            return self.mcp.states()
        except BaseException as exc:
            raise server.error("mcpServerStatus/list", exc) from None
        for entry in (page or {}).get("data") or [] if isinstance(page, dict) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                continue
            tools = entry.get("tools")
            names = sorted(tools) if isinstance(tools, dict) else [
                str(t.get("name")) for t in tools if isinstance(t, dict)] if isinstance(tools, list) else None
            if names is not None:
                self.mcp.tools(entry["name"], names)
        return self.mcp.states()

    @property
    def pid(self) -> int | None:
        server = self._server
        return server.proc.pid if server is not None and server.alive else None

    # ------------------------------------------------------------------ attaching to an app-server

    def _attach(self, server: AppServer, setup: Any) -> None:
        """Route the thread's messages from ``server``; ``setup`` is thread/start's or thread/resume's answer."""
        self._server = server
        self._attached_at = trio.current_time()
        server.threads[self._id] = self
        for early in server.early_mcp.pop(self._id, []):
            self._on_mcp_startup(early)
        if isinstance(setup, dict):
            self._model = str(setup.get("model") or self._model)
            thread = setup.get("thread") if isinstance(setup.get("thread"), dict) else {}
            self.workdir = self.workdir or str(thread.get("cwd") or setup.get("cwd") or "")

    async def _resume(self, server: AppServer) -> None:
        """thread/resume this thread into ``server``. Raises ConversationNotFound, SessionUnreadable (an error
        answer), RuntimeUnavailable (no answer in time, the app-server gone)."""
        params = {"threadId": self._id, "excludeTurns": True,
                  **self._provider.thread_params(self.workdir, self._next_model or self._model, self.mcp.servers)}
        server.threads[self._id] = self  # notifications may come before the answer
        timeout = self._provider.config.startup_timeout_s
        try:
            raw = await server.request("thread/resume", params, timeout=timeout)
        except RpcError as exc:
            server.threads.pop(self._id, None)
            text = exc.describe()
            # 0.171.0: "no rollout found for thread id ..." (unknown), "invalid session id: ..." (not a UUID)
            if any(m in text.lower() for m in ("not found", "no rollout", "invalid session id", "invalid thread id")):
                raise ConversationNotFound(f"{self._provider.name} has no thread {self._id!r}: {text}") from None
            # Up and answering, yet it cannot read the thread back (an empty rollout: agentd.lost_sessions decides).
            raise SessionUnreadable(f"{self._provider.name} refused thread/resume of {self._id!r}: {text}") from None
        except BaseException as exc:
            server.threads.pop(self._id, None)
            raise server.error("thread/resume", exc, timeout) from None
        self._attach(server, raw)

    async def _attached(self) -> AppServer:
        """The app-server this thread is live in: after the old one died, a new one with the thread resumed."""
        async with self._attach_lock:
            server = self._server
            if server is not None and server.alive:
                return server
            server = await self._provider.server()
            await self._resume(server)
            return server

    # ------------------------------------------------------------------ contract.Conversation

    async def send(self, prompt: Prompt) -> None:
        """Start a turn (turn/start) and return once it was written to the app-server.

        Emits the user item and TurnEvent(working) first; the turn ends with
        exactly one terminal TurnEvent. Raises Busy while a turn runs, Closed,
        RuntimeUnavailable when the app-server cannot start, ConversationNotFound
        or SessionUnreadable when a new one cannot resume the thread (nothing was
        sent; agentd.lost_sessions decides). A prompt that cannot be written fails
        its turn; never resent.
        """
        await self._start_turn(prompt, prompt.text, [])

    async def _start_turn(self, prompt: Prompt, shown: str, skills: list[dict[str, Any]]) -> None:
        self._check_open()
        if self._turn is not None or self._starting:
            raise Busy(f"a turn is running in conversation {self.id}")
        self._starting = True
        try:
            server = await self._attached()
            await self._wait_for_mcp()
            with trio.CancelScope(shield=True):
                self._check_open()
                turn = _Turn(self._next_model or self._model)
                self._turn = turn
                self._tools = {}
                self._emit(ItemEvent(item=Item(id=f"{turn.key}-user", kind=ItemKind.USER, text=shown, time=utcnow(),
                                               attachments=list(prompt.attachments))))
                self._emit(TurnEvent(turn=Turn(state=TurnState.WORKING, model=turn.model)))
                params: dict[str, Any] = {"threadId": self.id, "input": [*skills, *_input(prompt)]}
                if self._next_model:
                    params["model"] = self._next_model
                if self._effort:
                    params["effort"] = self._effort
                assert server.proc.conn is not None
                try:
                    call = await server.proc.conn.start("turn/start", params)
                except ConnectionLost as exc:
                    self._finish(turn, TurnState.FAILED, f"the prompt could not be delivered: {exc.reason}", "runtime_exit")
                    return
                if self._next_model:
                    self._model, self._next_model = self._next_model, ""
                self._provider._spawn(self._await_start, turn, call)
        finally:
            self._starting = False

    async def _await_start(self, turn: _Turn, call: Call) -> None:
        try:
            raw = await call.wait()
        except RpcError as exc:
            self._finish(turn, TurnState.FAILED, f"Codex refused the prompt: {exc.describe()}")
            return
        except ConnectionLost:
            return  # the app-server's exit fails the turn (_runtime_exited)
        tid = (raw or {}).get("turn", {}).get("id") if isinstance(raw, dict) else None
        if isinstance(tid, str) and not turn.codex_id:
            turn.codex_id = tid
            turn.named.set()

    async def _skills(self) -> list[dict[str, Any]]:
        server = await self._attached()
        try:
            raw = await server.request("skills/list", {"cwds": [self.workdir] if self.workdir else []})
        except RpcError as exc:
            raise InternalError(f"Codex did not list its skills: {exc.describe()}") from None
        except ConnectionLost as exc:
            raise Closed(f"the Codex app-server went away: {exc.reason}") from None
        out: list[dict[str, Any]] = []
        for entry in (raw or {}).get("data") or []:
            for skill in (entry.get("skills") or []) if isinstance(entry, dict) else []:
                if isinstance(skill, dict) and isinstance(skill.get("name"), str) and skill.get("enabled", True):
                    out.append(skill)
        return out

    async def commands(self) -> list[Command]:
        """The enabled skills Codex finds for this thread's folder (skills/list); Codex's own slash
        commands act on its terminal interface and are not offered. Raises Closed, RuntimeUnavailable."""
        self._check_open()
        return [Command(name=sk["name"], kind="skill",
                        description=str(sk.get("shortDescription") or sk.get("description") or ""))
                for sk in await self._skills()]

    async def run_command(self, name: str, args: Prompt) -> None:
        """Start a turn whose input is the skill (by name and path) and ``args`` as text; the user item
        shows ``/name args``. Raises Invalid when Codex no longer lists the skill, and what ``send`` raises."""
        self._check_open()
        skill = next((sk for sk in await self._skills() if sk["name"] == name), None)
        if skill is None:
            raise Invalid(f"Codex lists no skill {name!r}")
        shown = f"/{name} {args.text}" if args.text else f"/{name}"
        text = args.text or f"Use the {name} skill."
        await self._start_turn(Prompt(text=text, attachments=list(args.attachments)), shown,
                               [{"type": "skill", "name": name, "path": str(skill.get("path") or "")}])

    async def steer(self, prompt: Prompt) -> None:
        """Add ``prompt`` to the running turn (turn/steer with the expected turn id).

        Raises Invalid when no turn runs (or Codex refuses: the turn just
        ended), SubmissionUncertain when the app-server went away meanwhile.
        """
        self._check_open()
        turn, server = self._turn, self._server
        if turn is None or server is None or not server.alive:
            raise Invalid("no turn is running; send the prompt instead")
        with trio.move_on_after(TURN_ID_WAIT_S):
            await turn.named.wait()
        if not turn.codex_id:
            raise Invalid("the running turn has not started in Codex yet; try again")
        # Its user item comes when Codex uses it (a userMessage item of this turn; see _item), which
        # may be read before the answer to turn/steer: noted first, dropped again when refused.
        steer = (f"{turn.key}-steer-{uuid.uuid4().hex[:6]}", prompt)
        turn.steers.append(steer)
        try:
            await server.request("turn/steer", {"threadId": self.id, "expectedTurnId": turn.codex_id,
                                                "input": _input(prompt)})
        except RpcError as exc:
            if steer in turn.steers:
                turn.steers.remove(steer)
            raise Invalid(f"Codex refused the steering prompt: {exc.describe()}") from None
        except (ConnectionLost, trio.TooSlowError) as exc:
            raise SubmissionUncertain(f"Codex may or may not have received the steering prompt ({exc}); "
                                      "it is not resent") from None

    async def cancel(self) -> None:
        """Interrupt the running turn (turn/interrupt) and return once it ended; no turn: a no-op.

        Pending interactions expire (Codex gets their refusal). A turn Codex
        has not ended within ``cancel_timeout_s`` ends cancelled with reason
        ``cancel_timeout``.
        """
        self._check_open()
        turn = self._turn
        if turn is None:
            await trio.lowlevel.checkpoint()
            return
        turn.cancel_requested = True
        self._expire_pending("cancelled")
        timeout = self._provider.config.cancel_timeout_s
        with trio.move_on_after(timeout):
            await turn.named.wait()
            server = self._server
            if server is not None and server.alive and server.proc.conn is not None:
                try:
                    await server.proc.conn.start("turn/interrupt", {"threadId": self.id, "turnId": turn.codex_id})
                except ConnectionLost:
                    pass
            await turn.done.wait()
        if not turn.done.is_set():
            log.warning("codex.cancel_timeout", provider=self._provider.name, conversation=self.id)
            self._finish(turn, TurnState.CANCELLED, "", "cancel_timeout")

    async def respond(self, interaction_id: str, answer: Answer) -> None:
        """Answer a pending approval (one of Codex's decisions) or user-input request.

        Raises InteractionGone when not pending, Invalid when the answer does not fit.
        """
        self._check_open()
        pending = self._pending.get(interaction_id)
        if pending is None:
            raise InteractionGone(f"interaction {interaction_id!r} is not pending")
        validate_answer(pending.interaction, answer)
        del self._pending[interaction_id]
        pending.answer = answer
        inter = pending.interaction
        if inter.kind is InteractionKind.PERMISSION:
            option = next(o for o in inter.options if o.id == answer.decision)
            state, resolution = (InteractionState.REJECTED if option.reject else InteractionState.ANSWERED), option.id
        else:
            state = InteractionState.REJECTED if answer.reject else InteractionState.ANSWERED
            resolution = "rejected" if answer.reject else "answered"
        self._emit(InteractionEvent(interaction=msgspec.structs.replace(inter, state=state, resolution=resolution)))
        pending.done.set()
        await trio.lowlevel.checkpoint()

    async def history(self) -> HistoryRecord:
        """The thread's items as Codex recorded them (thread/read with its turns)."""
        self._check_open()
        server = await self._attached()
        try:
            raw = await server.request("thread/read", {"threadId": self.id, "includeTurns": True})
        except BaseException as exc:
            raise server.error("thread/read", exc) from None
        items: list[Item] = []
        thread = (raw or {}).get("thread") or {}
        for t in thread.get("turns") or []:
            for it in (t.get("items") or []) if isinstance(t, dict) else []:
                item = m.item(it) if isinstance(it, dict) else None
                if item is not None:
                    items.append(item)
        return HistoryRecord(items=items, model=str(thread.get("model") or self._model))

    async def rewind(self, marker: str) -> None:
        """Drop every turn after Codex turn ``marker`` from the thread (thread/revert before the
        turn that follows it; nothing follows: nothing to do). Idle only.

        Raises Busy while a turn runs, Invalid when the thread has no turn ``marker``,
        SubmissionUncertain when thread/revert was sent but its answer was lost.
        """
        self._check_open()
        if self._turn is not None or self._starting:
            raise Busy(f"a turn is running in thread {self.id}")
        server = await self._attached()
        try:
            raw = await server.request("thread/read", {"threadId": self.id, "includeTurns": True})
        except BaseException as exc:
            raise server.error("thread/read", exc) from None
        ids = [str(t.get("id")) for t in ((raw or {}).get("thread") or {}).get("turns") or [] if isinstance(t, dict)]
        if marker not in ids:
            raise Invalid(f"{self._provider.name} thread {self.id} has no turn {marker!r}")
        after = ids[ids.index(marker) + 1:]
        if not after:
            return
        try:
            await server.request("thread/revert", {"threadId": self.id, "beforeTurnId": after[0]})
        except RpcError as exc:
            raise InternalError(f"{self._provider.name} refused thread/revert: {exc.describe()}") from None
        except BaseException as exc:
            if isinstance(exc, trio.Cancelled):
                raise
            raise SubmissionUncertain(f"thread/revert of {self.id} may or may not have happened: {exc}") from None
        log.info("codex.reverted", provider=self._provider.name, conversation=self.id, kept=marker, dropped=len(after))

    async def set_model(self, model: str, effort: str = "") -> None:
        """Use ``model`` (and reasoning ``effort``) from the next turn on (turn/start's overrides)."""
        self._check_open()
        await trio.lowlevel.checkpoint()
        if model and model != self._model:
            self._next_model = model
        if effort:
            self._effort = effort
        self._emit(ModelSelectionEvent(selection=ModelSelection(model=model or self._model, effort=effort or None)))

    async def set_title(self, title: str) -> None:
        """Name the thread in Codex's store (thread/name/set); the daemon journals the title itself."""
        self._check_open()
        server = await self._attached()
        try:
            await server.request("thread/name/set", {"threadId": self.id, "name": title})
        except RpcError as exc:
            raise Invalid(f"Codex refused the title: {exc.describe()}") from None
        except BaseException as exc:
            raise server.error("thread/name/set", exc) from None

    async def close(self) -> None:
        """Interrupt a running turn (reason ``closed``) and stop routing the thread; the app-server,
        shared with other conversations, keeps running. Idempotent; not cancellable."""
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        self._closed = True
        self._closed_reason = f"conversation {self.id} is closed"
        with trio.CancelScope(shield=True):
            server, self._server = self._server, None
            turn = self._turn
            if turn is not None:
                turn.cancel_requested = True
                self._expire_pending("closed")
                if server is not None and server.alive and server.proc.conn is not None and turn.codex_id:
                    try:
                        await server.proc.conn.start("turn/interrupt", {"threadId": self.id, "turnId": turn.codex_id})
                    except ConnectionLost:
                        pass
                self._finish(turn, TurnState.CANCELLED, "", "closed")
            if server is not None:
                if server.threads.get(self.id) is self:
                    del server.threads[self.id]
                if server.alive and server.proc.conn is not None:
                    try:
                        await server.proc.conn.start("thread/unsubscribe", {"threadId": self.id})
                    except ConnectionLost:
                        pass
        self._provider._forget(self)

    # ------------------------------------------------------------------ notifications

    def note_quota(self, quotas: list[Any]) -> None:
        """The account's rate-limit snapshot arrived: a running turn's usage carries it."""
        if self._turn is not None and not self._closed:
            self._emit(UsageEvent(usage=Usage(quota=list(quotas))))

    def _on_notification(self, server: AppServer, method: str, p: dict[str, Any]) -> None:
        if server is not self._server:
            return
        if method == "mcpServer/startupStatus/updated":
            self._on_mcp_startup(p)
            return
        unknown = m.unknown_notification(self._provider.name, method, p)
        if unknown is not None:
            self._emit(unknown)  # a newer runtime's kind: journaled verbatim, never dropped
            return
        turn = self._turn
        if method == "thread/name/updated":
            name = p.get("threadName") or p.get("name")
            if isinstance(name, str) and name:
                self._emit(TitleEvent(title=name))
            return
        if turn is None:
            return
        codex_turn = p.get("turnId") or (p.get("turn") or {}).get("id")
        if method == "turn/started":
            if isinstance(codex_turn, str) and not turn.codex_id:
                turn.codex_id = codex_turn
                turn.named.set()
            return
        if turn.codex_id and isinstance(codex_turn, str) and codex_turn != turn.codex_id:
            return  # a straggler of an earlier turn
        if method == "item/agentMessage/delta":
            self._delta(p, ItemKind.ASSISTANT)
        elif method in ("item/reasoning/summaryTextDelta", "item/reasoning/textDelta"):
            self._delta(p, ItemKind.REASONING)
        elif method == "item/started":
            self._item(p.get("item"), started=True)
        elif method == "item/completed":
            self._item(p.get("item"), started=False)
        elif method == "item/commandExecution/outputDelta":
            self._output(p)
        elif method == "turn/diff/updated":
            if isinstance(p.get("diff"), str):  # the runtime's own record of the turn's changes: kept
                self._emit(TurnDiffEvent(turn_diff=TurnDiff(diff=p["diff"])))
        elif method == "thread/tokenUsage/updated":
            tokens, context = m.token_usage(p, turn.model or self._model)
            if tokens is not None:
                self._emit(TokensEvent(tokens=tokens))
            if context is not None:
                self._emit(ContextEvent(context=Context(used=context[0], limit=context[1])))
        elif method == "error":
            err = p.get("error") if isinstance(p.get("error"), dict) else {}
            if not p.get("willRetry") and err.get("message"):
                turn.error = str(err["message"])
        elif method == "turn/completed":
            t = p.get("turn") if isinstance(p.get("turn"), dict) else {}
            status = t.get("status")
            if status == "completed":
                self._finish(turn, TurnState.COMPLETED)
            elif status == "interrupted":
                self._finish(turn, TurnState.CANCELLED)
            else:
                err = t.get("error") if isinstance(t.get("error"), dict) else {}
                text = str(err.get("message") or turn.error or f"the turn ended {status or 'without a status'}")
                detail = err.get("additionalDetails")
                if isinstance(detail, str) and detail and detail not in text:
                    text = f"{text}: {detail}"
                self._finish(turn, TurnState.FAILED, text)

    def _delta(self, p: dict[str, Any], kind: ItemKind) -> None:
        text, iid = p.get("delta"), p.get("itemId")
        if isinstance(text, str) and text and isinstance(iid, str):
            self._emit(DeltaEvent(delta=Delta(item_id=iid, kind=kind, text=text)))

    def _item(self, raw: Any, *, started: bool) -> None:
        if isinstance(raw, dict) and raw.get("type") == "userMessage":
            if not started:
                self._steer_used(m.user_text(raw.get("content")))
            return  # the prompt: its user item is agentd's own; a steer's is emitted once Codex used it
        if not isinstance(raw, dict):
            return
        kind = raw.get("type")
        if not started and (unknown := m.unknown_item(self._provider.name, raw)) is not None:
            self._emit(unknown)  # an item type of a newer runtime, once, as it completed
            return
        if kind in m.TOOL_TYPES:
            iid = str(raw.get("id") or "")
            tool = self._tools.get(iid)
            if tool is None:
                tool = self._tools[iid] = _Tool(raw)
            else:
                tool.raw = raw
            if not started:
                del self._tools[iid]
                if kind == "webSearch" and not raw.get("status"):
                    raw = {**raw, "status": "completed"}
            item = m.item(raw)
            if item is not None and item.tool is not None and started:
                item.tool = m.tool_call(raw, tool.tail)
            if item is not None and item.tool is not None and not started:
                # the record keeps a display cut; the whole output goes beside the journal (issue 13, item 6)
                for event in runtime_output.whole_output(item.tool, m.whole_tool_text(raw), item.id):
                    self._emit(event)
            if item is not None:
                self._emit(ItemEvent(item=item))
            return
        if started:
            return  # a message or reasoning item: its deltas stream, item/completed brings it whole
        item = m.item(raw)
        if item is None:
            log.debug("codex.item_ignored", provider=self._provider.name, type=kind)
        elif item.text:
            self._emit(ItemEvent(item=item))

    def _output(self, p: dict[str, Any]) -> None:
        tool = self._tools.get(str(p.get("itemId")))
        delta = p.get("delta")
        if tool is None or not isinstance(delta, str):
            return
        m.push_output(tool.tail, tool.partial, delta)
        now = trio.current_time()
        if now - tool.emitted_at >= TAIL_EMIT_S:
            tool.emitted_at = now
            item = m.item(tool.raw)
            if item is not None:
                item.tool = m.tool_call(tool.raw, tool.tail)
                self._emit(ItemEvent(item=item))

    # ------------------------------------------------------------------ server requests

    async def _on_server_request(self, server: AppServer, method: str, params: dict[str, Any]) -> Any:
        turn = self._turn
        refused = _refusal(method, params)
        if server is not self._server or turn is None or turn.cancel_requested or self._closed:
            return refused
        iid = f"{'ask' if method == 'item/tool/requestUserInput' else 'perm'}-{uuid.uuid4().hex[:12]}"
        values: dict[str, Any] = {}
        qids: list[str] = []
        tool_item = str(params.get("itemId") or "")
        if method == "mcpServer/elicitation/request":
            if not m.is_mcp_tool_approval(method, params):
                return refused  # an MCP server's own form: not mapped yet, declined
            title, detail = m.mcp_tool_approval_detail(params)
            inter = Interaction(id=iid, kind=InteractionKind.PERMISSION, title=title, detail=detail,
                                options=list(m.MCP_TOOL_OPTIONS), time=utcnow())
        elif method == "item/tool/requestUserInput":
            questions, qids = m.questions(params)
            if not questions:
                return refused
            inter = Interaction(id=iid, kind=InteractionKind.QUESTION, title=questions[0].header or "Codex asks",
                                questions=questions, time=utcnow(), tool_call_id=tool_item)
        else:
            title, detail = m.approval_detail(method, params)
            if method == "item/permissions/requestApproval":
                options = list(m.PERMISSION_GRANT_OPTIONS)
            else:
                options, values = m.permission_options(params.get("availableDecisions"))
            inter = Interaction(id=iid, kind=InteractionKind.PERMISSION, title=title, detail=detail, options=options,
                                time=utcnow(), tool_call_id=tool_item)
        pending = _Pending(inter)
        self._pending[iid] = pending
        self._emit(InteractionEvent(interaction=inter))
        try:
            await pending.done.wait()
        finally:
            if self._pending.pop(iid, None) is not None:  # the app-server went away while waiting
                self._emit(InteractionEvent(interaction=msgspec.structs.replace(
                    inter, state=InteractionState.EXPIRED, resolution="the app-server exited")))
        answer = pending.answer
        if answer is None:
            return refused
        if method == "item/tool/requestUserInput":
            return {"answers": {}} if answer.reject else m.user_input_answer(qids, list(answer.answers))
        if method == "item/permissions/requestApproval":
            return m.permission_grant(params, answer.decision)
        if method == "mcpServer/elicitation/request":
            return {"action": "accept", "content": {}} if answer.decision == "accept" else {"action": "decline"}
        return {"decision": values.get(answer.decision, answer.decision)}

    # ------------------------------------------------------------------ ends

    def _steer_used(self, text: str) -> None:
        turn = self._turn
        if turn is None:
            return
        for n, (iid, prompt) in enumerate(turn.steers):
            if prompt.text == text or prompt.text in text:
                del turn.steers[n]
                self._emit(ItemEvent(item=Item(id=iid, kind=ItemKind.USER, text=prompt.text, time=utcnow(),
                                               delivery="steer", attachments=list(prompt.attachments))))
                return

    def _finish(self, turn: _Turn, state: TurnState, error: str = "", reason: str = "") -> None:
        """End ``turn`` once: fail its running tools, expire its interactions, emit its terminal TurnEvent."""
        if turn.finished:
            return
        turn.finished = True
        if self._turn is turn:
            why = reason or ("cancelled" if state is TurnState.CANCELLED else error or "the turn ended")
            for tool in self._tools.values():
                item = m.item({**tool.raw, "status": "failed"})
                if item is not None and item.tool is not None:
                    item.tool.output = f"{item.tool.output}\n{why}" if item.tool.output else why
                    item.ended_at = utcnow()
                    self._emit(ItemEvent(item=item))
            self._tools = {}
            self._expire_pending(why)
            for iid, prompt in turn.steers:
                self._emit(ItemEvent(item=unused_steer(iid, prompt.text)))
            turn.steers = []
            self._turn = None
        # The turn id is what thread/fork and thread/revert name a turn by (agentd.branching).
        marker = turn.codex_id if reason not in ("cancel_timeout", "runtime_exit") else ""
        self._emit(TurnEvent(turn=Turn(state=state, error=error, reason=reason, model=turn.model, marker=marker)))
        turn.named.set()
        turn.done.set()
        if state is TurnState.COMPLETED:
            self._provider._turn_completed()

    def _expire_pending(self, why: str) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():
            self._emit(InteractionEvent(interaction=msgspec.structs.replace(
                p.interaction, state=InteractionState.EXPIRED, resolution=why)))
            p.done.set()  # its handler answers Codex with the refusal

    def _runtime_exited(self, server: AppServer, reason: str) -> None:
        """The app-server ended on its own: fail the turn (``runtime_exit``), then ExitEvent.

        The conversation stays usable: the next send starts an app-server and resumes the thread.
        """
        if server is not self._server:
            return
        self._server = None
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
        self._server = None

    def _check_open(self) -> None:
        if self._closed or self._provider._nursery is None:
            raise Closed(self._closed_reason or f"conversation {self.id} is closed")

    def _emit(self, event: Event) -> None:
        self._sink.emit(event)


def _refusal(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """What Codex gets for a request nobody answered: the strongest refusal it offers."""
    if method == "item/tool/requestUserInput":
        return {"answers": {}}
    if method == "item/permissions/requestApproval":
        return {"permissions": {}, "scope": "turn"}
    if method == "mcpServer/elicitation/request":
        return {"action": "decline"}
    _, values = m.permission_options(params.get("availableDecisions"))
    return {"decision": "cancel" if "cancel" in values else "decline"}


def _input(prompt: Prompt) -> list[dict[str, Any]]:
    """turn/start's input: the text, images as local images, other files named by their path."""
    items: list[dict[str, Any]] = [{"type": "text", "text": prompt.text, "text_elements": []}]
    for a in prompt.attachments:
        if not a.path:
            continue
        if a.mime.startswith("image/"):
            items.append({"type": "localImage", "path": a.path})
        else:
            items.append({"type": "text", "text": f"Attached file {a.name} ({a.mime}, {a.size} bytes): {a.path}",
                          "text_elements": []})
    return items


__all__ = ["CodexConversation", "parse_time"]
