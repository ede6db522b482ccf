"""Small file-system helpers shared by the journal and the lease store.

Everything here is synchronous and blocking; callers on the trio thread keep
the calls short (one small file) or move them to a worker thread.
"""

from __future__ import annotations

import ctypes
import errno
import os
import pathlib
import re
import secrets
import stat
import struct
import time

from collections.abc import Iterator
from typing import BinaryIO

from . import _trust

#: State directories hold prompts and transcripts: owner only.
DIR_MODE = 0o700
FILE_MODE = 0o600

# Names that are safe as one path component: no separator, no leading dot (so no "..", no hidden or temp file).
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")


def is_safe_name(name: str) -> bool:
    """Whether ``name`` (a conversation id, a lease key) can name a directory under a state dir."""
    return _SAFE_NAME.match(name) is not None


def make_dirs(path: pathlib.Path) -> None:
    """Create ``path`` and every missing parent, each exactly 0700 whatever the umask; an existing one is left as it is.

    A directory it creates is made durable in its parent (fsync), so files
    later fsynced inside it cannot vanish with it after a crash. The rule
    behind it, and the checks of the directories agentd trusts, are in :mod:`agentd._trust`.
    """
    _trust.make_dir(path)


def read_file(path: pathlib.Path) -> bytes:
    """The bytes of the regular file at ``path``, never through a symlink (OSError ELOOP) nor from a FIFO or device."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """``os.write`` until every byte of ``data`` is written (regular files may write short)."""
    n = os.write(fd, data)
    if n == len(data):
        return
    view = memoryview(data)
    while n < len(view):
        n += os.write(fd, view[n:])


def fsync_dir(path: pathlib.Path) -> None:
    """fsync a directory, so a rename or unlink in it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: pathlib.Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` so a reader (or a crash) sees the old or the new content, never a mix.

    Writes a temporary file in the same directory (mode 0600), fsyncs it,
    renames it over ``path`` and fsyncs the directory. The directory must
    exist. With ``durable`` false there is no fsync: readers still see old or
    new, but a power cut may leave the old content (for what is worth nothing
    after one, such as a liveness heartbeat). Raises ``OSError``; the
    temporary file is removed on failure.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        try:
            write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


def real_path(path: str) -> str | None:
    """``os.path.realpath(path)``, or None for a path no file can have (a NUL, a lone surrogate:
    what a runtime's own records may name). Blocking."""
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return None


_STATX_BTIME = 0x800
_AT_SYMLINK_NOFOLLOW = 0x100
_CLOCK_REALTIME_COARSE = 5  # Linux's clock id; the clock the kernel stamps new files with
try:
    #: how far a birth time may lag ``time.time()``: one tick of the kernel's coarse clock (4 ms at HZ=250)
    BIRTH_TIME_TICK_S = time.clock_getres(_CLOCK_REALTIME_COARSE)
except (OSError, AttributeError):
    BIRTH_TIME_TICK_S = 0.01
#: struct statx: stx_mask (u32) at 0, stx_btime (s64 seconds, u32 nanoseconds) at 80; 256 bytes in all
_STATX_SIZE, _STATX_BTIME_AT = 256, 80
_statx = None


def birth_time(dir_fd: int, name: bytes) -> float | None:
    """When ``name`` in the folder ``dir_fd`` (any fd of it, O_PATH included) was created, unix
    seconds, not following a symlink; None when the file system does not record it (statx(2)'s
    STATX_BTIME: ext4, xfs, btrfs and tmpfs do), the C library lacks statx, or it fails.
    The kernel stamps it with its coarse clock, up to :data:`BIRTH_TIME_TICK_S` behind ``time.time()``."""
    global _statx
    if _statx is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).statx
        except (AttributeError, OSError):
            fn = False
        else:
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
            fn.restype = ctypes.c_int
        _statx = fn
    if not _statx:
        return None
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    if _statx(dir_fd, name, _AT_SYMLINK_NOFOLLOW, _STATX_BTIME, buf) != 0:
        return None
    (mask,) = struct.unpack_from("I", buf, 0)
    if not mask & _STATX_BTIME:
        return None
    sec, nsec = struct.unpack_from("qI", buf, _STATX_BTIME_AT)
    return sec + nsec / 1e9


def open_regular(path: str | os.PathLike[str]) -> tuple[BinaryIO, os.stat_result]:
    """``path`` open for reading, and its stat. Raises OSError unless it is a regular file: a
    symlink (ELOOP), a FIFO (a read would block its thread forever, and shutdown with it) and a
    device such as /dev/zero (a line that never ends) are refused (EINVAL)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    f = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
    except BaseException:
        f.close()
        raise
    return f, st


def bounded_lines(f: BinaryIO, end: int, max_line: int) -> Iterator[bytes | int]:
    """The lines of ``f`` from where it stands up to byte ``end`` (a line cut there comes out cut),
    for a file a runtime wrote. A line over ``max_line`` bytes is never held: its size in bytes
    (up to ``end``) stands for it."""
    pos = f.tell()
    while pos < end:
        line = f.readline(min(max_line, end - pos))
        if not line:
            return
        pos += len(line)
        if line.endswith(b"\n") or len(line) < max_line or pos >= end:
            yield line
            continue
        size = len(line)
        while not line.endswith(b"\n") and pos < end:
            line = f.readline(min(1 << 20, end - pos))
            if not line:
                break
            pos += len(line)
            size += len(line)
        yield size
