"""MCP servers: which a conversation gets, how they reach its runtime, and what state they are in.

Rules:

* The servers are the config's ``[mcp.servers.<name>]``. A conversation's set is chosen once,
  at ``new``: the names it asks for (``agentctl new --mcp NAME``, each must exist), none
  (``--no-mcp``), or by default ``[mcp.defaults] <provider>`` when the provider has an entry,
  else every server with ``default = true`` whose ``providers`` is empty or names the
  provider (a glob such as ``acp:*`` works). The names are kept in the conversation record
  (``mcp``), so a conversation reopened after a restart gets the same servers, with the
  config's settings of the day.
* A provider whose capability ``mcp`` is false gets none: asking for one by name is
  ``unsupported``; defaults are left out quietly.
* Secrets: the values of ``env`` under a secret's name and every ``headers`` value are
  registered with agentd.masking at start, so whatever a runtime echoes of them is masked;
  nothing here journals, logs or answers them (``mcp ls`` shows env and header names only).
* ``status`` asks the conversation's runtime (``McpStatusReader``); a runtime that does not
  say reports each server ``unknown``. A server that fails to start is also a notice item
  in the conversation, emitted by the provider when the runtime says so.

The conversation service calls :meth:`McpRoom.servers_for` when it opens a conversation on
its runtime; nothing else here is its code.
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING, Any

from . import contract as c
from . import masking, wire

if TYPE_CHECKING:
    from .config import McpConfig
    from .conversations import ConversationService

__all__ = ["McpRoom"]


class McpRoom:
    """The ``[mcp]`` config and the ops on it; one per daemon.

    ``extra``: called with a conversation record, returns more servers for it (agentd's own
    host-tool server, agentd.host_tools); None = none.
    """

    def __init__(self, config: "McpConfig") -> None:
        self.config = config
        self.extra: Any = None
        values: list[str] = []
        for server in config.servers.values():
            values += [server.env[k] for k in masking.secret_names(server.env)]
            for value in server.headers.values():  # the whole value, and the token after a scheme (Bearer ...)
                values += [value, value.split(" ", 1)[-1]]
        masking.register(*values)

    # ------------------------------------------------------------------ choosing

    def defaults(self, provider: str) -> list[str]:
        """The names of the servers ``provider``'s new conversations get when they name none."""
        if provider in self.config.defaults:
            return list(self.config.defaults[provider])
        return [name for name, s in self.config.servers.items()
                if s.default and (not s.providers or any(fnmatch.fnmatchcase(provider, p) for p in s.providers))]

    def choose(self, provider: str, capabilities: c.Capabilities, names: list[str] | None) -> list[str]:
        """The server names a new conversation on ``provider`` keeps in its record.

        ``names`` None = the provider's defaults; [] = none. Raises Invalid for an unknown
        or repeated name, Unsupported when names are given and the provider cannot take MCP servers.
        """
        if names is None:
            return self.defaults(provider) if capabilities.mcp else []
        unknown = [n for n in names if n not in self.config.servers]
        if unknown:
            known = ", ".join(sorted(self.config.servers)) or "none (add [mcp.servers.<name>] to agentd.toml)"
            raise c.Invalid(f"unknown MCP server {unknown[0]!r}; configured: {known}")
        if len(set(names)) != len(names):
            raise c.Invalid("an MCP server is named twice")
        if names and not capabilities.mcp:
            raise c.Unsupported(f"provider {provider!r} cannot take MCP servers (capability mcp is false)")
        return list(names)

    def servers_for(self, record: wire.ConversationRecord) -> list[c.McpServer]:
        """What a provider is handed when it opens ``record``'s conversation (secrets included)."""
        names = self.defaults(record.provider) if record.mcp is None else record.mcp
        out: list[c.McpServer] = []
        for name in names:
            s = self.config.servers.get(name)
            if s is None:
                continue  # removed from the config since: `mcp status` shows it missing
            if s.url:
                out.append(c.McpServer(name=name, transport="http", url=s.url, headers=dict(s.headers)))
            else:
                out.append(c.McpServer(name=name, command=s.command, args=list(s.args), env=dict(s.env)))
        if self.extra is not None:
            out += self.extra(record)
        return out

    # ------------------------------------------------------------------ ops

    def listing(self, providers: list[str]) -> wire.McpListResult:
        """``mcp_ls``: every configured server, without a secret; ``providers``: those that take MCP servers."""
        servers = []
        for name, s in sorted(self.config.servers.items()):
            servers.append(wire.McpServerInfo(
                name=name, transport="http" if s.url else "stdio", command=s.command, args=list(s.args),
                url=masking.mask_text(s.url), env=sorted(s.env), headers=sorted(s.headers),
                default_for=[p for p in providers if name in self.defaults(p)],
            ))
        return wire.McpListResult(servers=servers, host_tool_timeout_s=self.config.host_tool_timeout_s)

    async def status(self, service: "ConversationService", ref: str) -> wire.McpStatusResult:
        """``mcp_status``: each server of conversation ``ref`` as its runtime reports it.

        Opens the conversation on its runtime when it is not open (the runtime starts its
        servers then). Raises NotFound, Closed for a closed conversation, RuntimeUnavailable.
        """
        live = await service.live(ref, open_only=True)
        record = live.record
        provider = await service.runtimes.get(record.provider)
        if not provider.capabilities().mcp:
            return wire.McpStatusResult(conversation=record.id, provider=record.provider)
        wanted = [s.name for s in self.servers_for(record)]
        conv = await service.open_conversation(live)
        reported: list[c.McpServerState] | None = None
        if isinstance(conv, c.McpStatusReader):
            reported = await conv.mcp_status()
        by_name = {s.name: s for s in reported or []}
        states = [by_name.get(n, c.McpServerState(name=n)) for n in wanted]
        configured = self.defaults(record.provider) if record.mcp is None else record.mcp
        states += [c.McpServerState(name=n, state="failed", error="not in agentd.toml any more")
                   for n in configured if n not in self.config.servers]
        return wire.McpStatusResult(conversation=record.id, provider=record.provider,
                                    servers=[masking.mask_struct(s) for s in states], reported=reported is not None)
