"""A blocking client of the agentd control socket.

Transport only: it frames requests, matches replies to requests by id, routes
pushed subscription frames to their subscription, and starts the daemon when
asked to. It knows nothing of terminals.

One reader thread owns the receiving side of the socket. Replies and pushed
frames are handed to the calling thread through queues, so a caller can wait
for a reply, or read a subscription, while other frames keep arriving (attach
prompts at the terminal while a turn streams on).
"""

from __future__ import annotations

import errno
import itertools
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TypeVar

# The C modules under ``queue`` and ``socket``: every class and constant used here,
# without what the Python wrappers add at import (enums, selectors), which every
# agentctl start would pay for (about 5 ms on a slow machine).
import _queue as queue
import _signal
import _socket as socket

import msgspec

# _trust is standard library only, like wire: the daemon's own trust rule, so refusals read the same.
from agentd import _trust, wire
from agentd.contract import AgentdError, LimitExceeded

from . import __version__

T = TypeVar("T")

#: How long to wait for a daemon we started to answer, seconds (it starts in about
#: a second; a loaded machine can take several).
AUTOSTART_TIMEOUT_S = 10.0
#: How much the reader asks the socket for at once, bytes.
_RECV_BYTES = 64 * 1024
#: Environment variables that disable autostart when set to a true value.
NO_AUTOSTART_ENV = "AGENTD_NO_AUTOSTART"


class Unreachable(Exception):
    """agentd could not be reached (no socket, refused, or the connection broke)."""


class NotRunning(Unreachable):
    """Nothing listens on the socket (no socket file, or connection refused) and autostart was off."""


class ForeignListener(Unreachable):
    """The process listening on the socket runs as another uid (SO_PEERCRED): nothing is sent to it."""


#: the signals only agentctl's main thread takes (see Client._start)
_MAIN_THREAD_SIGNALS = {_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT, _signal.SIGWINCH}


class _Closed:
    """Put into every queue when the connection ends; ``error`` says why."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def default_socket_path() -> str:
    """Where agentd's socket is when neither ``--socket`` nor the config file says: as agentd finds it.

    ``$AGENTD_SOCKET``, else ``$AGENTD_RUNTIME_DIR/agentd.sock``, else
    ``<user runtime dir>/agentd/agentd.sock`` (platformdirs; on Linux that is
    ``$XDG_RUNTIME_DIR/agentd`` when set, computed here without importing
    platformdirs). Relative values are taken from the current directory.
    """
    env = os.environ.get("AGENTD_SOCKET")
    if env:
        return os.path.abspath(env)
    runtime = os.environ.get("AGENTD_RUNTIME_DIR")
    if runtime:
        return os.path.join(os.path.abspath(runtime), "agentd.sock")
    xdg = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if xdg and sys.platform.startswith("linux"):
        return os.path.join(xdg, "agentd", "agentd.sock")
    try:
        return os.path.join(_trust.user_runtime_dir("agentd"), "agentd.sock")
    except _trust.Untrusted as exc:  # the fallback is another user's: agentd refuses it too
        raise Unreachable(str(exc)) from None


def autostart_disabled() -> bool:
    return os.environ.get(NO_AUTOSTART_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class Client:
    """One connection to agentd, after the hello exchange.

    Use :meth:`connect`. :meth:`request` sends a request and waits for its
    reply; :meth:`subscribe` returns a :class:`Subscription` whose frames are
    read with :meth:`Subscription.get`. Thread-safe for one caller thread plus
    the reader thread. A broken connection raises :class:`Unreachable` from
    every waiting call.
    """

    def __init__(self, sock: socket.socket, path: str) -> None:
        self.path = path
        self._sock = sock
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._replies: dict[int, queue.SimpleQueue[Any]] = {}
        self._subs: dict[int, queue.SimpleQueue[Any]] = {}
        self._closed: BaseException | None = None
        self.hello: wire.HelloFrame | None = None
        #: the daemon's limit of one incoming frame (from its hello result); None = not told
        self.max_frame_bytes: int | None = None
        #: the daemon's largest attachment ([attachments] max_bytes, from its hello result); None = not told
        self.max_attachment_bytes: int | None = None
        self._reader = threading.Thread(target=self._read_loop, name="agentctl-reader", daemon=True)

    # ------------------------------------------------------------------ connecting

    @classmethod
    def connect(
        cls,
        path: str | None = None,
        *,
        autostart: bool = True,
        notify: Any = None,
    ) -> Client:
        """Connect to the daemon at ``path`` and exchange hellos.

        When nothing listens there (no socket file, connection refused) and
        ``autostart`` is true, starts ``python -m agentd run`` detached, calls
        ``notify(message)`` once to say so, and retries for up to
        :data:`AUTOSTART_TIMEOUT_S`. Raises :class:`Unreachable`, or the
        daemon's error (e.g. a protocol mismatch) as an :class:`AgentdError`.
        """
        path = path or default_socket_path()
        try:
            _trust.check_socket_length(path)  # the daemon refuses such a path with these same words
        except _trust.Untrusted as exc:
            raise Unreachable(str(exc)) from None
        try:
            sock = _open_socket(path)
        except OSError as exc:
            if not _nobody_listening(exc):
                raise Unreachable(f"cannot connect to agentd at {path}: {exc.strerror or exc}") from None
            if not autostart:
                raise NotRunning(
                    f"agentd is not running at {path} ({exc.strerror or exc}); "
                    "start it with `agentd run` (autostart is disabled)"
                ) from None
            sock = _autostart(path, notify)
        client = cls(sock, path)
        client._start()
        return client

    def _start(self) -> None:
        # The kernel gives a process-directed signal (Ctrl-C's SIGINT) to any thread that does not
        # block it. Taken by the reader, Python's handler would only mark it for the main thread,
        # asleep in a reply's wait that nothing wakes: agentctl would not stop. The reader starts
        # with them blocked (a thread inherits its creator's mask), so only the main thread takes them.
        held = _signal.pthread_sigmask(_signal.SIG_BLOCK, _MAIN_THREAD_SIGNALS)
        try:
            self._reader.start()
        finally:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, held)
        # The daemon speaks first, but both hellos can cross: send ours right away.
        hello_q = self._register_reply(0)
        self._send(wire.Hello(id=0, protocol=wire.PROTOCOL_VERSION, client=f"agentctl/{__version__}"))
        raw = self._wait(hello_q, 0)
        try:
            told = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            told = None
        if not isinstance(told, dict):
            told = {}
        self.max_frame_bytes = _positive(told.get("max_frame_bytes"))
        self.max_attachment_bytes = _positive(told.get("max_attachment_bytes"))

    # ------------------------------------------------------------------ requests

    def next_id(self) -> int:
        return next(self._ids)

    def request(self, req: Any, result_type: type[T] | Any = Any) -> T:
        """Send ``req`` (a :data:`wire.Request` struct) and return its decoded result.

        Raises the daemon's error as its :class:`AgentdError` subclass.
        """
        reply_q = self._register_reply(req.id)
        self._send(req)
        raw = self._wait(reply_q, req.id)
        return msgspec.json.decode(raw, type=result_type)

    def call(self, cls: type, result_type: Any = Any, **fields: Any) -> Any:
        """Build ``cls(id=<next id>, **fields)`` and :meth:`request` it."""
        return self.request(cls(id=self.next_id(), **fields), result_type)

    def subscribe(self, conversation: str | None, after: int = 0, *, snapshot: bool = True,
                  dropped: bool = False) -> Subscription:
        """Subscribe to one conversation after ``after`` (or every one, live, when None);
        ``dropped`` replays the turns a rewind dropped too (each record marked ``dropped``).

        Returns once the daemon confirmed; frames arrive on the returned
        :class:`Subscription`, which also resubscribes transparently after a
        ``lagged`` frame.
        """
        sub = Subscription(self, conversation, snapshot)
        sub.dropped = dropped
        sub._open(after)
        return sub

    def _subscribe_raw(
        self, conversation: str | None, after: int, snapshot: bool, frames: queue.SimpleQueue[Any], dropped: bool = False
    ) -> tuple[int, wire.SubscribeResult]:
        req = wire.Subscribe(id=self.next_id(), conversation=conversation, after=after, snapshot=snapshot,
                             all=dropped)
        with self._lock:
            # Registered before sending: pushed frames may follow the reply at once.
            self._subs[req.id] = frames
        try:
            result = self.request(req, wire.SubscribeResult)
        except BaseException:
            with self._lock:
                self._subs.pop(req.id, None)
            raise
        return req.id, result

    def _unsubscribe(self, sub_id: int) -> None:
        with self._lock:
            self._subs.pop(sub_id, None)
        if self._closed is None:
            try:
                self.request(wire.Unsubscribe(id=self.next_id(), subscription=sub_id), Any)
            except AgentdError:
                pass  # already gone on the daemon's side

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the daemon to close the connection; whether it did."""
        self._reader.join(timeout)
        return not self._reader.is_alive()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _register_reply(self, req_id: int) -> queue.SimpleQueue[Any]:
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self._lock:
            if self._closed is not None:
                raise Unreachable(f"connection to agentd closed: {self._closed}")
            self._replies[req_id] = q
        return q

    def _send(self, frame: Any) -> None:
        data = wire.encode(frame)
        if self.max_frame_bytes is not None and len(data) - 1 > self.max_frame_bytes:
            # agentd would refuse it and drop the connection: say why here instead.
            raise LimitExceeded(
                f"the request is {len(data) - 1} bytes, over agentd's limit of {self.max_frame_bytes} "
                "(server.max_frame_bytes); attachments count base64-encoded, 4/3 of their size"
            )
        try:
            with self._send_lock:
                self._sock.sendall(data)
        except OSError as exc:
            raise Unreachable(f"connection to agentd lost: {exc.strerror or exc}") from None

    def _wait(self, q: queue.SimpleQueue[Any], req_id: int) -> msgspec.Raw:
        try:
            item = q.get()
        finally:
            with self._lock:
                self._replies.pop(req_id, None)
        if isinstance(item, _Closed):
            if isinstance(item.error, AgentdError):
                raise item.error
            raise Unreachable(f"connection to agentd lost: {item.error}")
        if isinstance(item, wire.ErrorFrame):
            raise wire.error_from_body(item.error)
        return item.result

    def _read_loop(self) -> None:
        reason: BaseException = EOFError("agentd closed the connection")
        limit = wire.CLIENT_MAX_FRAME_BYTES
        buf = bytearray()  # the start of a frame whose newline has not arrived yet
        try:
            while True:
                chunk = self._sock.recv(_RECV_BYTES)
                if not chunk:
                    break  # closed; a torn last frame in buf means the daemon went away mid-write
                scan = len(buf)  # buf holds no newline: look only at what arrived
                buf += chunk
                start = 0
                while (end := buf.find(b"\n", scan)) >= 0:
                    if end - start > limit:
                        raise wire.ProtocolError("frame from agentd over the client limit")
                    self._dispatch(wire.decode_server_frame(bytes(buf[start:end])))
                    start = scan = end + 1
                del buf[:start]
                if len(buf) > limit:
                    raise wire.ProtocolError("frame from agentd over the client limit")
        except (OSError, ValueError) as exc:
            reason = exc if not isinstance(exc, ValueError) else EOFError("connection closed")
        except AgentdError as exc:
            reason = exc
        finally:
            self._shutdown(reason)

    def _dispatch(self, frame: Any) -> None:
        if isinstance(frame, wire.HelloFrame):
            self.hello = frame
            return
        if isinstance(frame, (wire.ResultFrame, wire.ErrorFrame)):
            with self._lock:
                q = self._replies.get(frame.id) if frame.id is not None else None
                if q is None and frame.id is None and isinstance(frame, wire.ErrorFrame):
                    # An error about a frame without a readable id: fail every waiter.
                    for waiting in self._replies.values():
                        waiting.put(frame)
                    return
            if q is not None:
                q.put(frame)
            return
        # event / snapshot / lagged
        with self._lock:
            q = self._subs.get(frame.sub)
        if q is not None:
            q.put(frame)

    def _shutdown(self, reason: BaseException) -> None:
        with self._lock:
            if self._closed is not None:
                return
            self._closed = reason
            waiting = list(self._replies.values()) + list(self._subs.values())
        for q in waiting:
            q.put(_Closed(reason))


class Subscription:
    """The frames of one subscription, lagged frames handled on the way.

    :meth:`get` returns :class:`wire.EventFrame`, :class:`wire.SnapshotFrame`,
    or None on timeout; it never returns a ``lagged`` frame: it resubscribes
    after ``resume_after`` instead (for every conversation: live again, after
    catching each conversation up from its last delivered seq). Records already
    delivered (same conversation, same seq) are dropped, so a resubscription
    shows no duplicate.
    """

    def __init__(self, client: Client, conversation: str | None, snapshot: bool) -> None:
        self._client = client
        self.conversation = conversation
        self._snapshot = snapshot
        self._frames: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._backlog: list[Any] = []
        self.id = 0
        self.result: wire.SubscribeResult | None = None
        #: conversation id -> last durable seq delivered
        self.positions: dict[str, int] = {}
        #: replay the turns a rewind dropped too
        self.dropped = False

    def _open(self, after: int) -> None:
        self.id, self.result = self._client._subscribe_raw(self.conversation, after, self._snapshot, self._frames,
                                                           self.dropped)

    def get(self, timeout: float | None = None) -> Any:
        """The next frame, or None after ``timeout`` seconds (None: wait for ever).

        Raises :class:`Unreachable` when the connection ends.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._backlog:
                frame = self._backlog.pop(0)
            else:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    frame = self._frames.get(timeout=remaining) if remaining != 0.0 else self._frames.get_nowait()
                except queue.Empty:
                    return None
            if isinstance(frame, _Closed):
                self._frames.put(frame)  # stay closed for later calls
                if isinstance(frame.error, AgentdError):
                    raise frame.error
                raise Unreachable(f"connection to agentd lost: {frame.error}")
            if isinstance(frame, wire.LaggedFrame):
                if frame.sub == self.id:
                    self._resubscribe(frame)
                continue
            if frame.sub != self.id:
                continue  # left over from a subscription we replaced
            if isinstance(frame, wire.EventFrame):
                seq = _peek_seq(frame.record)
                if seq:
                    if seq <= self.positions.get(frame.conversation, 0):
                        continue
                    self.positions[frame.conversation] = seq
            return frame

    def __iter__(self) -> Iterator[Any]:
        while True:
            yield self.get()

    def close(self) -> None:
        if self.id:
            self._client._unsubscribe(self.id)
            self.id = 0

    def _resubscribe(self, lagged: wire.LaggedFrame) -> None:
        old = self.id
        with self._client._lock:
            self._client._subs.pop(old, None)
        if self.conversation is not None:
            after = max(lagged.resume_after, self.positions.get(lagged.conversation, 0))
            self._open(after)
            return
        # Every conversation: live again first (buffering), then catch each one
        # up from what it last delivered; duplicates are dropped by seq.
        self._open(0)
        positions = dict(lagged.positions)
        for conv, pos in self.positions.items():
            positions[conv] = max(pos, positions.get(conv, 0))
        for conv, pos in positions.items():
            self._catch_up(conv, pos)

    def _catch_up(self, conversation: str, after: int) -> None:
        frames: queue.SimpleQueue[Any] = queue.SimpleQueue()
        try:
            sub_id, result = self._client._subscribe_raw(conversation, after, False, frames)
        except AgentdError:
            return  # removed meanwhile
        try:
            last = result.last_seq
            while after < last:
                frame = frames.get()
                if isinstance(frame, _Closed):
                    frames.put(frame)
                    self._frames.put(frame)
                    return
                if isinstance(frame, wire.EventFrame) and frame.sub == sub_id:
                    seq = _peek_seq(frame.record)
                    if seq:
                        after = max(after, seq)
                        self._backlog.append(frame)
                elif isinstance(frame, wire.LaggedFrame):
                    break  # give up on this one; the live subscription goes on
        finally:
            self._client._unsubscribe(sub_id)
        # Deliver the caught-up records as if they came on the live subscription.
        self._backlog = [
            wire.EventFrame(sub=self.id, conversation=f.conversation, record=f.record)
            if isinstance(f, wire.EventFrame)
            else f
            for f in self._backlog
        ]


class _SeqOnly(msgspec.Struct):
    seq: int = 0


_seq_decoder = msgspec.json.Decoder(_SeqOnly)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _peek_seq(raw: msgspec.Raw) -> int:
    try:
        return _seq_decoder.decode(raw).seq
    except msgspec.DecodeError:
        return 0


# ---------------------------------------------------------------------- sockets and autostart


def _open_socket(path: str) -> socket.socket:
    """Connect to ``path``; raises OSError, or :class:`ForeignListener` before anything is sent."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        _check_peer(sock, path)
    except BaseException:
        sock.close()
        raise
    return sock


def _check_peer(sock: socket.socket, path: str) -> None:
    """Refuse a listener that runs as another uid: it could be another user's fake agentd (SO_PEERCRED)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return  # not Linux: the 0700 runtime dir is the only guard
    cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    pid, uid = (int.from_bytes(cred[i:i + 4], sys.byteorder) for i in (0, 4))
    me = os.geteuid()
    if uid != me:
        raise ForeignListener(
            f"the process listening at {path} (pid {pid}) runs as uid {uid}, not as you (uid {me}); "
            "agentctl sends it nothing. Another user may have created that path: remove it, "
            "or point --socket / AGENTD_SOCKET at your own agentd"
        )


def _nobody_listening(exc: OSError) -> bool:
    return isinstance(exc, (FileNotFoundError, ConnectionRefusedError)) or exc.errno in (
        errno.ENOENT,
        errno.ECONNREFUSED,
    )


def _daemon_env(path: str) -> dict[str, str]:
    """The environment for an autostarted daemon: ours, with the socket and paths made absolute."""
    env = dict(os.environ)
    env["AGENTD_SOCKET"] = os.path.abspath(path)
    for key in ("AGENTD_STATE_DIR", "AGENTD_CONFIG"):
        if env.get(key):
            env[key] = os.path.abspath(env[key])
    # Run the same agentd as this agentctl, also from a source checkout.
    import agentd

    root = os.path.dirname(os.path.dirname(os.path.abspath(agentd.__file__)))
    if os.path.basename(root) not in ("site-packages", "dist-packages"):
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if root not in parts:
            env["PYTHONPATH"] = os.pathsep.join([root, *parts])
    return env


def _socket_unit(path: str) -> str | None:
    """The installed agentd.socket user unit when it listens at ``path`` (its ListenStream,
    $XDG_RUNTIME_DIR/agentd/agentd.sock); else None."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if not runtime or os.path.abspath(path) != os.path.join(os.path.abspath(runtime), "agentd", "agentd.sock"):
        return None
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    unit = os.path.join(base, "systemd", "user", "agentd.socket")
    return unit if os.path.isfile(unit) else None


def _start_socket_unit(path: str, unit: str, notify: Any) -> socket.socket:
    """Leave the start to systemd: ``systemctl --user start agentd.socket``, then connect (systemd
    starts agentd.service on it). An agentd started beside the unit would hold the state dir and
    the socket path the unit wants."""
    import shutil
    import subprocess

    fix = (f"agentd.socket is installed ({unit}) but not listening at {path}, and agentctl leaves the start "
           "to systemd: run `systemctl --user daemon-reload && systemctl --user enable --now agentd.socket`")
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        raise Unreachable(f"{fix} (systemctl is not on PATH)")
    try:
        cp = subprocess.run([systemctl, "--user", "start", "agentd.socket"], capture_output=True, text=True, timeout=30,
                            stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unreachable(f"{fix} (systemctl --user start agentd.socket: {exc})") from None
    if cp.returncode != 0:
        said = " ".join(cp.stderr.split())[:300]
        raise Unreachable(f"{fix} (systemctl --user start agentd.socket exited {cp.returncode}: {said})")
    if notify is not None:
        notify("started agentd.socket (systemctl --user start agentd.socket); systemd starts agentd on this connection")
    deadline = time.monotonic() + AUTOSTART_TIMEOUT_S
    while True:
        try:
            return _open_socket(path)
        except OSError as exc:
            if not _nobody_listening(exc) or time.monotonic() > deadline:
                raise Unreachable(f"agentd.socket was started but nothing answers at {path}: "
                                  f"{exc.strerror or exc} (journalctl --user -u agentd.socket -u agentd)") from None
        time.sleep(0.05)


def _autostart(path: str, notify: Any) -> socket.socket:
    """Start ``python -m agentd run`` detached and connect once it listens; where the agentd.socket
    user unit is installed for this path, have systemd start it instead (:func:`_start_socket_unit`)."""
    import subprocess

    unit = _socket_unit(path)
    if unit is not None:
        return _start_socket_unit(path, unit, notify)
    rundir = os.path.dirname(os.path.abspath(path))
    log_path = os.path.join(rundir, "agentd.log")
    try:
        # The daemon's own rule (agentd._trust): never a log in another user's directory, nor through a symlink.
        _trust.private_dir(rundir, "socket dir", narrow=False)
        log_fd = _trust.open_file(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, "autostart log")
    except (_trust.Untrusted, OSError) as exc:
        raise Unreachable(f"agentd is not running at {path}, and agentctl will not start it: {exc}") from None
    log_start = os.lseek(log_fd, 0, os.SEEK_END)  # where what this daemon writes begins in the log
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentd", "run"],
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            env=_daemon_env(path),
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        raise Unreachable(f"agentd is not running at {path}, and starting it failed: {exc}") from None
    finally:
        os.close(log_fd)
    if notify is not None:
        notify(f"starting agentd (pid {proc.pid}); log: {log_path}")
    deadline = time.monotonic() + AUTOSTART_TIMEOUT_S
    last: OSError | None = None
    while time.monotonic() < deadline:
        try:
            return _open_socket(path)
        except ForeignListener:
            raise
        except OSError as exc:
            if not _nobody_listening(exc):
                raise Unreachable(f"cannot connect to agentd at {path}: {exc.strerror or exc}") from None
            last = exc
        if proc.poll() is not None:
            if proc.returncode == EXIT_CONFIG:
                break  # a start-up error a restart cannot fix: no agentd started like this will come up
            # Ours exited: maybe another agentd holds the state dir and is still
            # starting, so keep trying a little longer, but not the whole wait.
            deadline = min(deadline, time.monotonic() + 1.0)
        time.sleep(0.05)
    where = f"; see {log_path}"
    code = proc.poll()
    if code is not None:
        what = " (a start-up error a restart cannot fix)" if code == EXIT_CONFIG else ""
        said = _daemon_said(log_path, log_start)
        if not said:
            raise Unreachable(f"agentd exited with status {code}{what} right after starting{where}") from None
        quoted = "\n".join(f"  {line}" for line in said)
        raise Unreachable(
            f"agentd exited with status {code}{what} right after starting; its log {log_path} says:\n{quoted}"
        ) from None
    raise Unreachable(
        f"started agentd (pid {proc.pid}) but it did not listen at {path} within "
        f"{AUTOSTART_TIMEOUT_S:g} s ({last.strerror if last else 'no answer'}){where}"
    ) from None


#: agentd's exit status for a start-up error a restart cannot fix: a broken config, a path it may
#: not use (sysexits EX_CONFIG; the systemd unit does not restart on it).
EXIT_CONFIG = _trust.EXIT_UNUSABLE
#: At most this many lines of a daemon's output are quoted when it exits at start.
QUOTED_LINES = 10


def _daemon_said(log_path: str, start: int) -> list[str]:
    """What a daemon that exited at start wrote to the log (its stdout and stderr) after ``start``.

    Its own error reports (``agentd: ...``, e.g. the config error) when there
    are some, else the last lines (a traceback's end); at most
    :data:`QUOTED_LINES`, each cut to 500 characters. Empty when unreadable.
    """
    try:
        with os.fdopen(os.open(log_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            f.seek(max(start, os.fstat(f.fileno()).st_size - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("agentd: ")]
    return [line[:500] for line in (errors or lines)[-QUOTED_LINES:]]
