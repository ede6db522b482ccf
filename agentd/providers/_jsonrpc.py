"""JSON-RPC 2.0 over an agent's stdio, one JSON object per line, and the agent process itself.

Shared by the ``acp`` provider and the ``codex`` provider (``codex app-server``
speaks the same framing; it leaves out the ``jsonrpc`` field, which this reader
does not require, and accepts it). It imports no provider, so providers built
at once in worker threads never import each other half-initialized.

Transport below, protocol above: :class:`Connection` knows requests,
responses and notifications, never what a session is; :class:`AgentProcess`
owns one agent process, its connection and its stderr, and reports its end
exactly once. Neither blocks the trio loop: reading, writing and waiting are
trio checkpoints, and every task lives in the nursery given to
:meth:`AgentProcess.start`.
"""

from __future__ import annotations

import collections
import errno
import itertools
import math
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import structlog
import trio

from .. import procs, runtime_output

log = structlog.get_logger("agentd.providers.jsonrpc")

#: JSON-RPC 2.0 error codes
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

#: A line longer than this (no newline yet) ends the turn and the process (agentd.runtime_output).
MAX_LINE_BYTES = runtime_output.MAX_MESSAGE_BYTES
#: bytes asked of the agent's stdout at a time
READ_BYTES = 1 << 16
#: After stdin is closed, a well-behaved agent exits within this; then SIGTERM.
EOF_GRACE_S = 0.3
#: SIGTERM to SIGKILL.
TERM_GRACE_S = 2.0
#: For the keeper to SIGKILL the agent's group and descendants; then agentd kills the group itself.
KILL_WAIT_S = 1.0
#: stderr lines kept to explain an exit.
STDERR_TAIL = 40

_encoder = msgspec.json.Encoder()


class RpcError(Exception):
    """The peer answered a request with a JSON-RPC error, or a handler refuses one."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message
        self.data = data

    def describe(self) -> str:
        """The message plus any human-readable detail the agent put in ``data``."""
        detail = ""
        if isinstance(self.data, dict):
            detail = str(self.data.get("details") or self.data.get("message") or self.data.get("uri") or "")
        elif isinstance(self.data, str):
            detail = self.data
        detail = detail.strip()
        if detail and detail not in self.message:
            return f"{self.message}: {detail}"
        return self.message


class ConnectionLost(Exception):
    """The agent went away or broke the protocol; ``reason`` says how, for a person."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Call:
    """One request in flight; :meth:`wait` returns its result."""

    __slots__ = ("id", "method", "_done", "_result", "_error")

    def __init__(self, id: int, method: str) -> None:
        self.id = id
        self.method = method
        self._done = trio.Event()
        self._result: Any = None
        self._error: Exception | None = None

    def _set(self, result: Any = None, error: Exception | None = None) -> None:
        if not self._done.is_set():
            self._result, self._error = result, error
            self._done.set()

    async def wait(self) -> Any:
        """The result; raises RpcError (the agent refused) or ConnectionLost. Cancellable."""
        await self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result


RequestHandler = Callable[[str, Any], Awaitable[Any]]
NotificationHandler = Callable[[str, Any], None]


class Connection:
    """A JSON-RPC peer on a pair of byte streams.

    Incoming requests run ``on_request(method, params)`` each in a task of the
    serving nursery (a permission request may wait for a person); its return
    value is the result, an :class:`RpcError` it raises is the error answer.
    Notifications run ``on_notification(method, params)`` inline, in arrival
    order, before the next message is read: a response that follows updates on
    the wire is seen after them.
    """

    def __init__(self, send: trio.abc.SendStream, *, on_request: RequestHandler, on_notification: NotificationHandler,
                 label: str = "agent") -> None:
        self._send = send
        self._on_request = on_request
        self._on_notification = on_notification
        self._label = label
        self._ids = itertools.count(1)
        self._calls: dict[int, Call] = {}
        self._write_lock = trio.Lock()
        self.lost: ConnectionLost | None = None
        #: set when the peer broke the protocol (as opposed to closing its output)
        self.violation = ""

    # ------------------------------------------------------------------ outgoing

    async def start(self, method: str, params: Any) -> Call:
        """Write a request and return its :class:`Call` without waiting for the answer.

        Raises ConnectionLost when the line cannot be written (the agent then never
        saw a whole request).
        """
        if self.lost is not None:
            raise self.lost
        call = Call(next(self._ids), method)
        self._calls[call.id] = call
        try:
            await self._write({"jsonrpc": "2.0", "id": call.id, "method": method, "params": params})
        except ConnectionLost:
            self._calls.pop(call.id, None)
            raise
        return call

    async def request(self, method: str, params: Any, *, timeout: float = math.inf) -> Any:
        """Send a request and wait for its result.

        Raises RpcError, ConnectionLost, or trio.TooSlowError after ``timeout`` seconds
        (the call is then forgotten; a late answer is dropped).
        """
        call = await self.start(method, params)
        try:
            with trio.fail_after(timeout):
                return await call.wait()
        finally:
            self._calls.pop(call.id, None)

    async def notify(self, method: str, params: Any) -> None:
        """Send a notification; raises ConnectionLost."""
        await self._write({"jsonrpc": "2.0", "method": method, "params": params})

    async def _write(self, message: dict[str, Any]) -> None:
        """Write one line, whole, after any line being written. A checkpoint; cancelled only before
        any of it was written. Raises ConnectionLost."""
        line = _encoder.encode(message) + b"\n"
        lock = self._write_lock
        send = self._send
        if not isinstance(send, trio.lowlevel.FdStream) or lock.locked():
            async with lock:
                await self._send_line(line)
            return
        # A pipe nobody writes to: the line goes now, not after the scheduler passes that the lock's and
        # send_all's checkpoints took (the prompt waited behind the journaling of its own turn's start).
        await trio.lowlevel.checkpoint_if_cancelled()
        lock.acquire_nowait()  # not locked: nobody waits for it either
        try:
            await self._send_line(line, send.fileno())
        finally:
            lock.release()
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def _send_line(self, line: bytes, fd: int = -1) -> None:
        """``line`` on the stream, the write lock held: at once on ``fd`` (when >= 0) as far as the pipe
        takes it, the rest by ``send_all``. Raises ConnectionLost."""
        if self.lost is not None:
            raise self.lost
        try:
            if fd >= 0:
                try:
                    sent = os.write(fd, line)
                except BlockingIOError:  # the pipe is full
                    sent = 0
                except OSError as exc:  # named as send_all would have
                    raise trio.ClosedResourceError() if exc.errno == errno.EBADF else trio.BrokenResourceError()
                if sent == len(line):
                    return
                line = line[sent:]
            await self._send.send_all(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise ConnectionLost(f"the {self._label} stopped reading its input ({exc.__class__.__name__})") from None

    async def _answer(self, id: Any, result: Any = None, error: RpcError | None = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id}
        if error is not None:
            err: dict[str, Any] = {"code": error.code, "message": error.message}
            if error.data is not None:
                err["data"] = error.data
            msg["error"] = err
        else:
            msg["result"] = result
        try:
            await self._write(msg)
        except ConnectionLost:
            pass  # the agent is gone; its end is reported by the reader

    # ------------------------------------------------------------------ incoming

    async def serve(self, receive: trio.abc.ReceiveStream) -> None:
        """Read and dispatch until EOF or a protocol violation (then :attr:`violation` says which).

        Returns normally in both cases, with request handlers still running
        cancelled; calls in flight stay pending until :meth:`close`, so that
        the owner can give them the real reason (say, the process's exit).
        """
        async with trio.open_nursery() as nursery:
            try:
                await self._read_loop(receive, nursery)
            except ConnectionLost as exc:
                self.violation = exc.reason
            except Exception as exc:  # a bug met on this runtime's output ends its connection, not the provider
                log.exception("jsonrpc.reader_failed", runtime=self._label)
                self.violation = f"agentd could not read the {self._label}'s output ({type(exc).__name__}: {exc})"
            nursery.cancel_scope.cancel()

    def close(self, reason: str) -> None:
        """Mark the connection lost (first reason wins) and fail every call in flight."""
        if self.lost is None:
            self.lost = ConnectionLost(reason)
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call._set(error=self.lost)

    async def _read_loop(self, receive: trio.abc.ReceiveStream, nursery: trio.Nursery) -> None:
        receive_some = _chunk_reader(receive)
        buf = bytearray()  # the start of a line whose end has not come yet
        while True:
            try:
                chunk = await receive_some()  # a checkpoint: handlers and waiters run between chunks
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                chunk = b""
            if not chunk:
                if buf and not buf.isspace():
                    self._dispatch(bytes(buf), nursery)
                return
            # Only the new bytes can hold the next newline: scanning the whole buffer on every
            # chunk made a long line quadratic (an 80 MB line took seconds of CPU).
            lines = chunk.split(b"\n")
            rest = lines.pop()
            if lines:
                if buf:
                    buf += lines[0]
                    lines[0] = bytes(buf)
                    buf.clear()
                for line in lines:
                    if line and not line.isspace():
                        self._dispatch(line, nursery)
            buf += rest
            if len(buf) > MAX_LINE_BYTES:
                # No end in sight: the size so far is all that can be named (the line is over the ceiling).
                raise ConnectionLost(f"the {self._label} wrote a line over the ceiling: "
                                     + runtime_output.too_big(len(buf), complete=False))

    def _dispatch(self, line: bytes, nursery: trio.Nursery) -> None:
        try:
            msg = runtime_output.decode_json(line)  # odd bytes become U+FFFD, never a lost agent
        except msgspec.DecodeError as exc:
            raise ConnectionLost(f"the {self._label} wrote invalid JSON-RPC ({exc}): {_preview(line)}") from None
        if not isinstance(msg, dict) or (msg.get("jsonrpc", "2.0") != "2.0"):
            raise ConnectionLost(f"the {self._label} wrote invalid JSON-RPC: {_preview(line)}")
        method = msg.get("method")
        if isinstance(method, str):
            params = msg.get("params")
            if "id" in msg and msg["id"] is not None:
                nursery.start_soon(self._handle_request, msg["id"], method, params)
            else:
                try:
                    self._on_notification(method, params)
                except Exception:  # a mapping bug must not take the connection down
                    log.exception("jsonrpc.notification_failed", method=method)
            return
        if "id" in msg and ("result" in msg or "error" in msg):
            call = self._calls.pop(msg["id"], None) if isinstance(msg["id"], int) else None
            if call is None:
                log.debug("jsonrpc.unexpected_response", id=msg.get("id"))
                return
            err = msg.get("error")
            if err is not None:
                if not isinstance(err, dict):
                    err = {"message": str(err)}
                code = err.get("code")
                call._set(error=RpcError(code if isinstance(code, int) else INTERNAL_ERROR,
                                         str(err.get("message") or "error"), err.get("data")))
            else:
                call._set(result=msg.get("result"))
            return
        raise ConnectionLost(f"the {self._label} wrote a message that is neither request, response nor notification: "
                             f"{_preview(line)}")

    async def _handle_request(self, id: Any, method: str, params: Any) -> None:
        try:
            result = await self._on_request(method, params)
        except RpcError as exc:
            await self._answer(id, error=exc)
        except msgspec.ValidationError as exc:
            await self._answer(id, error=RpcError(INVALID_PARAMS, f"invalid params for {method}: {exc}"))
        except trio.Cancelled:
            raise
        except Exception as exc:
            log.exception("jsonrpc.request_handler_failed", method=method)
            await self._answer(id, error=RpcError(INTERNAL_ERROR, f"agentd failed to handle {method}: {exc}"))
        else:
            await self._answer(id, result)


def _chunk_reader(receive: trio.abc.ReceiveStream) -> Callable[[], Awaitable[bytes]]:
    """``receive``'s next chunk (b"" at EOF), one trio checkpoint each.

    A pipe (trio's FdStream, an agent's stdout) is waited on, then read: one
    scheduler pass a chunk. ``receive_some`` takes three (its checkpoint, a
    read that most often finds nothing, as agents write a line at a time, then
    the wait), and the reader checkpointed once more: 90 task steps of a
    41-line Gemini CLI turn became 25. The fd is asked of the stream each time
    (it is -1 once closed: EBADF, never another file's bytes).
    """
    if not isinstance(receive, trio.lowlevel.FdStream):
        return lambda: receive.receive_some(READ_BYTES)
    fileno = receive.fileno
    wait_readable = trio.lowlevel.wait_readable

    async def read() -> bytes:
        while True:
            fd = fileno()
            await wait_readable(fd)
            try:
                return os.read(fd, READ_BYTES)
            except BlockingIOError:  # readiness taken back (another reader of the pipe): wait again
                pass

    return read


def _preview(line: bytes, limit: int = 200) -> str:
    text = line.decode("utf-8", "replace").strip()
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


# --------------------------------------------------------------------------- the process


class AgentProcess:
    """One agent process with its connection; started by :meth:`start`, ended by :meth:`stop`.

    ``on_exit(reason)`` is called exactly once when the process ends or breaks
    the protocol without :meth:`stop` having been asked for, after every call in
    flight failed with :class:`ConnectionLost` carrying the same reason.
    """

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: str, label: str, state_dir: Path,
                 on_request: RequestHandler, on_notification: NotificationHandler,
                 on_exit: Callable[[str], None]) -> None:
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.label = label
        self.state_dir = state_dir
        self._on_request = on_request
        self._on_notification = on_notification
        self._on_exit = on_exit
        self.proc: trio.Process | None = None
        self.conn: Connection | None = None
        self.stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self.exit_reason = ""
        self._eof_reason = ""
        self._stopping = False
        self._ended = trio.Event()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and not self._ended.is_set() and not self._stopping

    async def start(self, nursery: trio.Nursery) -> None:
        """Spawn the process and start serving it in ``nursery``.

        Raises OSError when it cannot be started. Does not initialize. It runs
        under the keeper of :mod:`agentd.procs` (its own group, ended with agentd).
        """
        argv = procs.launch_argv(self.argv, state_dir=self.state_dir, what=self.label, path=self.env.get("PATH"))
        self.proc = await trio.lowlevel.open_process(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=self.cwd, env=self.env, start_new_session=True)
        assert self.proc.stdin is not None
        self.conn = Connection(self.proc.stdin, on_request=self._on_request,
                               on_notification=self._on_notification, label="agent")
        nursery.start_soon(self._supervise)

    async def request(self, method: str, params: Any, *, timeout: float = math.inf) -> Any:
        if self.conn is None:
            raise ConnectionLost("the agent was not started")
        return await self.conn.request(method, params, timeout=timeout)

    async def wait(self) -> None:
        """Until the process ended and was reaped."""
        await self._ended.wait()

    def stopping(self) -> None:
        """Mark the end as wanted (the owner is shutting down): no ``on_exit`` will be called."""
        self._stopping = True

    async def stop(self) -> None:
        """End the process: close its stdin, then SIGTERM, then SIGKILL its process group.

        Not cancellable; returns once it was reaped (at most about 2.5 s). Idempotent.
        """
        self._stopping = True
        if self.proc is None:
            return
        with trio.CancelScope(shield=True):
            await self._terminate()
            await self._ended.wait()

    def describe_exit(self) -> str:
        """Why the process ended, for a person: exit code or signal, and its last stderr line."""
        rc = self.proc.returncode if self.proc is not None else None
        if rc is None:
            what = "the agent process stopped"
        elif rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = str(-rc)
            what = f"the agent process was killed by {name}"
        else:
            what = f"the agent process exited with code {rc}"
        last = self.last_stderr()
        return f"{what}: {last}" if last else what

    def last_stderr(self, limit: int = 300) -> str:
        for line in reversed(self.stderr):
            line = line.strip()
            if line:
                return line[:limit]
        return ""

    def request_failure(self, name: str, what: str, exc: BaseException, timeout: float) -> BaseException:
        """The contract error for request ``what`` of runtime ``name`` that failed with ``exc``:
        RuntimeUnavailable for a timeout (with the last stderr line), a lost connection or an
        error answer; anything else (cancellation included) is returned as it is."""
        from ..contract import RuntimeUnavailable

        if isinstance(exc, trio.TooSlowError):
            tail = self.last_stderr()
            return RuntimeUnavailable(f"{name} did not answer {what} within {timeout:g} s"
                                      + (f" (stderr: {tail})" if tail else ""))
        if isinstance(exc, ConnectionLost):
            return RuntimeUnavailable(f"{name} failed during {what}: {self.exit_reason or exc.reason}")
        if isinstance(exc, RpcError):
            return RuntimeUnavailable(f"{name} refused {what}: {exc.describe()}")
        return exc

    async def _supervise(self) -> None:
        assert self.proc is not None and self.conn is not None
        proc, conn = self.proc, self.conn
        served = trio.Event()
        try:
            async with trio.open_nursery() as nursery:

                async def serve() -> None:
                    assert proc.stdout is not None
                    await conn.serve(proc.stdout)
                    served.set()
                    if not conn.violation:
                        # EOF on stdout: the process is most likely exiting; give it a moment to say how.
                        with trio.move_on_after(1.0):
                            await proc.wait()
                        if proc.returncode is None:
                            self._eof_reason = "the agent closed its output (it was stopped)"
                    # EOF or garbage on stdout: the agent is of no use any more.
                    await self._terminate()

                nursery.start_soon(serve)
                nursery.start_soon(self._pump_stderr)
                await proc.wait()
                # Let the reader take what the process wrote before it died.
                with trio.move_on_after(0.5):
                    await served.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._terminate()
                await proc.wait()
                for stream in (proc.stdin, proc.stdout, proc.stderr):
                    if stream is not None:
                        try:
                            await stream.aclose()
                        except Exception:
                            pass
                procs.ended(proc.pid, self.state_dir)  # leftovers of the group (tools, subprocesses)
            self.exit_reason = conn.violation or self._eof_reason or self.describe_exit()
            conn.close(self.exit_reason)
            self._ended.set()
            if not self._stopping:
                log.warning("jsonrpc.agent_exited", agent=self.label, reason=self.exit_reason)
                try:
                    self._on_exit(self.exit_reason)
                except Exception:
                    log.exception("jsonrpc.on_exit_failed", agent=self.label)

    async def _pump_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        partial = b""
        try:
            async for chunk in self.proc.stderr:
                partial += chunk
                *lines, partial = partial.split(b"\n")
                for raw in lines:
                    text = runtime_output.decode(raw).rstrip()[:2000]
                    self.stderr.append(text)
                    log.debug("jsonrpc.agent_stderr", agent=self.label, line=text)
                if len(partial) > 8192:
                    self.stderr.append(runtime_output.decode(partial)[:2000])
                    partial = b""
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        if partial.strip():
            self.stderr.append(runtime_output.decode(partial)[:2000])

    async def _terminate(self) -> None:
        """Close stdin, then SIGTERM, then SIGKILL the group, each after a grace period."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            try:
                await proc.stdin.aclose()
            except Exception:
                pass
        with trio.move_on_after(EOF_GRACE_S):
            await proc.wait()
        if proc.returncode is None:
            _killpg(proc.pid, signal.SIGTERM)
            with trio.move_on_after(TERM_GRACE_S):
                await proc.wait()
        if proc.returncode is None:
            procs.kill(proc.pid)
            with trio.move_on_after(KILL_WAIT_S):
                await proc.wait()
        if proc.returncode is None:
            _killpg(proc.pid, signal.SIGKILL)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
