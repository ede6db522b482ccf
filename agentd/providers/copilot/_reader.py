"""agentd's reader of the Copilot CLI's JSON-RPC frames, in place of the SDK's own.

The SDK's reader (``copilot._jsonrpc.JsonRpcClient._read_message``) reads a
``Content-Length`` frame of any size into memory and decodes it with
``bytes.decode("utf-8")`` and ``json.loads``: invalid UTF-8 raised in its read
thread, which ended the read loop and with it the connection to the CLI (every
session's turn failed), and a frame over agentd's ceiling was taken whole.
:class:`BoundedJsonRpcClient` overrides that method (and guards the SDK's
dispatch of a message), applying agentd.runtime_output's rules:

* a frame up to :data:`~agentd.runtime_output.MAX_MESSAGE_BYTES` is decoded by
  the odd-bytes rule (:func:`~agentd.runtime_output.decode_json`);
* a frame over it is drained in chunks, never held (its first
  :data:`HEAD_BYTES` are kept to tell what it was); a frame whose JSON stays
  broken, that is no JSON-RPC object, or that the SDK's dispatch cannot take
  is dropped too. Each is *refused*: a response to one of our requests fails
  that request with :class:`MessageRefused`; a request of the CLI is answered
  with an error; and ``on_refused(head, text)`` runs on the SDK's asyncio
  loop, in order with the session's events, so that the provider fails that
  session's running turn with the text (:func:`~agentd.runtime_output.too_big`'s
  for a frame over the ceiling), unless the frame is an event agentd drops
  unread (the CLI's ``model.*`` telemetry). The connection and the other
  sessions go on;
* only broken framing (a header that is not ``Content-Length``, the stream
  ending inside a frame) ends the connection, :attr:`BoundedJsonRpcClient.violation`
  saying why;
* the CLI's stderr is read by the same rule (its last STDERR_TAIL lines kept).

:class:`AgentdCopilotClient` is the SDK's ``CopilotClient`` with this reader
installed: the SDK builds its ``JsonRpcClient`` inside ``_connect_via_stdio``
and starts it at once, so the subclass catches the assignment to ``_client``
(a property) and puts the bounded reader in its place before it starts.

What the SDK does per frame and per event costs agentd's CPU, so the reader
also reads the CLI's pipes through a buffer (the SDK's read a frame's header a
byte per read(2)), drops the notifications nobody reads in its thread
(:class:`BoundedJsonRpcClient`'s ``unread``), hands the others to the loop a
burst at a time, and the session events' timestamps are parsed by
:func:`from_datetime` in place of ``dateutil.parser.parse``
(:func:`install_from_datetime`). All of this depends on the SDK's private
shape; :func:`check_sdk` verifies it (run before each CLI start) and refuses
to start on an SDK that changed it.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import io
import json
import re
import threading
from collections.abc import Callable
from datetime import datetime
from json.decoder import scanstring
from typing import Any

import msgspec
import structlog
from copilot import CopilotClient
from copilot import client as _sdk_client
from copilot._jsonrpc import JsonRpcClient, JsonRpcError
from copilot._jsonrpc import logger as _sdk_logger
from copilot.generated import session_events as _sdk_events

from ... import runtime_output

log = structlog.get_logger(__name__)

#: The github-copilot-sdk release whose private reader this module replaces (pinned in pyproject.toml).
SDK_VERSION = "1.0.27"
#: How much of a refused frame is kept to tell what it was (its id, method and sessionId come first).
HEAD_BYTES = 8 << 10
#: A frame this big or bigger is first told by its head (:func:`peek`): one nobody reads is
#: drained, never decoded (the CLI's model.messages_snapshot holds the session's whole context).
PEEK_BYTES = 64 << 10
#: The read buffer put on the CLI's unbuffered stdout and stderr.
STREAM_BUFFER = 64 << 10
#: Chunk size for draining a refused frame.
DRAIN_CHUNK = 1 << 20
#: A header line longer than this is broken framing.
HEADER_LINE_MAX = 8 << 10
#: stderr lines kept to explain an exit (the SDK kept every line for the CLI's life).
STDERR_TAIL = 40
#: JSON-RPC "invalid request": what a refused request of the CLI is answered with.
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603

#: on_refused(head, text): called on the SDK's asyncio loop
OnRefused = Callable[["FrameHead", str], None]
#: drop_event(event_type): whether a session event of that type (the CLI's type string) goes unread
DropEvent = Callable[[str], bool]
#: unread(method, event_type): whether a notification of the CLI goes undispatched (the read thread);
#: event_type is a session.event's ``params.event.type``, else ""
Unread = Callable[[str, str], bool]


class FrameHead(msgspec.Struct, frozen=True):
    """What the start of a frame tells: its top-level ``id`` and ``method``, ``params.sessionId``,
    and for a ``session.event`` its ``params.event.type``."""

    id: str | int | None = None
    method: str = ""
    session_id: str = ""
    event_type: str = ""


class MessageRefused(JsonRpcError):
    """The CLI's answer to a request was refused (over the ceiling, or broken JSON); the message says which."""

    def __init__(self, text: str) -> None:
        super().__init__(INTERNAL_ERROR, text)


class BoundedJsonRpcClient(JsonRpcClient):
    """The SDK's JSON-RPC client with agentd's reader (see the module docstring).

    ``on_refused`` and ``unread`` are set by :class:`AgentdCopilotClient` before :meth:`start`.
    A notification ``unread(method, event_type)`` says nobody reads is dropped in
    the read thread: the SDK never parses it (a ``SessionEvent``'s ``dateutil``
    timestamp parse alone is ~30 us) nor hops it to its asyncio loop. Most of a
    turn's events are of that kind (``assistant.streaming_delta``, the
    ``model.*`` telemetry). A frame of :data:`PEEK_BYTES` or more is told by
    its head, and one nobody reads is drained undecoded (so also one whose JSON
    breaks past its head: it is not refused). The notifications read in a row
    reach the loop in one callback (:meth:`_notify`), not one each.
    """

    def __init__(self, process: Any, on_refused: OnRefused | None = None, unread: Unread | None = None) -> None:
        super().__init__(process)
        self.on_refused = on_refused
        self.unread = unread
        #: why the framing broke (the connection then ended), for the runtime's exit reason
        self.violation = ""
        # The SDK starts the CLI with bufsize=0: a readline of its raw pipe is a read(2) per byte
        # (~25 for a frame's header).
        self._stdout = _buffered(getattr(process, "stdout", None))
        self._stderr = _buffered(getattr(process, "stderr", None))
        #: the notifications read whose run on the loop is scheduled (see _notify)
        self._burst: _Burst | None = None
        self._burst_lock = threading.Lock()

    def _read_message(self) -> dict[str, Any] | None:
        """The next usable message; refused frames are reported and skipped. None: the stream ended."""
        while True:
            length = self._read_header()
            if length is None:
                return None
            if length > runtime_output.MAX_MESSAGE_BYTES:
                head = self._drain(length)
                self._refuse(peek(head), runtime_output.too_big(length))
                continue
            if length >= PEEK_BYTES and self.unread is not None:
                start = self._read_exact(HEAD_BYTES)
                head = peek(start)
                if head.id is None and head.method and self.unread(head.method, head.event_type):
                    self._drain(length - HEAD_BYTES, frame=length)
                    continue
                data = start + self._read_exact(length - HEAD_BYTES, frame=length)
            else:
                data = self._read_exact(length)
            try:
                message = runtime_output.decode_json(data)  # odd bytes become U+FFFD
            except msgspec.DecodeError:
                message = None
            # the SDK's read loop takes a falsy message for the end of the stream, and a non-dict breaks it
            if isinstance(message, dict) and message:
                return message
            self._refuse(peek(data[:HEAD_BYTES]), f"the Copilot CLI sent a message that is not JSON-RPC: "
                                                   f"{_preview(data)}")

    def _handle_message(self, message: dict[str, Any]) -> None:
        unread = self.unread
        if unread is not None and "id" not in message:
            method = message.get("method")
            params = message.get("params")
            event = params.get("event") if isinstance(params, dict) else None
            kind = event.get("type") if isinstance(event, dict) else None
            if isinstance(method, str) and unread(method, kind if isinstance(kind, str) else ""):
                return
        if "id" not in message and self._loop is not None and self._burstable(message.get("method")):
            self._notify(message["method"], message.get("params", {}))
            return
        self._burst = None  # what the SDK schedules now comes after the open burst's notifications
        # A message the SDK's dispatch cannot take (say, an "error" that is no object) raised in
        # the read thread and ended the connection: it is refused like a frame that is no JSON-RPC.
        try:
            super()._handle_message(message)
        except Exception as exc:
            self._refuse(_head_of(message), f"the Copilot CLI sent a message the SDK cannot take "
                                            f"({type(exc).__name__}: {exc}): {_preview(json.dumps(message).encode())}")

    def _burstable(self, method: Any) -> bool:
        """Whether the SDK would hand notification ``method`` to its notification handler on the loop."""
        return (isinstance(method, str) and method != "$/cancelRequest" and self.notification_handler is not None
                and method not in self.notification_method_handlers)

    def _notify(self, method: str, params: Any) -> None:
        """Hand a notification to the loop as the SDK does (the read thread), one wake-up per burst.

        The SDK scheduled a loop callback for each (a write to the loop's self-pipe, and a pass of
        the loop); here it joins the burst whose run is scheduled and has not begun, else starts one.
        A burst is closed once anything else is scheduled from this thread (an answer, a refusal),
        so the loop still runs everything in the order read.
        """
        item = (self.notification_handler, method, params)
        with self._burst_lock:
            burst = self._burst
            if burst is not None and burst.open:
                burst.items.append(item)
                return
            burst = self._burst = _Burst(item)
        self._loop.call_soon_threadsafe(self._run_burst, burst)  # type: ignore[union-attr]

    def _run_burst(self, burst: _Burst) -> None:
        """Run a burst's notifications, in order (the loop); a handler's error is reported as the loop does."""
        with self._burst_lock:
            burst.open = False  # what is read from now on starts a burst of its own
            items = burst.items
        for handler, method, params in items:
            try:
                handler(method, params)
            except Exception as exc:
                self._loop.call_exception_handler(  # type: ignore[union-attr]
                    {"message": f"Exception in callback {handler!r}({method!r}, ...)", "exception": exc})

    def _stderr_loop(self) -> None:
        # The SDK's decoded each stderr line as strict UTF-8: one odd byte ended this loop, after
        # which nobody drained the pipe and the CLI blocked once it filled. Its lines were all kept.
        stderr = self._stderr
        try:
            while self._running and stderr:
                line = stderr.readline(HEADER_LINE_MAX)
                if not line:
                    break
                text = runtime_output.decode(line) if isinstance(line, bytes) else runtime_output.clean(line)
                _sdk_logger.warning("[CLI] %s", text.rstrip())
                with self._stderr_lock:
                    self._stderr_output.append(text)
                    del self._stderr_output[:-STDERR_TAIL]
        except Exception:
            log.debug("copilot.stderr_unreadable", exc_info=True)

    def _read_header(self) -> int | None:
        """The Content-Length of the next frame; None at EOF or broken framing (then :attr:`violation`)."""
        stdout = self._stdout
        length: int | None = None
        first = True
        while True:
            line = stdout.readline(HEADER_LINE_MAX)
            if not line:
                if not first:
                    self._broken("the stream ended inside a frame header")
                return None
            first = False
            text = line.decode("latin-1").strip()
            if not text:
                if length is None:
                    self._broken("a frame header without Content-Length")
                return length
            name, sep, value = text.partition(":")
            if not sep or not line.endswith(b"\n"):
                self._broken(f"not a frame header: {text[:200]!r}")
                return None
            if name.strip().lower() == "content-length":
                try:
                    length = int(value.strip())
                except ValueError:
                    length = -1
                if length < 0:
                    self._broken(f"a bad Content-Length: {value.strip()[:50]!r}")
                    return None

    def _drain(self, length: int, frame: int = 0) -> bytes:
        """Read and drop ``length`` bytes of a frame (of ``frame`` bytes in all, if more), keeping its
        first HEAD_BYTES; EOFError at a short stream."""
        stdout = self._stdout
        head = bytearray()
        left = length
        while left > 0:
            chunk = stdout.read(min(left, DRAIN_CHUNK))
            if not chunk:
                self._broken(f"the stream ended inside a frame of {max(frame, length):,} bytes")
                raise EOFError("the stream ended inside a frame")
            if len(head) < HEAD_BYTES:
                head += chunk[: HEAD_BYTES - len(head)]
            left -= len(chunk)
        return bytes(head)

    def _read_exact(self, num_bytes: int, frame: int = 0) -> bytes:
        data = self._stdout.read(num_bytes)  # a buffered read returns short only at the end
        if len(data) < num_bytes:
            self._broken(f"the stream ended inside a frame of {max(frame, num_bytes):,} bytes")
            raise EOFError("Unexpected end of stream while reading JSON-RPC message")
        return data

    def _broken(self, why: str) -> None:
        if not self.violation:
            self.violation = why
            log.warning("copilot.frame_broken", why=why)

    def _refuse(self, head: FrameHead, text: str) -> None:
        """Fail what the refused frame was: our request's wait, or the CLI's request; then tell its session."""
        self._burst = None  # the report comes after the notifications read before
        log.info("copilot.frame_refused", method=head.method, id=head.id, session=head.session_id,
                 event_type=head.event_type, why=text)
        if head.id is not None and not head.method:
            with self._pending_lock:
                future = self.pending_requests.get(head.id)  # type: ignore[call-overload]
                self._pending_inline_callbacks.pop(head.id, None)  # type: ignore[call-overload]
            if future is not None:
                future.get_loop().call_soon_threadsafe(_fail, future, MessageRefused(text))
        elif head.id is not None and self._loop is not None:  # the CLI waits for an answer
            asyncio.run_coroutine_threadsafe(self._send_error_response(head.id, INVALID_REQUEST, text, None), self._loop)
        if self.on_refused is not None and self._loop is not None:
            # on the loop the session events are dispatched on, so it comes in order with them
            self._loop.call_soon_threadsafe(self._report, head, text)

    def _report(self, head: FrameHead, text: str) -> None:
        try:
            if self.on_refused is not None:
                self.on_refused(head, text)
        except Exception:
            log.exception("copilot.on_refused_failed")


class _Burst:
    """Notifications read in a row, run by one loop callback: (handler, method, params) each."""

    __slots__ = ("items", "open")

    def __init__(self, first: tuple[Any, str, Any]) -> None:
        self.items = [first]
        #: False once its run began: nothing more joins it
        self.open = True


def _buffered(stream: Any) -> Any:
    """``stream`` with a read buffer when it is a raw (unbuffered) file, else itself."""
    if isinstance(stream, io.RawIOBase):
        return io.BufferedReader(stream, STREAM_BUFFER)
    return stream


def _head_of(message: dict[str, Any]) -> FrameHead:
    """The FrameHead of a decoded message (what :func:`peek` finds in its bytes)."""
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    event = params.get("event")
    found = {"method": message.get("method"), "session_id": params.get("sessionId"),
             "event_type": event.get("type") if isinstance(event, dict) else None}
    rid = message.get("id")
    return FrameHead(id=rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None,
                     **{k: v for k, v in found.items() if isinstance(v, str)})


def _fail(future: Any, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _preview(data: bytes, limit: int = 200) -> str:
    text = runtime_output.decode(data[: limit * 4]).strip()
    return repr(text[:limit] + ("..." if len(text) > limit or len(data) > limit * 4 else ""))


class AgentdCopilotClient(CopilotClient):
    """``CopilotClient`` whose JSON-RPC connection reads with :class:`BoundedJsonRpcClient`.

    ``on_refused(head, text)`` is called on the SDK's asyncio loop for each
    refused frame (:class:`FrameHead`: what its start names, "" for what it does not);
    ``drop_event(event_type)`` (the SDK's read thread) says which session events go
    unread (see :class:`BoundedJsonRpcClient`); lifecycle events go unread while
    nobody listens to them (agentd does not).
    """

    def __init__(self, *args: Any, on_refused: OnRefused | None = None, drop_event: DropEvent | None = None,
                 **kwargs: Any) -> None:
        install_from_datetime()
        self._agentd_on_refused = on_refused
        self._agentd_drop_event = drop_event
        super().__init__(*args, **kwargs)

    @property
    def _client(self) -> JsonRpcClient | None:  # type: ignore[override]
        return self.__dict__.get("_agentd_rpc")

    @_client.setter
    def _client(self, value: JsonRpcClient | None) -> None:
        # The SDK assigns a JsonRpcClient it just built (not started yet): ours takes its place.
        if value is not None and not isinstance(value, BoundedJsonRpcClient):
            value = BoundedJsonRpcClient(value.process, self.__dict__.get("_agentd_on_refused"), self._unread)
        self.__dict__["_agentd_rpc"] = value

    def _unread(self, method: str, event_type: str) -> bool:
        """Whether the CLI's notification ``method`` goes undispatched (the read thread): a session
        event whose type ``drop_event`` names, a lifecycle event while no handler listens."""
        if method == "session.event":
            drop = self._agentd_drop_event
            return drop is not None and bool(event_type) and drop(event_type)
        if method == "session.lifecycle":
            return not (self._lifecycle_handlers or any(self._typed_lifecycle_handlers.values()))
        return False


#: The times the CLI sends (JavaScript's toISOString; an offset allowed): the shape fromisoformat
#: reads as dateutil does (the same instant, offset and fields).
_ISO_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?(?:Z|[+-][0-9]{2}:[0-9]{2})")
_sdk_from_datetime = _sdk_events.from_datetime


def from_datetime(x: Any) -> datetime:
    """The SDK's ``from_datetime`` (``dateutil.parser.parse``, ~30 us), in ~1 us for the CLI's times.

    A string of the CLI's shape (``2026-12-02T20:29:09.123Z``) is read by
    ``datetime.fromisoformat``: the same instant, offset and fields as the SDK's
    (the tzinfo is ``timezone.utc`` or a fixed ``timezone``, not dateutil's
    ``tzlocal``/``tzutc``/``tzoffset``). Anything else, and a string of that
    shape that is no valid time, is parsed, or refused, by the SDK's own.
    """
    if isinstance(x, str) and _ISO_TIME.fullmatch(x):
        try:
            return datetime.fromisoformat(x)
        except ValueError:
            pass  # say Feb 30: the SDK's parse raises its own error
    return _sdk_from_datetime(x)


def install_from_datetime() -> None:
    """Have the SDK's session events parse their times with :func:`from_datetime` (idempotent)."""
    _sdk_events.from_datetime = from_datetime


class SdkChanged(RuntimeError):
    """The installed github-copilot-sdk no longer has the shape agentd's reader relies on."""


def check_sdk() -> None:
    """Raise :class:`SdkChanged` when the SDK's private shape that this module relies on changed.

    The release is pinned (:data:`SDK_VERSION`); another release is accepted
    only while every hook below is still there as in that one.
    """
    try:
        installed = importlib.metadata.version("github-copilot-sdk")
    except importlib.metadata.PackageNotFoundError:
        installed = "?"
    problems: list[str] = []
    if list(inspect.signature(JsonRpcClient.__init__).parameters) != ["self", "process"]:
        problems.append("JsonRpcClient(process) takes other arguments")
    for name in ("_read_message", "_read_loop", "_send_error_response", "_handle_message",
                 "_stderr_loop", "get_stderr_output"):
        if not callable(getattr(JsonRpcClient, name, None)):
            problems.append(f"JsonRpcClient.{name} is gone")
    if "_client" in vars(CopilotClient):
        problems.append("CopilotClient defines _client itself")
    if getattr(_sdk_client, "JsonRpcClient", None) is not JsonRpcClient:
        problems.append("copilot.client no longer builds copilot._jsonrpc.JsonRpcClient")
    probe = JsonRpcClient(None)
    for attr in ("pending_requests", "_pending_inline_callbacks", "_pending_lock", "_loop", "_running",
                 "_stderr_output", "_stderr_lock", "notification_handler", "notification_method_handlers"):
        if not hasattr(probe, attr):
            problems.append(f"JsonRpcClient has no {attr}")
    for owner, fn, needle in ((JsonRpcClient, "_read_loop", "self._read_message()"),
                              (JsonRpcClient, "start", "target=self._stderr_loop"),
                              (JsonRpcClient, "_handle_message",
                               "self._loop.call_soon_threadsafe(self.notification_handler, method, params)"),
                              (CopilotClient, "_connect_via_stdio", "self._client = JsonRpcClient(self._process)"),
                              (CopilotClient, "_connect_via_stdio", 'event_dict = params["event"]'),
                              (CopilotClient, "_connect_via_stdio", "self._dispatch_lifecycle_event(lifecycle_event)"),
                              (CopilotClient, "_dispatch_lifecycle_event", "self._typed_lifecycle_handlers.get("),
                              (CopilotClient, "_dispatch_lifecycle_event", "list(self._lifecycle_handlers)")):
        try:
            source = inspect.getsource(getattr(owner, fn))
        except (OSError, TypeError, AttributeError):
            if installed != SDK_VERSION:
                problems.append(f"{owner.__name__}.{fn}'s source cannot be read to check it")
            continue
        if needle not in source:
            problems.append(f"{owner.__name__}.{fn} no longer does {needle!r}")
    if _sdk_events.from_datetime not in (_sdk_from_datetime, from_datetime):
        problems.append("copilot.generated.session_events.from_datetime is no longer the SDK's own")
    try:
        if "dateutil.parser.parse(" not in inspect.getsource(_sdk_from_datetime):
            problems.append("copilot.generated.session_events.from_datetime no longer parses with dateutil")
        if "from_datetime(obj.get(\"timestamp\"))" not in inspect.getsource(_sdk_events.SessionEvent.from_dict):
            problems.append("SessionEvent.from_dict no longer parses its timestamp with from_datetime")
    except (OSError, TypeError):
        if installed != SDK_VERSION:
            problems.append("copilot.generated.session_events' source cannot be read to check it")
    if problems:
        raise SdkChanged(
            f"github-copilot-sdk {installed} changed what agentd's Copilot reader relies on "
            f"(agentd is built for {SDK_VERSION}): " + "; ".join(problems))
    if installed != SDK_VERSION:
        log.warning("copilot.sdk_version", installed=installed, expected=SDK_VERSION,
                    note="the JSON-RPC reader hooks agentd relies on are still there")


# --------------------------------------------------------------------------- the head of a frame

_WS = re.compile(r"[ \t\n\r]*")
_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null")
_STRUCTURAL = re.compile(r'["{}\[\]]')


class _Cut(Exception):
    """The head ends (or breaks) before what is looked for."""


def peek(head: bytes) -> FrameHead:
    """The top-level ``id`` and ``method`` and the ``params.sessionId`` found in the start of a JSON-RPC frame.

    ``head`` may be cut anywhere (and hold odd bytes); what lies past the cut is
    simply not found. Never raises.
    """
    s = runtime_output.decode(head)
    found: dict[str, Any] = {}

    def event(key: str, i: int) -> int:
        return _take(s, i, found, "event_type") if key == "type" else _skip(s, i)

    def params(key: str, i: int) -> int:
        if key == "sessionId":
            return _take(s, i, found, "session_id")
        if key == "event" and s[i:i + 1] == "{":
            return _object(s, i, event)
        return _skip(s, i)

    def top(key: str, i: int) -> int:
        if key == "params" and s[i:i + 1] == "{":
            return _object(s, i, params)
        if key == "id":
            return _take(s, i, found, "id")
        if key == "method":
            return _take(s, i, found, "method")
        return _skip(s, i)

    try:
        i = _WS.match(s, 0).end()  # type: ignore[union-attr]
        if s[i:i + 1] == "{":
            _object(s, i, top)
    except _Cut:
        pass
    rid = found.get("id")
    return FrameHead(id=rid if isinstance(rid, (str, int)) and not isinstance(rid, bool) else None,
                     **{k: v for k in ("method", "session_id", "event_type") if isinstance(v := found.get(k), str)})


def _object(s: str, i: int, member: Callable[[str, int], int]) -> int:
    """Walk the object at ``s[i] == "{"``, calling ``member(key, value_start)`` (it returns the value's end)."""
    i += 1
    while True:
        i = _WS.match(s, i).end()  # type: ignore[union-attr]
        c = s[i:i + 1]
        if c == "}":
            return i + 1
        if c == ",":
            i += 1
            continue
        if c != '"':
            raise _Cut
        key, i = _string(s, i)
        i = _WS.match(s, i).end()  # type: ignore[union-attr]
        if s[i:i + 1] != ":":
            raise _Cut
        i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]
        i = member(key, i)


def _string(s: str, i: int) -> tuple[str, int]:
    try:
        return scanstring(s, i + 1)
    except (ValueError, IndexError):
        raise _Cut from None


def _take(s: str, i: int, found: dict[str, Any], name: str) -> int:
    """Read the scalar value at ``i`` into ``found[name]``; a container is skipped."""
    if s[i:i + 1] == '"':
        found[name], end = _string(s, i)
        return end
    m = _SCALAR.match(s, i)
    if m is not None and m.end() < len(s):  # a number cut by the head's end is not taken
        found[name] = json.loads(m.group())
        return m.end()
    return _skip(s, i)


def _skip(s: str, i: int) -> int:
    """The end of the JSON value at ``i``."""
    c = s[i:i + 1]
    if c == '"':
        return _string(s, i)[1]
    if c not in ("{", "["):
        m = _SCALAR.match(s, i)
        if m is None or m.end() >= len(s):
            raise _Cut
        return m.end()
    depth = 0
    while True:
        m = _STRUCTURAL.search(s, i)
        if m is None:
            raise _Cut
        c, i = m.group(), m.start()
        if c == '"':
            i = _string(s, i)[1]
            continue
        depth += 1 if c in "{[" else -1
        i += 1
        if depth == 0:
            return i
