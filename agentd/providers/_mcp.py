"""What every provider does with MCP servers: keep their states and say when one failed.

Each runtime reports its MCP servers its own way (Copilot's session events, Claude Code's
init message and ``mcp_status``, Codex's ``mcpServer/startupStatus/updated``); a provider
feeds what it learns to one :class:`McpStates` per conversation, which answers
``mcp_status()`` and gives the notice item to emit the first time a server is seen failed,
so a server that fails to start never fails a turn silently.
"""

from __future__ import annotations

import uuid

from ..contract import Item, ItemKind, McpServer, McpServerState, utcnow

__all__ = ["McpStates", "normal_state"]

_STATES = {"connected": "connected", "ready": "connected", "running": "connected", "starting": "pending",
           "pending": "pending", "connecting": "pending", "failed": "failed", "error": "failed",
           "disabled": "disabled", "needs-auth": "failed", "needs_auth": "failed", "cancelled": "failed"}


def normal_state(runtime_state: str) -> str:
    """A runtime's word for a server's state as one of McpServerState's (unknown when none fits)."""
    return _STATES.get(runtime_state.lower().replace(" ", "_"), "unknown")


class McpStates:
    """The MCP servers of one conversation and their last reported states."""

    def __init__(self, servers: list[McpServer]) -> None:
        self.servers = list(servers)
        self._states: dict[str, McpServerState] = {s.name: McpServerState(name=s.name) for s in servers}
        self._told: set[str] = set()

    def update(self, name: str, state: str, *, error: str = "", tools: list[str] | None = None) -> Item | None:
        """Note ``name``'s state (a runtime's word, see :func:`normal_state`); returns the notice
        item to emit when it has just failed (once per failure), else None. Unknown names are ignored
        (a runtime's own servers, configured outside agentd)."""
        old = self._states.get(name)
        if old is None:
            return None
        norm = normal_state(state)
        if state.lower() in ("needs-auth", "needs_auth") and not error:
            error = "the server needs authentication"
        keep_tools = tools if tools is not None else (old.tools if norm == "connected" else None)
        self._states[name] = McpServerState(name=name, state=norm, error=error if norm == "failed" else "",  # type: ignore[arg-type]
                                            tools=keep_tools)
        if norm != "failed":
            self._told.discard(name)
            return None
        if name in self._told:
            return None
        self._told.add(name)
        why = f": {error}" if error else ""
        now = utcnow()
        return Item(id=f"notice-mcp-{uuid.uuid4().hex[:12]}", kind=ItemKind.NOTICE,
                    text=f"MCP server {name!r} failed to start{why}", time=now, ended_at=now)

    def tools(self, name: str, tools: list[str]) -> None:
        old = self._states.get(name)
        if old is not None:
            self._states[name] = McpServerState(name=name, state=old.state, error=old.error, tools=list(tools))

    def starting(self, *, unknown_too: bool = False) -> bool:
        """Whether a server is still starting (``pending``; with ``unknown_too``, not reported yet either)."""
        waiting = ("pending", "unknown") if unknown_too else ("pending",)
        return any(s.state in waiting for s in self._states.values())

    def states(self) -> list[McpServerState]:
        return [self._states[s.name] for s in self.servers]
