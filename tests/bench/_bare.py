"""The baseline of the fan-out and latency benchmarks: a bare trio socket server writing the same frames.

No journal, no hub, no protocol: it accepts connections on a Unix socket and
writes ``event`` frames shaped like agentd's (same envelope, same record
fields, same size, the same ``@<monotonic_ns>@`` stamp) the simplest fast way
trio allows. What agentd adds on top of this is what the benchmarks measure.

``python _bare.py fanout SOCKET --subs K --n N --burst B --size S``: once K
clients are connected, one producer makes N records, B at a time with a
checkpoint between bursts (as the bench provider does); each connection has
a list of pending frames and a writer task that joins them into one
``send_all``.

``python _bare.py latency SOCKET --n N --rate R --size S``: one client; a
record every 1/R s, each written at once with ``send_all``.

Prints ``listening`` once the socket is bound; exits when done.
"""

from __future__ import annotations

import argparse
import os
import socket as _socket
import time

import trio

END = b"@@END@@"
TS = b"2026-01-01T00:00:00.000Z"


def _record(pad: bytes, end: bool) -> bytes:
    # The shape of agentd's live delta record (wire.Record around a contract.Delta).
    return b'{"type":"delta","ts":"%s","data":{"item_id":"i0123abcd","kind":"assistant","text":"@%d@%s%s"},"run":"r0123456789ab"}' % (
        TS,
        time.monotonic_ns(),
        pad,
        END if end else b"",
    )


def _prefix(sub: int) -> bytes:
    return b'{"type":"event","sub":%d,"conversation":"c0123456789ab","record":' % sub


class _Conn:
    def __init__(self, stream: trio.SocketStream, sub: int) -> None:
        self.stream = stream
        self.prefix = _prefix(sub)
        self.pending: list[bytes] = []
        self.wake = trio.Event()
        self.done = False

    async def writer(self) -> None:
        while True:
            if not self.pending:
                if self.done:
                    return
                self.wake = trio.Event()
                await self.wake.wait()
                continue
            batch, self.pending = self.pending, []
            await self.stream.send_all(b"".join(batch))


def _listen(path: str) -> trio.socket.SocketType:
    if os.path.exists(path):
        os.unlink(path)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(1024)
    return trio.socket.from_stdlib_socket(sock)


async def fanout(args: argparse.Namespace) -> None:
    listener = trio.SocketListener(_listen(args.socket))
    print("listening", flush=True)
    conns = [_Conn(await listener.accept(), i + 1) for i in range(args.subs)]
    pad = b"x" * max(0, args.size - 120 - 30)
    async with trio.open_nursery() as nursery:
        for conn in conns:
            nursery.start_soon(conn.writer)
        n, burst = args.n, args.burst
        for i in range(n):
            rec = _record(pad, i == n - 1)
            for conn in conns:
                conn.pending.append(b"".join((conn.prefix, rec, b"}\n")))
                conn.wake.set()
            if i % burst == burst - 1:
                await trio.lowlevel.checkpoint()
        for conn in conns:
            conn.done = True
            conn.wake.set()
    for conn in conns:
        await conn.stream.aclose()


async def latency(args: argparse.Namespace) -> None:
    listener = trio.SocketListener(_listen(args.socket))
    print("listening", flush=True)
    stream = await listener.accept()
    prefix = _prefix(1)
    pad = b"x" * max(0, args.size - 120 - 30)
    start = trio.current_time()
    for i in range(args.n):
        await trio.sleep_until(start + i / args.rate)
        await stream.send_all(b"".join((prefix, _record(pad, i == args.n - 1), b"}\n")))
    await stream.aclose()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["fanout", "latency"])
    p.add_argument("socket")
    p.add_argument("--subs", type=int, default=1)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--burst", type=int, default=64)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--rate", type=float, default=1000.0)
    args = p.parse_args()
    trio.run({"fanout": fanout, "latency": latency}[args.mode], args)


if __name__ == "__main__":
    main()
