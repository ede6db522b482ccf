"""Codex app-server values -> contract values: thread items, approvals, user-input requests, usage.

Pure functions on the JSON the app-server sends (``codex app-server
generate-json-schema`` prints its schema; the names below are from 0.171.0).
Items arrive flat, tagged by ``type``: ``userMessage``, ``agentMessage``,
``reasoning``, ``commandExecution``, ``fileChange``, ``mcpToolCall``,
``dynamicToolCall``, ``webSearch`` map to contract items; other types (plans,
review markers, compaction, images) are left out and logged by the caller.
Tool text is display text bounded to ``MAX_TOOL_TEXT`` characters.

Approvals offer Codex's own decisions: the request's ``availableDecisions``
when it sends them (0.171.0 does for commands), else accept, accept for the
session, decline and cancel. A decision the app-server shaped as an object
(``acceptWithExecpolicyAmendment``) is offered under its key and sent back
as it came.
"""

from __future__ import annotations

import collections
import datetime as _dt
import json
from typing import Any

from ...contract import (
    MAX_TAIL_LINE_BYTES,
    MAX_TAIL_LINES,
    Item,
    ItemKind,
    Option,
    OutputLine,
    Question,
    TokenUsage,
    ToolCall,
    ToolStatus,
    UnknownEvent,
)
from ... import runtime_output
from .._common import MAX_TOOL_TEXT, bound, render_input

#: item types that become tool items, and the tool name shown for each (MCP and dynamic tools name themselves)
TOOL_TYPES = {"commandExecution": "shell", "fileChange": "apply_patch", "mcpToolCall": "mcp",
              "dynamicToolCall": "tool", "webSearch": "web_search"}

#: Thread item types of the pinned app-server (0.171.0's schema) that agentd does not show; any
#: other type it does not map is journaled as an ``unknown`` record (a newer runtime).
INERT_ITEM_TYPES = frozenset({
    "collabAgentToolCall", "contextCompaction", "enteredReviewMode", "exitedReviewMode", "functionCallOutput",
    "hookPrompt", "imageGeneration", "imageView", "plan", "sleep", "subAgentActivity",
})

#: Server notifications the conversation acts on.
HANDLED_NOTIFICATIONS = frozenset({
    "thread/name/updated", "turn/started", "item/agentMessage/delta", "item/reasoning/summaryTextDelta",
    "item/reasoning/textDelta", "item/started", "item/completed", "item/commandExecution/outputDelta",
    "thread/tokenUsage/updated", "error", "turn/completed", "turn/diff/updated",
})

#: The rest of 0.171.0's server notifications: known, and deliberately not journaled (thread
#: bookkeeping, account and UI state, realtime audio, review plumbing). A method in neither set
#: comes from a newer runtime and is journaled verbatim as ``unknown``.
INERT_NOTIFICATIONS = frozenset({
    "thread/started", "thread/status/changed", "thread/readState/changed", "thread/archived", "thread/deleted",
    "thread/unarchived", "thread/closed", "thread/reverted", "skills/changed", "thread/section/changed",
    "thread/attachment/updated", "thread/goal/updated", "thread/prediction/updated", "thread/goal/cleared",
    "thread/queue/changed", "project/changed", "thread/project/updated", "thread/environment/connected",
    "thread/environment/disconnected", "thread/settings/updated", "hook/started", "hook/completed",
    "turn/plan/updated", "item/autoApprovalReview/started",
    "item/autoApprovalReview/completed", "autoApprovalReview/strictReviewRequired", "item/plan/delta",
    "command/exec/outputDelta", "process/outputDelta", "thread/search/partial", "process/exited",
    "item/commandExecution/terminalInteraction", "item/fileChange/outputDelta", "item/fileChange/patchUpdated",
    "serverRequest/resolved", "item/mcpToolCall/progress", "mcpServer/oauthLogin/completed",
    "mcpServer/startupStatus/updated", "mcpServer/event/stream/notification", "account/updated",
    "account/gatewayOAuth/changed", "account/rateLimits/updated", "app/list/updated", "remoteControl/status/changed",
    "externalAgentConfig/import/progress", "externalAgentConfig/import/completed", "fs/changed",
    "item/reasoning/summaryPartAdded", "thread/compacted", "model/rerouted", "model/verification",
    "modelProvider/authRecoveryStarted", "modelProvider/authRecoveryCompleted", "turn/moderationMetadata",
    "model/safetyBuffering/updated", "warning", "guardianWarning", "deprecationNotice", "configWarning",
    "fuzzyFileSearch/sessionUpdated", "fuzzyFileSearch/sessionCompleted", "thread/realtime/started",
    "thread/realtime/itemAdded", "thread/realtime/item/started", "thread/realtime/item/transcript/delta",
    "thread/realtime/item/completed", "thread/realtime/transcript/delta", "thread/realtime/transcript/done",
    "thread/realtime/outputAudio/delta", "thread/realtime/sdp", "thread/realtime/error", "thread/realtime/closed",
    "windows/worldWritableWarning", "windowsSandbox/setupCompleted", "account/login/completed",
})


def unknown_notification(provider: str, method: str, params: Any) -> UnknownEvent | None:
    """The ``unknown`` record of a server notification no Codex agentd knows, else None."""
    if method in HANDLED_NOTIFICATIONS or method in INERT_NOTIFICATIONS:
        return None
    return runtime_output.unknown(provider, method, params)


def unknown_item(provider: str, raw: dict[str, Any]) -> UnknownEvent | None:
    """The ``unknown`` record of a thread item of a type no Codex agentd knows, else None."""
    kind = raw.get("type")
    if kind in TOOL_TYPES or kind in INERT_ITEM_TYPES or kind in ("agentMessage", "userMessage", "reasoning"):
        return None
    return runtime_output.unknown(provider, f"item/{kind}", raw)


_STATUS = {"inProgress": ToolStatus.RUNNING, "completed": ToolStatus.COMPLETED, "failed": ToolStatus.FAILED,
           "declined": ToolStatus.FAILED}

#: labels of the decisions Codex defines (CommandExecutionApprovalDecision, FileChangeApprovalDecision)
DECISION_LABELS = {
    "accept": "Accept",
    "acceptForSession": "Accept for this session",
    "acceptWithExecpolicyAmendment": "Accept, and allow commands like it from now on",
    "applyNetworkPolicyAmendment": "Apply the proposed network rule",
    "decline": "Decline (the agent goes on)",
    "cancel": "Cancel (the turn ends)",
}
DEFAULT_DECISIONS: list[Any] = ["accept", "acceptForSession", "decline", "cancel"]
_REJECTS = {"decline", "cancel"}


def _time_ms(value: Any) -> _dt.datetime | None:
    if isinstance(value, (int, float)) and value > 0:
        return _dt.datetime.fromtimestamp(value / 1000, _dt.timezone.utc)
    return None


def item(raw: dict[str, Any]) -> Item | None:
    """The contract item for a Codex thread item, or None for a type agentd does not show."""
    kind = raw.get("type")
    iid = str(raw.get("id") or "")
    started, ended = _time_ms(raw.get("startedAtMs")), _time_ms(raw.get("completedAtMs"))
    if not iid:
        return None
    if kind == "agentMessage":
        return Item(id=iid, kind=ItemKind.ASSISTANT, text=str(raw.get("text") or ""), time=started, ended_at=ended)
    if kind == "userMessage":
        return Item(id=iid, kind=ItemKind.USER, text=user_text(raw.get("content")), time=started, ended_at=ended)
    if kind == "reasoning":
        parts = raw.get("summary") or raw.get("content") or []
        text = "\n\n".join(str(p) for p in parts if isinstance(p, str))
        return Item(id=iid, kind=ItemKind.REASONING, text=text, time=started, ended_at=ended)
    if kind in TOOL_TYPES:
        return Item(id=iid, kind=ItemKind.TOOL, tool=tool_call(raw), time=started, ended_at=ended)
    return None


def user_text(content: Any) -> str:
    """The text of a userMessage's inputs (images and mentions by their path or name)."""
    out: list[str] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            out.append(str(part.get("text") or ""))
        elif part.get("path") or part.get("name"):
            out.append(f"[{part.get('type')}: {part.get('path') or part.get('name')}]")
    return "\n".join(out)


def tool_call(raw: dict[str, Any], tail: collections.deque[OutputLine] | None = None) -> ToolCall:
    """The ToolCall of a tool-like thread item; ``tail`` is a running command's newest output lines."""
    kind = raw.get("type")
    status = _STATUS.get(str(raw.get("status")), ToolStatus.RUNNING)
    if kind == "commandExecution":
        command = str(raw.get("command") or "")
        code = raw.get("exitCode")
        running = status is ToolStatus.RUNNING
        output = str(raw.get("aggregatedOutput") or "")
        if raw.get("status") == "declined":
            output = output or "declined"
        return ToolCall(name="shell", status=status, title=bound(command, 200), input=bound(command),
                        output=bound(output), exit_code=code if isinstance(code, int) else None,
                        tail=list(tail) if running and tail else [])
    if kind == "fileChange":
        changes = [c for c in raw.get("changes") or [] if isinstance(c, dict)]
        paths = ", ".join(str(c.get("path")) for c in changes)
        diff = "\n".join(f"{_change_kind(c.get('kind'))} {c.get('path')}\n{c.get('diff') or ''}" for c in changes)
        return ToolCall(name="apply_patch", status=status, title=bound(f"Edit {paths}" if paths else "Edit files", 200),
                        input=bound(diff), output="declined" if raw.get("status") == "declined" else "")
    if kind == "mcpToolCall":
        name = f"{raw.get('server')}.{raw.get('tool')}"
        err = raw.get("error")
        output = render_input(raw.get("result")) if raw.get("result") is not None else ""
        if isinstance(err, dict):
            output = str(err.get("message") or "") or output
        return ToolCall(name=name, status=status, title=bound(name, 200), input=bound(render_input(raw.get("arguments"))),
                        output=bound(output))
    if kind == "dynamicToolCall":
        name = str(raw.get("tool") or "tool")
        return ToolCall(name=name, status=status, title=bound(name, 200), input=bound(render_input(raw.get("arguments"))),
                        output=bound(render_input(raw.get("contentItems")) if raw.get("contentItems") else ""))
    query = str(raw.get("query") or "")  # webSearch: no status of its own; completed once item/completed says so
    return ToolCall(name="web_search", status=status if raw.get("status") else ToolStatus.RUNNING,
                    title=bound(f"Search: {query}", 200), input=bound(query))


def whole_tool_text(raw: dict[str, Any]) -> str:
    """The output of a tool-like thread item before :func:`tool_call`'s display cut ("" when none)."""
    kind = raw.get("type")
    if kind == "commandExecution":
        return str(raw.get("aggregatedOutput") or "")
    if kind == "mcpToolCall" and not isinstance(raw.get("error"), dict):
        return render_input(raw.get("result"), None)
    if kind == "dynamicToolCall" and raw.get("contentItems"):
        return render_input(raw.get("contentItems"), None)
    return ""


def _change_kind(kind: Any) -> str:
    name = kind.get("type") if isinstance(kind, dict) else kind
    return {"add": "A", "delete": "D", "update": "M"}.get(str(name), "M")


def push_output(tail: collections.deque[OutputLine], partial: list[str], delta: str) -> None:
    """Add a command's output delta to ``tail`` (its newest lines); ``partial`` holds the unfinished line."""
    text = partial[0] + delta if partial else delta
    *lines, rest = text.split("\n")
    for line in lines:
        tail.append(OutputLine(text=line.encode()[:MAX_TAIL_LINE_BYTES].decode("utf-8", "ignore")))
    if len(rest) > 4 * MAX_TAIL_LINE_BYTES:
        tail.append(OutputLine(text=rest.encode()[:MAX_TAIL_LINE_BYTES].decode("utf-8", "ignore")))
        rest = ""
    partial[:] = [rest]


def new_tail() -> collections.deque[OutputLine]:
    return collections.deque(maxlen=MAX_TAIL_LINES)


# --------------------------------------------------------------------------- approvals


def permission_options(available: Any) -> tuple[list[Option], dict[str, Any]]:
    """Options for an approval request, and each option id's decision value to send back."""
    decisions = available if isinstance(available, list) and available else DEFAULT_DECISIONS
    options: list[Option] = []
    values: dict[str, Any] = {}
    for d in decisions:
        if isinstance(d, str):
            key = d
        elif isinstance(d, dict) and len(d) == 1:
            key = next(iter(d))
        else:
            continue
        if key in values:
            continue
        values[key] = d
        options.append(Option(id=key, label=DECISION_LABELS.get(key, key), reject=key in _REJECTS,
                              allow_once=key == "accept"))
    # Decline before cancel: `agentctl answer --deny` takes the first reject option, and decline lets the turn go on.
    options.sort(key=lambda o: 1 if o.id == "cancel" else 0)
    return options, values


def approval_detail(method: str, params: dict[str, Any]) -> tuple[str, str]:
    """(title, detail) of an approval request."""
    reason = str(params.get("reason") or "")
    if method == "item/commandExecution/requestApproval":
        command = str(params.get("command") or "")
        title = f"Run {bound(command, 200)}?" if command else "Run the command?"
        return title, bound("\n".join(x for x in (command, reason, str(params.get("cwd") or "")) if x))
    if method == "item/fileChange/requestApproval":
        root = str(params.get("grantRoot") or "")
        return ("Allow writes under " + root + "?" if root else "Apply the file changes?"), bound(reason)
    return "Grant the requested permissions?", bound("\n".join(
        x for x in (reason, json.dumps(params.get("permissions") or {})) if x))


#: an MCP tool call's approval (mcpServer/elicitation/request with _meta.codex_approval_kind "mcp_tool_call")
MCP_TOOL_OPTIONS = [
    Option(id="accept", label="Run the tool", allow_once=True),
    Option(id="decline", label="Do not run it", reject=True),
]


def is_mcp_tool_approval(method: str, params: dict[str, Any]) -> bool:
    meta = params.get("_meta")
    return method == "mcpServer/elicitation/request" and isinstance(meta, dict) and \
        meta.get("codex_approval_kind") == "mcp_tool_call"


def mcp_tool_approval_detail(params: dict[str, Any]) -> tuple[str, str]:
    """(title, detail) of an MCP tool call's approval: the server, the tool, its arguments."""
    meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
    server, tool = str(params.get("serverName") or ""), str(meta.get("tool_name") or "")
    title = f"Use {server}/{tool}?" if tool else str(params.get("message") or "Use the MCP tool?")
    return bound(title, 200), bound(json.dumps(meta.get("tool_params") or {}))


#: permission request (item/permissions/requestApproval) options: grant for the turn, for the session, or not
PERMISSION_GRANT_OPTIONS = [
    Option(id="accept", label="Grant for this turn", allow_once=True),
    Option(id="acceptForSession", label="Grant for this session"),
    Option(id="decline", label="Decline", reject=True),
]


def permission_grant(params: dict[str, Any], decision: str) -> dict[str, Any]:
    """The PermissionsRequestApprovalResponse for ``decision``: the requested profile, or nothing."""
    if decision in ("accept", "acceptForSession"):
        requested = params.get("permissions") if isinstance(params.get("permissions"), dict) else {}
        granted = {k: v for k, v in requested.items() if k in ("fileSystem", "network") and v is not None}
        return {"permissions": granted, "scope": "session" if decision == "acceptForSession" else "turn"}
    return {"permissions": {}, "scope": "turn"}


# --------------------------------------------------------------------------- user input


def questions(params: dict[str, Any]) -> tuple[list[Question], list[str]]:
    """Questions of an item/tool/requestUserInput request, and each one's Codex id (same order)."""
    out: list[Question] = []
    ids: list[str] = []
    for q in params.get("questions") or []:
        if not isinstance(q, dict):
            continue
        choices = [str(o.get("label")) for o in q.get("options") or [] if isinstance(o, dict) and o.get("label")]
        out.append(Question(text=str(q.get("question") or ""), header=str(q.get("header") or ""), choices=choices,
                            custom=bool(q.get("isOther")) or not choices))
        ids.append(str(q.get("id") or ""))
    return out, ids


def user_input_answer(ids: list[str], answers: list[list[str]]) -> dict[str, Any]:
    """ToolRequestUserInputResponse: question id -> its answers."""
    return {"answers": {qid: {"answers": [v for v in values if v]} for qid, values in zip(ids, answers)}}


# --------------------------------------------------------------------------- usage


def token_usage(params: dict[str, Any], model: str) -> tuple[TokenUsage | None, tuple[int, int] | None]:
    """thread/tokenUsage/updated -> the last model call's tokens, and (context used, window) when known."""
    usage = params.get("tokenUsage")
    if not isinstance(usage, dict):
        return None, None
    last = usage.get("last") if isinstance(usage.get("last"), dict) else {}

    def n(key: str) -> int:
        v = last.get(key)
        return int(v) if isinstance(v, (int, float)) and v > 0 else 0

    tokens = TokenUsage(model=model, input=n("inputTokens"), output=n("outputTokens"), cache_read=n("cachedInputTokens"),
                        cache_write=n("cacheWriteInputTokens"))
    window = usage.get("modelContextWindow")
    context = (n("inputTokens") + n("outputTokens"), int(window)) if isinstance(window, int) and window > 0 else None
    return tokens, context


__all__ = ["MAX_TOOL_TEXT", "item", "tool_call", "permission_options", "questions", "token_usage"]
