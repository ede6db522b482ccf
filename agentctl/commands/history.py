"""agentctl's history commands: history (a page of a conversation's items, from agentd's journal)."""

from __future__ import annotations

import sys

import click

from agentd import wire

from ..cli import _json, _opts, common


@click.command()
@click.argument("conversation")
@click.option("--limit", "-n", type=click.IntRange(1, 1000), default=50, show_default=True,
              help="Items on the page.")
@click.option("--before", type=click.IntRange(min=1), default=None, metavar="SEQ",
              help="The page of items just older than journal seq SEQ.")
@click.option("--after", type=click.IntRange(min=0), default=None, metavar="SEQ",
              help="The page of items just newer than journal seq SEQ (0: from the start).")
@click.option("--all", "all_", is_flag=True, help="Also the turns a rewind dropped, marked [dropped].")
@common
def history(conversation: str, limit: int, before: int | None, after: int | None, all_: bool) -> None:
    """Page through a conversation's items (prompts, messages, tools), newest page first.

    Read from agentd's journal: nothing is sent and the conversation is not
    opened on its runtime. Each item appears once, in its latest form, tagged
    with the journal seq of that form; the footer names the cursor of the
    next page. Turns a rewind dropped are left out unless --all. --json:
    {"conversation", "items": [{"seq", "run", "item", "dropped", "copied"}],
    "before", "after", "start", "end"} (a cursor of 0: no page that way).

    \b
    Examples:
      agentctl history c3f9 --limit 20
      agentctl history c3f9 --before 120 --json
    """
    if before is not None and after is not None:
        raise click.UsageError("give at most one of --before and --after")
    o = _opts()
    cursor = {"before": before} if before is not None else {"after": after} if after is not None else {}
    page = o.client().call(wire.History, wire.HistoryPage, conversation=conversation, limit=limit, all=all_,
                           **cursor)
    if o.json:
        return _json(page)
    from ..render import Renderer

    ren = Renderer(sys.stdout, seq=True, answer_hints=False)
    ren.conversation = page.conversation  # named in the command that shows a cut output whole
    if any(e.item.agent_id for e in page.items):
        # Subagents by name, as the live view shows them (the records that name them may lie off this page).
        subs = o.client().call(wire.ListSubagents, wire.SubagentList, conversation=page.conversation)
        ren.know_subagents(subs.subagents)
    for entry in page.items:
        ren.history_entry(entry)
    ren.flush()
    if not page.items:
        click.echo("no items", err=True)
    from ..render import Style, use_color

    style = Style(use_color(sys.stderr))
    if page.before:
        click.echo(style.dim(f"older: agentctl history {conversation} --before {page.before}"), err=True)
    if page.after:
        click.echo(style.dim(f"newer: agentctl history {conversation} --after {page.after}"), err=True)
