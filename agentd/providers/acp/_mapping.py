"""Pure mapping from ACP values to the contract's: tool calls, permission options, plans, stop reasons.

No I/O and no trio here; the conversation keeps the state and emits.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import msgspec

from ... import runtime_output
from ..._fsutil import read_file
from ...contract import Command, Option, Prompt, Todo, TodoList, ToolCall, ToolStatus, TurnState
from .._common import MAX_TOOL_TEXT, bound, render_input
from . import _schema as s

#: Tool input and output are display text, bounded to this many characters.

_STATUS = {
    "pending": ToolStatus.PENDING,
    "in_progress": ToolStatus.RUNNING,
    "completed": ToolStatus.COMPLETED,
    "failed": ToolStatus.FAILED,
}

_TODO_STATUS = {"pending": "pending", "in_progress": "in_progress", "completed": "done"}

#: stopReason -> (turn state, error for a failed turn)
_STOP = {
    "end_turn": (TurnState.COMPLETED, ""),
    "cancelled": (TurnState.CANCELLED, ""),
    "max_tokens": (TurnState.FAILED, "the model reached its output token limit (stopReason max_tokens)"),
    "max_turn_requests": (TurnState.FAILED, "the agent reached its limit of model requests for one turn (stopReason max_turn_requests)"),
    "refusal": (TurnState.FAILED, "the agent refused to continue (stopReason refusal)"),
}


def unknown_update(provider: str, raw: dict[str, Any]) -> Any:
    """The ``unknown`` event for a session/update of a kind agentd does not know, else None."""
    kind = raw.get("sessionUpdate")
    if kind in s.KNOWN_UPDATES:
        return None
    return runtime_output.unknown(provider, str(kind), raw)


def stop_reason(reason: str) -> tuple[TurnState, str]:
    """The turn state and error of a session/prompt stopReason; an unknown one fails the turn."""
    return _STOP.get(reason, (TurnState.FAILED, f"the agent stopped the turn: {reason}"))


def block_text(block: s.ContentBlock) -> str:
    """Display text of one content block; non-text blocks become a short placeholder."""
    if block.type == "text":
        return block.text
    if block.type == "resource_link":
        return f"[{block.title or block.name or 'link'}: {block.uri}]"
    if block.type == "resource":
        res = block.resource or {}
        if isinstance(res.get("text"), str):
            return res["text"]
        return f"[resource {res.get('uri', '')}]"
    return f"[{block.type}{': ' + block.mime_type if block.mime_type else ''}]"


#: Lines of each side, past the common head and tail, that the line diff of a summary takes on;
#: past it the counts come from which lines each side has more of. difflib's matcher is quadratic
#: and runs on the event loop, per update of the tool: a 20,000-line edit held every
#: conversation for 5 s each time.
DIFF_LINES = 1_000


def summarize_diff(path: str, old: str | None, new: str) -> str:
    """One line per diff: ``edit path: +A -R lines`` (``create`` when there was no old text).

    Linear in the text past :data:`DIFF_LINES` changed lines: the lines both sides share at
    the start and end are not compared, and a larger middle is counted as multisets (a line
    moved within it then counts as neither added nor removed)."""
    old_lines = (old or "").splitlines()
    new_lines = new.splitlines()
    if old is None:
        return f"create {path}: +{len(new_lines)} lines"
    head = 0
    while head < min(len(old_lines), len(new_lines)) and old_lines[head] == new_lines[head]:
        head += 1
    tail = 0
    while tail < min(len(old_lines), len(new_lines)) - head and old_lines[-1 - tail] == new_lines[-1 - tail]:
        tail += 1
    old_mid = old_lines[head:len(old_lines) - tail]
    new_mid = new_lines[head:len(new_lines) - tail]
    if len(old_mid) <= DIFF_LINES and len(new_mid) <= DIFF_LINES:
        import difflib

        added = removed = 0
        for line in difflib.unified_diff(old_mid, new_mid, lineterm="", n=0):
            if line.startswith("+") and not line.startswith("+++"):
                added += 1
            elif line.startswith("-") and not line.startswith("---"):
                removed += 1
    else:
        from collections import Counter

        before, after = Counter(old_mid), Counter(new_mid)
        added, removed = (after - before).total(), (before - after).total()
    return f"edit {path}: +{added} -{removed} lines"


def render_content(content: list[s.ToolCallContent] | None, raw_output: Any = msgspec.UNSET,
                   limit: int | None = MAX_TOOL_TEXT) -> str:
    """A tool's output for display: its text content, diffs summarized, terminals named.

    Falls back to ``rawOutput`` when there is no content. ``limit`` None: the whole text.
    """
    parts: list[str] = []
    for c in content or []:
        if c.type == "diff":
            parts.append(summarize_diff(c.path, c.old_text, c.new_text))
        elif c.type == "terminal":
            parts.append(f"[terminal {c.terminal_id}]")
        elif c.content is not None:
            text = block_text(c.content)
            if text:
                parts.append(text)
    if not parts and raw_output is not msgspec.UNSET and raw_output is not None:
        if isinstance(raw_output, str):
            parts.append(raw_output)
        elif isinstance(raw_output, dict) and isinstance(raw_output.get("content"), str):
            parts.append(raw_output["content"])
        else:
            parts.append(render_input(raw_output))
    text = "\n".join(parts).strip("\n")
    return text if limit is None else bound(text, limit)


class ToolState:
    """What is known of one tool call so far; updates change only the fields they carry."""

    __slots__ = ("id", "title", "kind", "status", "content", "raw_input", "raw_output", "locations", "started",
                 "_rendered")

    def __init__(self, tool_call_id: str) -> None:
        self.id = tool_call_id
        self.title = ""
        self.kind = ""
        self.status = "pending"
        self.content: list[s.ToolCallContent] = []
        self.raw_input: Any = None
        self.raw_output: Any = msgspec.UNSET
        self.locations: list[s.ToolCallLocation] = []
        self.started = False
        #: limit -> render_content of the content and raw output as they are (a diff's summary is
        #: linear in its text, and a tool is shown again on every update)
        self._rendered: dict[int | None, str] = {}

    def merge(self, u: s.ToolCallFields) -> None:
        if isinstance(u.content, list) or u.raw_output is not msgspec.UNSET:
            self._rendered = {}
        if isinstance(u.title, str) and u.title:
            self.title = u.title
        if isinstance(u.kind, str) and u.kind:
            self.kind = u.kind
        if isinstance(u.status, str) and u.status:
            self.status = u.status
        if isinstance(u.content, list):
            self.content = u.content
        if u.raw_input is not msgspec.UNSET and u.raw_input not in (None, {}):
            self.raw_input = u.raw_input
        if u.raw_output is not msgspec.UNSET:
            self.raw_output = u.raw_output
        if isinstance(u.locations, list):
            self.locations = u.locations

    @property
    def terminal(self) -> bool:
        return self.status in ("completed", "failed")

    def whole_output(self) -> str:
        """The output :meth:`to_call` shows, uncut."""
        return self._render(None)

    def _render(self, limit: int | None) -> str:
        try:
            return self._rendered[limit]
        except KeyError:
            text = self._rendered[limit] = render_content(self.content, self.raw_output, limit=limit)
            return text

    def to_call(self) -> ToolCall:
        shown = render_input(self.raw_input)
        if not shown and self.locations:
            shown = ", ".join(loc.path + (f":{loc.line}" if loc.line else "") for loc in self.locations)
        return ToolCall(
            name=self.kind or "other",
            status=_STATUS.get(self.status, ToolStatus.RUNNING),
            title=self.title or shown or self.kind or "tool",
            input=shown,
            output=self._render(MAX_TOOL_TEXT),
        )


def permission_options(options: list[s.PermissionOption]) -> list[Option]:
    """The agent's options as the interaction's, in its order: allow_once -> allow_once, reject_* -> reject."""
    return [
        Option(id=o.option_id, label=o.name or o.option_id.replace("_", " "),
               allow_once=o.kind == "allow_once", reject=o.kind.startswith("reject"))
        for o in options
    ]


def commands(available: list[Any]) -> list[Command]:
    """An available_commands_update's commands (``{name, description, input: {hint}}``); odd entries skipped."""
    out: list[Command] = []
    for entry in available:
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name.strip():
            continue
        hint = entry.get("input")
        out.append(Command(name=name.strip().removeprefix("/"), description=str(entry.get("description") or ""),
                           input_hint=str(hint.get("hint") or "") if isinstance(hint, dict) else ""))
    return out


def todos(plan: s.PlanUpdate) -> TodoList:
    """A plan's entries as the whole todo list (ACP sends the complete plan each time)."""
    return TodoList(todos=[
        Todo(id=str(i), title=e.content, status=_TODO_STATUS.get(e.status, "pending"),  # type: ignore[arg-type]
             note=f"priority {e.priority}" if e.priority and e.priority != "medium" else "")
        for i, e in enumerate(plan.entries, 1)
    ])


def is_not_found(code: int, text: str) -> bool:
    """Whether an error answer to session/load or session/resume means "no such session".

    ACP's code is -32002 (resource not found); Gemini CLI answers -32603 with
    "Invalid session identifier" or "No previous sessions found".
    """
    if code == s.RESOURCE_NOT_FOUND:
        return True
    low = text.lower()
    return any(p in low for p in ("not found", "invalid session identifier", "no previous sessions", "no such session",
                                  "does not exist", "unknown session"))


#: Images up to this size go inline (where the agent takes images); bigger ones as a link.
MAX_INLINE_IMAGE_BYTES = 5 << 20
#: Text files up to this size go inline as an embedded resource (where the agent takes those).
MAX_INLINE_TEXT_BYTES = 1 << 20
_TEXT_TYPES = ("application/json", "application/xml", "application/javascript", "application/x-sh",
               "application/toml", "application/yaml", "application/x-yaml", "application/sql")


def prompt_blocks(prompt: Prompt, caps: s.PromptCapabilities) -> list[dict[str, Any]]:
    """The session/prompt content for ``prompt``: its text, then one block per attachment.

    An image goes inline when the agent advertises ``image``, a text file as an
    embedded resource when it advertises ``embeddedContext``; anything else as a
    ``resource_link`` to the stored copy (every agent takes those). Blocking: reads files.
    """
    blocks: list[dict[str, Any]] = [{"type": "text", "text": prompt.text}]
    for a in prompt.attachments:
        if not a.path:
            continue
        path = Path(a.path)
        link = {"type": "resource_link", "uri": path.as_uri(), "name": a.name, "mimeType": a.mime, "size": a.size}
        try:
            if caps.image and a.mime.startswith("image/") and 0 < a.size <= MAX_INLINE_IMAGE_BYTES:
                data = base64.b64encode(read_file(path)).decode("ascii")
                blocks.append({"type": "image", "data": data, "mimeType": a.mime, "uri": path.as_uri()})
                continue
            if caps.embedded_context and (a.mime.startswith("text/") or a.mime in _TEXT_TYPES) \
                    and a.size <= MAX_INLINE_TEXT_BYTES:
                text = read_file(path).decode("utf-8")
                blocks.append({"type": "resource", "resource": {"uri": path.as_uri(), "mimeType": a.mime, "text": text}})
                continue
        except (OSError, UnicodeDecodeError):
            pass
        blocks.append(link)
    return blocks
