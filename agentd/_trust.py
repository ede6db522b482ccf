"""Which paths agentd trusts, and how it creates and opens them (sshd's StrictModes is the model).

Threat: another local user creates agentd's runtime or state directory first
(a shared ``/tmp`` path when ``XDG_RUNTIME_DIR`` is missing, a state dir on a
shared disk) and fills it with their gateway token or a pending task; an
agentd that adopts it runs their commands as its own user. A symlink left in
one of those places makes agentd write, or ``chmod``, whatever it points at.

The rule, for every path agentd trusts (runtime dir, state dir, the socket's
directory, the config file and its directory, the environment file beside it,
the gateway token file, the lock file, agentctl's autostart log):

- it is looked at with ``lstat``: a symlink where a directory or file is
  expected is refused, never followed;
- it is owned by agentd's effective uid (the config and environment files and
  their directory: or root) and not writable by group or others; the token file, a secret, is not
  readable by them either;
- every directory above it, both as written and with symlinks resolved, is
  owned by root or by agentd's uid and not writable by group or others unless
  sticky (``/tmp``): whoever may rename entries there could swap the trusted
  path for their own; a symlink on the way is owned by root or agentd's uid
  (in a sticky directory its owner may replace it to point elsewhere).

Directories agentd creates, parents included, are 0700 whatever the umask; an
existing runtime or state dir that passes is narrowed to 0700 (a chmod that
never follows a symlink). Files are opened with ``O_NOFOLLOW``, created 0600,
and checked again with ``fstat`` on the open descriptor.

A path that breaks the rule, or that the system will not let agentd use
(EACCES, EPERM, EROFS, ENOTDIR, ELOOP, ENAMETOOLONG, ...), raises
:class:`Untrusted`, whose text names the path and what is wrong. The daemon
exits :data:`EXIT_UNUSABLE` (78, EX_CONFIG) on it: a restart cannot fix it,
and the shipped systemd unit does not retry 78. Other OSErrors (ENOSPC, EIO),
which may pass, stay OSError.

Standard library only (no trio, structlog or msgspec): agentctl applies the
same rule to the runtime dir and its autostart log, and so words a refusal
exactly as the daemon does.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile

__all__ = [
    "EXIT_UNUSABLE",
    "SUN_PATH_MAX",
    "Untrusted",
    "check_config_file",
    "check_socket_length",
    "check_socket_path",
    "chmod_nofollow",
    "make_dir",
    "open_file",
    "private_dir",
]

#: Exit status for a start-up error a restart cannot fix (sysexits EX_CONFIG).
EXIT_UNUSABLE = 78
#: Longest AF_UNIX socket path, bytes: Linux's sun_path is 108 bytes, the last one the NUL.
SUN_PATH_MAX = 107

#: errnos that say "this path cannot be used", which waiting will not change.
_UNUSABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG,
             errno.EEXIST, errno.EISDIR}


class Untrusted(Exception):
    """``what`` at ``path`` breaks the trust rule or cannot be used; ``str()`` says which and why.

    Example: ``state dir /tmp/x: owned by uid 1001 (bob), not by agentd's uid 1000 (ann)``.
    """

    def __init__(self, what: str, path: str | os.PathLike[str], problem: str) -> None:
        self.what = what
        self.path = os.fspath(path)
        self.problem = problem
        super().__init__(f"{what} {self.path}: {problem}")


def user_runtime_dir(app: str) -> str:
    """platformdirs' user runtime dir of ``app`` (``$XDG_RUNTIME_DIR/<app>``, else a fallback such as
    ``/tmp/runtime-<uid>``). Raises :class:`Untrusted` when platformdirs refuses its fallback (another
    user made it first), not platformdirs' PermissionError."""
    import warnings

    import platformdirs

    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; its fallback is what agentd uses.
        warnings.simplefilter("ignore")
        try:
            return platformdirs.user_runtime_dir(app)
        except PermissionError as exc:
            fallback = os.path.join(tempfile.gettempdir(), f"runtime-{os.geteuid()}")
            raise Untrusted("runtime dir", fallback, f"refused: {exc} (or AGENTD_RUNTIME_DIR)") from None


def _who(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a file"


def _writers(mode: int) -> str:
    return " and ".join(w for bit, w in ((stat.S_IWGRP, "group"), (stat.S_IWOTH, "others")) if mode & bit)


def _problem(path: str, st: os.stat_result, *, directory: bool, root_ok: bool = False,
             secret: bool = False) -> str | None:
    """What is wrong with ``st`` (an lstat or fstat of ``path``) by the rule; None when nothing."""
    mode = st.st_mode
    want = "a directory" if directory else "a regular file"
    if stat.S_ISLNK(mode):
        try:
            target = f" (to {os.readlink(path)})"
        except OSError:
            target = ""
        return f"a symlink{target}, not {want}: agentd does not follow symlinks for the paths it trusts"
    if (stat.S_ISDIR(mode)) != directory or not (directory or stat.S_ISREG(mode)):
        return f"{_kind(mode)}, not {want}"
    uid = os.geteuid()
    if st.st_uid != uid and not (root_ok and st.st_uid == 0):
        either = " or root" if root_ok else ""
        return f"owned by {_who(st.st_uid)}, not by agentd's {_who(uid)}{either}: another user may have put it there"
    if mode & 0o022:
        return f"writable by {_writers(mode)} (mode {stat.S_IMODE(mode):04o}); chmod go-w it"
    if secret and mode & 0o077:
        return f"readable by group or others (mode {stat.S_IMODE(mode):04o}); it holds a secret: chmod 600 it"
    return None


def _ancestors(d: str) -> list[str]:
    """``d`` and every directory above it, up to ``/``."""
    out = [d]
    while (parent := os.path.dirname(out[-1])) != out[-1]:
        out.append(parent)
    return out


def _check_dir_above(what: str, path: str, d: str, st: os.stat_result) -> None:
    uid = os.geteuid()
    if st.st_uid not in (0, uid):
        raise Untrusted(what, path, f"it lies in {d}, owned by {_who(st.st_uid)}, who could replace it")
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise Untrusted(what, path, f"it lies in {d}, writable by {_writers(st.st_mode)} "
                                    f"(mode {stat.S_IMODE(st.st_mode):04o}), who could replace it")


def _check_above(what: str, path: str) -> None:
    """Every directory above ``path`` is root's or ours and not writable by others (sticky excepted)."""
    _check_from(what, path, os.path.dirname(os.path.abspath(path)))


def _check_from(what: str, path: str, start: str) -> None:
    """``start`` (above ``path``) and every directory above it pass the rule (see :func:`_check_above`).

    Both the path as written and the path with its symlinks resolved are
    checked: agentd keeps using the path by name, so a symlink on the way is
    only as safe as its owner (who may, in a sticky ``/tmp``, replace it to
    point elsewhere) and the directory holding it.
    """
    uid = os.geteuid()
    for d in _ancestors(start):
        st = os.lstat(d)
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in (0, uid):
                raise Untrusted(what, path, f"it lies under {d}, a symlink owned by {_who(st.st_uid)}, "
                                            "who could point it elsewhere")
        else:
            _check_dir_above(what, path, d, st)
    for d in _ancestors(os.path.realpath(start)):
        _check_dir_above(what, path, d, os.stat(d))


def _unusable(what: str, path: str | os.PathLike[str], exc: OSError) -> Exception:
    """An errno waiting cannot change becomes :class:`Untrusted`; others (ENOSPC, EIO) stay OSError."""
    if exc.errno not in _UNUSABLE:
        return exc
    return Untrusted(what, path, f"cannot be used: {exc.strerror or exc}")


def chmod_nofollow(path: str | os.PathLike[str], mode: int) -> None:
    """``chmod`` that never follows a symlink at ``path`` (raises OSError, ELOOP for a symlink)."""
    try:
        os.chmod(path, mode, follow_symlinks=False)
        return
    except NotImplementedError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def make_dir(path: str | os.PathLike[str]) -> bool:
    """Create ``path`` and its missing parents, each exactly 0700 whatever the umask; True if it created ``path``.

    An existing entry is left as it is (the caller checks it). Each directory it
    creates is fsynced into its parent. Raises OSError.
    """
    path = os.path.abspath(path)
    missing = []
    d = path
    while True:
        try:
            os.lstat(d)
            break
        except FileNotFoundError:
            missing.append(d)
            d = os.path.dirname(d)
    created = False
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            created = False
            continue
        chmod_nofollow(d, 0o700)  # the umask may have taken owner bits away
        fd = os.open(os.path.dirname(d), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        created = True
    return created


def private_dir(path: str | os.PathLike[str], what: str, *, narrow: bool = True) -> None:
    """Make ``path`` a directory agentd may trust, or raise :class:`Untrusted` naming what is wrong.

    Creates it (and missing parents) 0700; checks it and every directory above
    by the rule; ``narrow`` sets an existing one that passes to 0700. What
    already exists above it is checked before anything is created, so nothing
    is made in (or through) a directory that breaks the rule.
    """
    try:
        existing = os.path.abspath(path)
        while not os.path.lexists(existing):
            existing = os.path.dirname(existing)
        if existing != os.path.abspath(path):
            _check_from(what, os.fspath(path), existing)
        make_dir(path)
        st = os.lstat(path)
        problem = _problem(os.fspath(path), st, directory=True)
        if problem:
            raise Untrusted(what, path, problem)
        _check_above(what, os.path.abspath(path))
        if narrow and stat.S_IMODE(st.st_mode) != 0o700:
            chmod_nofollow(path, 0o700)
    except OSError as exc:
        raise _unusable(what, path, exc) from None


def open_file(path: str | os.PathLike[str], flags: int, what: str, *, root_ok: bool = False,
              secret: bool = False) -> int:
    """``os.open(path, flags)`` that never follows a symlink; the file, checked by the rule, as a descriptor.

    Created 0600 when ``flags`` has ``O_CREAT``; close-on-exec; never blocks
    on a FIFO (which is refused). Raises FileNotFoundError when it does not
    exist (and ``O_CREAT`` is not given), :class:`Untrusted` otherwise.
    The directory it is in is the caller's to check.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Untrusted(what, path, _problem(os.fspath(path), os.lstat(path), directory=False) or "a symlink") \
                from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads, opened for writing
            raise Untrusted(what, path, "a FIFO, not a regular file") from None
        raise _unusable(what, path, exc) from None
    try:
        problem = _problem(os.fspath(path), os.fstat(fd), directory=False, root_ok=root_ok, secret=secret)
        if problem:
            raise Untrusted(what, path, problem)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_config_file(path: str | os.PathLike[str], what: str = "config file", *, secret: bool = False) -> bytes:
    """The bytes of the config file at ``path``, which with its directory must pass the rule (root may own both).

    ``what`` names the file in a refusal (the environment file beside
    agentd.toml is config too: it sets the environment every runtime starts from).
    ``secret``: the file holds a secret (the store's ``dsn_file``), so group and others may not read it either.
    Raises FileNotFoundError, :class:`Untrusted`.
    """
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    try:
        problem = _problem(parent, os.lstat(parent), directory=True, root_ok=True)
        if problem:
            raise Untrusted("config dir", parent, problem)
        _check_above("config dir", parent)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise _unusable("config dir", parent, exc) from None
    fd = open_file(path, os.O_RDONLY, "secret file" if secret and what == "config file" else what,
                   root_ok=True, secret=secret)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def check_socket_length(path: str | os.PathLike[str]) -> None:
    """Raise :class:`Untrusted` when ``path`` is too long for an AF_UNIX address (daemon and agentctl say the same)."""
    n = len(os.fsencode(path))
    if n > SUN_PATH_MAX:
        raise Untrusted("socket path", path, f"{n} bytes, over the AF_UNIX limit of {SUN_PATH_MAX} bytes "
                                             f"({SUN_PATH_MAX + 1} with the NUL): set a shorter AGENTD_SOCKET "
                                             "or runtime dir")


def check_socket_path(path: str | os.PathLike[str]) -> bool:
    """Check the socket path before agentd binds it; True when a socket file is already there.

    Raises :class:`Untrusted` when the path is too long for AF_UNIX, or when
    something other than a socket (a regular file, a symlink, a directory) is
    there: agentd only ever replaces a stale socket of its own, never deletes a file.
    """
    check_socket_length(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise _unusable("socket", path, exc) from None
    if not stat.S_ISSOCK(st.st_mode):
        raise Untrusted("socket", path, f"{_kind(st.st_mode)}, not a socket: agentd replaces only a stale socket "
                                        "there, it does not delete anything else; move it away")
    if st.st_uid != os.geteuid():
        raise Untrusted("socket", path, f"owned by {_who(st.st_uid)}, not by agentd's {_who(os.geteuid())}")
    return True
