"""One conversation (a Copilot CLI session) held open by the provider.

Threads: SDK callbacks (:meth:`CopilotConversation._sdk_event` and the
question handlers) run on the bridge's asyncio thread and do nothing there
but hand over to trio (``bridge.to_trio``) or await an asyncio future. All
state below, and every ``sink.emit``, lives on the trio thread.

A turn: ``send`` marks it *submitting* and hands the prompt to the CLI;
events that arrive before the CLI's answer are held back, so the
``TurnEvent(working)`` always comes first. The CLI's ``session.idle`` ends
the turn: ``failed`` after a ``session.error``, ``cancelled`` after an abort
(ours, or the CLI's own after a denied permission), else ``completed``. A
runtime exit ends it ``failed`` with reason ``runtime_exit``. A message of the
session that agentd's reader refused (over the 64 MiB ceiling, or no JSON-RPC;
agentd.providers.copilot._reader) is a notice item where it was lost; the CLI's
turn is aborted, and ends ``failed`` with the reader's text (reason ``error``).
Each turn gets exactly one terminal ``TurnEvent``.

``session.idle`` is ephemeral (the CLI keeps it in no record) and can be
lost, so the end does not hang on it alone: once the main agent's
``assistant.turn_end`` followed a final message (no tool requests) and no
idle came within IDLE_GRACE_S, or the turn has been quiet for QUIET_PROBE_S
with nobody asked anything, the session's own state is read
(``session.metadata.isProcessing``); a session no longer processing ends the
turn as its durable events say (``inferred``, reason ``end_event_lost``). A
cancel the CLI does not confirm within CANCEL_GRACE_S ends it ``cancelled``,
reason ``cancel_timeout``.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import os
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
import trio
from copilot._jsonrpc import JsonRpcError, ProcessExitedError
from copilot.generated import rpc as _rpc
from copilot.generated import session_events as se

from ...contract import (
    Answer,
    Closed,
    Command,
    Event,
    EventSink,
    ExitEvent,
    HistoryRecord,
    Interaction,
    InteractionEvent,
    Item,
    ItemKind,
    InteractionGone,
    InteractionState,
    InternalError,
    ItemEvent,
    NotFound,
    Invalid,
    McpServerState,
    Prompt,
    SubmissionUncertain,
    TodoList,
    TodosEvent,
    Turn,
    TurnEvent,
    TurnState,
    Busy,
    utcnow,
    validate_answer,
)
from .._mcp import McpStates
from . import _mapping as m
from .._common import unused_steer
from ._bridge import BridgeClosed

if TYPE_CHECKING:
    from ._provider import CopilotProvider, _Runtime

log = structlog.get_logger(__name__)

T = se.SessionEventType
#: the CLI's MCP server events agentd reads (the rest of its MCP events are unknown records)
_MCP_EVENTS = frozenset({T.SESSION_MCP_SERVERS_LOADED, T.SESSION_MCP_SERVER_STATUS_CHANGED})
_MCP_NAMES = frozenset(t.value for t in _MCP_EVENTS)


def unread_event_type(name: str) -> bool:
    """Whether session events of type ``name`` (the CLI's type string) may go unparsed: those
    :meth:`CopilotConversation._sdk_event` drops unseen. The reader drops them in its thread
    (``drop_event``), before the SDK builds a ``SessionEvent`` and hops it to its loop."""
    return name not in _MCP_NAMES and m.inert_type(name)


def _enum_value(value: Any) -> str:
    return str(getattr(value, "value", value) or "")

#: How long the CLI may take to accept a prompt before the submission counts as uncertain.
SUBMIT_TIMEOUT_S = 30.0
#: How long control calls (abort, answer, model, title, history) may take.
RPC_TIMEOUT_S = 30.0
#: After a cancel, the turn is ended by us if the CLI has not ended it within this long.
CANCEL_GRACE_S = 5.0
#: After the abort of a turn whose message was refused, the turn is ended by us if the CLI has not
#: ended it within this long (longer than a cancel's: the CLI may still be writing that huge message
#: into its other events, seconds each).
REFUSED_GRACE_S = 30.0
#: After the final assistant.turn_end, how long session.idle may take before the session's state is read.
IDLE_GRACE_S = 2.0
#: A turn quiet this long (nobody asked anything) has the session's state read too.
QUIET_PROBE_S = 60.0
#: Turn end reason when the CLI's end event never came but the session says the turn is over.
END_EVENT_LOST = "end_event_lost"

_TITLE_BAD = re.compile(r'["\x00-\x1f\x7f]')


class _TurnPhase(enum.Enum):
    IDLE = "idle"
    SUBMITTING = "submitting"  # send() is waiting for the CLI; events are held back
    UNCERTAIN = "uncertain"  # send() gave up waiting; the CLI may or may not run it
    RUNNING = "running"


@dataclass(frozen=True)
class _Refused:
    """A refused message of the session, held back with the events while the prompt is submitted."""

    text: str


@dataclass
class _Pending:
    """A pending interaction and how to answer it."""

    interaction: Interaction
    #: permission: the SDK event data; questions and plans: the asyncio future the handler awaits
    data: Any = None
    future: asyncio.Future[Any] | None = None
    #: "permission", "ask_user", "elicitation" or "plan"
    via: str = ""


class CopilotConversation:
    """A Copilot CLI session as a :class:`agentd.contract.Conversation`; see the module docstring."""

    def __init__(self, provider: CopilotProvider, runtime: _Runtime, sink: EventSink, *, workdir: str, model: str, effort: str) -> None:
        self._provider = provider
        self._runtime = runtime
        self._bridge = provider._require_bridge()
        self._sink = sink
        self.workdir = workdir
        self.model = model
        self.effort = effort
        self.session: Any = None
        self._id = ""
        self._mapper = m.EventMapper()
        #: its MCP servers (the provider sets them at open) and their states
        self.mcp = McpStates([])
        self._closed = False
        self._closed_reason = ""
        self._phase = _TurnPhase.IDLE
        self._held: list[se.SessionEvent | _Refused] = []
        #: steers the CLI took and has not delivered yet (no steering user.message came), oldest first
        self._steers: list[str] = []
        self._turn_no = 0
        self._turn_error = ""
        #: the reader refused a message of the running turn: the turn's error (it wins over the CLI's)
        self._refused = ""
        #: set once the abort of a turn whose message was refused reached the CLI (the next send waits for it)
        self._refused_abort: trio.Event | None = None
        self._aborted = ""
        #: id of the running turn's root user.message event (its Turn.marker)
        self._user_event = ""
        self._cancel_requested = False
        self._denied = False
        self._pending: dict[str, _Pending] = {}
        self._flush_scheduled = False
        #: the main agent's last message had no tool requests and its assistant.turn_end came
        self._final_end = False
        self._final_message = False
        #: trio time of the last event of this session (the end probe's clock)
        self._last_event_at = 0.0
        # asyncio-thread side: requests announced by events, waiting for their handler
        self._announced: dict[str, collections.deque[tuple[str, str, str]]] = collections.defaultdict(collections.deque)

    # ------------------------------------------------------------------ identity

    @property
    def id(self) -> str:
        """The Copilot session id (persist it to reopen this conversation)."""
        return self._id

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<CopilotConversation {self._id or '?'} {self._phase.value}{' closed' if self._closed else ''}>"

    # ------------------------------------------------------------------ SDK wiring (asyncio thread)

    def session_options(self) -> dict[str, Any]:
        """Handlers and options for ``create_session`` / ``resume_session``."""
        return {
            "on_event": self._sdk_event,
            "on_permission_request": _leave_pending,
            "on_user_input_request": self._ask_user,
            "on_elicitation_request": self._elicit,
            "on_exit_plan_mode_request": self._review_plan,
            "streaming": True,
            "working_directory": self.workdir,
            "client_name": "agentd",
            # Where the CLI finds skills, the same places it looks in a folder it trusts; agentd's
            # sessions do not discover the folder's other configuration (hooks, MCP servers).
            "skill_directories": [os.path.join(self.workdir, d, "skills") for d in (".github", ".claude", ".agents")]
            + [str(self._provider.copilot_home / "skills")],
        }

    def _sdk_event(self, event: se.SessionEvent) -> None:
        """SDK callback (asyncio thread): note request ids, then hand the event to trio (unless inert;
        the reader drops most of those before the SDK parses them, :func:`unread_event_type`)."""
        t = event.type
        if t in _MCP_EVENTS:
            self._bridge.to_trio(self._on_mcp, event)
            return
        if m.inert(event):
            return
        d: Any = event.data
        if t is T.USER_INPUT_REQUESTED:
            self._announced["ask_user"].append((d.request_id, d.question, d.tool_call_id or ""))
        elif t is T.ELICITATION_REQUESTED:
            self._announced["elicitation"].append((d.request_id, d.message, d.tool_call_id or ""))
        elif t is T.EXIT_PLAN_MODE_REQUESTED:
            self._announced["plan"].append((d.request_id, d.summary, ""))
        self._bridge.to_trio(self._on_event, event)

    def _claim(self, via: str, key: str) -> tuple[str, str]:
        """(request id, tool call id) the CLI announced for a handler call (asyncio thread).

        The SDK calls a question handler right after dispatching the event
        that announced it, without its request id; the oldest announcement
        with the same text is the one. Unknown: a fresh id.
        """
        queue = self._announced[via]
        for i, (rid, text, tool_call_id) in enumerate(queue):
            if text == key:
                del queue[i]
                return rid, tool_call_id
        if queue:
            rid, _, tool_call_id = queue.popleft()
            return rid, tool_call_id
        return f"{via}-{uuid.uuid4()}", ""

    async def _ask_user(self, request: dict[str, Any], invocation: dict[str, str]) -> dict[str, Any]:
        """SDK user-input handler (asyncio thread): waits for :meth:`respond`."""
        question = request.get("question", "")
        rid, tool_call_id = self._claim("ask_user", question)
        inter = m.ask_user_interaction(rid, question, list(request.get("choices") or []), bool(request.get("allowFreeform", True)), tool_call_id=tool_call_id)
        return await self._wait_for_answer(inter, "ask_user")

    async def _elicit(self, context: dict[str, Any]) -> dict[str, Any]:
        """SDK elicitation handler (asyncio thread): waits for :meth:`respond`."""
        rid, tool_call_id = self._claim("elicitation", context.get("message", ""))
        inter = m.elicitation_interaction(rid, context)
        inter.tool_call_id = tool_call_id
        return await self._wait_for_answer(inter, "elicitation")

    async def _review_plan(self, request: dict[str, Any], invocation: dict[str, str]) -> dict[str, Any]:
        """SDK exit-plan-mode handler (asyncio thread): waits for :meth:`respond`."""
        rid, _ = self._claim("plan", request.get("summary", ""))
        inter = m.plan_interaction(rid, request)
        return await self._wait_for_answer(inter, "plan")

    async def _wait_for_answer(self, inter: Interaction, via: str) -> dict[str, Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._bridge.to_trio(self._open_interaction, _Pending(interaction=inter, future=future, via=via))
        try:
            return await future
        finally:
            if not future.done():
                future.cancel()

    # ------------------------------------------------------------------ events (trio thread)

    def _emit(self, event: Event) -> None:
        try:
            self._sink.emit(event)
        except Exception:
            log.exception("copilot.sink_failed", conversation=self._id, event=type(event).__name__)

    def _on_mcp(self, event: se.SessionEvent) -> None:
        """An MCP server's state from the CLI's session events; a failure is a notice item."""
        d: Any = event.data
        updates: list[tuple[str, str, str]] = []
        if event.type is T.SESSION_MCP_SERVERS_LOADED:
            updates = [(s.name, _enum_value(s.status), s.error or "") for s in d.servers]
        elif event.type is T.SESSION_MCP_SERVER_STATUS_CHANGED:
            updates = [(d.server_name, _enum_value(d.status), d.error or "")]
        for name, state, error in updates:
            notice = self.mcp.update(name, state, error=error)
            if notice is not None and not self._closed:
                self._emit(ItemEvent(item=notice))

    async def mcp_status(self) -> list[McpServerState]:
        """Each MCP server's state and tools as the CLI reports them (``session.mcp.list``,
        ``session.mcp.listTools``); raises Closed."""
        self._check_open()
        if not self.mcp.servers:
            return []
        listed = await self._call("the MCP server list", self.session.rpc.mcp.list)
        for server in listed.servers:
            self.mcp.update(server.name, _enum_value(server.status), error=server.error or "")
        for state in self.mcp.states():
            if state.state == "connected":
                try:
                    tools = await self._call("the MCP tool list", self.session.rpc.mcp.list_tools,
                                             _rpc.MCPListToolsRequest(server_name=state.name))
                except JsonRpcError:
                    continue
                self.mcp.tools(state.name, [t.name for t in tools.tools])
        return self.mcp.states()

    def _on_event(self, event: se.SessionEvent) -> None:
        if self._closed:
            return
        self._last_event_at = trio.current_time()
        if self._phase is _TurnPhase.SUBMITTING:
            self._held.append(event)
            return
        self._handle(event)

    def _handle(self, ev: se.SessionEvent) -> None:
        t = ev.type
        main = not ev.agent_id
        if main and t is T.USER_MESSAGE and not self._user_event and ev.data.delivery is not se.UserMessageDelivery.STEERING:
            self._user_event = str(ev.id)  # the turn's root user message: fork and rewind name the turn by it
        if main and t in (T.USER_MESSAGE, T.ASSISTANT_TURN_START) and self._phase is not _TurnPhase.RUNNING:
            # The CLI runs a turn we did not see start: an uncertain submission that
            # went through, or work the CLI started by itself. Report it as a turn.
            self._reset_turn()
            self._begin_turn()
        for out in self._mapper.map(ev):
            self._emit(out)
        if main and t is T.USER_MESSAGE and self._steers and ev.data.delivery in m.STEER_DELIVERIES:
            self._steer_used(ev.data.content or "")
        if self._mapper.flush_pending():
            self._schedule_tail_flush()
        d: Any = ev.data
        if t is T.PERMISSION_REQUESTED:
            if not d.resolved_by_hook:
                inter = m.permission_interaction(d, agent_id=ev.agent_id or "", time=ev.timestamp)
                self._open_interaction(_Pending(interaction=inter, data=d, via="permission"))
        elif t is T.PERMISSION_COMPLETED:
            state, resolution = m.permission_outcome(d.result)
            self._resolved_elsewhere(d.request_id, InteractionState(state), resolution)
        elif t is T.USER_INPUT_COMPLETED or t is T.ELICITATION_COMPLETED or t is T.EXIT_PLAN_MODE_COMPLETED:
            self._resolved_elsewhere(d.request_id, InteractionState.ANSWERED, "answered")
        elif t is T.SESSION_TODOS_CHANGED:
            self._provider._spawn(self._refresh_todos)
        elif main and t is T.SESSION_ERROR and self._phase is not _TurnPhase.IDLE:
            self._turn_error = d.message or d.error_type or "the Copilot CLI reported an error"
        elif main and t is T.ABORT and self._phase is not _TurnPhase.IDLE:
            self._aborted = d.reason.value if d.reason is not None else "aborted"
        elif main and t is T.SESSION_IDLE:
            self._idle(bool(d.aborted))
        elif main and t is T.ASSISTANT_MESSAGE:
            self._final_end = False
            self._final_message = not d.tool_requests
        elif main and t in (T.ASSISTANT_TURN_START, T.TOOL_EXECUTION_START, T.USER_MESSAGE):
            self._final_end = self._final_message = False
        elif main and t is T.ASSISTANT_TURN_END:
            self._final_end = self._final_message

    def _begin_turn(self) -> None:
        self._phase = _TurnPhase.RUNNING
        self._turn_no += 1
        self._last_event_at = trio.current_time()
        self._emit(TurnEvent(turn=Turn(state=TurnState.WORKING, model=self._mapper.model or self.model)))
        self._provider._spawn(self._probe_end, self._turn_no)

    async def _probe_end(self, turn: int) -> None:
        """End turn ``turn`` from the session's own state when its end event is lost.

        Runs while the turn does. After the final ``assistant.turn_end`` (IDLE_GRACE_S
        without idle) or QUIET_PROBE_S of quiet with nothing pending, asks the CLI whether the
        session still processes; one that does not ends the turn (see the module docstring).
        """
        while self._turn_no == turn and self._phase is _TurnPhase.RUNNING and not self._closed:
            wait = IDLE_GRACE_S if self._final_end else QUIET_PROBE_S
            quiet = trio.current_time() - self._last_event_at
            if quiet < wait or self._pending:
                # woken at least every IDLE_GRACE_S: a final turn_end shortens the wait
                await trio.sleep(min(IDLE_GRACE_S, wait - quiet if quiet < wait else wait))
                continue
            try:
                with trio.fail_after(RPC_TIMEOUT_S):
                    state = await self._bridge.run(self.session.rpc.metadata.is_processing)
            except Exception as exc:  # an older CLI, or one going away: the deadlines still apply
                log.debug("copilot.processing_unknown", conversation=self._id, error=str(exc))
                await trio.sleep(QUIET_PROBE_S)
                continue
            if self._turn_no != turn or self._phase is not _TurnPhase.RUNNING or self._closed:
                return
            if getattr(state, "processing", True) or trio.current_time() - self._last_event_at < wait:
                self._last_event_at = trio.current_time()  # working (or it just spoke): look again later
                continue
            log.warning("copilot.end_event_lost", conversation=self._id, final=self._final_end,
                        why="no session.idle came, and the session is no longer processing")
            if self._turn_error or self._refused or self._aborted or self._final_end:
                self._idle(False, inferred=True)
            else:
                self._end_turn(TurnState.FAILED, reason=END_EVENT_LOST, inferred=True,
                               error="the Copilot CLI stopped processing without ending the turn")
            return

    def _reset_turn(self) -> None:
        self._phase = _TurnPhase.IDLE
        self._final_end = self._final_message = False
        self._held = []
        self._turn_error = ""
        self._refused = ""
        self._aborted = ""
        self._cancel_requested = False
        self._denied = False

    def _idle(self, aborted: bool, *, inferred: bool = False) -> None:
        """End the turn as the session says; ``inferred``: read from its state, no idle came."""
        if self._phase is _TurnPhase.IDLE:
            return  # an idle with no turn of ours (e.g. right after resume)
        if self._refused or self._turn_error:
            self._end_turn(TurnState.FAILED, error=self._refused or self._turn_error, reason="error", inferred=inferred)
        elif aborted or self._aborted:
            if self._cancel_requested:
                reason = "cancelled"
            elif self._denied:
                reason = "permission_denied"
            else:
                reason = self._aborted or "aborted"
            self._end_turn(TurnState.CANCELLED, reason=reason, inferred=inferred)
        else:
            self._end_turn(TurnState.COMPLETED, reason=END_EVENT_LOST if inferred else "", inferred=inferred)
            if self._runtime.alive:  # the CLI works: its restart backoff starts over
                self._provider._restarts.succeeded(why="a turn completed")

    def _steer_used(self, text: str) -> None:
        for n, steer in enumerate(self._steers):
            if steer == text or steer in text:
                del self._steers[n]
                return

    def _end_turn(self, state: TurnState, *, error: str = "", reason: str = "", inferred: bool = False) -> None:
        """Emit the turn's one terminal event (after closing what it left open)."""
        if self._phase is _TurnPhase.IDLE:
            return
        for out in self._mapper.finish_turn():
            self._emit(out)
        steers, self._steers = self._steers, []
        for steer in steers:  # accepted, never delivered (no steering user.message came)
            self._emit(ItemEvent(item=unused_steer(f"steer-unused-{uuid.uuid4().hex[:8]}", steer)))
        self._expire_all("turn ended")
        self._reset_turn()
        marker, self._user_event = self._user_event, ""
        if reason in ("runtime_exit", "cancel_timeout"):
            marker = ""
        self._emit(TurnEvent(turn=Turn(state=state, error=error, reason=reason, inferred=inferred,
                                       model=self._mapper.model or self.model, marker=marker)))

    def _schedule_tail_flush(self) -> None:
        if self._flush_scheduled:
            return
        self._flush_scheduled = True
        self._provider._spawn(self._flush_tails_later)

    async def _flush_tails_later(self) -> None:
        await trio.sleep(m.TAIL_EMIT_INTERVAL)
        self._flush_scheduled = False
        if self._closed:
            return
        for out in self._mapper.flush_tails():
            self._emit(out)

    async def _refresh_todos(self) -> None:
        if self._closed or self.session is None:
            return
        try:
            with trio.fail_after(RPC_TIMEOUT_S):
                result = await self._bridge.run(self.session.rpc.plan.read_sql_todos)
            todos = m.todo_list(result.rows)
        except Exception as exc:
            log.debug("copilot.todos_unreadable", conversation=self._id, error=str(exc))
            todos = TodoList(known=False)
        if not self._closed:
            self._emit(TodosEvent(todos=todos))

    # ------------------------------------------------------------------ interactions (trio thread)

    def _open_interaction(self, pending: _Pending) -> None:
        if self._closed:
            if pending.future is not None:
                self._bridge.call_soon(_cancel_future, pending.future)
            return
        inter = pending.interaction
        self._pending[inter.id] = pending
        self._emit(InteractionEvent(interaction=inter))

    def _close_interaction(self, pending: _Pending, state: InteractionState, resolution: str) -> None:
        inter = pending.interaction
        ended = Interaction(
            id=inter.id,
            kind=inter.kind,
            title=inter.title,
            detail=inter.detail,
            options=inter.options,
            questions=inter.questions,
            plan=inter.plan,
            elicitation=inter.elicitation,
            state=state,
            resolution=resolution,
            time=inter.time,
            agent_id=inter.agent_id,
            tool_call_id=inter.tool_call_id,
        )
        self._emit(InteractionEvent(interaction=ended))

    def _resolved_elsewhere(self, request_id: str, state: InteractionState, resolution: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            if pending.future is not None:
                self._bridge.call_soon(_cancel_future, pending.future)
            self._close_interaction(pending, state, resolution)

    def _expire_all(self, resolution: str) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if p.future is not None:
                self._bridge.call_soon(_cancel_future, p.future)
            self._close_interaction(p, InteractionState.EXPIRED, resolution)

    # ------------------------------------------------------------------ refused messages (trio thread)

    def message_refused(self, text: str) -> None:
        """The reader refused a message of this session; ``text`` says why (its size and the ceiling).

        Running turn: a notice item, the CLI's turn aborted, and the turn ends
        ``failed`` with ``text`` when the CLI ends it (or REFUSED_GRACE_S after
        the abort, ``inferred``). No turn: the notice item only. While the
        prompt is submitted it waits with the held events.
        """
        if self._closed:
            return
        if self._phase is _TurnPhase.SUBMITTING:
            self._held.append(_Refused(text))
            return
        self._emit(ItemEvent(item=Item(id=f"refused-{uuid.uuid4().hex[:12]}", kind=ItemKind.NOTICE,
                                       text=f"error: {text}", time=utcnow())))
        if self._phase is not _TurnPhase.RUNNING or self._refused:
            return
        self._refused = text
        self._refused_abort = trio.Event()
        self._provider._spawn(self._abort_refused, self._turn_no, self._refused_abort)

    async def _abort_refused(self, turn: int, sent: trio.Event) -> None:
        """Stop the CLI's turn ``turn`` whose message was refused; end it ourselves if the CLI does not."""
        try:
            await self._call("abort", self.session.abort)
        except Exception as exc:  # it may have ended already; the deadline below still holds
            log.debug("copilot.refused_abort_failed", conversation=self._id, error=str(exc))
        finally:
            sent.set()
        await trio.sleep(REFUSED_GRACE_S)
        if not self._closed and self._turn_no == turn and self._phase is _TurnPhase.RUNNING and self._refused:
            log.warning("copilot.refused_turn_unended", conversation=self._id)
            self._end_turn(TurnState.FAILED, error=self._refused, reason="error", inferred=True)

    # ------------------------------------------------------------------ runtime exit (trio thread)

    def runtime_exited(self, reason: str) -> None:
        """The CLI process is gone: fail the turn (``runtime_exit``), expire, emit ``exit``, close."""
        if self._closed:
            return
        if self._phase is not _TurnPhase.IDLE:
            self._end_turn(TurnState.FAILED, error=reason, reason="runtime_exit")
        self._expire_all("the runtime exited")
        self._closed = True
        self._closed_reason = reason
        self._emit(ExitEvent(error=reason))

    def detach(self, reason: str) -> None:
        """Stop reporting (the provider stopped, or the id was reopened elsewhere)."""
        self.runtime_exited(reason)

    # ------------------------------------------------------------------ Conversation protocol

    def _check_open(self) -> None:
        if self._closed:
            raise Closed(self._closed_reason or "the conversation is closed")
        if not self._runtime.alive:
            raise Closed(self._runtime.exit_reason or "the Copilot CLI exited")

    async def _call(self, what: str, fn: Any, *args: Any, timeout: float = RPC_TIMEOUT_S, **kwargs: Any) -> Any:
        """One SDK call with the runtime's failures mapped to the contract's errors."""
        try:
            with trio.fail_after(timeout):
                return await self._bridge.run(fn, *args, **kwargs)
        except (ProcessExitedError, BridgeClosed, BrokenPipeError, ConnectionError) as exc:
            raise Closed(self._runtime.exit_reason or f"the Copilot CLI exited during {what}: {exc}") from None
        except trio.TooSlowError:
            raise InternalError(f"the Copilot CLI did not answer {what} within {timeout:g} s") from None

    async def send(self, prompt: Prompt) -> None:
        """Start a turn with ``prompt``; return once the CLI accepted it.

        Emits ``TurnEvent(working)`` then the turn's events; the user item
        comes from the CLI's own record of the prompt. Raises :class:`Busy`
        while a turn runs, :class:`Closed` when the runtime is known to be
        gone, :class:`SubmissionUncertain` when the CLI died or stalled
        during the submission (never resend then), :class:`Invalid` when the
        CLI refused the prompt. Cancelling the caller mid-submission leaves
        the outcome uncertain; the turn is reported if the CLI runs it.
        """
        await self._submit(prompt)

    async def _submit(self, prompt: Prompt, display: str | None = None) -> None:
        self._check_open()
        if self._phase is not _TurnPhase.IDLE:
            raise Busy("a turn is running in this conversation")
        attachments = _attachments(prompt)
        self._reset_turn()
        self._user_event = ""
        self._phase = _TurnPhase.SUBMITTING
        try:
            with trio.fail_after(SUBMIT_TIMEOUT_S):
                abort = self._refused_abort
                if abort is not None:  # the last turn's abort must not reach the CLI after this prompt
                    await abort.wait()
                await self._bridge.run(self.session.send, prompt.text, attachments=attachments or None,
                                       display_prompt=display)
        except JsonRpcError as exc:
            held, self._held = self._held, []
            self._phase = _TurnPhase.IDLE
            self._replay(held)
            if "busy" in exc.message.lower() or "already" in exc.message.lower():
                raise Busy(f"the Copilot CLI is busy: {exc.message}") from None
            raise Invalid(f"the Copilot CLI refused the prompt: {exc.message}") from None
        except (ProcessExitedError, BridgeClosed, BrokenPipeError, ConnectionError, trio.TooSlowError) as exc:
            self._uncertain()
            why = self._runtime.exit_reason or str(exc) or type(exc).__name__
            raise SubmissionUncertain(f"the Copilot CLI may or may not have received the prompt ({why}); it is not resent") from None
        except BaseException:
            self._uncertain()
            raise
        if self._phase is _TurnPhase.SUBMITTING:
            held, self._held = self._held, []
            self._begin_turn()
            self._replay(held)

    def _uncertain(self) -> None:
        if self._phase is not _TurnPhase.SUBMITTING:
            return  # already ended (the runtime exit was handled first)
        held, self._held = self._held, []
        self._phase = _TurnPhase.UNCERTAIN
        self._replay(held)

    def _replay(self, held: list[se.SessionEvent | _Refused]) -> None:
        for event in held:
            if self._closed:
                return
            if isinstance(event, _Refused):
                self.message_refused(event.text)
            else:
                self._handle(event)

    async def _agent_task(self, agent_id: str) -> Any:
        sub = self._mapper.subagents.get(agent_id)
        listed = await self._call("the task list", self.session.rpc.tasks.list)
        for task in getattr(listed, "tasks", []) or []:
            if not isinstance(task, _rpc.TaskAgentInfo):
                continue
            if task.id == agent_id or (sub is not None and sub.parent_tool_call_id and task.tool_call_id == sub.parent_tool_call_id):
                return task
        raise NotFound(f"the Copilot CLI runs no agent task for subagent {agent_id!r}")

    async def cancel_subagent(self, agent_id: str) -> None:
        """Cancel the CLI's agent task behind subagent ``agent_id`` (``session.tasks.cancel``); its end
        comes as the CLI's subagent event. Raises NotFound (no such task), Invalid (the CLI refused)."""
        self._check_open()
        task = await self._agent_task(agent_id)
        try:
            done = await self._call("the subagent cancel", self.session.rpc.tasks.cancel, _rpc.TasksCancelRequest(id=task.id))
        except JsonRpcError as exc:
            raise Invalid(f"the Copilot CLI refused to cancel subagent {agent_id!r}: {exc.message}") from None
        if not done.cancelled:
            raise Invalid(f"the Copilot CLI did not cancel subagent {agent_id!r} (it may have ended)")

    async def prompt_subagent(self, agent_id: str, text: str) -> None:
        """Send ``text`` to the CLI's idle agent task behind ``agent_id`` (``session.tasks.sendMessage``).
        Raises NotFound, Invalid (refused or not delivered)."""
        self._check_open()
        task = await self._agent_task(agent_id)
        try:
            sent = await self._call("the subagent prompt", self.session.rpc.tasks.send_message,
                                    _rpc.TasksSendMessageRequest(id=task.id, message=text))
        except JsonRpcError as exc:
            raise Invalid(f"the Copilot CLI refused the prompt for subagent {agent_id!r}: {exc.message}") from None
        if not sent.sent:
            raise Invalid(f"the Copilot CLI did not deliver the prompt to subagent {agent_id!r}: {sent.error or 'no reason given'}")

    async def commands(self) -> list[Command]:
        """The skills (and SDK-registered commands) the CLI offers in this session.

        The CLI's built-in commands are left out: most act on the CLI itself (model,
        permissions, share ...), and their list does not say which become a prompt.
        """
        self._check_open()
        listed = await self._call("the command list", self.session.rpc.commands.list,
                                  _rpc.SessionCommandsListRequest(include_builtins=False, include_client_commands=True,
                                                                  include_skills=True))
        out: list[Command] = []
        for cmd in listed.commands:
            if cmd.kind is _rpc.SlashCommandKind.BUILTIN:
                continue
            hint = cmd.input.hint if cmd.input is not None and isinstance(getattr(cmd.input, "hint", None), str) else ""
            out.append(Command(name=cmd.name, kind="skill" if cmd.kind is _rpc.SlashCommandKind.SKILL else "command",
                               description=cmd.description or "", input_hint=hint or ""))
        return out

    async def run_command(self, name: str, args: Prompt) -> None:
        """Invoke ``/name args`` in the CLI and send the prompt it makes, shown as ``/name args``.

        Raises Invalid when the CLI refuses the command or it would not become a prompt,
        and what ``send`` raises.
        """
        self._check_open()
        if self._phase is not _TurnPhase.IDLE:
            raise Busy("a turn is running in this conversation")
        try:
            result = await self._call("the command", self.session.rpc.commands.invoke,
                                      _rpc.CommandsInvokeRequest(name=name, input=args.text or None))
        except JsonRpcError as exc:
            raise Invalid(f"the Copilot CLI refused /{name}: {exc.message}") from None
        if not isinstance(result, _rpc.SlashCommandAgentPromptResult):
            raise Invalid(f"/{name} does not become a prompt in the Copilot CLI (it answered {type(result).__name__})")
        typed = f"/{name} {args.text}" if args.text else f"/{name}"
        await self._submit(Prompt(text=result.prompt, attachments=list(args.attachments)),
                           display=result.display_prompt or typed)

    async def steer(self, prompt: Prompt) -> None:
        """Add ``prompt`` to the running turn (the CLI delivers it at its next step).

        The CLI's user message for it (delivery steering) is its user item; a
        turn that ends before the CLI delivered it ends with a notice item saying
        so. Raises :class:`Invalid` when no turn runs, :class:`SubmissionUncertain`
        when the CLI died during the submission.
        """
        self._check_open()
        if self._phase is _TurnPhase.IDLE:
            raise Invalid("no turn is running; send the prompt instead")
        # Noted first: the CLI may deliver it before its answer to the send reaches us.
        self._steers.append(prompt.text)
        try:
            with trio.fail_after(SUBMIT_TIMEOUT_S):
                await self._bridge.run(self.session.send, prompt.text, attachments=_attachments(prompt) or None, mode="immediate")
        except JsonRpcError as exc:
            if prompt.text in self._steers:
                self._steers.remove(prompt.text)
            raise Invalid(f"the Copilot CLI refused the steering prompt: {exc.message}") from None
        except (ProcessExitedError, BridgeClosed, BrokenPipeError, ConnectionError, trio.TooSlowError) as exc:
            raise SubmissionUncertain(f"the Copilot CLI may or may not have received the steering prompt ({exc}); it is not resent") from None

    async def cancel(self) -> None:
        """Abort the running turn; return once the CLI acknowledged the abort.

        The turn's end (``cancelled``) follows as an event; should the CLI not
        report it within a few seconds, it is reported anyway. No turn: a no-op.
        """
        self._check_open()
        if self._phase is _TurnPhase.IDLE:
            return
        self._cancel_requested = True
        turn = self._turn_no
        try:
            await self._call("abort", self.session.abort)
        except JsonRpcError as exc:
            raise InternalError(f"the Copilot CLI refused to abort: {exc.message}") from None
        self._provider._spawn(self._cancel_watchdog, turn)

    async def _cancel_watchdog(self, turn: int) -> None:
        await trio.sleep(CANCEL_GRACE_S)
        if not self._closed and self._turn_no == turn and self._phase is not _TurnPhase.IDLE and self._cancel_requested:
            log.warning("copilot.cancel_unacknowledged", conversation=self._id)
            self._end_turn(TurnState.CANCELLED, reason="cancel_timeout", inferred=True,
                           error=f"the Copilot CLI did not confirm the cancel within {CANCEL_GRACE_S:g} s")

    async def respond(self, interaction_id: str, answer: Answer) -> None:
        """Answer a pending interaction.

        Raises :class:`InteractionGone` when it is not pending (answered,
        expired, or its turn ended), :class:`Invalid` when the answer does
        not fit it. Returns once the CLI took the answer.
        """
        self._check_open()
        pending = self._pending.get(interaction_id)
        if pending is None:
            raise InteractionGone(f"interaction {interaction_id!r} is not pending")
        inter = pending.interaction
        validate_answer(inter, answer)
        if pending.via == "permission":
            await self._answer_permission(pending, answer)
            return
        value, state, resolution = _handler_result(pending, answer)
        self._pending.pop(interaction_id, None)
        assert pending.future is not None
        self._bridge.call_soon(_resolve_future, pending.future, value)
        self._close_interaction(pending, state, resolution)

    async def _answer_permission(self, pending: _Pending, answer: Answer) -> None:
        inter = pending.interaction
        decision = m.permission_decision(answer.decision, pending.data)
        self._pending.pop(inter.id, None)  # no second answer while this one travels
        rejected = answer.decision == m.REJECT
        # set before the call: the CLI may abort and go idle before its reply reaches us
        denied_before, self._denied = self._denied, self._denied or rejected
        try:
            result = await self._call(
                "the permission answer",
                self.session.rpc.permissions.handle_pending_permission_request,
                _rpc.PermissionDecisionRequest(request_id=inter.id, result=decision),
            )
        except JsonRpcError as exc:
            self._denied = denied_before
            self._close_interaction(pending, InteractionState.EXPIRED, "the runtime no longer waits for it")
            raise InteractionGone(f"the Copilot CLI no longer waits for this permission: {exc.message}") from None
        except BaseException:
            self._denied = denied_before
            if not self._closed and inter.id not in self._pending:
                self._pending[inter.id] = pending  # not delivered: still pending
            raise
        if not getattr(result, "success", True):
            self._denied = denied_before
            self._close_interaction(pending, InteractionState.EXPIRED, "the runtime no longer waits for it")
            raise InteractionGone("the Copilot CLI no longer waits for this permission")
        self._close_interaction(pending, InteractionState.REJECTED if rejected else InteractionState.ANSWERED, answer.decision)

    async def rewind(self, marker: str) -> None:
        """Discard the root user turns after the one whose ``user.message`` event is ``marker``
        (``session.history.rewind``, mode conversation, at the next rewind point; none: nothing
        to do). Idle only. Raises Busy, Invalid (no such rewind point), SubmissionUncertain
        (the CLI went away mid-rewind), InternalError (it refused).
        """
        self._check_open()
        if self._phase is not _TurnPhase.IDLE:
            raise Busy("a turn is running in this conversation")
        points: list[Any] = []
        for _ in range(25):  # "session-busy" is transient: the file captures are settling
            listed = await self._call("the rewind points", self.session.rpc.history.list_rewind_points)
            reason = listed.unavailable_reason
            if reason is None:
                points = [p.event_id for p in listed.points]
                break
            if reason.value != "session-busy":
                raise Invalid(f"the Copilot CLI cannot rewind this session: {reason.value}")
            await trio.sleep(0.2)
        else:
            raise Busy("the Copilot CLI is still settling this session's last turn; try again")
        if marker not in points:
            raise Invalid(f"the Copilot CLI has no rewind point {marker!r} in this session")
        after = points[points.index(marker) + 1:]
        if not after:
            return
        request = _rpc.HistoryRewindRequest(event_id=after[0], mode=_rpc.HistoryRewindMode.CONVERSATION)
        try:
            result = await self._call("the rewind", self.session.rpc.history.rewind, request)
        except JsonRpcError as exc:
            raise InternalError(f"the Copilot CLI refused the rewind: {exc.message}") from None
        except (Closed, InternalError) as exc:
            raise SubmissionUncertain(f"the rewind may or may not have happened: {exc.message}") from None
        outcome = getattr(result.outcome, "value", str(result.outcome))
        # The history is truncated in these; only the CLI's own snapshot bookkeeping may have failed.
        if outcome == "session-busy":
            raise Busy("the Copilot CLI is busy with this session; nothing was rewound")
        if outcome not in ("success", "checkpoint-cleanup-failed", "snapshot-prune-failed"):
            raise InternalError(f"the Copilot CLI did not rewind ({outcome}): {getattr(result, 'error', '') or ''}")
        log.info("copilot.rewound", conversation=self._id, kept=marker, outcome=outcome)

    async def history(self) -> HistoryRecord:
        """The CLI's recorded transcript of this session (its stored events), oldest first."""
        self._check_open()
        events = await self._call("history", self.session.get_events)
        return m.history_from_events(events)

    async def set_model(self, model: str, effort: str = "") -> None:
        """Use ``model`` (and reasoning ``effort``) from the next model call on.

        The CLI confirms with a ``model_selection`` event. Raises
        :class:`Invalid` when it refuses the model or the effort.
        """
        self._check_open()
        if not model.strip():
            raise Invalid("a model name is required")
        try:
            await self._call("the model change", self.session.set_model, model.strip(), reasoning_effort=effort or None)
        except JsonRpcError as exc:
            raise Invalid(f"the Copilot CLI refused model {model!r}: {exc.message}") from None
        self.model, self.effort = model.strip(), effort

    async def set_title(self, title: str) -> None:
        """Name the session in the CLI's store (shown by ``copilot --resume``)."""
        self._check_open()
        name = clean_title(title)
        if not name:
            raise Invalid("the title is empty")
        try:
            await self._call("the title change", self.session.rpc.name.set, _rpc.NameSetRequest(name=name))
        except JsonRpcError as exc:
            raise Invalid(f"the Copilot CLI refused the title: {exc.message}") from None

    async def close(self) -> None:
        """Detach from the session without deleting it; idempotent.

        A turn still running is reported ``cancelled`` (reason ``closed``);
        pending interactions expire with no answer given.
        """
        if self._closed:
            return
        self._end_turn(TurnState.CANCELLED, reason="closed")
        self._expire_all("the conversation was closed")
        self._closed = True
        self._closed_reason = "the conversation is closed"
        self._provider._forget(self)
        if self.session is not None and self._runtime.alive:
            with trio.move_on_after(5), trio.CancelScope(shield=True):
                try:
                    await self._bridge.run(self.session.disconnect)
                except Exception as exc:
                    log.debug("copilot.detach_failed", conversation=self._id, error=str(exc))

    async def discard(self) -> None:
        """Close, then delete the session from the CLI's store (agentd.warm_pool: a session made ahead
        and never prompted, which ``import`` would otherwise list). Raises Closed when the CLI is gone."""
        sid = self._id
        await self.close()
        await self._provider.delete_session(sid)


# --------------------------------------------------------------------------- helpers


def _leave_pending(request: Any, invocation: Any) -> Any:
    """Permission handler: answer nothing here; the interaction is answered by ``respond``."""
    from copilot import PermissionNoResult

    return PermissionNoResult()


def _resolve_future(future: asyncio.Future[Any], value: Any) -> None:
    if future.done():
        return
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)


def _cancel_future(future: asyncio.Future[Any]) -> None:
    """End a handler's wait with an error, so the SDK answers the CLI (a cancelled task would not)."""
    if not future.done():
        future.set_exception(AnswerDeclined("the question expired unanswered"))


class AnswerDeclined(Exception):
    """The person declined to answer the agent's question."""


def _handler_result(pending: _Pending, answer: Answer) -> tuple[Any, InteractionState, str]:
    """(what the SDK handler returns, the interaction's new state, resolution)."""
    inter = pending.interaction
    if pending.via == "ask_user":
        if answer.reject:
            return AnswerDeclined("the user declined to answer"), InteractionState.REJECTED, "declined"
        q = inter.questions[0]
        values = [v for v in answer.answers[0] if v != ""]
        text = ", ".join(values)
        freeform = not (len(values) == 1 and values[0] in q.choices)
        return {"answer": text, "wasFreeform": freeform}, InteractionState.ANSWERED, "answered"
    if pending.via == "elicitation":
        if answer.cancel:
            return {"action": "cancel"}, InteractionState.REJECTED, "cancelled"
        if answer.reject:
            return {"action": "decline"}, InteractionState.REJECTED, "declined"
        return {"action": "accept", "content": m.elicitation_content(inter, answer.answers)}, InteractionState.ANSWERED, "accepted"
    # plan review
    plan = answer.plan
    assert plan is not None
    if plan.action is not None:
        return {"approved": True, "selectedAction": plan.action}, InteractionState.ANSWERED, plan.action
    return {"approved": False, "feedback": plan.feedback}, InteractionState.REJECTED, "feedback"


def _attachments(prompt: Prompt) -> list[dict[str, Any]]:
    """SDK attachments for a prompt: each file by the absolute path of its stored copy.

    The daemon sets ``path``; an attachment without one may name its file by
    an absolute path in ``id`` (older callers). The CLI reads the file itself
    (images and documents natively where the model takes them).
    """
    out = []
    for a in prompt.attachments:
        path = a.path or a.id or a.name
        if not os.path.isabs(path):
            raise Invalid(f"attachment {a.name!r}: the copilot provider takes files by absolute path")
        kind = "directory" if os.path.isdir(path) else "file"
        out.append({"type": kind, "path": path, "displayName": a.name or os.path.basename(path)})
    return out


def clean_title(title: str) -> str:
    """A title the CLI accepts: no control characters or double quotes, at most 100 characters."""
    name = _TITLE_BAD.sub(" ", title.replace('"', "'")).strip()
    name = re.sub(r"\s+", " ", name)
    return name[:100].strip()
