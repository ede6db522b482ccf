"""The provider-neutral contract between agentd and its provider adapters.

Everything a provider reports, and everything agentd asks of one, is a value
defined here: msgspec Structs for items, events, interactions and capabilities,
typing Protocols for providers and conversations, and the exception classes
for the error values. Nothing here knows about sockets, the journal or trio.

Lifetime rules every provider follows (they are the point of this module):

* A conversation belongs to the daemon, never to a client connection. A call
  bounds only itself; a turn keeps running after ``send`` returns and after
  the client that asked for it went away.
* Providers report through the :class:`EventSink` given at ``open``.
  ``EventSink.emit`` never blocks, so it may be called from any task.
* Providers never replay a prompt, never pick "the latest" conversation and
  never answer an interaction on the user's behalf. Only the daemon may, in
  yolo mode, and only for permission requests, only with the allow-once
  option.
* An ambiguous submission raises :class:`SubmissionUncertain`; the caller
  surfaces it and never resends.
* :class:`Capabilities` says what really works; anything else raises
  :class:`Unsupported`.
"""

from __future__ import annotations

import datetime as _dt
import enum
import math
import re
from typing import Any, ClassVar, Literal, Protocol, Union, runtime_checkable

import msgspec

# --------------------------------------------------------------------------- errors


class AgentdError(Exception):
    """Base of every error agentd reports; ``code`` is its wire error code."""

    code: ClassVar[str] = "internal"

    def __init__(self, message: str = "", *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message or self.__class__.__doc__ or self.code)
        self.message = message or (self.__class__.__doc__ or self.code).strip().splitlines()[0]
        self.details = details or {}


class NotFound(AgentdError):
    """The named conversation, interaction or item does not exist."""

    code = "not_found"


class ConversationNotFound(NotFound):
    """The exact conversation id does not exist (a runtime that died before it saved the session
    says so at its reopen). A provider never creates a replacement by itself; only the service may,
    where the journal shows nothing the runtime kept is lost (agentd.lost_sessions)."""


class Invalid(AgentdError):
    """The request or answer does not fit what it is for."""

    code = "invalid"


class Busy(AgentdError):
    """A turn is already running and the caller asked not to wait."""

    code = "busy"


class Unsupported(AgentdError):
    """The provider does not offer this operation."""

    code = "unsupported"


class SubmissionUncertain(AgentdError):
    """The provider may or may not have accepted the prompt; it is never resent."""

    code = "uncertain"


class InteractionGone(AgentdError):
    """The interaction is no longer pending (answered, expired, or its turn ended)."""

    code = "gone"


class Closed(AgentdError):
    """The conversation is closed, or its runtime exited."""

    code = "closed"


class Unauthorized(AgentdError):
    """The peer is not allowed to talk to this daemon."""

    code = "unauthorized"


class LimitExceeded(AgentdError):
    """A size or count limit was exceeded."""

    code = "limit"


class Refused(AgentdError):
    """agentd will not use a file in its state dir that is not what it wrote (a symlink, a FIFO);
    the message names the path and what is there. Waiting or retrying does not change it."""

    code = "refused"


class InternalError(AgentdError):
    """agentd failed; the message says how."""

    code = "internal"


class RuntimeUnavailable(AgentdError):
    """The provider's runtime is not installed or could not start."""

    code = "unsupported"


class SessionUnreadable(RuntimeUnavailable):
    """The runtime answered the reopen of a session it has with an error: its store of that session
    is empty or damaged (a runtime killed before it wrote the session: codex-acp's "empty session
    file"), or the runtime failed otherwise. Not a timeout or a crash: those stay RuntimeUnavailable.

    As with ConversationNotFound, agentd.lost_sessions goes on in a fresh session where the journal
    shows the runtime held no context; otherwise this error stands and a later prompt tries the
    reopen again. On the wire it is RuntimeUnavailable's ``unsupported``.
    """


#: Wire error code -> exception class, one to one (the client re-raises these).
ERRORS_BY_CODE: dict[str, type[AgentdError]] = {
    cls.code: cls
    for cls in (
        NotFound,
        Invalid,
        Busy,
        Unsupported,
        SubmissionUncertain,
        InteractionGone,
        Closed,
        Unauthorized,
        LimitExceeded,
        Refused,
        InternalError,
    )
}


def utcnow() -> _dt.datetime:
    """The current time, timezone-aware UTC."""
    return _dt.datetime.now(_dt.timezone.utc)


# --------------------------------------------------------------------------- capabilities


class Capabilities(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a provider really supports; clients hide what is False."""

    cancel: bool = False
    steer: bool = False
    #: list the runtime's slash commands and skills, and run one as a turn (:class:`CommandRunner`)
    commands: bool = False
    permissions: bool = False
    questions: bool = False
    plan: bool = False
    history: bool = False
    #: reopen an exact conversation id after the daemon restarted
    reopen: bool = False
    #: list the models it offers (``models()``)
    models: bool = False
    #: change a conversation's model or effort between turns (``set_model``)
    set_model: bool = False
    titles: bool = False
    usage: bool = False
    context_size: bool = False
    subagents: bool = False
    #: stop one subagent instance, the rest going on (:class:`SubagentController`)
    cancel_subagent: bool = False
    #: send text to one idle subagent (:class:`SubagentController`)
    prompt_subagent: bool = False
    todos: bool = False
    #: list the runtime's earlier conversations for a folder
    import_: bool = msgspec.field(default=False, name="import")
    account: bool = False
    #: sign in with a token through agentd (``agentctl login --with-token``: :class:`SignInManager`)
    sign_in: bool = False
    #: remove the runtime's stored sign-in (``agentctl logout``: :class:`SignOutManager`)
    sign_out: bool = False
    #: sign in through GitHub's device flow (``agentctl login --device``: :class:`DeviceSignInManager`)
    device_sign_in: bool = False
    #: report the account's quota (``agentctl quota``: :class:`QuotaReporter`)
    quota: bool = False
    #: the runtime is a process of its own, which can die apart from agentd
    runtime_process: bool = False
    #: turns call a model endpoint, which can fail apart from the runtime
    model_endpoint: bool = False
    #: prompts may carry files (``Prompt.attachments``), passed on in a form the runtime takes
    attachments: bool = False
    #: branch a new conversation off a completed turn, natively (:class:`Forker`)
    fork: bool = False
    #: discard the turns after a completed one, natively (:class:`Rewinder`)
    rewind: bool = False
    #: agentd's own per-turn file checkpoints (diff, revert): agentd-side, so the same for every
    #: provider, true while ``[checkpoints]`` is on
    checkpoints: bool = False
    #: the runtime takes MCP servers at open (``OpenRequest.mcp_servers``) and its agent calls their tools
    mcp: bool = False


# --------------------------------------------------------------------------- items


class ItemKind(str, enum.Enum):
    USER = "user"
    ASSISTANT = "assistant"
    REASONING = "reasoning"
    TOOL = "tool"
    #: provider-originated status text: errors, aborts, info
    NOTICE = "notice"


class ToolStatus(str, enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"


#: How deep free-form JSON from a client or a runtime (tool arguments, input schemas, an unknown
#: event's payload) may nest, in containers. Far past any real schema, and well inside the
#: recursion that every later encode of it takes (msgspec and json recurse per level: a value
#: decoded near the interpreter's limit failed to encode again deeper down the stack).
MAX_JSON_NESTING = 100


def nested_deeper_than(value: Any, limit: int = MAX_JSON_NESTING) -> bool:
    """Whether ``value`` (plain JSON: dicts, lists, tuples, scalars) nests more than ``limit``
    containers deep (``[[1]]`` is 2). Iterative: any depth is checked without recursing."""
    stack = [(value, 1)] if isinstance(value, (dict, list, tuple)) else []
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if depth > limit:
            return True
        for child in children:
            if isinstance(child, (dict, list, tuple)):
                stack.append((child, depth + 1))
    return False


#: A running shell call keeps at most this many output lines, each at most this many bytes.
MAX_TAIL_LINES = 10
MAX_TAIL_LINE_BYTES = 512
#: Tool progress text is display metadata, bounded in UTF-8 bytes.
MAX_PROGRESS_BYTES = 512


class OutputLine(msgspec.Struct, frozen=True, omit_defaults=True):
    text: str
    err: bool = False


class ToolCall(msgspec.Struct, omit_defaults=True):
    """One tool invocation. ``input`` and ``output`` are display text, bounded by adapters."""

    name: str
    status: ToolStatus = ToolStatus.RUNNING
    title: str = ""
    input: str = ""
    output: str = ""
    progress: str = ""
    exit_code: int | None = None
    #: newest output lines of a running shell call, oldest first; empty once it ended
    tail: list[OutputLine] = []
    #: UTF-8 bytes of the whole output left out of ``output`` (a display cut); 0 = nothing cut.
    #: The daemon keeps the whole output when the provider gave it (ToolOutputEvent).
    cut: int = 0


class Attachment(msgspec.Struct, frozen=True, omit_defaults=True):
    """A file sent with a prompt: its (sanitized) name, MIME type, size in bytes and content id.

    ``path`` is the absolute path of the stored copy, under the daemon's state
    dir; the daemon sets it on what it hands a provider (its ``prompt``
    records leave it out). A provider reads the file there, never writes it.
    """

    name: str
    mime: str
    size: int = 0
    id: str = ""
    path: str = ""


class Item(msgspec.Struct, omit_defaults=True):
    """One transcript entry. A later item with the same ``agent_id`` and ``id`` replaces it.

    ``text`` is untrusted provider output. ``agent_id`` is empty for the main
    agent, else the exact subagent instance id.
    """

    id: str
    kind: ItemKind
    text: str = ""
    tool: ToolCall | None = None
    time: _dt.datetime | None = None
    ended_at: _dt.datetime | None = None
    agent_id: str = ""
    #: "steer" on a user item that joined a running turn
    delivery: str = ""
    attachments: list[Attachment] = []


class Delta(msgspec.Struct, frozen=True, omit_defaults=True, gc=False):
    """Appends ``text`` to item ``item_id`` of kind ``kind``, creating it when absent.

    Not tracked by the garbage collector (msgspec ``gc=False``): its fields are strings and an
    enum, so it can never be part of a reference cycle, and one is made per streamed chunk.
    """

    item_id: str
    kind: ItemKind
    text: str
    agent_id: str = ""


# --------------------------------------------------------------------------- turns


class TurnState(str, enum.Enum):
    WORKING = "working"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self is not TurnState.WORKING


#: Turn end reason the daemon records for a turn whose daemon died mid-turn.
RUN_INTERRUPTED = "run_interrupted"


class Turn(msgspec.Struct, frozen=True, omit_defaults=True):
    """A turn transition, with the provider's evidence.

    ``error`` is the sanitized reason of a failed turn; ``reason`` a short code
    for why it stopped (``run_interrupted``, ``budget``, ``runtime_exit`` ...).
    Waiting for a person is derived from pending interactions, not a state.
    """

    state: TurnState
    error: str = ""
    reason: str = ""
    model: str = ""
    #: the runtime never reported this end: agentd inferred it (an inactivity deadline, a cancel
    #: the runtime did not confirm, a completion read from the runtime's own record)
    inferred: bool = False
    #: the runtime's own name for the point this turn ended at (a Claude Code message uuid, a
    #: Codex turn id), set on a terminal turn the runtime recorded; fork and rewind name it
    marker: str = ""


# --------------------------------------------------------------------------- interactions


class InteractionKind(str, enum.Enum):
    PERMISSION = "permission"
    QUESTION = "question"
    PLAN_REVIEW = "plan_review"


class InteractionState(str, enum.Enum):
    PENDING = "pending"
    ANSWERED = "answered"
    REJECTED = "rejected"
    #: withdrawn without an answer (turn ended, timeout, conversation closed)
    EXPIRED = "expired"


class Option(msgspec.Struct, frozen=True, omit_defaults=True):
    """One permission decision. Yolo mode only ever picks the option with ``allow_once``."""

    id: str
    label: str
    reject: bool = False
    allow_once: bool = False


FieldType = Literal["string", "number", "integer", "boolean", "array"]
FieldFormat = Literal["", "email", "uri", "date", "date-time"]


class Field(msgspec.Struct, frozen=True, omit_defaults=True):
    """One typed form field behind a question of an elicitation form.

    An enumerated field (and a boolean, as "Yes"/"No") offers its question's
    choices; ``values`` holds what each choice sends, in the same order.
    Bounds left ``None`` do not apply. String lengths count characters.
    """

    name: str
    type: FieldType
    required: bool = False
    values: list[str] = []
    format: FieldFormat = ""
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    min_items: int | None = None
    max_items: int | None = None


class Question(msgspec.Struct, frozen=True, omit_defaults=True):
    """One prompt of a question interaction: choices, free text, or a typed field."""

    text: str
    header: str = ""
    choices: list[str] = []
    multiple: bool = False
    custom: bool = False
    field: Field | None = None

    def field_value(self, values: list[str]) -> tuple[Any, bool]:
        """Validate ``values`` (the answer to this question) against its field.

        Returns ``(value, answered)``: the value the field sends (str, float,
        int, bool or list[str]) and whether the field was answered at all (an
        optional field may be left empty). Every bound is checked here, so an
        invalid answer never reaches a provider. Raises :class:`Invalid`.
        """
        f = self.field
        if f is None:
            raise Invalid(f"question {self.text!r} has no form field")
        present = [v for v in values if v != ""]
        if not present:
            if f.required:
                raise Invalid(f"field {f.name!r} is required")
            return None, False

        def mapped(v: str) -> str:
            # A choice label maps to its value; a raw value is accepted too.
            if self.choices and f.values:
                if v in self.choices:
                    return f.values[self.choices.index(v)]
                if v in f.values:
                    return v
                raise Invalid(f"field {f.name!r}: {v!r} is not one of {self.choices}")
            if self.choices and v not in self.choices:
                raise Invalid(f"field {f.name!r}: {v!r} is not one of {self.choices}")
            return v

        if f.type == "array":
            chosen = [mapped(v) for v in present]
            if len(set(chosen)) != len(chosen):
                raise Invalid(f"field {f.name!r}: a choice is repeated")
            if f.min_items is not None and len(chosen) < f.min_items:
                raise Invalid(f"field {f.name!r} takes at least {f.min_items} choices")
            if f.max_items is not None and len(chosen) > f.max_items:
                raise Invalid(f"field {f.name!r} takes at most {f.max_items} choices")
            return chosen, True
        if len(present) != 1:
            raise Invalid(f"field {f.name!r} takes exactly one value")
        raw = present[0]
        if f.type == "boolean":
            truth = {"yes": True, "true": True, "no": False, "false": False}
            v = raw.strip().lower()
            if self.choices and raw in self.choices and f.values:
                v = f.values[self.choices.index(raw)].lower()
            if v not in truth:
                raise Invalid(f"field {f.name!r} takes yes or no, not {raw!r}")
            return truth[v], True
        if f.type in ("number", "integer"):
            text = mapped(raw).strip()
            try:
                num: float | int = int(text) if f.type == "integer" else float(text)
            except ValueError:
                raise Invalid(f"field {f.name!r} takes {'an integer' if f.type == 'integer' else 'a number'}, not {raw!r}") from None
            if isinstance(num, float) and not math.isfinite(num):
                raise Invalid(f"field {f.name!r} takes a finite number")
            if f.minimum is not None and num < f.minimum:
                raise Invalid(f"field {f.name!r} must be >= {f.minimum:g}")
            if f.maximum is not None and num > f.maximum:
                raise Invalid(f"field {f.name!r} must be <= {f.maximum:g}")
            return num, True
        text = mapped(raw)
        if f.min_length is not None and len(text) < f.min_length:
            raise Invalid(f"field {f.name!r} takes at least {f.min_length} characters")
        if f.max_length is not None and len(text) > f.max_length:
            raise Invalid(f"field {f.name!r} takes at most {f.max_length} characters")
        if f.format and not _FORMAT_CHECKS[f.format](text):
            raise Invalid(f"field {f.name!r} must be a valid {f.format}")
        return text, True


def _is_date(text: str) -> bool:
    try:
        _dt.date.fromisoformat(text)
        return bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", text))
    except ValueError:
        return False


def _is_datetime(text: str) -> bool:
    try:
        return _dt.datetime.fromisoformat(text.replace("Z", "+00:00")).tzinfo is not None
    except ValueError:
        return False


_SPACE = re.compile(r"\s")


def _is_email(text: str) -> bool:
    """``local@domain.tld``: one "@", no whitespace, a dot inside the domain. In linear time: the
    regex it replaces backtracked quadratically on an answer such as ``a@....@`` (text a client
    sends, checked on the event loop)."""
    local, at, domain = text.partition("@")
    return bool(local and at and "@" not in domain and "." in domain[1:-1]) and not _SPACE.search(text)


_FORMAT_CHECKS = {
    "email": _is_email,
    "uri": lambda s: re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:[^\s]+", s) is not None,
    "date": _is_date,
    "date-time": _is_datetime,
}


class Elicitation(msgspec.Struct, frozen=True, omit_defaults=True):
    """Marks a question interaction standing for a structured request (a form or a link).

    It is user data, never a permission, so yolo mode never answers it.
    """

    mode: Literal["form", "url"] = "form"
    source: str = ""
    url: str = ""


PlanAction = Literal["autopilot", "interactive", "exit_only"]


class PlanReview(msgspec.Struct, frozen=True, omit_defaults=True):
    request_id: str
    summary: str = ""
    content: str = ""
    actions: list[PlanAction] = []
    recommended: PlanAction | None = None


class Interaction(msgspec.Struct, omit_defaults=True):
    """A provider request that needs a person: a permission, a question or a plan review.

    ``options`` lists the decisions a permission accepts; ``questions`` the
    prompts of a question (an answer has one entry per question). ``auto``
    is set by the daemon, never a provider: yolo answered it.
    """

    id: str
    kind: InteractionKind
    title: str
    detail: str = ""
    options: list[Option] = []
    questions: list[Question] = []
    plan: PlanReview | None = None
    elicitation: Elicitation | None = None
    state: InteractionState = InteractionState.PENDING
    resolution: str = ""
    time: _dt.datetime | None = None
    agent_id: str = ""
    tool_call_id: str = ""
    auto: bool = False


class PlanAnswer(msgspec.Struct, frozen=True, omit_defaults=True):
    """Exactly one offered action, or nonblank feedback that refuses the plan."""

    action: PlanAction | None = None
    feedback: str = ""


class Answer(msgspec.Struct, frozen=True, omit_defaults=True):
    """A response to an interaction.

    Permissions set ``decision`` (an option id). Questions set ``answers``,
    one list per question holding chosen choices and/or a custom text, or
    ``reject`` to decline. ``cancel`` dismisses an elicitation. Plan reviews
    set ``plan``.
    """

    decision: str = ""
    answers: list[list[str]] = []
    reject: bool = False
    cancel: bool = False
    plan: PlanAnswer | None = None


class AnswerRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """An answer as journaled: who gave it (``auto`` = yolo) and when."""

    interaction_id: str
    answer: Answer
    auto: bool = False
    by: str = ""


def validate_answer(interaction: Interaction, answer: Answer) -> None:
    """Check that ``answer`` fits ``interaction``; raise :class:`Invalid` when it does not.

    Permission: ``decision`` names one of its options. Question: either
    ``reject``/``cancel``, or one answer list per question whose values are
    offered choices or a custom text where custom text is allowed, and whose
    form fields validate (:meth:`Question.field_value`). Plan review: one
    offered action or nonblank feedback.
    """
    if interaction.kind is InteractionKind.PERMISSION:
        if not answer.decision:
            raise Invalid("a permission answer needs a decision (one of its option ids)")
        if answer.decision not in {o.id for o in interaction.options}:
            ids = ", ".join(o.id for o in interaction.options)
            raise Invalid(f"unknown option {answer.decision!r}; choose one of: {ids}")
        return
    if interaction.kind is InteractionKind.PLAN_REVIEW:
        p = answer.plan
        if p is None:
            raise Invalid("a plan review answer needs an action or feedback")
        if (p.action is None) == (not p.feedback.strip()):
            raise Invalid("a plan review answer takes exactly one action or nonblank feedback")
        offered = interaction.plan.actions if interaction.plan else []
        if p.action is not None and p.action not in offered:
            raise Invalid(f"action {p.action!r} is not offered; choose one of: {', '.join(offered)}")
        return
    # question
    if answer.reject or answer.cancel:
        if answer.answers:
            raise Invalid("an answer either rejects or answers, not both")
        if answer.cancel and interaction.elicitation is None:
            raise Invalid("only an elicitation can be cancelled")
        return
    if len(answer.answers) != len(interaction.questions):
        raise Invalid(
            f"expected {len(interaction.questions)} answer(s), one per question; got {len(answer.answers)}"
        )
    for q, values in zip(interaction.questions, answer.answers):
        if q.field is not None:
            q.field_value(values)
            continue
        if not values or all(v == "" for v in values):
            raise Invalid(f"question {q.text!r} needs an answer")
        custom = [v for v in values if v not in q.choices]
        if custom and not q.custom:
            raise Invalid(f"question {q.text!r} takes one of {q.choices}, not {custom[0]!r}")
        if len(custom) > 1:
            raise Invalid(f"question {q.text!r} takes at most one custom text")
        if len(values) > 1 and not q.multiple:
            raise Invalid(f"question {q.text!r} takes a single answer")


# --------------------------------------------------------------------------- subagents, todos, usage


class SubagentStatus(str, enum.Enum):
    RUNNING = "running"
    IDLE = "idle"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (SubagentStatus.COMPLETED, SubagentStatus.FAILED, SubagentStatus.CANCELLED)


class SubagentRun(msgspec.Struct, frozen=True, omit_defaults=True):
    """One period of work of a subagent; ``trigger`` is spawn, agent or user."""

    status: SubagentStatus
    trigger: str = "spawn"
    started_at: _dt.datetime | None = None
    ended_at: _dt.datetime | None = None


#: A reused subagent keeps at most this many runs: the first and the newest.
MAX_SUBAGENT_RUNS = 50


class Subagent(msgspec.Struct, omit_defaults=True):
    """One agent instance the main agent delegated work to; its items carry ``agent_id == id``."""

    id: str
    name: str
    status: SubagentStatus
    description: str = ""
    model: str = ""
    parent_tool_call_id: str = ""
    error: str = ""
    started_at: _dt.datetime | None = None
    ended_at: _dt.datetime | None = None
    runs: list[SubagentRun] = []
    tokens: int = 0
    tool_calls: int = 0


class Todo(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str
    title: str
    status: Literal["pending", "in_progress", "done", "blocked"] = "pending"
    note: str = ""
    agent_id: str = ""


class TodoList(msgspec.Struct, frozen=True, omit_defaults=True):
    """The conversation's todo list; ``known`` is False when it could not be read."""

    known: bool = True
    todos: list[Todo] = []


class Usage(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a conversation consumed so far: a total, never an increment.

    ``ai_units`` is the provider's own unit (Copilot AI units); ``cost_usd``
    is present when the provider reports money. A provider may leave the
    token totals at 0: the daemon sums them from each :class:`TokensEvent`.
    On the daemon's running total, ``estimated`` says that ``cost_usd``
    includes prices from the configured pricing table, not only the
    provider's own figures; ``cached_tokens`` counts cache reads, which
    ``input_tokens`` includes.
    """

    ai_units: float = 0.0
    cost_usd: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    estimated: bool = False
    #: the account's quota or rate-limit snapshot, as the runtime last sent it during a turn
    #: (empty: none sent); a report carrying one replaces the total's
    quota: list["Quota"] = []


class TokenUsage(msgspec.Struct, frozen=True, omit_defaults=True):
    """One model call. ``input`` includes cache reads and writes."""

    model: str = ""
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    duration_ms: int = 0
    cost_usd: float | None = None


class Context(msgspec.Struct, frozen=True, omit_defaults=True):
    """The provider's latest context-window report (tokens), not an estimate."""

    used: int
    limit: int
    prompt: int = 0
    cached: int = 0


class Retry(msgspec.Struct, frozen=True, omit_defaults=True):
    count: int
    reason: str = ""
    status: int = 0


class Activity(msgspec.Struct, frozen=True, omit_defaults=True):
    """The main agent's live state in the running turn; never journaled."""

    intent: str = ""
    retry: Retry | None = None
    phase: str = ""


class ModelSelection(msgspec.Struct, frozen=True, omit_defaults=True):
    """Model settings: provider-confirmed (``source`` ""), or asked for by a person (``source``
    "user", journaled by the daemon before the provider is told; ``queued`` while it waits for
    the running turn to end). ``None`` fields were not reported."""

    model: str
    effort: str | None = None
    source: str = ""
    queued: bool = False
    context_tier: str | None = None


class ContextTier(msgspec.Struct, frozen=True, omit_defaults=True):
    """A selectable context-window size of a model: its id and its prompt budget in tokens (0: not said)."""

    id: str
    tokens: int = 0


#: Relative model cost tiers, cheapest first (``Model.cost_tier``; "" = not reported).
COST_TIERS = ("low", "medium", "high", "very_high")


class Model(msgspec.Struct, frozen=True, omit_defaults=True):
    """One model a provider offers: its id, display name, the effort levels and context tiers
    it takes (empty: none listed; the first tier is the default) and its relative cost tier
    (one of :data:`COST_TIERS`, "" when the provider reports none)."""

    id: str
    name: str = ""
    efforts: list[str] = []
    context_tiers: list[ContextTier] = []
    cost_tier: str = ""


# --------------------------------------------------------------------------- events


class _Event(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type"):
    #: durable events are journaled before they are published; the rest go live only
    durable: ClassVar[bool] = True


class ItemEvent(_Event, tag="item"):
    """Upserts a transcript item."""

    item: Item


class DeltaEvent(_Event, tag="delta", gc=False):
    """Streamed text for an item; live only, a snapshot rebuilds it. Untracked by the garbage
    collector, as :class:`Delta` (it holds one Delta: no reference cycle)."""

    durable: ClassVar[bool] = False
    delta: Delta


class TurnEvent(_Event, tag="turn"):
    turn: Turn


class InteractionEvent(_Event, tag="interaction"):
    """Upserts an interaction by id (pending, then answered/rejected/expired)."""

    interaction: Interaction


class AnswerEvent(_Event, tag="answer"):
    """The daemon's record of an answer given (by a person, or ``auto`` by yolo)."""

    answer: AnswerRecord


class ExitEvent(_Event, tag="exit"):
    """The runtime or the conversation became unusable; ``error`` says why."""

    error: str


class TitleEvent(_Event, tag="title"):
    title: str


class SubagentEvent(_Event, tag="subagent"):
    subagent: Subagent


class ContextEvent(_Event, tag="context"):
    durable: ClassVar[bool] = False
    context: Context


class UsageEvent(_Event, tag="usage"):
    usage: Usage


class TokensEvent(_Event, tag="tokens"):
    tokens: TokenUsage


class CompactionEvent(_Event, tag="compaction"):
    compacting: bool
    background: bool = False


class ActivityEvent(_Event, tag="activity"):
    durable: ClassVar[bool] = False
    activity: Activity


class TodosEvent(_Event, tag="todos"):
    durable: ClassVar[bool] = False
    todos: TodoList


class ModelSelectionEvent(_Event, tag="model_selection"):
    selection: ModelSelection


class Unknown(msgspec.Struct, frozen=True, omit_defaults=True):
    """A runtime event, update or item of a kind agentd does not know, kept verbatim.

    ``type`` is the runtime's own name for the kind; ``data`` its payload as plain
    JSON (odd bytes replaced, see agentd.runtime_output). Never dropped, never fatal.
    """

    provider: str
    type: str
    data: Any = None


class UnknownEvent(_Event, tag="unknown"):
    unknown: Unknown


class TurnDiff(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the runtime itself reports the running turn changed so far, as a unified diff it
    sends (Codex's ``turn/diff/updated``); each report replaces the one before. Kept beside
    agentd's own checkpoints (agentd.checkpoints), which ``agentctl diff`` shows."""

    diff: str


class TurnDiffEvent(_Event, tag="turn_diff"):
    turn_diff: TurnDiff


class ToolOutputEvent(_Event, tag="tool_output"):
    """The whole output of a tool item whose ``output`` is a display cut (``ToolCall.cut``).

    Emitted right before that item. The daemon keeps it beside the journal
    (agentd.tool_outputs), never in it; nobody is sent it live.
    """

    durable: ClassVar[bool] = False
    item_id: str
    output: str
    agent_id: str = ""


Event = Union[
    ItemEvent,
    DeltaEvent,
    TurnEvent,
    InteractionEvent,
    AnswerEvent,
    ExitEvent,
    TitleEvent,
    SubagentEvent,
    ContextEvent,
    UsageEvent,
    TokensEvent,
    CompactionEvent,
    ActivityEvent,
    TodosEvent,
    ModelSelectionEvent,
    UnknownEvent,
    ToolOutputEvent,
    TurnDiffEvent,
]
"""One adapter notification; the ``type`` tag names the kind and the one payload it carries."""


# --------------------------------------------------------------------------- provider protocols


class Prompt(msgspec.Struct, frozen=True, omit_defaults=True):
    """One user message as typed, plus attachments the daemon already checked."""

    text: str
    attachments: list[Attachment] = []


@runtime_checkable
class EventSink(Protocol):
    """Receives a conversation's events. ``emit`` never blocks and never raises.

    agentd's sinks also take ``runs_under(keepers)`` (a provider calls it through
    agentd.providers._common.runs_under, which leaves a sink without it alone): ``keepers``
    returns the pids of the keepers (agentd.procs) whose processes act for the conversation
    now. Only processes below them may call its host tools (agentd.agent_peers).
    """

    def emit(self, event: Event) -> None: ...


class McpServer(msgspec.Struct, frozen=True, omit_defaults=True):
    """One MCP server a conversation's runtime connects to (agentd.mcp builds them from the config).

    ``transport`` stdio: the runtime starts ``command`` ``args`` with ``env`` added to its own
    environment; http: it connects to ``url`` with ``headers``. ``env`` and ``headers`` may hold
    secrets: a provider hands them to its runtime only, never to a log line or an event.
    """

    name: str
    transport: Literal["stdio", "http"] = "stdio"
    command: str = ""
    args: list[str] = []
    env: dict[str, str] = {}
    url: str = ""
    headers: dict[str, str] = {}


class McpServerState(msgspec.Struct, frozen=True, omit_defaults=True):
    """One MCP server's state in a conversation as its runtime reports it.

    ``state``: connected, failed (``error`` says why), pending (still starting), disabled, or
    unknown (the runtime does not say). ``tools``: the tool names the server offers, as the
    runtime reports them; None when it does not say.
    """

    name: str
    state: Literal["connected", "failed", "pending", "disabled", "unknown"] = "unknown"
    error: str = ""
    tools: list[str] | None = None


class OpenRequest(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a provider needs to create (``conversation_id`` empty) or reopen a conversation.

    ``mcp_servers``: the MCP servers to hand the runtime (empty unless ``capabilities().mcp``);
    never journaled or logged, as they may carry secrets.
    """

    workdir: str
    conversation_id: str = ""
    title: str = ""
    model: str = ""
    effort: str = ""
    #: a context tier the model lists (``Model.context_tiers``); "" = the default
    context_tier: str = ""
    mcp_servers: list[McpServer] = []


class HistoryRecord(msgspec.Struct, omit_defaults=True):
    """A conversation's provider-recorded transcript, oldest first."""

    items: list[Item] = []
    subagents: list[Subagent] = []
    usage: Usage | None = None
    model: str = ""


class PreviousConversation(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str
    title: str = ""
    workdir: str = ""
    created_at: _dt.datetime | None = None
    updated_at: _dt.datetime | None = None


@runtime_checkable
class Conversation(Protocol):
    """One open provider conversation, owned by the daemon.

    Every method bounds only its own call: a turn goes on after ``send``
    returns. Methods raise :class:`Closed` after ``close`` or after the
    runtime exited.
    """

    @property
    def id(self) -> str:
        """The exact provider conversation id to persist."""
        ...

    async def send(self, prompt: Prompt) -> None:
        """Start a turn with ``prompt``; return once the provider accepted it.

        Raises :class:`Busy` if a turn runs (a provider never folds a prompt
        into a running turn), :class:`SubmissionUncertain` when the outcome
        is unknown (never resent), :class:`ConversationNotFound` when its
        restarted runtime no longer has the session, :class:`SessionUnreadable`
        when it answered the session's reload with an error (nothing was sent
        in either case).
        """
        ...

    async def steer(self, prompt: Prompt) -> None:
        """Add ``prompt`` to the running turn; :class:`Unsupported` if the provider cannot."""
        ...

    async def cancel(self) -> None:
        """Abort the running turn; the conversation stays open."""
        ...

    async def respond(self, interaction_id: str, answer: Answer) -> None:
        """Answer a pending interaction; :class:`InteractionGone` if it is not pending."""
        ...

    async def history(self) -> HistoryRecord:
        """The provider-recorded transcript; :class:`Unsupported` without history."""
        ...

    async def set_model(self, model: str, effort: str = "") -> None:
        """Apply a model from the next turn on; :class:`Unsupported` when impossible."""
        ...

    async def set_title(self, title: str) -> None:
        """Name the conversation in the provider's store; :class:`Unsupported` when impossible."""
        ...

    async def close(self) -> None:
        """Disconnect without deleting. Pending interactions end with no answer fabricated."""
        ...


@runtime_checkable
class Provider(Protocol):
    """Creates and reopens conversations on one provider runtime.

    The daemon runs :meth:`run` in its nursery for the provider's whole life;
    the provider starts its runtime lazily and owns every task it needs in
    that nursery. Cancelling :meth:`run` shuts the provider down: it stops
    the runtimes it started, never one it did not start.
    """

    name: str
    display_name: str

    def capabilities(self) -> Capabilities: ...

    async def run(self, *, task_status: Any = ...) -> None:
        """Serve until cancelled; ``task_status.started()`` once ready for ``open``."""
        ...

    async def check(self) -> None:
        """Raise :class:`RuntimeUnavailable` (text shown to the user) if the runtime is unusable."""
        ...

    async def models(self) -> list[Model]:
        """Selectable models; :class:`Unsupported` when only the default is offered."""
        ...

    async def open(self, request: OpenRequest, sink: EventSink) -> Conversation:
        """Create, or reopen exactly ``request.conversation_id``.

        Raises :class:`ConversationNotFound` when that id no longer exists,
        :class:`SessionUnreadable` when the runtime answered its reopen with an
        error; the provider never makes a replacement itself (agentd.lost_sessions decides).
        """
        ...


@runtime_checkable
class Forker(Protocol):
    """A provider whose ``capabilities().fork`` is True.

    ``fork`` makes a new runtime conversation holding ``source``'s history up to and
    including the turn that ended at ``marker`` (a terminal ``Turn.marker``), through the
    runtime's own fork; it sends no prompt. Returns the new conversation's id, which
    ``open`` then reopens. Raises ConversationNotFound (no ``source``), Invalid (the runtime
    has no such marker), Unsupported (this runtime cannot fork there), SubmissionUncertain
    when a fork may exist but its id was lost (never retried).
    """

    async def fork(self, source: str, marker: str, request: OpenRequest) -> str: ...


@runtime_checkable
class Rewinder(Protocol):
    """An open conversation whose provider's ``capabilities().rewind`` is True.

    ``rewind`` discards, in the runtime, every turn after the one that ended at ``marker``;
    the next prompt's model request holds the history up to that turn only. Idle only
    (Busy while a turn runs). Raises Invalid for a marker the runtime does not hold,
    SubmissionUncertain when the rewind may or may not have happened (never retried).
    """

    async def rewind(self, marker: str) -> None: ...


@runtime_checkable
class Importer(Protocol):
    """A provider whose ``capabilities().import_`` is True: it lists the runtime's own earlier
    sessions and its ``open`` resumes one of them by id (agentd.adopt).

    Optionally it also has ``in_use(ids) -> set[str]``: the ids among ``ids`` that another
    process holds open right now (a snapshot; the provider's own runtime is never reported).
    A provider without it cannot tell (``in_use: unknown``).
    """

    async def previous(self, workdir: str) -> list[PreviousConversation]:
        """The sessions recorded with exactly ``workdir`` as their working directory, newest first."""
        ...


@runtime_checkable
class McpStatusReader(Protocol):
    """A conversation whose runtime reports its MCP servers' states."""

    async def mcp_status(self) -> list[McpServerState]:
        """Each MCP server of the conversation as the runtime sees it now; raises Closed."""
        ...


class Account(msgspec.Struct, frozen=True, omit_defaults=True):
    """A runtime's sign-in; never carries a credential.

    ``source`` says where the credential comes from: ``stored`` (a sign-in the runtime
    keeps), ``env`` (a token in the environment variable ``env_var``), ``gh-cli`` (the
    GitHub CLI's sign-in), ``api_key`` (an API key in ``env_var``), ``byok`` (a model
    provider of the user's own, key in ``env_var``), or another name the runtime reports;
    "" while signed out.
    """

    signed_in: bool
    login: str = ""
    source: str = ""
    env_var: str = ""
    message: str = ""
    host: str = ""


@runtime_checkable
class AccountReader(Protocol):
    """A provider whose ``capabilities().account`` is True."""

    async def account(self) -> Account: ...


# --------------------------------------------------------------------------- commands


CommandKind = Literal["skill", "command"]


class Command(msgspec.Struct, frozen=True, omit_defaults=True):
    """One slash command a runtime offers that becomes a prompt: a skill or a prompt command.

    ``name`` has no leading slash; ``input_hint`` says what its arguments are ("" = none
    described). Runtime commands that act locally (clear, model, config ...) are never listed.
    """

    name: str
    kind: CommandKind = "command"
    description: str = ""
    input_hint: str = ""


@runtime_checkable
class CommandRunner(Protocol):
    """A conversation whose provider's ``capabilities().commands`` is True."""

    async def commands(self) -> list[Command]:
        """The commands offered now, in the runtime's order. Sends no prompt."""
        ...

    async def run_command(self, name: str, args: Prompt) -> None:
        """Run command ``name`` (one :meth:`commands` lists) with ``args.text`` as its arguments.

        Starts a turn like ``Conversation.send``, with its outcomes (Busy,
        SubmissionUncertain, ...); the runtime's record of the user message shows
        ``/name args``. A command whose result would not start a prompt turn is Invalid.
        """
        ...


class Quota(msgspec.Struct, frozen=True, omit_defaults=True):
    """One account quota as the runtime reported it (Copilot's ``premium_interactions``, a
    rate-limit window). ``used`` / ``entitlement`` count ``unit`` (``requests``,
    ``ai_credits``, ``percent``; "" = not said); ``entitlement`` 0 with ``unlimited``;
    ``remaining_percent`` None when not said; ``reset_at`` RFC 3339, "" when not said."""

    type: str
    used: float = 0
    entitlement: float = 0
    unlimited: bool = False
    remaining_percent: float | None = None
    overage: float = 0
    reset_at: str = ""
    unit: str = ""
    plan: str = ""


@runtime_checkable
class QuotaReporter(Protocol):
    """A provider whose ``capabilities().quota`` is True."""

    async def quota(self) -> list[Quota]:
        """The signed-in account's quotas, sorted by type. Raises RuntimeUnavailable."""
        ...


class DeviceCode(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a person enters at ``url`` to approve a device sign-in."""

    url: str
    code: str
    notice: str = ""


@runtime_checkable
class SignInManager(Protocol):
    """A provider whose ``capabilities().sign_in`` is True. A change applies to the whole runtime."""

    async def sign_in(self, token: str) -> Account:
        """Validate and store ``token`` (never logged or kept by agentd). Raises Invalid when refused."""
        ...


@runtime_checkable
class SubagentController(Protocol):
    """A conversation whose provider can stop (``cancel_subagent``) or prompt (``prompt_subagent``) one subagent."""

    async def cancel_subagent(self, agent_id: str) -> None:
        """Stop only ``agent_id``; its end comes as a SubagentEvent. Raises NotFound, Unsupported."""
        ...

    async def prompt_subagent(self, agent_id: str, text: str) -> None:
        """Send ``text`` to idle ``agent_id``; returns once the runtime took it. Raises Invalid,
        SubmissionUncertain (never resent), Unsupported."""
        ...


@runtime_checkable
class SignOutManager(Protocol):
    """A provider whose ``capabilities().sign_out`` is True."""

    async def sign_out(self) -> Account:
        """Remove the stored sign-in. Raises Invalid while a token in the environment takes precedence."""
        ...


@runtime_checkable
class DeviceSignInManager(Protocol):
    """A provider whose ``capabilities().device_sign_in`` is True."""

    async def device_sign_in(self, show: Any, *, store_plaintext: bool = False) -> Account:
        """Start the device flow, call ``show(DeviceCode)`` (synchronously, never blocking) once the
        code is known, and return once the sign-in is approved and in effect. ``store_plaintext``:
        the person agreed that the runtime keep the token in a plain file when it has no keychain.
        Cancelling the call cancels the flow. Raises Invalid when refused or expired, RuntimeUnavailable."""
        ...
