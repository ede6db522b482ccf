"""agentctl's MCP commands: mcp ls (the configured servers), mcp status (a conversation's servers)."""

from __future__ import annotations

import click

from agentd import wire

from ..cli import _err, _json, _opts, _style, common


@click.group("mcp")
def mcp() -> None:
    """MCP servers: those agentd.toml configures, and their state in a conversation."""


@mcp.command("ls")
@common
def mcp_ls() -> None:
    """List the MCP servers of agentd.toml ([mcp.servers.NAME]).

    Never shows a secret: env and headers are listed by name only. DEFAULT FOR
    names the providers whose new conversations get the server when `agentctl
    new` names none. --json: {"servers": [{"name", "transport", "command",
    "args", "url", "env", "headers", "default_for"}], "host_tool_timeout_s"}.

    \b
    Examples:
      agentctl mcp ls
      agentctl mcp ls --json
    """
    o = _opts()
    res = o.client().call(wire.McpList, wire.McpListResult)
    if o.json:
        return _json(res)
    if not res.servers:
        _err("no MCP servers configured (add [mcp.servers.<name>] to agentd.toml)")
        return
    from ..render import table

    rows = []
    for s in res.servers:
        what = s.url if s.transport == "http" else " ".join([s.command, *s.args])
        keys = ", ".join([*s.env, *s.headers]) or "-"
        rows.append([s.name, s.transport, what, ", ".join(s.default_for) or "-", keys])
    click.echo(table(rows, ["NAME", "TRANSPORT", "COMMAND / URL", "DEFAULT FOR", "SECRETS/ENV"], _style()))


@mcp.command("status")
@click.argument("conversation")
@common
def mcp_status(conversation: str) -> None:
    """Show each MCP server of CONVERSATION as its runtime reports it.

    STATE is connected, failed (with the reason), pending, disabled, or unknown
    (the runtime does not report its servers). Opens the conversation on its
    runtime when it is not open. --json: {"conversation", "provider",
    "servers": [{"name", "state", "error", "tools"}], "reported"}.

    \b
    Examples:
      agentctl mcp status c3f9
      agentctl mcp status c3f9 --json
    """
    o = _opts()
    res = o.client().call(wire.McpStatus, wire.McpStatusResult, conversation=conversation)
    if o.json:
        return _json(res)
    if not res.servers:
        _err(f"{res.conversation} has no MCP servers")
        return
    from ..render import table

    rows = [[s.name, s.state, "-" if s.tools is None else (", ".join(s.tools) or "none"), s.error or "-"]
            for s in res.servers]
    click.echo(table(rows, ["NAME", "STATE", "TOOLS", "ERROR"], _style()))
    if not res.reported:
        _err(f"{res.provider} does not report its MCP servers' states")
