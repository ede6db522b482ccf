"""The parts of the Agent Client Protocol (schema version 1) that agentd reads, as msgspec Structs.

Only what the provider consumes is declared; every Struct ignores unknown
fields (``_meta`` and anything newer), so a newer agent still decodes. Field
names are the protocol's camelCase (``rename="camel"``). Outgoing messages
are plain dicts built where they are sent.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

PROTOCOL_VERSION = 1

# JSON-RPC error codes (ACP adds -32002 "resource not found").
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
RESOURCE_NOT_FOUND = -32002


class _S(msgspec.Struct, rename="camel", omit_defaults=True):
    pass


# --------------------------------------------------------------------------- initialize


class PromptCapabilities(_S):
    image: bool = False
    audio: bool = False
    embedded_context: bool = False


class SessionCapabilities(_S):
    """Each present (even empty) object means the method is offered."""

    close: dict[str, Any] | None = None
    fork: dict[str, Any] | None = None
    list: dict[str, Any] | None = None
    resume: dict[str, Any] | None = None


class McpCapabilities(_S):
    """The MCP transports an agent takes besides stdio (which every ACP agent must take)."""

    http: bool = False
    sse: bool = False


class AgentCapabilities(_S):
    load_session: bool = False
    mcp_capabilities: McpCapabilities = msgspec.field(default_factory=McpCapabilities)
    prompt_capabilities: PromptCapabilities = msgspec.field(default_factory=PromptCapabilities)
    session_capabilities: SessionCapabilities = msgspec.field(default_factory=SessionCapabilities)


class Implementation(_S):
    name: str = ""
    title: str | None = None
    version: str = ""


class InitializeResponse(_S):
    protocol_version: int = 0
    agent_capabilities: AgentCapabilities = msgspec.field(default_factory=AgentCapabilities)
    agent_info: Implementation | None = None


# --------------------------------------------------------------------------- sessions


class ModelInfo(_S):
    model_id: str
    name: str = ""
    description: str | None = None


class SessionModelState(_S):
    available_models: list[ModelInfo] = []
    current_model_id: str = ""


class SessionMode(_S):
    id: str
    name: str = ""
    description: str | None = None


class SessionModeState(_S):
    available_modes: list[SessionMode] = []
    current_mode_id: str = ""


class ConfigOption(_S):
    """A session config option (select or boolean); ``options`` may be flat or grouped."""

    id: str
    name: str = ""
    type: str = ""
    category: str | None = None
    current_value: Any = None
    options: list[dict[str, Any]] = []

    def values(self) -> list[str]:
        out: list[str] = []
        for opt in self.options:
            if isinstance(opt.get("options"), list):  # a group
                out.extend(str(o.get("value")) for o in opt["options"] if isinstance(o, dict))
            elif "value" in opt:
                out.append(str(opt["value"]))
        return out


class SessionSetup(_S):
    """The answer of session/new, session/load and session/resume."""

    session_id: str = ""
    models: SessionModelState | None = None
    modes: SessionModeState | None = None
    config_options: list[ConfigOption] | None = None


class SessionInfo(_S):
    session_id: str
    cwd: str = ""
    title: str | None = None
    updated_at: str | None = None


class ListSessionsResponse(_S):
    sessions: list[SessionInfo] = []
    next_cursor: str | None = None


# --------------------------------------------------------------------------- content


class ContentBlock(_S):
    """Any content block, flattened: text, image, audio, resource_link, resource."""

    type: str = "text"
    text: str = ""
    uri: str = ""
    name: str = ""
    title: str | None = None
    mime_type: str | None = None
    resource: dict[str, Any] | None = None


class ToolCallContent(_S):
    """``content`` (a block), ``diff`` (path, oldText, newText) or ``terminal`` (terminalId)."""

    type: str = "content"
    content: ContentBlock | None = None
    path: str = ""
    old_text: str | None = None
    new_text: str = ""
    terminal_id: str = ""


class ToolCallLocation(_S):
    path: str
    line: int | None = None


class ToolCallFields(_S):
    """A tool_call, a tool_call_update, or the toolCall of a permission request.

    UNSET fields were not sent (an update changes only what it carries).
    """

    tool_call_id: str
    title: str | None | msgspec.UnsetType = msgspec.UNSET
    kind: str | None | msgspec.UnsetType = msgspec.UNSET
    status: str | None | msgspec.UnsetType = msgspec.UNSET
    content: list[ToolCallContent] | None | msgspec.UnsetType = msgspec.UNSET
    locations: list[ToolCallLocation] | None | msgspec.UnsetType = msgspec.UNSET
    raw_input: Any | msgspec.UnsetType = msgspec.UNSET
    raw_output: Any | msgspec.UnsetType = msgspec.UNSET


# --------------------------------------------------------------------------- session/update


class _Update(_S, tag_field="sessionUpdate"):
    pass


class UserMessageChunk(_Update, tag="user_message_chunk"):
    content: ContentBlock
    message_id: str | None = None


class AgentMessageChunk(_Update, tag="agent_message_chunk"):
    content: ContentBlock
    message_id: str | None = None


class AgentThoughtChunk(_Update, tag="agent_thought_chunk"):
    content: ContentBlock
    message_id: str | None = None


class ToolCallStart(_Update, ToolCallFields, tag="tool_call"):
    pass


class ToolCallProgress(_Update, ToolCallFields, tag="tool_call_update"):
    pass


class PlanEntry(_S):
    content: str
    priority: str = "medium"
    status: str = "pending"


class PlanUpdate(_Update, tag="plan"):
    entries: list[PlanEntry] = []


class AvailableCommandsUpdate(_Update, tag="available_commands_update"):
    #: entries as sent: one that is no object is skipped by the mapping, never the whole update
    available_commands: list[Any] = []


class CurrentModeUpdate(_Update, tag="current_mode_update"):
    current_mode_id: str


class ConfigOptionUpdate(_Update, tag="config_option_update"):
    config_options: list[ConfigOption] = []


class SessionInfoUpdate(_Update, tag="session_info_update"):
    title: str | None = None
    updated_at: str | None = None


class Cost(_S):
    amount: float
    currency: str = ""


class UsageUpdate(_Update, tag="usage_update"):
    used: int = 0
    size: int = 0
    cost: Cost | None = None


SessionUpdate = Union[
    UserMessageChunk,
    AgentMessageChunk,
    AgentThoughtChunk,
    ToolCallStart,
    ToolCallProgress,
    PlanUpdate,
    AvailableCommandsUpdate,
    CurrentModeUpdate,
    ConfigOptionUpdate,
    SessionInfoUpdate,
    UsageUpdate,
]

#: every sessionUpdate tag agentd understands; others are logged at debug and dropped
KNOWN_UPDATES = frozenset(
    t.__struct_config__.tag for t in SessionUpdate.__args__  # type: ignore[attr-defined]
)


class UpdateOf(_S):
    """One ``session/update``'s ``update`` (convert ``{"update": raw}``): msgspec keeps the decoding
    plan of a Struct on its class, while converting to the bare union hashes the Union every time
    (7.6 us against 0.4 us an update, measured)."""

    update: SessionUpdate


class SessionNotification(_S):
    session_id: str
    #: decoded separately, so an unknown kind is dropped instead of failing the message
    update: dict[str, Any]


# --------------------------------------------------------------------------- prompt turn


class Usage(_S):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cached_read_tokens: int | None = None
    cached_write_tokens: int | None = None
    thought_tokens: int | None = None


class PromptResponse(_S):
    stop_reason: str = "end_turn"
    usage: Usage | None = None


# --------------------------------------------------------------------------- agent -> client requests


class PermissionOption(_S):
    option_id: str
    name: str = ""
    kind: str = ""


class RequestPermissionRequest(_S):
    tool_call: ToolCallFields
    options: list[PermissionOption]
    session_id: str = ""


class ReadTextFileRequest(_S):
    path: str
    session_id: str = ""
    line: int | None = None
    limit: int | None = None


class WriteTextFileRequest(_S):
    path: str
    content: str
    session_id: str = ""
