"""Whether another process holds a runtime's session open: the checks behind ``in_use``.

Each runtime leaves a mark of its own while a process has a session open; a mark
whose process is gone (it crashed) is stale and does not count:

* Copilot CLI: ``<copilot_home>/session-state/<id>/inuse.<pid>.lock``, one per process
  that holds the session (it is removed when that process lets go).
* Claude Code: ``<config dir>/sessions/<pid>.json``, one per running CLI process, naming
  the ``sessionId`` it works on.

A process is alive when ``/proc/<pid>`` (or ``kill(pid, 0)``) says so; a pid reused by
an unrelated process since is the one false positive, and errs on the safe side (busy).
Synchronous file reads: call these from a worker thread.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from .. import runtime_output

_COPILOT_LOCK = re.compile(r"^inuse\.(\d+)\.lock$")
#: Claude Code's per-process files are small JSON; bigger is not one
_MAX_SESSION_FILE = 64 << 10


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (ours or another user's)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def copilot(home: Path, ids: Iterable[str], *, own: set[int]) -> set[str]:
    """The ids whose Copilot session directory holds an ``inuse.<pid>.lock`` of a live process
    that is not one of ``own`` (agentd's own CLI)."""
    out: set[str] = set()
    for sid in ids:
        try:
            names = os.listdir(home / "session-state" / sid)
        except OSError:
            continue
        for name in names:
            match = _COPILOT_LOCK.match(name)
            if match and int(match.group(1)) not in own and alive(int(match.group(1))):
                out.add(sid)
                break
    return out


def claude(config_dir: Path, ids: Iterable[str], *, own: set[int]) -> set[str]:
    """The ids that a live Claude Code process (not one of ``own``) names in
    ``<config_dir>/sessions/<pid>.json``."""
    wanted = set(ids)
    out: set[str] = set()
    try:
        entries = list(os.scandir(config_dir / "sessions"))
    except OSError:
        return out
    for entry in entries:
        stem, dot, ext = entry.name.partition(".")
        if ext != "json" or not stem.isdigit() or int(stem) in own:
            continue
        try:
            data = runtime_output.decode_json(_small_file(entry.path))
        except (OSError, ValueError):  # also JSON nested too deeply (msgspec.DecodeError)
            continue
        sid = data.get("sessionId") if isinstance(data, dict) else None
        if isinstance(sid, str) and sid in wanted and alive(int(stem)):
            out.add(sid)
    return out


def _small_file(path: str) -> bytes:
    """The bytes of the regular file at ``path`` of at most _MAX_SESSION_FILE bytes; OSError otherwise
    (a symlink, a FIFO that would block, a device that never ends, a bigger file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_SESSION_FILE:
            raise OSError(errno.EINVAL, "not a small regular file", path)
        return os.read(fd, _MAX_SESSION_FILE + 1)
    finally:
        os.close(fd)
