"""Who may run: one daemon per state dir, and one owner per open conversation.

:class:`DaemonLock` is an ``flock`` on ``<state_dir>/agentd.lock``; the kernel
drops it when the holder dies, however it dies, so a stale lock never blocks
a restart. A :class:`Lease` says which daemon instance owns a conversation
until when; it is renewed while the conversation is open, and a lease left by
a dead daemon is taken over on the next start. The daemon records what that
means (``run_interrupted``); this module only stores leases.

:class:`LeaseStore` is the interface; :class:`FileLeaseStore` keeps leases as
files next to the journals. A shared store (PostgreSQL) can implement the
same interface later.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import os
import pathlib
import time
from typing import Iterator, Literal, Protocol, runtime_checkable

import msgspec
import structlog
import trio

from . import _fsutil, _trust
from .contract import AgentdError, Invalid, NotFound

__all__ = [
    "AlreadyRunning",
    "DaemonLock",
    "FileLeaseStore",
    "Lease",
    "LeaseHeld",
    "LeaseOutcome",
    "LeaseStore",
    "OwnerHeartbeat",
]

LOCK_FILE = "agentd.lock"
LEASE_FILE = "lease.json"
#: one heartbeat file per owner, ``<root>/.lease-owners/<owner>.json`` (a dot name: never a conversation)
OWNERS_DIR = ".lease-owners"


def _log() -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("agentd.leases")


def _rfc3339(t: float) -> str:
    """Unix seconds -> ``2024-05-01T12:00:00.123Z``."""
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- daemon lock


class AlreadyRunning(AgentdError):
    """Another agentd holds this state dir; ``pid`` is its process id (0 when unreadable)."""

    code = "busy"

    def __init__(self, pid: int, lock_path: pathlib.Path) -> None:
        super().__init__(f"another agentd (pid {pid}) holds {lock_path}", details={"pid": pid, "lock": str(lock_path)})
        self.pid = pid
        self.lock_path = lock_path


def _read_pid(fd: int) -> int:
    # The holder writes its pid just after locking; give it a moment rather than report pid 0.
    deadline = time.monotonic() + 0.5
    while True:
        text = os.pread(fd, 64, 0).strip()
        if text or time.monotonic() >= deadline:
            break
        time.sleep(0.01)
    try:
        return int(text)
    except ValueError:
        return 0


class DaemonLock:
    """An exclusive ``flock`` on ``<state_dir>/agentd.lock`` holding our pid.

    Held until :meth:`release` or until this process exits (the kernel drops
    it even on SIGKILL). The fd is close-on-exec, so runtimes the daemon
    spawns never inherit, and never prolong, the lock.
    """

    def __init__(self, fd: int, path: pathlib.Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def acquire(cls, state_dir: pathlib.Path) -> DaemonLock:
        """Lock ``state_dir`` (created 0700 if missing) and write our pid into the lock file.

        Does not wait: raises :class:`AlreadyRunning` with the holder's pid
        when another process (or another DaemonLock in this one) holds it.
        Raises :class:`~agentd._trust.Untrusted` when the lock file breaks the
        trust rule (a symlink, another user's, writable by others) or cannot be opened.
        """
        state_dir = pathlib.Path(state_dir)
        _fsutil.make_dirs(state_dir)
        path = state_dir / LOCK_FILE
        fd = _trust.open_file(path, os.O_RDWR | os.O_CREAT, "lock file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise AlreadyRunning(pid, path) from None
        except BaseException:
            os.close(fd)
            raise
        # The file is never unlinked: unlinking a locked file lets two daemons lock two different inodes.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        """Unlock; idempotent."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            os.ftruncate(fd, 0)  # no stale pid for the next reader
        except OSError:
            pass
        finally:
            os.close(fd)  # closing the only fd of the open file drops the flock

    def __enter__(self) -> DaemonLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


# --------------------------------------------------------------------------- leases


class Lease(msgspec.Struct, frozen=True):
    """Conversation ``key`` belongs to daemon instance ``owner`` (process ``pid``) until ``expires_at``.

    ``acquired_at`` is UTC RFC 3339; ``expires_at`` is unix seconds.
    """

    key: str
    owner: str
    pid: int
    acquired_at: str
    expires_at: float


class OwnerHeartbeat(msgspec.Struct, frozen=True):
    """Every lease of ``owner`` (process ``pid``) lasts at least until ``expires_at`` (unix seconds).

    One write of this renews all of an owner's leases at once (see :class:`FileLeaseStore`).
    """

    owner: str
    pid: int
    expires_at: float


class LeaseHeld(AgentdError):
    """The conversation is leased to another owner that is alive; ``lease`` is that lease."""

    code = "busy"

    def __init__(self, lease: Lease) -> None:
        super().__init__(
            f"conversation {lease.key} is leased to {lease.owner} (pid {lease.pid}) until {_rfc3339(lease.expires_at)}",
            details={"owner": lease.owner, "pid": lease.pid, "expires_at": lease.expires_at},
        )
        self.lease = lease


class LeaseOutcome(msgspec.Struct, frozen=True, omit_defaults=True):
    """What :meth:`LeaseStore.acquire` did; ``previous_*`` describe a lease taken over."""

    action: Literal["acquired", "taken_over", "renewed"]
    previous_owner: str = ""
    previous_expired: bool = False


@runtime_checkable
class LeaseStore(Protocol):
    """Where leases live. Methods are synchronous and short; keys are conversation ids."""

    def acquire(self, key: str) -> LeaseOutcome:
        """Lease ``key`` to us; raises :class:`LeaseHeld` when a live other owner holds it."""
        ...

    def renew(self, key: str) -> None:
        """Extend our lease; raises :class:`LeaseHeld` (lost to another owner) or :class:`NotFound`."""
        ...

    def release(self, key: str) -> None:
        """Give up our lease; idempotent, never touches another owner's lease."""
        ...

    def get(self, key: str) -> Lease | None: ...

    def held(self) -> list[str]:
        """Keys this store holds for us, sorted."""
        ...


_lease_decoder = msgspec.json.Decoder(Lease)
_heartbeat_decoder = msgspec.json.Decoder(OwnerHeartbeat)
_encode = msgspec.json.Encoder().encode


class FileLeaseStore:
    """Leases as files: ``<root>/<key>/lease.json``, written atomically.

    ``owner`` is this daemon instance's id; ``ttl_s`` how long a lease lasts
    without renewal. Each read-modify-write holds an ``flock`` on
    ``<root>/<key>/`` so two processes never interleave. Use from the trio
    thread; blocking I/O per call is one small file.

    With ``exclusive`` (the default, and what agentd uses) the caller holds the
    :class:`DaemonLock` of the state dir. That lock is the liveness proof: the
    kernel holds it exactly as long as its holder lives, so any other owner is
    provably dead (its leases are taken over at once, expired or not) and our
    own leases last while we run. Nothing is renewed: :meth:`run` never wakes,
    and an idle daemon with a thousand open conversations writes nothing and
    takes no timer (tests/bench ``idle``). :meth:`get` reports our own leases
    as lasting ``ttl_s`` from now.

    Without ``exclusive`` (several owners sharing ``root``, none proving the
    others dead) renewal is batched: :meth:`run` rewrites one
    :class:`OwnerHeartbeat` file every ``ttl_s / 3``, never one file per lease,
    and a lease lasts until the later of its own ``expires_at`` and its owner's
    heartbeat, so a dead owner's leases all expire together. One holding no
    lease writes nothing and never wakes.
    """

    def __init__(self, root: pathlib.Path, *, owner: str, ttl_s: float = 30.0, exclusive: bool = True) -> None:
        self.root = pathlib.Path(root)
        self.owner = owner
        self.ttl_s = ttl_s
        self.exclusive = exclusive
        self._held: set[str] = set()
        #: when our heartbeat file, as last written, expires (0: not written yet)
        self._beat_until = 0.0
        #: set by :meth:`acquire` while :meth:`run` waits for a first lease to keep alive
        self._first_lease: trio.Event | None = None

    # ------------------------------------------------------------------ heartbeats

    def _owners(self) -> pathlib.Path:
        return self.root / OWNERS_DIR

    def _heartbeat_path(self, owner: str) -> pathlib.Path | None:
        return self._owners() / f"{owner}.json" if _fsutil.is_safe_name(owner) else None

    def _read_heartbeat(self, owner: str) -> OwnerHeartbeat | None:
        path = self._heartbeat_path(owner)
        if path is None:
            return None
        try:
            beat = _heartbeat_decoder.decode(_fsutil.read_file(path))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (msgspec.DecodeError, OSError) as exc:
            _log().warning("lease.heartbeat_unreadable", path=str(path), error=str(exc))
            return None
        return beat if beat.owner == owner else None

    def _beat(self) -> None:
        """Write our heartbeat: every lease we hold now lasts ``ttl_s`` from now. Blocking; OSError."""
        path = self._heartbeat_path(self.owner)
        if path is None:
            raise Invalid(f"lease owner {self.owner!r} cannot name a file")
        until = time.time() + self.ttl_s
        _fsutil.make_dirs(path.parent)
        # Not fsynced: a power cut that loses it also ended its owner, whose leases may then go sooner.
        _fsutil.atomic_write(path, _encode(OwnerHeartbeat(self.owner, os.getpid(), until)), durable=False)
        self._beat_until = until

    def _expires_at(self, lease: Lease) -> float:
        if self.exclusive and lease.owner == self.owner:
            return max(lease.expires_at, time.time() + self.ttl_s)  # ours, and we hold the daemon lock
        beat = self._read_heartbeat(lease.owner)
        return max(lease.expires_at, beat.expires_at) if beat is not None else lease.expires_at

    def sweep(self) -> int:
        """Delete the heartbeats of other owners that expired (with ``exclusive``: every other owner's).

        Returns how many were removed. Blocking; a file that vanished meanwhile is no error.
        """
        removed = 0
        try:
            entries = list(os.scandir(self._owners()))
        except FileNotFoundError:
            return 0
        now = time.time()
        for e in entries:
            owner = e.name.removesuffix(".json")
            if owner == self.owner or not e.name.endswith(".json"):
                continue
            beat = self._read_heartbeat(owner)
            if self.exclusive or beat is None or beat.expires_at <= now:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
                    removed += 1
        return removed

    def _dir(self, key: str) -> pathlib.Path:
        if not _fsutil.is_safe_name(key):
            raise Invalid(f"invalid lease key {key!r}")
        return self.root / key

    @contextlib.contextmanager
    def _locked(self, d: pathlib.Path) -> Iterator[None]:
        """flock the key's directory; raises FileNotFoundError when it does not exist."""
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self, d: pathlib.Path) -> Lease | None:
        try:
            data = _fsutil.read_file(d / LEASE_FILE)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return _lease_decoder.decode(data)
        except msgspec.DecodeError as exc:
            # Atomic writes make this unlikely; an unreadable lease proves no owner.
            _log().warning("lease.unreadable", path=str(d / LEASE_FILE), error=str(exc))
            return None

    def _write(self, d: pathlib.Path, lease: Lease) -> None:
        _fsutil.atomic_write(d / LEASE_FILE, _encode(lease))

    def acquire(self, key: str) -> LeaseOutcome:
        """Lease ``key`` to us for ``ttl_s``; blocking (one small atomic write).

        No lease -> ``acquired``; ours -> ``renewed``; another owner's that
        expired -> ``taken_over`` with ``previous_expired``; another owner's
        that has not expired -> ``taken_over`` when ``exclusive``, else raises
        :class:`LeaseHeld`. Raises :class:`Invalid` for a key that cannot name
        a directory, OSError.
        """
        d = self._dir(key)
        _fsutil.make_dirs(d)
        with self._locked(d):
            now = time.time()
            cur = self._read(d)
            acquired_at = _rfc3339(now)
            if cur is None:
                outcome = LeaseOutcome("acquired")
            elif cur.owner == self.owner:
                outcome = LeaseOutcome("renewed")
                acquired_at = cur.acquired_at
            else:
                until = self._expires_at(cur)
                expired = until <= now
                if not expired and not self.exclusive:
                    raise LeaseHeld(msgspec.structs.replace(cur, expires_at=until))
                outcome = LeaseOutcome("taken_over", previous_owner=cur.owner, previous_expired=expired)
            self._write(d, Lease(key, self.owner, os.getpid(), acquired_at, now + self.ttl_s))
        self._hold(key)
        if not self.exclusive and self._beat_until < now + self.ttl_s * 2 / 3:
            try:
                self._beat()  # the heartbeat covers this lease from now on
            except (AgentdError, OSError) as exc:  # the lease itself lasts ttl_s; run() retries the heartbeat
                _log().error("lease.renew_failed", key=self.owner, error=str(exc))
        return outcome

    def _renew(self, key: str) -> None:
        # No self._held changes here: run() calls this from a worker thread.
        d = self._dir(key)
        try:
            with self._locked(d):
                cur = self._read(d)
                if cur is None:
                    raise NotFound(f"no lease on {key}")
                if cur.owner != self.owner:
                    raise LeaseHeld(cur)
                self._write(d, Lease(key, self.owner, os.getpid(), cur.acquired_at, time.time() + self.ttl_s))
        except FileNotFoundError:
            raise NotFound(f"no lease on {key}") from None

    def renew(self, key: str) -> None:
        """Extend our lease on ``key`` to ``ttl_s`` from now; blocking.

        Raises :class:`LeaseHeld` when another owner holds it now and
        :class:`NotFound` when it has no lease (released, or the conversation
        was removed); either way ``key`` leaves :meth:`held`. OSError leaves
        it held (the next renewal retries).
        """
        try:
            self._renew(key)
        except (LeaseHeld, NotFound):
            self._held.discard(key)
            raise
        self._hold(key)

    def _hold(self, key: str) -> None:
        self._held.add(key)
        if self._first_lease is not None:
            self._first_lease.set()  # run() renews from now on

    def release(self, key: str) -> None:
        """Delete our lease on ``key``; idempotent; another owner's lease is left alone."""
        self._held.discard(key)
        d = self._dir(key)
        try:
            with self._locked(d):
                cur = self._read(d)
                if cur is not None and cur.owner == self.owner:
                    os.unlink(d / LEASE_FILE)
        except FileNotFoundError:
            pass

    def get(self, key: str) -> Lease | None:
        """The current lease on ``key`` whoever owns it, expired or not; None when there is none.

        Its ``expires_at`` is the later of the lease's own and its owner's heartbeat.
        """
        cur = self._read(self._dir(key))
        if cur is None:
            return None
        until = self._expires_at(cur)
        return cur if until == cur.expires_at else msgspec.structs.replace(cur, expires_at=until)

    def held(self) -> list[str]:
        """Keys we hold (acquired and not released or lost), sorted."""
        return sorted(self._held)

    def _renew_many(self, keys: list[str]) -> list[tuple[str, Exception]]:
        failed: list[tuple[str, Exception]] = []
        for key in keys:
            try:
                self._renew(key)
            except (AgentdError, OSError) as exc:
                failed.append((key, exc))
        return failed

    def _round(self) -> bool:
        """One renewal round: the heartbeat. Returns whether it had lapsed before
        (every lease must then be looked at again); raises what :meth:`_beat` raises."""
        lapsed = self._beat_until <= time.time()
        self._beat()
        return lapsed

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep every held lease alive until cancelled. Never raises but Cancelled.

        First the heartbeats other owners left are swept (:meth:`sweep`). With
        ``exclusive`` that is all: the daemon lock keeps our leases, so this
        waits without a timer. Otherwise every ``ttl_s / 3`` one heartbeat
        write renews them all, on the trio thread (see :meth:`_beat`). After a
        heartbeat that had lapsed (a failed write, a stalled daemon) each lease
        is read again, in a worker thread: one lost to another owner, or
        deleted, is dropped from :meth:`held` and logged (``lease.lost``). An
        OSError is logged (``lease.renew_failed``) and retried at the next round.
        """
        with contextlib.suppress(OSError):
            await trio.to_thread.run_sync(self.sweep)
        task_status.started()
        if self.exclusive:
            await trio.sleep_forever()  # no other owner can be alive to take a lease from us
        while True:
            if not self._held:
                # Nothing to keep alive: no wake-ups until an acquire, which writes the heartbeat itself.
                self._first_lease = trio.Event()
                try:
                    await self._first_lease.wait()
                finally:
                    self._first_lease = None
            await trio.sleep(self.ttl_s / 3)
            if not self._held:
                continue
            try:
                # On this thread, as acquire's own beat and the journal's writes: one small file, no
                # fsync. A worker thread here was a new thread each round (trio keeps one 10 s).
                lapsed = self._round()
            except (AgentdError, OSError) as exc:
                _log().error("lease.renew_failed", key=self.owner, error=str(exc))
                continue
            if not lapsed:
                continue  # the one write of the round: nothing here is per lease
            # While it had lapsed another owner may have taken a lease: look at each one.
            failed = await trio.to_thread.run_sync(self._renew_many, sorted(self._held))
            for key, exc in failed:
                if isinstance(exc, (LeaseHeld, NotFound)):
                    self._held.discard(key)
                    _log().warning("lease.lost", key=key, reason=str(exc))
                else:
                    _log().error("lease.renew_failed", key=key, error=str(exc))
