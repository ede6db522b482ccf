"""The control protocol: frames between agentd and its clients, and their codec.

Transport-neutral (the same frames go over the Unix socket and the WebSocket
gateway) and import-light: this module imports neither trio nor structlog,
because every ``agentctl`` call pays for what it imports.

Framing: one JSON object per line (``\\n``-terminated, UTF-8). Both sides send
``hello`` first. A client request carries ``id`` and ``op``; the daemon answers
with a ``result`` or ``error`` frame carrying the same ``id``. Subscriptions
push ``event``, ``snapshot`` and ``lagged`` frames tagged with the
subscription's id (the ``id`` of the ``subscribe`` request).
"""

from __future__ import annotations

import enum
import functools
from typing import Annotated, Any, Literal, Union

import msgspec

from .contract import (
    ERRORS_BY_CODE,
    MAX_JSON_NESTING,
    nested_deeper_than,
    Activity,
    Attachment,
    AgentdError,
    Answer,
    LimitExceeded,
    AnswerRecord,
    Capabilities,
    Command,
    Context,
    Interaction,
    Item,
    Model,
    Account,
    DeviceCode,
    Quota,
    Subagent,
    TodoList,
    TokenUsage,
    Turn,
    TurnDiff,
    Unknown,
    Usage,
    ModelSelection,
    Delta,
    McpServerState,
)

#: Bumped on any incompatible change to the frames below.
PROTOCOL_VERSION = 1
#: Default limit of one incoming frame, bytes (``server.max_frame_bytes`` in config): room for
#: a prompt with a 10 MiB attachment (``[attachments] max_bytes``), base64-encoded.
DEFAULT_MAX_FRAME_BYTES = 16 << 20
#: What a client accepts from the daemon; journal records can be large.
CLIENT_MAX_FRAME_BYTES = 64 << 20


class ConversationState(str, enum.Enum):
    IDLE = "idle"
    RUNNING = "running"
    #: a turn waits for a person to answer an interaction
    REQUIRES_ACTION = "requires_action"
    BUDGET_PAUSED = "budget_paused"
    CLOSED = "closed"
    ERROR = "error"


IfBusy = Literal["reject", "queue", "steer", "interrupt"]
Mode = Literal["interactive", "yolo"]
#: What a conversation does when its spend reaches its budget: pause (wait for a raise and
#: ``continue``) or stop (close it).
OnReach = Literal["pause", "stop"]
NonNegUsd = Annotated[float, msgspec.Meta(ge=0)]


class Budget(msgspec.Struct, frozen=True, omit_defaults=True):
    """A conversation's spend limit in USD; ``max_cost_usd`` None = no limit."""

    max_cost_usd: NonNegUsd | None = None
    on_reach: OnReach = "pause"


class Upload(msgspec.Struct, frozen=True, omit_defaults=True):
    """A file sent with a prompt: its name (a plain file name) and its bytes, base64-encoded.

    The daemon decides the MIME type from the content and the name; it
    stores the file under the conversation and passes it to the provider.
    """

    name: str
    data: str


# --------------------------------------------------------------------------- requests


class _Request(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="op", forbid_unknown_fields=True):
    id: int


class Hello(_Request, tag="hello"):
    protocol: int
    client: str = ""


class Status(_Request, tag="status"):
    pass


class Hosts(_Request, tag="hosts"):
    """The agentd hosts sharing this store (``[store] backend = "postgres"``; agentd.hosts)."""


class Providers(_Request, tag="providers"):
    #: "" = every provider; else only this one
    provider: str = ""


class Models(_Request, tag="models"):
    provider: str


class New(_Request, tag="new"):
    #: "" = the config's ``[providers] default``
    provider: str = ""
    #: required (an existing absolute directory); a default only so that provider may have one
    workdir: str = ""
    title: str = ""
    model: str = ""
    #: an effort level the model lists ("" = the runtime's default)
    effort: str = ""
    #: a context tier the model lists ("" = the default)
    context_tier: str = ""
    mode: Mode = "interactive"
    #: None = the provider's default budget from the config ([budgets.<provider>]), if any
    budget: Budget | None = None
    #: MCP servers by name ([mcp.servers.<name>]); None = the provider's defaults, [] = none (agentd.mcp)
    mcp: list[str] | None = None


class List(_Request, tag="ls"):
    #: include closed conversations
    all: bool = False


class Show(_Request, tag="show"):
    """Conversation ids accept a unique prefix in every request."""

    conversation: str


class Send(_Request, tag="send"):
    conversation: str
    text: str
    #: what to do when a turn is already running
    if_busy: IfBusy = "reject"
    #: files sent with the prompt (``[attachments]`` limits apply)
    attachments: list[Upload] = []


class Steer(_Request, tag="steer"):
    conversation: str
    text: str


class Cancel(_Request, tag="cancel"):
    conversation: str


class AnswerInteraction(_Request, tag="answer"):
    conversation: str
    interaction: str
    answer: Answer


class Close(_Request, tag="close"):
    conversation: str


class Remove(_Request, tag="rm"):
    """Answers ``{"conversation": <full id>}``; a running turn is refused ``busy`` unless ``force``."""

    conversation: str
    #: cancel a running turn and remove all the same
    force: bool = False


class SetTitle(_Request, tag="title"):
    conversation: str
    title: str


class Subscribe(_Request, tag="subscribe"):
    """Stream journal records after ``after``, then live ones, then a snapshot.

    ``conversation`` None subscribes to every conversation, live only
    (``after`` is ignored). Records arrive with no gap and no duplicate;
    a subscriber that falls behind gets ``lagged`` and resubscribes.
    """

    conversation: str | None = None
    after: int = 0
    #: send a snapshot of the in-flight turn once caught up
    snapshot: bool = True
    #: also replay the records of turns a rewind dropped (each marked ``dropped``)
    all: bool = False


class Unsubscribe(_Request, tag="unsubscribe"):
    subscription: int


class TaskStatus(str, enum.Enum):
    """Where a task is. ``completed``, ``failed`` and ``cancelled`` are final."""

    #: queued behind the provider's concurrency limit
    PENDING = "pending"
    RUNNING = "running"
    #: its turn waits for an answer to an interaction (``agentctl answer`` on its conversation)
    WAITING_FOR_INPUT = "waiting_for_input"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED)


class TaskCreate(_Request, tag="task_create"):
    """Queue a non-interactive job; it runs in a new conversation of its own."""

    #: "" = the config's ``[providers] default``
    provider: str = ""
    workdir: str = ""
    input: str = ""
    model: str = ""
    #: http(s) URL POSTed a JSON summary when the task ends; "" = none
    callback: str = ""
    #: yolo = its permission requests are answered allow-once, so it runs unattended
    mode: Mode = "interactive"
    #: its conversation's budget; None = the provider's default from the config, if any
    budget: Budget | None = None


class TaskList(_Request, tag="task_ls"):
    """A page of the tasks, oldest first: at most ``limit`` and 16 MiB of them (one at least);
    the result's ``next`` is the ``after`` of the next page."""

    #: only tasks in these statuses; empty = every task
    status: list[TaskStatus] = []
    #: the id of the last task of the page before ("" = from the first)
    after: str = ""
    limit: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 1000


class TaskShow(_Request, tag="task_show"):
    """Task ids accept a unique prefix in every request."""

    task: str


class TaskCancel(_Request, tag="task_cancel"):
    task: str


class TaskAddComment(_Request, tag="task_comment"):
    task: str
    text: str


class SetBudget(_Request, tag="budget"):
    """Set (raise, lower or remove) a conversation's budget; an explicit, journaled change.

    A paused conversation stays paused until ``continue``.
    """

    conversation: str
    budget: Budget


class Continue(_Request, tag="continue"):
    """Resume a conversation paused on its budget (``budget_paused`` -> ``idle``) once it is under it."""

    conversation: str


class Export(_Request, tag="export"):
    """The conversation's transcript from its journal, rendered as ``md``, ``json`` or ``html``."""

    conversation: str
    format: Literal["md", "json", "html"] = "md"
    #: add tool calls and output, permission requests, reasoning and subagents' items
    include_tools: bool = False
    #: also the turns a rewind dropped (marked as dropped)
    all: bool = False


class SetModel(_Request, tag="set_model"):
    """Choose the model / effort of a conversation's next turns (agentd.models); during a turn
    it is refused ``busy`` unless ``after_turn`` queues it."""

    conversation: str
    model: str = ""
    effort: str = ""
    after_turn: bool = False
    context_tier: str = ""


class History(_Request, tag="history"):
    """A page of a conversation's items from its journal (agentd.history): the newest ``limit``,
    or those below ``before`` / above ``after`` (journal seqs; at most one of the two)."""

    conversation: str
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 50
    #: the newest ``limit`` items with seq < before
    before: Annotated[int, msgspec.Meta(ge=1)] | None = None
    #: the oldest ``limit`` items with seq > after (0: from the first)
    after: Annotated[int, msgspec.Meta(ge=0)] | None = None
    #: also the turns a rewind dropped (marked ``dropped``)
    all: bool = False

# ---- forkrewind


class Fork(_Request, tag="fork"):
    """Branch a new conversation off ``conversation`` at turn ``at`` (agentd.branching).

    The new one holds the history up to and including that turn, on the same provider,
    made by the runtime's own fork; no prompt is sent again.
    """

    conversation: str
    #: the run to fork at, "" = the last completed turn
    at: str = ""
    title: str = ""


class Rewind(_Request, tag="rewind"):
    """Discard the turns of ``conversation`` after run ``to``, in the runtime and in agentd's view
    (agentd.branching); refused ``busy`` while a turn runs. ``preview`` changes nothing."""

    conversation: str
    to: str
    preview: bool = False


# ---- checkpoints


class Diff(_Request, tag="diff"):
    """What one step of a conversation changed in its working directory (agentd.checkpoints):
    a turn (its run id) or a revert (its id); "" = the last step. ``stat``: files and line
    counts only, no hunks and no patch."""

    conversation: str
    run: str = ""
    stat: bool = False


class Revert(_Request, tag="revert"):
    """Restore the files step ``run`` changed to how they were before it (agentd.checkpoints);
    ``dry_run`` says what would change and changes nothing. Refused ``busy`` while a turn runs."""

    conversation: str
    run: str
    dry_run: bool = False


class ShowItem(_Request, tag="show_item"):
    """One item of a conversation as last journaled, with a page of its whole tool output when kept.

    ``offset`` is a byte offset into the kept output (``ItemInfo.next_offset`` of the page before).
    """

    conversation: str
    item: str
    agent_id: str = ""
    offset: Annotated[int, msgspec.Meta(ge=0)] = 0


class Shutdown(_Request, tag="shutdown"):
    """Stop the daemon gracefully, exactly as SIGTERM does, after answering ``ShutdownResult``.

    Turns running then are cut and recorded ``run_interrupted`` by the next
    start (the prompt is never resent); tasks likewise. Accepted only on the
    Unix socket from the daemon's own uid: refused ``unauthorized`` through
    the WebSocket gateway.
    """

    #: the pid of the agentd to stop, as its ``hello`` frame and ``status`` give it; a shutdown
    #: naming another pid (a daemon since restarted, e.g. by socket activation) is refused ``invalid``
    pid: Annotated[int, msgspec.Meta(gt=0)]


# ---- import


class ImportList(_Request, tag="import_list"):
    """The sessions ``provider``'s runtime recorded for ``workdir`` before or outside agentd
    (agentd.adopt), newest first; ``unsupported`` where the runtime cannot list and resume them."""

    provider: str
    #: an absolute directory (agentctl sends its working directory)
    workdir: str


class ImportSession(_Request, tag="import_session"):
    """Adopt runtime session ``session``: a new conversation bound to exactly it (agentd.adopt).
    A session another client holds open is refused ``busy`` unless ``force``; one that is gone is
    ``not_found`` (nothing is created, nothing is sent)."""

    provider: str
    session: str
    #: the folder the session is listed under (``import_list``); an absolute directory
    workdir: str
    force: bool = False


#: whether another client holds a session open: true, false, or "unknown" (the runtime cannot tell)
InUse = Union[bool, Literal["unknown"]]


class ImportCandidate(msgspec.Struct, frozen=True, omit_defaults=True):
    """One runtime session ``import_list`` offers. ``title`` is untrusted runtime text; times are
    UTC RFC 3339 ("" when the runtime does not say)."""

    id: str
    in_use: InUse
    title: str = ""
    workdir: str = ""
    created_at: str = ""
    updated_at: str = ""


class ImportListResult(msgspec.Struct, frozen=True, omit_defaults=True):
    provider: str
    workdir: str
    sessions: list[ImportCandidate] = []
    #: how ``in_use`` was found out for this runtime
    in_use_check: str = ""


class ImportRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """An ``import`` record: the conversation adopts runtime session ``session``. The ``items``
    earlier turns follow it as ``item`` records outside any run, their ids ``import.<runtime id>``."""

    provider: str
    session: str
    in_use: InUse
    items: int = 0
    #: the runtime gave the session's earlier turns (False: it resumes them but cannot show them)
    history: bool = True
    #: adopted with --force although another client held it
    forced: bool = False
    title: str = ""


class ImportResult(msgspec.Struct, omit_defaults=True):
    """``import_session``: the new conversation and what was journaled of the session's past."""

    conversation: ConversationRecord
    session: str
    in_use: InUse
    items: int = 0
    history: bool = True


# ---- cli


class Restart(_Request, tag="restart"):
    """Re-read agentd.toml and the environment file, re-check providers, and have runtimes started
    from then on use them (agentd.reload); connections, conversations and the journal stay.

    Waits until no turn runs (turns started meanwhile are waited for too), unless ``now``, which
    cancels the running ones first. A config that does not load is refused ``invalid`` (the
    message is its error) and the config in force stays.
    """

    now: bool = False


class RestartResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a restart did."""

    pid: int
    #: the config file read ("" = none: every key at its default)
    config: str = ""
    #: the environment file read ("" = none)
    env_file: str = ""
    #: names (never values) of the variables it set or changed
    env_changed: list[str] = []
    #: runs cancelled (``now``) and conversations whose provider conversation was closed to reopen
    cancelled: list[str] = []
    reopened: int = 0
    #: seconds spent waiting for running turns to end
    waited_s: float = 0.0
    providers: list["ProviderInfo"] = []
    #: sections of agentd.toml that changed but apply only after a stop and a start (they run as before)
    need_stop: list[str] = []


# ---- commands


class ListCommands(_Request, tag="commands"):
    """The slash commands and skills the conversation's runtime offers (opens it on its runtime)."""

    conversation: str


# ---- mcp


class McpList(_Request, tag="mcp_ls"):
    """The configured MCP servers (agentd.mcp), without a secret."""


class McpStatus(_Request, tag="mcp_status"):
    """Each MCP server of a conversation as its runtime reports it; opens the conversation."""

    conversation: str


class RunCommand(_Request, tag="command"):
    """Run one offered command as a turn: the same as ``send`` of ``/name args``."""

    conversation: str
    name: str
    args: str = ""
    if_busy: IfBusy = "reject"


class ListSubagents(_Request, tag="subagents"):
    """The conversation's subagents with their latest status, from its journal."""

    conversation: str


class CancelSubagent(_Request, tag="subagent_cancel"):
    """Stop exactly one subagent instance; its parent and siblings go on."""

    conversation: str
    agent: str


class PromptSubagent(_Request, tag="subagent_prompt"):
    """Send text to one idle subagent instance; not a turn of the conversation."""

    conversation: str
    agent: str
    text: str


class CommandList(msgspec.Struct, frozen=True, omit_defaults=True):
    conversation: str
    provider: str
    commands: list[Command] = []


class SubagentList(msgspec.Struct, frozen=True, omit_defaults=True):
    conversation: str
    subagents: list[Subagent] = []


# ---- accounts
# Account, sign-in and quota of each provider's runtime (agentd.accounts).

#: A provider's state for ``providers``: available = a turn can run now (installed, and signed in or
#: a key present); needs_sign_in; not_installed; misconfigured (the config or environment is wrong).
ProviderState = Literal["available", "needs_sign_in", "not_installed", "misconfigured"]


class AccountRequest(_Request, tag="account"):
    """The sign-in of ``provider`` ("" = every provider that reports one): ``list[AccountInfo]``."""

    provider: str = ""


class Login(_Request, tag="login"):
    """Sign ``provider``'s runtime in: with ``token`` (handed to the runtime, never kept or logged),
    with the device flow (``device``: answers ``LoginResult`` with the code and a ``flow`` to wait on
    with ``login_wait``), or, where agentd cannot do it, the answer names the command to run."""

    provider: str
    device: bool = False
    token: str = ""
    #: the person agrees that the runtime keep the token in a plain file when it has no keychain
    store_plaintext: bool = False


class LoginWait(_Request, tag="login_wait"):
    """Wait until the device flow ``flow`` ends: ``LoginResult`` (``done``). Closing the connection
    (Ctrl-C) or ``timeout_s`` cancels the flow."""

    flow: str
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 900.0


class Logout(_Request, tag="logout"):
    """Remove the runtime's stored sign-in: ``LoginResult``."""

    provider: str


class QuotaRequest(_Request, tag="quota"):
    """The account quota of ``provider`` ("" = every provider that reports one): ``list[QuotaInfo]``."""

    provider: str = ""


class AccountInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    """One provider's sign-in (never a credential) and, when signed out, the command that signs it in."""

    provider: str
    account: Account
    fix: str = ""


class LoginResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """``login`` / ``login_wait`` / ``logout``. ``done``: the account after it. Else ``device``
    holds the code to enter (wait on ``flow``), or ``command`` the exact command a person runs."""

    provider: str
    done: bool = False
    account: Account | None = None
    device: DeviceCode | None = None
    flow: str = ""
    command: str = ""
    message: str = ""


class QuotaInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    """One provider's quotas as its runtime last reported them; ``error`` when it could not say."""

    provider: str
    quotas: list[Quota] = []
    #: where the figures come from: "account" (the runtime, asked now)
    source: str = ""
    #: when they were asked for (UTC, RFC 3339)
    at: str = ""
    error: str = ""


class McpServerInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    """One ``[mcp.servers.<name>]``: ``env`` and ``headers`` are the names only, never values."""

    name: str
    transport: Literal["stdio", "http"]
    command: str = ""
    args: list[str] = []
    url: str = ""
    env: list[str] = []
    headers: list[str] = []
    #: the daemon's providers whose new conversations get it by default
    default_for: list[str] = []


class McpListResult(msgspec.Struct, frozen=True, omit_defaults=True):
    servers: list[McpServerInfo] = []
    host_tool_timeout_s: float = 0.0


class McpStatusResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """``reported`` false: the runtime does not report its servers, each is ``unknown``."""

    conversation: str
    provider: str
    servers: list[McpServerState] = []
    reported: bool = False


# ---- host tools (agentd.host_tools)


#: the longest description of a host tool, in characters (agentd.host_tools bounds the rest)
MAX_TOOL_DESCRIPTION_CHARS = 8192


class RegisterTool(_Request, tag="register_tool"):
    """Offer a tool to conversation ``conversation``'s agent; this connection serves its calls
    (``next_tool_call`` / ``tool_result``). Registering a name again takes it over."""

    conversation: str
    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,47}$")]
    description: Annotated[str, msgspec.Meta(max_length=MAX_TOOL_DESCRIPTION_CHARS)] = ""
    #: JSON Schema of the call's arguments (an object schema); None = any object
    input_schema: dict[str, Any] | None = None


class UnregisterTool(_Request, tag="unregister_tool"):
    conversation: str
    name: str


class NextToolCall(_Request, tag="next_tool_call"):
    """Wait (at most ``wait_s`` seconds) for the next call of a tool this connection registered;
    the result is a ``HostToolCallInfo``, or null when none came. Answer it with ``tool_result``."""

    conversation: str
    name: str
    wait_s: Annotated[float, msgspec.Meta(ge=0, le=300)] = 30.0


class ToolResult(_Request, tag="tool_result"):
    """The result of call ``call_id``: ``output`` is what the agent gets; ``error`` marks it failed."""

    conversation: str
    call_id: str
    output: str = ""
    error: bool = False


class ListHostTools(_Request, tag="list_host_tools"):
    """The conversation's host tools; with ``after`` = the version last seen, waits (at most
    ``wait_s``) for a change first. agentd's MCP relay uses it."""

    conversation: str
    after: int = -1
    wait_s: Annotated[float, msgspec.Meta(ge=0, le=300)] = 0.0
    #: the runtime is listing them now (agentd's relay answering tools/list)
    listing: bool = False


class CallHostTool(_Request, tag="call_host_tool"):
    """Call a host tool as the agent does (agentd's MCP relay uses it); answers when the serving
    client answered, or fails after ``[mcp] host_tool_timeout_s`` without one."""

    conversation: str
    name: str
    arguments: dict[str, Any] = {}


class HostToolInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    description: str = ""
    input_schema: dict[str, Any] | None = None
    #: a client serves it now (its registering connection is open)
    served: bool = False


class HostToolList(msgspec.Struct, frozen=True, omit_defaults=True):
    conversation: str
    version: int = 0
    tools: list[HostToolInfo] = []


class HostToolCallInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    """One call for the serving client: ``arguments`` as the agent gave them."""

    conversation: str
    call_id: str
    name: str
    arguments: dict[str, Any] = {}


class HostToolCallResult(msgspec.Struct, frozen=True, omit_defaults=True):
    output: str = ""
    error: bool = False


Request = Union[
    Hello,
    Status,
    Hosts,
    Providers,
    Models,
    New,
    List,
    Show,
    Send,
    Steer,
    Cancel,
    AnswerInteraction,
    Close,
    Remove,
    SetTitle,
    Subscribe,
    Unsubscribe,
    SetBudget,
    Continue,
    Export,
    History,
    SetModel,
    ImportList,
    ImportSession,
    Restart,
    Fork,
    Rewind,
    ListCommands,
    RunCommand,
    ListSubagents,
    CancelSubagent,
    PromptSubagent,
    AccountRequest,
    Login,
    LoginWait,
    Logout,
    QuotaRequest,
    Diff,
    Revert,
    McpList,
    McpStatus,
    RegisterTool,
    UnregisterTool,
    NextToolCall,
    ToolResult,
    ListHostTools,
    CallHostTool,

    ShowItem,
    Shutdown,
    TaskCreate,
    TaskList,
    TaskShow,
    TaskCancel,
    TaskAddComment,
]

OPS: frozenset[str] = frozenset(t.__struct_config__.tag for t in Request.__args__)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- results


class ProviderInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str
    display_name: str
    capabilities: Capabilities
    available: bool = True
    #: why the provider is not available
    error: str = ""
    #: available (a turn can run now), needs_sign_in, not_installed, misconfigured (agentd.accounts)
    state: ProviderState = "available"
    #: the exact command that fixes ``state`` ("" when available)
    fix: str = ""
    #: its sign-in, when it reports one (never a credential)
    account: Account | None = None


class StatusResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """``conversations``: the open ones (as ``ls`` lists them), ``running`` of them with a turn
    in flight; ``closed``: those ``ls --all`` adds."""

    version: str
    protocol: int
    pid: int
    uptime_s: float
    state_dir: str
    socket: str
    conversations: int
    running: int
    providers: list[str]
    closed: int = 0


class HostInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    """One agentd instance registered in the shared store (its heartbeat row).

    ``alive``: its heartbeat had not expired when read (database clock). ``leases``: the
    conversations it holds open now. ``this``: the agentd that answered.
    """

    owner: str
    hostname: str
    pid: int
    site: str
    started_at: str
    alive: bool
    providers: list[str] = []
    leases: int = 0
    this: bool = False


class HostsResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """``hosts``: every agentd instance of the shared store, alive or not, by hostname then start."""

    hosts: list[HostInfo]


class ShutdownResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """``shutdown``: the daemon took the request and is stopping; its socket closes, then it exits."""

    pid: int


class ModelChoice(msgspec.Struct, frozen=True, omit_defaults=True):
    """A model and effort level asked for with ``set-model`` (agentd.models)."""

    model: str = ""
    effort: str = ""
    context_tier: str = ""


class ConversationRecord(msgspec.Struct, omit_defaults=True):
    """A conversation as the daemon keeps it on disk (``record.json``)."""

    id: str
    provider: str
    workdir: str
    created_at: str
    updated_at: str
    title: str = ""
    model: str = ""
    #: the effort level asked for ("" = the runtime's default)
    effort: str = ""
    #: the context tier asked for ("" = the model's default)
    context_tier: str = ""
    #: a set-model queued behind the running turn (``--after-turn``), applied before the next prompt
    next_model: ModelChoice | None = None
    mode: Mode = "interactive"
    state: ConversationState = ConversationState.IDLE
    #: the provider's own conversation id, once opened
    provider_conversation_id: str = ""
    #: the turn in flight, "" when none; set before a prompt reaches the provider
    active_run: str = ""
    #: runs of prompts queued behind it (journaled, not yet sent), oldest first
    queued: list[str] = []
    #: the journal seq just before the current turn's prompt (as of the last turn's end when
    #: idle): subscribing after it replays the turn in flight, or the one that ended last
    turn_after: int = 0
    error: str = ""
    #: who titled it: user (new --title, agentctl title), prompt (made from the first prompt),
    #: provider (its own); a provider's title never replaces a user's
    title_source: Literal["", "user", "prompt", "provider"] = ""
    #: the running total of what the conversation consumed (see agentd.usage)
    usage: Usage | None = None
    #: its spend limit; None = none
    budget: Budget | None = None
    #: the journal this record reflects: its size in bytes and last seq when the record was
    #: saved (-1: unknown, a record older than this field). The journal is the source of truth:
    #: recovery reads what it holds past them (a turn's start is its prompt record; see
    #: agentd.conversations).
    journal_end: int = -1
    journal_seq: int = 0
    #: runs a rewind discarded (agentd.branching): left out of history, tail, attach and export
    dropped: list[str] = []
    #: the conversation and run it was forked from ("" = not a fork)
    forked_from: str = ""
    forked_at: str = ""
    #: its MCP servers by name, chosen at creation; None = the provider's defaults of the day (agentd.mcp)
    mcp: list[str] | None = None
    #: on a store shared by several hosts: the agentd site (``<hostname>:<state dir>``) that runs it,
    #: where its runtime keeps its session state (agentd.hosts); "" on the file store
    site: str = ""


class ConversationInfo(msgspec.Struct, omit_defaults=True):
    """``show``: the record, its live state and pending interactions."""

    record: ConversationRecord
    #: the journal's last seq (0 when the conversation is not loaded yet)
    last_seq: int = 0
    pending: list[Interaction] = []
    queued: int = 0
    usage: Usage | None = None


class ItemInfo(msgspec.Struct, omit_defaults=True):
    """``show_item``: the item; when its tool output was cut (``tool.cut``) and the whole is kept,
    ``kept`` with a page of it from the request's offset (``next_offset`` 0: the last page)."""

    conversation: str
    item: Item
    kept: bool = False
    full_output: str = ""
    #: size of the whole kept output in UTF-8 bytes
    full_bytes: int = 0
    next_offset: int = 0


class SendResult(msgspec.Struct, frozen=True, omit_defaults=True):
    #: the turn started (or to be started) by this prompt
    run: str
    #: how the prompt was taken: started, queued, steered, or interrupted (then started)
    disposition: Literal["started", "queued", "steered", "interrupted"] = "started"
    #: the journal seq just before the prompt; subscribe after it to follow the turn
    after: int = 0


class CancelResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """What ``cancel`` did: the run it cancelled ("" when no turn ran) and how that turn ended.

    ``reason`` ``cancel_timeout`` (with ``inferred``) means the runtime did not confirm the
    cancel within ``[runtimes] cancel_timeout_s``: agentd ended the turn itself. ``state`` is
    "" when the turn had not ended yet when the answer was sent (it ends on its own later).
    """

    run: str = ""
    state: str = ""
    reason: str = ""
    error: str = ""
    inferred: bool = False


class SubscribeResult(msgspec.Struct, frozen=True, omit_defaults=True):
    subscription: int
    #: the journal's last seq when the subscription started
    last_seq: int = 0


class TaskUsage(msgspec.Struct):
    """What a task's turn consumed (every field always encoded: it goes into callback bodies).

    Tokens are the daemon's totals for the task's conversation, else the sum of
    the turn's per-call reports; cost and AI units are the running totals.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    #: cache reads, part of input_tokens
    cached_tokens: int = 0
    #: the provider's cost report, else the sum of its per-call costs; None when it reports none
    cost_usd: float | None = None
    #: the provider's own units (Copilot AI units)
    ai_units: float = 0.0
    #: cost_usd includes prices from agentd's pricing table, not only the provider's figures
    estimated: bool = False


class TaskComment(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str
    text: str
    created_at: str
    #: steered = also added to the task's running turn; recorded = kept on the task only
    delivery: Literal["steered", "recorded"] = "recorded"
    #: why it was only recorded
    note: str = ""


class CallbackAttempt(msgspec.Struct, frozen=True, omit_defaults=True):
    """One POST of a task's result to its callback URL."""

    attempt: int
    at: str
    #: the terminal status it reported
    status: TaskStatus
    #: the HTTP status code, 0 when no response came
    status_code: int = 0
    #: why it did not succeed ("" when it did)
    error: str = ""
    ok: bool = False


class TaskRecord(msgspec.Struct, omit_defaults=True):
    """A task as the daemon keeps it on disk (``<state_dir>/tasks/<id>.json``)."""

    id: str
    provider: str
    workdir: str
    input: str
    created_at: str
    updated_at: str
    status: TaskStatus = TaskStatus.PENDING
    model: str = ""
    callback: str = ""
    #: its conversation's mode: yolo answers its permission requests allow-once
    mode: Mode = "interactive"
    #: its conversation's budget (None: the provider's default from the config, if any)
    budget: Budget | None = None
    #: the conversation it runs in, once started
    conversation: str = ""
    #: its turn in that conversation
    run: str = ""
    started_at: str = ""
    ended_at: str = ""
    #: the last assistant message of its turn
    result: str = ""
    error: str = ""
    #: short code for how it ended: the turn's reason, run_interrupted, create_failed, ...
    reason: str = ""
    usage: TaskUsage | None = None
    comments: list[TaskComment] = []
    #: pending = being delivered (retrying); delivered; failed = gave up after the retry window
    callback_state: Literal["", "pending", "delivered", "failed"] = ""
    callback_attempts: list[CallbackAttempt] = []


class TaskInfo(msgspec.Struct, omit_defaults=True):
    """``task_show``: the record, and the interactions its turn waits for."""

    task: TaskRecord
    pending: list[Interaction] = []


class TaskListResult(msgspec.Struct, omit_defaults=True):
    tasks: list[TaskRecord] = []
    #: the next page's ``after`` ("" = this page is the last)
    next: str = ""


class TaskCancelResult(msgspec.Struct, omit_defaults=True):
    task: TaskRecord
    #: dequeued = it was pending and never runs; cancelled = its turn was cancelled and ended;
    #: cancelling = its turn was asked to stop and has not ended yet; ended = it ended otherwise
    #: (completed or failed) before the cancel took effect
    disposition: Literal["dequeued", "cancelled", "cancelling", "ended"] = "cancelled"


class TaskCommentResult(msgspec.Struct, frozen=True, omit_defaults=True):
    task: str
    comment: TaskComment


class TaskCallback(msgspec.Struct, frozen=True):
    """The JSON body POSTed to a task's callback URL (every field present)."""

    task: str
    status: TaskStatus
    result: str
    conversation: str
    usage: TaskUsage | None
    error: str
    reason: str
    created_at: str
    ended_at: str


# --------------------------------------------------------------------------- journal records


class Record(msgspec.Struct, frozen=True, omit_defaults=True):
    """One journal line, and the payload of an ``event`` frame.

    ``seq`` counts 1, 2, 3 ... per conversation with no gap; live-only
    (ephemeral) records carry ``seq`` 0. ``ts`` is UTC RFC 3339. ``data``
    is the payload of kind ``type`` (see :data:`PAYLOADS`), left raw so a
    line encoded once is sent to every subscriber as it is.
    """

    type: str
    ts: str
    data: msgspec.Raw = msgspec.Raw(b"{}")
    seq: int = 0
    run: str = ""
    #: set on a record of a turn a rewind dropped, when a reader asked for those too (``all``)
    dropped: bool = False


class ConversationCreated(msgspec.Struct, frozen=True, omit_defaults=True):
    provider: str
    workdir: str
    title: str = ""
    model: str = ""
    mode: Mode = "interactive"


class PromptRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """A prompt the daemon accepted, before it reaches the provider; never resent."""

    text: str
    disposition: str = "started"
    #: files sent with it, as stored (without their path)
    attachments: list[Attachment] = []


class LeaseRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    action: Literal["acquired", "taken_over", "released"]
    owner: str
    previous_owner: str = ""


class ErrorRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    code: str
    message: str


class StateRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    state: ConversationState
    reason: str = ""


class BudgetRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """A ``budget`` record: the budget a conversation got (new, config) or was given (command)."""

    budget: Budget
    source: Literal["new", "config", "command"] = "command"
    by: str = ""


class HistoryEntry(msgspec.Struct, frozen=True, omit_defaults=True):
    """One item of a history page: its latest form, at the seq of the record that holds it.
    The user's prompts are ``user`` items with id ``prompt-<seq>``."""

    seq: int
    item: Item
    run: str = ""
    #: one of the runtime's earlier turns, journaled when the conversation adopted its session
    imported: bool = False
    #: its turn was dropped by a rewind (shown only with ``all``)
    dropped: bool = False
    #: copied from the conversation this one was forked from
    copied: bool = False


class HistoryPage(msgspec.Struct, frozen=True, omit_defaults=True):
    """Entries oldest first. ``before`` / ``after``: the cursor of the next older / newer page
    (pass it as the request's ``before`` / ``after``), 0 when there is none; ``start`` / ``end``:
    the page reaches the first / the newest entry."""

    conversation: str
    items: list[HistoryEntry] = []
    before: int = 0
    after: int = 0
    start: bool = False
    end: bool = False


class ExportResult(msgspec.Struct, frozen=True, omit_defaults=True):
    conversation: str
    format: str
    #: the rendered transcript
    text: str
    title: str = ""


# ---- forkrewind (results and journal records)


class BranchRun(msgspec.Struct, frozen=True, omit_defaults=True):
    """One turn as fork and rewind name it: its run, the seq of its end, how it ended, its prompt."""

    run: str
    seq: int = 0
    state: str = ""
    prompt: str = ""


class ForkResult(msgspec.Struct, omit_defaults=True):
    """``fork``: the new conversation, where it branched off, and how many records were copied."""

    conversation: ConversationRecord
    source: str
    run: str
    seq: int
    copied: int = 0
    #: the turns the new conversation holds, oldest first
    turns: list[BranchRun] = []


class RewindResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """``rewind``: the run kept and the runs dropped, newest last; ``preview``: nothing changed.
    ``seq`` is the ``rewind`` record's (0 in a preview)."""

    conversation: str
    kept: BranchRun
    dropped: list[BranchRun] = []
    preview: bool = False
    seq: int = 0


class ForkedRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """A ``forked`` record, the first of a forked conversation's journal: where it came from.
    ``seq`` is the source's record that ended run ``run``; the copies follow, each with a
    ``copied`` key ``{conversation, seq}`` naming its original."""

    source: str
    run: str
    seq: int
    provider: str = ""
    provider_conversation_id: str = ""


class RewindRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """A ``rewind`` record: the run kept (ending at ``seq``) and the runs discarded after it."""

    kept: str
    seq: int
    dropped: list[str] = []


class TaskEvent(msgspec.Struct, frozen=True, omit_defaults=True):
    """A ``task`` record: what happened to the task running in this conversation."""

    task: str
    #: created, started, status (a change of status), comment, callback (one delivery attempt)
    event: Literal["created", "started", "status", "comment", "callback"]
    status: TaskStatus | None = None
    reason: str = ""
    error: str = ""
    comment: TaskComment | None = None
    attempt: CallbackAttempt | None = None


#: Record ``type`` -> payload type, for decoding ``Record.data``.
PAYLOADS: dict[str, Any] = {
    "item": Item,
    "delta": Delta,
    "turn": Turn,
    "interaction": Interaction,
    "answer": AnswerRecord,
    "exit": str,
    "title": str,
    "subagent": Subagent,
    "context": Context,
    "usage": Usage,
    "tokens": TokenUsage,
    "compaction": dict,
    "activity": Activity,
    "todos": TodoList,
    "model_selection": ModelSelection,
    "unknown": Unknown,
    "conversation": ConversationCreated,
    "prompt": PromptRecord,
    "lease": LeaseRecord,
    "error": ErrorRecord,
    "state": StateRecord,
    "budget": BudgetRecord,
    "task": TaskEvent,
    "import": ImportRecord,
    "forked": ForkedRecord,
    "rewind": RewindRecord,
}


# ---- checkpoints

class CheckpointRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """A ``checkpoint`` record: the working directory recorded before or after a step (a turn,
    named by its run, or a revert, by its id), as a tree in agentd's shadow git repository. A
    turn's records carry its run, the after-record right before its terminal ``turn`` record;
    when agentd itself ended the turn (a cancel not confirmed, a runtime that died), the
    after-record follows the end and carries no run (nothing of a run follows its end).

    ``tree`` is "" when the checkpoint was skipped; ``skipped`` then says why: ``timeout``
    (past ``[checkpoints] timeout_s``), ``no_workdir``, ``error`` (``error`` says what).
    """

    step: str
    phase: Literal["before", "after"]
    tree: str = ""
    skipped: str = ""
    error: str = ""
    #: milliseconds the turn (or op) waited for it
    ms: int = 0
    #: files left out, bigger than [checkpoints] max_file_bytes (workdir-relative paths)
    too_large: list[str] = []
    #: nested git repositories left out (workdir-relative, ending in /)
    nested: list[str] = []
    #: which directory was recorded: ``"<st_dev>:<st_ino>"`` of the working directory then (symlinks
    #: followed); a revert writes only into that one ("" in records of an agentd before it)
    workdir_id: str = ""


class RevertedFile(msgspec.Struct, frozen=True, omit_defaults=True):
    """One file a revert writes back (``restore``: content and mode as before the step;
    ``create``: it did not exist now) or removes (``delete``: it did not exist before).
    ``changed_since``: it is not as the step left it (a later turn or the user changed it): the
    revert undoes that too (the revert's own undo brings it back)."""

    path: str
    action: Literal["restore", "create", "delete"]
    changed_since: bool = False


class RevertRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """A ``revert`` record: step ``id`` restored the files step ``of`` changed. A revert is a
    step of its own, with its own before/after checkpoints, so it can be reverted in turn."""

    id: str
    of: str
    files: list[RevertedFile] = []
    by: str = ""


class DiffHunk(msgspec.Struct, frozen=True, omit_defaults=True):
    """One ``@@ -old_start,old_lines +new_start,new_lines @@ section`` hunk; ``lines`` keep
    their first character (`` ``, ``+``, ``-``, ``\\``) and lose their newline."""

    old_start: int
    old_lines: int
    new_start: int
    new_lines: int
    section: str = ""
    lines: list[str] = []


class DiffFile(msgspec.Struct, frozen=True, omit_defaults=True):
    """One file a step changed. ``status``: added, modified, deleted, type_changed (a file
    became a symlink or back). Modes are git's (``100644``, ``100755``, ``120000``)."""

    path: str
    status: Literal["added", "modified", "deleted", "type_changed"]
    old_mode: str = ""
    new_mode: str = ""
    binary: bool = False
    additions: int = 0
    deletions: int = 0
    hunks: list[DiffHunk] = []


class DiffResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """What step ``run`` changed. ``kind``: turn or revert. ``after``: where its after-state
    came from: ``checkpoint`` (recorded as it ended), ``next`` (the next step's before-state),
    ``now`` (the working directory now: the turn is running, or its end was not recorded).
    ``patch`` is the unified diff ("" with ``stat``); ``truncated``: files past the size a
    diff may carry are listed without hunks and left out of the patch."""

    conversation: str
    run: str
    kind: Literal["turn", "revert"] = "turn"
    after: Literal["checkpoint", "next", "now"] = "checkpoint"
    files: list[DiffFile] = []
    patch: str = ""
    truncated: bool = False
    #: files left out of either checkpoint (too big): not diffed
    too_large: list[str] = []
    #: what the runtime itself reported of the turn's changes, verbatim, when it reports any
    runtime_diff: str = ""


class RevertResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """What a revert of step ``run`` changed (or, with ``dry_run``, would change). ``revert`` is
    the new step's id ("" for a dry run or when nothing differs); revert it to undo this one."""

    conversation: str
    run: str
    files: list[RevertedFile] = []
    revert: str = ""
    dry_run: bool = False


PAYLOADS["checkpoint"] = CheckpointRecord
PAYLOADS["turn_diff"] = TurnDiff
PAYLOADS["revert"] = RevertRecord


def decode_payload(record: Record) -> Any:
    """Decode ``record.data`` into its payload type; unknown types decode as plain JSON."""
    return msgspec.json.decode(record.data, type=PAYLOADS.get(record.type, Any))


class InFlightItem(msgspec.Struct, omit_defaults=True):
    id: str
    kind: str
    text: str = ""
    agent_id: str = ""


class Snapshot(msgspec.Struct, omit_defaults=True):
    """The in-flight turn, rebuilt from what is only live: text so far, pending interactions."""

    state: ConversationState
    last_seq: int
    run: str = ""
    items: list[InFlightItem] = []
    pending: list[Interaction] = []
    todos: TodoList | None = None
    activity: Activity | None = None
    context: Context | None = None


# --------------------------------------------------------------------------- server frames


class _Frame(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="type"):
    pass


class HelloFrame(_Frame, tag="hello"):
    protocol: int
    server: str
    pid: int = 0


class ErrorBody(msgspec.Struct, frozen=True, omit_defaults=True):
    code: str
    message: str
    details: dict[str, Any] = {}


class ResultFrame(_Frame, tag="result"):
    id: int
    result: msgspec.Raw = msgspec.Raw(b"null")


class ErrorFrame(_Frame, tag="error"):
    #: None when the failing frame had no readable id
    id: int | None
    error: ErrorBody


class EventFrame(_Frame, tag="event"):
    sub: int
    conversation: str
    record: msgspec.Raw


class SnapshotFrame(_Frame, tag="snapshot"):
    sub: int
    conversation: str
    snapshot: Snapshot


class LaggedFrame(_Frame, tag="lagged"):
    """The subscription fell behind and ended; resubscribe after ``resume_after``.

    For an all-conversations subscription, ``positions`` holds the last seq
    delivered per conversation.
    """

    sub: int
    conversation: str = ""
    resume_after: int = 0
    positions: dict[str, int] = {}


ServerFrame = Union[HelloFrame, ResultFrame, ErrorFrame, EventFrame, SnapshotFrame, LaggedFrame]


# --------------------------------------------------------------------------- codec


class ProtocolError(AgentdError):
    """A frame could not be read; ``request_id`` is its id when one was readable."""

    code = "invalid"

    def __init__(self, message: str, *, code: str = "invalid", request_id: int | None = None) -> None:
        super().__init__(message)
        self.code = code  # type: ignore[misc]
        self.request_id = request_id


class _Envelope(msgspec.Struct):
    id: int | None = None
    op: str | None = None


_encoder = msgspec.json.Encoder()
_envelope_decoder = msgspec.json.Decoder(_Envelope)
_server_frame_decoder = msgspec.json.Decoder(ServerFrame)


# Built on first use: building a decoder analyses every type in its union, a cost
# agentctl (which decodes neither requests nor, for most commands, records) need not pay.
@functools.cache
def _request_decoder() -> msgspec.json.Decoder[Request]:
    return msgspec.json.Decoder(Request)


@functools.cache
def _record_decoder() -> msgspec.json.Decoder[Record]:
    return msgspec.json.Decoder(Record)


def encode(obj: Any) -> bytes:
    """Encode one frame as a line: JSON followed by ``\\n``."""
    buf = bytearray()
    _encoder.encode_into(obj, buf)
    buf += b"\n"
    return bytes(buf)


def encode_result(request_id: int, result: Any) -> bytes:
    return encode(ResultFrame(id=request_id, result=msgspec.Raw(_encoder.encode(result))))


#: Longest piece of a client's request an error quotes back, characters: an error about a
#: 16 MB frame must not be a 16 MB frame itself.
ECHO_LIMIT = 200
#: Longest error message or detail string agentd sends; past it, the middle is cut out.
ERROR_TEXT_LIMIT = 1000


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` when at most ``limit`` characters; else its start, an ellipsis and its length."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} chars)"


def _clip_middle(text: str) -> str:
    # Whatever agentd itself says is short: a long message quotes the request somewhere inside,
    # so keep its start and its end (a decoder error names the path last) and cut the middle.
    if len(text) <= ERROR_TEXT_LIMIT:
        return text
    return f"{text[:ECHO_LIMIT]}… ({len(text)} chars in all) …{text[-ECHO_LIMIT:]}"


def _clip_details(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return _clip_middle(value)
    if depth > 3:
        return value
    if isinstance(value, dict):
        if len(value) > 100:
            value = dict(list(value.items())[:100])
        return {_clip_middle(str(k)): _clip_details(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clip_details(v, depth + 1) for v in value[:100]]
    return value


def encode_error(request_id: int | None, error: AgentdError) -> bytes:
    """An ``error`` frame; its message and detail strings are cut to a bounded size, whatever they quote."""
    body = ErrorBody(code=error.code, message=_clip_middle(error.message), details=_clip_details(error.details))
    return encode(ErrorFrame(id=request_id, error=body))


def size_text(n: int) -> str:
    """A byte count as people read it: ``512 bytes``, ``2.0 KiB``, ``10.0 MiB``."""
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} bytes"


def attachment_over_limit(name: str, size: int, max_bytes: int, *, at_least: bool = False) -> LimitExceeded:
    """The ``limit`` error for a file past ``[attachments] max_bytes`` (agentd's and agentctl's alike)."""
    told = f"more than {size_text(max_bytes)}" if at_least else size_text(size)
    return LimitExceeded(
        f"attachment {name!r} is {told}, over the {size_text(max_bytes)} limit ([attachments] max_bytes)",
        details={"name": name, "size": size, "max_bytes": max_bytes},
    )


def _decoder_message(exc: Exception) -> str:
    # msgspec quotes bad values and unknown field names (" - at `$.path`" last): clip the quote.
    text = str(exc)
    head, sep, path = text.rpartition(" - at `")
    if not sep:
        return clip(text)
    return f"{clip(head)}{sep}{clip(path)}"


#: request type -> its fields of free-form JSON, checked against MAX_JSON_NESTING as decoded
_FREE_JSON: dict[type, tuple[str, ...]] = {RegisterTool: ("input_schema",), CallHostTool: ("arguments",)}


def decode_request(line: bytes) -> Request:
    """Decode one client frame (without its newline).

    Raises :class:`ProtocolError` with code ``invalid`` for malformed JSON,
    wrong fields (the message names the path) or free-form JSON (tool arguments,
    schemas) nested more than :data:`MAX_JSON_NESTING` levels, and ``unsupported`` for an
    unknown ``op``; ``request_id`` is set whenever the frame's id was readable.
    """
    try:
        env = _envelope_decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed frame: {_decoder_message(exc)}") from None
    except RecursionError:
        # msgspec recurses per nesting level; a frame of a few hundred KB of "[" exhausts the stack.
        raise ProtocolError("malformed frame: nested too deeply") from None
    if env.op is None:
        raise ProtocolError("frame has no op", request_id=env.id)
    if env.op not in OPS:
        raise ProtocolError(f"unknown op {clip(env.op)!r}", code="unsupported", request_id=env.id)
    try:
        req = _request_decoder().decode(line)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"invalid {env.op!r} request: {_decoder_message(exc)}", request_id=env.id) from None
    except RecursionError:
        raise ProtocolError(f"invalid {env.op!r} request: nested too deeply", request_id=env.id) from None
    for name in _FREE_JSON.get(type(req), ()):
        if nested_deeper_than(getattr(req, name)):
            raise ProtocolError(f"invalid {env.op!r} request: {name} nests more than {MAX_JSON_NESTING} levels deep",
                                request_id=env.id)
    return req


def decode_server_frame(line: bytes) -> ServerFrame:
    """Decode one daemon frame; raises :class:`ProtocolError`."""
    try:
        return _server_frame_decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed frame from agentd: {exc}") from None


def decode_record(raw: bytes | msgspec.Raw) -> Record:
    return _record_decoder().decode(raw)


def error_from_body(body: ErrorBody) -> AgentdError:
    """The exception a client raises for an ``error`` frame (one class per code)."""
    cls = ERRORS_BY_CODE.get(body.code, AgentdError)
    err = cls(body.message, details=dict(body.details))
    return err


__all__ = [name for name in globals() if not name.startswith("_")]
