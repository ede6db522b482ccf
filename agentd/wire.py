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
from typing import Any, Literal, Union

import msgspec

from .contract import (
    ERRORS_BY_CODE,
    Activity,
    AgentdError,
    Answer,
    AnswerRecord,
    Capabilities,
    Context,
    Interaction,
    Item,
    Model,
    Subagent,
    TodoList,
    TokenUsage,
    Turn,
    Usage,
    ModelSelection,
    Delta,
)

#: Bumped on any incompatible change to the frames below.
PROTOCOL_VERSION = 1
#: Default limit of one incoming frame, bytes (``server.max_frame_bytes`` in config).
DEFAULT_MAX_FRAME_BYTES = 1 << 20
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


# --------------------------------------------------------------------------- requests


class _Request(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="op", forbid_unknown_fields=True):
    id: int


class Hello(_Request, tag="hello"):
    protocol: int
    client: str = ""


class Status(_Request, tag="status"):
    pass


class Providers(_Request, tag="providers"):
    pass


class Models(_Request, tag="models"):
    provider: str


class New(_Request, tag="new"):
    provider: str
    workdir: str
    title: str = ""
    model: str = ""
    mode: Mode = "interactive"


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
    conversation: str


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


class Unsubscribe(_Request, tag="unsubscribe"):
    subscription: int


Request = Union[
    Hello,
    Status,
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


class StatusResult(msgspec.Struct, frozen=True, omit_defaults=True):
    version: str
    protocol: int
    pid: int
    uptime_s: float
    state_dir: str
    socket: str
    conversations: int
    running: int
    providers: list[str]


class ConversationRecord(msgspec.Struct, omit_defaults=True):
    """A conversation as the daemon keeps it on disk (``record.json``)."""

    id: str
    provider: str
    workdir: str
    created_at: str
    updated_at: str
    title: str = ""
    model: str = ""
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


class ConversationInfo(msgspec.Struct, omit_defaults=True):
    """``show``: the record, its live state and pending interactions."""

    record: ConversationRecord
    #: the journal's last seq (0 when the conversation is not loaded yet)
    last_seq: int = 0
    pending: list[Interaction] = []
    queued: int = 0
    usage: Usage | None = None


class SendResult(msgspec.Struct, frozen=True, omit_defaults=True):
    #: the turn started (or to be started) by this prompt
    run: str
    #: how the prompt was taken: started, queued, steered, or interrupted (then started)
    disposition: Literal["started", "queued", "steered", "interrupted"] = "started"
    #: the journal seq just before the prompt; subscribe after it to follow the turn
    after: int = 0


class SubscribeResult(msgspec.Struct, frozen=True, omit_defaults=True):
    subscription: int
    #: the journal's last seq when the subscription started
    last_seq: int = 0


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
    "conversation": ConversationCreated,
    "prompt": PromptRecord,
    "lease": LeaseRecord,
    "error": ErrorRecord,
    "state": StateRecord,
}


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
_request_decoder = msgspec.json.Decoder(Request)
_server_frame_decoder = msgspec.json.Decoder(ServerFrame)
_record_decoder = msgspec.json.Decoder(Record)


def encode(obj: Any) -> bytes:
    """Encode one frame as a line: JSON followed by ``\\n``."""
    buf = bytearray()
    _encoder.encode_into(obj, buf)
    buf += b"\n"
    return bytes(buf)


def encode_result(request_id: int, result: Any) -> bytes:
    return encode(ResultFrame(id=request_id, result=msgspec.Raw(_encoder.encode(result))))


def encode_error(request_id: int | None, error: AgentdError) -> bytes:
    return encode(
        ErrorFrame(id=request_id, error=ErrorBody(code=error.code, message=error.message, details=error.details))
    )


def decode_request(line: bytes) -> Request:
    """Decode one client frame (without its newline).

    Raises :class:`ProtocolError` with code ``invalid`` for malformed JSON or
    wrong fields (the message names the path), and ``unsupported`` for an
    unknown ``op``; ``request_id`` is set whenever the frame's id was readable.
    """
    try:
        env = _envelope_decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed frame: {exc}") from None
    if env.op is None:
        raise ProtocolError("frame has no op", request_id=env.id)
    if env.op not in OPS:
        raise ProtocolError(f"unknown op {env.op!r}", code="unsupported", request_id=env.id)
    try:
        return _request_decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"invalid {env.op!r} request: {exc}", request_id=env.id) from None


def decode_server_frame(line: bytes) -> ServerFrame:
    """Decode one daemon frame; raises :class:`ProtocolError`."""
    try:
        return _server_frame_decoder.decode(line)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed frame from agentd: {exc}") from None


def decode_record(raw: bytes | msgspec.Raw) -> Record:
    return _record_decoder.decode(raw)


def error_from_body(body: ErrorBody) -> AgentdError:
    """The exception a client raises for an ``error`` frame (one class per code)."""
    cls = ERRORS_BY_CODE.get(body.code, AgentdError)
    err = cls(body.message, details=dict(body.details))
    return err


__all__ = [name for name in globals() if not name.startswith("_")]
