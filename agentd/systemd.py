"""systemd integration without libsystemd: sd_notify, socket activation, watchdog, units.

Everything here is a no-op outside systemd: :func:`notify` returns False,
:func:`listen_fds` returns ``[]``, :func:`watchdog_interval` returns None.
Only the standard library is used (trio is imported by :func:`watchdog_loop`
alone).

The canonical unit text lives here (:data:`SERVICE_UNIT`, :data:`SOCKET_UNIT`)
so an installed wheel can write it; ``systemd/agentd.service`` and
``systemd/agentd.socket`` in the repository are :func:`render_units` with
``ExecStart=%h/.local/bin/agentd``.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping

__all__ = [
    "DEFAULT_EXEC_PATH",
    "SERVICE_UNIT",
    "SOCKET_UNIT",
    "SYSTEMD_ENV_VARS",
    "child_environ",
    "install_units",
    "listen_fds",
    "listen_fds_with_names",
    "notify",
    "ready",
    "render_units",
    "status",
    "stopping",
    "take_environment",
    "user_unit_dir",
    "watchdog",
    "watchdog_interval",
    "watchdog_loop",
]

#: First file descriptor passed by socket activation (SD_LISTEN_FDS_START).
LISTEN_FDS_START = 3

#: ExecStart used for the unit files kept in the repository.
DEFAULT_EXEC_PATH = "%h/.local/bin/agentd"

#: Variables systemd sets for the daemon itself; runtimes started by the daemon
#: must not inherit them (see :func:`child_environ`).
SYSTEMD_ENV_VARS = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_PID",
    "LISTEN_FDS",
    "LISTEN_FDNAMES",
    "JOURNAL_STREAM",
    "INVOCATION_ID",
)

_EXEC = "@AGENTD_EXEC@"
_PATH = "@AGENTD_PATH@"

#: PATH of the repository's unit file: a user service does not get the login shell's PATH, so
#: runtimes installed in ~/.local/bin (pipx, npm --prefix ~/.local) are found only if it says so.
DEFAULT_PATH = "%h/.local/bin:/usr/local/bin:/usr/bin:/bin"

#: The user service; ``@AGENTD_EXEC@`` is replaced by the agentd executable.
SERVICE_UNIT = f"""\
# agentd user service, in ~/.config/systemd/user/ (`agentd install-units`
# writes it with ExecStart set). Then `systemctl --user daemon-reload` and
# `systemctl --user enable --now agentd.socket` (start on first use) or
# `systemctl --user enable --now agentd.service` (start at login).
[Unit]
Description=agentd: supervisor for AI coding-agent runtimes
After=agentd.socket

[Service]
Type=notify
NotifyAccess=main
ExecStart={_EXEC} run
# SIGHUP: agentd re-reads agentd.toml and the environment file once no turn runs (as `agentctl
# restart`); a broken config is refused and the one in force stays.
ExecReload=kill -HUP $MAINPID
# Where agentd and its runtimes find programs (copilot, codex, node, gemini, ...): a user service
# does not get your shell's PATH. `agentd install-units` writes the PATH it was run with.
Environment="PATH={_PATH}"
# Keys, one KEY=VALUE a line (ANTHROPIC_API_KEY=..., OPENAI_API_KEY=...), in a 0600 file; "-": it
# may be missing. agentd reads it again on `agentctl restart` and `systemctl --user reload agentd`.
EnvironmentFile=-%h/.config/agentd/environment
Restart=on-failure
RestartSec=2
# 78 (EX_CONFIG): agentd.toml is broken, or a path agentd needs is unusable or
# untrusted (another user's, a symlink, a socket path too long): restarting will not fix it.
RestartPreventExitStatus=78
WatchdogSec=30
# SIGTERM goes to agentd alone, which stops its runtimes within
# [daemon] shutdown_grace_s; whatever is left is killed after TimeoutStopSec.
KillMode=mixed
TimeoutStopSec=30
UMask=0077

[Install]
WantedBy=default.target
"""

#: The socket unit: systemd listens and starts agentd.service on the first connection.
SOCKET_UNIT = """\
# agentd control socket: `systemctl --user enable --now agentd.socket` starts
# agentd on the first connection. The path is agentd's default socket.
[Unit]
Description=agentd control socket

[Socket]
ListenStream=%t/agentd/agentd.sock
SocketMode=0600
DirectoryMode=0700

[Install]
WantedBy=sockets.target
"""


# --------------------------------------------------------------------------- sd_notify

#: systemd's variables taken out of the environment by :func:`take_environment`, still used here
_taken: dict[str, str] = {}


def take_environment() -> None:
    """Move :data:`SYSTEMD_ENV_VARS` out of ``os.environ`` (as sd_notify's unset_environment does),
    keeping NOTIFY_SOCKET and the watchdog's for this module: no process agentd starts (a runtime,
    the command a tool runs) can inherit them, whichever way it builds its environment."""
    for name in SYSTEMD_ENV_VARS:
        value = os.environ.pop(name, None)
        if value is not None:
            _taken[name] = value


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    if environ is not None:
        return environ
    return {**_taken, **os.environ} if _taken else os.environ


def notify(state: str, *, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (``KEY=VALUE`` lines) to the service manager's notify socket.

    The address is ``$NOTIFY_SOCKET``: a filesystem path, or an abstract name
    written with a leading ``@``. The datagram is sent without blocking.
    Returns True once sent; False when not under systemd (no or unsupported
    ``NOTIFY_SOCKET``) or when sending failed. Never raises OSError.
    """
    env = _env(environ)
    addr = env.get("NOTIFY_SOCKET", "")
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    elif not addr.startswith("/"):
        return False  # unset, or vsock:/other transports we do not speak
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.setblocking(False)
            sock.sendto(state.encode("utf-8"), addr)
    except OSError:
        return False
    return True


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


def ready(status_text: str | None = None) -> bool:
    """Tell systemd the daemon is ready (socket bound, journal open); optional status line."""
    return notify("READY=1" + (f"\nSTATUS={_one_line(status_text)}" if status_text else ""))


def status(text: str) -> bool:
    """Set the one-line status shown by ``systemctl --user status agentd``."""
    return notify(f"STATUS={_one_line(text)}")


def stopping(status_text: str | None = None) -> bool:
    """Tell systemd the daemon is shutting down."""
    return notify("STOPPING=1" + (f"\nSTATUS={_one_line(status_text)}" if status_text else ""))


def watchdog() -> bool:
    """Ping the service watchdog (``WATCHDOG=1``)."""
    return notify("WATCHDOG=1")


# --------------------------------------------------------------------------- watchdog


def watchdog_interval(environ: Mapping[str, str] | None = None) -> float | None:
    """The watchdog timeout in seconds (``$WATCHDOG_USEC``), or None when off.

    None also when ``$WATCHDOG_PID`` is set to another process (the variable
    was inherited) or either variable is malformed. Ping at half this interval.
    """
    env = _env(environ)
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    try:
        value = int(usec)
        if pid and int(pid) != os.getpid():
            return None
    except ValueError:
        return None
    return value / 1e6 if value > 0 else None


async def watchdog_loop(
    interval: float | None = None,
    *,
    healthy: Callable[[], bool] | None = None,
) -> None:
    """Ping the watchdog every ``interval / 2`` seconds until cancelled.

    ``interval`` defaults to :func:`watchdog_interval`; when there is none this
    returns at once. A ping is skipped while ``healthy()`` returns False, so
    systemd restarts a daemon that stopped making progress. Run it in the
    daemon's nursery; cancelling it is the only way to stop it.
    """
    import trio

    if interval is None:
        interval = watchdog_interval()
    if interval is None:
        return
    while True:
        if healthy is None or healthy():
            watchdog()
        await trio.sleep(interval / 2)


# --------------------------------------------------------------------------- socket activation


def listen_fds_with_names(*, unset_environment: bool = True) -> list[tuple[str, socket.socket]]:
    """Sockets passed by systemd socket activation, with their names.

    Honoured only when ``$LISTEN_PID`` is this process. Descriptors start at 3
    and number ``$LISTEN_FDS``; names come from ``$LISTEN_FDNAMES``
    (colon-separated, "unknown" when absent). Each descriptor gets FD_CLOEXEC
    and becomes a socket object of its real family and type. With
    ``unset_environment`` (the default) the LISTEN_* variables are removed so
    child processes do not inherit them. Raises OSError if a passed
    descriptor is not a socket.
    """
    env = os.environ
    try:
        pid = int(env.get("LISTEN_PID", ""))
        count = int(env.get("LISTEN_FDS", ""))
    except ValueError:
        pid, count = -1, 0
    names_var = env.get("LISTEN_FDNAMES")
    if unset_environment:
        for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            env.pop(var, None)
    if pid != os.getpid() or count <= 0:
        return []
    names = names_var.split(":") if names_var else []
    result: list[tuple[str, socket.socket]] = []
    for i in range(count):
        fd = LISTEN_FDS_START + i
        os.set_inheritable(fd, False)
        name = names[i] if i < len(names) and names[i] else "unknown"
        result.append((name, socket.socket(fileno=fd)))
    return result


def listen_fds(*, unset_environment: bool = True) -> list[socket.socket]:
    """The sockets of :func:`listen_fds_with_names`, in order; ``[]`` when not activated."""
    return [sock for _, sock in listen_fds_with_names(unset_environment=unset_environment)]


def child_environ(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``environ`` (default os.environ) without :data:`SYSTEMD_ENV_VARS`.

    Use it for runtimes the daemon starts: their stderr is a pipe to the
    daemon, not the journal, and systemd's notifications are for agentd only.
    """
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k not in SYSTEMD_ENV_VARS}


# --------------------------------------------------------------------------- units


def _unit_exec(path: str) -> str:
    """Quote ``path`` for ExecStart when it holds whitespace or quotes."""
    if any(c.isspace() for c in path) or '"' in path or "\\" in path:
        return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return path


def render_units(exec_path: str = DEFAULT_EXEC_PATH, path: str = DEFAULT_PATH) -> dict[str, str]:
    """Unit file name -> text, with ExecStart running ``<exec_path> run`` and ``path`` as PATH.

    ``exec_path`` and ``path`` are written as is (systemd specifiers such as
    ``%h`` keep their meaning); ``exec_path`` is quoted if it holds whitespace.
    """
    return _render(_unit_exec(exec_path), path)


def _render(exec_start: str, path: str) -> dict[str, str]:
    return {
        "agentd.service": SERVICE_UNIT.replace(_EXEC, exec_start).replace(_PATH, path.replace('"', "")),
        "agentd.socket": SOCKET_UNIT,
    }


def user_unit_dir() -> pathlib.Path:
    """``$XDG_CONFIG_HOME/systemd/user``, i.e. ~/.config/systemd/user by default."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return pathlib.Path(base) / "systemd" / "user"


def _find_agentd() -> list[str]:
    """argv that starts agentd: the running script, else `agentd` on PATH, else python -m agentd."""
    argv0 = pathlib.Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "agentd" and argv0.is_file() and os.access(argv0, os.X_OK):
        return [str(argv0.absolute())]
    found = shutil.which("agentd")
    if found:
        return [str(pathlib.Path(found).absolute())]
    return [sys.executable, "-m", "agentd"]


def install_units(dest: pathlib.Path | None = None, *, exec_path: str | None = None) -> list[pathlib.Path]:
    """Write agentd.service and agentd.socket; return their paths.

    ``dest`` defaults to :func:`user_unit_dir` (created if needed).
    ``exec_path`` (written as in :func:`render_units`) defaults to the running
    ``agentd`` script (``sys.argv[0]`` when it is one), else ``agentd`` on
    PATH, else ``<this python> -m agentd``, and the unit's PATH then is the
    PATH this process runs with; ``%`` in a detected path is escaped. With
    ``exec_path`` given, PATH is :data:`DEFAULT_PATH`. Files are replaced atomically, mode 0644. Does not run
    ``systemctl --user daemon-reload``. Raises OSError when writing fails.
    """
    if exec_path is None:
        # The PATH this runs with, so the service finds the runtimes this shell finds.
        here = os.environ.get("PATH") or DEFAULT_PATH
        units = _render(" ".join(_unit_exec(arg.replace("%", "%%")) for arg in _find_agentd()), here.replace("%", "%%"))
    else:
        units = render_units(exec_path)
    dest = user_unit_dir() if dest is None else pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    written: list[pathlib.Path] = []
    for name, text in units.items():
        target = dest / name
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=dest)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            pathlib.Path(tmp).unlink(missing_ok=True)
            raise
        written.append(target)
    return written

