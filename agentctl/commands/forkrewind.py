"""agentctl's branching commands: fork (a new conversation off one turn) and rewind (go back to one)."""

from __future__ import annotations

import click

from agentd import wire
from agentd.termsafe import visible

from ..cli import _json, _opts, _style, common


def _turn(t: wire.BranchRun) -> str:
    prompt = f"  {visible(t.prompt)!r}" if t.prompt else ""
    return f"{t.run} ({t.state or 'running'}, seq {t.seq}){prompt}"


@click.command("fork")
@click.argument("conversation")
@click.option("--at", "at", default="", metavar="RUN",
              help="Fork after this turn: a run id, a unique prefix, or a turn number (1 = the first; "
                   "default: the last completed turn).")
@click.option("--title", default="", help="Title of the new conversation (default: the source's, marked (fork)).")
@common
def fork(conversation: str, at: str, title: str) -> None:
    """Make a new conversation holding CONVERSATION's history up to and including turn RUN.

    Same provider, made by the runtime's own fork; no prompt is sent again. The new
    journal begins with a `forked` record naming the source, run and seq, then the
    copied records. Exits 1 (unsupported) where the provider cannot fork, 6 (not
    found) for an unknown run, 8 (invalid) for a turn its runtime never recorded.
    --json: {"conversation": record, "source", "run", "seq", "copied", "turns"}.

    \b
    Examples:
      agentctl fork c3f9
      agentctl fork c3f9 --at 2 --title 'try another way'
    """
    o = _opts()
    res = o.client().call(wire.Fork, wire.ForkResult, conversation=conversation, at=at, title=title)
    if o.json:
        return _json(res)
    click.echo(f"{res.conversation.id}: forked from {res.source} at run {res.run} (seq {res.seq}), "
               f"{len(res.turns)} turn(s), {res.copied} record(s) copied")


@click.command("rewind")
@click.argument("conversation")
@click.option("--to", "to", required=True, metavar="RUN",
              help="The last turn to keep: a run id, a unique prefix, or a turn number (1 = the first).")
@click.option("--preview", is_flag=True, help="List what would be dropped; change nothing.")
@common
def rewind(conversation: str, to: str, preview: bool) -> None:
    """Discard CONVERSATION's turns after RUN, in the runtime and in agentd's view.

    The journal keeps everything: a `rewind` record names the kept run and the
    dropped ones; history, tail, attach and export leave the dropped turns out
    (--all shows them, marked). Exits 7 (busy) while a turn runs, 1 (unsupported)
    where the provider cannot rewind, 8 (invalid) when nothing follows RUN.
    --json: {"conversation", "kept", "dropped", "preview", "seq"}.

    \b
    Examples:
      agentctl rewind c3f9 --to 1 --preview
      agentctl rewind c3f9 --to r1a2b3c --json
    """
    o = _opts()
    res = o.client().call(wire.Rewind, wire.RewindResult, conversation=conversation, to=to, preview=preview)
    if o.json:
        return _json(res)
    s = _style()
    head = "would drop" if res.preview else "dropped"
    click.echo(f"{res.conversation}: {head} {len(res.dropped)} turn(s) after {_turn(res.kept)}")
    for t in res.dropped:
        click.echo(s.dim(f"  - {_turn(t)}"))
    if res.preview:
        click.echo(s.dim(f"nothing changed; run agentctl rewind {res.conversation} --to {res.kept.run} to do it"))
