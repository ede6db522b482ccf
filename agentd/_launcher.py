"""The keeper between agentd and one runtime process: ``python -I -S _launcher.py ARGS -- CMD...``.

Run as a script (stdlib only, no agentd import: it starts in ~20 ms). It
puts itself at the head of a process group of its own, forks CMD, records
both in ``RECORDS/<its pid>.json`` and waits. Why a process of its own
rather than a ``preexec_fn``: Linux sends the parent-death signal when the
parent *thread* ends, and agentd's spawns come from trio's worker threads
and the SDKs' threads, which end long before the runtime should. So:

* the runtime child gets ``PR_SET_PDEATHSIG`` SIGKILL with this keeper (one
  thread, alive as long as it is) as its parent;
* this keeper gets ``PR_SET_PDEATHSIG`` SIGUSR1 and, on it, looks at
  ``getppid()``: the same agentd process means only a thread of it ended
  (ignored); another means agentd died, and it ends the runtime: SIGTERM to
  its group and every descendant (and to those that appear later), then
  SIGKILL after ``--grace`` seconds;
* it is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a tool shell that
  ``setsid``-ed itself away from the group and lost its parent is reparented
  here, not to init, and is still found as a descendant.

Signals agentd (or an SDK) sends it (TERM, INT, HUP, QUIT) are passed to
the runtime; SIGUSR2 from agentd means "SIGKILL all of it" (group and
descendants, then itself), since a SIGKILL of the keeper could not reach
the descendants that left its group. When the runtime exits, what is left of its group and its
descendants is SIGKILLed, the record removed, and the keeper exits the way
the runtime did (same code, or the same signal). Its stdio is /dev/null
after the fork, so the runtime's pipes close when the runtime's do.

Every SIGKILL is :func:`_kill_below`: rounds of scan and SIGKILL until this
keeper has no child left (as a subreaper, no child means nothing below it),
for at most ``KILL_S`` seconds, and only then does the keeper exit. One
scan is not enough: a process may fork between the scan that finds it and
its SIGKILL (a tool shell, ``timeout`` passing on a signal, a runtime's own
shutdown), and the scan of /proc is not atomic. The record stays when
something could not be ended, for the reaper at agentd's next start.
"""

from __future__ import annotations

import os
import sys
import time

import _signal as signal  # the signal module's enums would cost ~10 ms of start-up

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
WATCH = signal.SIGUSR1
#: agentd's "SIGKILL all of it": a SIGKILL of the keeper itself would leave setsid-ed descendants behind.
KILL_ALL = signal.SIGUSR2
#: at most this long of SIGKILL rounds (against a descendant that keeps forking)
KILL_S = 5.0


def _prctl(option: int, arg: int) -> int:
    """prctl(2). Through _ctypes when it can (import ctypes costs ~15 ms of every runtime start)."""
    try:
        import _ctypes

        fn = _ctypes.dlsym(_ctypes.dlopen(None, os.RTLD_NOW), "prctl")
        return _ctypes.call_function(fn, (option, arg, 0, 0, 0))
    except (ImportError, AttributeError, OSError):
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)


def _stat(pid: int) -> tuple[bool, int, int, int] | None:
    """(zombie, ppid, pgid, start time) of PID from /proc/PID/stat (start time: field 22, clock
    ticks after boot); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2:].split()
        return fields[0] == b"Z", int(fields[1]), int(fields[2]), int(fields[19])
    except (OSError, ValueError, IndexError):  # gone (a torn read of an exiting one, too)
        return None


def stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, pgid, start time) of a live PID; None when it is gone or a zombie (which needs no signal)."""
    st = _stat(pid)
    if st is None or st[0]:
        return None
    return st[1:]


def start_time(pid: int) -> int | None:
    st = stat(pid)
    return st[2] if st is not None else None


def table(zombies: bool = False) -> dict[int, tuple[int, int, int]]:
    """``stat`` of every live process (and of every zombie too with ``zombies``)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and (zombies or not st[0]):
                out[int(name)] = st[1:]
    return out


def group_and_below(pgid: int, procs: dict[int, tuple[int, int, int]]) -> set[int]:
    """The members of group ``pgid`` and, through ppid links, every descendant of them and of ``pgid``."""
    found = {pid for pid, (_, group, _) in procs.items() if group == pgid}
    frontier = found | {pgid}
    while frontier:
        frontier = {pid for pid, (ppid, _, _) in procs.items() if ppid in frontier and pid not in found}
        found |= frontier
    return found


def _others(me: int) -> list[int]:
    """Live processes in my group or below me, without me.

    Zombies are walked through, not returned: the scan is not atomic, and a child read
    before its parent died still names that parent (by now a zombie) as its ppid.
    """
    procs = table(zombies=True)
    return sorted(pid for pid in group_and_below(me, procs) - {me} if stat(pid) is not None)


def _children(me: int) -> list[int]:
    """My direct children, zombies too, from one small read; [] where the kernel does not list them."""
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:
            return [int(pid) for pid in f.read().split()]
    except OSError:
        return []


def _kill_below(me: int, deadline: float) -> bool:
    """SIGKILL everything in my group or below me, round after round, until no child is left
    (reaped), or ``deadline`` (monotonic) passes; whether nothing is left.

    A round: a /proc scan and SIGKILL of what it found, then quick SIGKILL passes over my
    direct children (an orphan comes here, so a process that forks and exits faster than a
    scan reads /proc is caught one generation at a time), then a reap. A SIGKILLed process
    can fork no more, so each round leaves only what forked before its SIGKILL.
    """
    while _reap_any():
        killed = _others(me)
        _signal_all(killed, signal.SIGKILL)
        seen = set(killed)
        for _ in range(1000):
            kids = [pid for pid in _children(me) if pid not in seen]
            if not kids:
                break
            _signal_all(kids, signal.SIGKILL)
            seen.update(kids)
        if time.monotonic() >= deadline:
            return not _reap_any()
        time.sleep(0.005)  # the SIGKILLed take a moment to die: poll, do not spin
    return True


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _reap_any() -> bool:
    """Collect exited children (orphans reparented to this subreaper); whether any child is left.

    Everything in this keeper's group or below it is its descendant (orphans come
    here), so no child left means nothing left at all.
    """
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


#: this keeper's process name (/proc/PID/comm): what agentd.agent_peers looks for among a
#: client's parents. Only this process can set it (or one that may ptrace it).
NAME = "agentd-keeper"


def _name_self() -> None:
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(NAME)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    split = argv.index("--")
    opts = dict(zip(argv[:split:2], argv[1:split:2]))
    cmd = argv[split + 1:]
    parent = int(opts["--parent"])
    records = opts["--records"]
    grace = float(opts.get("--grace", "2"))
    me = os.getpid()
    if os.getpgrp() != me:
        os.setsid()  # the SDKs spawn without a session of its own
    _name_self()
    record = os.path.join(records, f"{me}.json")
    ending = False

    def end_all() -> None:
        nonlocal ending
        ending = True
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_IGN)
        termed: set[int] = set()
        deadline = time.monotonic() + grace
        while _reap_any() and time.monotonic() < deadline:
            # what forked since (a tool shell's child, a runtime's shutdown hook) gets its SIGTERM too
            new = [pid for pid in _others(me) if pid not in termed]
            _signal_all(new, signal.SIGTERM)
            _signal_all(new, signal.SIGCONT)
            termed.update(new)
            time.sleep(0.05)
        if _kill_below(me, time.monotonic() + KILL_S):
            _unlink(record)

    def on_watch(signum: int, frame: object) -> None:
        if os.getppid() != parent and not ending:
            end_all()
            os._exit(128 + signal.SIGTERM)

    def on_kill_all(signum: int, frame: object) -> None:
        nonlocal ending
        ending = True
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_IGN)
        if _kill_below(me, time.monotonic() + KILL_S):
            _unlink(record)
        os.kill(me, signal.SIGKILL)  # ends the way agentd asked for: killed by SIGKILL

    signal.signal(WATCH, on_watch)
    signal.signal(KILL_ALL, on_kill_all)
    _prctl(PR_SET_PDEATHSIG, WATCH)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != parent:
        return 125  # agentd died before the watch was armed
    child = os.fork()
    if child == 0:
        try:
            signal.signal(WATCH, signal.SIG_DFL)
            signal.signal(KILL_ALL, signal.SIG_DFL)
            # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec:
            # give the runtime (and its tools' `seq | head` pipelines) the defaults, as subprocess does.
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != me:
                os._exit(125)
            os.execvp(cmd[0], cmd)
        except BaseException as exc:
            os.write(2, f"agentd: could not start {cmd[0]}: {exc}\n".encode())
        os._exit(127)

    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(child, signum)
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    try:
        _write_record(record, {
            "pid": me, "pgid": me, "start": start_time(me),
            "runtime_pid": child, "runtime_start": start_time(child),
            "parent": parent, "parent_start": start_time(parent),
            "boot_id": _boot_id(), "what": opts.get("--what", ""), "command": cmd[0],
        })
    except OSError:
        pass  # the watch works without it; only a reap at the next start needs it
    while True:
        pid, status = os.waitpid(-1, 0)  # PEP 475: retried after a signal handler ran
        if pid == child:
            break
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_IGN)
    # leftovers: background jobs, setsid-ed tool shells (no child left: nothing left, and no scan)
    if _kill_below(me, time.monotonic() + KILL_S):
        _unlink(record)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(sig, signal.SIG_DFL)
        os.kill(me, sig)
        return 128 + sig
    return os.waitstatus_to_exitcode(status)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _json(value: object) -> str:
    """JSON of ints, None and strings (the json module would cost this keeper ~10 ms of start-up)."""
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(ch if ch >= " " else f"\\u{ord(ch):04x}" for ch in text) + '"'


def _write_record(path: str, data: dict[str, object]) -> None:
    """Atomic (rename), not fsynced: it only matters while this boot runs, and a crash of agentd keeps the page cache."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.tmp")  # the reaper at start removes a torn one
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, ("{" + ", ".join(f"{_json(k)}: {_json(v)}" for k, v in data.items()) + "}").encode())
    finally:
        os.close(fd)
    os.rename(tmp, path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
