"""Runtime processes that cannot outlive agentd: how they are started, recorded and reaped.

Every runtime process (an ACP agent, a script tool's shell, the Copilot and
Claude CLIs the SDKs spawn) starts under ``agentd/_launcher.py``, a keeper
at the head of a process group of its own with a parent-death watch (see its
docstring for why a keeper, not a ``preexec_fn``). The keeper writes
``<state_dir>/runtimes/<pid>.json`` (atomically, 0600) with its pid, process
group and start time (field 22 of ``/proc/PID/stat``, clock ticks after
boot), the runtime's pid and start time, the agentd pid and the boot id, and
removes it when the runtime ends.

At start, with the state-dir lock held, :func:`reap_previous` reads the
records a previous instance left and ends what of them still runs: the
group (and the keeper's descendants, setsid-ed tool shells included) of
each record whose keeper pid is alive with the recorded start time, or,
when the keeper is gone, the members left in its group (a pgid is not
reused while any member lives, and a reused one has a leader whose start
time does not match). SIGTERM and SIGCONT first, SIGKILL after
``grace_s``. Never by name; a pid that now belongs to another process is
left alone (logged ``runtime.record_stale``). Each group reaped is logged as
``runtime.reaped`` with pid, pgid, what it was and how many processes.

Linux only (``/proc``, ``prctl``); elsewhere :func:`launch_argv` returns
the command unchanged and nothing is recorded. Synchronous: call
:func:`reap_previous` from a worker thread.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import msgspec
import structlog

from . import _fsutil, _launcher

log = structlog.get_logger("agentd.procs")

#: Under the state dir: one ``<keeper pid>.json`` per running runtime, and the SDK launch scripts.
RECORDS_DIR = "runtimes"
#: SIGTERM to SIGKILL, seconds, for the keeper when agentd died and for the reaper at start.
GRACE_S = 2.0
LAUNCHER = str(Path(__file__).with_name("_launcher.py"))
#: the keeper's "SIGKILL everything" signal (see _launcher.py)
KILL_ALL = signal.SIGUSR2
SUPPORTED = sys.platform.startswith("linux") and os.path.isdir("/proc/self")


class RuntimeRecord(msgspec.Struct, frozen=True):
    """What ``_launcher.py`` writes: the keeper (pid = pgid) and the runtime it forked."""

    pid: int
    pgid: int
    start: int | None
    runtime_pid: int
    runtime_start: int | None
    parent: int
    parent_start: int | None = None
    boot_id: str = ""
    what: str = ""
    command: str = ""


_decoder = msgspec.json.Decoder(RuntimeRecord)


def records_dir(state_dir: Path) -> Path:
    return Path(state_dir) / RECORDS_DIR


def launch_argv(argv: list[str], *, state_dir: Path, what: str, path: str | None = None) -> list[str]:
    """``argv`` run under the keeper. Raises FileNotFoundError when ``argv[0]`` is not found on ``path``.

    ``what`` names the runtime in records and logs ("acp:gemini", "script tool").
    """
    if not SUPPORTED:
        return list(argv)
    exe = shutil.which(argv[0], path=path) if os.sep not in argv[0] else argv[0]
    if exe is None or not os.path.exists(exe):
        raise FileNotFoundError(2, "No such file or directory", argv[0])
    return [sys.executable, "-I", "-S", LAUNCHER, *_keeper_args(state_dir, what), "--", *argv]


def launch_script(command: list[str], *, state_dir: Path, what: str) -> str:
    """An executable that runs ``command`` + its own arguments under the keeper, for an SDK's ``cli_path``.

    The Copilot and Claude SDKs spawn ``[cli_path, args...]`` themselves, with no
    hook before exec; this script is that ``cli_path``. Written atomically, 0700.
    """
    if not SUPPORTED:
        return command[0]
    directory = records_dir(state_dir)
    _fsutil.make_dirs(directory)
    argv = [sys.executable, "-I", "-S", LAUNCHER, *_keeper_args(state_dir, what), "--", *command]
    text = f"#!/bin/sh\nexec {shlex.join(argv)} \"$@\"\n"
    safe = "".join(ch if ch.isalnum() else "-" for ch in what)
    path = directory / f"launch-{safe}.sh"
    try:
        if path.read_text() == text:
            return str(path)
    except OSError:
        pass
    tmp = directory / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o700)
    try:
        _fsutil.write_all(fd, text.encode())
    finally:
        os.close(fd)
    os.rename(tmp, path)
    return str(path)


def _keeper_args(state_dir: Path, what: str) -> list[str]:
    directory = records_dir(state_dir)
    _fsutil.make_dirs(directory)
    return ["--parent", str(os.getpid()), "--records", str(directory), "--what", what, "--grace", f"{GRACE_S:g}"]


def kill(pid: int) -> None:
    """SIGKILL the runtime under keeper ``pid``: its group and its descendants, setsid-ed ones too.

    The keeper does it (and exits killed by SIGKILL); wait for it a moment,
    then :func:`ended` SIGKILLs the group in case the keeper could not act.
    """
    try:
        if SUPPORTED:
            os.kill(pid, KILL_ALL)
            os.kill(pid, signal.SIGCONT)  # a stopped keeper cannot act on it
        else:
            os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def ended(pid: int | None, state_dir: Path) -> None:
    """The keeper ``pid`` was reaped: SIGKILL what is left of its group, drop its record. Idempotent."""
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        (records_dir(state_dir) / f"{pid}.json").unlink()
    except OSError:
        pass


async def run_kept(argv: list[str], *, state_dir: Path, what: str, env: dict[str, str],
                   timeout_s: float) -> tuple[int, bytes, bytes]:
    """Run a short runtime command (``claude auth status``) under the keeper, like every runtime:
    SIGKILL of agentd ends it too. Returns (exit status, stdout, stderr).

    Raises FileNotFoundError when ``argv[0]`` is not found, trio.TooSlowError past ``timeout_s``
    (the command and what it started are killed then, and on cancel).
    """
    import subprocess

    import trio

    argv = launch_argv(argv, state_dir=state_dir, what=what, path=env.get("PATH"))
    proc = await trio.lowlevel.open_process(argv, env=env, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out: list[bytes] = []
    err: list[bytes] = []

    async def drain(stream: trio.abc.ReceiveStream, into: list[bytes]) -> None:
        async for chunk in stream:
            into.append(chunk)

    try:
        with trio.fail_after(timeout_s):
            async with trio.open_nursery() as nursery:
                assert proc.stdout is not None and proc.stderr is not None
                nursery.start_soon(drain, proc.stdout, out)
                nursery.start_soon(drain, proc.stderr, err)
                await proc.wait()
    finally:
        if proc.returncode is None:
            kill(proc.pid)  # the keeper ends the command and whatever it started
            with trio.CancelScope(shield=True):
                await proc.wait()
        ended(proc.pid, state_dir)
        with trio.CancelScope(shield=True):
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    await stream.aclose()
    return proc.returncode, b"".join(out), b"".join(err)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _targets(rec: RuntimeRecord, procs: dict[int, tuple[int, int, int]]) -> tuple[list[int], str]:
    """The pids of ``rec``'s group (and the keeper's descendants) still alive, and why they match."""
    leader = procs.get(rec.pgid)
    if leader is not None:
        if leader[2] != rec.start:
            return [], "pid reused"  # a new process holds the pid (and so the group id): not ours
        return sorted(_launcher.group_and_below(rec.pgid, procs)), "keeper alive"
    # The keeper is gone; members left in its group were started after it.
    left = [pid for pid, (_, pgid, start) in procs.items()
            if pgid == rec.pgid and rec.start is not None and start >= rec.start]
    return sorted(left), "group left without its keeper"


def reap_previous(state_dir: Path, *, grace_s: float = GRACE_S) -> list[RuntimeRecord]:
    """End the runtimes a previous agentd instance left running; return the records reaped.

    Blocks up to ``grace_s`` (plus a moment) when something had to be ended.
    Every record read is removed. Call it with the state-dir lock held,
    before any runtime of this instance starts.
    """
    if not SUPPORTED:
        return []
    directory = records_dir(state_dir)
    _fsutil.make_dirs(directory)  # here, in a worker thread: later spawns on the trio thread only stat it
    names = sorted(os.listdir(directory))
    boot = _boot_id()
    me = os.getpid()
    table = _launcher.table()
    work: list[tuple[RuntimeRecord, list[int], str, Path]] = []
    for name in names:
        path = directory / name
        if name.startswith(".") and name.endswith(".tmp"):
            path.unlink(missing_ok=True)  # a record torn by a crash mid-write
            continue
        if not name.endswith(".json"):
            continue
        try:
            rec = _decoder.decode(_fsutil.read_file(path))  # never a symlink, FIFO or device
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("runtime.record_unreadable", path=str(path), error=str(exc))
            path.unlink(missing_ok=True)
            continue
        if rec.parent == me:
            continue  # ours (cannot happen at start; kept safe for a second call)
        if rec.boot_id and boot and rec.boot_id != boot:
            path.unlink(missing_ok=True)  # from before a reboot: nothing of it runs
            continue
        pids, why = _targets(rec, table)
        if why == "pid reused":
            log.info("runtime.record_stale", pid=rec.pid, pgid=rec.pgid, what=rec.what,
                     recorded_start=rec.start, start=table[rec.pgid][2])
        if pids:
            work.append((rec, pids, why, path))
        else:
            path.unlink(missing_ok=True)
    if not work:
        return []
    for rec, pids, _, _ in work:
        _signal(rec.pgid, pids, signal.SIGTERM)
        _signal(rec.pgid, pids, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pids) for _, pids, _, _ in work):
        time.sleep(0.05)
    for rec, pids, why, path in work:
        left = _alive(pids)
        if left:
            _signal(rec.pgid, left, signal.SIGKILL)
        log.warning("runtime.reaped", pid=rec.pid, pgid=rec.pgid, what=rec.what, command=rec.command,
                    runtime_pid=rec.runtime_pid, processes=len(pids), killed=len(left), matched=why)
        path.unlink(missing_ok=True)
    return [rec for rec, _, _, _ in work]


def _alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if _launcher.stat(pid) is not None]


def _signal(pgid: int, pids: list[int], sig: int) -> None:
    """``sig`` to each of ``pids`` (matched by start time a moment ago) and to group ``pgid``."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass
