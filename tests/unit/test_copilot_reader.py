"""agentd's reader of the Copilot CLI's JSON-RPC frames (agentd.providers.copilot._reader), on a real pipe.

The SDK's own reader took a frame of any size whole and raised on invalid
UTF-8, which ended the connection. Here the frames go through an OS pipe to
the SDK's read thread running agentd's reader, as the CLI's stdout would: an
over-ceiling frame is drained without being held and reported with its size;
a frame with invalid UTF-8 is decoded with U+FFFD; and the frame after each is
still read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as _dt
import io
import json
import os
import threading
import tracemalloc
from collections.abc import Iterator
from typing import Any

import dateutil.parser
import pytest
from copilot import RuntimeConnection
from copilot.generated import session_events as se
from hypothesis import given, settings
from hypothesis import strategies as st
from copilot._jsonrpc import JsonRpcClient
from copilot.generated.session_events import SessionEventType as T

from agentd import runtime_output
from agentd.providers.copilot import _reader
from agentd.providers.copilot import _mapping as m
from agentd.providers.copilot._conversation import _MCP_EVENTS, unread_event_type
from agentd.providers.copilot._reader import AgentdCopilotClient, BoundedJsonRpcClient, MessageRefused, peek

CEILING = runtime_output.MAX_MESSAGE_BYTES


class _Process:
    """What JsonRpcClient needs of a process: stdout to read, stdin to write its answers to.

    Unbuffered, as the SDK's ``Popen(bufsize=0)`` gives them."""

    def __init__(self, stdout: io.RawIOBase | io.BufferedReader, stderr: io.RawIOBase | None = None) -> None:
        self.stdout = stdout
        self.stdin = io.BytesIO()
        self.stderr = stderr


def _frame(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _event(session: str, text: str, kind: str = "assistant.message") -> bytes:
    return json.dumps({"jsonrpc": "2.0", "method": "session.event",
                       "params": {"sessionId": session, "event": {"type": kind, "data": {"content": text}}}},
                      separators=(",", ":")).encode()


def _big_frame(prefix: bytes, size: int) -> Iterator[bytes]:
    """A frame of ``size`` bytes of body, ``prefix`` then a JSON string of x's, in 1 MiB pieces (never whole here)."""
    tail = b'"}}}}'
    yield b"Content-Length: %d\r\n\r\n" % size
    yield prefix
    left = size - len(prefix) - len(tail)
    piece = b"x" * (1 << 20)
    while left > 0:
        n = min(left, len(piece))
        yield piece if n == len(piece) else piece[:n]
        left -= n
    yield tail


class _CountingPipe(io.FileIO):
    """The read end of an OS pipe, unbuffered, counting the read(2) calls made on it."""

    def __init__(self, fd: int) -> None:
        super().__init__(fd, "rb")
        self.reads = 0

    def readinto(self, buffer: Any) -> int | None:
        self.reads += 1
        return super().readinto(buffer)

    def read(self, size: int = -1) -> bytes | None:
        self.reads += 1
        return super().read(size)


class _Reader:
    """A BoundedJsonRpcClient started on a pipe with an asyncio loop; records what it dispatched."""

    def __init__(self, client_class: type[JsonRpcClient] = BoundedJsonRpcClient, *, stderr: bool = False) -> None:
        r, self._w = os.pipe()
        self.err_w = -1
        err = None
        if stderr:
            er, self.err_w = os.pipe()
            err = open(er, "rb", buffering=0)
        self.process = _Process(_CountingPipe(r), err)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.got: list[tuple[str, Any]] = []
        self.refused: list[tuple[str, str]] = []
        self.closed = threading.Event()
        self.event = threading.Event()
        self.client = client_class(self.process)
        self.client.set_notification_handler(self._note)
        self.client.on_close = self.closed.set
        if isinstance(self.client, BoundedJsonRpcClient):
            self.client.on_refused = lambda head, text: (self.refused.append((head.session_id, text)), self.event.set())
        self.client.start(self.loop)

    def _note(self, method: str, params: Any) -> None:
        self.got.append((method, params))
        self.event.set()

    def write(self, *parts: bytes) -> None:
        for part in parts:
            view = memoryview(part)
            while view:
                view = view[os.write(self._w, view):]

    def wait(self, count: int, timeout: float = 30.0) -> None:
        """Until ``count`` notifications and refusals in all came."""
        for _ in range(int(timeout * 20)):
            if len(self.got) + len(self.refused) >= count:
                return
            self.event.wait(0.05)
            self.event.clear()
        raise AssertionError(f"only {self.got!r} and {self.refused!r} came")

    def ask(self, method: str, params: Any) -> tuple[concurrent.futures.Future[Any], str]:
        """The client's request ``method`` sent from the loop: its answer to come, and its id once pending."""
        async def ask() -> Any:
            return await self.client.request(method, params)

        pending = asyncio.run_coroutine_threadsafe(ask(), self.loop)
        for _ in range(100):
            if self.client.pending_requests:
                break
            threading.Event().wait(0.02)
        (rid,) = self.client.pending_requests
        return pending, rid

    def close(self) -> None:
        os.close(self._w)
        self.closed.wait(5)
        self.client._running = False
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
        self.process.stdout.close()
        if self.err_w >= 0:
            os.close(self.err_w)
            self.process.stderr.close()


@pytest.fixture
def reader() -> Iterator[_Reader]:
    r = _Reader()
    try:
        yield r
    finally:
        r.close()


def test_an_over_ceiling_frame_is_drained_unheld_and_reported_with_its_size_and_the_next_frame_is_read(reader: _Reader) -> None:
    size = CEILING + (3 << 20)
    prefix = b'{"jsonrpc":"2.0","method":"session.event","params":{"sessionId":"s-big","event":{"type":"assistant.message","data":{"content":"'
    tracemalloc.start()
    try:
        writer = threading.Thread(target=lambda: [reader.write(p) for p in _big_frame(prefix, size)])
        writer.start()
        writer.join(60)
        reader.write(_frame(_event("s-big", "after")))
        reader.wait(2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reader.refused == [("s-big", runtime_output.too_big(size))]
    assert f"{size:,} bytes" in reader.refused[0][1] and f"{CEILING:,}" in reader.refused[0][1]
    assert reader.got == [("session.event", json.loads(_event("s-big", "after"))["params"])]
    assert peak < 16 << 20, f"the reader held {peak:,} bytes for a frame of {size:,}"
    assert not reader.closed.is_set()


def test_a_frame_with_invalid_utf8_is_decoded_with_u_fffd_and_the_next_frame_is_read(reader: _Reader) -> None:
    body = _event("s1", "odd TEXT here").replace(b"TEXT", b"\xff\xfe \xed\xa0\x80 ok \\ud800")
    reader.write(_frame(body), _frame(_event("s1", "after")))
    reader.wait(2)
    assert [p["event"]["data"]["content"] for _, p in reader.got] == ["odd \ufffd\ufffd \ufffd\ufffd\ufffd ok \ufffd here", "after"]
    assert reader.refused == []
    assert not reader.closed.is_set()


def _agentd_client() -> AgentdCopilotClient:
    # a path given: the SDK never looks for (or downloads) a CLI; nothing is started here
    return AgentdCopilotClient(connection=RuntimeConnection.for_stdio(path="/bin/true"), drop_event=unread_event_type)


def test_events_agentd_drops_unseen_never_reach_the_sdk_and_every_other_message_comes_in_order(reader: _Reader) -> None:
    reader.client.unread = _agentd_client()._unread  # as AgentdCopilotClient sets it (read per message)
    sent = [("assistant.message", "1"), ("assistant.streaming_delta", "x"), ("model.log", "x"),
            ("assistant.message_delta", "2"), ("session.mcp_servers_loaded", "3"), ("pending_messages.modified", "x"),
            ("assistant.idle", "x"), ("session.idle", "4"), ("some.future_type", "5"), ("model.messages_snapshot", "x")]
    reader.write(*(_frame(_event("s1", text, kind)) for kind, text in sent))
    other = {"jsonrpc": "2.0", "method": "session.other", "params": {"type": "assistant.streaming_delta"}}
    reader.write(_frame(json.dumps(other).encode()), _frame(_event("s1", "last")))  # the read is in order: all before came
    reader.wait(7)
    got = [(p["event"]["type"], p["event"]["data"]["content"]) if method == "session.event" else (method, "")
           for method, p in reader.got]
    assert got == [("assistant.message", "1"), ("assistant.message_delta", "2"), ("session.mcp_servers_loaded", "3"),
                   ("session.idle", "4"), ("some.future_type", "5"), ("session.other", ""), ("assistant.message", "last")]
    assert reader.refused == []


def test_a_big_frame_nobody_reads_is_drained_by_its_head_unheld_and_a_big_one_read_is_read_whole(reader: _Reader) -> None:
    reader.client.unread = _agentd_client()._unread
    size = 24 << 20
    assert size < CEILING
    snapshot = b'{"jsonrpc":"2.0","method":"session.event","params":{"sessionId":"s1","event":{"type":"model.messages_snapshot","data":{"m":"'
    broken = b'{"jsonrpc":"2.0","method":"session.event","params":{"sessionId":"s1","event":{"type":"assistant.streaming_delta","data":{"m":"'
    late = {"jsonrpc": "2.0", "method": "session.event",  # its type past the head: told once decoded
            "params": {"sessionId": "s1", "event": {"data": {"m": "y" * (1 << 20)}, "type": "assistant.streaming_delta"}}}
    kept = _event("s1", "z" * (256 << 10))
    assert len(kept) >= _reader.PEEK_BYTES  # told by its head too
    tracemalloc.start()
    try:
        writer = threading.Thread(target=lambda: [reader.write(p) for p in _big_frame(snapshot, size)])
        writer.start()
        writer.join(60)
        _, peak = tracemalloc.get_traced_memory()
        body = b"".join(_big_frame(broken, 1 << 20)).split(b"\r\n\r\n", 1)[1][:-3]  # its JSON ends too soon
        reader.write(_frame(body), _frame(json.dumps(late).encode()), _frame(kept), _frame(_event("s1", "after")))
        reader.wait(2)
    finally:
        tracemalloc.stop()
    assert [p["event"]["data"]["content"] for _, p in reader.got] == ["z" * (256 << 10), "after"]
    assert reader.refused == []
    assert peak < 8 << 20, f"the reader held {peak:,} bytes for a frame of {size:,} nobody reads"


def test_lifecycle_events_are_read_only_while_a_handler_listens(reader: _Reader) -> None:
    client = _agentd_client()
    reader.client.unread = client._unread
    lifecycle = {"jsonrpc": "2.0", "method": "session.lifecycle", "params": {"type": "session.updated", "sessionId": "s1"}}
    reader.write(_frame(json.dumps(lifecycle).encode()), _frame(_event("s1", "1")))
    reader.wait(1)
    unsubscribe = client.on_lifecycle(lambda event: None)
    reader.write(_frame(json.dumps(lifecycle).encode()), _frame(_event("s1", "2")))
    reader.wait(3)
    unsubscribe()
    client.on_lifecycle("session.deleted", lambda event: None)
    reader.write(_frame(json.dumps(lifecycle).encode()), _frame(_event("s1", "3")))
    reader.wait(5)
    assert [method for method, _ in reader.got] == ["session.event", "session.lifecycle", "session.event",
                                                    "session.lifecycle", "session.event"]


def test_the_event_types_left_unread_are_the_inert_ones_but_the_mcp_events() -> None:
    for t in T:
        assert unread_event_type(t.value) == (t in m.INERT and t not in _MCP_EVENTS), t
    assert unread_event_type("model.turn_started") and unread_event_type("model.messages_snapshot")
    assert not unread_event_type("some.future_type") and not unread_event_type("")


def test_a_burst_of_frames_is_read_in_few_reads_of_the_pipe_and_a_lone_frame_is_not_held_back(reader: _Reader) -> None:
    reader.write(_frame(_event("s1", "first")))
    reader.wait(1)  # read at once: the buffer does not wait to be filled
    pipe = reader.process.stdout
    before = pipe.reads
    reader.write(b"".join(_frame(_event("s1", str(i))) for i in range(100)))
    reader.wait(101)
    assert [p["event"]["data"]["content"] for _, p in reader.got] == ["first"] + [str(i) for i in range(100)]
    # the SDK's reader: one read(2) per byte of each header, ~2,500 here
    assert pipe.reads - before < 50, f"{pipe.reads - before} reads of the pipe for 100 frames"
    reader.write(_frame(_event("s1", "split"))[:7])
    threading.Event().wait(0.1)
    reader.write(_frame(_event("s1", "split"))[7:])
    reader.wait(102)
    assert reader.got[-1][1]["event"]["data"]["content"] == "split"


def _method(text: str) -> bytes:
    """A notification the SDK hands to a method handler (not to the notification handler): it ends a burst."""
    return json.dumps({"jsonrpc": "2.0", "method": "test.method", "params": {"text": text}}).encode()


class _Recorder:
    """What the reader hands the loop, in the order the loop runs it; the read thread's progress."""

    def __init__(self, reader: _Reader) -> None:
        self.order: list[str] = []
        self.changed = threading.Event()
        self.read: list[str] = []  # each notification's method or text, as the read thread sees it
        self.bursts: list[int] = []
        self.hold = threading.Event()
        self.hold.set()
        self.held = threading.Event()
        client = reader.client
        client.set_notification_handler(self._note)
        client.set_notification_method_handler("test.method", lambda params: self._add("m:" + params["text"]))
        client.on_refused = lambda head, text: self._add("refused")
        client.unread = self._spy
        run = client._run_burst
        client._run_burst = lambda burst: (self.bursts.append(len(burst.items)), run(burst))  # type: ignore[method-assign]

    def _spy(self, method: str, event_type: str) -> bool:
        self.read.append(method)
        return False

    def _note(self, method: str, params: Any) -> None:
        text = params["event"]["data"]["content"] if method == "session.event" else method
        if text == "hold":
            self.held.set()
            self.hold.wait(10)
        if text == "raise":
            raise RuntimeError("a handler's error")
        self._add(text)

    def _add(self, what: str) -> None:
        self.order.append(what)
        self.changed.set()

    def until(self, count: int, timeout: float = 10.0) -> list[str]:
        for _ in range(int(timeout * 20)):
            if len(self.order) >= count:
                break
            self.changed.wait(0.05)
            self.changed.clear()
        return self.order

    def until_read(self, count: int) -> None:
        for _ in range(200):
            if len(self.read) >= count:
                return
            threading.Event().wait(0.01)
        raise AssertionError(f"the reader read only {self.read}")


def test_notifications_read_in_a_row_run_in_one_loop_callback_in_order_with_what_comes_between(reader: _Reader) -> None:
    rec = _Recorder(reader)
    gate = threading.Event()
    reader.loop.call_soon_threadsafe(gate.wait, 10)  # the loop is busy while all of it is read
    reader.write(_frame(_event("s", "e1")), _frame(_event("s", "e2")), _frame(_method("1")),
                 _frame(_event("s", "e3")), _frame(b'{"broken'), _frame(_event("s", "e4")), _frame(_event("s", "e5")),
                 _frame(_method("2")))
    rec.until_read(7)  # all of it read (the refused one never reaches the spy)
    gate.set()
    assert rec.until(8) == ["e1", "e2", "m:1", "e3", "refused", "e4", "e5", "m:2"]
    assert rec.bursts == [2, 1, 2]  # one loop callback per burst: an answer or a refusal ends one


def test_a_notification_read_while_a_burst_runs_is_run_without_waiting_for_another(reader: _Reader) -> None:
    rec = _Recorder(reader)
    rec.hold.clear()
    reader.write(_frame(_event("s", "hold")))
    assert rec.held.wait(10)  # its burst runs (and waits): what is read now cannot join it
    reader.write(_frame(_event("s", "next")), _frame(_method("end")))
    rec.until_read(3)
    rec.hold.set()
    assert rec.until(3) == ["hold", "next", "m:end"]
    assert rec.bursts == [1, 1]


def test_a_handlers_error_is_reported_as_the_loop_reports_it_and_the_rest_of_its_burst_runs(reader: _Reader) -> None:
    rec = _Recorder(reader)
    errors: list[BaseException] = []
    reader.loop.set_exception_handler(lambda loop, context: errors.append(context["exception"]))
    gate = threading.Event()
    reader.loop.call_soon_threadsafe(gate.wait, 10)
    reader.write(_frame(_event("s", "raise")), _frame(_event("s", "after")), _frame(_method("end")))
    rec.until_read(3)
    gate.set()
    assert rec.until(2) == ["after", "m:end"]
    assert rec.bursts == [2]
    assert [str(e) for e in errors] == ["a handler's error"]


def test_the_sdks_own_reader_loses_the_connection_on_invalid_utf8() -> None:
    """Why agentd's reader exists: the SDK's ends its read loop (and the connection) at the first odd byte."""
    r = _Reader(JsonRpcClient)
    try:
        r.write(_frame(_event("s1", "odd TEXT").replace(b"TEXT", b"\xff")), _frame(_event("s1", "after")))
        assert r.closed.wait(10), "the SDK's reader went on"
        assert all(p["event"]["data"]["content"] != "after" for _, p in r.got)
    finally:
        r.close()


def test_broken_json_in_a_whole_frame_is_refused_for_its_session_and_the_next_frame_is_read(reader: _Reader) -> None:
    reader.write(_frame(b'{"jsonrpc":"2.0","method":"session.event","params":{"sessionId":"s2","event":{'),
                 _frame(b"[]"), _frame(_event("s2", "after")))
    reader.wait(3)
    assert [sid for sid, _ in reader.refused] == ["s2", ""]
    assert "not JSON-RPC" in reader.refused[0][1]
    assert [p["event"]["data"]["content"] for _, p in reader.got] == ["after"]


def test_an_over_ceiling_answer_fails_the_request_waiting_for_it_and_the_connection_goes_on(reader: _Reader) -> None:
    pending, rid = reader.ask("session.getMessages", {"sessionId": "s3"})
    size = CEILING + 1
    prefix = b'{"jsonrpc":"2.0","id":"%s","result":{"events":["' % rid.encode()
    for part in _big_frame(prefix, size):
        reader.write(part)
    with pytest.raises(MessageRefused) as refused:
        pending.result(30)
    assert refused.value.message == runtime_output.too_big(size)
    reader.write(_frame(_event("s3", "after")))
    reader.wait(2)
    assert reader.got[-1][1]["event"]["data"]["content"] == "after"


def test_an_over_ceiling_request_of_the_cli_is_answered_with_an_error(reader: _Reader) -> None:
    size = CEILING + 10
    prefix = b'{"jsonrpc":"2.0","id":7,"method":"userInput.request","params":{"sessionId":"s4","question":"'
    for part in _big_frame(prefix, size):
        reader.write(part)
    reader.wait(1)
    assert reader.refused == [("s4", runtime_output.too_big(size))]
    for _ in range(100):
        if reader.process.stdin.getvalue():
            break
        threading.Event().wait(0.02)
    header, _, body = reader.process.stdin.getvalue().partition(b"\r\n\r\n")
    answer = json.loads(body)
    assert answer["id"] == 7 and answer["error"]["message"] == runtime_output.too_big(size)


def test_broken_framing_ends_the_connection_and_says_why(reader: _Reader) -> None:
    reader.write(_frame(_event("s5", "before")), b"garbage\r\n")
    assert reader.closed.wait(10)
    assert reader.client.violation == "not a frame header: 'garbage'"
    reader.wait(1)  # dispatched on the loop thread, which may run it after the read thread closed
    assert [p["event"]["data"]["content"] for _, p in reader.got] == ["before"]


def test_the_head_of_a_frame_names_its_id_method_and_session_even_cut_anywhere() -> None:
    whole = b'{"jsonrpc":"2.0","id":12,"method":"tool.call","params":{"x":{"sessionId":"no","s":"}"},"sessionId":"s\\u00e9","more":1}}'
    assert peek(whole) == _reader.FrameHead(id=12, method="tool.call", session_id="s\u00e9")
    event = b'{"jsonrpc":"2.0","method":"session.event","params":{"sessionId":"s1","event":{"id":"e","type":"model.messages_snapshot","data":{"m'
    assert peek(event) == _reader.FrameHead(method="session.event", session_id="s1", event_type="model.messages_snapshot")
    for cut in range(len(whole)):
        head = peek(whole[:cut])  # never raises; what it names is right
        assert head.id in (None, 12) and head.method in ("", "tool.call") and head.session_id in ("", "s\u00e9")
    assert peek(b'{"id":"a","result":{"sessionId":"not-params"}}') == _reader.FrameHead(id="a")
    assert peek(b"\xff\xfe{") == _reader.FrameHead()


def test_the_copilot_client_reads_with_agentds_reader_and_the_sdk_shape_is_checked() -> None:
    _reader.check_sdk()  # the installed SDK has every hook the reader relies on
    seen: list[tuple[_reader.FrameHead, str]] = []
    # a path given: the SDK never looks for (or downloads) a CLI; nothing is started here
    client = AgentdCopilotClient(connection=RuntimeConnection.for_stdio(path="/bin/true"),
                                 on_refused=lambda head, text: seen.append((head, text)), drop_event=unread_event_type)
    assert client._client is None
    client._client = JsonRpcClient(_Process(io.BufferedReader(io.BytesIO(b""))))  # as _connect_via_stdio does
    assert isinstance(client._client, BoundedJsonRpcClient)
    assert client._client.unread == client._unread
    assert client._unread("session.event", "assistant.streaming_delta")
    assert not client._unread("session.event", "session.idle") and not client._unread("session.event", "")
    client._client.on_refused(_reader.FrameHead(session_id="s"), "t")  # type: ignore[misc]
    assert seen == [(_reader.FrameHead(session_id="s"), "t")]
    client._client = None
    assert client._client is None


def test_a_streamed_message_past_the_ceiling_keeps_its_start_and_says_how_much_was_cut() -> None:
    """Its whole message (the CLI's assistant.message) is refused, so the streamed deltas are all there is:
    they are kept up to the ceiling while they come, and the item keeps their start, small enough for a frame."""
    from copilot.generated.session_events import SessionEvent

    from agentd.contract import ItemEvent
    from agentd.providers.copilot._mapping import STREAM_KEEP_BYTES, EventMapper

    mapper = EventMapper()
    piece = "z" * (1 << 20)
    for n in range(65):
        mapper.map(SessionEvent.from_dict({"id": f"00000000-0000-4000-8000-{n:012d}", "timestamp": "2026-12-01T10:00:00.000Z",
                                           "parentId": None, "type": "assistant.message_delta",
                                           "data": {"messageId": "m1", "deltaContent": piece}}))
    (item,) = [e.item for e in mapper.finish_turn() if isinstance(e, ItemEvent)]
    kept, _, note = item.text.rpartition("\n")
    assert kept == "z" * STREAM_KEEP_BYTES
    assert note == f"[{65 * len(piece) - STREAM_KEEP_BYTES} more bytes cut: the streamed message passed agentd's ceiling of {CEILING:,} bytes]"
    small = EventMapper()
    small.map(SessionEvent.from_dict({"id": "00000000-0000-4000-8000-000000000001", "timestamp": "2026-12-01T10:00:00.000Z",
                                      "parentId": None, "type": "assistant.message_delta",
                                      "data": {"messageId": "m2", "deltaContent": "whole"}}))
    assert [e.item.text for e in small.finish_turn() if isinstance(e, ItemEvent)] == ["whole"]


def test_a_refused_event_fails_only_its_own_sessions_turn_and_refused_telemetry_fails_none(tmp_path: Any) -> None:
    """The CLI's model.* telemetry (model.messages_snapshot holds the whole history) passes the ceiling in a long
    session of small messages; agentd drops those events unread anyway, so they must fail no turn."""
    from agentd.config import CopilotConfig
    from agentd.providers.copilot import CopilotProvider

    provider = CopilotProvider(CopilotConfig(), state_dir=tmp_path)
    failed: list[tuple[str, str]] = []

    class Conv:  # what the provider reads of an open conversation
        def __init__(self, sid: str, generation: int = 1) -> None:
            self.id, self._runtime = sid, _Runtime(generation)

        def message_refused(self, text: str) -> None:
            failed.append((self.id, text))

    class _Runtime:
        def __init__(self, generation: int) -> None:
            self.generation = generation

    conv = Conv

    provider._conversations.update({conv("s1"), conv("s2"), conv("s1", generation=0)})  # type: ignore[arg-type]
    head = _reader.FrameHead(method="session.event", session_id="s1")
    for telemetry in ("model.messages_snapshot", "model.response", "assistant.streaming_delta"):
        provider._message_refused(1, _reader.FrameHead(method="session.event", session_id="s1", event_type=telemetry), "t")
    assert failed == []
    provider._message_refused(1, _reader.FrameHead(method="session.event", session_id="s1", event_type="assistant.message"), "big")
    provider._message_refused(1, head, "no type seen")  # the head told no type: it may be anything
    provider._message_refused(1, _reader.FrameHead(id="r1"), "an answer")  # no session: its request failed instead
    assert failed == [("s1", "big"), ("s1", "no type seen")]


def test_a_message_the_sdks_dispatch_cannot_take_is_refused_and_the_connection_goes_on(reader: _Reader) -> None:
    """An error answer whose "error" is no object raised in the SDK's read thread (AttributeError) and ended it."""
    pending, rid = reader.ask("session.abort", {"sessionId": "s6"})
    reader.write(_frame(json.dumps({"jsonrpc": "2.0", "id": rid, "error": "flat"}).encode()), _frame(_event("s6", "after")))
    with pytest.raises(MessageRefused) as refused:
        pending.result(10)
    assert "cannot take" in refused.value.message
    reader.wait(2)
    assert reader.got[-1][1]["event"]["data"]["content"] == "after"
    assert not reader.closed.is_set()


async def test_a_refused_message_fails_the_running_turn_after_its_abort_which_the_next_prompt_waits_for(nursery: Any) -> None:
    """Through CopilotConversation with a stand-in SDK session: a notice, the CLI's turn aborted, the CLI's idle
    ends the turn failed with the reader's text, and the next prompt reaches the CLI only after the abort."""
    import trio
    from copilot.generated.session_events import SessionEvent

    from agentd.contract import ItemEvent, Prompt, TurnEvent, TurnState
    from agentd.providers.copilot._conversation import CopilotConversation

    calls: list[str] = []
    emitted: list[Any] = []

    class Bridge:
        async def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)

        def call_soon(self, fn: Any, *args: Any) -> None:
            pass

    class Restarts:
        def succeeded(self, **_: Any) -> None:
            pass

    class Provider:
        _restarts = Restarts()

        def _require_bridge(self) -> Bridge:
            return Bridge()

        def _spawn(self, fn: Any, *args: Any) -> None:
            nursery.start_soon(fn, *args)

    class Runtime:
        alive, exit_reason = True, ""

    class Session:
        async def send(self, text: str, **_: Any) -> str:
            calls.append(f"send {text}")
            return "m"

        async def abort(self) -> None:
            await trio.sleep(0.2)  # the CLI busy with the huge message's other events
            calls.append("abort")

    class Sink:
        def emit(self, event: Any) -> None:
            emitted.append(event)

    conv = CopilotConversation(Provider(), Runtime(), Sink(), workdir="/", model="m", effort="")  # type: ignore[arg-type]
    conv.session = Session()
    await conv.send(Prompt(text="one"))
    conv.message_refused("too big: 68 MB")
    await trio.sleep(0)
    assert [e.item.text for e in emitted if isinstance(e, ItemEvent)] == ["error: too big: 68 MB"]
    conv._handle(SessionEvent.from_dict({"id": "00000000-0000-4000-8000-000000000009", "timestamp": "2026-12-01T10:00:00.000Z",
                                         "parentId": None, "type": "session.idle", "ephemeral": True, "data": {"aborted": True}}))
    ends = [e.turn for e in emitted if isinstance(e, TurnEvent) and e.turn.state is not TurnState.WORKING]
    assert [(t.state, t.error, t.reason) for t in ends] == [(TurnState.FAILED, "too big: 68 MB", "error")]
    await conv.send(Prompt(text="two"))
    assert calls == ["send one", "abort", "send two"]
    nursery.cancel_scope.cancel()


@pytest.mark.parametrize("client_class", [BoundedJsonRpcClient, JsonRpcClient])
def test_odd_bytes_on_the_clis_stderr_become_u_fffd_and_it_is_still_drained(client_class: type[JsonRpcClient]) -> None:
    """The SDK's stderr reader stopped at the first odd byte (and kept every line): the CLI would then block
    on a full pipe. agentd's reads on, keeping the last lines for an exit's explanation."""
    r = _Reader(client_class, stderr=True)
    try:
        n_lines = _reader.STDERR_TAIL + 5
        os.write(r.err_w, b"".join(b"line %d\n" % n for n in range(n_lines)) + b"odd \xff byte\nafter\n")
        for _ in range(200):
            if "after" in r.client.get_stderr_output():
                break
            threading.Event().wait(0.02)
        out = r.client.get_stderr_output().splitlines()
        if client_class is JsonRpcClient:
            assert out == [f"line {n}" for n in range(n_lines)], out  # the SDK's: nothing read past the odd byte
            return
        assert out == [f"line {n}" for n in range(7, n_lines)] + ["odd \ufffd byte", "after"]
    finally:
        r.close()


def test_an_sdk_that_changed_what_the_reader_relies_on_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from copilot import CopilotClient

    async def _connect_via_stdio(self: Any) -> None:  # a release that builds its client elsewhere
        self._client = self._make_rpc()

    monkeypatch.setattr(CopilotClient, "_connect_via_stdio", _connect_via_stdio)
    monkeypatch.delattr(JsonRpcClient, "_stderr_loop")
    with pytest.raises(_reader.SdkChanged) as changed:
        _reader.check_sdk()
    text = str(changed.value)
    assert f"agentd is built for {_reader.SDK_VERSION}" in text
    assert "JsonRpcClient._stderr_loop is gone" in text
    assert "CopilotClient._connect_via_stdio no longer does 'self._client = JsonRpcClient(self._process)'" in text
    assert "_connect_via_stdio no longer does 'event_dict = params[\"event\"]'" in text
    monkeypatch.setattr(se, "from_datetime", lambda x: x)  # a release that parses its times in another way
    with pytest.raises(_reader.SdkChanged, match="session_events.from_datetime is no longer the SDK's own"):
        _reader.check_sdk()


_times = st.datetimes(min_value=_dt.datetime(1, 1, 1), max_value=_dt.datetime(9999, 12, 31, 23, 59, 59))


@settings(max_examples=400, deadline=None)
@given(_times, st.integers(0, 6), st.sampled_from(["Z", "+00:00", "-00:00", "+05:30", "-11:45", "+14:00"]))
def test_the_clis_times_are_parsed_as_the_sdk_parses_them(when: _dt.datetime, digits: int, offset: str) -> None:
    text = f"{when.year:04d}" + when.strftime("-%m-%dT%H:%M:%S") + ("." + f"{when.microsecond:06d}"[:digits] if digits else "") + offset
    ours, sdks = _reader.from_datetime(text), dateutil.parser.parse(text)
    assert ours == sdks and ours.utcoffset() == sdks.utcoffset()
    assert ours.replace(tzinfo=None) == sdks.replace(tzinfo=None)


@pytest.mark.parametrize("text", ["2026-12-02 20:29:09", "2026-12-02T20:29:09", "Dec 2 2026 20:29", "2026-12-02T20:29:09.1234567Z",
                                  "２０２６-12-02T20:29:09Z"])
def test_other_times_are_parsed_by_the_sdks_own(text: str) -> None:
    try:
        sdks = dateutil.parser.parse(text)
    except ValueError as exc:
        with pytest.raises(type(exc)):
            _reader.from_datetime(text)
    else:
        assert _reader.from_datetime(text) == sdks and type(_reader.from_datetime(text).tzinfo) is type(sdks.tzinfo)


@pytest.mark.parametrize("text", ["2026-02-30T20:29:09Z", "2026-12-02T24:00:00Z", "2026-12-02T20:61:09.5+01:00"])
def test_a_time_of_the_clis_shape_that_is_no_time_is_refused_as_the_sdk_refuses_it(text: str) -> None:
    with pytest.raises(dateutil.parser.ParserError):
        _reader.from_datetime(text)


def test_the_session_events_parse_their_times_with_agentds_once_a_client_is_made() -> None:
    _agentd_client()
    assert se.from_datetime is _reader.from_datetime
    event = se.session_event_from_dict({"type": "session.idle", "data": {}, "id": "27ba8409-ba20-41d9-a87e-82055935ec03",
                                        "timestamp": "2026-12-02T20:29:50.203Z", "parentId": None})
    assert event.timestamp == _dt.datetime(2026, 12, 2, 20, 29, 50, 203000, tzinfo=_dt.timezone.utc)
    assert event.timestamp.tzinfo is _dt.timezone.utc  # ours: dateutil's is a tzlocal or tzutc
