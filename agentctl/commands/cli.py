"""agentctl completion and restart: the shell's completion script, and a daemon that picks up a new
config and environment without cutting running turns."""

from __future__ import annotations

import click

from agentd.termsafe import visible, visible_name

from .. import exitcodes
from ..cli import Fail, _json, _opts, common

#: The variable click's completion reads; agentctl's entry point is named "agentctl".
COMPLETE_VAR = "_AGENTCTL_COMPLETE"

_INSTALL = {
    "bash": "mkdir -p ~/.local/share/bash-completion/completions && agentctl completion bash > ~/.local/share/bash-completion/completions/agentctl",
    "zsh": "agentctl completion zsh > \"${fpath[1]}/_agentctl\"   # or: eval \"$(agentctl completion zsh)\" in ~/.zshrc",
    "fish": "mkdir -p ~/.config/fish/completions && agentctl completion fish > ~/.config/fish/completions/agentctl.fish",
}


@click.command()
@click.argument("shell", type=click.Choice(sorted(_INSTALL)))
@common
def completion(shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish).

    It completes commands, options, provider names, and conversation and task
    ids (those asked of the running agentd, which completion never starts).

    \b
    Examples:
      mkdir -p ~/.local/share/bash-completion/completions && agentctl completion bash > ~/.local/share/bash-completion/completions/agentctl
      eval "$(agentctl completion zsh)"          # in ~/.zshrc
      mkdir -p ~/.config/fish/completions && agentctl completion fish > ~/.config/fish/completions/agentctl.fish

    --json: {"shell", "script", "install"}.
    """
    from click.shell_completion import get_completion_class

    from ..cli import cli

    cls = get_completion_class(shell)
    if cls is None:  # pragma: no cover - click ships all three
        raise Fail(exitcodes.USAGE, f"click has no completion for {shell}")
    script = cls(cli, {}, "agentctl", COMPLETE_VAR).source()
    if _opts().json:
        return _json({"shell": shell, "script": script, "install": _INSTALL[shell]})
    click.echo(script)


@click.command()
@click.option("--now", is_flag=True, help="Cancel the running turns instead of waiting for them (says which).")
@common
def restart(now: bool) -> None:
    """Restart agentd in place: re-read agentd.toml and its environment file, re-check providers.

    Runtimes started afterwards get the new config ([providers.<name>.env]
    included) and the environment file's keys (~/.config/agentd/environment,
    the file the systemd units name). Running turns are not interrupted:
    restart waits until none runs (--now cancels them, and says which).
    Conversations, connections and the journal stay; each conversation opens
    again on its provider at its next prompt. A config that does not load is
    refused (exit 8) with its error, and agentd keeps the config it had. The
    same happens on SIGHUP (`agentd reload`, `systemctl --user reload agentd`).

    \b
    Examples:
      export ANTHROPIC_API_KEY=...  # not seen by a running agentd; instead:
      echo 'ANTHROPIC_API_KEY=...' >> ~/.config/agentd/environment && agentctl restart
      agentctl restart --now        # cancel running turns rather than wait

    --json: {"pid", "config", "env_file", "env_changed", "cancelled", "reopened",
    "waited_s", "providers": [ProviderInfo, ...]}.
    """
    import sys

    from agentd import wire

    from ..cli import _err

    o = _opts()
    client = o.client()
    running = client.call(wire.Status, wire.StatusResult).running
    if running and not now and not o.json:
        _err(f"waiting for {running} running turn{'s' if running > 1 else ''} to end (--now cancels them; "
             "Ctrl-C stops waiting and changes nothing)")
    res = client.call(wire.Restart, wire.RestartResult, now=now)
    if o.json:
        return _json(res)
    out = sys.stdout
    for run in res.cancelled:
        _err(f"cancelled run {run} (--now)")
    bits = [f"config {visible_name(res.config) if res.config else 'none (defaults)'}"]
    if res.env_file:
        bits.append(f"{visible_name(res.env_file)}: "
                    + (f"set {visible_name(', '.join(res.env_changed))}" if res.env_changed else "no change"))
    if res.reopened:
        bits.append(f"{res.reopened} conversation{'s reopen on their' if res.reopened > 1 else ' reopens on its'} next prompt")
    # With none running, the agentd just started (autostart) read everything already.
    head = (f"agentd was not running: started it (pid {res.pid})" if o.autostarted
            else f"restarted agentd in place (pid {res.pid}, the same process)")
    click.echo(f"{head}: " + "; ".join(bits), file=out)
    for p in res.providers:
        click.echo(f"  {visible_name(p.name)}: " + ("available" if p.available else f"unavailable: {visible(p.error)}"),
                   file=out)
    if res.need_stop:
        _err(f"changed, applied only after agentctl stop and a start: {', '.join(f'[{s}]' for s in res.need_stop)}")
