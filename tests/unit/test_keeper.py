"""agentd/_launcher.py, the keeper: nothing started under it outlives it, however agentd's runtime ends.

The runtime here starts, when told to end, a descendant that keeps forking: each generation
``setsid``-s away from the keeper's group, forks the next and exits, faster than a /proc scan
reads. Whichever way the runtime ends (agentd SIGKILLed: the keeper's watch; the runtime exits by
itself; agentd's "SIGKILL all of it"), the keeper exits only when nothing of it is left, and a
single SIGKILL pass over one scan (which it once was) leaves the walker running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from agentd import procs

pytestmark = pytest.mark.skipif(not procs.SUPPORTED, reason="the keeper is Linux only")

#: descendants walking at once (each one's escape from a single scan-and-SIGKILL pass is likely, not certain)
WALKERS = 12
#: longest they walk, seconds, while the keeper runs: past its grace (0.3 s here), within its kill rounds'
#: bound (5 s), so a loaded machine's slow keeper still ends its tree; one alive once the keeper is gone says so
WALK_S = 3.0

#: argv: READY. SIGTERM: start the walkers and stay (it ignores SIGTERM); SIGHUP: start it and exit 0.
RUNTIME = r'''
import os, signal, sys, time

ready = sys.argv[1]

keeper = os.getppid()

def keeper_alive():
    try:
        with open(f"/proc/{keeper}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False

def walk(signum, frame):
    until = time.monotonic() + WALK_S
    for _ in range(WALKERS):
        if os.fork() == 0:
            # Walk while the keeper runs (however slow its kills are on a loaded machine), at most WALK_S.
            while time.monotonic() < until and keeper_alive():
                os.setsid()  # a group and session of its own, out of the keeper's group
                if os.fork():
                    os._exit(0)  # the next generation is an orphan: the keeper (a subreaper) gets it
                open(ready + ".walking", "a").close()
            if not keeper_alive():  # alive after the keeper ended: it outlived the SIGKILLs
                with open(ready + ".escaped", "a") as f:
                    f.write(f"{os.getpid()}\n")
            os._exit(0)
    if signum == signal.SIGHUP:
        os._exit(0)

signal.signal(signal.SIGTERM, walk)
signal.signal(signal.SIGHUP, walk)
open(ready, "w").close()
while True:
    time.sleep(1)
'''

#: argv: LAUNCHER RECORDS RUNTIME READY. Starts the keeper as agentd does, prints its pid, sleeps.
AGENTD = r'''
import os, subprocess, sys, time

launcher, records, runtime, ready = sys.argv[1:]
argv = [sys.executable, "-I", "-S", launcher, "--parent", str(os.getpid()), "--records", records,
        "--what", "test", "--grace", "0.3", "--", sys.executable, runtime, ready]
print(subprocess.Popen(argv).pid, flush=True)
time.sleep(600)
'''


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _marked(token: bytes) -> list[int]:
    """Live processes whose environment carries ``token``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                environ = Path(f"/proc/{name}/environ").read_bytes()
            except OSError:
                continue
            if token in environ and _alive(int(name)):
                out.append(int(name))
    return out


def _wait(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("how", ["agentd_killed", "runtime_exits", "kill_all"])
def test_the_keeper_exits_only_when_nothing_below_it_is_left_even_a_descendant_that_keeps_forking(
    tmp_path: Path, how: str
) -> None:
    records = procs.records_dir(tmp_path)
    records.mkdir(parents=True)
    runtime, agentd_py, ready = tmp_path / "runtime.py", tmp_path / "agentd.py", tmp_path / "ready"
    runtime.write_text(RUNTIME.replace("WALKERS", str(WALKERS)).replace("WALK_S", str(WALK_S)))
    agentd_py.write_text(AGENTD)
    mark = uuid.uuid4().hex
    token = f"KEEPER_TEST_MARK={mark}".encode()
    agentd = subprocess.Popen([sys.executable, str(agentd_py), procs.LAUNCHER, str(records), str(runtime), str(ready)],
                              stdout=subprocess.PIPE, env={**os.environ, "KEEPER_TEST_MARK": mark})
    try:
        assert agentd.stdout is not None
        keeper = int(agentd.stdout.readline())
        assert _wait(ready.exists, 20), "the runtime never started"
        if how == "agentd_killed":  # the watch: SIGTERM (the walker starts), SIGKILL after the grace
            agentd.kill()
            agentd.wait()
        elif how == "runtime_exits":  # SIGHUP is passed on: the walker starts and the runtime exits 0
            os.kill(keeper, signal.SIGHUP)
        else:  # the walker runs when agentd asks the keeper to SIGKILL all of it
            os.kill(keeper, signal.SIGTERM)
            assert _wait(Path(f"{ready}.walking").exists, 20), "the walker never ran"
            os.kill(keeper, procs.KILL_ALL)
        assert _wait(lambda: not _alive(keeper), 20), "the keeper did not exit"
        # A /proc scan does not see a walker (each generation is gone before the scan reads its pid):
        # a walker that escaped tells, once it sees the keeper gone.
        time.sleep(1.0)
        escaped = Path(f"{ready}.escaped")
        assert not escaped.exists(), f"{how}: walkers outlived the keeper: {escaped.read_text().split()}"
        left = [pid for pid in _marked(token) if pid != agentd.pid]
        assert not left, f"{how}: left running after the keeper exited: {left}"
        assert not list(records.glob("*.json"))
    finally:
        agentd.kill()
        agentd.wait()
        deadline = time.monotonic() + 60
        while (left := _marked(token)) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
