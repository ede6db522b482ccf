"""Pure helpers of the ``claude`` provider: display text, interactions, transcripts.

Nothing here imports ``claude_agent_sdk`` or does I/O, so it is cheap to
import and easy to test: tool calls become display text, ``can_use_tool``
requests become interactions and answers become the CLI's decisions (as plain
dicts), and a session transcript (the CLI's ``<session>.jsonl``, one JSON
object per line) becomes :class:`~agentd.contract.HistoryRecord` items.
"""

from __future__ import annotations

import datetime as _dt
import json
import signal
from collections.abc import Iterable
from typing import Any

import msgspec

from ... import runtime_output
from ...contract import (
    Answer,
    Interaction,
    InteractionKind,
    InteractionState,
    Item,
    ItemKind,
    Option,
    Question,
    ToolCall,
    ToolStatus,
)

#: A tool's input or output shown in an item keeps at most this many characters (its end).
MAX_TOOL_TEXT = 64 * 1024
#: An interaction's detail keeps at most this many characters.
MAX_DETAIL = 4000
#: The tool Claude Code uses to ask the user multiple-choice questions.
ASK_TOOL = "AskUserQuestion"

#: Tool input keys that name what a call acts on, in order of preference.
_SUBJECT_KEYS = ("command", "file_path", "notebook_path", "path", "url", "pattern", "query", "prompt", "skill")


#: system message subtypes agentd reads or leaves alone on purpose; any other is an ``unknown`` record
SYSTEM_KNOWN = frozenset({"init", "api_retry", "status", "compact_boundary", "mirror_error",
                          "task_started", "task_progress", "task_notification", "task_updated",
                          "hook_started", "hook_progress", "hook_response"})


def unknown_message(data: Any, parsed: Any) -> Any:
    """The ``unknown`` event for one CLI stdout message, else None.

    ``parsed`` is the SDK's message for ``data``: None when the SDK skipped a
    type it does not know (or could not read it). A system message of a subtype
    agentd does not know is unknown too (``system/<subtype>``).
    """
    if not isinstance(data, dict):
        return runtime_output.unknown("claude", "?", data)
    kind = data.get("type")
    if parsed is None:
        return runtime_output.unknown("claude", str(kind), data)
    if kind == "system" and data.get("subtype") not in SYSTEM_KNOWN:
        return runtime_output.unknown("claude", f"system/{data.get('subtype')}", data)
    return None


def bounded(text: str, limit: int = MAX_TOOL_TEXT) -> str:
    """``text`` cut to its last ``limit`` characters, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"[{len(text) - limit} earlier characters cut]\n{text[-limit:]}"


def input_text(tool_input: Any) -> str:
    """A tool's input as display text: a shell command as is, anything else as compact JSON."""
    if isinstance(tool_input, dict):
        command = tool_input.get("command")
        if isinstance(command, str) and set(tool_input) <= {"command", "description", "timeout", "run_in_background"}:
            return bounded(command)
        return bounded(json.dumps(tool_input, ensure_ascii=False, sort_keys=True))
    return bounded(str(tool_input))


def subject(tool_input: Any) -> str:
    """What a call acts on (a command, a path, a URL...), or ""."""
    if isinstance(tool_input, dict):
        for key in _SUBJECT_KEYS:
            value = tool_input.get(key)
            if isinstance(value, str) and value:
                return value
    return ""


def tool_title(name: str, tool_input: Any) -> str:
    """One line for a tool call: its own description, else ``Name: subject``, else the name."""
    if isinstance(tool_input, dict):
        desc = tool_input.get("description")
        if isinstance(desc, str) and desc.strip():
            return desc.strip().splitlines()[0][:200]
    what = subject(tool_input)
    return f"{name}: {what.splitlines()[0][:200]}" if what else name


def tool_call(name: str, tool_input: Any, status: ToolStatus = ToolStatus.RUNNING) -> ToolCall:
    return ToolCall(name=name, status=status, title=tool_title(name, tool_input), input=input_text(tool_input))


def content_text(content: Any) -> str:
    """The text of a tool result's content: a string, or a list of blocks (text kept, others named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict):
                if block.get("type") == "text":
                    parts.append(str(block.get("text", "")))
                else:
                    parts.append(f"[{block.get('type', 'content')}]")
            else:
                parts.append(str(block))
        return "\n".join(parts)
    if isinstance(content, dict):
        return json.dumps(content, ensure_ascii=False)
    return str(content)


def describe_exit(code: int | None) -> str:
    """``exit status 1``, ``killed by SIGKILL``, or ``no exit status``."""
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


# --------------------------------------------------------------------------- interactions


def permission_options(tool: str) -> list[Option]:
    """allow_once (the only one yolo picks), allow_always (this tool, this conversation), reject."""
    return [
        Option(id="allow_once", label="Allow once", allow_once=True),
        Option(id="allow_always", label=f"Always allow {tool} in this conversation"),
        Option(id="reject", label="Reject", reject=True),
    ]


def permission_interaction(
    iid: str, tool: str, tool_input: Any, *, tool_call_id: str, title: str | None, description: str | None,
    display_name: str | None, decision_reason: str | None, blocked_path: str | None, agent_id: str,
    time: _dt.datetime,
) -> Interaction:
    """The permission interaction for one ``can_use_tool`` request."""
    lines = []
    what = subject(tool_input)
    if what:
        lines.append(what)
    for extra in (description, decision_reason):
        if extra and extra not in lines:
            lines.append(extra)
    if blocked_path and blocked_path not in lines:
        lines.append(f"path: {blocked_path}")
    if not lines:
        lines.append(input_text(tool_input))
    detail = "\n".join(lines)
    if len(detail) > MAX_DETAIL:
        detail = detail[: MAX_DETAIL - 1] + "…"
    return Interaction(
        id=iid,
        kind=InteractionKind.PERMISSION,
        title=title or f"Allow {display_name or tool}?",
        detail=detail,
        options=permission_options(tool),
        time=time,
        agent_id=agent_id,
        tool_call_id=tool_call_id,
    )


def ask_questions(tool_input: Any) -> list[Question] | None:
    """The questions of an ``AskUserQuestion`` call, or None when its input is not the known shape.

    Each question offers its options' labels as choices and accepts a
    custom text (Claude Code always offers "Other").
    """
    if not isinstance(tool_input, dict):
        return None
    raw = tool_input.get("questions")
    if not isinstance(raw, list) or not raw:
        return None
    out = []
    for q in raw:
        if not isinstance(q, dict) or not isinstance(q.get("question"), str):
            return None
        choices = [str(o.get("label")) for o in q.get("options") or [] if isinstance(o, dict) and o.get("label")]
        out.append(Question(text=q["question"], header=str(q.get("header") or ""), choices=choices,
                            multiple=bool(q.get("multiSelect")), custom=True))
    return out


def question_answers(questions: list[Question], answer: Answer) -> dict[str, str]:
    """``AskUserQuestion``'s ``answers`` input: question text -> the chosen labels joined by ", "."""
    return {q.text: ", ".join(v for v in values if v) for q, values in zip(questions, answer.answers)}


def resolve(interaction: Interaction, answer: Answer) -> tuple[InteractionState, str]:
    """The state and display resolution of a validated answer."""
    if interaction.kind is InteractionKind.PERMISSION:
        option = next(o for o in interaction.options if o.id == answer.decision)
        return (InteractionState.REJECTED if option.reject else InteractionState.ANSWERED), option.id
    if answer.reject or answer.cancel:
        return InteractionState.REJECTED, "declined"
    return InteractionState.ANSWERED, " / ".join(", ".join(v for v in values if v) for values in answer.answers)


# --------------------------------------------------------------------------- transcripts


_time = runtime_output.parse_utc


def _entry(line: str | bytes) -> Any:
    """One transcript line's JSON after runtime_output's odd-bytes rule (a lone surrogate escape
    becomes U+FFFD); None when it is no JSON, or nested too deeply to decode."""
    data = line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass")
    try:
        return runtime_output.decode_json(data)
    except ValueError:
        return None


def _skipped_notice(size: int, at: int) -> Item:
    """The notice standing for a transcript line a reader left out for its size (``at``: its place)."""
    return Item(id=f"notice-skipped-{at}", kind=ItemKind.NOTICE,
                text=f"agentd left out one line of this transcript: {size:,} bytes or more, over the "
                     f"{runtime_output.MAX_MESSAGE_BYTES:,} bytes it reads of one line")


def _user_text(content: Any) -> str:
    """The text a person typed, or "" for the CLI's own insertions (reminders, interruptions)."""
    if isinstance(content, str):
        texts = [content]
    elif isinstance(content, list):
        texts = [b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)]
    else:
        return ""
    kept = [t for t in texts if t.strip() and not t.lstrip().startswith(("<system-reminder>", "[Request interrupted"))]
    return "\n".join(kept)


def transcript_items(lines: Iterable[str | bytes | int]) -> list[Item]:
    """The items of a Claude Code session transcript, oldest first.

    Reads the main thread only (sidechains and meta entries are skipped):
    user prompts, assistant text, thinking (as reasoning) and tool calls
    completed or failed by their results. Unparseable lines (also ones nested
    too deeply) are skipped; an int in ``lines`` stands for a line the reader
    left out for its size (that many bytes) and becomes a notice item.
    Item ids follow the live mapping: ``<message id>-<block index>`` for text
    and reasoning, the tool_use id for tools.
    """
    items: list[Item] = []
    tools: dict[str, int] = {}
    blocks: dict[str, int] = {}
    for at, line in enumerate(lines):
        if isinstance(line, int):
            items.append(_skipped_notice(line, at))
            continue
        entry = _entry(line)
        if not isinstance(entry, dict) or entry.get("isSidechain") or entry.get("isMeta"):
            continue
        try:
            _take(entry, items, tools, blocks)
        except RecursionError:  # a value nested too deeply for str() or json.dumps: a malformed line
            continue
    return items


def _take(entry: dict[str, Any], items: list[Item], tools: dict[str, int], blocks: dict[str, int]) -> None:
    """Add what transcript entry ``entry`` holds to ``items`` (``tools``, ``blocks``: transcript_items' state)."""
    kind = entry.get("type")
    message = entry.get("message")
    if kind not in ("user", "assistant") or not isinstance(message, dict):
        return
    when = _time(entry.get("timestamp"))
    content = message.get("content")
    if kind == "user":
        text = _user_text(content)
        if text:
            items.append(Item(id=f"user-{entry.get('uuid', len(items))}", kind=ItemKind.USER, text=text, time=when))
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                at = tools.get(str(block.get("tool_use_id")))
                if at is None:
                    continue
                old = items[at]
                assert old.tool is not None
                status = ToolStatus.FAILED if block.get("is_error") else ToolStatus.COMPLETED
                tool = msgspec.structs.replace(old.tool, status=status, output=bounded(content_text(block.get("content"))))
                items[at] = msgspec.structs.replace(old, tool=tool, ended_at=when)
        return
    if entry.get("isApiErrorMessage") or message.get("model") == "<synthetic>":
        text = content_text([b for b in content or [] if isinstance(b, dict)]) if isinstance(content, list) else str(content or "")
        if text:
            items.append(Item(id=f"notice-{entry.get('uuid', len(items))}", kind=ItemKind.NOTICE, text=text, time=when, ended_at=when))
        return
    mid = str(message.get("id") or entry.get("uuid") or len(items))
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        index = blocks.get(mid, 0)
        blocks[mid] = index + 1
        btype = block.get("type")
        if btype == "text" and block.get("text"):
            items.append(Item(id=f"{mid}-{index}", kind=ItemKind.ASSISTANT, text=str(block["text"]), time=when, ended_at=when))
        elif btype == "thinking" and block.get("thinking"):
            items.append(Item(id=f"{mid}-{index}", kind=ItemKind.REASONING, text=str(block["thinking"]), time=when, ended_at=when))
        elif btype in ("tool_use", "server_tool_use"):
            tid = str(block.get("id") or f"{mid}-{index}")
            tools[tid] = len(items)
            items.append(Item(id=tid, kind=ItemKind.TOOL, tool=tool_call(str(block.get("name", "tool")), block.get("input")), time=when))


class SessionHead(msgspec.Struct):
    """What a transcript says of its session for a listing (``previous``)."""

    cwd: str = ""
    title: str = ""
    created_at: _dt.datetime | None = None
    #: the transcript holds at least one prompt
    prompted: bool = False


def session_head(lines: Iterable[str | bytes | int]) -> SessionHead:
    """The working directory, title and start of a session transcript (an iterable of lines,
    str or bytes; an int, a line left out, is skipped).

    The title is the session's last custom title (``/rename``), else its last summary, else
    the first prompt's first line (cut to 80 characters); runtime_output's odd-bytes rule is
    applied to every string. Unparseable lines (also ones nested too deeply) are skipped.
    """
    head = SessionHead()
    first_prompt = named = ""
    for line in lines:
        if isinstance(line, int):
            continue
        marks = (b'"custom-title"', b'"summary"') if isinstance(line, bytes) else ('"custom-title"', '"summary"')
        if marks[0] not in line and marks[1] not in line and (head.prompted and head.cwd):  # type: ignore[operator]
            continue  # the rest only matters for a title record
        entry = _entry(line)
        if not isinstance(entry, dict):
            continue
        kind = entry.get("type")
        if kind == "custom-title" and isinstance(entry.get("customTitle"), str):
            named = entry["customTitle"]
        elif kind == "summary" and isinstance(entry.get("summary"), str) and not named:
            head.title = entry["summary"]
        if not head.cwd and isinstance(entry.get("cwd"), str):
            head.cwd = entry["cwd"]
        if head.created_at is None:
            head.created_at = _time(entry.get("timestamp"))
        if kind == "user" and not entry.get("isSidechain") and not entry.get("isMeta") and not head.prompted:
            message = entry.get("message")
            text = _user_text(message.get("content")) if isinstance(message, dict) else ""
            if text:
                head.prompted = True
                first_prompt = text.strip().splitlines()[0][:80]
    head.title = named or head.title or first_prompt
    return head
