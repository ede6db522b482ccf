"""agentctl status, stop: the daemon, and stopping it (providers and models: agentctl.commands.accounts)."""

from __future__ import annotations

import os

import click

from agentd import wire
from agentd.termsafe import visible_name

from .. import exitcodes
from ..cli import Fail, FiniteFloat, _json, _opts, common

#: ``agentctl stop --timeout`` default, seconds: what agentd needs to close its provider
#: conversations (5 s at most) and stop its runtimes, with room to spare.
STOP_TIMEOUT_S = 15.0


@click.command()
@common
def status() -> None:
    """Show the daemon: its version (and agentctl's), pid, uptime, paths, conversations.

    \b
    Examples:
      agentctl status
      agentctl status --json | jq -r .version      # the daemon's version

    --json: the daemon's status (version, protocol, pid, uptime_s, ...) and
    "agentctl": agentctl's own version.
    """
    from agentd import __version__
    from ..jsonout import full

    o = _opts()
    r = o.client().call(wire.Status, wire.StatusResult)
    if o.json:
        return _json({**full(r), "agentctl": __version__})
    from ..render import duration

    mine = "" if r.version == __version__ else f" (agentctl {__version__}: `agentctl restart` runs the installed agentd)"
    click.echo(f"agentd {r.version} (protocol {r.protocol}), pid {r.pid}, up {duration(r.uptime_s)}{mine}")
    click.echo(f"socket:        {visible_name(r.socket)}")
    click.echo(f"state dir:     {visible_name(r.state_dir)}")
    closed = f", {r.closed} closed (agentctl ls --all)" if r.closed else ""
    click.echo(f"conversations: {r.conversations} open ({r.running} running){closed}")
    click.echo(f"providers:     {visible_name(', '.join(r.providers)) or '-'}"
               + (" (enabled; `agentctl providers` says which can run a turn now)" if r.providers else ""))


@click.command()
@common
def hosts() -> None:
    """List the agentd hosts sharing this daemon's PostgreSQL store, alive or not.

    Each host is one agentd instance: its hostname, site (the state dir it runs
    on, where its runtimes keep their sessions), pid, whether its heartbeat is
    current, the conversations it holds open and its providers. A host whose
    heartbeat expired has died or stalled; another host ends its running turns
    once its leases expire. On the file store there is one host: exit 1 says so.

    \b
    Examples:
      agentctl hosts
      agentctl hosts --json | jq -r '.hosts[] | select(.alive | not) | .site'
    """
    from ..jsonout import full

    o = _opts()
    r = o.client().call(wire.Hosts, wire.HostsResult)
    if o.json:
        return _json(full(r))
    rows = [("HOST", "SITE", "PID", "STATE", "OPEN", "PROVIDERS")]
    for h in r.hosts:
        state = ("alive" if h.alive else "gone") + (" (this)" if h.this else "")
        rows.append((visible_name(h.hostname), visible_name(h.site), str(h.pid), state, str(h.leases),
                     visible_name(", ".join(h.providers)) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])


@click.command()
@click.option("--timeout", type=FiniteFloat(min=0), default=STOP_TIMEOUT_S, show_default=True,
              metavar="SECONDS", help="How long to wait for agentd to exit (then exit 1).")
@common
def stop(timeout: float) -> None:
    """Stop agentd gracefully, as SIGTERM does, and wait until it has exited.

    Running turns are cut; the next start records them run_interrupted (the
    prompt is never resent). Never starts agentd: when none runs, says so
    and exits 0. Under systemd socket activation the socket unit starts agentd
    again on the next connection; `systemctl --user stop agentd.socket
    agentd.service` stops it for good.

    --json: {"stopped", "pid", "socket", "waited_s"} ("stopped": false when none was running).

    \b
    Examples:
      agentctl stop
      agentctl stop --timeout 60 --json
    """
    import time

    from ..client import Client, NotRunning, Unreachable, default_socket_path

    o = _opts()
    path = o.socket or default_socket_path()
    try:
        client = Client.connect(path, autostart=False)  # stopping a daemon we just started helps no one
    except NotRunning:
        if o.json:
            return _json({"stopped": False, "pid": None, "socket": path, "waited_s": 0.0})
        click.echo("agentd is not running")
        return
    try:
        pid = client.call(wire.Status, wire.StatusResult).pid
        started = _start_time(pid)
        asked = time.monotonic()
        try:
            client.call(wire.Shutdown, wire.ShutdownResult, pid=pid)
        except Unreachable:
            pass  # it went away meanwhile (a SIGTERM, a crash): wait for its process all the same
        # agentd closes every connection once it stops serving, then stops its runtimes and exits.
        client.wait_closed(timeout)
    finally:
        client.close()
    deadline = asked + timeout
    while _alive(pid, started):
        if time.monotonic() >= deadline:
            raise Fail(
                exitcodes.FAILED,
                f"agentd (pid {pid}) was asked to stop but is still running after {timeout:g} s; "
                f"it goes on stopping (its log says what it waits for; `kill -KILL {pid}` ends it at once)",
            )
        time.sleep(0.05)
    waited = round(time.monotonic() - asked, 3)
    if o.json:
        return _json({"stopped": True, "pid": pid, "socket": path, "waited_s": waited})
    click.echo(f"stopped agentd (pid {pid})")


def _proc_stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat from the state on ([] when there is no such process); None without /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [] if os.path.exists("/proc/self/stat") else None
    except OSError:
        return None
    return data.rsplit(b")", 1)[-1].split()


def _start_time(pid: int) -> bytes | None:
    """When the process started (clock ticks since boot), to tell it from a later one with its pid."""
    fields = _proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def _alive(pid: int, started: bytes | None) -> bool:
    """Whether process ``pid`` (started at ``started``) still runs; an exited, unreaped one (a zombie) does not."""
    fields = _proc_stat(pid)
    if fields is not None:
        if not fields or (started is not None and len(fields) > 19 and fields[19] != started):
            return False
        if fields[0] not in (b"Z", b"X"):
            return True
        # Its main thread has exited. The process has once its other threads have too (until
        # then they hold its files: the state-dir lock, the journals).
        try:
            return os.listdir(f"/proc/{pid}/task") not in ([], [str(pid)])
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process now has the pid: ours (same uid as us) is gone
    return True
