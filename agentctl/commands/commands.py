"""agentctl's runtime-command commands: commands and command (slash commands and skills),
subagents and subagent cancel / prompt (the agents a conversation's main agent started)."""

from __future__ import annotations

from typing import Any

import click

from agentd import wire
from agentd.termsafe import visible_name

from ..cli import _exit, _interactive, _json, _ok_json, _opts, _style, _text_arg, common
from .conversations import _follow, _follow_options, _with


@click.command("commands")
@click.argument("conversation")
@common
def commands(conversation: str) -> None:
    """List the slash commands and skills CONVERSATION's runtime offers.

    Only commands that become a prompt are listed (skills and prompt commands),
    never the runtime's local ones. Opens the conversation on its runtime if it
    is not. --json: {"conversation", "provider", "commands": [{"name", "kind",
    "description", "input_hint"}]}. Exits 1 (unsupported) on a provider without
    commands.

    \b
    Examples:
      agentctl commands c3f9
      agentctl commands c3f9 --json | jq -r '.commands[].name'
    """
    from ..render import shorten, table

    o = _opts()
    res = o.client().call(wire.ListCommands, wire.CommandList, conversation=conversation)
    if o.json:
        return _json(res)
    if not res.commands:
        click.echo(f"{visible_name(res.provider)} offers no commands in {res.conversation}")
        return
    rows = [[f"/{cmd.name}", cmd.kind, cmd.input_hint, shorten(cmd.description, 70)]
            for cmd in res.commands]
    click.echo(table(rows, ["COMMAND", "KIND", "ARGS", "DESCRIPTION"], _style()))


@click.command("command")
@click.argument("conversation")
@click.argument("name")
@click.argument("args", nargs=-1)
@click.option("--if-busy", type=click.Choice(["reject", "queue", "interrupt"]), default="reject",
              show_default=True, help="What to do when a turn is running (reject exits 7).")
@click.option("--follow", "-f", is_flag=True, help="Follow the turn until it ends; exit with its outcome.")
@_with(_follow_options)
@common
def command(conversation: str, name: str, args: tuple[str, ...], if_busy: str, follow: bool, no_input: bool,
            exit_on_action: bool) -> None:
    """Run command NAME (with ARGS) as a turn: the same as send CONVERSATION "/NAME ARGS".

    A NAME the runtime does not offer exits 8, listing what it offers (agentctl
    commands CONVERSATION). Without --follow it returns once agentd took it
    (--json: run, disposition, after); with --follow it streams the turn and
    exits 0 completed, 1 failed, 3 cancelled.

    \b
    Examples:
      agentctl command c3f9 review the tests
      agentctl command c3f9 init --follow
    """
    o = _opts()
    text = " ".join(args)

    def run_it() -> wire.SendResult:
        return o.client().call(wire.RunCommand, wire.SendResult, conversation=conversation, name=name, args=text,
                               if_busy=if_busy)

    if not follow:
        res = run_it()
        if o.json:
            return _json(res)
        click.echo(f"run {res.run}: {res.disposition}")
        return
    from ..follow import FROM_NOW

    _exit(_follow(conversation, FROM_NOW, send=lambda: run_it().run, interactive=_interactive(no_input),
                  exit_on_action=exit_on_action))


@click.command("subagents")
@click.argument("conversation")
@common
def subagents(conversation: str) -> None:
    """List CONVERSATION's subagents with their status (from its journal; starts no runtime).

    --json: {"conversation", "subagents": [{"id", "name", "status", ...}]}.

    \b
    Examples:
      agentctl subagents c3f9
      agentctl subagents c3f9 --json
    """
    from ..render import shorten, table

    o = _opts()
    res = o.client().call(wire.ListSubagents, wire.SubagentList, conversation=conversation)
    if o.json:
        return _json(res)
    if not res.subagents:
        click.echo(f"no subagents in {res.conversation}")
        return
    rows = [[s.id, s.name, s.status.value, shorten(s.description or s.error, 60)]
            for s in res.subagents]
    click.echo(table(rows, ["AGENT", "NAME", "STATUS", "DESCRIPTION"], _style()))


@click.group("subagent")
def subagent() -> None:
    """Control one subagent of a conversation (where its runtime can)."""


@subagent.command("cancel")
@click.argument("conversation")
@click.argument("agent")
@common
def subagent_cancel(conversation: str, agent: str) -> None:
    """Stop only subagent AGENT; the main agent and other subagents go on.

    Exits 6 when no such subagent is known, 1 (unsupported) when the runtime
    cannot stop one subagent. --json: {"ok", "conversation", "agent"}.

    \b
    Examples:
      agentctl subagent cancel c3f9 agent-1
    """
    o = _opts()
    o.client().call(wire.CancelSubagent, Any, conversation=conversation, agent=agent)
    if o.json:
        return _ok_json(conversation=conversation, agent=agent)
    click.echo(f"subagent {agent}: cancel sent")


@subagent.command("prompt")
@click.argument("conversation")
@click.argument("agent")
@click.argument("text")
@common
def subagent_prompt(conversation: str, agent: str, text: str) -> None:
    """Send TEXT (TEXT - reads stdin) to idle subagent AGENT; it is not a turn of the conversation.

    Exits 6 when no such subagent is known, 8 when it is not idle, 1
    (unsupported) when the runtime cannot talk to a subagent.

    \b
    Examples:
      agentctl subagent prompt c3f9 agent-1 "also check the docs"
      echo 'go on' | agentctl subagent prompt c3f9 agent-1 -
    """
    o = _opts()
    o.client().call(wire.PromptSubagent, Any, conversation=conversation, agent=agent, text=_text_arg(text))
    if o.json:
        return _ok_json(conversation=conversation, agent=agent)
    click.echo(f"subagent {agent}: prompt sent")
