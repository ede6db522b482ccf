"""Copilot SDK session events -> the contract's events and values.

:class:`EventMapper` turns one conversation's stream of SDK
``SessionEvent``s into contract events: items (user, assistant, reasoning,
tool, notice) with streamed deltas, tool progress and output tails, subagents,
usage and tokens, context, title, compaction, model selection and activity.
It holds the state that needs (running tools, streamed text, subagents) and
is pure otherwise, so the same mapper rebuilds a transcript from stored events
(:func:`history_from_events`). Turn control (idle, error, abort) and
interactions are the conversation's business; the helpers for the latter
(:func:`permission_interaction`, :func:`permission_decision`,
:func:`elicitation_questions`, ...) live here too.

An event type the mapper does not act on (and is not listed as ignored) becomes an
``unknown`` record with its type name and data (agentd.runtime_output): a newer
CLI never breaks the adapter, and nothing it sends is lost.
"""

from __future__ import annotations

import datetime as _dt
import json
import mimetypes
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from copilot.generated import rpc as _rpc
from copilot.generated import session_events as se

from ... import runtime_output
from ...contract import (
    MAX_PROGRESS_BYTES,
    MAX_TAIL_LINE_BYTES,
    MAX_TAIL_LINES,
    Activity,
    ActivityEvent,
    Attachment,
    CompactionEvent,
    Context,
    ContextEvent,
    Delta,
    DeltaEvent,
    Elicitation,
    Event,
    Field,
    HistoryRecord,
    Interaction,
    InteractionKind,
    Item,
    ItemEvent,
    ItemKind,
    ModelSelection,
    ModelSelectionEvent,
    Option,
    OutputLine,
    PlanReview,
    Question,
    Retry,
    Subagent,
    SubagentEvent,
    SubagentRun,
    SubagentStatus,
    TitleEvent,
    Todo,
    TodoList,
    TokenUsage,
    TokensEvent,
    ToolCall,
    ToolStatus,
    Usage,
    UsageEvent,
    utcnow,
)

log = structlog.get_logger(__name__)

T = se.SessionEventType

#: A finished tool's output (display text) keeps at most this many bytes: head and tail.
MAX_OUTPUT_BYTES = 16 * 1024
#: A tool's input (display text) keeps at most this many bytes.
MAX_INPUT_BYTES = 4 * 1024
#: Interaction titles and details stay readable in a terminal.
MAX_TITLE_BYTES = 200
MAX_DETAIL_BYTES = 4 * 1024
#: Running-tool tail updates are durable items: at most one per tool per this many seconds.
TAIL_EMIT_INTERVAL = 0.2

#: Option ids of a permission interaction.
ALLOW_ONCE = "allow_once"
ALLOW_SESSION = "allow_session"
REJECT = "reject"

_SHELL_ID = "<shellId: "
_PLAN_ACTIONS = ("autopilot", "interactive", "exit_only")


# --------------------------------------------------------------------------- small helpers


def strip_shell_trailer(text: str) -> str:
    """``text`` without the ``<shellId: ...>`` line the CLI ends a shell tool's output with.

    What ``re.sub(r"\\n?<shellId: [^>\\n]*>\\s*$", "", text)`` does, in linear time: that regex
    tries every ``<shellId: `` of a line to its end, quadratic on output the agent chose (a line
    of them froze the daemon for seconds per 200 KB).
    """
    body = text.rstrip()  # the trailer's own trailing whitespace (str.isspace, as re's \\s)
    if not body.endswith(">"):
        return text
    # The trailer starts at the first "<shellId: " after the line's start and the ">" before its own.
    lo = max(body.rfind("\n") + 1, body.rfind(">", 0, len(body) - 1) + 1)
    start = body.find(_SHELL_ID, lo, len(body) - 1)
    if start < 0:
        return text
    return text[:start - 1] if start and text[start - 1] == "\n" else text[:start]


def user_attachments(attachments: Any) -> list[Attachment]:
    """The files of a user message as the CLI recorded them (file attachments only)."""
    out = []
    for a in attachments or []:
        if isinstance(a, se.AttachmentFile):
            name = a.display_name or a.path.rsplit("/", 1)[-1]
            out.append(Attachment(name=name, mime=a.mime_type or mimetypes.guess_type(name)[0] or "",
                                  size=a.byte_length or 0, path=a.path))
    return out


def truncate_bytes(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (an ellipsis marks a cut); lone surrogates become U+FFFD."""
    text = runtime_output.clean(text)
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: max(0, limit - 3)].decode("utf-8", "ignore") + "…"


def bound_output(text: str, limit: int = MAX_OUTPUT_BYTES) -> str:
    """``text`` bounded to about ``limit`` bytes, keeping its head and its tail; lone surrogates become U+FFFD."""
    text = runtime_output.clean(text)
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    half = limit // 2
    head = data[:half].decode("utf-8", "ignore")
    tail = data[-half:].decode("utf-8", "ignore")
    return f"{head}\n… ({len(data) - 2 * half} bytes cut) …\n{tail}"


def utc(value: _dt.datetime | None) -> _dt.datetime:
    """An event's time in UTC: now when the CLI gave none, or one with no UTC value
    (:func:`agentd.runtime_output.utc`)."""
    return runtime_output.utc(value) or utcnow()


def event_type(event: se.SessionEvent) -> str:
    """The wire type of an event, also for types this SDK does not know."""
    if event.type is T.UNKNOWN:
        return event.raw_type or "unknown"
    return event.type.value


def _to_dict(value: Any) -> Any:
    to_dict = getattr(value, "to_dict", None)
    return to_dict() if callable(to_dict) else value


def _json_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(_to_dict(value), ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def tool_input(name: str, arguments: Any) -> str:
    """Display text of a tool call's input: the command of a shell call, else its JSON."""
    if isinstance(arguments, dict) and isinstance(arguments.get("command"), str):
        return truncate_bytes(arguments["command"], MAX_INPUT_BYTES)
    return truncate_bytes(_json_text(arguments), MAX_INPUT_BYTES)


def tool_title(data: se.ToolExecutionStartData) -> str:
    """The call's own description (bash's ``description``), else the CLI's generic title."""
    args = data.arguments if isinstance(data.arguments, dict) else {}
    for key in ("description", "intent"):
        if isinstance(args.get(key), str) and args[key].strip():
            return truncate_bytes(args[key].strip(), MAX_TITLE_BYTES)
    return truncate_bytes(data.tool_title or "", MAX_TITLE_BYTES)


def _exit_code(data: se.ToolExecutionCompleteData) -> int | None:
    if data.shell_execution is not None:
        return data.shell_execution.exit_code
    if data.result is not None and data.result.contents:
        for content in data.result.contents:
            raw = _to_dict(content)
            code = raw.get("exitCode") if isinstance(raw, dict) else None
            if isinstance(code, int):
                return code
    return None


# --------------------------------------------------------------------------- the mapper


#: How the CLI delivers a steer (``send(mode="immediate")``): at its next step (steering), or,
#: when its answer had no next step, right after it within the same turn (queued). agentd's own
#: queued prompts never reach the CLI during a turn, so a queued user message is a steer.
STEER_DELIVERIES = frozenset({se.UserMessageDelivery.STEERING, se.UserMessageDelivery.QUEUED})


@dataclass
class _Tool:
    item: Item
    call: ToolCall
    tail: list[OutputLine] = field(default_factory=list)
    open_line: bool = False  # the last tail line has no newline yet
    shell: bool = False  # shell output seen: partial results are not needed
    last_emit: float = 0.0
    dirty: bool = False


#: What is kept of a streamed message over agentd's ceiling whose whole message never came (the
#: reader refuses it): its start, within the item text bound (so the record fits a client's frame,
#: and the conversation service keeps the note saying what was cut).
STREAM_KEEP_BYTES = runtime_output.MAX_ITEM_TEXT_CHARS


@dataclass
class _Stream:
    """A message streamed in deltas; its parts are kept up to the ceiling, past it only counted."""

    kind: ItemKind
    agent_id: str
    time: _dt.datetime | None = None
    parts: list[str] = field(default_factory=list)  # a list: += on a long str copies it at each delta
    size: int = 0  # UTF-8 bytes streamed

    def add(self, text: str) -> None:
        if self.size <= runtime_output.MAX_MESSAGE_BYTES:
            self.parts.append(text)
        self.size += len(text) if text.isascii() else len(text.encode("utf-8", "replace"))

    @property
    def text(self) -> str:
        """The streamed text; over the ceiling, its first STREAM_KEEP_BYTES and how much was cut."""
        whole = "".join(self.parts)
        if self.size <= runtime_output.MAX_MESSAGE_BYTES:
            self.parts = [whole] if whole else []  # joined once
            return whole
        kept = whole.encode("utf-8", "replace")[:STREAM_KEEP_BYTES].decode("utf-8", "ignore")
        cut = self.size - len(kept.encode("utf-8", "replace"))
        return kept + f"\n[{cut} more bytes cut: the streamed message passed agentd's ceiling of " \
                      f"{runtime_output.MAX_MESSAGE_BYTES:,} bytes]"


class EventMapper:
    """Maps one conversation's SDK events to contract events; see the module docstring.

    ``live`` mappers (a running conversation) throttle tool tails and emit
    deltas; a history mapper (``live=False``) keeps only durable results.
    """

    def __init__(self, *, live: bool = True, clock: Any = time.monotonic) -> None:
        self.live = live
        self._clock = clock
        self._tools: dict[str, _Tool] = {}
        self._streams: dict[str, _Stream] = {}
        self.subagents: dict[str, Subagent] = {}
        self._retries = 0
        self._nano_aiu = 0.0
        self.usage: Usage | None = None
        self.model = ""
        self.effort: str | None = None

    # ------------------------------------------------------------------ entry points

    def map(self, event: se.SessionEvent) -> list[Event]:
        """The contract events for one SDK event (often none). Never raises."""
        try:
            return self._map(event)
        except Exception:
            log.exception("copilot.map_failed", type=event_type(event))
            return []

    def finish_turn(self, at: _dt.datetime | None = None) -> list[Event]:
        """Close what a turn left open: streamed text becomes items, running tools end failed.

        Called at a turn's end (completed, cancelled, failed or runtime exit),
        so the journal keeps what the user saw streaming and no tool stays
        running forever.
        """
        out: list[Event] = []
        when = utc(at)
        for item_id, stream in list(self._streams.items()):
            if stream.text:
                out.append(ItemEvent(item=Item(id=item_id, kind=stream.kind, text=stream.text, time=stream.time, agent_id=stream.agent_id)))
        self._streams.clear()
        for tool in list(self._tools.values()):
            if tool.call.status in (ToolStatus.RUNNING, ToolStatus.PENDING):
                tool.call.status = ToolStatus.FAILED
                tool.call.output = tool.call.output or "interrupted: the turn ended before the tool finished"
                tool.tail = []
                tool.item.ended_at = when
                out.append(self._tool_event(tool))
        self._tools.clear()
        for sub in self.subagents.values():
            if not sub.status.terminal:
                sub.status = SubagentStatus.CANCELLED
                sub.ended_at = when
                out.append(SubagentEvent(subagent=_copy_subagent(sub)))
        self._retries = 0
        return out

    def flush_pending(self) -> bool:
        """Whether a throttled tool tail waits to be emitted (call :meth:`flush_tails` soon)."""
        return any(t.dirty for t in self._tools.values())

    def flush_tails(self) -> list[Event]:
        """Tool items whose throttled tail changed since they were last emitted."""
        out: list[Event] = []
        for tool in self._tools.values():
            if tool.dirty and tool.call.status is ToolStatus.RUNNING:
                out.append(self._tool_event(tool))
        return out

    # ------------------------------------------------------------------ dispatch

    def _map(self, ev: se.SessionEvent) -> list[Event]:
        d: Any = ev.data  # the payload class follows ev.type
        agent = ev.agent_id or ""
        t = ev.type
        # Deltas are most of a turn's events; their time is needed only when a stream starts.
        if t is T.ASSISTANT_MESSAGE_DELTA:
            return self._delta(d.message_id, ItemKind.ASSISTANT, d.delta_content, agent, ev.timestamp)
        if t is T.ASSISTANT_REASONING_DELTA:
            return self._delta(d.reasoning_id, ItemKind.REASONING, d.delta_content, agent, ev.timestamp)
        when = utc(ev.timestamp)
        if t is T.USER_MESSAGE:
            delivery = "steer" if d.delivery in STEER_DELIVERIES else ""
            return [ItemEvent(item=Item(id=str(ev.id), kind=ItemKind.USER, text=d.content, time=when, agent_id=agent,
                                        delivery=delivery, attachments=user_attachments(d.attachments)))]
        if t is T.ASSISTANT_MESSAGE:
            return self._assistant_message(d, agent, when)
        if t is T.ASSISTANT_REASONING:
            self._streams.pop(d.reasoning_id, None)
            if not d.content:
                return []
            return [ItemEvent(item=Item(id=d.reasoning_id, kind=ItemKind.REASONING, text=d.content, time=when, agent_id=agent))]
        if t is T.ASSISTANT_INTENT:
            return [ActivityEvent(activity=Activity(intent=d.intent))] if self.live and not agent else []
        if t is T.ASSISTANT_TURN_RETRY:
            if agent or not self.live:
                return []
            self._retries += 1
            return [ActivityEvent(activity=Activity(retry=Retry(count=self._retries, reason=d.reason or "")))]
        if t is T.ASSISTANT_TURN_START:
            return [ActivityEvent(activity=Activity(phase="thinking"))] if self.live and not agent else []
        if t is T.TOOL_EXECUTION_START:
            return self._tool_start(d, agent, when)
        if t is T.TOOL_EXECUTION_PROGRESS:
            return self._tool_progress(d)
        if t is T.TOOL_SHELL_OUTPUT:
            return self._tool_output(d.tool_call_id, d.text, d.stream is se.ToolShellOutputStream.STDERR, shell=True)
        if t is T.TOOL_EXECUTION_PARTIAL_RESULT:
            tool = self._tools.get(d.tool_call_id)
            if tool is None or tool.shell:
                return []
            tool.tail, tool.open_line = [], False
            return self._tool_output(d.tool_call_id, d.partial_output, False, shell=False)
        if t is T.TOOL_EXECUTION_COMPLETE:
            return self._tool_complete(d, agent, when)
        if t is T.SUBAGENT_STARTED:
            return self._subagent_started(d, agent, when)
        if t in (T.SUBAGENT_COMPLETED, T.SUBAGENT_FAILED):
            return self._subagent_ended(ev, d, agent, when)
        if t is T.ASSISTANT_USAGE:
            return self._usage(d)
        if t is T.SESSION_USAGE_CHECKPOINT:
            self._nano_aiu = d.total_nano_aiu
            self.usage = Usage(ai_units=d.total_nano_aiu / 1e9)
            return [UsageEvent(usage=self.usage)]
        if t is T.SESSION_USAGE_INFO:
            if agent or not self.live:
                return []
            prompt = (d.system_tokens or 0) + (d.tool_definitions_tokens or 0)
            return [ContextEvent(context=Context(used=d.current_tokens, limit=d.token_limit, prompt=prompt))]
        if t is T.SESSION_TITLE_CHANGED:
            return [TitleEvent(title=d.title)] if not agent and d.title else []
        if t is T.SESSION_COMPACTION_START:
            background = d.trigger is not None and d.trigger is not se.CompactionTrigger.MANUAL
            return [CompactionEvent(compacting=True, background=background)] if not agent else []
        if t is T.SESSION_COMPACTION_COMPLETE:
            out: list[Event] = [CompactionEvent(compacting=False)] if not agent else []
            if not d.success and (d.error or d.failure_reason):
                out.append(ItemEvent(item=Item(id=str(ev.id), kind=ItemKind.NOTICE, text=f"compaction failed: {d.error or d.failure_reason}", time=when)))
            return out
        if t is T.SESSION_MODEL_CHANGE:
            if agent:
                return []
            return self._model(d.new_model, d.reasoning_effort)
        if t in (T.SESSION_START, T.SESSION_RESUME):
            return self._model(d.selected_model or "", d.reasoning_effort) if d.selected_model else []
        if t is T.SESSION_ERROR:
            return [ItemEvent(item=Item(id=str(ev.id), kind=ItemKind.NOTICE, text=f"error: {d.message}", time=when, agent_id=agent))]
        if t is T.SESSION_WARNING:
            return [ItemEvent(item=Item(id=str(ev.id), kind=ItemKind.NOTICE, text=f"warning: {d.message}", time=when, agent_id=agent))]
        if t in _IGNORED or inert(ev):
            return []
        if not self.live:
            return []  # a transcript rebuilt from stored events keeps items only
        # A kind agentd does not act on (or this SDK does not know): journaled verbatim.
        return [runtime_output.unknown("copilot", event_type(ev), _to_dict(d))]

    # ------------------------------------------------------------------ messages

    def _delta(self, item_id: str, kind: ItemKind, text: str, agent: str, at: _dt.datetime | None) -> list[Event]:
        if not text:
            return []
        stream = self._streams.get(item_id)
        if stream is None:
            stream = self._streams[item_id] = _Stream(kind=kind, agent_id=agent, time=utc(at))
        stream.add(text)
        if not self.live:
            return []
        return [DeltaEvent(delta=Delta(item_id=item_id, kind=kind, text=text, agent_id=agent))]

    def _assistant_message(self, d: se.AssistantMessageData, agent: str, when: _dt.datetime) -> list[Event]:
        stream = self._streams.pop(d.message_id, None)
        out: list[Event] = []
        if d.reasoning_text:
            rid = f"{d.message_id}-reasoning"
            if not any(s.kind is ItemKind.REASONING for s in self._streams.values()):
                out.append(ItemEvent(item=Item(id=rid, kind=ItemKind.REASONING, text=d.reasoning_text, time=when, agent_id=agent)))
        text = d.content or (stream.text if stream else "")
        if text:
            start = stream.time if stream and stream.time else when
            out.append(ItemEvent(item=Item(id=d.message_id, kind=ItemKind.ASSISTANT, text=text, time=start, agent_id=agent)))
        return out

    # ------------------------------------------------------------------ tools

    def _tool_event(self, tool: _Tool) -> ItemEvent:
        tool.dirty = False
        tool.last_emit = self._clock()
        call = ToolCall(
            name=tool.call.name,
            status=tool.call.status,
            title=tool.call.title,
            input=tool.call.input,
            output=tool.call.output,
            progress=tool.call.progress,
            exit_code=tool.call.exit_code,
            tail=list(tool.tail) if tool.call.status is ToolStatus.RUNNING else [],
            cut=tool.call.cut,
        )
        it = tool.item
        return ItemEvent(item=Item(id=it.id, kind=ItemKind.TOOL, tool=call, time=it.time, ended_at=it.ended_at, agent_id=it.agent_id))

    def _tool_start(self, d: se.ToolExecutionStartData, agent: str, when: _dt.datetime) -> list[Event]:
        call = ToolCall(name=d.tool_name, status=ToolStatus.RUNNING, title=tool_title(d), input=tool_input(d.tool_name, d.arguments))
        if d.shell_tool_info is not None and d.shell_tool_info.display_command and not call.input:
            call.input = truncate_bytes(d.shell_tool_info.display_command, MAX_INPUT_BYTES)
        open_ = self._tools.get(d.tool_call_id)
        if open_ is not None:  # announced again while still running: the same call, updated
            open_.call.name, open_.call.title = call.name or open_.call.name, call.title or open_.call.title
            open_.call.input = call.input or open_.call.input
            return [self._tool_event(open_)]
        tool = _Tool(item=Item(id=d.tool_call_id, kind=ItemKind.TOOL, tool=call, time=when, agent_id=agent), call=call)
        self._tools[d.tool_call_id] = tool
        return [self._tool_event(tool)]

    def _tool_progress(self, d: se.ToolExecutionProgressData) -> list[Event]:
        tool = self._tools.get(d.tool_call_id)
        if tool is None or not self.live:
            return []
        tool.call.progress = truncate_bytes(d.progress_message, MAX_PROGRESS_BYTES)
        return [self._tool_event(tool)]

    def _tool_output(self, tool_call_id: str, text: str, err: bool, *, shell: bool) -> list[Event]:
        tool = self._tools.get(tool_call_id)
        if tool is None or not text or not self.live:
            return []
        tool.shell = tool.shell or shell
        parts = text.split("\n")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if i == 0 and tool.open_line and tool.tail and tool.tail[-1].err == err:
                joined = tool.tail[-1].text + part
                tool.tail[-1] = OutputLine(text=truncate_bytes(joined, MAX_TAIL_LINE_BYTES), err=err)
            elif last and part == "":
                pass  # the text ended with a newline
            else:
                tool.tail.append(OutputLine(text=truncate_bytes(part, MAX_TAIL_LINE_BYTES), err=err))
        tool.open_line = parts[-1] != ""
        del tool.tail[:-MAX_TAIL_LINES]
        tool.dirty = True
        if self._clock() - tool.last_emit < TAIL_EMIT_INTERVAL:
            return []
        return [self._tool_event(tool)]

    def _tool_complete(self, d: se.ToolExecutionCompleteData, agent: str, when: _dt.datetime) -> list[Event]:
        tool = self._tools.pop(d.tool_call_id, None)
        if tool is None:  # started before we were listening (resume mid-turn, history)
            call = ToolCall(name="tool", status=ToolStatus.RUNNING)
            tool = _Tool(item=Item(id=d.tool_call_id, kind=ItemKind.TOOL, tool=call, time=when, agent_id=agent), call=call)
        if d.success:
            tool.call.status = ToolStatus.COMPLETED
            text = d.result.content if d.result is not None else ""
        else:
            tool.call.status = ToolStatus.FAILED
            text = d.error.message if d.error is not None else (d.result.content if d.result is not None else "failed")
        whole = strip_shell_trailer(text or "")
        tool.call.output = bound_output(whole)
        if d.success and d.result is not None and d.result.detailed_content \
                and len(d.result.detailed_content) > len(text or ""):
            whole = strip_shell_trailer(d.result.detailed_content)  # what the CLI shows, beyond the model's cut
        tool.call.exit_code = _exit_code(d)
        if tool.call.exit_code not in (None, 0):
            tool.call.status = ToolStatus.FAILED  # the command ran and failed
        tool.tail = []
        tool.item.ended_at = when
        out: list[Event] = []
        if self.live:
            out += runtime_output.whole_output(tool.call, whole, tool.item.id, tool.item.agent_id)
        return [*out, self._tool_event(tool)]

    # ------------------------------------------------------------------ subagents

    def _subagent_started(self, d: se.SubagentStartedData, agent: str, when: _dt.datetime) -> list[Event]:
        sub_id = agent or d.tool_call_id
        existing = self.subagents.get(sub_id)
        run = SubagentRun(status=SubagentStatus.RUNNING, trigger="spawn" if existing is None else "agent", started_at=when)
        if existing is None:
            sub = Subagent(
                id=sub_id,
                name=d.agent_display_name or d.agent_name,
                status=SubagentStatus.RUNNING,
                description=d.agent_description,
                model=d.model or "",
                parent_tool_call_id=d.tool_call_id,
                started_at=when,
                runs=[run],
            )
        else:
            sub = existing
            sub.status = SubagentStatus.RUNNING
            sub.ended_at = None
            sub.error = ""
            sub.runs = _bounded_runs([*sub.runs, run])
        self.subagents[sub_id] = sub
        return [SubagentEvent(subagent=_copy_subagent(sub))]

    def _subagent_ended(self, ev: se.SessionEvent, d: Any, agent: str, when: _dt.datetime) -> list[Event]:
        sub_id = agent or d.tool_call_id
        sub = self.subagents.get(sub_id)
        if sub is None:
            sub = Subagent(id=sub_id, name=d.agent_display_name or d.agent_name, status=SubagentStatus.RUNNING, parent_tool_call_id=d.tool_call_id)
            self.subagents[sub_id] = sub
        if ev.type is T.SUBAGENT_FAILED:
            status = SubagentStatus.FAILED
            sub.error = truncate_bytes(d.error, MAX_DETAIL_BYTES)
        elif getattr(d, "cancelled", None):
            status = SubagentStatus.CANCELLED
        else:
            status = SubagentStatus.COMPLETED
        sub.status = status
        sub.ended_at = when
        sub.model = d.model or sub.model
        sub.tokens = d.total_tokens or sub.tokens
        sub.tool_calls = d.total_tool_calls or sub.tool_calls
        if sub.runs:
            last = sub.runs[-1]
            sub.runs = [*sub.runs[:-1], SubagentRun(status=status, trigger=last.trigger, started_at=last.started_at, ended_at=when)]
        return [SubagentEvent(subagent=_copy_subagent(sub))]

    # ------------------------------------------------------------------ usage, model

    def _usage(self, d: se.AssistantUsageData) -> list[Event]:
        duration = int(d.duration.total_seconds() * 1000) if d.duration is not None else 0
        out: list[Event] = [
            TokensEvent(
                tokens=TokenUsage(
                    model=d.model,
                    input=d.input_tokens or 0,
                    output=d.output_tokens or 0,
                    cache_read=d.cache_read_tokens or 0,
                    cache_write=d.cache_write_tokens or 0,
                    duration_ms=duration,
                )
            )
        ]
        if d.copilot_usage is not None and d.copilot_usage.total_nano_aiu:
            self._nano_aiu += d.copilot_usage.total_nano_aiu
            self.usage = Usage(ai_units=self._nano_aiu / 1e9)
            out.append(UsageEvent(usage=self.usage))
        return out

    def _model(self, model: str, effort: str | None) -> list[Event]:
        if not model:
            return []
        self.model, self.effort = model, effort
        return [ModelSelectionEvent(selection=ModelSelection(model=model, effort=effort))]


#: SDK event types that change nothing in agentd: no contract event, and no effect in
#: CopilotConversation._handle. Dropped in the reader's thread before the SDK parses them (but the
#: MCP ones, which agentd reads; _conversation.unread_event_type), so no SDK handler sees them
#: either: most of a turn's events are assistant.streaming_delta (one per chunk, beside
#: assistant.message_delta).
INERT = frozenset(
    {
        T.ASSISTANT_MESSAGE_START,
        T.ASSISTANT_STREAMING_DELTA,
        T.ASSISTANT_TOOL_CALL_DELTA,
        T.ASSISTANT_IDLE,
        T.AGENT_INTERRUPTED,
        T.SYSTEM_MESSAGE,
        T.SESSION_INFO,
        T.SESSION_SHUTDOWN,
        T.PENDING_MESSAGES_MODIFIED,
        T.SESSION_BACKGROUND_TASKS_CHANGED,
        T.SESSION_TOOLS_UPDATED,
        T.SESSION_SKILLS_LOADED,
        T.SESSION_MCP_SERVERS_LOADED,
        T.SESSION_MANAGED_SETTINGS_RESOLVED,
        T.MODEL_CALL_START,
        T.MODEL_CALL_FINISHED,
        T.MODEL_CALL_FAILURE,
        T.MODEL_CALL_FINAL_RESULT,
        T.SANDBOX_DECISION,
        T.SUBAGENT_CONFIGURED,
        T.SESSION_CONTEXT_CHANGED,
        T.HOOK_START,
        T.HOOK_END,
        T.HOOK_PROGRESS,
    }
)
#: Raw type names the SDK does not know but agentd does: the CLI's model-call telemetry
#: (model.log, model.messages_snapshot with the whole context, model.response, ...), sent on
#: every model call and of no use to a transcript. Dropped with the inert ones.
INERT_RAW_PREFIXES = ("model.",)
_INERT_NAMES = frozenset(t.value for t in INERT)


def inert_type(name: str) -> bool:
    """Whether events of type ``name`` (the CLI's type string) are dropped unseen, as :func:`inert` says."""
    return name.startswith(INERT_RAW_PREFIXES) or name in _INERT_NAMES


def inert(event: se.SessionEvent) -> bool:
    """Whether agentd drops ``event`` unseen: an inert type, or known telemetry the SDK does not type."""
    if event.type is T.UNKNOWN:
        return (event.raw_type or "").startswith(INERT_RAW_PREFIXES)
    return event.type in INERT


#: types that map to no contract event: the inert ones, and those CopilotConversation._handle acts on
_IGNORED = INERT | {
    T.SESSION_IDLE,
    T.ASSISTANT_TURN_END,
    T.ABORT,
    T.PERMISSION_REQUESTED,
    T.PERMISSION_COMPLETED,
    T.USER_INPUT_REQUESTED,
    T.USER_INPUT_COMPLETED,
    T.ELICITATION_REQUESTED,
    T.ELICITATION_COMPLETED,
    T.EXIT_PLAN_MODE_REQUESTED,
    T.EXIT_PLAN_MODE_COMPLETED,
    T.SESSION_TODOS_CHANGED,
}


def _copy_subagent(sub: Subagent) -> Subagent:
    return Subagent(
        id=sub.id,
        name=sub.name,
        status=sub.status,
        description=sub.description,
        model=sub.model,
        parent_tool_call_id=sub.parent_tool_call_id,
        error=sub.error,
        started_at=sub.started_at,
        ended_at=sub.ended_at,
        runs=list(sub.runs),
        tokens=sub.tokens,
        tool_calls=sub.tool_calls,
    )


def _bounded_runs(runs: list[SubagentRun]) -> list[SubagentRun]:
    from ...contract import MAX_SUBAGENT_RUNS

    if len(runs) <= MAX_SUBAGENT_RUNS:
        return runs
    return [runs[0], *runs[-(MAX_SUBAGENT_RUNS - 1) :]]


# --------------------------------------------------------------------------- history


def history_from_events(events: Iterable[se.SessionEvent]) -> HistoryRecord:
    """The transcript a conversation's stored events describe, oldest first."""
    mapper = EventMapper(live=False)
    items: dict[tuple[str, str], Item] = {}
    last: se.SessionEvent | None = None
    for event in events:
        last = event
        for out in mapper.map(event):
            if isinstance(out, ItemEvent):
                items[(out.item.agent_id, out.item.id)] = out.item
    if last is not None:
        for out in mapper.finish_turn(utc(last.timestamp)):
            if isinstance(out, ItemEvent):
                items[(out.item.agent_id, out.item.id)] = out.item
    return HistoryRecord(items=list(items.values()), subagents=list(mapper.subagents.values()), usage=mapper.usage, model=mapper.model)


def parse_events_jsonl(lines: Iterable[str | bytes]) -> list[se.SessionEvent]:
    """SDK events from the CLI's ``events.jsonl`` lines (runtime_output's odd-bytes rule applied);
    unreadable lines (also ones nested too deeply to decode) are skipped."""
    events = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            data = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
            events.append(se.session_event_from_dict(runtime_output.decode_json(data)))
        except Exception:  # RecursionError too
            log.debug("copilot.history_line_skipped", line=runtime_output.clean(str(line[:200])))
    return events


# --------------------------------------------------------------------------- permissions


def _describe_permission(req: Any) -> tuple[str, str]:
    kind = getattr(req, "kind", "")
    intention = getattr(req, "intention", "") or ""
    if kind == "shell":
        title = f"Run: {req.full_command_text}"
        detail = "\n".join(x for x in (intention, req.warning or "") if x)
    elif kind == "write":
        title = f"Write {req.file_name}"
        detail = "\n".join(x for x in (intention, req.diff or "") if x)
    elif kind == "read":
        title = f"Read {req.path}"
        detail = intention
    elif kind == "url":
        title = f"Fetch {req.url}"
        detail = intention
    elif kind == "mcp":
        title = f"Use {req.server_name}/{req.tool_name}"
        detail = _json_text(req.args)
    elif kind == "custom-tool":
        title = f"Use {req.tool_name}"
        detail = "\n".join(x for x in (req.tool_description, _json_text(req.args)) if x)
    elif kind == "memory":
        title = "Remember a fact"
        detail = req.fact
    elif kind == "hook":
        title = f"Hook for {req.tool_name}"
        detail = req.hook_message or ""
    else:
        title = f"Permission: {kind or 'unknown'}"
        detail = _json_text(req)
    return truncate_bytes(title, MAX_TITLE_BYTES), truncate_bytes(detail, MAX_DETAIL_BYTES)


def permission_interaction(data: se.PermissionRequestedData, *, agent_id: str = "", time: _dt.datetime | None = None) -> Interaction:
    """The permission interaction for a ``permission.requested`` event (id = the CLI's request id).

    Options: allow once (``allow_once``), allow for the session where the CLI
    offers it for shell commands, and deny (``reject``).
    """
    req = data.permission_request
    title, detail = _describe_permission(req)
    options = [Option(id=ALLOW_ONCE, label="Allow once", allow_once=True)]
    if getattr(req, "kind", "") == "shell" and getattr(req, "can_offer_session_approval", False):
        options.append(Option(id=ALLOW_SESSION, label="Allow these commands for the session"))
    options.append(Option(id=REJECT, label="Deny", reject=True))
    return Interaction(
        id=data.request_id,
        kind=InteractionKind.PERMISSION,
        title=title,
        detail=detail,
        options=options,
        time=utc(time),
        agent_id=agent_id,
        tool_call_id=getattr(req, "tool_call_id", None) or "",
    )


def permission_decision(option_id: str, data: se.PermissionRequestedData) -> Any:
    """The SDK decision for a permission option id (one of :func:`permission_interaction`'s)."""
    if option_id == ALLOW_ONCE:
        return _rpc.PermissionDecisionApproveOnce(approved_interactively=True)
    if option_id == ALLOW_SESSION:
        req = data.permission_request
        ids = [c.identifier for c in getattr(req, "commands", [])]
        return _rpc.PermissionDecisionApproveForSession(approval=_rpc.PermissionDecisionApproveForSessionApprovalCommands(command_identifiers=ids))
    if option_id == REJECT:
        return _rpc.PermissionDecisionReject()
    raise ValueError(f"unknown permission option {option_id!r}")


def permission_outcome(result: Any) -> tuple[str, str]:
    """(interaction state name, resolution) for a ``permission.completed`` result."""
    kind = getattr(result, "kind", "") or ""
    if kind.startswith("approved"):
        return "answered", kind
    if kind == "cancelled":
        return "expired", getattr(result, "reason", None) or "cancelled"
    return "rejected", kind or "denied"


# --------------------------------------------------------------------------- questions


def ask_user_interaction(request_id: str, question: str, choices: list[str], allow_freeform: bool, *, tool_call_id: str = "", time: _dt.datetime | None = None) -> Interaction:
    """A question interaction for the CLI's ``ask_user`` tool (one question)."""
    q = Question(text=question, choices=list(choices), custom=allow_freeform or not choices)
    return Interaction(
        id=request_id,
        kind=InteractionKind.QUESTION,
        title=truncate_bytes(question, MAX_TITLE_BYTES),
        questions=[q],
        time=utc(time),
        tool_call_id=tool_call_id,
    )


_FIELD_TYPES = {"string", "number", "integer", "boolean", "array"}
_FORMATS = {"email", "uri", "date", "date-time"}


def _schema_question(name: str, prop: dict[str, Any], required: bool) -> Question:
    ftype = prop.get("type", "string")
    if ftype not in _FIELD_TYPES:
        ftype = "string"
    choices: list[str] = []
    values: list[str] = []
    enum = prop.get("enum")
    one_of = prop.get("oneOf") or prop.get("anyOf")
    if ftype == "array":
        items = prop.get("items") or {}
        enum = items.get("enum")
        one_of = items.get("oneOf") or items.get("anyOf")
    if isinstance(enum, list):
        values = [str(v) for v in enum]
        names = prop.get("enumNames")
        choices = [str(n) for n in names] if isinstance(names, list) and len(names) == len(values) else list(values)
    elif isinstance(one_of, list):
        for option in one_of:
            if isinstance(option, dict) and "const" in option:
                values.append(str(option["const"]))
                choices.append(str(option.get("title", option["const"])))
    elif ftype == "boolean":
        choices, values = ["Yes", "No"], ["true", "false"]
    fmt = prop.get("format", "")
    field_ = Field(
        name=name,
        type=ftype,  # type: ignore[arg-type]
        required=required,
        values=values,
        format=fmt if fmt in _FORMATS else "",  # type: ignore[arg-type]
        minimum=prop.get("minimum"),
        maximum=prop.get("maximum"),
        min_length=prop.get("minLength"),
        max_length=prop.get("maxLength"),
        min_items=prop.get("minItems"),
        max_items=prop.get("maxItems"),
    )
    text = prop.get("description") or prop.get("title") or name
    return Question(
        text=str(text),
        header=str(prop.get("title") or name),
        choices=choices,
        multiple=ftype == "array",
        custom=not choices,
        field=field_,
    )


def elicitation_interaction(request_id: str, data: Any, *, time: _dt.datetime | None = None) -> Interaction:
    """A question interaction for an elicitation (a typed form, or a URL to visit)."""
    mode = "url" if data.get("mode") == "url" else "form"
    message = data.get("message") or ""
    questions: list[Question] = []
    if mode == "form":
        schema = data.get("requestedSchema") or {}
        required = set(schema.get("required") or [])
        for name, prop in (schema.get("properties") or {}).items():
            if isinstance(prop, dict):
                questions.append(_schema_question(name, prop, name in required))
    return Interaction(
        id=request_id,
        kind=InteractionKind.QUESTION,
        title=truncate_bytes(message or "The agent asks for information", MAX_TITLE_BYTES),
        detail=truncate_bytes(message, MAX_DETAIL_BYTES),
        questions=questions,
        elicitation=Elicitation(mode=mode, source=data.get("elicitationSource") or "", url=data.get("url") or ""),  # type: ignore[arg-type]
        time=utc(time),
    )


def elicitation_content(interaction: Interaction, answers: list[list[str]]) -> dict[str, Any]:
    """The form content for validated ``answers`` (one list per question)."""
    content: dict[str, Any] = {}
    for q, values in zip(interaction.questions, answers, strict=False):
        if q.field is None:
            continue
        value, answered = q.field_value(values)
        if answered:
            content[q.field.name] = value
    return content


def plan_interaction(request_id: str, data: Any, *, time: _dt.datetime | None = None) -> Interaction:
    """A plan-review interaction for the CLI's exit-plan-mode request."""
    actions = [a for a in (data.get("actions") or []) if a in _PLAN_ACTIONS]
    recommended = data.get("recommendedAction")
    summary = data.get("summary") or ""
    return Interaction(
        id=request_id,
        kind=InteractionKind.PLAN_REVIEW,
        title=truncate_bytes(summary or "Review the plan", MAX_TITLE_BYTES),
        plan=PlanReview(
            request_id=request_id,
            summary=summary,
            content=data.get("planContent") or "",
            actions=actions,  # type: ignore[arg-type]
            recommended=recommended if recommended in actions else None,  # type: ignore[arg-type]
        ),
        time=utc(time),
    )


# --------------------------------------------------------------------------- todos


_TODO_STATUS = {
    "pending": "pending",
    "todo": "pending",
    "in_progress": "in_progress",
    "in-progress": "in_progress",
    "doing": "in_progress",
    "done": "done",
    "completed": "done",
    "complete": "done",
    "blocked": "blocked",
}


def todo_list(rows: Iterable[Any]) -> TodoList:
    """The contract's todo list from the session's SQL todo rows."""
    todos = []
    for i, row in enumerate(rows):
        status = _TODO_STATUS.get((row.status or "").strip().lower(), "pending")
        todos.append(Todo(id=row.id or str(i), title=row.title or row.description or "", status=status, note=(row.description or "") if row.title else ""))  # type: ignore[arg-type]
    return TodoList(known=True, todos=todos)
