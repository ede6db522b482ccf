"""agentctl's host tool commands: tool serve (offer a command as a tool to a conversation's agent), tool ls."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import click

from agentd import wire
from agentd.contract import NotFound

from ..cli import _err, _json, _notice, _opts, _style, common

#: bytes of a command's stdout returned to the agent at most (agentd journals a bounded part)
MAX_OUTPUT = 1 << 20


@click.group("tool")
def tool() -> None:
    """Host tools: commands served from here that a conversation's agent may call (docs/mcp.md)."""


@tool.command("serve", context_settings={"ignore_unknown_options": True})
@click.argument("conversation")
@click.option("--name", required=True, help="The tool's name (letters, digits, - and _).")
@click.option("--description", default="", help="What the tool does, for the model.")
@click.option("--schema", "schema_file", type=click.File("r"), default=None,
              help="JSON Schema file of the call's arguments (an object schema); default: any object.")
@click.argument("command", nargs=-1, required=True)
@common
def serve(conversation: str, name: str, description: str, schema_file: Any, command: tuple[str, ...]) -> None:
    """Offer COMMAND to CONVERSATION's agent as tool NAME, until interrupted.

    Each call runs COMMAND (no shell) with the call's arguments as one JSON
    object on stdin; its stdout is the result the agent gets. A non-zero exit
    makes the result an error (with stderr). Calls are served one at a time.
    Needs `[mcp] host_tools = true` and an MCP-capable provider. --json: one
    line per call, {"call_id", "name", "arguments", "exit_code", "error"}.
    Exits 130 on Ctrl-C, 6 when the conversation is gone, 8 for a refused name
    or schema, 1 (unsupported) when host tools are off or the provider cannot
    take MCP servers.

    \b
    Examples:
      agentctl tool serve c3f9 --name stamp --description 'Stamp a file' --schema stamp.json -- ./stamp.sh
    """
    schema = None
    if schema_file is not None:
        try:
            schema = json.load(schema_file)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--schema") from None
        if not isinstance(schema, dict):
            raise click.BadParameter("not a JSON object", param_hint="--schema")
    o = _opts()
    client = o.client()
    info = client.call(wire.RegisterTool, wire.HostToolInfo, conversation=conversation, name=name,
                       description=description, input_schema=schema)
    if not o.json:
        _err(f"serving tool {info.name!r} on {conversation} (Ctrl-C stops)")
    while True:
        call = client.call(wire.NextToolCall, wire.HostToolCallInfo | None, conversation=conversation, name=name,
                           wait_s=30.0)
        if call is None:
            continue
        output, error, code = _run(list(command), call.arguments)
        try:
            client.call(wire.ToolResult, None, conversation=call.conversation, call_id=call.call_id, output=output,
                        error=error)
        except NotFound as exc:  # the call ended meanwhile (withdrawn): the next one may still come
            _notice(str(exc))
            continue
        if o.json:
            _json({"call_id": call.call_id, "name": call.name, "arguments": call.arguments, "exit_code": code,
                   "error": error})
        else:
            click.echo(f"{call.call_id}: {call.name} -> exit {code}" + (" (error)" if error else ""))


def _run(command: list[str], arguments: dict[str, Any]) -> tuple[str, bool, int]:
    """(output, error, exit code) of one call of ``command``."""
    try:
        proc = subprocess.run(command, input=json.dumps(arguments), capture_output=True, text=True, errors="replace")
    except OSError as exc:
        return f"the tool's command could not run: {exc}", True, 127
    out = proc.stdout[:MAX_OUTPUT]
    if proc.returncode != 0:
        detail = proc.stderr.strip()[-4000:]
        return (out + ("\n" if out and detail else "") + detail) or f"exit {proc.returncode}", True, proc.returncode
    return out, False, 0


@tool.command("ls")
@click.argument("conversation")
@common
def ls(conversation: str) -> None:
    """List CONVERSATION's host tools and whether a client serves each now.

    --json: {"conversation", "version", "tools": [{"name", "description", "input_schema", "served"}]}.

    \b
    Examples:
      agentctl tool ls c3f9
      agentctl tool ls c3f9 --json
    """
    o = _opts()
    res = o.client().call(wire.ListHostTools, wire.HostToolList, conversation=conversation)
    if o.json:
        return _json(res)
    if not res.tools:
        _err(f"{res.conversation} has no host tools (agentctl tool serve offers one)")
        return
    from ..render import table

    rows = [[t.name, "yes" if t.served else "no", t.description or "-"] for t in res.tools]
    click.echo(table(rows, ["NAME", "SERVED", "DESCRIPTION"], _style()))
    sys.stdout.flush()
