"""systemd integration against real sockets, real subprocesses and systemd-analyze."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import sys
import uuid

import pytest
import trio

from agentd import systemd
from environment import unavailable

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def notify_socket(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    """A datagram socket standing in for systemd's, with $NOTIFY_SOCKET pointing at it."""
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    yield sock
    sock.close()


def received(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


# --------------------------------------------------------------------------- notify


def test_notify_sends_one_datagram_to_the_notify_socket(notify_socket: socket.socket) -> None:
    assert systemd.notify("READY=1\nSTATUS=up")
    assert received(notify_socket) == ["READY=1\nSTATUS=up"]


def test_helpers_send_the_sd_notify_states(notify_socket: socket.socket) -> None:
    assert systemd.ready("serving 3 conversations")
    assert systemd.status("two\nlines")
    assert systemd.stopping()
    assert systemd.watchdog()
    assert received(notify_socket) == [
        "READY=1\nSTATUS=serving 3 conversations",
        "STATUS=two lines",
        "STOPPING=1",
        "WATCHDOG=1",
    ]


def test_notify_reaches_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"agentd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.ready()
        assert sock.recv(100) == b"READY=1"


def test_notify_outside_systemd_returns_false(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert systemd.notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert systemd.notify("READY=1") is False


# --------------------------------------------------------------------------- watchdog


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": str(os.getpid())}, 0.5),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid() + 1)}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "x"}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert systemd.watchdog_interval(env) == expected


async def test_watchdog_loop_pings_at_half_the_interval(notify_socket: socket.socket, autojump_clock) -> None:
    with trio.move_on_after(10.5):
        await systemd.watchdog_loop(4.0)
    # at t = 0, 2, 4, 6, 8, 10
    assert received(notify_socket) == ["WATCHDOG=1"] * 6


async def test_watchdog_loop_skips_pings_while_unhealthy(notify_socket: socket.socket, autojump_clock) -> None:
    healthy = True

    def check() -> bool:
        return healthy

    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: systemd.watchdog_loop(2.0, healthy=check))
        await trio.sleep(2.5)  # pings at 0, 1, 2
        healthy = False
        await trio.sleep(3)  # none at 3, 4, 5
        nursery.cancel_scope.cancel()
    assert received(notify_socket) == ["WATCHDOG=1"] * 3


async def test_watchdog_loop_returns_at_once_without_a_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    with trio.fail_after(1):
        await systemd.watchdog_loop()


# --------------------------------------------------------------------------- socket activation

# Runs in a child that received the sockets: moves them to fd 3.. as systemd
# would, sets LISTEN_PID to its own pid, then calls listen_fds_with_names().
CHILD = r"""
import fcntl, json, os, socket, sys
fds = [int(x) for x in sys.argv[1].split(",")]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]  # out of the way first
for fd in fds:
    os.close(fd)
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i)
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
from agentd.systemd import listen_fds_with_names
got = listen_fds_with_names()
report = {
    "sockets": [[name, s.fileno(), int(s.family), int(s.type), os.get_inheritable(s.fileno())] for name, s in got],
    "env": sorted(k for k in os.environ if k.startswith("LISTEN_")),
}
print(json.dumps(report), flush=True)
for name, s in got:
    if s.family == socket.AF_UNIX:
        conn, _ = s.accept()
        conn.sendall(b"hello from " + name.encode())
        conn.close()
"""


def run_child(fds: list[int], env: dict[str, str]) -> subprocess.Popen[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, ",".join(map(str, fds))],
        pass_fds=fds,
        env=full,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_listen_fds_takes_sockets_passed_by_systemd(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "agentd.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(path))
    unix.listen()
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    with run_child([unix.fileno(), tcp.fileno()], {"LISTEN_FDS": "2", "LISTEN_FDNAMES": "control:ws"}) as child:
        try:
            assert child.stdout is not None
            report = json.loads(child.stdout.readline())
            assert report["sockets"] == [
                ["control", 3, int(socket.AF_UNIX), int(socket.SOCK_STREAM), False],
                ["ws", 4, int(socket.AF_INET), int(socket.SOCK_STREAM), False],
            ]
            assert report["env"] == []  # unset, so runtimes started later do not inherit them
            unix.close()  # only the child holds the listening socket now
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(10)
                client.connect(str(path))
                assert client.recv(100) == b"hello from control"
            assert child.wait(timeout=10) == 0
        finally:
            if child.poll() is None:
                child.kill()
            unix.close()
            tcp.close()


def test_listen_fds_without_names_calls_them_unknown(tmp_path: pathlib.Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        with run_child([tcp.fileno()], {"LISTEN_FDS": "1"}) as child:
            assert child.stdout is not None
            report = json.loads(child.stdout.readline())
            assert child.wait(timeout=10) == 0
    assert [s[0] for s in report["sockets"]] == ["unknown"]


def test_listen_fds_ignores_variables_meant_for_another_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LISTEN_PID", str(os.getpid() + 1))
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_FDNAMES", "control")
    assert systemd.listen_fds() == []
    assert not any(k in os.environ for k in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"))


def test_listen_fds_outside_systemd_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        monkeypatch.delenv(var, raising=False)
    assert systemd.listen_fds() == []


def test_child_environ_drops_systemd_variables() -> None:
    env = {"PATH": "/bin", "NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1", "JOURNAL_STREAM": "1:2", "HOME": "/h"}
    assert systemd.child_environ(env) == {"PATH": "/bin", "HOME": "/h"}


# --------------------------------------------------------------------------- units


def test_repo_unit_files_are_what_install_units_writes(tmp_path: pathlib.Path) -> None:
    written = systemd.install_units(tmp_path, exec_path="%h/.local/bin/agentd")
    assert [p.name for p in written] == ["agentd.service", "agentd.socket"]
    for path in written:
        assert path.read_text() == (REPO / "systemd" / path.name).read_text()


def test_service_unit_runs_agentd_as_a_notify_service(tmp_path: pathlib.Path) -> None:
    service = systemd.install_units(tmp_path, exec_path="/opt/agentd/bin/agentd")[0].read_text()
    lines = service.splitlines()
    for expected in (
        "Type=notify",
        "NotifyAccess=main",
        "ExecStart=/opt/agentd/bin/agentd run",
        "Restart=on-failure",
        "RestartPreventExitStatus=78",
        "WatchdogSec=30",
    ):
        assert expected in lines
    assert any(line.startswith("TimeoutStopSec=") for line in lines)
    socket_unit = (tmp_path / "agentd.socket").read_text().splitlines()
    for expected in ("ListenStream=%t/agentd/agentd.sock", "SocketMode=0600", "DirectoryMode=0700"):
        assert expected in socket_unit
    assert stat.S_IMODE((tmp_path / "agentd.service").stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agentd.service", "agentd.socket"]  # no temp files left


def test_install_units_finds_the_running_agentd_and_escapes_it(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = tmp_path / "my 100% bin"
    bindir.mkdir()
    exe = bindir / "agentd"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(exe), "install"])
    service = systemd.install_units(tmp_path / "units")[0].read_text()
    assert f'ExecStart="{bindir}/agentd" run'.replace("100%", "100%%") in service.splitlines()


def test_install_units_falls_back_to_agentd_on_path_then_python_m_agentd(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "agentd"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setattr(sys, "argv", ["/usr/lib/python3/pytest"])
    monkeypatch.setenv("PATH", str(tmp_path))
    service = systemd.install_units(tmp_path / "units")[0].read_text()
    assert f"ExecStart={exe} run" in service.splitlines()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    service = systemd.install_units(tmp_path / "units")[0].read_text()
    assert f"ExecStart={sys.executable} -m agentd run" in service.splitlines()


def test_install_units_defaults_to_the_user_unit_directory(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    written = systemd.install_units(exec_path="/usr/bin/agentd")
    assert written == [tmp_path / "cfg/systemd/user/agentd.service", tmp_path / "cfg/systemd/user/agentd.socket"]


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        unavailable("systemd-analyze is not installed (apt-get install systemd): the units cannot be verified")
    return found


def verify(units: list[pathlib.Path], home: pathlib.Path) -> subprocess.CompletedProcess[str]:
    runtime = home / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_LEVEL": "notice"}
    return subprocess.run(
        [systemd_analyze(), "--user", "verify", *map(str, units)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def fake_agentd(path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_installed_units_pass_systemd_analyze_verify(tmp_path: pathlib.Path) -> None:
    exe = fake_agentd(tmp_path / "bin" / "agentd")
    units = systemd.install_units(tmp_path / "units", exec_path=str(exe))
    result = verify(units, tmp_path)
    assert result.returncode == 0, result.stderr
    # verify exits 0 on unknown keys and bad values too; it must have said nothing.
    assert result.stderr.strip() == "" and result.stdout.strip() == ""


def test_repo_units_pass_systemd_analyze_verify(tmp_path: pathlib.Path) -> None:
    fake_agentd(tmp_path / ".local" / "bin" / "agentd")  # %h/.local/bin/agentd
    result = verify([REPO / "systemd" / "agentd.socket", REPO / "systemd" / "agentd.service"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "" and result.stdout.strip() == ""


def test_systemd_analyze_verify_catches_a_broken_unit(tmp_path: pathlib.Path) -> None:
    """Guards the two tests above: verify really reads and judges these files."""
    exe = fake_agentd(tmp_path / "bin" / "agentd")
    service, sock = systemd.install_units(tmp_path / "units", exec_path=str(exe))
    service.write_text(service.read_text().replace("Restart=on-failure", "Restart=sometimes"))
    result = verify([sock, service], tmp_path)
    assert "Restart" in result.stderr or "restart" in result.stderr
