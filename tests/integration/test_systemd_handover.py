"""The real hand-over from systemd: agentd started by systemd-socket-activate (systemd's own tool)
with the listening socket in LISTEN_FDS, telling a real NOTIFY_SOCKET, which the test listens on,
READY, STATUS, WATCHDOG, RELOADING and STOPPING; and agentctl leaving the start to an installed
agentd.socket unit instead of starting a daemon beside it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from environment import unavailable


def socket_activate() -> str:
    found = shutil.which("systemd-socket-activate")
    if found is None:
        unavailable("systemd-socket-activate is not installed (apt-get install systemd)")
    return found


class Notifications:
    """A datagram socket standing in for systemd's notify socket: collects what agentd sends."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.seen: list[str] = []

    def wait_for(self, state: str, timeout: float = 30.0) -> str:
        """The first message after those already taken that holds ``state`` (a ``KEY=VALUE`` line)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.sock.recv(4096).decode()
            except TimeoutError:
                continue
            self.seen.append(msg)
            if state in msg.splitlines():
                return msg
        raise AssertionError(f"no {state} within {timeout} s; got {self.seen}")


def agentctl(env: dict[str, str], sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(sock), "--no-autostart", *args],
                          env=env, capture_output=True, text=True, timeout=60)


def test_agentd_started_by_socket_activation_serves_the_passed_socket_and_notifies(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    sock = run / "agentd.sock"
    (tmp_path / "agentd.toml").write_text("")
    notes = Notifications(tmp_path / "notify")
    daemon_env = {
        "HOME": str(tmp_path), "PATH": os.environ["PATH"], "NOTIFY_SOCKET": str(tmp_path / "notify"),
        "WATCHDOG_USEC": "1000000", "AGENTD_STATE_DIR": str(tmp_path / "state"), "AGENTD_RUNTIME_DIR": str(run),
        "AGENTD_SOCKET": str(sock), "AGENTD_CONFIG": str(tmp_path / "agentd.toml"),
    }
    argv = [socket_activate(), "-l", str(sock)]
    for key, value in daemon_env.items():
        argv += ["-E", f"{key}={value}"]
    argv += [sys.executable, "-m", "agentd", "run"]
    log = open(tmp_path / "agentd.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():  # systemd-socket-activate listens first, and starts agentd on a connection
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "agentd.log").read_text()
            time.sleep(0.05)
        env = {**os.environ, "AGENTD_NO_AUTOSTART": "1"}
        st = agentctl(env, sock, "status", "--json")  # this connection starts agentd
        assert st.returncode == 0, st.stderr + (tmp_path / "agentd.log").read_text()
        status = json.loads(st.stdout)
        assert status["pid"] == proc.pid  # systemd-socket-activate exec'd agentd: the same process
        assert status["socket"] == str(sock)
        ready = notes.wait_for("READY=1")
        assert any(line.startswith("STATUS=serving ") for line in ready.splitlines()), ready
        notes.wait_for("WATCHDOG=1", timeout=5)  # WATCHDOG_USEC=1 s: a ping every half second
        notes.wait_for("WATCHDOG=1", timeout=5)
        # SIGHUP: a reload, told to systemd as RELOADING then READY again
        os.kill(proc.pid, signal.SIGHUP)
        reloading = notes.wait_for("RELOADING=1")
        assert any(line.startswith("MONOTONIC_USEC=") for line in reloading.splitlines())
        notes.wait_for("READY=1")
        # the runtimes agentd starts do not get systemd's variables
        workdir = tmp_path / "work"
        workdir.mkdir()
        (tmp_path / "env.toml").write_text(
            'model = "env"\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\nkind = "tool"\n'
            'command = "echo notify=${NOTIFY_SOCKET:-unset} listen=${LISTEN_FDS:-unset}"\n'
        )
        ran = agentctl(env, sock, "run", "-p", "script", "-m", str(tmp_path / "env.toml"), "--cwd", str(workdir),
                       "--json", "go")
        assert ran.returncode == 0, ran.stderr
        assert "notify=unset listen=unset" in ran.stdout
        stop = agentctl(env, sock, "stop", "--json")
        assert stop.returncode == 0 and json.loads(stop.stdout)["stopped"] is True, stop.stderr
        notes.wait_for("STOPPING=1")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        notes.sock.close()


def test_agentctl_leaves_the_start_to_an_installed_socket_unit(tmp_path: Path) -> None:
    xdg_runtime = tmp_path / "xdg-run"
    xdg_runtime.mkdir(mode=0o700)
    units = tmp_path / "cfg" / "systemd" / "user"
    installed = subprocess.run([sys.executable, "-m", "agentd", "install-units", "--dest", str(units)],
                               capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTD_")}
    env.update(XDG_RUNTIME_DIR=str(xdg_runtime), XDG_CONFIG_HOME=str(tmp_path / "cfg"), HOME=str(tmp_path),
               AGENTD_STATE_DIR=str(tmp_path / "state"), PATH=str(tmp_path / "nothing-here"))
    cp = subprocess.run([sys.executable, "-m", "agentctl", "status"], env=env, capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 5, cp.stderr
    assert "agentd.socket is installed" in cp.stderr and "systemctl --user enable --now agentd.socket" in cp.stderr
    # no agentd was started beside the unit: nothing listens, no autostart log
    assert not (xdg_runtime / "agentd" / "agentd.sock").exists()
    assert not (xdg_runtime / "agentd" / "agentd.log").exists()
    assert not (tmp_path / "state" / "agentd.lock").exists()
    # the units name the environment file, the reload signal and a PATH
    service = (units / "agentd.service").read_text()
    assert "EnvironmentFile=-%h/.config/agentd/environment" in service
    assert "ExecReload=kill -HUP $MAINPID" in service
    assert f'Environment="PATH={os.environ["PATH"]}"' in service or 'Environment="PATH=' in service


def test_agentctl_starts_an_installed_socket_unit_through_systemctl(tmp_path: Path) -> None:
    """systemctl is not usable in this container (no systemd as PID 1): a stand-in on PATH does what
    `systemctl --user start agentd.socket` makes systemd do, with systemd's own socket-activate."""
    xdg_runtime = tmp_path / "xdg-run"
    xdg_runtime.mkdir(mode=0o700)
    units = tmp_path / "cfg" / "systemd" / "user"
    assert subprocess.run([sys.executable, "-m", "agentd", "install-units", "--dest", str(units)],
                          capture_output=True, timeout=60).returncode == 0
    bindir = tmp_path / "bin"
    bindir.mkdir()
    sock = xdg_runtime / "agentd" / "agentd.sock"
    calls = tmp_path / "systemctl.calls"
    (bindir / "systemctl").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        '[ "$*" = "--user start agentd.socket" ] || exit 1\n'
        f"mkdir -p -m 700 {xdg_runtime / 'agentd'}\n"
        f"setsid {socket_activate()} -l {sock} -E HOME={tmp_path} -E PATH=/usr/bin:/bin -E XDG_RUNTIME_DIR={xdg_runtime} "
        f"-E AGENTD_STATE_DIR={tmp_path / 'state'} {sys.executable} -m agentd run "
        f"> {tmp_path / 'agentd.log'} 2>&1 < /dev/null &\n"
        f"for i in $(seq 200); do [ -S {sock} ] && exit 0; sleep 0.05; done; exit 1\n"
    )
    (bindir / "systemctl").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTD_")}
    env.update(XDG_RUNTIME_DIR=str(xdg_runtime), XDG_CONFIG_HOME=str(tmp_path / "cfg"), HOME=str(tmp_path),
               AGENTD_STATE_DIR=str(tmp_path / "state"), PATH=f"{bindir}:/usr/bin:/bin")
    cp = subprocess.run([sys.executable, "-m", "agentctl", "status", "--json"], env=env, capture_output=True,
                        text=True, timeout=90)
    try:
        assert cp.returncode == 0, cp.stderr + (tmp_path / "agentd.log").read_text()
        assert calls.read_text() == "--user start agentd.socket\n"
        notices = [json.loads(line) for line in cp.stderr.splitlines()]
        assert any("started agentd.socket" in n.get("notice", "") for n in notices), cp.stderr
        assert json.loads(cp.stdout)["socket"] == str(sock)
    finally:
        stop = subprocess.run([sys.executable, "-m", "agentctl", "stop", "--no-autostart"], env=env,
                              capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr
