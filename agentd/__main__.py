"""``agentd``: run the daemon, check its config, install its systemd user units.

Exit codes: 0 stopped cleanly; 1 could not start (another agentd holds the
state dir, the socket is in use); 78 (EX_CONFIG) a start-up error a restart
cannot fix: the config is broken, or a path agentd needs breaks the trust rule
of :mod:`agentd._trust` or cannot be used (the message names the path and why).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from . import __version__


def _load(config_path: Path | None):  # -> (Config, Paths)
    from .config import EXIT_CONFIG, ConfigError, load_config

    from ._trust import Untrusted

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        click.echo(f"agentd: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    try:
        return config, config.resolved_paths()
    except Untrusted as exc:  # no XDG_RUNTIME_DIR, and the fallback is another user's
        _unusable(exc)


def _trusted_paths(config, paths, config_path) -> None:  # (Config, Paths, Path | None)
    """Check, creating what is missing (0700), every path the daemon trusts before it uses one.

    Raises :class:`~agentd._trust.Untrusted`. The lock file is checked as it is
    taken; the socket here and again as it is bound.
    """
    from . import _trust

    from .reload import read_environment

    read_environment(config_path)  # the environment file beside the config: checked like it
    _trust.check_socket_path(paths.socket)
    _trust.private_dir(paths.runtime_dir, "runtime dir")
    _trust.private_dir(paths.state_dir, "state dir")
    if config.websocket.enabled:
        from .gateway import load_or_create_token

        load_or_create_token(paths.token_file)


def _unusable(exc: Exception) -> None:
    from ._trust import EXIT_UNUSABLE

    click.echo(f"agentd: {exc}", err=True)
    sys.exit(EXIT_UNUSABLE)


def _sole(exc: BaseException) -> BaseException:
    """The one exception nested single-exception groups hold (trio wraps one per nursery), else ``exc``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="agentd")
def cli() -> None:
    """agentd: a supervisor daemon for AI coding-agent runtimes."""


@cli.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path), envvar="AGENTD_CONFIG",
              help="agentd.toml to load (default: the user config dir's agentd.toml, if any).")
def run(config_path: Path | None) -> None:
    """Run the daemon in the foreground until SIGTERM or SIGINT."""
    config, paths = _load(config_path)
    from .logs import configure_logging

    configure_logging(config.log.level, config.log.format)
    from ._trust import Untrusted
    from .leases import AlreadyRunning, DaemonLock

    try:
        _trusted_paths(config, paths, config_path)
        lock = DaemonLock.acquire(paths.state_dir)
    except Untrusted as exc:
        _unusable(exc)
    except AlreadyRunning as exc:
        click.echo(f"agentd: {exc.message}", err=True)
        sys.exit(1)
    except OSError as exc:  # ENOSPC, EIO: a later start may succeed
        click.echo(f"agentd: cannot prepare {exc.filename or 'its paths'}: {exc.strerror or exc}", err=True)
        sys.exit(1)
    import trio

    from .daemon import serve
    from .contract import AgentdError

    # Provider SDKs run in threads of their own beside trio's. With the default 5 ms switch
    # interval, each syscall on one thread (a socket write, a wake-up) can wait that long for
    # the GIL while the other parses a burst of events (the GIL convoy): 0.5 ms bounds it.
    sys.setswitchinterval(0.0005)
    try:
        try:
            trio.run(serve, config, paths, config_path)
        except BaseExceptionGroup as group:
            # A start-up error that knows its exit status, raised inside the daemon's nurseries,
            # comes wrapped once per nursery; anything else keeps its whole traceback.
            leaf = _sole(group)
            if not isinstance(leaf, Untrusted) and not (isinstance(leaf, AgentdError) and hasattr(leaf, "exit_code")):
                raise
            raise leaf from None
    except Untrusted as exc:  # the socket, checked again as it is bound
        _unusable(exc)
    except AgentdError as exc:
        # A start-up error that knows its exit status (the [store] database cannot be reached or
        # used: agentd.store.postgres.StoreUnavailable, 78 when a restart cannot help).
        if not hasattr(exc, "exit_code"):
            raise
        click.echo(f"agentd: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:
        click.echo(f"agentd: {exc}", err=True)
        sys.exit(1)
    finally:
        lock.release()


@cli.command("check-config")
@click.option("--config", "config_path", type=click.Path(path_type=Path), envvar="AGENTD_CONFIG")
def check_config(config_path: Path | None) -> None:
    """Load the config, print which file was read and the resolved paths, exit 78 if it is broken."""
    config, paths = _load(config_path)
    from ._trust import Untrusted, check_socket_length
    from .config import default_config_path

    try:
        check_socket_length(paths.socket)
    except Untrusted as exc:
        _unusable(exc)

    if config_path is not None:
        source = str(config_path)
    else:
        default = default_config_path()
        source = str(default) if default.is_file() else f"none ({default} does not exist: every key at its default)"
    click.echo(f"config:    {source}\nstate_dir: {paths.state_dir}\nsocket:    {paths.socket}\nconfig ok")


@cli.command()
@click.option("--now", is_flag=True, help="Cancel running turns instead of waiting for them.")
def reload(now: bool) -> None:
    """Have the running agentd re-read its config and environment file, as SIGHUP does.

    The same as `agentctl restart`: waits until no turn runs (--now cancels
    them); a config that does not load is refused, the running agentd keeps
    its own, and this exits 78 with the error. Exits 1 when no agentd runs.
    """
    from agentctl.client import Client, Unreachable

    from . import wire
    from .contract import AgentdError

    try:
        client = Client.connect(None, autostart=False)
        res = client.call(wire.Restart, wire.RestartResult, now=now)
    except Unreachable as exc:
        click.echo(f"agentd: {exc}", err=True)
        sys.exit(1)
    except AgentdError as exc:
        click.echo(f"agentd: {exc.message}", err=True)
        sys.exit(78 if exc.code == "invalid" else 1)
    click.echo(f"reloaded agentd (pid {res.pid})" + (f"; cancelled {', '.join(res.cancelled)}" if res.cancelled else ""))


@cli.command("install-units")
@click.option("--dest", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Where to write the units (default ~/.config/systemd/user).")
def install_units(dest: Path | None) -> None:
    """Write agentd.service and agentd.socket as systemd user units."""
    from .systemd import install_units as _install

    paths = _install(dest)
    for path in paths:
        click.echo(str(path))
    steps = ("next: `agentctl stop` (an agentd that agentctl started holds the socket and state dir the unit "
             "wants), then `systemctl --user daemon-reload && systemctl --user enable --now agentd.socket`; "
             "`loginctl enable-linger $USER` keeps agentd and its turns running after you log out. Keys go in "
             "~/.config/agentd/environment (KEY=VALUE lines, chmod 600); the unit's PATH is this shell's")
    if dest is None:
        click.echo(steps, err=True)
    else:
        click.echo(f"systemd looks for user units in ~/.config/systemd/user; link these there "
                   f"(systemctl --user link {' '.join(str(p) for p in paths)}), then: "
                   "systemctl --user daemon-reload && systemctl --user enable --now agentd.socket", err=True)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
