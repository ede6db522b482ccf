"""agentctl status, providers, models: the daemon and what it offers."""

from __future__ import annotations

import click
import msgspec

from agentd import wire

from ..cli import _json, _opts, _style, common


@click.command()
@common
def status() -> None:
    """Show the daemon: version, pid, uptime, paths, conversations."""
    o = _opts()
    r = o.client().call(wire.Status, wire.StatusResult)
    if o.json:
        return _json(r)
    from ..render import duration

    click.echo(f"agentd {r.version} (protocol {r.protocol}), pid {r.pid}, up {duration(r.uptime_s)}")
    click.echo(f"socket:        {r.socket}")
    click.echo(f"state dir:     {r.state_dir}")
    click.echo(f"conversations: {r.conversations} ({r.running} running)")
    click.echo(f"providers:     {', '.join(r.providers) or '-'}")


@click.command()
@common
def providers() -> None:
    """List providers, whether each is available, and what it supports.

    --json: {"providers": [ProviderInfo, ...]}.
    """
    o = _opts()
    infos = o.client().call(wire.Providers, list[wire.ProviderInfo])
    if o.json:
        return _json({"providers": infos})
    from ..render import table

    rows = []
    for p in infos:
        caps = msgspec.structs.asdict(p.capabilities)
        supported = ", ".join(k.rstrip("_") for k, v in caps.items() if v) or "-"
        state = "available" if p.available else f"unavailable: {p.error}" if p.error else "unavailable"
        rows.append([p.name, state, supported])
    click.echo(table(rows, ["NAME", "STATUS", "SUPPORTS"], _style()))


@click.command()
@click.argument("provider")
@common
def models(provider: str) -> None:
    """List the models PROVIDER offers.

    --json: {"provider": PROVIDER, "models": [Model, ...]}.
    """
    o = _opts()
    ms = o.client().call(wire.Models, list[wire.Model], provider=provider)
    if o.json:
        return _json({"provider": provider, "models": ms})
    from ..render import table

    rows = [[m.id, m.name, ", ".join(m.efforts)] for m in ms]
    click.echo(table(rows, ["ID", "NAME", "EFFORTS"], _style()))
