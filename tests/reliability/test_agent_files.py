"""Agent file access through the real daemon and a real ACP agent process (acp_fault_agent.py):
a symlink swapped in a loop, a FIFO, a device, an oversized file, line windows, a hard link out,
agentd's own state under the workdir, and a hung file system (a FUSE mount whose server never
answers) that must cost its own requests their deadline and nobody else anything."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from agentd import wire
from daemon_harness import Client, Daemon
from environment import unavailable

from .conftest import ECHO, fast_daemon, new, run_turn
from .figures import FAULTS

AGENT = Path(__file__).parent / "acp_fault_agent.py"
SECRET = "top-secret-4f1c9a"


def acp_config(extra: str = "") -> str:
    return f"""
[providers.acp.fault]
command = [{json.dumps(sys.executable)}, {json.dumps(str(AGENT))}]
{extra}"""


def start(root: Path, extra: str = "", env: dict[str, str] | None = None) -> Daemon:
    return fast_daemon(root, acp_config(extra), env=env).start()


def open_acp(client: Client, workdir: Path) -> str:
    cid = client.request(wire.New, provider="acp:fault", workdir=str(workdir))["id"]
    client.subscribe(cid)
    return cid


def reply(client: Client, cid: str, prompt: str, timeout: float = 30) -> str:
    """The agent's answer line (``ok:...``, ``error:...`` or ``many:...``) to ``prompt``."""
    records = run_turn(client, cid, prompt, timeout=timeout)
    texts = [msgspec.json.decode(r.data).get("text", "") for r in records if r.type == "item"]
    answers = [t for t in texts if t.startswith(("ok", "error", "many:"))]
    assert answers, f"no answer from the agent to {prompt!r}: {[t[:80] for t in texts]}"
    return answers[-1]


def many(answer: str) -> list[str]:
    assert answer.startswith("many:"), answer
    return json.loads(answer[len("many:"):])


def rchar(pid: int) -> int:
    """Bytes the process has read through read(2) and friends, all threads (/proc/<pid>/io)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/<pid>/io")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(SECRET + "\n")
    (work / "inside.txt").write_text("inside\n")
    return work


# --------------------------------------------------------------------------- the symlink race


#: Runs in its own process: swap ``target`` and ``alt`` (one atomic renameat2 RENAME_EXCHANGE each
#: time) as fast as it can, until killed: ``target`` is in turn the thing inside and the symlink out.
_FLIPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
target, alt = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
print("flipping", flush=True)
while True:
    if libc.renameat2(-100, target, -100, alt, 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
"""


@pytest.fixture
def flipping(tmp_path: Path, tree: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """``target`` (a file, or with ``dir`` a directory holding ``secret.txt``, reading "inside")
    swapped with a symlink to the secret (or to the directory holding it) by another process;
    yields the path the agent asks for."""
    outside = tmp_path / "outside"
    if request.param == "dir":
        (tree / "target").mkdir()
        (tree / "target" / "secret.txt").write_text("inside\n")
        (tree / "alt").symlink_to(outside)
        asked = str(tree / "target" / "secret.txt")
    else:
        (tree / "target").write_text("inside\n")
        (tree / "alt").symlink_to(outside / "secret.txt")
        asked = str(tree / "target")
    flipper = subprocess.Popen([sys.executable, "-c", _FLIPPER, str(tree / "target"), str(tree / "alt")],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert flipper.stdout is not None and flipper.stdout.readline() == "flipping\n"
        yield asked
    finally:
        flipper.kill()
        flipper.wait()


@pytest.mark.parametrize("flipping", ["file", "dir"], indirect=True)
@pytest.mark.parametrize("resolver", ["openat2", "walk"])
def test_a_symlink_swapped_in_a_loop_during_reads_never_leaks_a_byte_of_the_secret(
    tmp_path: Path, tree: Path, flipping: str, resolver: str
) -> None:
    d = start(tmp_path / "d", env={"AGENTD_AGENTFS_WALK": "1"} if resolver == "walk" else {})
    answers: list[str] = []
    try:
        with d.client() as client:
            cid = open_acp(client, tree)
            # 400 reads at least, and on until 20 of them met the link (the flipper's pace varies with load).
            for turn in range(80):
                answers += many(reply(client, cid, f"readmany 25 {flipping}"))
                if turn >= 15 and sum(a.startswith("error:") for a in answers) >= 20:
                    break
    finally:
        d.stop()
    FAULTS["agent files: symlink swaps raced"] += len(answers)
    leaked = [a for a in answers if SECRET[:6] in a]
    assert not leaked, f"{len(leaked)} of {len(answers)} reads returned the secret: {leaked[:3]}"
    # The race really ran: some reads found the file, some the link (refused, never followed).
    assert "ok:inside\n" in answers, answers[:5]
    assert sum(a.startswith("error:") and "symbolic link" in a for a in answers) >= 20, answers[:5]
    assert all(a == "ok:inside\n" or "symbolic link" in a for a in answers), set(answers)


@pytest.mark.parametrize("flipping", ["file", "dir"], indirect=True)
def test_a_symlink_swapped_in_a_loop_during_writes_never_writes_outside(
    tmp_path: Path, tree: Path, flipping: str
) -> None:
    d = start(tmp_path / "d")
    answers: list[str] = []
    try:
        with d.client() as client:
            cid = open_acp(client, tree)
            for n in range(6):  # 150 writes, 25 a turn
                answers += many(reply(client, cid, f"writemany 25 {flipping} pwned-{n}"))
    finally:
        d.stop()
    FAULTS["agent files: symlink swaps raced"] += len(answers)
    outside = tmp_path / "outside"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"], "a file was made outside"
    assert (outside / "secret.txt").read_text() == SECRET + "\n", "the secret outside was written through a link"
    assert "ok" in answers and all(a == "ok" or "symbolic link" in a for a in answers), set(answers)


# --------------------------------------------------------------------------- not regular files


def test_a_fifo_is_refused_and_sigterm_still_stops_the_daemon_promptly(tmp_path: Path, tree: Path) -> None:
    os.mkfifo(tree / "fifo")
    d = start(tmp_path / "d")
    try:
        with d.client() as client:
            cid = open_acp(client, tree)
            run = client.request(wire.Send, conversation=cid, text=f"read {tree / 'fifo'}")["run"]
            try:
                records = client.follow(run, timeout=10)
            except (TimeoutError, OSError):
                records = []  # the read hangs: what follows must still stop the daemon
            texts = [msgspec.json.decode(r.data).get("text", "") for r in records if r.type == "item"]
            FAULTS["agent files: FIFO"] += 1
            sent = time.monotonic()
            d.proc.send_signal(signal.SIGTERM)
            try:
                d.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            took = time.monotonic() - sent
    finally:
        d.stop(signal.SIGKILL)
    assert any(t.startswith("error:") and "is a FIFO, not a regular file" in t for t in texts), texts
    assert d.proc.returncode == 0 and took < 5, f"agentd took {took:.1f} s to stop (exit {d.proc.returncode})"


def test_devices_and_a_fifo_to_write_are_refused(tmp_path: Path, tree: Path) -> None:
    if os.geteuid() != 0:
        unavailable("making a device node needs root")
    try:
        os.mknod(tree / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's numbers
        os.mknod(tree / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's
    except PermissionError as exc:
        unavailable(f"mknod is not allowed here: {exc}")
    os.mkfifo(tree / "fifo")
    d = start(tmp_path / "d")
    try:
        with d.client() as client:
            cid = open_acp(client, tree)
            for name in ("zero", "null"):
                FAULTS["agent files: device"] += 1
                answer = reply(client, cid, f"read {tree / name}", timeout=15)
                assert answer.startswith("error:") and "is a character device, not a regular file" in answer, answer
                answer = reply(client, cid, f"write {tree / name} x", timeout=15)
                assert answer.startswith("error:") and "character device" in answer, answer
            answer = reply(client, cid, f"write {tree / 'fifo'} x", timeout=15)
            assert answer.startswith("error:") and "is a FIFO" in answer, answer
            assert reply(client, cid, f"read {tree / 'inside.txt'}") == "ok:inside\n"  # and it goes on serving
    finally:
        d.stop()
    assert stat.S_ISCHR((tree / "zero").lstat().st_mode) and stat.S_ISFIFO((tree / "fifo").lstat().st_mode)


# --------------------------------------------------------------------------- size


CEILING = 1 << 20


def test_an_oversized_file_is_refused_after_reading_only_the_ceiling_plus_one(tmp_path: Path, tree: Path) -> None:
    big = tree / "big.log"
    with open(big, "wb") as f:
        f.truncate(64 << 20)  # 64 MiB (sparse)
    d = start(tmp_path / "d", f"[agent_files]\nmax_bytes = {CEILING}\n")
    try:
        with d.client() as client:
            cid = open_acp(client, tree)
            assert reply(client, cid, f"read {tree / 'inside.txt'}") == "ok:inside\n"
            before = rchar(d.proc.pid)
            answer = reply(client, cid, f"read {big}")
            read = rchar(d.proc.pid) - before
    finally:
        d.stop()
    FAULTS["agent files: oversized"] += 1
    assert answer.startswith("error:") and f"larger than agent_files.max_bytes ({CEILING} bytes)" in answer, answer
    # ceiling + 1 of the file, plus the few KB of frames the turn itself reads
    assert CEILING < read < CEILING + (256 << 10), f"agentd read {read} bytes for a {CEILING}-byte ceiling"


def test_a_line_window_reads_only_up_to_its_last_line(tmp_path: Path, tree: Path) -> None:
    log = tree / "app.log"
    with open(log, "w") as f:
        for n in range(1, 3_000_001):  # ~32 MB of lines, over the default 10 MiB ceiling
            f.write(f"line {n}\n")
    d = start(tmp_path / "d")
    try:
        with d.client() as client:
            cid = open_acp(client, tree)
            assert reply(client, cid, f"read {tree / 'inside.txt'}") == "ok:inside\n"
            before = rchar(d.proc.pid)
            window = reply(client, cid, f"readlines {log} 3 2")
            read = rchar(d.proc.pid) - before
            whole = reply(client, cid, f"read {log}")
    finally:
        d.stop()
    FAULTS["agent files: line window"] += 1
    assert window == "ok:line 3\nline 4\n", window
    assert read < 256 << 10, f"agentd read {read} bytes for lines 3-4"
    assert whole.startswith("error:") and "larger than agent_files.max_bytes" in whole, whole[:200]


# --------------------------------------------------------------------------- writes


def test_a_write_through_a_hard_link_leaves_the_outside_file_untouched(tmp_path: Path, tree: Path) -> None:
    outside = tmp_path / "outside" / "secret.txt"
    os.link(outside, tree / "hard.txt")
    (tree / "run.sh").write_text("echo old\n")
    os.chmod(tree / "run.sh", 0o750)
    d = start(tmp_path / "d")
    try:
        with d.client() as client:
            cid = open_acp(client, tree)
            FAULTS["agent files: hard link out"] += 1
            assert reply(client, cid, f"write {tree / 'hard.txt'} pwned") == "ok"
            assert reply(client, cid, f"write {tree / 'run.sh'} echo-new") == "ok"
            assert reply(client, cid, f"read {tree / 'hard.txt'}") == "ok:pwned"
    finally:
        d.stop()
    assert outside.read_text() == SECRET + "\n" and outside.stat().st_nlink == 1
    assert (tree / "hard.txt").read_text() == "pwned"
    assert (tree / "run.sh").read_text() == "echo-new" and stat.S_IMODE((tree / "run.sh").stat().st_mode) == 0o750
    assert not list(tree.glob(".agentd-*")), "a temporary file was left behind"


# --------------------------------------------------------------------------- agentd's own files


def test_agentds_state_runtime_and_config_under_the_workdir_are_refused(tmp_path: Path) -> None:
    # The default `--cwd .` in $HOME: the daemon's state, runtime and config all lie under the workdir.
    home = tmp_path / "home"
    d = start(home)
    (home / "notes.txt").write_text("mine\n")
    # Beside the config: the keys, and the variables (NODE_OPTIONS, LD_PRELOAD) every runtime starts with.
    env_file = home / "environment"
    try:
        with d.client() as client:
            script = new(client, home, ECHO)
            cid = open_acp(client, home)
            answer = reply(client, cid, f"write {env_file} NODE_OPTIONS=--require=./evil.js")
            assert answer.startswith("error:") and "agentd's own" in answer, answer
            assert not env_file.exists(), "an agent created agentd's environment file"
            env_file.write_text("SOME_API_KEY=sk-kept-from-agents\n")
            env_file.chmod(0o600)
            record = d.state_dir / "conversations" / script / "record.json"
            saved = record.read_bytes()
            for path in (record, d.state_dir / "agentd.lock", d.state_dir / "conversations" / cid / "events.jsonl",
                         d.runtime_dir / "agentd.sock", d.config, env_file, d.state_dir / "no-such-file"):
                FAULTS["agent files: agentd's own"] += 1
                answer = reply(client, cid, f"read {path}")
                assert answer.startswith("error:") and "agentd's own" in answer, (path, answer)
            for path in (record, d.state_dir / "new.txt", d.runtime_dir / "ws-token", d.config, env_file,
                         d.state_dir / "conversations" / "x" / "y.json"):
                answer = reply(client, cid, f"write {path} pwned")
                assert answer.startswith("error:") and "agentd's own" in answer, (path, answer)
            assert reply(client, cid, f"read {home / 'notes.txt'}") == "ok:mine\n"
            assert record.read_bytes() == saved
    finally:
        d.stop()
    assert not (d.state_dir / "new.txt").exists() and not (d.runtime_dir / "ws-token").exists()
    assert not (d.state_dir / "conversations" / "x").exists()
    assert "pwned" not in d.config.read_text() and env_file.read_text() == "SOME_API_KEY=sk-kept-from-agents\n"


# --------------------------------------------------------------------------- a hung file system


_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture
def hung_mount(tree: Path) -> Iterator[Path]:
    """``<work>/hung``: a FUSE mount whose server never answers (every lookup in it hangs, killably),
    as a hung NFS server would. Ended by closing /dev/fuse (pending requests then fail ENOTCONN)."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        unavailable("a FUSE mount needs root and /dev/fuse")
    mnt = tree / "hung"
    mnt.mkdir()
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)  # close-on-exec: the daemon must not hold it
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    if _libc.mount(b"agentd-test-hung", str(mnt).encode(), b"fuse", ctypes.c_ulong(0), opts) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        unavailable(f"mounting FUSE failed: {os.strerror(err)}")
    try:
        yield mnt
    finally:
        os.close(fd)
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_hung_request_hits_its_deadline_while_other_conversations_go_on_and_sigterm_stops_promptly(
    tmp_path: Path, tree: Path, hung_mount: Path
) -> None:
    d = start(tmp_path / "d", "[agent_files]\ntimeout_s = 2.0\nthreads = 2\n")
    try:
        with d.client() as client, d.client() as other:
            cid = open_acp(client, tree)
            script = new(other, tree, ECHO)
            other.subscribe(script)
            # 50 reads into the hung mount at once: more than any thread pool of the daemon.
            run = client.request(wire.Send, conversation=cid, text=f"readmany 50 {hung_mount / 'file.txt'}")["run"]
            sent = time.monotonic()

            def answered() -> bool:
                return any(r["type"] == "turn" and r.get("run") == run and r["data"]["state"] != "working"
                           for r in d.journal(cid))

            turns = 0
            while not answered() and time.monotonic() - sent < 15:  # meanwhile the other conversation goes on
                records = run_turn(other, script, f"hello {turns}", timeout=5)
                assert msgspec.json.decode(records[-1].data)["state"] == "completed"
                turns += 1
            took_reads = time.monotonic() - sent
            records = client.follow(run, timeout=10)
            texts = [msgspec.json.decode(r.data).get("text", "") for r in records if r.type == "item"]
            answers = many(next(t for t in texts if t.startswith("many:")))
            # The hung threads are still stuck in the kernel; the agent's file access stays usable.
            assert reply(client, cid, f"read {tree / 'inside.txt'}", timeout=15).startswith("error:")
            FAULTS["agent files: hung file system"] += len(answers)
            stopping = time.monotonic()
            d.proc.send_signal(signal.SIGTERM)
            try:
                d.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            took = time.monotonic() - stopping
    finally:
        d.stop(signal.SIGKILL)
    assert len(answers) == 50 and all("did not finish within 2 s" in a for a in answers), answers[:3]
    assert took_reads < 6, f"the hung reads were answered after {took_reads:.1f} s"
    assert turns >= 3, f"only {turns} turns of the other conversation completed meanwhile"
    assert d.proc.returncode == 0 and took < 5, f"agentd took {took:.1f} s to stop (exit {d.proc.returncode})"
