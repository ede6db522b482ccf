"""agentctl providers, models, account, login, logout, quota: what each provider offers, its
state and the command that fixes it, its sign-in and quota."""

from __future__ import annotations

import sys
from typing import Any

import click

from agentd import wire
from agentd.termsafe import visible, visible_name

from .. import exitcodes
from ..cli import Fail, _err, _json, _opts, _style, common

#: ``providers`` (narrow): the columns that fit 80 characters; the fix wraps under its provider.
_WIDTH = 80


def _caps(p: wire.ProviderInfo) -> str:
    import msgspec

    caps = msgspec.structs.asdict(p.capabilities)
    return ", ".join(k.rstrip("_") for k, v in caps.items() if v) or "-"


def _signed(a: Any) -> str:
    if a is None:
        return "-"
    if not a.signed_in:
        return "signed out"
    who = a.login or ""
    src = a.source + (f" ${a.env_var}" if a.env_var and a.source in ("env", "api_key", "byok") else "")
    return " ".join(x for x in (who, f"({src})" if src else "") if x) or "signed in"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 1)] + "…"


@click.group(invoke_without_command=True)
@click.option("--wide", is_flag=True, help="Every detail: capabilities, account, the error in full.")
@common
@click.pass_context
def providers(ctx: click.Context, wide: bool) -> None:
    """List providers: each one's state and the exact command that fixes it.

    \b
    States: available (a turn can run now: installed, and signed in or a key
    present), needs_sign_in, not_installed, misconfigured. The output fits 80
    columns; --wide (or `agentctl providers show NAME`) gives the details.

    \b
    Examples:
      agentctl providers
      agentctl providers show copilot
      agentctl providers --json | jq '.providers[] | {name, state, fix}'

    --json: {"providers": [ProviderInfo, ...]} with every field (state, fix,
    error, account, capabilities, available).
    """
    if ctx.invoked_subcommand is not None:
        return
    o = _opts()
    infos = o.client().call(wire.Providers, list[wire.ProviderInfo])
    if o.json:
        return _json({"providers": infos})
    from ..render import table

    style = _style()
    if wide:
        rows = [[p.name, p.state, _signed(p.account), _caps(p), p.fix or p.error or "-"] for p in infos]
        click.echo(table(rows, ["NAME", "STATE", "ACCOUNT", "SUPPORTS", "FIX"], style))
        return
    name_w = max([4, *(len(p.name) for p in infos)])
    rows = []
    for p in infos:
        rows.append([p.name, p.state, _clip(p.display_name, _WIDTH - name_w - 17)])
    lines = table(rows, ["NAME", "STATE", "RUNTIME"], style).splitlines()
    click.echo(lines[0])
    cut = False
    for p, line in zip(infos, lines[1:]):
        click.echo(line)
        if p.state != "available":
            why = p.error.splitlines()[0] if p.error else ""
            if why:
                shown = _clip(f"  why: {visible_name(why)}", _WIDTH)
                cut = cut or shown.endswith("…") or len(p.error.splitlines()) > 1
                click.echo(style.dim(shown))
            if p.fix:  # a command is never clipped: one too long for the table is behind `show`
                fix = f"  fix: {visible_name(p.fix)}"
                click.echo(fix if len(fix) <= _WIDTH else f"  fix: agentctl providers show {visible_name(p.name)}")
    if cut:
        click.echo(style.dim("(cut to 80 columns: agentctl providers --wide shows every line whole)"))


@providers.command("show")
@click.argument("name")
@common
def providers_show(name: str) -> None:
    """Everything about provider NAME: state, fix, account, capabilities.

    \b
    Example:
      agentctl providers show claude

    Exits 6 for an unknown provider. --json: the ProviderInfo.

    \b
    Examples:
      agentctl providers show claude
      agentctl providers show copilot --json
    """
    o = _opts()
    if not name.strip():  # "" asks agentd for every provider
        raise click.BadParameter("name a provider (agentctl providers lists them)", param_hint="NAME")
    infos = o.client().call(wire.Providers, list[wire.ProviderInfo], provider=name)
    p = infos[0]
    if o.json:
        return _json(p)
    click.echo(f"name:         {visible_name(p.name)}")
    click.echo(f"runtime:      {visible_name(p.display_name)}")
    click.echo(f"state:        {visible_name(p.state)}")
    if p.error:
        click.echo(f"why:          {visible(p.error)}")
    if p.fix:
        click.echo(f"fix:          {visible_name(p.fix)}")
    if p.account is not None:
        click.echo(f"account:      {visible_name(_signed(p.account))}")
        if p.account.message:
            click.echo(f"              {visible(p.account.message)}")
    click.echo(f"supports:     {_caps(p)}")


@click.command()
@click.argument("provider")
@common
def models(provider: str) -> None:
    """List the models PROVIDER offers: id, name, efforts, context tiers, cost tier.

    \b
    Example:
      agentctl models claude
      agentctl new -p claude -m sonnet --effort high --context-tier 1m

    --json: {"provider": PROVIDER, "models": [Model, ...]}.

    \b
    Examples:
      agentctl models claude
      agentctl models copilot --json | jq -r '.models[].id'
    """
    o = _opts()
    ms = o.client().call(wire.Models, list[wire.Model], provider=provider)
    if o.json:
        return _json({"provider": provider, "models": ms})
    from ..render import table

    rows = [[m.id, m.name, ",".join(m.efforts) or "-", ",".join(t.id for t in m.context_tiers) or "-",
             m.cost_tier or "-"] for m in ms]
    click.echo(table(rows, ["ID", "NAME", "EFFORTS", "CONTEXT", "COST"], _style()))


@click.command()
@click.argument("provider", required=False, default="")
@common
def account(provider: str) -> None:
    """Show whether PROVIDER (default: each that reports one) is signed in, as whom, and where the
    credential comes from (stored sign-in, the environment variable named, GitHub CLI, API key,
    bring-your-own-key); never the credential itself.

    \b
    Examples:
      agentctl account
      agentctl account copilot --json

    Exits 0 when every provider shown is signed in, 4 when one needs a sign-in (its fix is
    printed), 1 when PROVIDER reports no account. --json: {"accounts": [AccountInfo, ...]}.
    """
    o = _opts()
    infos = o.client().call(wire.AccountRequest, list[wire.AccountInfo], provider=provider)
    out_code = exitcodes.OK if all(i.account.signed_in for i in infos) else exitcodes.NEEDS_ACTION
    if o.json:
        _json({"accounts": infos})
        raise click.exceptions.Exit(out_code)
    from ..render import table

    rows = []
    for i in infos:
        a = i.account
        rows.append([i.provider, "yes" if a.signed_in else "no", a.login or "-", a.source or "-",
                     a.env_var or "-"])
    click.echo(table(rows, ["PROVIDER", "SIGNED IN", "LOGIN", "SOURCE", "ENV VAR"], _style()))
    for i in infos:
        if not i.account.signed_in:
            if i.account.message:
                click.echo(_style().dim(f"{visible_name(i.provider)}: {visible(i.account.message)}"))
            if i.fix:
                click.echo(f"{visible_name(i.provider)}: fix: {visible_name(i.fix)}")
    raise click.exceptions.Exit(out_code)


@click.command()
@click.argument("provider")
@click.option("--device", is_flag=True, help="Sign in through the device flow: enter a code in a browser anywhere.")
@click.option("--with-token", is_flag=True, help="Read a token from standard input and hand it to the runtime.")
@click.option("--store-plaintext", is_flag=True,
              help="Without a system keychain, let the runtime keep the token in its config file (Copilot asks).")
@common
def login(provider: str, device: bool, with_token: bool, store_plaintext: bool) -> None:
    """Sign PROVIDER's runtime in, where it supports it.

    \b
    copilot: --device runs GitHub's device flow (prints the code and the URL,
             waits until you approved it; Ctrl-C cancels); --with-token
             hands a GitHub token from stdin to the CLI, which stores it.
    claude, codex: they sign in through their own browser flow, which agentd
             cannot run for them: prints the exact command to run (or the
             API key variable to set).

    \b
    Examples:
      agentctl login copilot --device
      gh auth token | agentctl login copilot --with-token
      agentctl login claude

    Exits 0 when signed in (or the command to run was printed), 1 when the
    runtime refused or cannot sign in (unsupported), 8 when the flow was
    refused or expired, 130 on Ctrl-C (the flow is cancelled). --json:
    the LoginResult (the device code first, as its own line, then the result).
    """
    if device and with_token:
        raise click.UsageError("give --device or --with-token, not both")
    token = ""
    if with_token:
        token = sys.stdin.readline().strip()
        if not token:
            raise click.UsageError("no token on standard input")
    o = _opts()
    client = o.client()
    res = client.call(wire.Login, wire.LoginResult, provider=provider, device=device, token=token,
                      store_plaintext=store_plaintext)
    if res.device is not None:
        if o.json:
            _json(res)
        else:
            click.echo(f"First copy your one-time code: {visible_name(res.device.code)}")
            click.echo(f"Then open {visible_name(res.device.url)} in a browser and enter it. Waiting (Ctrl-C cancels)...")
        res = client.call(wire.LoginWait, wire.LoginResult, flow=res.flow)
    if o.json:
        return _json(res)
    if res.done and res.account is not None:
        click.echo(f"{provider}: signed in{' as ' + visible_name(res.account.login) if res.account.login else ''}"
                   f"{' (' + visible_name(res.account.source) + ')' if res.account.source else ''}")
        return
    if res.command:
        click.echo(f"{visible(res.message) or provider + ' signs in through its own command'}:")
        click.echo(f"  {visible_name(res.command)}")
        return
    raise Fail(exitcodes.FAILED, res.message or f"{provider} did not sign in")


@click.command()
@click.argument("provider")
@common
def logout(provider: str) -> None:
    """Remove PROVIDER's stored sign-in (where agentd can: copilot, claude).

    \b
    Example:
      agentctl logout copilot

    Exits 0 when signed out, 8 when a token or key in agentd's environment
    signs it in (unset it there instead), 1 when the provider cannot sign
    out (unsupported). --json: the LoginResult (its account after it).

    \b
    Examples:
      agentctl logout copilot
    """
    o = _opts()
    res = o.client().call(wire.Logout, wire.LoginResult, provider=provider)
    if o.json:
        return _json(res)
    a = res.account
    if a is not None and a.signed_in:
        _err(f"{provider}: still signed in ({a.source or 'unknown source'}): {a.message}")
        raise click.exceptions.Exit(exitcodes.FAILED)
    click.echo(f"{provider}: signed out")


@click.command()
@click.argument("provider", required=False, default="")
@common
def quota(provider: str) -> None:
    """Show PROVIDER's account quota (default: each provider that reports one), as its runtime
    reports it: Copilot's account quotas; the rate-limit information a turn carried.

    \b
    Example:
      agentctl quota copilot

    Exits 1 when PROVIDER reports no quota (unsupported). --json:
    {"quotas": [QuotaInfo, ...]}.

    \b
    Examples:
      agentctl quota
      agentctl quota copilot --json
    """
    o = _opts()
    infos = o.client().call(wire.QuotaRequest, list[wire.QuotaInfo], provider=provider)
    if o.json:
        return _json({"quotas": infos})
    from ..render import table

    rows = []
    for i in infos:
        if i.error:
            rows.append([i.provider, "-", "-", "-", "-", i.error])
        for q in i.quotas:
            used = f"{q.used:g}/{'unlimited' if q.unlimited else f'{q.entitlement:g}'}" + (f" {q.unit}" if q.unit else "")
            left = "-" if q.remaining_percent is None else f"{q.remaining_percent:g}%"
            rows.append([i.provider, q.type, used, left, q.reset_at or "-", i.source + (f" {i.at}" if i.at else "")])
    if not rows:
        click.echo("no provider reports a quota")
        return
    click.echo(table(rows, ["PROVIDER", "QUOTA", "USED", "LEFT", "RESETS", "FROM"], _style()))
