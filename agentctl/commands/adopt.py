"""agentctl import: list a runtime's earlier sessions for a folder, or adopt one (agentd.adopt)."""

from __future__ import annotations

import os

import click

from agentd import wire
from agentd.termsafe import visible_name

from ..cli import _json, _opts, _style, common


@click.command("import")
@click.argument("session", required=False)
@click.option("--provider", "-p", required=True, help="The provider whose runtime keeps the sessions.")
@click.option("--cwd", "workdir", type=click.Path(exists=True, file_okay=False, resolve_path=True), default=None,
              help="The folder the sessions were recorded for (default: the current directory).")
@click.option("--force", is_flag=True, help="Adopt a session even while another client holds it open.")
@common
def import_(session: str | None, provider: str, workdir: str | None, force: bool) -> None:
    """List the sessions PROVIDER's runtime recorded for a folder, or adopt SESSION.

    Without SESSION: the runtime's sessions for the folder that no agentd
    conversation is bound to, newest first, with whether another client holds
    each open (in_use: true, false or unknown). --json: {"provider", "workdir",
    "in_use_check", "sessions": [{"id", "in_use", "title", "workdir",
    "created_at", "updated_at"}]}.

    With SESSION: a new conversation bound to exactly that runtime session; its
    earlier turns are in its history (marked imported) and its next prompt
    continues the session. Nothing is sent. A session in use is refused (exit 7)
    unless --force; a session that is gone is not found (exit 6). --json:
    {"conversation": record, "session", "in_use", "items", "history"}.

    \b
    Examples:
      agentctl import -p claude --cwd ~/src/app
      agentctl import -p claude --cwd ~/src/app 5f0c2d1e-... --force
    """
    o = _opts()
    workdir = workdir or os.getcwd()
    if force and not session:
        raise click.UsageError("--force goes with a SESSION to adopt")
    client = o.client()
    if session:
        res = client.call(wire.ImportSession, wire.ImportResult, provider=provider, session=session,
                          workdir=workdir, force=force)
        if o.json:
            return _json(res)
        past = (f"{res.items} earlier item(s) in its history" if res.history
                else "the runtime resumes it but cannot show its earlier turns")
        click.echo(res.conversation.id)
        style = _style()
        click.echo(style.dim(f"adopted {provider} session {visible_name(res.session)}: {past}; "
                             f"next: agentctl send {res.conversation.id} TEXT"), err=True)
        return
    res = client.call(wire.ImportList, wire.ImportListResult, provider=provider, workdir=workdir)
    if o.json:
        return _json(res)
    if not res.sessions:
        click.echo(f"no {provider} sessions recorded for {visible_name(res.workdir)} outside agentd", err=True)
        return
    from ..render import table

    def in_use(v: wire.InUse) -> str:
        return "yes" if v is True else "no" if v is False else "unknown"

    rows = [[s.id, (s.updated_at or s.created_at)[:16].replace("T", " ") or "-", in_use(s.in_use), s.title or "-"]
            for s in res.sessions]
    style = _style()
    click.echo(table(rows, ["SESSION", "UPDATED", "IN USE", "TITLE"], style))
    click.echo(style.dim(f"adopt one: agentctl import -p {provider} --cwd {visible_name(res.workdir)} SESSION"), err=True)
