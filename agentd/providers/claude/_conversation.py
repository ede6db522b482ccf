"""One conversation: a Claude Code session, driven by one CLI process at a time.

Tasks. Each CLI process is a *session* whose runner task
(:meth:`ClaudeConversation._run_session`) lives in the provider's nursery: it
connects a ``ClaudeSDKClient`` (which starts the CLI with
``--input-format stream-json``; its stdout read by :mod:`._stdout`), waits for
the CLI's output to end, and disconnects when the process ends, the
conversation closes or the provider stops. The SDK's helpers (its stdout
reader, the ``can_use_tool`` callbacks) are trio system tasks that
``disconnect`` cancels; the reader maps every message the CLI sends to events
itself (:class:`_Inbox`, in place of the SDK's message stream), so a burst read
at once is mapped without a task switch per message. Everything runs on the
trio thread, so ``EventSink.emit`` is only ever called there.

A turn. :meth:`ClaudeConversation.send` emits the user item and
``TurnEvent(working)``, then writes the prompt to the CLI. The CLI's
``result`` message ends the turn: ``cancelled`` after an interrupt,
``failed`` with the runtime's own error text (``API Error: 500 ...``) when
the result is an error, else ``completed``. When the process dies mid-turn
the turn ends ``failed`` (reason ``runtime_exit``, the exit status and the
last stderr line as the error) and an ``ExitEvent`` follows; the next
``send`` starts a new process that resumes the same session id, once the
restart backoff (:mod:`agentd.providers._restart`) allows it. Every turn
gets exactly one terminal ``TurnEvent``.

Steers. A steer is a user message written while the turn runs; the CLI
queues it and takes it at the answer's next step. What the CLI holds
queued when a result comes it answers next, as a turn of its own: so an
agentd turn goes on until no steer it took is left queued, and a cancel
withdraws them with the interrupt (``cancel_queued``) or, when the CLI keeps
one, stops the process. No runtime turn ever runs outside an agentd turn.

Mapping. Partial messages (``include_partial_messages``) give
``DeltaEvent``s for text and thinking; each finished content block becomes
an item with id ``<message id>-<block index>`` (a tool call's id is its
``tool_use`` id); tool results complete or fail the tool item; each model
call's usage becomes a ``TokensEvent``, each result's cost a ``UsageEvent``
(a running total) and the context window a ``ContextEvent``. The CLI's
permission requests (``can_use_tool``) become permission interactions;
``AskUserQuestion`` calls become question interactions.
"""

from __future__ import annotations

import base64
import collections
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
import trio

from ... import procs, runtime_output
from ..._fsutil import read_file
from ..._quick_lock import QuickLock
from .._mcp import McpStates
from ...contract import (
    Activity,
    ActivityEvent,
    Answer,
    Busy,
    Closed,
    Command,
    Context,
    ContextEvent,
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
    ItemKind,
    McpServer,
    McpServerState,
    ModelSelection,
    ModelSelectionEvent,
    Prompt,
    Retry,
    RuntimeUnavailable,
    SubmissionUncertain,
    TokenUsage,
    TokensEvent,
    ToolStatus,
    Turn,
    TurnEvent,
    TurnState,
    Unsupported,
    Usage,
    UsageEvent,
    utcnow,
    validate_answer,
)
from .._common import keeper_set, runs_under, unused_steer
from . import _mapping as m

if TYPE_CHECKING:
    from ._provider import ClaudeProvider, _Record

log = structlog.get_logger(__name__)

#: How long starting the CLI and its initialize handshake may take.
CONNECT_TIMEOUT_S = 90.0
#: How long writing a prompt to the CLI may take before the submission counts as uncertain.
SUBMIT_TIMEOUT_S = 30.0
#: How long the CLI may take to acknowledge an interrupt.
INTERRUPT_TIMEOUT_S = 5.0
#: After an acknowledged interrupt, how long the CLI may take to end the turn before its process is killed.
CANCEL_GRACE_S = 5.0
#: How long a stopping session may take to end (the SDK bounds its own shutdown at about 20 s).
STOP_TIMEOUT_S = 30.0
#: stderr lines of the CLI kept to explain an exit.
STDERR_LINES = 20
#: Effort levels Claude Code accepts.
EFFORTS = ("low", "medium", "high", "xhigh", "max")
#: The capability (system/init) of a CLI whose interrupt can withdraw the user messages it holds queued.
CANCEL_QUEUED = "interrupt_cancel_queued_v1"


class _InterruptReceipt(msgspec.Struct):
    """The CLI's answer to an interrupt (capability ``interrupt_receipt_v1``): uuids of the
    queued user messages that survive it, and of those it withdrew (``cancel_queued``)."""

    still_queued: list[str] = []
    cancelled: list[str] = []


class _Withdrawal(msgspec.Struct):
    """The CLI's answer to ``cancel_async_message``: whether the queued message will not run."""

    cancelled: bool = False


#: Images up to this size go to the model inline; bigger ones only by path.
MAX_INLINE_IMAGE_BYTES = 5 << 20
INLINE_IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")


def prompt_content(prompt: Prompt) -> Any:
    """The ``content`` of the user message for ``prompt``: its text, or with attachments a list of blocks.

    Images (PNG, JPEG, GIF, WebP up to 5 MiB) go inline as image blocks; every
    file is also named by the absolute path of its stored copy in a note after
    the text, so the agent can read it with its own tools (reading outside the
    workdir may need a permission). Blocking: reads the images.
    """
    if not prompt.attachments:
        return prompt.text
    blocks: list[dict[str, Any]] = []
    lines = []
    for a in prompt.attachments:
        inline = False
        if a.path and a.mime in INLINE_IMAGE_TYPES and 0 < a.size <= MAX_INLINE_IMAGE_BYTES:
            try:
                data = read_file(Path(a.path))[:MAX_INLINE_IMAGE_BYTES + 1]  # stored copies: never through a symlink
                blocks.append({"type": "image", "source": {"type": "base64", "media_type": a.mime,
                                                           "data": base64.b64encode(data).decode("ascii")}})
                inline = True
            except OSError as exc:
                log.warning("claude.attachment_unreadable", name=a.name, error=str(exc))
        where = a.path or "(not stored)"
        lines.append(f"- {a.name} ({a.mime}, {a.size} bytes): {where}" + (" (also shown above)" if inline else ""))
    note = "\n\n[Files attached to this message; read them from these paths:]\n" + "\n".join(lines)
    blocks.append({"type": "text", "text": prompt.text + note})
    return blocks


_sdk: Any = None


def sdk() -> Any:
    """The ``claude_agent_sdk`` module; imported on first use (the provider imports it in a thread first)."""
    global _sdk
    if _sdk is None:
        import claude_agent_sdk

        _sdk = claude_agent_sdk
    return _sdk


def _parse_message(data: dict[str, Any]) -> Any:
    """The SDK's typed message for one raw CLI message (None: a type it skips); raises ClaudeSDKError."""
    from claude_agent_sdk._internal.message_parser import parse_message

    return parse_message(data)


class _Inbox:
    """Stands in for the SDK's message stream (``Query._message_send``, an anyio memory stream):
    its stdout reader hands each message it does not route itself straight to ``handle``, in
    its own task. A burst read in one chunk is mapped in one go, without the two task switches
    per message a stream between the reader and a consumer task costs on trio.

    What the reader sends last (``end``, or ``error`` with its exception), or a ``close``, sets
    :attr:`ended`; :attr:`error` is then the reader's exception, if any. ``handle`` must not
    block (it is synchronous); what it raises ends the reader as any reading error would.
    """

    __slots__ = ("_handle", "ended", "error")

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self.ended = trio.Event()
        self.error: Exception | None = None

    @classmethod
    def attach(cls, client: Any, handle: Any) -> _Inbox | None:
        """Put an inbox in place of ``client``'s message stream, first handing ``handle`` what
        that stream holds already, in order. None when this SDK has no such stream."""
        query = getattr(client, "_query", None)
        stream = getattr(query, "_message_send", None)
        buffered = getattr(query, "_message_receive", None)
        if stream is None or buffered is None:
            return None
        import anyio

        inbox = cls(handle)
        while not inbox.ended.is_set():  # no checkpoint until the swap: nothing comes in between
            try:
                message = buffered.receive_nowait()
            except anyio.WouldBlock:
                break
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                inbox.close()
                break
            inbox.send_nowait(message)
        query._message_send = inbox
        stream.close()
        buffered.close()
        return inbox

    async def send(self, message: dict[str, Any]) -> None:
        self.send_nowait(message)

    def send_nowait(self, message: dict[str, Any]) -> None:
        if self.ended.is_set():
            return
        kind = message.get("type")
        if kind == "end":
            self.ended.set()
        elif kind == "error":
            exc = message.get("exception")
            self.error = exc if isinstance(exc, Exception) else Exception(message.get("error", "Unknown error"))
            self.ended.set()
        else:
            self._handle(message)

    def close(self) -> None:
        self.ended.set()

    async def aclose(self) -> None:  # the rest of a memory send stream's closing, should the SDK use it
        self.close()


class _Pending:
    """An interaction a ``can_use_tool`` callback waits on."""

    __slots__ = ("interaction", "done", "answer", "questions", "tool", "tool_input")

    def __init__(self, interaction: Interaction, tool: str, tool_input: Any, questions: list[Any] | None) -> None:
        self.interaction = interaction
        self.done = trio.Event()
        self.answer: Answer | None = None
        self.tool = tool
        self.tool_input = tool_input
        self.questions = questions


class _Call:
    """One model call being streamed (``message_start`` .. ``message_stop``)."""

    __slots__ = ("id", "model", "usage", "started", "blocks")

    def __init__(self, message: dict[str, Any]) -> None:
        self.id = str(message.get("id") or f"msg-{uuid.uuid4().hex[:12]}")
        self.model = str(message.get("model") or "")
        self.usage: dict[str, Any] = dict(message.get("usage") or {})
        self.started = trio.current_time()
        #: content block index -> item id, for text and thinking blocks
        self.blocks: dict[int, str] = {}


class _Turn:
    """A running turn: what cancelling or failing it must finish."""

    def __init__(self, no: int) -> None:
        self.no = no
        self.uuid = str(uuid.uuid4())
        self.done = trio.Event()
        self.cancelling = False
        self.ended = False
        #: the runtime's own error report seen during the turn (an "API Error: ..." message)
        self.error = ""
        self.pending: dict[str, _Pending] = {}
        #: the last model call's usage, for the context size
        self.last_usage: dict[str, Any] = {}
        #: uuid of the turn's last main-chain transcript entry seen: where a fork or rewind resumes
        self.last_uuid = ""
        #: steers written to the CLI that it has not taken yet, by their message uuid, oldest first
        self.steers: dict[str, Prompt] = {}
        #: held while a steer is written: an interrupt goes to the CLI after every steer, never between
        self.writing = trio.Lock()
        #: how the turn ends once no steer is left queued: (state, error, reason) of a result that came first
        self.deferred: tuple[TurnState, str, str] | None = None


class _Session:
    """One CLI process (one ``ClaudeSDKClient``) of a conversation."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.client: Any = None
        self.scope = trio.CancelScope()
        self.started = trio.Event()
        #: trio time the CLI came up (its uptime counts from here)
        self.started_at = 0.0
        self.done = trio.Event()
        self.stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        #: why we stop it ourselves: "closed", "shutdown", "cancel", "restart"; "" = it ends on its own
        self.stopping = ""
        #: the last session-cumulative cost this process reported (None: none yet)
        self.cost_seen: float | None = None
        #: options changed (effort): replace the process before the next turn
        self.stale = False
        #: what the CLI says it can do (its system/init ``capabilities``)
        self.capabilities: frozenset[str] = frozenset()

    def on_stderr(self, line: str) -> None:
        self.stderr.append(line)

    @property
    def process(self) -> Any:
        transport = getattr(self.client, "_transport", None)
        return getattr(transport, "_process", None)

    @property
    def pid(self) -> int | None:
        proc = self.process
        return getattr(proc, "pid", None) if proc is not None else None

    @property
    def alive(self) -> bool:
        proc = self.process
        return self.started.is_set() and not self.done.is_set() and proc is not None and proc.returncode is None

    def kill(self) -> None:
        proc = self.process
        if proc is not None and proc.returncode is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass

    def last_error_line(self) -> str:
        for line in reversed(self.stderr):
            text = line.strip()
            # The CLI's tagged diagnostics ("[claude-code:...]") are not errors.
            if text and not text.startswith("[claude-code:"):
                return text[:300]
        return ""


async def _one(message: dict[str, Any]) -> Any:
    yield message


class ClaudeConversation:
    """One Claude Code session held open by :class:`~._provider.ClaudeProvider`.

    Implements :class:`agentd.contract.Conversation`. Its ``id`` is the
    Claude Code session id (a UUID), the same across processes and daemon
    restarts. Methods raise :class:`Closed` after :meth:`close` or once the
    provider stopped; a process that died does not close it (the next
    ``send`` starts another).
    """

    def __init__(self, provider: ClaudeProvider, record: _Record, sink: EventSink,
                 mcp_servers: list[McpServer] | None = None) -> None:
        self._provider = provider
        #: its MCP servers (handed to every CLI process) and their states
        self.mcp = McpStates(mcp_servers or [])
        self._record = record
        self._sink = sink
        self._session: _Session | None = None
        runs_under(sink, self._keepers)
        self._start_lock = QuickLock()
        self._generation = 0
        self._turn: _Turn | None = None
        self._turns = 0
        self._submitting = False
        self._closed = False
        self._closed_reason = ""
        #: items streamed or running (text so far, running tools) by id: finished when the turn ends
        self._live: dict[str, Item] = {}
        #: content blocks seen per message id (the block index of the next one)
        self._blocks: dict[str, int] = {}
        self._call: _Call | None = None
        self._reported_model = ""
        #: the skills among its commands, as its last init message named them
        self._skills: frozenset[str] = frozenset()
        #: the restart-backoff slot of this conversation's CLI (the provider sets "" for a new one's first start)
        self._restart_key = record.id

    # ------------------------------------------------------------------ description

    @property
    def id(self) -> str:
        return self._record.id

    @property
    def workdir(self) -> str:
        return self._record.workdir

    @property
    def model(self) -> str:
        return self._record.model

    @property
    def effort(self) -> str:
        return self._record.effort

    @property
    def runtime_pid(self) -> int | None:
        """Process id of this conversation's running CLI, or None when none runs."""
        s = self._session
        return s.pid if s is not None and s.alive else None

    def _keepers(self) -> frozenset[int]:
        """The keeper of this conversation's CLI from its spawn until it exits (its MCP servers,
        agentd's relay among them, start before ``connect`` returns)."""
        s = self._session
        proc = s.process if s is not None else None
        return keeper_set(proc.pid) if proc is not None and proc.returncode is None else frozenset()

    # ------------------------------------------------------------------ Conversation protocol

    def _check_open(self) -> None:
        if self._closed:
            raise Closed(self._closed_reason or f"conversation {self.id} is closed")
        if self._provider._nursery is None:
            raise Closed(f"provider {self._provider.name!r} is not running")

    async def send(self, prompt: Prompt) -> None:
        """Start a turn with ``prompt``; return once the CLI has it.

        Starts a CLI process first when none runs (resuming this session).
        Emits the user item and ``TurnEvent(working)``, then the turn's
        events and exactly one terminal ``TurnEvent``. Raises :class:`Busy`
        while a turn runs, :class:`RuntimeUnavailable` when the CLI cannot
        start, :class:`SubmissionUncertain` when writing the prompt failed
        part-way (the process is then stopped and the turn ends ``failed``;
        never resend). Cancelling the caller during the write does not
        interrupt it.
        """
        self._check_open()
        if self._turn is not None or self._submitting:
            raise Busy(f"a turn is running in conversation {self.id}")
        self._submitting = True
        try:
            content: Any = prompt.text
            if prompt.attachments:
                content = await trio.to_thread.run_sync(prompt_content, prompt)
            session = await self._ensure_session()
            self._check_open()
            self._turns += 1
            turn = _Turn(self._turns)
            self._turn = turn
            self._emit(ItemEvent(item=Item(id=f"user-{turn.uuid}", kind=ItemKind.USER, text=prompt.text,
                                           time=utcnow(), attachments=list(prompt.attachments))))
            self._emit(TurnEvent(turn=Turn(state=TurnState.WORKING, model=self.model)))
            message = {
                "type": "user",
                "message": {"role": "user", "content": content},
                "parent_tool_use_id": None,
                "session_id": self.id,
                "uuid": turn.uuid,
            }
            with trio.CancelScope(shield=True):
                try:
                    with trio.fail_after(SUBMIT_TIMEOUT_S):
                        await session.client.query(_one(message))
                except (Exception, trio.TooSlowError) as exc:
                    log.warning("claude.submit_failed", conversation=self.id, error=str(exc))
                    # A definite end: the runner ends the turn failed when the process is gone.
                    session.kill()
                    with trio.move_on_after(STOP_TIMEOUT_S):
                        await session.done.wait()
                    if not turn.ended:
                        self._end_turn(turn, TurnState.FAILED, error=f"the prompt could not be handed to Claude Code: {exc}",
                                       reason="runtime_exit")
                    raise SubmissionUncertain(f"the prompt may or may not have reached Claude Code: {exc}") from None
            if not self._record.prompted:
                self._record.prompted = True
                self._provider.save_soon(self._record, self._save_quietly)
        finally:
            self._submitting = False

    async def commands(self) -> list[Command]:
        """The user's and the project's commands and skills, as the CLI reports them (its initialize answer).

        Claude Code's built-in commands are left out: their list does not say which become a
        prompt and which act locally (clear, compact, model ...). Starts the CLI if none runs.
        Raises RuntimeUnavailable when it cannot start.
        """
        self._check_open()
        session = await self._ensure_session()
        try:
            info = await session.client.get_server_info()
        except Exception as exc:
            raise InternalError(f"Claude Code did not list its commands: {exc}") from None
        out: list[Command] = []
        for entry in (info or {}).get("commands") or []:
            if not isinstance(entry, dict) or entry.get("builtin") or not isinstance(entry.get("name"), str):
                continue
            name = entry["name"]
            out.append(Command(name=name, kind="skill" if name in self._skills else "command",
                               description=str(entry.get("description") or ""),
                               input_hint=str(entry.get("argumentHint") or "")))
        return out

    async def run_command(self, name: str, args: Prompt) -> None:
        """Send ``/name args``: Claude Code expands the command (or loads the skill) itself, as typed."""
        text = f"/{name} {args.text}" if args.text else f"/{name}"
        await self.send(Prompt(text=text, attachments=list(args.attachments)))

    async def steer(self, prompt: Prompt) -> None:
        """Write ``prompt`` to the CLI during the running turn; return once it has it.

        Claude Code takes it at its next step (with the running tool calls' results),
        or, when the answer has no next step, right after it: the agentd turn then
        goes on until that is answered too. Its user item (delivery ``steer``) comes
        when the CLI announces the model request carrying it, or echoes it as taken;
        a turn that ends first (a cancel, which withdraws it from the CLI) ends with
        a notice item saying it was not used. Raises Invalid when no turn runs,
        SubmissionUncertain when the write failed part-way (never resent).
        """
        self._check_open()
        turn, session = self._turn, self._session
        if turn is None or turn.ended or turn.cancelling or session is None or not session.alive:
            raise Invalid("no turn is running; send the prompt instead")
        content: Any = prompt.text
        if prompt.attachments:
            content = await trio.to_thread.run_sync(prompt_content, prompt)
        mid = str(uuid.uuid4())
        message = {"type": "user", "message": {"role": "user", "content": content}, "parent_tool_use_id": None,
                   "session_id": self.id, "uuid": mid}
        with trio.CancelScope(shield=True):
            async with turn.writing:
                if turn.ended or turn.cancelling:
                    raise Invalid("the turn is ending; send the prompt instead")
                turn.steers[mid] = prompt  # noted first: the echo may come before the write returns
                try:
                    with trio.fail_after(SUBMIT_TIMEOUT_S):
                        await session.client.query(_one(message))
                except (Exception, trio.TooSlowError) as exc:
                    raise SubmissionUncertain(f"the steer may or may not have reached Claude Code ({exc}); "
                                              "it is not resent") from None

    def _echoed(self, data: dict[str, Any]) -> None:
        """A user message the CLI took (``--replay-user-messages``): a steer's, when one waits.

        Known by the uuid it was written with; by its text from a CLI that echoes another uuid.
        """
        turn = self._turn
        if turn is None or not turn.steers:
            return
        if str(data.get("uuid") or "") in turn.steers:
            self._steer_used(turn, str(data["uuid"]))
            return
        content = (data.get("message") or {}).get("content")
        blocks = isinstance(content, list)
        if blocks:  # a steer with attachments: its text, then a note naming the files
            content = "\n".join(str(b.get("text") or "") for b in content if isinstance(b, dict) and b.get("type") == "text")
        if not isinstance(content, str):
            return
        for mid, prompt in turn.steers.items():
            if prompt.text == content or (blocks and prompt.text and content.startswith(prompt.text)):
                self._steer_used(turn, mid)
                return

    def _lifecycle(self, data: dict[str, Any]) -> None:
        """A user message's ``command_lifecycle`` (Claude Code 2.1 sends one per state of every
        message written to it): a steer the CLI says it will not run is not waited for; a turn
        whose result came while it waited ends then. Any other state says nothing the turn's own
        events do not."""
        turn = self._turn
        mid = str(data.get("command_uuid") or "")
        if turn is None or mid not in turn.steers or data.get("state") not in ("cancelled", "discarded", "refused"):
            return
        prompt = turn.steers.pop(mid)
        self._emit(ItemEvent(item=unused_steer(f"steer-{mid}", prompt.text)))
        self._end_deferred(turn)

    def _end_deferred(self, turn: _Turn) -> None:
        """End a turn whose result came while steers were queued, once none is left
        (``cancelled`` when a cancel withdrew them: no result of the CLI ends it then)."""
        if turn.steers or turn.deferred is None or turn.ended:
            return
        state, error, reason = (TurnState.CANCELLED, "", "") if turn.cancelling else turn.deferred
        self._end_turn(turn, state, error=error, reason=reason)
        self._provider.save_soon(self._record, self._save_quietly)

    def _steer_used(self, turn: _Turn, mid: str) -> None:
        """The CLI took the steer written as ``mid`` into the turn: its user item (delivery steer)."""
        prompt = turn.steers.pop(mid)
        self._emit(ItemEvent(item=Item(id=f"steer-{mid}", kind=ItemKind.USER, text=prompt.text, time=utcnow(),
                                       delivery="steer", attachments=list(prompt.attachments))))

    async def cancel(self) -> None:
        """Interrupt the running turn and wait until it ended ``cancelled``; no turn: a no-op.

        Sends the CLI an interrupt (it ends the turn within about 100 ms) that
        also withdraws the steers it has not taken yet: left queued, the CLI
        would answer them in a turn of its own after this one, which no agentd
        turn owns. A CLI that keeps one (or cannot withdraw them) is stopped.
        If the CLI does not acknowledge the interrupt within 5 s, or does not
        end the turn 5 s after, its process is killed (the next ``send``
        starts a new one). Pending interactions end ``expired``, streamed
        items keep their text so far, running tools end ``failed``, steers not
        taken end as notices.
        """
        self._check_open()
        turn = self._turn
        if turn is None:
            await trio.lowlevel.checkpoint()
            return
        turn.cancelling = True
        session = self._session
        with trio.CancelScope(shield=True):
            if session is not None and session.alive:
                kept: list[str] = []
                try:
                    with trio.fail_after(INTERRUPT_TIMEOUT_S):
                        async with turn.writing:  # a steer being written reaches the CLI first
                            kept = await self._interrupt(session, turn)
                except (Exception, trio.TooSlowError) as exc:
                    log.warning("claude.interrupt_failed", conversation=self.id, error=str(exc))
                    kept = list(turn.steers)
                if kept and self._turn in (turn, None):
                    # Stopped, not left to run them (even when the turn ended already): it ends
                    # cancelled, they end as notices.
                    log.info("claude.queued_steers_kept", conversation=self.id, steers=len(kept))
                    session.stopping = "cancel"
                    session.kill()
                with trio.move_on_after(CANCEL_GRACE_S):
                    await turn.done.wait()
            if not turn.done.is_set() and session is not None and not session.done.is_set():
                # The CLI did not confirm the interrupt: stopped, the turn ends cancel_timeout.
                session.stopping = "cancel_timeout"
                session.kill()
                with trio.move_on_after(STOP_TIMEOUT_S):
                    await turn.done.wait()
            if not turn.ended:
                self._end_turn(turn, TurnState.CANCELLED, reason="cancel_timeout", inferred=True)

    async def _interrupt(self, session: _Session, turn: _Turn) -> list[str]:
        """Interrupt the CLI's turn, withdrawing its queued steers; returns the uuids of those it keeps.

        A CLI without ``interrupt_cancel_queued_v1`` gets a plain interrupt, after
        which it answers every steer still queued: all of them count as kept. A
        withdrawn steer ends as a notice (and a turn that only waited for steers
        ends). Raises what the SDK raises when the CLI does not answer.
        """
        query = getattr(session.client, "_query", None)
        if query is None or CANCEL_QUEUED not in session.capabilities:
            await session.client.interrupt()
            return list(turn.steers)
        answer = await query._send_control_request({"subtype": "interrupt", "cancel_queued": True})
        receipt = msgspec.convert(answer, _InterruptReceipt)
        withdrawn, kept = list(receipt.cancelled), []
        for mid in receipt.still_queued:  # one it could no longer recall with the abort
            if mid in turn.steers:
                answer = await query._send_control_request({"subtype": "cancel_async_message", "message_uuid": mid})
                (withdrawn if msgspec.convert(answer, _Withdrawal).cancelled else kept).append(mid)
        log.info("claude.interrupted", conversation=self.id, withdrawn=len(withdrawn), kept=len(kept))
        for mid in withdrawn:
            if mid in turn.steers:
                self._emit(ItemEvent(item=unused_steer(f"steer-{mid}", turn.steers.pop(mid).text)))
        self._end_deferred(turn)  # a steer it already started is cut off by the abort: its result ends the turn
        return kept

    async def respond(self, interaction_id: str, answer: Answer) -> None:
        """Answer a pending interaction; the waiting CLI request gets the decision.

        Raises :class:`Invalid` when the answer does not fit (it stays
        pending), :class:`InteractionGone` when it is not pending. Emits the
        interaction again as answered or rejected, with its resolution.
        """
        self._check_open()
        turn = self._turn
        pending = turn.pending.get(interaction_id) if turn else None
        if turn is None or pending is None:
            raise InteractionGone(f"interaction {interaction_id!r} is not pending")
        validate_answer(pending.interaction, answer)
        state, resolution = m.resolve(pending.interaction, answer)
        del turn.pending[interaction_id]
        pending.answer = answer
        self._emit(InteractionEvent(interaction=msgspec.structs.replace(
            pending.interaction, state=state, resolution=resolution)))
        pending.done.set()
        await trio.lowlevel.checkpoint()

    async def history(self) -> HistoryRecord:
        """The session's transcript as Claude Code recorded it (its ``<id>.jsonl``), oldest first.

        Empty before the first prompt. Usage is agentd's running total.
        """
        self._check_open()
        items = await self._provider.transcript(self.id)
        return HistoryRecord(items=items or [], usage=self._usage(), model=self.model)

    async def set_model(self, model: str, effort: str = "", context_tier: str = "") -> None:
        """Use ``model`` (and ``effort``, ``context_tier``, when given) from the next turn on.

        A model change reaches a running CLI at once; an effort change
        replaces the CLI process before the next turn (same session). Raises
        :class:`Busy` while a turn runs, :class:`Invalid` for an unknown
        effort.
        """
        self._check_open()
        if self._turn is not None:
            raise Busy("the model cannot change while a turn runs")
        if effort and effort not in EFFORTS:
            raise Invalid(f"unknown effort {effort!r}; Claude Code takes one of: {', '.join(EFFORTS)}")
        if context_tier:
            from ._provider import model_for_tier

            model = model_for_tier(model or self._record.model, context_tier)
        session = self._session
        if model != self._record.model and session is not None and session.alive:
            try:
                with trio.fail_after(INTERRUPT_TIMEOUT_S):
                    await session.client.set_model(model or None)
            except (Exception, trio.TooSlowError) as exc:
                raise InternalError(f"Claude Code did not switch the model: {exc}") from None
        if effort and effort != self._record.effort and session is not None:
            session.stale = True
        self._record.model = model
        if effort:
            self._record.effort = effort
        with trio.CancelScope(shield=True):
            await self._save_quietly()
        self._emit(ModelSelectionEvent(selection=ModelSelection(model=model, effort=self._record.effort or None)))

    async def rewind(self, marker: str) -> None:
        """Go back to the transcript entry ``marker`` (a turn's last message uuid): the CLI process
        is replaced by one resumed at it (``resume_session_at``), so the turns after it are no
        longer in what the model is sent. The session keeps its id; the record keeps the point
        (``resume_at``, moved to each later turn's end) so a restart resumes the same branch.

        Raises Busy while a turn runs, Invalid when the transcript has no ``marker``,
        RuntimeUnavailable when the CLI cannot start again.
        """
        self._check_open()
        if self._turn is not None or self._submitting:
            raise Busy(f"a turn is running in conversation {self.id}")
        if not await self._provider.has_entry(self.id, marker):
            raise Invalid(f"Claude Code session {self.id} has no transcript entry {marker}")
        self._record.resume_at = marker
        await self._save()
        async with self._start_lock:
            await self._stop_session("restart")
            self._session = None
        await self._ensure_session()
        log.info("claude.rewound", conversation=self.id, at=marker)

    async def set_title(self, title: str) -> None:
        """Raises :class:`Unsupported`: agentd keeps the title; Claude Code's session names are not written."""
        self._check_open()
        raise Unsupported("the claude provider does not name Claude Code sessions")

    async def close(self) -> None:
        """Interrupt a running turn, stop the CLI process, forget the conversation. Idempotent.

        A turn still running when the process stops ends ``cancelled``
        (reason ``closed``); pending interactions end ``expired``. The
        session stays on disk and can be reopened.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        with trio.CancelScope(shield=True):
            if self._turn is not None and self._provider._nursery is not None:
                with trio.move_on_after(CANCEL_GRACE_S):
                    await self.cancel()
            self._closed = True
            await self._stop_session("closed")
            await self._save_quietly(now=True)
        self._provider._restarts.forget(self.id)
        self._provider._forget(self)

    async def discard(self) -> None:
        """Close (the CLI process stops), then delete agentd's record of this never-prompted
        conversation (agentd.warm_pool). Claude Code writes no transcript before a prompt."""
        await self.close()
        if not self._record.prompted:
            await self._provider.forget_record(self.id)

    # ------------------------------------------------------------------ lifetime (provider side)

    async def detach(self, reason: str) -> None:
        """Stop reporting and stop the process: the id was reopened by another open, or agentd stops."""
        if self._closed:
            return
        self._closed = True
        self._closed_reason = reason
        with trio.CancelScope(shield=True):
            await self._stop_session("closed")

    async def _stop_session(self, why: str) -> None:
        session = self._session
        if session is None:
            return
        session.stopping = session.stopping or why
        session.scope.cancel()
        with trio.move_on_after(STOP_TIMEOUT_S):
            await session.done.wait()

    async def _ensure_session(self) -> _Session:
        """The running CLI session, started (resuming this session id when it exists) if needed,
        once the restart backoff allows.

        Raises RuntimeUnavailable when the CLI cannot start (RuntimeRestarting
        while the backoff holds its start back), ConversationNotFound when it
        reports the session missing.
        """
        async with self._start_lock:
            session = self._session
            if session is not None and session.alive and not session.stale:
                return session
            if session is not None:
                await self._stop_session("restart")
            self._session = None
            self._check_open()
            restarts = self._provider._restarts
            await restarts.wait(self._restart_key)
            self._check_open()
            self._generation += 1
            session = _Session(self._generation)
            resume = await self._provider.session_exists(self.id)
            options = await self._provider.options(self, session, resume=resume)
            try:
                await self._provider.start_task(self._run_session, session, options)
            except RuntimeUnavailable as exc:
                restarts.failed(self._restart_key, error=exc.message)
                raise
            self._session = session
            return session

    async def _run_session(self, session: _Session, options: Any, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The runner of one CLI process (in the provider's nursery); see the module docstring.

        Raises (before ``started``) RuntimeUnavailable or ConversationNotFound
        when the CLI cannot start; afterwards it never raises but Cancelled.
        """
        from ._stdout import lean_transport

        client = sdk().ClaudeSDKClient(options, transport=lean_transport(options))
        session.client = client
        reason = ""
        log.info("claude.session_starting", conversation=self.id, generation=session.generation,
                 resume=bool(getattr(options, "resume", None)))
        try:
            with session.scope:
                try:
                    with trio.fail_after(CONNECT_TIMEOUT_S):
                        await client.connect()
                except trio.TooSlowError:
                    raise self._provider.start_error(session, f"it did not start within {CONNECT_TIMEOUT_S:g} s") from None
                except Exception as exc:
                    raise self._provider.start_error(session, exc) from None
                session.started_at = trio.current_time()
                session.started.set()
                task_status.started()
                log.info("claude.session_started", conversation=self.id, pid=session.pid, generation=session.generation)
                reason = await self._pump(session, client)
        except trio.Cancelled:
            session.stopping = session.stopping or "shutdown"
            raise
        finally:
            with trio.CancelScope(shield=True):
                keeper = session.pid
                try:
                    await client.disconnect()
                except Exception as exc:
                    log.debug("claude.disconnect_failed", conversation=self.id, error=str(exc))
                procs.ended(keeper, self._provider.state_dir)
                session.done.set()
                if self._session is session:
                    self._session = None
                if session.started.is_set():
                    self._session_ended(session, reason)

    async def _pump(self, session: _Session, client: Any) -> str:
        """Map every message of the CLI until its output ends; returns why it ended.

        The SDK's stdout reader hands each message to :meth:`_on_data` itself (an
        :class:`_Inbox` in place of its message stream): this task only waits for the end.
        """
        lib = sdk()
        query = getattr(client, "_query", None)
        if isinstance(getattr(query, "_run_end_ceiling_ms", None), int):
            # The SDK times the end of a run (a system task armed at each result, cancelled at the
            # next turn) for a prompt stream it ends itself; agentd writes every prompt and never
            # ends input but by disconnect: no timer task per turn.
            query._run_end_ceiling_ms = 0
        inbox = _Inbox.attach(client, lambda data: self._on_data(session, data))
        try:
            if inbox is not None:
                await inbox.ended.wait()
                if inbox.error is not None:
                    raise inbox.error
            else:  # pragma: no cover - an SDK without the private query object or its message stream
                if query is not None:
                    async for data in query.receive_messages():
                        self._on_data(session, data)
                else:
                    async for message in client.receive_messages():
                        self._dispatch(session, message)
        except lib.ProcessError as exc:
            return self._exit_text(session, exc.exit_code)
        except Exception as exc:  # a broken pipe, undecodable output: the session is unusable either way
            cause = getattr(exc, "original_error", None)
            size = re.search(r"Buffer size (\d+) exceeds limit (\d+)", str(cause)) if cause is not None else None
            if size:  # the SDK's reader ceiling (max_buffer_size, set to agentd's)
                return runtime_output.too_big(int(size.group(1)), complete=False, ceiling=int(size.group(2)))
            return f"the connection to Claude Code failed: {exc}"
        proc = session.process
        return self._exit_text(session, proc.returncode if proc is not None else None)

    def _on_data(self, session: _Session, data: Any) -> None:
        """One message of the CLI as the SDK read it (a dict): parsed message by message, so one
        this SDK cannot parse is kept as unknown, not fatal. Runs in the SDK's reader task."""
        if type(data) is dict and data.get("type") == "stream_event":
            # The hot path (every streamed delta): what parse_message would wrap in a StreamEvent.
            event = data.get("event")
            if isinstance(event, dict) and "uuid" in data and "session_id" in data:
                if data.get("parent_tool_use_id") is None:
                    try:
                        self._on_stream(event)
                    except Exception:  # a mapping bug must not take the session down
                        log.exception("claude.mapping_failed", conversation=self.id, message="StreamEvent")
                return
        if type(data) is dict and data.get("type") == "command_lifecycle":
            # Read here, never journaled: the state of each user message the CLI queued (queued,
            # started, completed: the turn's own records say that) and what became of a steer.
            self._lifecycle(data)
            return
        lib = sdk()
        try:
            message = _parse_message(data)
        except lib.ClaudeSDKError as exc:
            # A known type in a shape this SDK cannot read: kept as unknown, not lost.
            log.warning("claude.unparsed_message", conversation=self.id, error=str(exc))
            message = None
        unknown = m.unknown_message(data, message)  # a type this SDK skips, a new subtype
        if unknown is not None:
            self._emit(unknown)
        if isinstance(data, dict) and data.get("type") == "user" and data.get("isReplay"):
            self._echoed(data)
            return
        if message is not None:
            self._dispatch(session, message)

    def _exit_text(self, session: _Session, code: int | None) -> str:
        text = f"Claude Code exited unexpectedly ({m.describe_exit(code)})"
        line = session.last_error_line()
        return f"{text}: {line}" if line else text

    def _session_ended(self, session: _Session, reason: str) -> None:
        """The process is gone: end the running turn, and report an unexpected exit."""
        turn = self._turn
        why = session.stopping
        if why in ("closed", "shutdown", "restart", "cancel", "cancel_timeout"):
            if turn is not None:
                self._end_turn(turn, TurnState.CANCELLED, reason="" if why == "cancel" else why,
                               inferred=why == "cancel_timeout")
            return
        reason = reason or "Claude Code exited"
        log.warning("claude.session_exited", conversation=self.id, generation=session.generation, reason=reason)
        self._provider._restarts.failed(self._restart_key, uptime=trio.current_time() - session.started_at, error=reason)
        if turn is not None:
            state = TurnState.CANCELLED if turn.cancelling else TurnState.FAILED
            self._end_turn(turn, state, error="" if turn.cancelling else reason, reason="runtime_exit")
        self._emit(ExitEvent(error=reason))

    # ------------------------------------------------------------------ permissions and questions

    async def _can_use_tool(self, tool_name: str, tool_input: dict[str, Any], context: Any) -> Any:
        """The SDK's ``can_use_tool`` callback (an SDK system task): ask, wait for respond(), decide.

        Cancelled when the CLI withdraws the request (an interrupt): the
        interaction then ends ``expired``.
        """
        lib = sdk()
        turn = self._turn
        if turn is None or turn.ended or turn.cancelling:
            return lib.PermissionResultDeny(message="No agentd turn is running to ask the user in.")
        questions = m.ask_questions(tool_input) if tool_name == m.ASK_TOOL else None
        if questions is None and tool_name in self._record.allowed_tools:
            return lib.PermissionResultAllow()
        tool_use_id = getattr(context, "tool_use_id", None) or f"tool-{uuid.uuid4().hex[:12]}"
        agent_id = getattr(context, "agent_id", None) or ""
        now = utcnow()
        if questions is not None:
            interaction = Interaction(id=f"{tool_use_id}-question", kind=InteractionKind.QUESTION,
                                      title=questions[0].header or "Claude asks", questions=questions, time=now,
                                      agent_id=agent_id, tool_call_id=tool_use_id)
        else:
            interaction = m.permission_interaction(
                f"{tool_use_id}-permission", tool_name, tool_input, tool_call_id=tool_use_id,
                title=getattr(context, "title", None), description=getattr(context, "description", None),
                display_name=getattr(context, "display_name", None),
                decision_reason=getattr(context, "decision_reason", None),
                blocked_path=getattr(context, "blocked_path", None), agent_id=agent_id, time=now)
            self._tool_status(tool_use_id, ToolStatus.PENDING)
        pending = _Pending(interaction, tool_name, tool_input, questions)
        turn.pending[interaction.id] = pending
        self._emit(InteractionEvent(interaction=interaction))
        try:
            await pending.done.wait()
        finally:
            if turn.pending.pop(interaction.id, None) is not None:  # withdrawn, not answered
                self._emit(InteractionEvent(interaction=msgspec.structs.replace(
                    interaction, state=InteractionState.EXPIRED, resolution="withdrawn by Claude Code")))
        try:
            return self._decision(pending, tool_use_id)
        except Exception:
            log.exception("claude.decision_failed", conversation=self.id, tool=tool_name)
            raise

    def _decision(self, pending: _Pending, tool_use_id: str) -> Any:
        """The ``can_use_tool`` result for an answered (or expired) interaction."""
        lib = sdk()
        answer, questions, interaction = pending.answer, pending.questions, pending.interaction
        tool_name, tool_input = pending.tool, pending.tool_input
        if answer is None:  # the turn ended without an answer
            return lib.PermissionResultDeny(message="The request expired without an answer.", interrupt=True)
        if questions is not None:
            if answer.reject or answer.cancel:
                return lib.PermissionResultDeny(message="The user declined to answer these questions.")
            answers = m.question_answers(questions, answer)
            return lib.PermissionResultAllow(updated_input={**tool_input, "answers": answers})
        option = next(o for o in interaction.options if o.id == answer.decision)
        if option.reject:
            return lib.PermissionResultDeny(message="The user rejected this tool call.")
        self._tool_status(tool_use_id, ToolStatus.RUNNING)
        if option.allow_once:
            return lib.PermissionResultAllow()
        # allow_always: this tool, for the rest of this conversation (kept across processes).
        self._record.allowed_tools.append(tool_name)
        self._provider.save_soon(self._record, self._save_quietly)
        from claude_agent_sdk.types import PermissionRuleValue, PermissionUpdate

        rule = PermissionUpdate(type="addRules", rules=[PermissionRuleValue(tool_name=tool_name)],
                                behavior="allow", destination="session")
        return lib.PermissionResultAllow(updated_permissions=[rule])

    def _tool_status(self, tool_use_id: str, status: ToolStatus) -> None:
        item = self._live.get(tool_use_id)
        if item is None or item.tool is None or item.tool.status is status:
            return
        item = msgspec.structs.replace(item, tool=msgspec.structs.replace(item.tool, status=status))
        self._live[tool_use_id] = item
        self._emit(ItemEvent(item=item))

    # ------------------------------------------------------------------ message mapping

    def _emit(self, event: Event) -> None:
        self._sink.emit(event)

    def _dispatch(self, session: _Session, message: Any) -> None:
        try:
            self._on_message(session, message)
        except Exception:  # a mapping bug must not take the session down
            log.exception("claude.mapping_failed", conversation=self.id, message=type(message).__name__)

    def _on_message(self, session: _Session, msg: Any) -> None:
        lib = sdk()
        if isinstance(msg, lib.StreamEvent):
            if msg.parent_tool_use_id is None:
                self._on_stream(msg.event)
        elif isinstance(msg, lib.AssistantMessage):
            self._note_uuid(msg)
            self._on_assistant(msg)
        elif isinstance(msg, lib.UserMessage):
            self._note_uuid(msg)
            agent_id = msg.parent_tool_use_id or ""
            for block in msg.content if isinstance(msg.content, list) else []:
                if isinstance(block, lib.ToolResultBlock):
                    self._tool_result(block.tool_use_id, block.content, bool(block.is_error), agent_id)
        elif isinstance(msg, lib.ResultMessage):
            self._on_result(session, msg)
        elif isinstance(msg, lib.ConversationResetMessage):
            session.cost_seen = 0.0
        elif isinstance(msg, lib.SystemMessage):
            self._on_system(session, msg.subtype, msg.data)

    def _note_uuid(self, msg: Any) -> None:
        if self._turn is not None and msg.parent_tool_use_id is None and msg.uuid:
            self._turn.last_uuid = str(msg.uuid)

    def _mcp_state(self, server: dict[str, Any]) -> None:
        """One entry of Claude Code's MCP server list (init message or ``mcp_status``)."""
        tools = server.get("tools")
        names = [str(t.get("name", "")) for t in tools if isinstance(t, dict)] if isinstance(tools, list) else None
        notice = self.mcp.update(str(server.get("name", "")), str(server.get("status", "")),
                                 error=str(server.get("error") or ""), tools=names)
        if notice is not None:
            self._emit(ItemEvent(item=notice))

    async def mcp_status(self) -> list[McpServerState]:
        """Each MCP server's state as Claude Code reports it now (``get_mcp_status``); raises Closed."""
        self._check_open()
        if self.mcp.servers:
            session = await self._ensure_session()
            try:
                with trio.fail_after(30):
                    status = await session.client.get_mcp_status()
            except trio.TooSlowError:
                raise InternalError("Claude Code did not report its MCP servers within 30 s") from None
            except Exception as exc:
                raise InternalError(f"Claude Code could not report its MCP servers: {exc}") from None
            for server in status.get("mcpServers", []) if isinstance(status, dict) else []:
                if isinstance(server, dict):
                    self._mcp_state(server)
        return self.mcp.states()

    def _on_system(self, session: _Session, subtype: str, data: dict[str, Any]) -> None:
        if subtype == "init":
            capabilities = data.get("capabilities")
            if isinstance(capabilities, list):
                session.capabilities = frozenset(str(c) for c in capabilities)
            skills = data.get("skills")
            if isinstance(skills, list):
                self._skills = frozenset(str(n) for n in skills)
            for server in data.get("mcp_servers") or []:
                if isinstance(server, dict):
                    self._mcp_state(server)
            model = str(data.get("model") or "")
            if model and model != self._reported_model:
                self._reported_model = model
                self._emit(ModelSelectionEvent(selection=ModelSelection(model=model, effort=self.effort or None)))
        elif subtype == "status" and data.get("status") == "requesting" and self._turn is not None:
            # The model request about to go out carries these user messages: a steer among them is
            # used, even when an interrupt then cuts the reply off before the CLI echoes it.
            turn = self._turn
            for mid in data.get("user_message_uuids") or []:
                if isinstance(mid, str) and mid in turn.steers:
                    self._steer_used(turn, mid)
        elif subtype == "api_retry" and self._turn is not None:
            attempt = data.get("attempt") or data.get("retry_attempt") or 1
            status = data.get("error_status") or data.get("status") or 0
            retry = Retry(count=int(attempt) if isinstance(attempt, int) else 1,
                          reason=str(data.get("error") or ""), status=status if isinstance(status, int) else 0)
            self._emit(ActivityEvent(activity=Activity(phase="retrying", retry=retry)))

    def _on_stream(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self._call = _Call(event.get("message") or {})
            return
        call = self._call
        if call is None:
            return
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            btype = block.get("type")
            if btype in ("text", "thinking"):
                index = int(event.get("index", 0))
                item_id = f"{call.id}-{index}"
                call.blocks[index] = item_id
                item_kind = ItemKind.ASSISTANT if btype == "text" else ItemKind.REASONING
                self._live[item_id] = Item(id=item_id, kind=item_kind, text="", time=utcnow())
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            dtype = delta.get("type")
            text = delta.get("text") if dtype == "text_delta" else delta.get("thinking") if dtype == "thinking_delta" else None
            item_id = call.blocks.get(int(event.get("index", 0)))
            live = self._live.get(item_id) if item_id else None
            if text and live is not None and item_id is not None:
                live.text += text  # a tracking copy, never emitted as is
                self._emit(DeltaEvent(delta=Delta(item_id=item_id, kind=live.kind, text=text)))
        elif kind == "message_delta":
            usage = event.get("usage") or {}
            call.usage.update({k: v for k, v in usage.items() if v is not None})
        elif kind == "message_stop":
            self._call = None
            u = call.usage
            cache_read = int(u.get("cache_read_input_tokens") or 0)
            cache_write = int(u.get("cache_creation_input_tokens") or 0)
            tokens = TokenUsage(
                model=call.model, input=int(u.get("input_tokens") or 0) + cache_read + cache_write,
                output=int(u.get("output_tokens") or 0), cache_read=cache_read, cache_write=cache_write,
                duration_ms=int((trio.current_time() - call.started) * 1000))
            self._emit(TokensEvent(tokens=tokens))
            if self._turn is not None:
                self._turn.last_usage = dict(u)

    def _on_assistant(self, msg: Any) -> None:
        lib = sdk()
        agent_id = msg.parent_tool_use_id or ""
        now = utcnow()
        if msg.error:
            # The runtime's own report of a failed model call ("API Error: 500 ...").
            text = "\n".join(b.text for b in msg.content if isinstance(b, lib.TextBlock)) or f"Claude Code: {msg.error}"
            if self._turn is not None and not agent_id:
                self._turn.error = text
            self._emit(ItemEvent(item=Item(id=f"notice-{msg.uuid or uuid.uuid4()}", kind=ItemKind.NOTICE, text=text,
                                           time=now, ended_at=now, agent_id=agent_id)))
            return
        mid = msg.message_id or msg.uuid or f"msg-{uuid.uuid4().hex[:12]}"
        for block in msg.content:
            index = self._blocks.get(mid, 0)
            self._blocks[mid] = index + 1
            item_id = f"{mid}-{index}"
            if isinstance(block, lib.TextBlock | lib.ThinkingBlock):
                live = self._live.pop(item_id, None)
                kind = ItemKind.ASSISTANT if isinstance(block, lib.TextBlock) else ItemKind.REASONING
                text = block.text if isinstance(block, lib.TextBlock) else block.thinking
                if not text:
                    continue
                self._emit(ItemEvent(item=Item(id=item_id, kind=kind, text=text, time=live.time if live else now,
                                               ended_at=now, agent_id=agent_id)))
            elif isinstance(block, lib.ToolUseBlock | lib.ServerToolUseBlock):
                item = Item(id=block.id, kind=ItemKind.TOOL, tool=m.tool_call(block.name, block.input), time=now,
                            agent_id=agent_id)
                self._live[block.id] = item
                self._emit(ItemEvent(item=item))
            elif isinstance(block, lib.ToolResultBlock):
                self._tool_result(block.tool_use_id, block.content, bool(block.is_error), agent_id)
            elif isinstance(block, lib.ServerToolResultBlock):
                self._tool_result(block.tool_use_id, block.content, False, agent_id)

    def _tool_result(self, tool_use_id: str, content: Any, is_error: bool, agent_id: str) -> None:
        now = utcnow()
        item = self._live.pop(tool_use_id, None)
        if item is None or item.tool is None:
            item = Item(id=tool_use_id, kind=ItemKind.TOOL, tool=m.tool_call("tool", None), time=now, agent_id=agent_id)
        assert item.tool is not None
        whole = m.content_text(content)
        tool = msgspec.structs.replace(item.tool, status=ToolStatus.FAILED if is_error else ToolStatus.COMPLETED,
                                       output=m.bounded(whole), tail=[])
        for event in runtime_output.whole_output(tool, whole, item.id, item.agent_id):
            self._emit(event)
        self._emit(ItemEvent(item=msgspec.structs.replace(item, tool=tool, ended_at=now)))

    def _on_result(self, session: _Session, msg: Any) -> None:
        self._account_cost(session, msg.total_cost_usd)
        self._emit(UsageEvent(usage=self._usage()))
        turn = self._turn
        if turn is None:  # a turn the CLI started on its own (a background task's report)
            return
        window = 0
        for usage in (msg.model_usage or {}).values():
            if isinstance(usage, dict):
                window = max(window, int(usage.get("contextWindow") or 0))
        u = turn.last_usage
        if window and u:
            prompt = int(u.get("input_tokens") or 0)
            cached = int(u.get("cache_read_input_tokens") or 0) + int(u.get("cache_creation_input_tokens") or 0)
            used = prompt + cached + int(u.get("output_tokens") or 0)
            self._emit(ContextEvent(context=Context(used=used, limit=window, prompt=prompt + cached, cached=cached)))
        aborted = msg.terminal_reason in ("aborted_streaming", "aborted_tools")
        if turn.cancelling or aborted:
            end: tuple[TurnState, str, str] = (TurnState.CANCELLED, "", "")
        elif msg.is_error:
            end = (TurnState.FAILED, self._result_error(turn, msg),
                   msg.subtype if msg.subtype and msg.subtype != "success" else "api_error")
        else:
            end = (TurnState.COMPLETED, "", "")
        if turn.steers and not turn.cancelling:
            # Steers came after the answer's last step, or the answer failed before taking them:
            # either way the CLI answers them next, so this turn goes on until that ends too.
            log.info("claude.turn_goes_on_for_steers", conversation=self.id, steers=len(turn.steers),
                     result=end[0].value)
            turn.deferred = end
            self._finish_live(end[1] or "the answer ended")  # what that answer streamed is over
            return
        self._end_turn(turn, end[0], error=end[1], reason=end[2])
        self._provider.save_soon(self._record, self._save_quietly)

    @staticmethod
    def _result_error(turn: _Turn, msg: Any) -> str:
        errors = [e for e in (msg.errors or []) if isinstance(e, str) and e.strip()]
        if errors:
            return "; ".join(errors)
        if isinstance(msg.result, str) and msg.result.strip():
            return msg.result.strip()
        if turn.error:
            return turn.error
        if msg.api_error_status:
            return f"API error (HTTP {msg.api_error_status})"
        return f"Claude Code ended the turn with an error ({msg.subtype})"

    def _account_cost(self, session: _Session, total: float | None) -> None:
        """Fold a session-cumulative cost into the conversation's running total.

        A resumed CLI restores the session's earlier cost, an older one
        starts from zero: the first report of a process tells them apart.
        """
        if total is None:
            return
        known = self._record.cost_usd or 0.0
        if session.cost_seen is None:
            self._record.cost_usd = total if total >= known else known + total
        elif total >= session.cost_seen:
            self._record.cost_usd = known + (total - session.cost_seen)
        else:  # the CLI's totals started over (a conversation reset)
            self._record.cost_usd = known + total
        session.cost_seen = total

    def _usage(self) -> Usage:
        return Usage(cost_usd=self._record.cost_usd)

    def _end_turn(self, turn: _Turn, state: TurnState, *, error: str = "", reason: str = "",
                  inferred: bool = False) -> None:
        """Finish what the turn left open, then emit its one terminal TurnEvent."""
        if turn.ended:
            return
        turn.ended = True
        why = error or reason or ("cancelled" if state is TurnState.CANCELLED else "the turn ended")
        for pending in list(turn.pending.values()):
            self._emit(InteractionEvent(interaction=msgspec.structs.replace(
                pending.interaction, state=InteractionState.EXPIRED, resolution=why)))
            pending.done.set()
        turn.pending.clear()
        self._finish_live(why)
        for mid, prompt in turn.steers.items():
            self._emit(ItemEvent(item=unused_steer(f"steer-{mid}", prompt.text)))
        turn.steers = {}
        if self._turn is turn:
            self._turn = None
        # The turn's last transcript entry: what a fork or rewind resumes at (resume_session_at).
        marker = "" if reason in ("runtime_exit", "cancel_timeout") else turn.last_uuid
        if marker and self._record.resume_at and state is TurnState.COMPLETED:
            self._record.resume_at = marker  # a rewound session resumes at its newest turn from now on
        self._emit(TurnEvent(turn=Turn(state=state, error=error, reason=reason, inferred=inferred,
                                       model=self._reported_model or self.model, marker=marker)))
        turn.done.set()
        if state is TurnState.COMPLETED:
            self._provider._restarts.succeeded(self._restart_key, why="a turn completed")

    def _finish_live(self, why: str) -> None:
        """End the items still streamed or running: text keeps what came, tools fail with ``why``."""
        now = utcnow()
        for item in list(self._live.values()):
            if item.tool is not None:
                out = item.tool.output
                tool = msgspec.structs.replace(item.tool, status=ToolStatus.FAILED, tail=[],
                                               output=f"{out}\n{why}" if out else why)
                item = msgspec.structs.replace(item, tool=tool)
            elif not item.text:
                continue
            self._emit(ItemEvent(item=msgspec.structs.replace(item, ended_at=now)))
        self._live.clear()
        self._blocks.clear()
        self._call = None

    # ------------------------------------------------------------------ persistence

    async def _save(self, *, now: bool = False) -> None:
        await self._provider.save_record(self._record, now=now)

    async def _save_quietly(self, *, now: bool = False) -> None:
        try:
            await self._save(now=now)
        except OSError as exc:
            log.warning("claude.record_not_saved", conversation=self.id, error=str(exc))
