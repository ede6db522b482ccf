"""Host tools: tools a client attached to a conversation offers its agent, over one MCP server of agentd's own.

How it fits together:

* A client registers a tool on a conversation (``register_tool``: name, description, JSON
  Schema) and serves its calls by long-polling ``next_tool_call`` and answering each with
  ``tool_result`` (``agentctl tool serve`` does this and runs a command per call).
* Every conversation on an MCP-capable runtime gets, when ``[mcp] host_tools`` is on, one
  more MCP server, ``agentd``: a stdio relay (``python -m agentd.host_tools_relay``) that the
  runtime starts like any stdio server and that talks to this daemon over its socket. One
  mechanism for every runtime: each offers the tools under its own MCP naming
  (``mcp__agentd__<name>``, ``agentd-<name>``, ...), so a host tool can never shadow one of
  the runtime's own tools; names that look like a runtime's own tools are refused anyway.
  The relay lists the tools at ``tools/list`` and tells the runtime when they change
  (``notifications/tools/list_changed``).
* Each call is journaled as a tool item (``host-<call id>``): its input (cut as every
  provider cuts a tool's, agentd.providers._common.bound; the serving client gets it whole),
  then its result, bounded to ``[mcp] host_tool_result_bytes`` (the agent gets the whole result).
* A call no client answers within ``[mcp] host_tool_timeout_s`` (nobody took it, or the
  client that took it is gone or still busy) fails with an error the agent sees; the turn
  goes on. A call the agent gave up on (its relay went away) is taken by no client after.
* The agent is untrusted: a conversation has at most :data:`MAX_CALLS_IN_FLIGHT` calls in
  flight (more get an error result at once), and a closed conversation takes none.

State is in memory: registrations end with the daemon (a client registers again).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
import trio

from . import contract as c
from . import wire
from .providers._common import bound

if TYPE_CHECKING:
    from .config import McpConfig
    from .conversations import ConversationService

__all__ = ["HostTools", "RELAY_SERVER"]

log = structlog.get_logger("agentd.host_tools")
_json = msgspec.json.Encoder()

#: the MCP server name agentd's relay has in every runtime (and so a name no configured server may take)
RELAY_SERVER = "agentd"

#: seconds a runtime gets to list changed tools again after the relay told it, before its conversation is reopened
REFRESH_WAIT_S = 3.0

#: host tool calls one conversation may have in flight: each holds a connection to the daemon
#: (the relay's), and an agent that called without bound could take every one of them
MAX_CALLS_IN_FLIGHT = 16
#: host tools one conversation may have registered, and the most bytes of one tool's input
#: schema (as JSON): registrations outlive their client (it may come back), and every listing
#: carries them all, so they are bounded (with wire.MAX_TOOL_DESCRIPTION_CHARS: about 5 MB a listing)
MAX_TOOLS = 64
MAX_SCHEMA_BYTES = 64 << 10

#: names of runtimes' own tools (lowercased); a host tool may not take one, even namespaced
RESERVED = frozenset({
    "bash", "shell", "read", "write", "edit", "multiedit", "view", "create", "grep", "glob", "ls", "task",
    "agent", "todowrite", "webfetch", "websearch", "notebookedit", "exec_command", "write_stdin", "apply_patch",
    "run_shell_command", "read_file", "write_file", "replace", "list_directory", "update_plan", "sql",
})


class _Call:
    def __init__(self, name: str, arguments: dict[str, Any]) -> None:
        self.id = uuid.uuid4().hex[:16]
        self.name = name
        self.arguments = arguments
        self.done = trio.Event()
        self.taken = trio.Event()
        self.result: wire.HostToolCallResult | None = None
        #: the connection that took it (its gone-ness fails the call after the timeout)
        self.taker: Any = None


class _Tool:
    def __init__(self, info: wire.HostToolInfo, conn: Any) -> None:
        self.info = info
        self.conn = conn
        self.queue: deque[_Call] = deque()
        self.arrived = trio.Event()
        #: the registration is done (the runtime was told, or will reopen): listed as served from then on
        self.ready = False


class _Conversation:
    def __init__(self) -> None:
        self.tools: dict[str, _Tool] = {}
        self.version = 0
        #: the version the runtime last listed (through the relay's tools/list); -1 = never
        self.listed = -1
        self.listed_changed = trio.Event()
        self.changed = trio.Event()
        self.calls: dict[str, _Call] = {}

    def bump(self) -> None:
        self.version += 1
        self.changed.set()
        self.changed = trio.Event()


def _gone(conn: Any) -> bool:
    return conn is None or bool(getattr(conn, "_shut", False) or getattr(conn, "closing", False))


class HostTools:
    """Host tools of every conversation; one per daemon. ``socket``: the daemon's socket path,
    which the relay connects to."""

    def __init__(self, config: "McpConfig", service: "ConversationService", socket: str) -> None:
        self.config = config
        self.service = service
        self.socket = socket
        self._by_conv: dict[str, _Conversation] = {}

    # ------------------------------------------------------------------ the relay's MCP server

    def servers_for(self, record: wire.ConversationRecord) -> list[c.McpServer]:
        """agentd's own MCP server for ``record``'s runtime, when host tools are on."""
        if not self.config.host_tools:
            return []
        return [c.McpServer(name=RELAY_SERVER, command=sys.executable,
                            args=["-m", "agentd.host_tools_relay", "--socket", self.socket,
                                  "--conversation", record.id])]

    def _conv(self, cid: str) -> _Conversation:
        conv = self._by_conv.get(cid)
        if conv is None:
            conv = self._by_conv[cid] = _Conversation()
        return conv

    def _resolve(self, ref: str) -> str:
        record = self.service.record(ref)  # NotFound, Invalid (ambiguous)
        return record.id

    # ------------------------------------------------------------------ serving clients

    async def register(self, conn: Any, req: wire.RegisterTool) -> wire.HostToolInfo:
        """Offer ``req.name`` on the conversation, served by ``conn``. Raises NotFound, Invalid
        (a reserved name, a schema that is not an object schema), Unsupported (host tools off,
        or a provider that cannot take MCP servers)."""
        cid = self._resolve(req.conversation)
        record = self.service.record(cid)
        if record.state is wire.ConversationState.CLOSED:
            raise c.Closed(f"conversation {cid} is closed")
        # What the config cannot change first: turning host tools on would not help this one.
        provider = await self.service.runtimes.get(record.provider)
        if not provider.capabilities().mcp:
            raise c.Unsupported(f"provider {record.provider!r} cannot take MCP servers, so no host tools")
        if not self.config.host_tools:
            raise c.Unsupported("host tools are off ([mcp] host_tools = false)")
        if req.name.lower() in RESERVED:
            raise c.Invalid(f"{req.name!r} is the name of a runtime's own tool; choose another")
        schema = req.input_schema if req.input_schema is not None else {"type": "object"}
        if schema.get("type") != "object":
            raise c.Invalid("input_schema must be a JSON Schema of type object")
        if len(_json.encode(schema)) > MAX_SCHEMA_BYTES:
            raise c.LimitExceeded(f"input_schema takes at most {MAX_SCHEMA_BYTES:,} bytes as JSON")
        conv = self._conv(cid)
        old = conv.tools.get(req.name)
        if old is None and len(conv.tools) >= MAX_TOOLS:
            raise c.LimitExceeded(f"conversation {cid} has {MAX_TOOLS} host tools, as many as it takes; "
                                  "unregister one first (agentctl tool ls lists them)")
        info = wire.HostToolInfo(name=req.name, description=req.description, input_schema=schema, served=True)
        tool = _Tool(info, conn)
        if old is not None:  # taken over: its waiting calls go to the new client
            tool.queue = old.queue
            old.arrived.set()
            if tool.queue:
                tool.arrived.set()
        conv.tools[req.name] = tool
        if old is None or old.info != info:
            conv.bump()
            await self._refresh(cid, conv)
        tool.ready = True
        log.info("host_tools.registered", conversation=cid, tool=req.name, takeover=old is not None)
        return info

    async def _refresh(self, cid: str, conv: _Conversation) -> None:
        """Have the runtime see the changed tools: the relay tells it (tools/list_changed); a runtime
        that does not list them again within REFRESH_WAIT_S has its conversation reopened before its
        next turn (when it is open and idle), which starts its MCP servers anew."""
        if conv.listed < 0:
            return  # the runtime has not listed them yet: it will see them when it does
        with trio.move_on_after(REFRESH_WAIT_S):
            while conv.listed < conv.version:
                conv.listed_changed = trio.Event()
                await conv.listed_changed.wait()
        if conv.listed >= conv.version:
            return
        reopened = await self.service.reopen_later(cid)
        log.info("host_tools.refresh", conversation=cid, version=conv.version, listed=conv.listed, reopened=reopened)

    def forget(self, cid: str) -> None:
        """Drop conversation ``cid``'s registrations (it was removed); its waiting calls fail."""
        conv = self._by_conv.pop(cid, None)
        if conv is not None:
            for tool in conv.tools.values():
                for call in tool.queue:
                    self._finish(call, "agentd: the conversation was removed", error=True)

    async def unregister(self, conn: Any, req: wire.UnregisterTool) -> None:
        """Stop offering ``req.name``; its waiting calls fail. Raises NotFound."""
        cid = self._resolve(req.conversation)
        conv = self._conv(cid)
        tool = conv.tools.pop(req.name, None)
        if tool is None:
            raise c.NotFound(f"no host tool {req.name!r} on {cid}")
        for call in tool.queue:
            self._finish(call, f"host tool {req.name!r} was withdrawn", error=True)
        conv.bump()

    async def next_call(self, conn: Any, req: wire.NextToolCall) -> wire.HostToolCallInfo | None:
        """The next call of a tool ``conn`` serves, waiting at most ``req.wait_s``; None when none came.
        Raises NotFound (no such tool), Invalid (another connection serves it now)."""
        cid = self._resolve(req.conversation)
        conv = self._conv(cid)
        with trio.move_on_after(req.wait_s):
            while True:
                tool = conv.tools.get(req.name)
                if tool is None:
                    raise c.NotFound(f"no host tool {req.name!r} on {cid} (register it first)")
                if tool.conn is not conn:
                    raise c.Invalid(f"host tool {req.name!r} is served by another client now")
                while tool.queue and not _gone(conn):  # a client gone meanwhile takes nothing more
                    call = tool.queue.popleft()
                    if call.done.is_set():
                        continue
                    call.taker = conn
                    call.taken.set()
                    return wire.HostToolCallInfo(conversation=cid, call_id=call.id, name=call.name,
                                                 arguments=call.arguments)
                tool.arrived = trio.Event()
                await tool.arrived.wait()
        return None

    async def result(self, conn: Any, req: wire.ToolResult) -> None:
        """Answer a call taken with ``next_tool_call``. Raises NotFound (unknown or already ended call)."""
        cid = self._resolve(req.conversation)
        call = self._conv(cid).calls.get(req.call_id)
        if call is None or call.done.is_set():
            raise c.NotFound(f"no pending host tool call {req.call_id!r} (it ended, or timed out)")
        self._finish(call, req.output, error=req.error)

    # ------------------------------------------------------------------ the relay's side

    async def list(self, req: wire.ListHostTools) -> wire.HostToolList:
        """The tools; when ``req.after`` is the current version, waits (``req.wait_s``) for a change."""
        cid = self._resolve(req.conversation)
        conv = self._conv(cid)
        if req.listing:
            conv.listed = conv.version
            conv.listed_changed.set()
            log.info("host_tools.listed", conversation=cid, version=conv.version, tools=len(conv.tools))
        if req.after == conv.version and req.wait_s > 0:
            with trio.move_on_after(req.wait_s):
                await conv.changed.wait()
        tools = [msgspec.structs.replace(t.info, served=t.ready and not _gone(t.conn)) for t in conv.tools.values()]
        return wire.HostToolList(conversation=cid, version=conv.version, tools=tools)

    async def call(self, req: wire.CallHostTool) -> wire.HostToolCallResult:
        """One call from the agent (via the relay): journaled as a tool item, handed to the serving
        client, answered with its result; an error result when no client answers within the timeout."""
        cid = self._resolve(req.conversation)
        if self.service.record(cid).state is wire.ConversationState.CLOSED:
            return wire.HostToolCallResult(output=f"agentd: conversation {cid} is closed", error=True)
        conv = self._conv(cid)
        tool = conv.tools.get(req.name)
        if tool is None:
            return wire.HostToolCallResult(output=f"agentd: no host tool {req.name!r} is registered", error=True)
        if len(conv.calls) >= MAX_CALLS_IN_FLIGHT:
            log.warning("host_tools.too_many_calls", conversation=cid, tool=req.name, limit=MAX_CALLS_IN_FLIGHT)
            return wire.HostToolCallResult(output=f"agentd: {MAX_CALLS_IN_FLIGHT} host tool calls of this conversation "
                                                  "are in flight already; call again once one has ended", error=True)
        call = _Call(req.name, dict(req.arguments))
        # Display text, cut as every provider cuts a tool's input (the serving client gets it whole);
        # made before the call takes a slot, which only the finally below gives back.
        arguments = bound(json.dumps(call.arguments, ensure_ascii=False))
        conv.calls[call.id] = call
        try:
            live = await self.service.live(cid)
        except BaseException:
            conv.calls.pop(call.id, None)
            raise
        item_id = f"host-{call.id}"
        started = c.utcnow()
        timeout = self.config.host_tool_timeout_s
        try:
            await self._journal(live, c.Item(id=item_id, kind=c.ItemKind.TOOL, time=started, tool=c.ToolCall(
                name=req.name, title=f"host tool {req.name}", input=arguments, status=c.ToolStatus.RUNNING)))
            tool.queue.append(call)
            tool.arrived.set()
            with trio.move_on_after(timeout):
                await call.done.wait()
            if not call.taken.is_set():
                self._finish(call, f"agentd: host tool {req.name!r} got no answer within {timeout:g} s: "
                                   "the client serving it is gone or busy", error=True)
            elif _gone(call.taker):
                self._finish(call, f"agentd: the client serving host tool {req.name!r} went away "
                                   f"and no answer came within {timeout:g} s", error=True)
            else:
                self._finish(call, f"agentd: the client serving host tool {req.name!r} took the call but did not "
                                   f"answer within {timeout:g} s ([mcp] host_tool_timeout_s)", error=True)
        finally:
            conv.calls.pop(call.id, None)
            # The agent gave up (its relay went away): no client takes it from the queue after this.
            self._finish(call, "agentd: the call was cancelled", error=True)
            with trio.CancelScope(shield=True):
                result = call.result or wire.HostToolCallResult(output="agentd: the call was cancelled", error=True)
                await self._journal(live, c.Item(
                    id=item_id, kind=c.ItemKind.TOOL, time=started, ended_at=c.utcnow(), tool=c.ToolCall(
                        name=req.name, title=f"host tool {req.name}", input=arguments,
                        status=c.ToolStatus.FAILED if result.error else c.ToolStatus.COMPLETED,
                        output=_bound(result.output, self.config.host_tool_result_bytes),
                        cut=max(0, len(result.output.encode()) - self.config.host_tool_result_bytes))))
        log.info("host_tools.call_ended", conversation=cid, tool=req.name, call=call.id, error=result.error)
        return result

    def _finish(self, call: _Call, output: str, *, error: bool) -> None:
        if not call.done.is_set():
            call.result = wire.HostToolCallResult(output=output, error=error)
            call.done.set()

    async def _journal(self, live: Any, item: c.Item) -> None:
        try:
            await self.service.journal(live, "item", _json.encode(item))
        except c.InternalError:
            pass  # the journal refused it: logged by the service; the call goes on
        except trio.ClosedResourceError:
            pass  # the conversation was removed meanwhile: nothing to journal into; the call goes on


def _bound(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes (never inside a character)."""
    data = text.encode()
    return text if len(data) <= limit else data[:limit].decode("utf-8", "ignore")
