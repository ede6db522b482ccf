"""Whether anything under a directory changed since a mark: inotify, so a checkpoint can skip git.

A checkpoint of an unchanged working directory runs ``git ls-files`` only to learn that
nothing changed (agentd.checkpoints); on a small tree that git run is most of what a turn
waits for. :class:`TreeWatch` answers the same question from the kernel: it watches every
directory of the tree (each watch added before that directory is listed, so nothing created
meanwhile goes unseen), and the kernel queues an event before the syscall that changed a file
returns. No event since :meth:`TreeWatch.mark` therefore means no change made through the
file system's paths since then.

It says "changed" whenever it cannot be sure: an event of any kind (an overflowed queue
included), a tree of more than ``max_dirs`` directories, a watch the kernel refused, a file
system whose changes may come from elsewhere (network and FUSE file systems; only the local
ones in :data:`LOCAL_FS` are trusted). What inotify cannot see, and so neither can this: a
write through a shared ``mmap``, and a file hard-linked from outside the tree written
through its other name. ``[checkpoints] watch = false`` makes every checkpoint run git.
Linux only (:data:`SUPPORTED`).
"""

from __future__ import annotations

import fcntl
import os
import sys
import termios
import threading
import weakref
from pathlib import Path
from typing import Any

#: file systems whose every change is made by this kernel (so inotify sees it)
LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs", "zfs", "bcachefs", "jfs",
                      "reiserfs", "overlay", "ramfs"})
SUPPORTED = sys.platform.startswith("linux")
#: inotify instances and watches are the user's, shared with their editors and tools (the
#: kernel's defaults: 128 instances, as few as 8,192 watches): agentd takes at most these
MAX_INSTANCES = 8
MAX_WATCHES = 4096
_used = {"instances": 0, "watches": 0}
#: the armed watches, least recently used first: a tree that needs a share the others hold
#: takes it from the one used longest ago (which says "changed" until it is marked again)
_armed: dict[int, "weakref.ref[TreeWatch]"] = {}
#: marks run in worker threads, several shadows' at once: the shares above are counted under it
_lock = threading.RLock()


def fs_type(path: str, mountinfo: str | None = None) -> str:
    """The file system type of the mount ``path`` lies on, from /proc/self/mountinfo ("" if
    unknown), or ``"mounts inside"`` when another file system is mounted below ``path``: its
    changes are another file system's, and listing it could hang (a stuck FUSE or NFS mount).
    ``mountinfo``: that file's text (default: read it)."""
    try:
        real = os.path.realpath(path)
        lines = (Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo).splitlines()
    except OSError:
        return ""
    best, kind, below = -1, "", False
    prefix = real.rstrip("/") + "/"
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        point = fields[4].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
        if point.startswith(prefix):
            below = True
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # the last of equal mount points is the one on top
            best, kind = len(point), right.split()[0]
    return "mounts inside" if below else kind


class TreeWatch:
    """inotify watches on every directory under ``root`` but those in ``exclude`` (absolute
    paths: agentd's own state directory when it lies inside) and those named ``.git``; of
    ``root/.git`` only its ``info`` directory counts (``info/exclude`` decides what is ignored).

    :meth:`mark` (re)arms; :meth:`changed` says whether anything happened since. One owner (a
    checkpoint shadow's worker) calls both, from any thread; another tree's mark may take this
    one's inotify share meanwhile (:data:`MAX_INSTANCES`, :data:`MAX_WATCHES`: the least
    recently used armed watch gives its share up, never one in a mark or a changed() call).
    Never raises OSError: what fails leaves the watch unarmed, and an unarmed watch always
    says "changed".
    """

    def __init__(self, root: str, *, exclude: frozenset[str] = frozenset(), max_dirs: int = 1024) -> None:
        self.root = root
        self.exclude = exclude
        self.max_dirs = max_dirs
        self._inotify: Any = None
        self._mask = 0
        #: watch descriptor -> the directory it watches, as it was named when the watch was added
        self._paths: dict[int, str] = {}
        #: the watch on root/.git, whose events count only for its "info" entry
        self._git_wd = -1
        #: the watch on root itself: its going (moved, deleted, unmounted) leaves nothing watched at root's path
        self._root_wd = -1
        #: events read by changed() and not yet taken in by mark()
        self._seen: list[Any] = []
        #: FIONREAD's answer, reused: changed() asks it before every turn (a read only when it says bytes)
        self._avail = bytearray(4)
        #: why the watch is not armed ("" = armed or never marked)
        self.unarmed = ""
        #: held by the owner's mark() and changed(): another tree's mark evicts only an idle watch
        self._busy = threading.Lock()

    @property
    def armed(self) -> bool:
        return self._inotify is not None

    def mark(self) -> bool:
        """Take in what happened so far and watch the tree as it is now; whether it is armed.

        Armed already: the new directories the events name are watched (each before it is
        listed); a directory moved, or a queue that overflowed, arms the whole tree again.
        Blocking (a listing per directory armed): run it in a worker thread.
        """
        with self._busy:
            armed = self._mark()
        if armed:
            with _lock:
                _armed.pop(id(self), None)
                _armed[id(self)] = weakref.ref(self)  # the most recently used now
        return armed

    def _mark(self) -> bool:
        if self._inotify is not None:
            from inotify_simple import flags

            events, self._seen = self._seen + self._read(), []
            # root left its path (moved, deleted: its watch removed; unmounted): whatever lies there now is armed
            root_gone = flags.MOVE_SELF | flags.DELETE_SELF | flags.IGNORED | flags.UNMOUNT
            fresh: list[str] = []
            for ev in events:
                if ev is None or ev.mask & flags.Q_OVERFLOW or ev.wd not in self._paths:
                    if ev is None or ev.mask & flags.Q_OVERFLOW:
                        fresh = []
                        break
                    continue  # a watch removed since (IGNORED after a delete)
                if ev.wd == self._root_wd and (ev.mask & root_gone or ev.name == ".git"):
                    fresh = []
                    break  # root (or root/.git) went, perhaps for another directory at its path: arm that
                if ev.wd == self._git_wd:
                    if ev.name == "info":
                        fresh = []
                        break  # root/.git/info came or went: arm again, to watch the new one
                    continue
                if ev.mask & flags.ISDIR and ev.mask & (flags.MOVED_FROM | flags.MOVED_TO | flags.MOVE_SELF):
                    fresh = []
                    break  # renamed directories: the names kept for their watches are stale
                if ev.mask & flags.ISDIR and ev.mask & flags.CREATE and ev.name != ".git":
                    path = os.path.join(self._paths[ev.wd], ev.name)
                    if path not in self.exclude:
                        fresh.append(path)
            else:
                try:
                    for path in fresh:
                        self._arm(path)
                    return True
                except (OSError, _Unarmed):
                    pass  # gone again, or too many now: from the top, which says which
        return self._arm_all()

    def _arm_all(self) -> bool:
        self.close()
        if not SUPPORTED:
            self.unarmed = "not Linux"
            return False
        kind = fs_type(self.root)
        if kind not in LOCAL_FS:
            self.unarmed = f"file system {kind or 'unknown'!r} is not known to be local"
            return False
        with _lock:
            if _used["instances"] >= MAX_INSTANCES and not _evict_one(self):
                self.unarmed = f"{MAX_INSTANCES} working directories are watched already, all in use"
                return False
            _used["instances"] += 1  # taken now: another thread's mark may be counting too
        from inotify_simple import INotify, flags

        self._mask = (flags.MODIFY | flags.ATTRIB | flags.CLOSE_WRITE | flags.MOVED_FROM | flags.MOVED_TO
                      | flags.CREATE | flags.DELETE | flags.DELETE_SELF | flags.MOVE_SELF | flags.ONLYDIR
                      | flags.DONT_FOLLOW | flags.EXCL_UNLINK)
        try:
            inotify = INotify(nonblocking=True)
        except OSError as exc:
            with _lock:
                _used["instances"] -= 1
            self.unarmed = f"inotify: {exc}"
            return False
        self._inotify = inotify  # from here close() gives the instance back
        try:
            git = os.path.join(self.root, ".git")
            if os.path.isdir(git) and not os.path.islink(git):
                with _lock:
                    _used["watches"] += 1
                try:
                    self._git_wd = self._inotify.add_watch(git, self._mask)
                except OSError:
                    with _lock:
                        _used["watches"] -= 1
                    raise
                self._paths[self._git_wd] = git
                if os.path.isdir(os.path.join(git, "info")):
                    self._arm(os.path.join(git, "info"))
            self._root_wd = self._arm(self.root)
        except (OSError, _Unarmed) as exc:
            self.close()
            self.unarmed = str(exc)
            return False
        self.unarmed = ""
        return True

    def _arm(self, top: str) -> int:
        """Watch ``top`` and every directory below it, each watched before it is listed; ``top``'s watch."""
        stack = [top]
        top_wd = -1
        while stack:
            path = stack.pop()
            if len(self._paths) >= self.max_dirs:
                raise _Unarmed(f"more than {self.max_dirs} directories")
            with _lock:
                if _used["watches"] >= MAX_WATCHES and not _evict_one(self):
                    raise _Unarmed(f"agentd watches {MAX_WATCHES} directories already, all in use")
                _used["watches"] += 1
            try:
                wd = self._inotify.add_watch(path, self._mask)  # first: what is created after it is an event
            except OSError:
                with _lock:
                    _used["watches"] -= 1
                raise
            if wd in self._paths:
                with _lock:
                    _used["watches"] -= 1  # the same directory again: one watch
            self._paths[wd] = path
            if top_wd < 0:
                top_wd = wd
            if path == os.path.join(self.root, ".git", "info"):
                continue
            with os.scandir(path) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False) and entry.name != ".git" and entry.path not in self.exclude:
                        stack.append(entry.path)
        return top_wd

    def _read(self) -> list[Any]:
        try:
            return list(self._inotify.read(timeout=0))
        except OSError:
            return [None]

    def changed(self) -> bool:
        """Whether anything may have changed since :meth:`mark` (True when unarmed). Never blocks."""
        with self._busy:
            if self._inotify is None:
                return True
            events = self._read() if self._queued() else []
        if events:
            self._seen += events
        with _lock:
            key = id(self)
            if key in _armed and next(reversed(_armed)) != key:
                _armed[key] = _armed.pop(key)  # the most recently used now
        return any(ev is None or ev.wd != self._git_wd or ev.name == "info" for ev in self._seen)

    def _queued(self) -> bool:
        """Whether the kernel holds events to read (True when it cannot say). The usual answer
        before a turn is no: one ioctl then, not inotify_simple's read and parse."""
        try:
            fcntl.ioctl(self._inotify.fileno(), termios.FIONREAD, self._avail, True)
        except OSError:
            return True  # _read says why, as None: "changed"
        return self._avail != b"\0\0\0\0"

    def __del__(self) -> None:
        try:
            self.close()  # its share of the user's inotify goes back with it
        except Exception:  # at interpreter exit the module's globals may be gone already
            pass

    def close(self) -> None:
        """Give the watch's inotify share back; it says "changed" until marked again."""
        with _lock:
            if _armed.get(id(self), lambda: None)() is self:
                del _armed[id(self)]
            if self._inotify is not None:
                self._inotify.close()
                self._inotify = None
                _used["instances"] -= 1
            _used["watches"] -= len(self._paths)
            self._paths.clear()
        self._seen = []
        self._git_wd = self._root_wd = -1


def _evict_one(taker: TreeWatch) -> bool:
    """Close the least recently used armed watch but ``taker`` that is idle; whether one was.
    Called under ``_lock``, which a watch's owner never holds while waiting for its ``_busy``."""
    for key, ref in list(_armed.items()):
        watch = ref()
        if watch is None:
            del _armed[key]  # collected: its __del__ gives its share back
            continue
        if watch is taker or not watch._busy.acquire(blocking=False):
            continue
        try:
            watch.close()
            watch.unarmed = "its inotify share went to a working directory used more recently"
        finally:
            watch._busy.release()
        return True
    return False


class _Unarmed(Exception):
    pass


__all__ = ["LOCAL_FS", "MAX_INSTANCES", "MAX_WATCHES", "SUPPORTED", "TreeWatch", "fs_type"]
