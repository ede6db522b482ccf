"""agentctl's checkpoint commands: diff (what a turn changed in the working directory) and revert
(put it back), from agentd's own per-turn checkpoints, on every provider."""

from __future__ import annotations

import sys

import click

from agentd import wire
from agentd.termsafe import visible, visible_name

from .. import exitcodes
from ..cli import _exit, _json, _opts, _report, common

_SIGN = {"added": "A", "modified": "M", "deleted": "D", "type_changed": "T"}
_ACTION = {"restore": "restore", "create": "create ", "delete": "delete "}


@click.command()
@click.argument("conversation")
@click.option("--run", "-r", default="", metavar="RUN",
              help="The turn (its run id, a prefix of it, or its number N: 1 the first) or revert (its id) "
                   "to show; default: the last one.")
@click.option("--stat", is_flag=True, help="Files and line counts only.")
@common
def diff(conversation: str, run: str, stat: bool) -> None:
    """Show what a turn of CONVERSATION changed in its working directory, as a unified diff.

    From agentd's own checkpoints, taken before and after every turn on every
    provider ([checkpoints] in agentd.toml). A turn still running shows its
    changes so far. Exits 6 when the conversation, the run or its checkpoint
    is not found. --json: {"conversation", "run", "kind", "after", "files":
    [{"path", "status", "old_mode", "new_mode", "binary", "additions",
    "deletions", "hunks": [{"old_start", "old_lines", "new_start",
    "new_lines", "section", "lines"}]}], "patch", "truncated", "too_large",
    "runtime_diff"} (runtime_diff: the diff the runtime itself reported, if any).

    \b
    Examples:
      agentctl diff c3f9
      agentctl diff c3f9 --run r1a2b3c --stat
      agentctl diff c3f9 --run 2             # the second turn
      agentctl diff c3f9 --json | jq '.files[].path'
    """
    o = _opts()
    res = o.client().call(wire.Diff, wire.DiffResult, conversation=conversation, run=run, stat=stat)
    if o.json:
        return _json(res)
    from ..render import Style, use_color

    style = Style(use_color(sys.stdout))
    if stat or not res.patch:
        width = max((len(visible_name(f.path)) for f in res.files), default=0)
        for f in res.files:
            counts = "binary" if f.binary else f"{style.green('+' + str(f.additions))} {style.red('-' + str(f.deletions))}"
            click.echo(f" {_SIGN[f.status]} {visible_name(f.path).ljust(width)} | {counts}")
    else:
        for line in res.patch.splitlines():
            text = visible(line)
            if line.startswith(("+++", "---", "diff --git", "index ", "new file", "deleted file")):
                text = style.bold(text)
            elif line.startswith("+"):
                text = style.green(text)
            elif line.startswith("-"):
                text = style.red(text)
            elif line.startswith("@@"):
                text = style.cyan(text)
            click.echo(text)
    estyle = Style(use_color(sys.stderr))
    what = f"{res.kind} {res.run}" + (" (running: changes so far)" if res.after == "now" else "")
    if not res.files:
        click.echo(estyle.dim(f"{what}: no file changed"), err=True)
    else:
        adds = sum(f.additions for f in res.files)
        dels = sum(f.deletions for f in res.files)
        click.echo(estyle.dim(f"{what}: {len(res.files)} file{'s' if len(res.files) != 1 else ''} changed, "
                              f"+{adds} -{dels}"), err=True)
    if res.truncated:
        click.echo(estyle.yellow("the diff is too big to show whole: later files are listed without hunks "
                                 "(agentctl diff --stat)"), err=True)
    if res.runtime_diff:
        click.echo(estyle.dim("the runtime reported its own diff of this turn too (agentctl diff --json: runtime_diff)"),
                   err=True)
    if res.too_large:
        click.echo(estyle.dim("not recorded (too big, or a nested repository): "
                              + ", ".join(visible_name(p) for p in res.too_large)), err=True)


@click.command()
@click.argument("conversation")
@click.option("--run", "-r", required=True, metavar="RUN",
              help="The turn (its run id, a prefix of it, or its number N: 1 the first) or revert (its id) "
                   "whose changes to undo.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask; needed when stdin is not a terminal.")
@click.option("--dry-run", is_flag=True, help="Only say what would change.")
@common
def revert(conversation: str, run: str, yes: bool, dry_run: bool) -> None:
    """Restore the files turn RUN of CONVERSATION changed to how they were before it.

    Only the files that turn changed are touched (written back, or removed
    when it created them). Shows what will change and asks first; without a
    terminal pass --yes. The revert is journaled as a step of its own: revert
    its id to undo it. Exits 7 while a turn runs, 6 when the conversation,
    the run or its checkpoint is not found, 2 when it needs --yes.
    A file changed after the step (a later turn, by hand) is marked "changed
    since": the revert undoes that change too.
    --json: {"conversation", "run", "files": [{"path", "action",
    "changed_since"}], "revert", "dry_run"} (action: restore, create, delete).

    \b
    Examples:
      agentctl revert c3f9 --run r1a2b3c
      agentctl revert c3f9 --run r1a2b3c --dry-run --json
      agentctl revert c3f9 --run r1a2b3c --yes
    """
    o = _opts()
    client = o.client()
    plan = client.call(wire.Revert, wire.RevertResult, conversation=conversation, run=run, dry_run=True)
    if dry_run or not plan.files:
        if o.json:
            return _json(plan)
        if not plan.files:
            click.echo(f"{plan.run}: nothing to revert (the files are as they were before it)", err=True)
            return
        for f in plan.files:
            click.echo(_line(f))
        _warn_changed_since(plan)
        click.echo(f"dry run: reverting {plan.run} would change "
                   + (f"these {len(plan.files)} files" if len(plan.files) != 1 else "this file")
                   + "; nothing changed", err=True)
        return
    if not yes:
        if not (sys.stdin.isatty() and not o.json):
            _report(exitcodes.USAGE, "revert changes files: pass --yes to do it without asking "
                                     "(or --dry-run to see what it would do)")
            _exit(exitcodes.USAGE)
        click.echo(f"Reverting {plan.run} changes {len(plan.files)} file{'s' if len(plan.files) != 1 else ''}:", err=True)
        for f in plan.files:
            click.echo(_line(f), err=True)
        _warn_changed_since(plan)
        if not click.confirm("Go on?", default=False, err=True):
            click.echo("nothing changed", err=True)
            _exit(1)
    res = client.call(wire.Revert, wire.RevertResult, conversation=conversation, run=run)
    if o.json:
        return _json(res)
    for f in res.files:
        click.echo(_line(f))
    if res.revert:
        click.echo(f"reverted {res.run} as {res.revert} (undo: agentctl revert {res.conversation} --run {res.revert})",
                   err=True)
    else:
        click.echo(f"{res.run}: nothing to revert", err=True)


def _line(f: wire.RevertedFile) -> str:
    return f"  {_ACTION[f.action]} {visible_name(f.path)}" + ("  (changed since)" if f.changed_since else "")


def _warn_changed_since(plan: wire.RevertResult) -> None:
    """Say that files changed after the step (by a later turn or by hand) lose those changes too."""
    since = sum(f.changed_since for f in plan.files)
    if since:
        which = "this file was" if len(plan.files) == 1 else f"{since} of these files {'were' if since > 1 else 'was'}"
        click.echo(f"{which} changed after {plan.run}: reverting undoes those changes too "
                   "(reverting the revert brings them back)", err=True)
