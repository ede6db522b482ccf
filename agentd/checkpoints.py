"""Per-turn file checkpoints: what each turn changed in a conversation's working directory,
and putting it back (``agentctl diff``, ``agentctl revert``), on every provider.

agentd does this itself, not the runtime, so the script provider has it as much as Copilot.
Rules kept here:

* Before a turn's prompt reaches the provider, and again once the turn ended, the working
  directory is recorded as a tree in a **shadow git repository** under
  ``<state_dir>/checkpoints/<key>/`` (one per working directory, its objects shared by the
  conversations there). The real ``git`` program does the work, with its own ``GIT_DIR``,
  ``GIT_WORK_TREE`` and ``GIT_INDEX_FILE``, no system or global config, a ``HOME`` of its own
  and hooks off. The user's own ``.git`` is never written: git never enters a directory named
  ``.git``, and the shadow repository's refs, index and objects live under agentd's state.
  Their ``.git/info/exclude`` is read (as an excludes file), never written.
* What is recorded: tracked and untracked files, as ``git ls-files --others --modified
  --exclude-standard`` sees them (``.gitignore`` honoured), regular files and symlinks. A file
  over ``max_file_bytes`` is left out and named in the record (``too_large``); a nested git
  repository is left out and named (``nested``). Diff and revert leave both alone.
* A turn never waits longer than ``timeout_s``: past it the checkpoint record says
  ``skipped: timeout`` and the turn goes on; the recording finishes in the background (up to
  ``max_run_s``), so git's index is warm for the next one. Recordings of one working
  directory run one at a time, in the order they were asked for (one that needs no git, the
  watch having seen no change, is done at once in the asking task when none is queued or
  running, else in its turn by the worker); when a turn stops waiting,
  every recording queued before it is marked late too (its after-state may mix in the new
  turn's writes), and its record says ``timeout``.
* Every checkpoint is journaled (``checkpoint``, :class:`~agentd.wire.CheckpointRecord`),
  and so is every revert (``revert``, :class:`~agentd.wire.RevertRecord`). A revert is a step
  of its own with before/after checkpoints, so it can be diffed and reverted in turn.
* A revert is refused ``busy`` while a turn runs or is queued, and holds the conversation's
  send lock, so no turn starts while files are being written back.

The conversation service calls :meth:`Checkpoints.before_turn` right before it sends a
prompt and :meth:`Checkpoints.turn_ended` when a turn ended; nothing else here is its code.
"""

from __future__ import annotations

import errno
import hashlib
import math
import os
import re
import secrets
import stat as _stat
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import msgspec
import structlog
import trio

from . import _fsutil, runtime_output
from ._tree_watch import TreeWatch
from . import contract as c
from . import wire

if TYPE_CHECKING:
    from .config import CheckpointsConfig
    from .conversations import ConversationService, _Live

__all__ = ["Checkpoints", "MAX_PATCH_BYTES"]

log = structlog.get_logger("agentd.checkpoints")
_json = msgspec.json.Encoder()
_checkpoint = msgspec.json.Decoder(wire.CheckpointRecord)
_revert = msgspec.json.Decoder(wire.RevertRecord)
_turn_diff = msgspec.json.Decoder(c.TurnDiff)

#: Most bytes of unified diff one answer carries; files past it are listed without hunks.
MAX_PATCH_BYTES = 4 << 20
#: Above this many changed paths, sorting them out (lstat) runs in a worker thread.
_THREAD_PATHS = 256
#: A folder's birth time is stamped by the kernel's coarse clock, up to a tick behind time.time():
#: one born within a tick before a step's before-state counts as the step's own.
_BIRTH_SLACK_S = _fsutil.BIRTH_TIME_TICK_S

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
_STATUS = {"A": "added", "M": "modified", "D": "deleted", "T": "type_changed"}


class _Head(msgspec.Struct):
    type: str
    ts: str = ""
    run: str = ""
    data: msgspec.Raw = msgspec.Raw(b"{}")


_head = msgspec.json.Decoder(_Head)


class GitFailed(Exception):
    """A git command exited non-zero; the message is its stderr (last line)."""


#: attributes a .gitattributes may set that would change what is recorded, written back or shown
_ATTRIBUTES = "* " + " ".join(f"!{a}" for a in ("text", "eol", "crlf", "diff", "filter", "working-tree-encoding",
                                                 "ident", "binary", "merge")) + "\n"


class _Job:
    """One recording of a working directory, run by its worker in the order asked."""

    __slots__ = ("done", "tree", "too_large", "nested", "error", "late", "started", "on_done", "recorded", "conv",
                 "ref", "workdir_id")

    def __init__(self, conv: str, ref: str, on_done: Callable[["_Job"], Awaitable[None]] | None = None) -> None:
        self.done = trio.Event()
        #: set once ``on_done`` ran (its record is journaled)
        self.recorded = trio.Event()
        self.tree = ""
        self.too_large: list[str] = []
        self.nested: list[str] = []
        self.error = ""
        #: nobody waits for its result any more (see the module docstring)
        self.late = False
        self.started = False
        self.on_done = on_done
        self.conv = conv
        #: the name of the ref under refs/agentd/<conv>/ that keeps its tree, "" = none (see _Shadow._keep)
        self.ref = ref
        #: the recorded directory's identity (see wire.CheckpointRecord.workdir_id)
        self.workdir_id = ""


class _Step(msgspec.Struct):
    kind: str  # turn, revert
    before: wire.CheckpointRecord | None = None
    after: wire.CheckpointRecord | None = None
    #: when the before-state was journaled (unix seconds; 0: not known): a folder born earlier was there
    before_at: float = 0.0


class _Shadow:
    """The shadow repository of one working directory and the worker that records it."""

    def __init__(self, root: Path, workdir: str, config: "CheckpointsConfig", state_dir: Path, *,
                 own: tuple[Path, ...] = ()) -> None:
        self.workdir = workdir
        self.config = config
        self.state_dir = state_dir
        #: agentd's own folders and files besides its state dir (runtime dir, config, environment file)
        self.own = own
        self._excludes_written = False
        self.dir = root / hashlib.sha256(workdir.encode("utf-8", "surrogateescape")).hexdigest()[:24]
        self.git_dir = self.dir / "git"
        #: git_dir/HEAD as a str: record_now stats it before every turn (os.path, not pathlib)
        self._head = str(self.git_dir / "HEAD")
        self.index = self.dir / "index"
        self.jobs_in, self.jobs_out = trio.open_memory_channel[_Job](math.inf)
        #: jobs asked for and not finished, oldest first
        self.pending: list[_Job] = []
        #: the tree of the index as the last recording left it ("" = unknown); only this
        #: shadow's worker writes the index
        self.last_tree = ""
        self._env: dict[str, str] | None = None
        #: what tells that the working directory is unchanged since the last recording (config.watch)
        self._watch: TreeWatch | None = None
        #: the last recording's (tree, too_large, nested, workdir_id), kept while the watch saw no change since
        self._watched: tuple[str, list[str], list[str], str] | None = None
        #: conversation -> the tree its last ref (written by this process) keeps; see _keep
        self._kept: dict[str, str] = {}
        #: jobs submitted whose record is not journaled yet (queued, running or in on_done)
        self.open_jobs = 0

    # ------------------------------------------------------------------ git

    def env(self, index: Path | None = None) -> dict[str, str]:
        if self._env is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
            env.update(
                GIT_DIR=str(self.git_dir), GIT_WORK_TREE=self.workdir, GIT_CONFIG_NOSYSTEM="1",
                GIT_CONFIG_GLOBAL=os.devnull, HOME=str(self.dir), XDG_CONFIG_HOME=str(self.dir),
                GIT_TERMINAL_PROMPT="0", LC_ALL="C", LANG="C",
            )
            self._env = env
        return {**self._env, "GIT_INDEX_FILE": str(index or self.index)}

    async def git(self, *args: str, stdin: bytes = b"", index: Path | None = None, private: bool = True) -> bytes:
        """Run ``git args`` in the working directory against the shadow repository; its stdout.

        ``private``: what git creates (objects, index, refs) is the owner's only (umask 077),
        whatever agentd's umask; off only where git writes the user's own files back.
        Raises GitFailed when it exits non-zero, OSError when git cannot be run. Cancelling
        kills it (trio.run_process).
        """
        proc = await trio.run_process(
            self._argv(args), stdin=stdin, capture_stdout=True, capture_stderr=True, check=False,
            env=self.env(index), cwd=self.workdir, **({"umask": 0o077} if private else {}),
        )
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise GitFailed(f"git {args[0]}: {err[-1] if err else f'exit {proc.returncode}'}")
        return proc.stdout

    def _argv(self, args: tuple[str, ...]) -> list[str]:
        cmd = ["git", "-c", "core.hooksPath=" + os.devnull, "-c", "core.fsmonitor=false",
               "-c", "core.quotepath=false", "-c", "core.autocrlf=false", "-c", "core.safecrlf=false"]
        exclude = Path(self.workdir, ".git", "info", "exclude")
        if exclude.is_file():
            cmd += ["-c", f"core.excludesFile={exclude}"]  # the user's own excludes, read only
        return [*cmd, *args]

    async def patch(self, a: str, b: str, budget: int) -> list[bytes | None]:
        """The patch from tree ``a`` to ``b`` as git writes it, one entry per ``diff --git``
        section: the section, or None when it did not fit in what ``budget`` (bytes) left. Read
        as git writes it, so a patch of gigabytes is never held. Raises GitFailed, OSError."""
        argv = self._argv(("diff-tree", "-r", "-p", "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv",
                           a, b))
        sections: list[bytes | None] = []
        cur: list[bytes] | None = []  # the section being read; None: it does not fit, dropped as it comes
        size = 0  # its bytes so far
        begun = False  # it has any
        left = budget  # what the sections kept so far leave

        def feed(data: bytes) -> None:
            nonlocal cur, size, begun
            if data:
                begun = True
                size += len(data)
                if cur is not None:
                    cur.append(data)
                    if size > left:
                        cur = None

        def finish() -> None:
            nonlocal cur, size, begun, left
            if begun:
                sections.append(None if cur is None else b"".join(cur))
                if cur is not None:
                    left -= size
            cur, size, begun = [], 0, False

        mark = b"\ndiff --git "
        proc = await trio.lowlevel.open_process(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                stderr=subprocess.DEVNULL, env=self.env(), cwd=self.workdir)
        try:
            assert proc.stdout is not None
            tail = b""
            while chunk := await proc.stdout.receive_some(1 << 16):
                data = tail + chunk
                pos = 0
                while (j := data.find(mark, pos)) >= 0:
                    feed(data[pos:j + 1])
                    finish()
                    pos = j + 1
                keep = max(pos, len(data) - len(mark) + 1)  # a mark may begin in what is held back
                feed(data[pos:keep])
                tail = data[keep:]
            feed(tail)
            finish()
        except BaseException:  # cancelled, or a bug: git must not outlive the diff
            with trio.CancelScope(shield=True):
                proc.kill()
                await proc.wait()
            raise
        await proc.wait()  # its output ended: it exits on its own
        if proc.returncode != 0:
            raise GitFailed(f"git diff-tree: exit {proc.returncode}")
        return sections

    async def ensure(self) -> None:
        """Create the shadow repository on first use (0700, its own config, excludes and attributes)."""
        if (self.git_dir / "HEAD").exists():
            if not (self.git_dir / "info" / "attributes").exists():  # made by an agentd before them
                _write_private(self.git_dir / "info" / "attributes", _ATTRIBUTES)
            if not self._excludes_written:  # once per daemon: agentd's paths may have moved since
                self._write_excludes()
            return
        _fsutil.make_dirs(self.dir)  # 0700, <state_dir>/checkpoints included, whatever the umask
        proc = await trio.run_process(["git", "init", "-q", str(self.git_dir)], capture_stdout=True,
                                      capture_stderr=True, check=False, umask=0o077,
                                      env={**self.env(), "GIT_DIR": str(self.git_dir)}, cwd=str(self.dir))
        if proc.returncode != 0:
            raise GitFailed("git init: " + proc.stderr.decode("utf-8", "replace").strip())
        with open(self.git_dir / "config", "a") as f:
            f.write("[core]\n\tuntrackedCache = true\n\tsymlinks = true\n[gc]\n\tauto = 0\n")
        _write_private(self.dir / "workdir", self.workdir + "\n")
        _fsutil.make_dirs(self.git_dir / "info")
        self._write_excludes()
        # Over every .gitattributes of the working directory (an agent can write one): files are
        # recorded and written back byte for byte, and diffs are made by git's own rules.
        _write_private(self.git_dir / "info" / "attributes", _ATTRIBUTES)

    # ------------------------------------------------------------------ recording

    async def record(self, job: _Job) -> None:
        """Bring the shadow index up to the working directory and write its tree (``job.tree``)."""
        await self.ensure()
        if self._unchanged(job):
            return
        self._watched = None  # until a recording after a mark succeeds
        armed = False
        if self.config.watch:
            if self._watch is None:
                self._watch = TreeWatch(self.workdir, exclude=self._inside())
            # Before git looks: any change from here on is an event, so "no event" later means unchanged.
            watch = self._watch
            try:
                armed = await trio.to_thread.run_sync(watch.mark, abandon_on_cancel=True)
            except trio.Cancelled:
                self._watch = None  # its thread may run on: the next recording takes a fresh watch
                raise
        job.workdir_id = workdir_id(self.workdir)
        out = await self.git("ls-files", "-z", "-t", "--others", "--modified", "--exclude-standard")
        entries = [e for e in out.split(b"\0") if e]
        if len(entries) > _THREAD_PATHS:
            update, force, job.too_large, job.nested = await trio.to_thread.run_sync(self._sort, entries)
        else:
            update, force, job.too_large, job.nested = self._sort(entries)
        if force:
            await self.git("update-index", "-z", "--force-remove", "--stdin", stdin=b"\0".join(force) + b"\0")
        if update:
            # --replace: a file where a folder was (or the reverse) takes the place of what the index held there.
            await self.git("update-index", "-z", "--add", "--remove", "--replace", "--stdin",
                           stdin=b"\0".join(update) + b"\0")
        if update or force or not self.last_tree:
            self.last_tree = ""  # until write-tree says what the index holds now
            self.last_tree = (await self.git("write-tree")).strip().decode()
        job.tree = self.last_tree  # nothing changed: the index, so its tree, is what it was
        self._keep(job.conv, job.ref, job.tree)
        if armed:
            self._watched = (job.tree, list(job.too_large), list(job.nested), job.workdir_id)

    def _unchanged(self, job: _Job) -> bool:
        """Fill ``job`` from the last recording when the kernel saw no change since (git would
        find none); whether it did. Never blocks: no git, no thread. Raises OSError (its ref)."""
        if self._watched is None or self._watch is None or self._watch.changed():
            return False
        job.tree, too_large, nested, job.workdir_id = self._watched
        job.too_large, job.nested = list(too_large), list(nested)
        self._keep(job.conv, job.ref, job.tree)
        return True

    def record_now(self, job: _Job) -> bool:
        """Record ``job`` in the caller's task when that needs neither git nor the worker: no job
        is pending or being journaled (the worker would run it next, in order), the shadow
        repository is there and the watch saw no change. Whether it did; when it did, ``job`` is
        done, never submitted. Saves a turn the two task switches of a round trip to the worker
        (the usual case: a turn that wrote nothing, the after-state that is the next
        before-state). A ref that cannot be written fails ``job`` as the worker would."""
        if self.open_jobs or not os.path.exists(self._head):
            return False
        job.started = True
        try:
            if not self._unchanged(job):
                job.started = False
                return False
        except OSError as exc:
            job.error = str(exc)
            log.warning("checkpoint.failed", workdir=self.workdir, error=job.error)
        job.done.set()
        job.recorded.set()
        return True

    def _own_inside(self) -> list[tuple[str, bool]]:
        """agentd's own paths below the working directory: (path relative to it, posix; a folder?).

        Its state directory, and ``own`` (its runtime dir with the socket, token and log, its config
        and environment file, which hold keys): a checkpoint never copies them into the shadow
        repository, and so a diff never shows them and a revert never writes them back.
        """
        try:
            top = Path(self.workdir).resolve()
        except (OSError, RuntimeError):
            return []
        out = []
        for path in (self.state_dir, *self.own):
            try:
                resolved = path.resolve()
                rel = resolved.relative_to(top)
            except (OSError, RuntimeError, ValueError):
                continue
            if rel.parts:  # not the working directory itself
                out.append((rel.as_posix(), path == self.state_dir or resolved.is_dir()))
        return out

    def _write_excludes(self) -> None:
        """The shadow repository's excludes: agentd's own paths, anchored, matched literally."""
        lines = ["# agentd's own files, when they lie in this working directory"]
        for rel, folder in self._own_inside():
            if "\n" in rel or "\r" in rel:
                continue  # no exclude line can hold it
            literal = "".join("\\" + ch if ch in "*?[\\!#" else ch for ch in rel)
            if literal.endswith(" "):  # git drops a line's trailing spaces unless escaped
                literal = literal[:-1] + "\\ "
            lines.append("/" + literal + ("/" if folder else ""))
        path = self.git_dir / "info" / "exclude"
        text = "\n".join(lines) + "\n"
        try:
            if path.read_text() == text:
                self._excludes_written = True
                return
        except (OSError, UnicodeDecodeError):
            pass
        _write_private(path, text)
        self._excludes_written = True

    def _inside(self) -> frozenset[str]:
        """What the watch leaves out: agentd's own folders below the working directory."""
        return frozenset(os.path.join(self.workdir, rel) for rel, folder in self._own_inside() if folder)

    def _sort(self, entries: list[bytes]) -> tuple[list[bytes], list[bytes], list[str], list[str]]:
        """(paths to add or remove, paths to drop from the index, too large, nested repositories)."""
        update: dict[bytes, None] = {}
        force: dict[bytes, None] = {}
        too_large: list[str] = []
        nested: list[str] = []
        limit = self.config.max_file_bytes
        base = os.fsencode(self.workdir)
        real_base = os.path.realpath(base)
        plain: dict[bytes, bool] = {b"": True}  # folder -> no symlink on the way to it

        def plain_folder(folder: bytes) -> bool:
            ok = plain.get(folder)
            if ok is None:
                ok = plain[folder] = os.path.realpath(os.path.join(base, folder)) == os.path.join(real_base, folder)
            return ok

        for entry in entries:
            tag, path = entry[:1], entry[2:]
            if path in update or path in force:
                continue  # modified and deleted both list a deleted file
            if path.endswith(b"/"):
                nested.append(path.decode("utf-8", "replace"))
                continue
            if not plain_folder(os.path.dirname(path)):
                # A folder on its way became a symlink (or a file): what the index held there is gone
                # from the tree, and a stat would look beyond the link.
                if tag != b"?":
                    force[path] = None
                continue
            try:
                st = os.lstat(os.path.join(base, path))
            except (FileNotFoundError, NotADirectoryError):
                update[path] = None  # gone (its folder may be a file now)
                continue
            except OSError:
                continue  # unreadable now: the index keeps what it had
            if _stat.S_ISREG(st.st_mode):
                if st.st_size > limit:
                    too_large.append(path.decode("utf-8", "replace"))
                    if tag != b"?":
                        force[path] = None
                else:
                    update[path] = None
            elif _stat.S_ISLNK(st.st_mode):
                update[path] = None
            elif tag != b"?":
                force[path] = None  # a tracked file became a directory, a fifo, ...
        return list(update), list(force), too_large, nested

    def _keep(self, conv: str, name: str, tree: str) -> None:
        """Keep ``tree`` reachable, so a gc never drops a tree a checkpoint record names: a loose
        ref ``refs/agentd/<conv>/<name>`` (``name``: ``<step>-<phase>``; "" = no ref) pointing at it.

        A conversation's refs are kept or dropped together, never one step's alone: a tree the
        conversation's last ref already keeps needs no new one, so an unchanged tree (the usual
        case: a turn that wrote nothing, the after-state that is the next before-state) costs
        nothing here. Raises OSError.
        """
        if not name or self._kept.get(conv) == tree:
            return
        path = self.git_dir / "refs" / "agentd" / conv / name
        _fsutil.make_dirs(path.parent)  # one per conversation: a lstat once it exists
        tmp = path.with_name(path.name + ".tmp")
        _write_private(tmp, tree + "\n")
        os.replace(tmp, path)
        self._kept[conv] = tree

    async def worker(self) -> None:
        async for job in self.jobs_out:
            if job.late and self.jobs_out.statistics().current_buffer_used:
                job.error = "timeout"  # nobody waits for it and a later one warms the index
            else:
                job.started = True
                with trio.move_on_after(self.config.max_run_s) as scope:
                    try:
                        await self.record(job)
                    except (GitFailed, OSError) as exc:
                        job.error = str(exc)
                        log.warning("checkpoint.failed", workdir=self.workdir, error=job.error)
                if scope.cancelled_caught:
                    job.error = "timeout"
                    job.tree = ""
            if job in self.pending:
                self.pending.remove(job)
            job.done.set()
            if job.on_done is not None:
                try:
                    await job.on_done(job)
                except Exception:
                    log.exception("checkpoint.record_failed", workdir=self.workdir)
            self.open_jobs -= 1
            job.recorded.set()

    def submit(self, job: _Job) -> _Job:
        self.pending.append(job)
        self.jobs_in.send_nowait(job)
        self.open_jobs += 1
        return job

    def give_up(self, job: _Job) -> None:
        """Nobody waits for ``job`` any more: it and every job before it are late."""
        for j in self.pending:
            j.late = True
            if j is job:
                break


class Checkpoints:
    """The checkpoints of every conversation: recording (the service's hooks), diff and revert.

    ``root`` is ``<state_dir>/checkpoints``. :meth:`run` must be running (in the daemon's
    nursery) for anything to be recorded.
    """

    def __init__(self, config: "CheckpointsConfig", root: Path, state_dir: Path, *,
                 own: tuple[Path, ...] = ()) -> None:
        self.config = config
        self.root = root
        self.state_dir = state_dir
        #: agentd's own paths besides ``state_dir``, never recorded (see _Shadow._own_inside)
        self.own = own
        self._shadows: dict[str, _Shadow] = {}
        #: conversation -> its steps in order, read from its journal on first use
        self._steps: dict[str, dict[str, _Step]] = {}
        #: conversation -> its last job whose record is journaled once it is done (a diff waits for it)
        self._last: dict[str, _Job] = {}
        #: (conversation, run) whose before-state was asked for: only those get an after-state
        self._began: set[tuple[str, str]] = set()
        self._nursery: trio.Nursery | None = None

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the working directories' workers until cancelled (a git process then is killed)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def _shadow(self, workdir: str) -> _Shadow | None:
        if not workdir or not os.path.isdir(workdir):
            return None
        shadow = self._shadows.get(workdir)
        if shadow is None:
            assert self._nursery is not None, "Checkpoints.run() is not running"
            shadow = self._shadows[workdir] = _Shadow(self.root, workdir, self.config, self.state_dir, own=self.own)
            self._nursery.start_soon(shadow.worker)
        return shadow

    # ------------------------------------------------------------------ the service's hooks

    async def before_turn(self, service: "ConversationService", live: "_Live", run: str) -> None:
        """Record ``live``'s working directory before ``run``'s prompt is sent, and journal it.

        Waits at most ``timeout_s``; never raises but Cancelled (a failure is journaled as the
        checkpoint's ``skipped: error``, or logged when the journal refuses it).
        """
        if not self.config.enabled:
            return
        self._began.add((live.record.id, run))
        try:
            rec = await self._wait(service, live, run, "before", self.config.timeout_s)
        except Exception as exc:  # a bug here must never keep a prompt from its provider
            log.exception("checkpoint.before_failed", conversation=live.record.id, run=run)
            rec = wire.CheckpointRecord(step=run, phase="before", skipped="error", error=str(exc))
        await self._journal(service, live, rec, run=run)

    async def after_turn(self, service: "ConversationService", live: "_Live", run: str) -> None:
        """Record ``run``'s after-state as the provider reports its end, before the end is
        journaled, and journal it (tagged with the run). Waits at most ``timeout_s``; never
        raises but Cancelled."""
        cid = live.record.id
        if (cid, run) not in self._began:
            return
        self._began.discard((cid, run))
        try:
            rec = await self._wait(service, live, run, "after", self.config.timeout_s)
        except Exception as exc:
            log.exception("checkpoint.after_failed", conversation=cid, run=run)
            rec = wire.CheckpointRecord(step=run, phase="after", skipped="error", error=str(exc))
        await self._journal(service, live, rec, run=run)

    def turn_ended(self, service: "ConversationService", live: "_Live", run: str) -> None:
        """Ask for the after-state of a turn that ended without :meth:`after_turn` (agentd ended
        it: a cancel not confirmed, a runtime that died or hung); it is journaled once recorded,
        after the end, without the run's tag (nothing of a run follows its end). Returns at once."""
        cid = live.record.id
        if (cid, run) not in self._began:
            return  # its prompt was never sent, checkpoints are off, or after_turn took it
        self._began.discard((cid, run))
        try:
            shadow = self._shadow(live.record.workdir)
        except OSError:
            shadow = None
        if shadow is None:
            return  # its before-record already said no_workdir

        async def journal(job: _Job) -> None:
            # Not tagged with the run: nothing of a run follows its terminal turn record.
            await self._journal(service, live, self._rec(run, "after", job, 0), run="")

        try:
            self._last[cid] = shadow.submit(_Job(cid, f"{run}-after", journal))
        except Exception:  # the turn's end goes on regardless
            log.exception("checkpoint.after_failed", conversation=cid, run=run)

    async def _wait(self, service: "ConversationService", live: "_Live", step: str, phase: str,
                    timeout: float) -> wire.CheckpointRecord:
        t0 = time.monotonic()
        record = live.record
        job = _Job(record.id, f"{step}-{phase}")
        # A shadow whose watch saw nothing needs no look at the directory: its watch on the
        # root says "changed" when the root is deleted or moved away (DELETE_SELF, MOVE_SELF).
        shadow = self._shadows.get(record.workdir)
        if shadow is None or not shadow.record_now(job):
            shadow = self._shadow(record.workdir)
            if shadow is None:
                return wire.CheckpointRecord(step=step, phase=phase, skipped="no_workdir",  # type: ignore[arg-type]
                                             error=f"{record.workdir!r} is not a directory")
            service.publish_held(live)  # nothing held back waits for a git run
            shadow.submit(job)
            with trio.move_on_after(timeout):
                await job.done.wait()
        ms = int((time.monotonic() - t0) * 1000)
        if not job.done.is_set():
            shadow.give_up(job)
            log.info("checkpoint.skipped", conversation=record.id, step=step, phase=phase, waited_ms=ms)
            if phase == "after":
                # Recorded late (unless a later recording overtakes it): journaled then, after the
                # end, so diff and revert use the step's own after-state, never a later one holding
                # what the user changed since. A late before-state could hold the step's own changes.
                async def late(done: _Job) -> None:
                    if done.tree and not done.error:
                        rec = wire.CheckpointRecord(step=step, phase="after", tree=done.tree,  # type: ignore[arg-type]
                                                    ms=int((time.monotonic() - t0) * 1000),
                                                    too_large=done.too_large, nested=done.nested,
                                                    workdir_id=done.workdir_id)
                        await self._journal(service, live, rec, run="")

                job.on_done = late
                self._last[record.id] = job
        return self._rec(step, phase, job, ms)

    @staticmethod
    def _rec(step: str, phase: str, job: _Job, ms: int) -> wire.CheckpointRecord:
        if job.late or not job.done.is_set():
            return wire.CheckpointRecord(step=step, phase=phase, skipped="timeout", ms=ms)  # type: ignore[arg-type]
        if job.error:
            return wire.CheckpointRecord(step=step, phase=phase, ms=ms,  # type: ignore[arg-type]
                                         skipped="timeout" if job.error == "timeout" else "error",
                                         error="" if job.error == "timeout" else job.error)
        return wire.CheckpointRecord(step=step, phase=phase, tree=job.tree, ms=ms,  # type: ignore[arg-type]
                                     too_large=job.too_large, nested=job.nested, workdir_id=job.workdir_id)

    async def _journal(self, service: "ConversationService", live: "_Live", rec: wire.CheckpointRecord | wire.RevertRecord,
                       *, run: str) -> None:
        try:
            await service.journal(live, "checkpoint" if isinstance(rec, wire.CheckpointRecord) else "revert",
                                  _json.encode(rec), run=run)
        except c.AgentdError as exc:
            log.error("checkpoint.journal_failed", conversation=live.record.id, error=exc.message)
            return
        steps = self._steps.get(live.record.id)
        if steps is not None:
            _note(steps, "checkpoint" if isinstance(rec, wire.CheckpointRecord) else "revert", run, rec, time.time())

    # ------------------------------------------------------------------ reading steps

    async def _read_steps(self, cid: str, journal: Any) -> dict[str, _Step]:
        steps = self._steps.get(cid)
        if steps is None:
            from .store import scan

            steps = {}
            async for lines in scan(journal):
                for line in lines:
                    if b'"checkpoint"' not in line and b'"revert"' not in line:
                        continue
                    head = _head.decode(line)
                    if head.type == "checkpoint":
                        at = runtime_output.parse_utc(head.ts)
                        _note(steps, head.type, head.run, _checkpoint.decode(head.data), at.timestamp() if at else 0.0)
                    elif head.type == "revert":
                        _note(steps, head.type, head.run, _revert.decode(head.data), 0.0)
            if cid in self._steps:  # noted meanwhile (a record journaled while this read): that one holds it too
                return self._steps[cid]
            self._steps[cid] = steps
        return steps

    async def _settle(self, cid: str) -> None:
        """Wait until the conversation's last recording is journaled (at most max_run_s)."""
        job = self._last.get(cid)
        if job is not None:
            with trio.move_on_after(self.config.max_run_s):
                await job.recorded.wait()

    def _pick(self, cid: str, steps: dict[str, _Step], run: str) -> str:
        if not steps:
            why = "" if self.config.enabled else " ([checkpoints] enabled = false)"
            raise c.NotFound(f"conversation {cid} has no checkpoints{why}")
        if not run:
            return next(reversed(steps))
        if run in steps:
            return run
        found = [step for step in steps if step.startswith(run)]  # a prefix, as ids are everywhere else
        if len(found) == 1:
            return found[0]
        if found:
            raise c.Invalid(f"step {run!r} of {cid} is ambiguous: {', '.join(found[:5])}")
        raise c.NotFound(f"conversation {cid} has no step {run!r} (a turn's run id, or a revert's id)",
                         details={"steps": list(steps)[-20:]})

    async def _trees(self, record: wire.ConversationRecord, steps: dict[str, _Step], step: str,
                     ) -> tuple[_Shadow, wire.CheckpointRecord, str, str, list[str]]:
        """(shadow, before record, before tree, after tree, the after-state's source) of ``step``."""
        s = steps[step]
        before = s.before
        if before is None or not before.tree:
            why = f" (skipped: {before.skipped}{', ' + before.error if before.error else ''})" if before else ""
            raise c.NotFound(f"{step} has no checkpoint from before it{why}")
        shadow = self._shadow(record.workdir)
        if shadow is None:
            raise c.NotFound(f"the working directory {record.workdir!r} is gone")
        if s.after is not None and s.after.tree:
            return shadow, before, before.tree, s.after.tree, ["checkpoint", *s.after.too_large, *s.after.nested]
        order = list(steps)
        i = order.index(step)
        if i + 1 < len(order):
            nxt = steps[order[i + 1]].before
            if nxt is None or not nxt.tree:
                raise c.NotFound(f"the state after {step} was not recorded")
            return shadow, before, before.tree, nxt.tree, ["next", *nxt.too_large, *nxt.nested]
        job = await self._now(record, shadow)
        return shadow, before, before.tree, job.tree, ["now", *job.too_large, *job.nested]

    async def _now(self, record: wire.ConversationRecord, shadow: _Shadow) -> _Job:
        job = shadow.submit(_Job(record.id, ""))
        with trio.move_on_after(self.config.max_run_s):
            await job.done.wait()
        if not job.done.is_set() or job.error or not job.tree:
            raise c.InternalError(f"cannot record {record.workdir}: {job.error or 'timeout'}")
        return job

    # ------------------------------------------------------------------ diff

    async def diff(self, service: "ConversationService", ref: str, run: str = "", *, stat: bool = False) -> wire.DiffResult:
        """What step ``run`` ("" = the last) of conversation ``ref`` changed.

        Reading takes no lease and opens no runtime. Waits for a recording still under way.
        Raises NotFound (no such conversation or step, or its before-state was not recorded),
        InternalError when git fails.
        """
        reader = await service.reader(ref)
        record = reader.record
        await self._settle(record.id)
        steps = await self._read_steps(record.id, reader.journal)
        step = self._pick(record.id, steps, await _numbered(service, reader, run))
        shadow, before, b, a, extra = await self._trees(record, steps, step)
        source, left_out = extra[0], sorted({*before.too_large, *before.nested, *extra[1:]})
        try:
            files, patch, truncated = await _diff(shadow, b, a, set(left_out), stat=stat)
        except GitFailed as exc:
            raise c.InternalError(str(exc)) from None
        return wire.DiffResult(conversation=record.id, run=step, kind=steps[step].kind,  # type: ignore[arg-type]
                               after=source, files=files, patch=patch,  # type: ignore[arg-type]
                               truncated=truncated, too_large=left_out,
                               runtime_diff=await _runtime_diff(reader.journal, step) if not stat else "")

    # ------------------------------------------------------------------ revert

    async def revert(self, service: "ConversationService", ref: str, run: str, *, dry_run: bool = False,
                     by: str = "") -> wire.RevertResult:
        """Restore the files step ``run`` changed to how they were before it.

        Only the paths that step changed are touched: each is written back as it was before
        it (content and mode), or removed when it did not exist then; paths already so are
        left alone. ``dry_run`` answers what would change and changes nothing. Otherwise the
        revert becomes a step of its own (id ``v…``, journaled with its before/after
        checkpoints and a ``revert`` record), unless nothing differs.

        Raises NotFound (conversation, step, or its checkpoints), Busy while a turn runs or
        is queued, Unsupported when checkpoints are off, InternalError when git fails.
        """
        if not self.config.enabled:
            raise c.Unsupported("checkpoints are off ([checkpoints] enabled = false)")
        if not run:
            raise c.Invalid("name the step to revert (--run RUN)")
        live = await service.live(ref)
        record = live.record
        async with live.send_lock:
            if live.run or record.queued:
                raise c.Busy(f"a turn is running in {record.id} (run {live.run or record.queued[0]}); "
                             "revert after it ended")
            # The files are the working directory's, not the conversation's: another conversation's
            # turn there would find the revert in its own diff (and undo it with its own revert).
            for other in service.list():
                if other.id != record.id and other.workdir == record.workdir and (other.active_run or other.queued):
                    raise c.Busy(f"a turn of conversation {other.id} is running in the same working directory "
                                 f"{record.workdir!r} (run {other.active_run or other.queued[0]}); revert after it ended")
            await self._settle(record.id)
            steps = await self._read_steps(record.id, live.journal)
            step = self._pick(record.id, steps, await _numbered(service, live, run))
            shadow, before, b, a, extra = await self._trees(record, steps, step)
            if extra[0] != "checkpoint":
                after = steps[step].after
                why = f" (skipped: {after.skipped})" if after is not None and after.skipped else ""
                raise c.Invalid(
                    f"the state after {step} was not recorded{why}: a revert would also undo what changed since "
                    f"(agentctl diff {record.id} --run {step} shows the step against the {extra[0]} state)")
            left_out = {*before.too_large, *before.nested, *extra[1:]}
            try:
                changed = {p for p in await _names(shadow, b, a) if _shown(p) not in left_out}
                now = await self._now(record, shadow)
                if before.workdir_id and now.workdir_id != before.workdir_id:
                    raise c.Invalid(
                        f"cannot revert {step}: {record.workdir!r} is not the directory recorded before it (moved, "
                        "replaced, or a symlink to another since); a revert writes only where the step ran "
                        f"(agentctl diff {record.id} --run {step} still shows the step)")
                changes = [ch for ch in await _plan(shadow, now.tree, b) if ch.raw in changed]
                since = set(await _names(shadow, a, now.tree)) if changes else set()
                for ch in changes:
                    ch.changed_since = ch.raw in since
            except GitFailed as exc:
                raise c.InternalError(str(exc)) from None
            blocked = await trio.to_thread.run_sync(_in_the_way, shadow.workdir, changes)
            if blocked:
                raise c.Invalid(
                    f"cannot revert {step}: {', '.join(map(repr, blocked[:5]))} would come back where a folder now "
                    "holds files no checkpoint recorded, or where such a file now stands in place of one of its "
                    "folders (ignored, too large, or a repository of its own), which writing it would delete; move "
                    "them away first", details={"paths": blocked[:100]})
            todo = [ch.file for ch in changes]
            if dry_run or not todo:
                return wire.RevertResult(conversation=record.id, run=step, files=todo, dry_run=dry_run)
            vid = "v" + secrets.token_hex(6)
            shadow._keep(record.id, f"{vid}-before", now.tree)
            await self._journal(service, live, wire.CheckpointRecord(step=vid, phase="before", tree=now.tree,
                                                                     too_large=now.too_large, nested=now.nested,
                                                                     workdir_id=now.workdir_id),
                                run="")
            try:
                await _apply(shadow, b, changes, steps[step].before_at)
            except (GitFailed, OSError) as exc:
                log.error("checkpoint.revert_failed", conversation=record.id, step=step, error=str(exc))
                raise c.InternalError(f"revert of {step} failed part way: {exc}") from None
            finally:
                await self._journal(service, live, wire.RevertRecord(id=vid, of=step, files=todo, by=by), run="")
                after = shadow.submit(_Job(record.id, f"{vid}-after"))
                with trio.move_on_after(self.config.max_run_s):
                    await after.done.wait()
                await self._journal(service, live, self._rec(vid, "after", after, 0), run="")
            return wire.RevertResult(conversation=record.id, run=step, files=todo, revert=vid)


async def _numbered(service: "ConversationService", reader: Any, run: str) -> str:
    """``run`` as given, or for a turn number N (ASCII digits: ids begin with a letter) the run
    of the Nth turn, 1 the first, counted as fork and rewind count them (agentd.branching.turns).
    Raises NotFound for a number past the last turn."""
    from .branching import is_turn_number, numbered, turns

    if not is_turn_number(run):
        return run  # no journal read for an id

    turn = numbered(turns(await service.published_lines(reader), reader.record.dropped), run, reader.record.id)
    assert turn is not None
    return turn.run


async def _runtime_diff(journal: Any, run: str) -> str:
    """The last diff the runtime itself reported for ``run`` (``turn_diff`` records), or ""."""
    from .store import scan

    last = ""
    tag = f'"run":"{run}"'.encode()
    async for lines in scan(journal):
        for line in lines:
            if b'"turn_diff"' in line and tag in line:
                head = _head.decode(line)
                if head.type == "turn_diff" and head.run == run:
                    last = _turn_diff.decode(head.data).diff
    return last


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _note(steps: dict[str, _Step], type_: str, run: str, rec: Any, at: float) -> None:
    """Fold one ``checkpoint`` / ``revert`` record, journaled at ``at`` (unix seconds), into ``steps``."""
    if type_ == "revert":
        s = steps.setdefault(rec.id, _Step(kind="revert"))
        s.kind = "revert"
        return
    s = steps.setdefault(rec.step, _Step(kind="turn"))  # a revert's own record says it is one
    if rec.phase == "before":
        s.before = rec
        s.before_at = at
    else:
        s.after = rec


# ---------------------------------------------------------------------- git plumbing


def _raw(out: bytes) -> list[tuple[str, bytes, str, str]]:
    """``git diff-tree -r -z --raw`` -> [(status, path as git names it, old mode, new mode)].

    Paths stay bytes: a file name that is not UTF-8 is shown with U+FFFD (:func:`_shown`) but
    written back and removed by its own name, never by the name shown."""
    parts = out.split(b"\0")
    rows = []
    i = 0
    while i + 1 < len(parts):
        meta = parts[i]
        if not meta.startswith(b":"):
            i += 1
            continue
        fields = meta[1:].split(b" ")
        rows.append((fields[4][:1].decode(), parts[i + 1], fields[0].decode(), fields[1].decode()))
        i += 2
    return rows


def _shown(path: bytes) -> str:
    return path.decode("utf-8", "replace")


class _Change(msgspec.Struct):
    """A path a revert brings back: as shown (``path``), what happens to it, and its own name."""

    path: str
    action: str  # create, restore, delete
    raw: bytes
    #: not as the step left it: changed since by a later step or by hand
    changed_since: bool = False

    @property
    def file(self) -> wire.RevertedFile:
        return wire.RevertedFile(path=self.path, action=self.action, changed_since=self.changed_since)  # type: ignore[arg-type]


async def _names(shadow: _Shadow, a: str, b: str) -> list[bytes]:
    out = await shadow.git("diff-tree", "-r", "-z", "--no-renames", "--raw", a, b)
    return [row[1] for row in _raw(out)]


async def _plan(shadow: _Shadow, now: str, target: str) -> list[_Change]:
    """What brings the tree ``now`` to ``target``, file by file."""
    out = await shadow.git("diff-tree", "-r", "-z", "--no-renames", "--raw", now, target)
    action = {"A": "create", "D": "delete"}
    return [_Change(_shown(path), action.get(st, "restore"), path) for st, path, _, _ in _raw(out)]


def _in_the_way(base: str, changes: list[_Change]) -> list[str]:
    """The paths to write back where what no checkpoint recorded (ignored or too large files, a
    nested repository) would be deleted by writing them: a folder standing at the path that holds
    something the revert does not remove, or a file or symlink the revert does not remove standing
    where one of the path's folders must go. Blocking (a walk): run it in a thread."""
    base_b = os.fsencode(base)
    removed = {os.path.join(base_b, ch.raw) for ch in changes if ch.action == "delete"}
    blocked = []
    for ch in changes:
        if ch.action == "delete":
            continue
        if _parent_in_the_way(base_b, ch.raw, removed):
            blocked.append(ch.path)
            continue
        top = os.path.join(base_b, ch.raw)
        if os.path.islink(top) or not os.path.isdir(top):
            continue
        for root, dirs, files in os.walk(top):
            held = [n for n in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]
                    if os.path.join(root, n) not in removed]
            if held:
                blocked.append(ch.path)
                break
    return blocked


def _parent_in_the_way(root: bytes, raw: bytes, removed: set[bytes]) -> bool:
    """Whether something other than a folder, and not removed by the revert, stands where one of
    the folders of ``raw`` (relative to ``root``) must go."""
    folder = root
    for part in raw.split(b"/")[:-1]:
        folder = os.path.join(folder, part)
        try:
            st = os.lstat(folder)
        except OSError:
            return False  # nothing there (or unreadable): nothing below it either
        if not _stat.S_ISDIR(st.st_mode):
            return folder not in removed
    return False


def workdir_id(workdir: str) -> str:
    """``"<st_dev>:<st_ino>"`` of ``workdir`` (symlinks followed), "" when it cannot be read."""
    try:
        st = os.stat(workdir)
    except OSError:
        return ""
    return f"{st.st_dev}:{st.st_ino}"


def _remove(base: str, paths: list[bytes], since: float = 0.0) -> None:
    """Remove ``paths`` (relative to ``base``) and the folders that leaves empty, each folder on
    the way opened without following a symlink, so a folder swapped for a link meanwhile stops
    it there, never removes beyond it. A folder born before ``since`` (unix seconds, 0: no such
    rule) was there before the step, perhaps empty, which no git tree records: it stays. Where
    the file system keeps no birth time (:func:`agentd._fsutil.birth_time`) every emptied
    folder goes. Blocking: run it in a thread."""
    root = os.open(base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for rel in paths:
            parts = rel.split(b"/")
            fds = [root]
            try:
                try:
                    for part in parts[:-1]:
                        fds.append(os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                           dir_fd=fds[-1]))
                except OSError:
                    continue  # gone, or a symlink or a file now: nothing beyond it is ours to remove
                try:
                    os.unlink(parts[-1], dir_fd=fds[-1])
                except (FileNotFoundError, IsADirectoryError):
                    pass  # gone already, or a folder now, which no checkpoint named
                for i in range(len(parts) - 1, 0, -1):  # the folders it leaves empty, innermost first
                    if since:
                        born = _fsutil.birth_time(fds[i - 1], parts[i - 1])
                        if born is not None and born < since - _BIRTH_SLACK_S:
                            break  # it was there before the step, and so were the folders above it
                    try:
                        os.rmdir(parts[i - 1], dir_fd=fds[i - 1])
                    except OSError:
                        break
            finally:
                for fd in fds[1:]:
                    os.close(fd)
    finally:
        os.close(root)


def _modes(base: str, changes: list[_Change]) -> dict[bytes, int]:
    """The permission bits of the regular files about to be written back over."""
    modes = {}
    for ch in changes:
        if ch.action == "restore":
            try:
                st = os.lstat(os.path.join(os.fsencode(base), ch.raw))
            except OSError:
                continue
            if _stat.S_ISREG(st.st_mode):
                modes[ch.raw] = _stat.S_IMODE(st.st_mode)
    return modes


def _keep_modes(base: str, modes: dict[bytes, int]) -> None:
    """Give the files written back the read and write bits they had (git keeps only 644 or
    755, and writes with agentd's umask: a 0600 file came back readable by all); the
    executable bits are git's, for whoever may read the file. The agent may swap a folder on
    the way for a symlink meanwhile: each file is reached with no symlink followed
    (:func:`_open_beneath`) and changed through that handle, so nothing outside changes."""
    try:
        root = os.open(base, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for raw, old in modes.items():
            try:
                fd = _open_beneath(root, raw)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if _stat.S_ISREG(st.st_mode):
                    # An O_PATH handle takes no fchmod; its /proc link names exactly that file.
                    os.chmod(f"/proc/self/fd/{fd}",
                             (old & 0o666) | (_stat.S_IMODE(st.st_mode) & 0o111 & ((old & 0o444) >> 2)))
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        os.close(root)


def _open_beneath(root: int, raw: bytes) -> int:
    """An O_PATH handle on ``raw`` (a path relative to the folder ``root``), each of its
    components opened O_NOFOLLOW from the one before: a symlink anywhere on the way is not
    followed (a folder swapped for one raises ENOTDIR; a last component that is one gives a
    handle on the symlink itself). Raises OSError."""
    *folders, name = raw.split(b"/")
    fd = os.dup(root)
    try:
        for part in folders:
            if part in (b"", b".", b".."):
                raise OSError(errno.EINVAL, "not a plain relative path", raw)
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        if name in (b"", b".", b".."):
            raise OSError(errno.EINVAL, "not a plain relative path", raw)
        return os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)


async def _apply(shadow: _Shadow, target: str, changes: list[_Change], since: float = 0.0) -> None:
    """Write ``changes`` back as they are in ``target``: Python removes the deleted ones and
    the folders that leaves empty unless born before ``since`` (:func:`_remove`) first (a file
    may come back where a folder of the step's was), then
    git writes the files (never through a symlink, never into a .git), keeping the permission
    bits of those it writes over."""
    base = os.path.realpath(shadow.workdir)
    gone = [ch.raw for ch in changes if ch.action == "delete"]
    write = [ch.raw for ch in changes if ch.action != "delete"]
    modes = await trio.to_thread.run_sync(_modes, base, changes)
    if gone:
        await trio.to_thread.run_sync(_remove, base, gone, since)
    if write:
        index = shadow.dir / f"revert-{secrets.token_hex(4)}.index"
        try:
            await shadow.git("read-tree", target, index=index)
            await shadow.git("checkout-index", "-f", "-z", "--stdin", index=index, private=False,  # the user's files
                             stdin=b"\0".join(write) + b"\0")
        finally:
            index.unlink(missing_ok=True)
        await trio.to_thread.run_sync(_keep_modes, base, modes)


async def _diff(shadow: _Shadow, a: str, b: str, left_out: set[str], *, stat: bool,
                ) -> tuple[list[wire.DiffFile], str, bool]:
    """(files, unified diff, truncated) from tree ``a`` to tree ``b``, without ``left_out``."""
    raw = _raw(await shadow.git("diff-tree", "-r", "-z", "--no-renames", "--raw", a, b))
    num = (await shadow.git("diff-tree", "-r", "-z", "--no-renames", "--numstat", a, b)).split(b"\0")
    counts: dict[str, tuple[int, int, bool]] = {}
    i = 0
    while i < len(num):
        if num[i].count(b"\t") >= 2:
            add, dele, path = num[i].split(b"\t", 2)
            binary = add == b"-"
            counts[path.decode("utf-8", "replace")] = (0 if binary else int(add), 0 if binary else int(dele), binary)
        i += 1
    sections: list[bytes | None] = []
    if not stat:
        sections = [s if s is None or s.endswith(b"\n") else s + b"\n"
                    for s in await shadow.patch(a, b, MAX_PATCH_BYTES)]
    files: list[wire.DiffFile] = []
    kept: list[bytes] = []
    truncated = False
    k = 0  # the next patch section: one per row, two for a type change (a delete and an add)
    for st, raw_path, old_mode, new_mode in raw:
        taken = sections[k:k + (2 if st == "T" else 1)]
        k += len(taken)
        path = _shown(raw_path)
        if path in left_out:
            continue
        add, dele, binary = counts.get(path, (0, 0, False))
        hunks: list[wire.DiffHunk] = []
        if taken:
            if None in taken:  # over what MAX_PATCH_BYTES left (Shadow.patch kept none of it)
                truncated = True
            else:
                section = b"".join(taken)  # type: ignore[arg-type]
                kept.append(section)
                hunks = _hunks(section)
        files.append(wire.DiffFile(path=path, status=_STATUS.get(st, "modified"),  # type: ignore[arg-type]
                                   old_mode="" if old_mode == "000000" else old_mode,
                                   new_mode="" if new_mode == "000000" else new_mode,
                                   binary=binary, additions=add, deletions=dele, hunks=hunks))
    return files, b"".join(kept).decode("utf-8", "replace"), truncated


def _hunks(section: bytes) -> list[wire.DiffHunk]:
    hunks: list[wire.DiffHunk] = []
    cur: list[str] | None = None
    head: tuple[int, int, int, int, str] | None = None
    for line in section.split(b"\n"):
        m = _HUNK.match(line)
        if m:
            if head is not None and cur is not None:
                hunks.append(wire.DiffHunk(*head[:4], section=head[4], lines=cur))
            g = m.groups()
            head = (int(g[0]), int(g[1] if g[1] is not None else 1), int(g[2]), int(g[3] if g[3] is not None else 1),
                    g[4].decode("utf-8", "replace"))
            cur = []
        elif cur is not None and line[:1] in (b" ", b"+", b"-", b"\\"):
            cur.append(line.decode("utf-8", "replace"))
    if head is not None and cur is not None:
        hunks.append(wire.DiffHunk(*head[:4], section=head[4], lines=cur))
    return hunks
