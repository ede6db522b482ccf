"""The JSON-RPC reader of agentd.providers._jsonrpc on a real pipe (an agent's stdout is one) and on a
memory stream: whatever the chunking, every message is dispatched once, in wire order; a broken line
ends the connection after the lines before it, and nothing after it is dispatched."""

from __future__ import annotations

import os
import random
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from agentd.providers import _jsonrpc
from agentd.providers._jsonrpc import Call, Connection


def _pipe() -> tuple[trio.lowlevel.FdStream, trio.lowlevel.FdStream]:
    r, w = os.pipe()
    return trio.lowlevel.FdStream(r), trio.lowlevel.FdStream(w)


def _memory() -> tuple[trio.abc.ReceiveStream, trio.abc.SendStream]:
    send, receive = trio.testing.memory_stream_one_way_pair()
    return receive, send


STREAMS = {"pipe": _pipe, "memory": _memory}


class Peer:
    """A Connection whose notifications are logged with which of ``calls`` were answered by then."""

    def __init__(self) -> None:
        self.out_send, self.out_receive = trio.testing.memory_stream_one_way_pair()
        self.log: list[tuple[Any, list[bool]]] = []
        self.requests: list[tuple[str, Any]] = []
        self.calls: list[Call] = []
        self.conn = Connection(self.out_send, on_request=self.on_request, on_notification=self.on_notification)

    def on_notification(self, method: str, params: Any) -> None:
        if params == "boom":
            raise RuntimeError("a mapping bug")
        self.log.append((params, [c._done.is_set() for c in self.calls]))

    async def on_request(self, method: str, params: Any) -> Any:
        self.requests.append((method, params))
        return {"seen": params}


def _line(msg: dict[str, Any], crlf: bool = False) -> bytes:
    return msgspec.json.encode(msg) + (b"\r\n" if crlf else b"\n")


async def _feed(send: trio.abc.SendStream, data: bytes, rng: random.Random, *, close: bool = True) -> None:
    """``data`` in chunks of random sizes (1 byte up to several lines), sometimes apart in time; then
    the end of the stream unless ``close`` is false."""
    at = 0
    while at < len(data):
        size = rng.choice([1, 2, 7, 64, 199, 200, 201, 450, 4096, 70000])
        await send.send_all(data[at:at + size])
        at += size
        if rng.random() < 0.3:
            await trio.sleep(0.0005)
        else:
            await trio.lowlevel.checkpoint()
    if close:
        await send.aclose()


async def _serve(peer: Peer, kind: str, data: bytes, seed: int) -> None:
    """Serve ``peer`` on a stream of ``kind`` fed ``data``; the feeder is stopped once serve returns (a
    violation leaves it blocked on a pipe nobody reads)."""
    receive, send = STREAMS[kind]()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_feed, send, data, random.Random(seed))
            await peer.conn.serve(receive)
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("kind", STREAMS)
@pytest.mark.parametrize("seed", range(6))
async def test_every_message_once_and_in_wire_order_whatever_the_chunking(kind: str, seed: int) -> None:
    rng = random.Random(seed)
    peer = Peer()
    calls = peer.calls
    for _ in range(20):
        calls.append(await peer.conn.start("session/prompt", {}))
    await peer.out_receive.receive_some()  # the requests written
    wire: list[bytes] = []
    expected: list[tuple[int, int, list[bool]]] = []
    answered = [False] * len(calls)
    pending = list(range(len(calls)))
    rng.shuffle(pending)
    for i in range(400):
        r = rng.random()
        if r < 0.05 and pending:
            k = pending.pop()
            wire.append(_line({"jsonrpc": "2.0", "id": calls[k].id, "result": {"k": k}}))
            answered[k] = True
        elif r < 0.08:
            wire.append(rng.choice([b"\n", b"   \n", b"\r\n", b"\t \n"]))  # blank lines are skipped
        elif r < 0.1:
            wire.append(_line({"jsonrpc": "2.0", "id": f"agent-{i}", "method": "fs/read_text_file", "params": i}))
        else:
            text = "x" * rng.choice([0, 1, 150, 3000, 90000])  # lines over a chunk, over 64 KiB
            wire.append(_line({"jsonrpc": "2.0", "method": "session/update", "params": [i, text]},
                              crlf=rng.random() < 0.2))
            expected.append((i, len(text), list(answered)))
    data = b"".join(wire)
    await _serve(peer, kind, data, seed)
    assert peer.conn.violation == ""
    assert [(p[0], len(p[1]), done) for p, done in peer.log] == expected
    for k, call in enumerate(calls):
        if answered[k]:
            assert await call.wait() == {"k": k}
        else:
            assert not call._done.is_set()


@pytest.mark.parametrize("kind", STREAMS)
async def test_a_broken_line_ends_the_connection_after_every_line_before_it(kind: str) -> None:
    peer = Peer()
    before = b"".join(_line({"jsonrpc": "2.0", "method": "session/update", "params": [i]}) for i in range(50))
    after = _line({"jsonrpc": "2.0", "method": "session/update", "params": ["after"]})
    await _serve(peer, kind, before + b"this is not JSON-RPC\n" + after, 1)
    assert "invalid JSON-RPC" in peer.conn.violation and "this is not JSON-RPC" in peer.conn.violation
    assert [p[0] for p, _ in peer.log] == list(range(50))


@pytest.mark.parametrize("kind", STREAMS)
async def test_a_failing_notification_handler_does_not_stop_the_reader(kind: str) -> None:
    peer = Peer()
    data = b"".join(_line({"jsonrpc": "2.0", "method": "session/update", "params": p})
                    for p in ([0], "boom", [1], "boom", [2]))
    await _serve(peer, kind, data, 2)
    assert peer.conn.violation == ""
    assert [p[0] for p, _ in peer.log] == [0, 1, 2]


@pytest.mark.parametrize("kind", STREAMS)
async def test_the_last_line_without_a_newline_is_read_at_eof(kind: str) -> None:
    peer = Peer()
    data = _line({"jsonrpc": "2.0", "method": "session/update", "params": [0]})
    data += _line({"jsonrpc": "2.0", "method": "session/update", "params": [1]}).rstrip(b"\n")
    await _serve(peer, kind, data, 3)
    assert [p[0] for p, _ in peer.log] == [0, 1]


@pytest.mark.parametrize("kind", STREAMS)
async def test_a_line_without_end_over_the_ceiling_is_a_violation(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_jsonrpc, "MAX_LINE_BYTES", 10_000)
    peer = Peer()
    first = _line({"jsonrpc": "2.0", "method": "session/update", "params": [0]})
    await _serve(peer, kind, first + b'{"jsonrpc": "2.0", "params": "' + b"y" * 50_000, 4)
    assert "over the ceiling" in peer.conn.violation
    assert [p[0] for p, _ in peer.log] == [0]


async def test_requests_of_the_agent_are_answered_on_its_input() -> None:
    peer = Peer()
    receive, send = _pipe()
    data = b"".join(_line({"jsonrpc": "2.0", "id": i, "method": "fs/read_text_file", "params": i}) for i in range(5))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.conn.serve, receive)
        # The input stays open until the answers are in: at its end the reader stops, and a request
        # still being answered then is moot (under load the end came first and no answer was written).
        await _feed(send, data, random.Random(5), close=False)
        got = b""
        with trio.fail_after(10):
            while got.count(b"\n") < 5:
                got += await peer.out_receive.receive_some()
        await send.aclose()
    answers = [msgspec.json.decode(line) for line in got.splitlines()]
    assert sorted((a["id"], a["result"]["seen"]) for a in answers) == [(i, i) for i in range(5)]
    assert sorted(peer.requests) == [("fs/read_text_file", i) for i in range(5)]


async def test_closing_the_pipe_while_the_reader_waits_ends_it() -> None:
    peer = Peer()
    receive, send = _pipe()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:  # exits once serve returned
            nursery.start_soon(peer.conn.serve, receive)
            await send.send_all(_line({"jsonrpc": "2.0", "method": "session/update", "params": [0]}))
            while not peer.log:
                await trio.sleep(0.001)
            await receive.aclose()  # the reader is waiting for more: it sees the end, not another fd's bytes
    await send.aclose()
    assert peer.conn.violation == ""
    assert [p[0] for p, _ in peer.log] == [0]


# --------------------------------------------------------------------------- writing


async def _read_lines(receive: trio.abc.ReceiveStream, count: int, slow: bool = False) -> list[bytes]:
    got = b""
    while got.count(b"\n") < count:
        chunk = await receive.receive_some(4096 if slow else 1 << 16)
        if not chunk:
            break
        got += chunk
        if slow:
            await trio.sleep(0)
    return got.split(b"\n")[:-1]


async def test_lines_written_at_once_by_many_tasks_stay_whole_and_in_each_task_s_order() -> None:
    receive, send = _pipe()
    conn = Connection(send, on_request=Peer().on_request, on_notification=lambda m, p: None)
    sizes = [10, 5000, 70_000, 150_000, 100]  # a pipe takes 64 KiB: the big ones are written in parts

    async def writer(w: int) -> None:
        for i in range(12):
            await conn.notify("n", [w, i, "z" * sizes[(w + i) % len(sizes)]])

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for w in range(4):
                nursery.start_soon(writer, w)
            lines = await _read_lines(receive, 4 * 12, slow=True)
    seen: dict[int, list[int]] = {}
    for line in lines:
        msg = msgspec.json.decode(line)  # raises for a line broken or interleaved with another
        w, i, text = msg["params"]
        assert len(text) == sizes[(w + i) % len(sizes)]
        seen.setdefault(w, []).append(i)
    assert seen == {w: list(range(12)) for w in range(4)}


async def test_a_cancelled_write_writes_nothing_and_the_next_one_goes_whole() -> None:
    receive, send = _pipe()
    conn = Connection(send, on_request=Peer().on_request, on_notification=lambda m, p: None)
    with trio.CancelScope() as scope:
        scope.cancel()
        await conn.notify("first", [])
    assert scope.cancelled_caught
    await conn.notify("second", [])
    with trio.fail_after(10):
        assert [msgspec.json.decode(line)["method"] for line in await _read_lines(receive, 1)] == ["second"]


async def test_writing_to_an_agent_that_closed_its_input_is_a_lost_connection() -> None:
    receive, send = _pipe()
    conn = Connection(send, on_request=Peer().on_request, on_notification=lambda m, p: None)
    await receive.aclose()
    with pytest.raises(_jsonrpc.ConnectionLost, match="stopped reading its input \\(BrokenResourceError\\)"):
        await conn.notify("n", [])
    await send.aclose()
    with pytest.raises(_jsonrpc.ConnectionLost, match="stopped reading its input \\(ClosedResourceError\\)"):
        await conn.notify("n", [])
