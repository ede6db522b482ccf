"""Subscriber side of the fan-out and latency benchmarks, run as a process of its own.

``python _subscribers.py fanout SOCKET --subs K [--conversation C]``
connects K clients (with ``--conversation``: says hello and subscribes to C,
as agentctl would; without: just reads, from the bare server), prints ``ready``, then reads every
socket until each has seen ``@@END@@`` and prints one JSON line
``{"first": t, "last": t, "lines": n, "lagged": k}`` (perf_counter seconds).

``python _subscribers.py latency SOCKET [--conversation C]`` does the
same with one client and prints ``{"lat_us": [...]}``: for each delta, the
receive time minus the ``@<monotonic_ns>@`` stamp the producer put in it.

Kept free of trio and of agentd's heavier modules: it measures, it should cost little.
"""

from __future__ import annotations

import argparse
import json
import re
import selectors
import socket
import sys
import time

END = b"@@END@@"
LAGGED = b'"type":"lagged"'
STAMP = re.compile(rb"@(\d{6,})@")


def _connect(path: str, conversation: str | None, sub_id: int) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    s.connect(path)
    if conversation is None:
        return s
    f = s.makefile("rb", buffering=0)

    def line() -> bytes:
        buf = b""
        while not buf.endswith(b"\n"):
            ch = s.recv(1)
            if not ch:
                raise EOFError("agentd closed the connection")
            buf += ch
        return buf

    line()  # hello from agentd
    s.sendall(b'{"op":"hello","id":0,"protocol":1,"client":"bench"}\n')
    reply = line()
    if b'"result"' not in reply:
        raise RuntimeError(f"hello refused: {reply!r}")
    sub = {"op": "subscribe", "id": sub_id, "conversation": conversation, "after": 1 << 60, "snapshot": False}
    s.sendall(json.dumps(sub).encode() + b"\n")
    reply = line()
    if b'"result"' not in reply:
        raise RuntimeError(f"subscribe refused: {reply!r}")
    del f
    return s


def fanout(args: argparse.Namespace) -> None:
    socks = [_connect(args.socket, args.conversation, i + 1) for i in range(args.subs)]
    sel = selectors.DefaultSelector()
    tails: dict[socket.socket, bytes] = {}
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        tails[s] = b""
    print("ready", flush=True)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    first = last = 0.0
    lines = lagged = 0
    open_ = len(socks)
    deadline = time.perf_counter() + args.timeout
    while open_:
        events = sel.select(timeout=1.0)
        now = time.perf_counter()
        if now > deadline:
            break
        for key, _ in events:
            s = key.fileobj
            try:
                n = s.recv_into(view)
            except BlockingIOError:
                continue
            if not first:
                first = now
            if not n:
                sel.unregister(s)
                open_ -= 1
                continue
            lines += buf.count(b"\n", 0, n)
            # The end marker and a lagged frame come last but for the turn's closing records (its end,
            # its file checkpoint): look at the tail only.
            tail = tails[s] + bytes(view[max(0, n - 8192) : n])
            if END in tail or LAGGED in tail:
                lagged += LAGGED in tail
                sel.unregister(s)
                open_ -= 1
                last = now
            else:
                tails[s] = tail[-8192:]
    print(json.dumps({"first": first, "last": last, "lines": lines, "lagged": lagged, "unfinished": open_}), flush=True)
    for s in socks:
        s.close()


def latency(args: argparse.Namespace) -> None:
    s = _connect(args.socket, args.conversation, 1)
    s.settimeout(args.timeout)
    print("ready", flush=True)
    lat: list[float] = []
    rest = b""
    while True:
        chunk = s.recv(1 << 20)
        now = time.monotonic_ns()
        if not chunk:
            break
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        for m in STAMP.finditer(data, 0, cut):
            lat.append((now - int(m.group(1))) / 1000)
        if END in data[:cut] or LAGGED in data[:cut]:
            break
    print(json.dumps({"lat_us": lat, "lagged": LAGGED in rest}), flush=True)
    s.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["fanout", "latency"])
    p.add_argument("socket")
    p.add_argument("--subs", type=int, default=1)
    p.add_argument("--conversation", default=None)
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args()
    {"fanout": fanout, "latency": latency}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
