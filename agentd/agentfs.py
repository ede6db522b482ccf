"""Files read and written on an agent's behalf, confined to its conversation's workdir.

Provider-neutral: ACP's ``fs/read_text_file`` and ``fs/write_text_file`` go
through here (:mod:`agentd.providers.acp._fs`), and so must anything later
that touches a file for an agent. The agent is untrusted (DESIGN.md, Trust;
issue 12): it runs code as the user and may change the workdir while agentd
works in it, so every rule below holds against a concurrent rename, symlink
swap or FIFO.

* The workdir is pinned when the conversation opens (:func:`pin`): one
  directory handle (an ``O_PATH`` fd). Every path is resolved once, beneath
  that handle, and the work is then done on the fds the resolution gave: no
  second lookup by name, so a swap between a check and an open cannot
  redirect it. Resolution uses ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS
  | RESOLVE_NO_MAGICLINKS)`` where the kernel has it (Linux 5.6+; ENOSYS,
  EPERM from a seccomp filter or EINVAL make it fall back), else a
  component-by-component walk with ``O_NOFOLLOW | O_DIRECTORY`` from the
  pinned fd. No symlink is followed, even one pointing inside; ``..`` is
  applied to the path's text first and may not climb out.
* agentd's own directories (state, runtime, config) and files (config file
  and the environment file beside it, socket, gateway token) are refused even
  inside the workdir: the ancestry of the file's directory is read back up to
  the pinned root through ``..`` and compared by ``st_dev``/``st_ino``; an own
  file is matched by its ``st_dev``/``st_ino`` and by (its directory's
  ``st_dev``/``st_ino``, its name), so one not there yet is not created
  either. A workdir inside one of them gets no file access at all.
* Regular files only: opened ``O_NONBLOCK | O_NOFOLLOW`` and ``fstat``-ed;
  FIFOs, devices, sockets and directories are refused (:class:`NotRegular`).
  At most ``max_bytes`` + 1 bytes are read; a file past ``max_bytes`` is
  refused (:class:`TooLarge`). A ``line``/``limit`` read stops once it has
  its lines.
* A write goes to a new temporary file (``O_EXCL``) in the target's own
  directory, fsynced, then ``renameat`` over the name: a hard link to a file
  outside is replaced, never written through. The mode (and, for root, the
  owner) of a file replaced is kept. Missing parent directories are created
  (0777 less the umask), beneath the pinned root like everything else.
* Each request runs in a worker thread on a :class:`trio.CapacityLimiter` of
  its own (``threads``, shared by all conversations of the daemon run) with a
  deadline (``timeout_s``, waiting for a thread included), abandoned on
  cancellation: a request stuck in the kernel (a hung NFS or FUSE server)
  answers :class:`TimedOut` and never holds up journal fsyncs, lease renewals,
  other conversations or shutdown. An abandoned thread keeps its limiter token
  (and the pinned fd stays open) until the kernel lets it go; a write that
  times out may still land later.

Paths given are absolute (beneath the workdir as given at :func:`pin` or its
real path) or relative to the workdir. Errors (all :class:`FileAccessError`,
an :class:`agentd.contract.AgentdError`) say what was refused and why; a
missing file raises ``FileNotFoundError``, other OS errors ``OSError``.

``AGENTD_AGENTFS_WALK=1`` in the daemon's environment forces the walk even
where openat2 works (the tests run both).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import posixpath
import secrets
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import ClassVar, TypeVar

import msgspec
import trio

from . import _fsutil
from .contract import AgentdError, LimitExceeded

__all__ = [
    "FileAccessError", "NotRegular", "Policy", "Refused", "TimedOut", "TooLarge", "Workdir", "openat2_available", "pin",
]

T = TypeVar("T")

#: bytes per read() of a file
CHUNK = 64 << 10
#: ``..`` steps from a file's directory up to the pinned root before giving up (deeper is refused)
MAX_DEPTH = 4096

_O_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_DIR = _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC

# --------------------------------------------------------------------------- errors


class FileAccessError(AgentdError):
    """A file request on an agent's behalf that agentd will not (or could not) do; ``path`` as asked."""

    code: ClassVar[str] = "invalid"

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class Refused(FileAccessError):
    """The path leads outside the workdir, through a symlink, or into agentd's own files.

    ``kind``: ``outside``, ``symlink`` or ``agentd``.
    """

    def __init__(self, message: str, path: str = "", kind: str = "outside") -> None:
        super().__init__(message, path)
        self.kind = kind


class NotRegular(FileAccessError):
    """The path names a directory, FIFO, device or socket: only regular files are read or written."""


class TooLarge(FileAccessError, LimitExceeded):
    """The file (or the content to write) is larger than ``max_bytes``."""

    code: ClassVar[str] = "limit"


class TimedOut(FileAccessError):
    """The request did not finish within ``timeout_s`` (waiting for a thread included)."""

    code: ClassVar[str] = "internal"


# --------------------------------------------------------------------------- policy


class Policy(msgspec.Struct, frozen=True, kw_only=True):
    """Limits and agentd's own paths; built once by the daemon (``[agent_files]`` of agentd.toml)."""

    #: largest file read or written, bytes
    max_bytes: int = 10 << 20
    #: deadline of one request, seconds
    timeout_s: float = 30.0
    #: worker threads for file requests, all conversations together
    threads: int = 4
    #: directories refused wherever they lie (state, runtime, config dir); missing ones are ignored
    own_dirs: tuple[str, ...] = ()
    #: files refused wherever they lie, there yet or not (config and environment file, socket, gateway token)
    own_files: tuple[str, ...] = ()


_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("agentd.agentfs.limiter")


def _limiter(threads: int) -> trio.CapacityLimiter:
    try:
        return _LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(threads)
        _LIMITER.set(limiter)
        return limiter


async def _run(policy: Policy, what: str, path: str, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a thread of the file-access limiter, within ``policy.timeout_s``; raises TimedOut."""
    try:
        with trio.fail_after(policy.timeout_s):
            return await trio.to_thread.run_sync(fn, *args, limiter=_limiter(policy.threads), abandon_on_cancel=True)
    except trio.TooSlowError:
        raise TimedOut(f"{what} {path} did not finish within {policy.timeout_s:g} s (agent_files.timeout_s); "
                       "the file system may be hung", path) from None


# --------------------------------------------------------------------------- openat2


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
#: openat2's number is 437 on every architecture of the unified syscall table (x86_64, aarch64, ...)
_SYS_OPENAT2 = 437 if platform.system() == "Linux" and platform.machine() in (
    "x86_64", "aarch64", "arm64", "armv7l", "riscv64", "ppc64le", "s390x", "i686") else None
_openat2_state: bool | None = None
_syscall: Callable[..., int] | None = None


def _openat2(dirfd: int, path: str, flags: int) -> int:
    """openat2(dirfd, path, {flags, 0, BENEATH | NO_SYMLINKS | NO_MAGICLINKS}); raises OSError."""
    assert _syscall is not None
    how = _OpenHow(flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = _syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(path)),
                  ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def openat2_available() -> bool:
    """Whether paths are resolved with openat2 (probed once: a kernel or seccomp filter may lack it)."""
    global _openat2_state, _syscall
    if _openat2_state is None:
        _openat2_state = False
        if _SYS_OPENAT2 is not None and os.environ.get("AGENTD_AGENTFS_WALK") != "1":
            try:
                fn = ctypes.CDLL(None, use_errno=True).syscall
                fn.restype = ctypes.c_long
                _syscall = fn
                os.close(_openat2(-100, ".", _DIR))  # AT_FDCWD
                _openat2_state = True
            except (OSError, AttributeError):
                _syscall = None
    return _openat2_state


# --------------------------------------------------------------------------- pinning


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _names(paths: Iterable[str]) -> frozenset[tuple[tuple[int, int], str]]:
    """(st_dev/st_ino of the directory, name) of each path whose directory exists, the file or not."""
    out = set()
    for p in paths:
        try:
            out.add((_ident(os.stat(os.path.dirname(os.path.abspath(p)))), os.path.basename(p)))
        except OSError:
            pass
    return frozenset(out)


def _idents(paths: Iterable[str]) -> frozenset[tuple[int, int]]:
    out = set()
    for p in paths:
        try:
            out.add(_ident(os.stat(p)))
        except OSError:
            pass  # not there (yet): nothing to refuse
    return frozenset(out)


async def pin(workdir: str, policy: Policy) -> Workdir:
    """Open ``workdir`` (absolute; symlinks in it followed, as the user gave it) and pin it.

    Runs on the file-access limiter within the deadline. Raises
    NotADirectoryError / FileNotFoundError / PermissionError, TimedOut.
    Close the result with :meth:`Workdir.close`.
    """
    return await _run(policy, "opening the workdir", workdir, Workdir, workdir, policy)


class Workdir:
    """A conversation's pinned workdir; reads and writes files beneath it for the agent.

    Thread-safe; the async methods are the API (each a worker-thread request
    under the policy's limiter and deadline). The fd is closed by
    :meth:`close` once no request still uses it.
    """

    def __init__(self, path: str, policy: Policy) -> None:
        self.path = os.path.abspath(path)
        self.policy = policy
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False
        #: attachments the agent may read although they lie outside: path -> (st_dev, st_ino)
        self._extra: dict[str, tuple[int, int]] = {}
        self._fd = os.open(self.path, _DIR)
        try:
            self._root = _ident(os.fstat(self._fd))
            self.real = os.path.realpath(self.path)
            self._own_dirs = _idents(policy.own_dirs)
            self._own_files = _idents(policy.own_files)
            # By name too: one not there yet (the environment file) must not be created by an agent.
            self._own_names = _names(policy.own_files)
            self._in_own = self._inside_own_dir()
        except BaseException:
            os.close(self._fd)
            raise

    def __repr__(self) -> str:
        return f"Workdir({self.path!r})"

    # ------------------------------------------------------------------ API

    async def read_text(self, path: str, line: int | None = None, limit: int | None = None) -> str:
        """The file's text (UTF-8, undecodable bytes replaced); from 1-based ``line``, at most ``limit`` lines.

        Raises Refused, NotRegular, TooLarge, TimedOut, FileNotFoundError, OSError.
        """
        return await _run(self.policy, "reading", path, self._read, path, line, limit)

    async def write_text(self, path: str, content: str) -> None:
        """Replace (or create) the file with ``content`` (UTF-8), creating missing parent directories.

        Raises Refused, NotRegular, TooLarge, TimedOut, OSError.
        """
        await _run(self.policy, "writing", path, self._write, path, content)

    async def allow(self, paths: Iterable[str]) -> None:
        """Let the agent read these files although they lie outside (a prompt's attachments):
        exactly the files there now (by st_dev/st_ino), through exactly these paths."""
        await _run(self.policy, "allowing", "attachments", self._allow, list(paths))

    def close(self) -> None:
        """Release the pinned fd (now, or when the last running request ends). Idempotent."""
        with self._lock:
            self._closing = True
            if self._users == 0 and self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    # ------------------------------------------------------------------ the worker-thread side

    @contextmanager
    def _use(self, path: str) -> Iterator[int]:
        """The pinned fd, kept open while the caller uses it (a close meanwhile waits for it)."""
        with self._lock:
            if self._closing:
                raise FileAccessError(f"the conversation's workdir is no longer open (asked for {path})", path)
            self._users += 1
        try:
            yield self._fd
        finally:
            with self._lock:
                self._users -= 1
                if self._closing and self._users == 0 and self._fd >= 0:
                    os.close(self._fd)
                    self._fd = -1

    def _allow(self, paths: list[str]) -> None:
        for p in paths:
            try:
                st = os.stat(p, follow_symlinks=False)
            except OSError:
                continue  # gone already: nothing to allow
            if stat.S_ISREG(st.st_mode):
                for name in {os.path.normpath(os.path.abspath(p)), os.path.realpath(p)}:
                    self._extra[name] = _ident(st)

    def _read(self, path: str, line: int | None, limit: int | None) -> str:
        fd = self._open_extra(path)
        if fd is None:
            with self._use(path) as root:
                parent, name = self._parent(root, path, create=False)
                try:
                    fd = self._open_in(parent, name, path)
                finally:
                    os.close(parent)
        try:
            if line is None and limit is None:
                data = _read_bounded(fd, self.policy.max_bytes, path)
            else:
                data = _read_lines(fd, line, limit, self.policy.max_bytes, path)
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace")

    def _open_extra(self, path: str) -> int | None:
        """An fd on the attachment ``path`` names, if it is one and still that same file."""
        ident = self._extra.get(os.path.normpath(path)) if os.path.isabs(path) else None
        if ident is None:
            return None
        fd = os.open(path, _READ)
        st = os.fstat(fd)
        if _ident(st) != ident or not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise self._outside(path)
        return fd

    def _open_in(self, parent: int, name: str, path: str) -> int:
        """``name`` in the directory ``parent``, opened for reading: a regular file that is none of agentd's."""
        try:
            fd = os.open(name, _READ, dir_fd=parent)
        except OSError as exc:
            raise self._explain(exc, parent, name, path) from None
        try:
            self._check_file(os.fstat(fd), path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check_file(self, st: os.stat_result, path: str) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        if _ident(st) in self._own_files:
            raise Refused(f"{path} is one of agentd's own files; agents may not read or write it", path, "agentd")

    def _write(self, path: str, content: str) -> None:
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise FileAccessError(f"the content for {path} is not valid Unicode (a lone surrogate)", path) from None
        if len(data) > self.policy.max_bytes:
            raise TooLarge(f"the content for {path} is {len(data)} bytes, more than agent_files.max_bytes "
                           f"({self.policy.max_bytes})", path)
        with self._use(path) as root:
            parent, name = self._parent(root, path, create=True)
            try:
                self._replace(parent, name, data, path)
            finally:
                os.close(parent)

    def _replace(self, parent: int, name: str, data: bytes, path: str) -> None:
        try:
            old = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None:
            if stat.S_ISLNK(old.st_mode):
                raise self._symlink(path, name)
            self._check_file(old, path)
        tmp = f".agentd-{secrets.token_hex(8)}.tmp"
        mode = stat.S_IMODE(old.st_mode) & 0o777 if old is not None else 0o666
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent)
        try:
            try:
                if old is not None:
                    if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                        try:
                            os.fchown(fd, old.st_uid, old.st_gid)
                        except PermissionError:
                            pass  # not root: the new file is ours, as any editor's save would make it
                    os.fchmod(fd, mode)  # the umask took bits off at create
                _fsutil.write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            # Replaces the name, whatever it is by now: a link swapped in is replaced, never followed.
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            raise

    # ------------------------------------------------------------------ resolution

    def _relative(self, path: str) -> list[str]:
        """``path``'s components beneath the root, ``..`` applied; raises Refused when it climbs out."""
        if not path or "\0" in path:
            raise Refused(f"{path!r} is not a usable path", path)
        if os.path.isabs(path):
            norm = posixpath.normpath(path)
            for base in (self.path, self.real):
                if norm == base:
                    return []
                prefix = base.rstrip("/") + "/"
                if norm.startswith(prefix):
                    return norm[len(prefix):].split("/")
            raise self._outside(path)
        norm = posixpath.normpath(path)
        if norm == ".":
            return []
        if norm == ".." or norm.startswith("../"):
            raise self._outside(path)
        return norm.split("/")

    def _parent(self, root: int, path: str, *, create: bool) -> tuple[int, str]:
        """An fd on the directory holding ``path``'s file, and the file's name in it.

        Checked: beneath the root, no symlink on the way, none of agentd's
        directories in its ancestry. ``create`` makes missing directories.
        """
        if self._in_own:
            raise Refused(f"{path}: the conversation's workdir {self.path} lies inside agentd's own directories; "
                          "agents get no file access there", path, "agentd")
        parts = self._relative(path)
        if not parts:
            raise NotRegular(f"{path} is the workdir itself, a directory, not a regular file", path)
        dirs, name = parts[:-1], parts[-1]
        fd = self._open_dirs(root, dirs, path, create=create)
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        if (_ident(os.fstat(fd)), name) in self._own_names:
            os.close(fd)
            raise Refused(f"{path} is one of agentd's own files; agents may not read or write it", path, "agentd")
        return fd, name

    def _open_dirs(self, root: int, dirs: list[str], path: str, *, create: bool) -> int | None:
        """The directory ``dirs`` beneath ``root``, checked; None when one is missing and not ``create``."""
        if not dirs:
            return os.dup(root)
        if openat2_available():
            try:
                fd = _openat2(root, "/".join(dirs), _DIR)
            except FileNotFoundError:
                pass  # the walk finds the deepest directory there is, checks it, and makes the rest
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    raise self._outside(path) from None
                if exc.errno == errno.ELOOP:
                    raise self._symlink(path, "a component") from None
                raise
            else:
                try:
                    self._check_ancestry(fd, path)
                except BaseException:
                    os.close(fd)
                    raise
                return fd
        fd = os.dup(root)
        try:
            for i, part in enumerate(dirs):
                try:
                    nxt = os.open(part, _DIR | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    self._check_ancestry(fd, path)  # nothing is made (or reported missing) in agentd's directories
                    if not create:
                        os.close(fd)
                        return None
                    try:
                        os.mkdir(part, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass  # made meanwhile: opened (and checked) below like any other
                    try:
                        nxt = os.open(part, _DIR | os.O_NOFOLLOW, dir_fd=fd)
                    except OSError as exc:
                        raise self._explain(exc, fd, part, path, "/".join(dirs[: i + 1])) from None
                except OSError as exc:
                    raise self._explain(exc, fd, part, path, "/".join(dirs[: i + 1])) from None
                os.close(fd)
                fd = nxt
            self._check_ancestry(fd, path)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _check_ancestry(self, fd: int, path: str) -> None:
        """Refuse unless the directory ``fd`` lies beneath the root, through none of agentd's directories."""
        for ident in _ancestry(fd):
            if ident in self._own_dirs:
                raise Refused(f"{path} lies in one of agentd's own directories (its state, runtime or config); "
                              "agents may not read or write there", path, "agentd")
            if ident == self._root:
                return
        raise self._outside(path)  # moved out of the workdir meanwhile (or deeper than MAX_DEPTH)

    def _inside_own_dir(self) -> bool:
        """Whether the root itself is, or lies inside, one of agentd's directories."""
        return any(ident in self._own_dirs for ident in _ancestry(self._fd))

    # ------------------------------------------------------------------ messages

    def _outside(self, path: str) -> Refused:
        return Refused(f"{path} is outside the conversation's workdir {self.path}", path, "outside")

    def _symlink(self, path: str, what: str) -> Refused:
        return Refused(f"{path}: {what} is a symbolic link; agent file access follows no links (one could lead "
                       f"outside the conversation's workdir {self.path})", path, "symlink")

    def _explain(self, exc: OSError, dirfd: int, name: str, path: str, shown: str = "") -> Exception:
        """The error to raise for an open of ``name`` in ``dirfd`` that failed with ``exc``.

        The lstat here only words the message; nothing is opened on its say-so.
        """
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            return self._symlink(path, shown or name)
        if exc.errno in (errno.ENOTDIR, errno.ENXIO, errno.EOPNOTSUPP):
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except OSError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                return self._symlink(path, shown or name)
            if st is not None and stat.S_ISDIR(st.st_mode) and exc.errno == errno.ENOTDIR:
                # A directory now, not one when opened with O_NOFOLLOW: a link was swapped in and out.
                return self._symlink(path, f"{shown or name} (changed while agentd opened it)")
            if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
                return _not_regular(path, st.st_mode)
        return OSError(exc.errno, exc.strerror, path)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def _ancestry(fd: int) -> Iterator[tuple[int, int]]:
    """st_dev/st_ino of the directory ``fd``, then of each parent (through ``..``) up to ``/``."""
    cur = os.dup(fd)
    try:
        st = os.fstat(cur)
        for _ in range(MAX_DEPTH):
            yield _ident(st)
            up = os.open("..", _DIR, dir_fd=cur)
            os.close(cur)
            cur = up
            parent = os.fstat(cur)
            if _ident(parent) == _ident(st):  # "/" is its own parent
                return
            st = parent
    finally:
        os.close(cur)


def _not_regular(path: str, mode: int) -> NotRegular:
    kind = next((name for test, name in _KINDS if test(mode)), "of an unknown kind")
    return NotRegular(f"{path} is {kind}, not a regular file: agent file access reads and writes regular files only",
                      path)


def _too_large(path: str, cap: int) -> TooLarge:
    return TooLarge(f"{path} is larger than agent_files.max_bytes ({cap} bytes); ask for a line range "
                    "(line, limit) near its start, or raise the limit", path)


def _read_bounded(fd: int, cap: int, path: str) -> bytes:
    """The whole file, reading at most ``cap`` + 1 bytes; raises TooLarge past ``cap``."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(CHUNK, cap + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > cap:
            raise _too_large(path, cap)
        chunks.append(chunk)


def _read_lines(fd: int, line: int | None, limit: int | None, cap: int, path: str) -> bytes:
    """Lines ``line`` (1-based) .. ``line + limit - 1``, reading no further than the last of them
    (and at most ``cap`` + 1 bytes: lines lying past ``cap`` raise TooLarge)."""
    skip = max((line or 1) - 1, 0)
    want = None if limit is None else max(limit, 0)
    out: list[bytes] = []
    if want == 0:
        return b""
    buf = bytearray()
    total = 0
    seen = 0  # complete lines taken from buf so far
    eof = False
    while not eof:
        chunk = os.read(fd, min(CHUNK, cap + 1 - total))
        total += len(chunk)
        over = total > cap  # byte cap + 1 is there: lines ending within the first cap bytes still count
        buf += chunk[: len(chunk) - 1] if over else chunk
        eof = not chunk
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                if eof and start < len(buf):
                    end = len(buf) - 1  # the last line, without its newline
                else:
                    break
            if seen >= skip:
                out.append(bytes(buf[start:end + 1]))
                if want is not None and len(out) >= want:
                    return b"".join(out)
            seen += 1
            start = end + 1
        del buf[:start]
        if over:
            raise _too_large(path, cap)
    return b"".join(out)
