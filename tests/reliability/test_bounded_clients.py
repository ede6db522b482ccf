"""Bounded clients (issue 12): whatever one client does, agentd's cost for it stays bounded.

Through the real daemon and real sockets: a client that pipelines 300,000
requests and never reads is pushed back by its own socket (agentd stops
reading it) while the daemon's memory stays flat and others are served; a
connection's subscriptions are capped (``limit``); exports of a large transcript
that a client asks for and never reads are built one at a time; a connection
that never says ``hello`` is closed; an error about a megabyte of bad request is short;
a flood of unauthenticated WebSocket connections from another user neither
exhausts agentd's descriptors nor locks the owner out.
"""

from __future__ import annotations

import contextlib
import json
import pwd
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import open_websocket_url

from agentd import contract as c
from agentd import wire
from daemon_harness import Daemon

from .conftest import ECHO, fast_daemon, log_events, new

HELLO = wire.encode(wire.Hello(id=0, protocol=wire.PROTOCOL_VERSION, client="tests"))


def _proc_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def _open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _wait_idle(pid: int, timeout: float = 30.0) -> None:
    """Return once ``pid`` used (almost) no CPU for 0.5 s."""
    deadline = time.monotonic() + timeout
    last = _cpu_ticks(pid)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = _cpu_ticks(pid)
        if now - last <= 2:
            return
        last = now
    raise AssertionError(f"pid {pid} stayed busy for {timeout}s")


def _raw(d: Daemon) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(d.socket))
    return sock


def _closed_by_peer(sock: socket.socket) -> bool:
    """True once the other side closed ``sock`` (EOF or reset); never blocks."""
    try:
        while True:
            data = sock.recv(65536, socket.MSG_DONTWAIT)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


# ---------------------------------------------------------------------- pipelining without reading


def test_a_client_pipelining_300k_requests_without_reading_is_pushed_back_and_memory_stays_flat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    total = 300_000
    d = fast_daemon(tmp_path).start()
    try:
        pid = d.proc.pid
        base_kb = _proc_kb(pid, "VmRSS")
        flood = _raw(d)
        flood.sendall(HELLO)
        requests = b"".join(b'{"id":%d,"op":"status"}\n' % i for i in range(1, total + 1))
        sent = [0]

        def pump() -> None:
            view = memoryview(requests)
            flood.settimeout(None)
            try:
                while sent[0] < len(requests):
                    sent[0] += flood.send(view[sent[0]:sent[0] + 65536])
            except OSError:
                pass

        pumper = threading.Thread(target=pump, daemon=True)
        pumper.start()
        # Sending stalls: agentd stopped reading this client (it never reads its answers).
        last, still_since = -1, time.monotonic()
        deadline = time.monotonic() + 15
        while time.monotonic() - still_since < 1.5:
            assert time.monotonic() < deadline, f"agentd took all {sent[0]} bytes: nothing pushed back"
            if sent[0] != last:
                last, still_since = sent[0], time.monotonic()
            time.sleep(0.05)
        taken = requests.count(b"\n", 0, sent[0])
        assert taken < total, "agentd read every pipelined request of a client that never reads"
        # Meanwhile everyone else is served at once.
        with d.client() as other:
            t0 = time.monotonic()
            assert other.request(wire.Status)["pid"] == pid
            rtt = time.monotonic() - t0
        assert rtt < 2.5, f"another client's status took {rtt:.2f}s"  # a held-up daemon never answers
        peak_kb = _proc_kb(pid, "VmHWM")
        growth_mb = (peak_kb - base_kb) / 1024
        assert growth_mb < 64, f"agentd grew by {growth_mb:.0f} MiB for one client that never reads"
        # Now the client reads: what it sent is answered, each request once (the first 20,000
        # here, to keep the test short), and agentd reads on as the client drains.
        flood.settimeout(30)
        ids: set[int] = set()
        buf = b""
        t0 = time.monotonic()
        want = 20_000
        while len(ids) < want:
            chunk = flood.recv(1 << 20)
            assert chunk, f"agentd closed the connection after {len(ids)} answers"
            buf += chunk
            lines = buf.split(b"\n")
            buf = lines.pop()
            for line in lines:
                frame = json.loads(line)
                if frame["type"] == "result" and frame["id"]:
                    assert frame["id"] not in ids and frame["result"]["pid"] == pid, frame
                    ids.add(frame["id"])
            assert time.monotonic() - t0 < 20, f"only {len(ids)} answers within 20 s"
        assert requests.count(b"\n", 0, sent[0]) > taken, "agentd did not read on as the client drained"
        drained = time.monotonic() - t0
        flood.close()
        pumper.join(5)
        assert _proc_kb(pid, "VmRSS") - base_kb < 64 * 1024
        with capsys.disabled():
            print(f"\nbounded clients: {total} pipelined requests, {taken} taken before agentd stopped reading; "
                  f"RSS peak +{growth_mb:.1f} MiB; another client's status {rtt * 1000:.0f} ms; "
                  f"{want} answered in {drained:.1f}s once the client read")
    finally:
        d.stop()


def _echoed(d: Daemon, tmp_path: Path, prompts: list[str]) -> tuple[str, int]:
    """A conversation on ``d`` whose script echoes each of ``prompts`` in one turn each; its id and
    the size of its Markdown export."""
    fast = tmp_path / "fast.toml"
    fast.write_text('model = "fast"\nchunk = 1048576\ndelay_ms = 0\n[[turn]]\n[[turn.step]]\nkind = "text"\n'
                    'text = "{prompt}"\n')
    work = tmp_path / "work"
    work.mkdir()
    with d.client() as a:
        cid = new(a, work, fast)
        a.subscribe(cid)
        for text in prompts:
            a.follow(a.request(wire.Send, conversation=cid, text=text)["run"])
        return cid, len(a.request(wire.Export, conversation=cid, format="md")["text"])


def test_large_answers_to_a_client_that_never_reads_are_bounded_in_bytes_not_only_in_frames(tmp_path: Path) -> None:
    # Each answer is a ~200 KB export; 1,500 of them fit the 4,096-frame outbox 75 times over in bytes.
    d = fast_daemon(tmp_path, "[server]\noutbox_bytes = 4194304\nmax_requests_in_flight = 8\n").start()
    try:
        pid = d.proc.pid
        cid, size = _echoed(d, tmp_path, ["y" * 100_000])
        assert size > 190_000
        base_kb = _proc_kb(pid, "VmRSS")
        flood = _raw(d)
        flood.sendall(HELLO)
        count = 1500
        requests = b"".join(json.dumps({"id": i, "op": "export", "conversation": cid, "format": "md"}).encode() + b"\n"
                            for i in range(1, count + 1))
        flood.setblocking(False)
        sent, still_since, deadline = 0, time.monotonic(), time.monotonic() + 20
        while time.monotonic() - still_since < 1.5:
            assert time.monotonic() < deadline
            try:
                n = flood.send(requests[sent:sent + 65536])
            except BlockingIOError:
                time.sleep(0.05)
                continue
            sent += n
            still_since = time.monotonic()
            if sent == len(requests):
                break
        _wait_idle(pid)  # agentd answered all it could: into its outbox, or it stopped reading
        growth_mb = (_proc_kb(pid, "VmHWM") - base_kb) / 1024
        assert growth_mb < 64, f"agentd grew by {growth_mb:.0f} MiB holding answers for a client that never reads"
        with d.client() as other:
            assert other.request(wire.Status)["pid"] == pid
        # The answers it holds are whole: the first one read back is the full export.
        flood.setblocking(True)
        flood.settimeout(20)
        reader = flood.makefile("rb")
        frames = [json.loads(reader.readline()) for _ in range(3)]
        assert frames[0]["type"] == "hello" and frames[1]["id"] == 0
        assert frames[2]["type"] == "result" and len(frames[2]["result"]["text"]) == size
        reader.close()
        flood.close()
        print(f"bounded clients: {count} pipelined ~{size // 1000} KB answers, RSS peak +{growth_mb:.1f} MiB "
              f"(outbox_bytes 4 MiB, 8 requests in flight)")
    finally:
        d.stop()


def test_exports_of_a_large_transcript_pipelined_without_reading_are_built_one_at_a_time(tmp_path: Path) -> None:
    # Each export is a ~12 MB transcript; all of them at once held several copies of it each
    # (the journal read, the rendering, the frame), gigabytes for a 170 MB journal. agentd
    # builds the next only once the client took the last one (server.LARGE_REPLIES).
    d = fast_daemon(tmp_path).start()
    try:
        pid = d.proc.pid
        cid, size = _echoed(d, tmp_path, [str(n) * (2 << 20) for n in range(3)])
        assert size > 12_000_000
        _wait_idle(pid)
        base_kb = _proc_kb(pid, "VmRSS")
        count = 20
        flood = _raw(d)
        flood.sendall(HELLO + b"".join(json.dumps({"id": i, "op": "export", "conversation": cid, "format": "md"})
                                       .encode() + b"\n" for i in range(1, count + 1)))
        _wait_idle(pid)  # agentd built what it would for a client that does not read
        growth_mb = (_proc_kb(pid, "VmHWM") - base_kb) / 1024
        print(f"bounded clients: {count} pipelined exports of {size / 1e6:.0f} MB, RSS peak +{growth_mb:.0f} MiB")
        # one export at a time holds ~10 copies of it at its peak (20 at once: 1.3 GiB here)
        assert growth_mb < 16 * size / 2**20, f"agentd grew by {growth_mb:.0f} MiB for exports nobody read"
        with d.client() as other:
            assert other.request(wire.Status)["pid"] == pid
        # Once the client reads, every export comes, whole.
        flood.settimeout(30)
        reader = flood.makefile("rb")
        assert json.loads(reader.readline())["type"] == "hello"
        assert json.loads(reader.readline())["id"] == 0
        got = set()
        for _ in range(count):
            frame = json.loads(reader.readline())
            assert frame["type"] == "result" and len(frame["result"]["text"]) == size
            got.add(frame["id"])
        assert got == set(range(1, count + 1))
        reader.close()
        flood.close()
    finally:
        d.stop()


# ---------------------------------------------------------------------- subscriptions, hello, errors


def test_subscriptions_per_connection_are_capped_with_a_limit_error(tmp_path: Path) -> None:
    d = fast_daemon(tmp_path, "[server]\nmax_subscriptions = 4\n").start()
    work = tmp_path / "work"
    work.mkdir()
    try:
        with d.client() as a, d.client() as b:
            cid = new(a, work, ECHO)
            subs = [a.subscribe(cid) for _ in range(3)] + [a.subscribe(None)]
            with pytest.raises(c.LimitExceeded, match="max_subscriptions"):
                a.subscribe(cid)
            with pytest.raises(c.LimitExceeded):
                a.subscribe(None)
            # The cap is per connection: another one subscribes; the first goes on after an unsubscribe.
            b.subscribe(cid)
            a.request(wire.Unsubscribe, subscription=subs[0])
            a.subscribe(cid)
            assert a.request(wire.Status)["pid"] == d.proc.pid
    finally:
        d.stop()


def test_a_connection_that_sends_no_hello_is_dropped_after_the_hello_timeout(tmp_path: Path) -> None:
    d = fast_daemon(tmp_path, "[server]\nhello_timeout_s = 1.0\n").start()
    try:
        silent, trickle = _raw(d), _raw(d)
        trickle.sendall(b'{"id": 0, "op": "hel')  # half a hello, then nothing (slowloris)
        with d.client() as greeted:
            t0 = time.monotonic()
            for sock in (silent, trickle):
                data = b""
                while chunk := sock.recv(65536):
                    data += chunk
                frames = [json.loads(line) for line in data.splitlines()]
                assert frames[0]["type"] == "hello"
                assert frames[-1]["type"] == "error" and "no hello within 1 s" in frames[-1]["error"]["message"]
            waited = time.monotonic() - t0
            assert waited < 4, f"a silent connection was dropped only after {waited:.1f}s"
            print(f"hello timeout 1 s: silent and half-hello connections dropped after {waited:.2f}s")
            time.sleep(0.5)
            # A client that said hello stays, past the timeout.
            assert greeted.request(wire.Status)["pid"] == d.proc.pid
        silent.close()
        trickle.close()
    finally:
        d.stop()


def test_an_oversized_bad_request_gets_a_short_error_and_the_connection_goes_on(tmp_path: Path) -> None:
    d = fast_daemon(tmp_path).start()
    big = "x" * 1_000_000
    bad = [
        {"id": 1, "op": big},  # unknown op
        {"id": 2, "op": "status", big: 1},  # unknown field
        {"id": 3, "op": "new", "provider": "script", "workdir": "/", "mode": big},  # bad enum value
        {"id": 4, "op": "show", "conversation": big},  # no such conversation
        {"id": 5, "op": "new", "provider": big, "workdir": big},  # a handler quoting what it got
    ]
    try:
        with d.client() as client:
            for frame in bad:
                client.send_raw(json.dumps(frame).encode() + b"\n")
                reply = client.read()
                assert isinstance(reply, wire.ErrorFrame) and reply.id == frame["id"], reply
                message = reply.error.message
                assert len(message) < 1200, f"{len(message)}-character error for {reply.error.code}"
                print(f"{len(json.dumps(frame))}-byte bad request: {len(message)}-character {reply.error.code} error")
                assert "chars" in message and "…" in message, message
                assert all(len(json.dumps(v)) < 1200 for v in reply.error.details.values())
            assert client.request(wire.Status)["pid"] == d.proc.pid
    finally:
        d.stop()


# ---------------------------------------------------------------------- the WebSocket gateway under a flood


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


GATEWAY = """\
[websocket]
enabled = true
port = {port}
max_unauthenticated = 64
max_unauthenticated_per_peer = 16
handshake_timeout_s = {timeout}
"""


def _start_with_low_nofile(d: Daemon, soft: int = 256) -> tuple[Daemon, int]:
    """Start agentd with an open-files soft limit of ``soft`` (the usual 1024, scaled down)."""
    was = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Lowered here (the daemon inherits it) with room for what this test process holds open.
    soft = max(soft, len(list(Path("/proc/self/fd").iterdir())) + 64)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, was[1]), was[1]))
    try:
        return d.start(), min(soft, was[1])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, was)


def _nofile_limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files limit")


def _flood(port: int, addresses: list[str], each: int) -> list[socket.socket]:
    """Connections that never authenticate: half say nothing, half send part of a handshake, slowly."""
    socks = []
    for address in addresses:
        for n in range(each):
            s = socket.socket()
            s.bind((address, 0))
            s.connect(("127.0.0.1", port))
            if n % 2:
                s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            socks.append(s)
    return socks


async def _status_over_ws(ws: Any, rid: int) -> dict[str, Any]:
    await ws.send_message(json.dumps({"id": rid, "op": "status"}))
    while True:
        frame = json.loads(await ws.get_message())
        if frame.get("id") == rid:
            return frame["result"]


@contextlib.asynccontextmanager
async def _ws(port: int, token: str) -> AsyncIterator[Any]:
    """An authenticated WebSocket past its hello exchange."""
    async with open_websocket_url(f"ws://127.0.0.1:{port}/",
                                  extra_headers=[("Authorization", f"Bearer {token}")]) as ws:
        assert json.loads(await ws.get_message())["type"] == "hello"
        await ws.send_message(json.dumps({"id": 0, "op": "hello", "protocol": wire.PROTOCOL_VERSION}))
        assert json.loads(await ws.get_message())["type"] == "result"
        yield ws


async def test_a_thousand_unauthenticated_websockets_neither_exhaust_descriptors_nor_lock_the_owner_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = _free_port()
    d, low = _start_with_low_nofile(fast_daemon(tmp_path, GATEWAY.format(port=port, timeout=2.0)), soft=256)
    try:
        pid = d.proc.pid
        soft, hard = _nofile_limits(pid)
        assert soft == hard, f"agentd kept an open-files soft limit of {soft} (hard {hard})"
        token = (d.runtime_dir / "ws-token").read_text().strip()
        async with _ws(port, token) as owner_ws:  # the owner's web client, authenticated before
            base_fds = _open_fds(pid)
            # 1,200 connections from 24 loopback addresses (another local user can bind any 127.x).
            t0 = time.monotonic()
            socks = await trio.to_thread.run_sync(_flood, port, [f"127.0.0.{n}" for n in range(2, 26)], 50)
            await trio.sleep(0.3)
            held = _open_fds(pid) - base_fds
            assert held <= 64 + 8, f"agentd holds {held} descriptors for unauthenticated connections"
            # The owner is not locked out: the Unix socket, and the authenticated WebSocket.
            with d.client() as unix:
                assert unix.request(wire.Status)["pid"] == pid
            assert (await _status_over_ws(owner_ws, 1))["pid"] == pid
            # Past the handshake timeout agentd has closed every one of them.
            with trio.fail_after(10):
                while not all(_closed_by_peer(s) for s in socks):
                    await trio.sleep(0.1)
            dropped_after = time.monotonic() - t0
            for s in socks:
                s.close()
            # And a new web client gets in.
            async with _ws(port, token) as ws:
                assert (await _status_over_ws(ws, 1))["pid"] == pid
        with capsys.disabled():
            print(f"\nbounded clients: {len(socks)} unauthenticated WebSockets held {held} agentd descriptors "
                  f"(cap 64); all dropped within {dropped_after:.1f}s (handshake timeout 2 s); "
                  f"open-files soft limit raised {low} -> {soft}")
    finally:
        d.stop()


#: Runs as another local user: opens ``n`` connections from 127.0.0.1 to the gateway, says how many
#: agentd closed at once (within 3 s), then holds the rest until its stdin closes.
_FLOOD_AS = r"""
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
def closed(s):
    try:
        return s.recv(1, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
deadline = time.monotonic() + 3
while time.monotonic() < deadline and sum(map(closed, socks)) < n - 16:
    time.sleep(0.05)
print(sum(map(closed, socks)), flush=True)
sys.stdin.read()
"""


async def test_unauthenticated_websockets_are_capped_per_local_user_not_per_address(
        tmp_path: Path, other_user: pwd.struct_passwd) -> None:
    # Every local user connects from 127.0.0.1: capped by address, another user's 16 idle
    # connections took the owner's share. agentd asks the kernel whose socket each one is.
    port = _free_port()
    d = fast_daemon(tmp_path, GATEWAY.format(port=port, timeout=8.0)).start()
    flood = subprocess.Popen(["/usr/bin/python3", "-c", _FLOOD_AS, str(port), "100"], user=other_user.pw_uid,
                             group=other_user.pw_gid, extra_groups=[], cwd="/", text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        token = (d.runtime_dir / "ws-token").read_text().strip()
        assert flood.stdout is not None
        closed = int(await trio.to_thread.run_sync(flood.stdout.readline))
        # 16 wait for their handshake timeout (8 s); the 84 past that user's cap were closed at once.
        assert closed == 100 - 16, f"{closed} of another user's 100 connections were closed at once"
        # The owner, from the same address, is not held up by that user's connections.
        async with _ws(port, token) as ws:
            assert (await _status_over_ws(ws, 1))["pid"] == d.proc.pid
        refused = [e for e in log_events(d) if e.get("event") == "gateway.refused"]
        assert refused and refused[0]["who"] == f"uid {other_user.pw_uid}"
    finally:
        flood.kill()
        flood.wait()
        d.stop()


def test_a_gateway_port_another_process_holds_stops_agentd_with_a_clear_error(tmp_path: Path) -> None:
    # Another user listening there first would be handed the token of every client that connects.
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        d = fast_daemon(tmp_path, f"[websocket]\nenabled = true\nport = {port}\n")
        proc = subprocess.run([sys.executable, "-m", "agentd", "run"], env=d.env, capture_output=True, text=True,
                              timeout=60)
    finally:
        holder.close()
    assert proc.returncode == 1, proc.stderr
    assert f"the WebSocket gateway cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "another process holds that port" in proc.stderr and "Traceback" not in proc.stderr


async def test_authenticated_websockets_no_longer_count_as_unauthenticated(tmp_path: Path) -> None:
    # The handler settled each connection under a key it never had: past the token check a
    # WebSocket still held its unauthenticated slot, so the owner's 17th was refused.
    port = _free_port()
    d = fast_daemon(tmp_path, GATEWAY.format(port=port, timeout=8.0)).start()
    try:
        token = (d.runtime_dir / "ws-token").read_text().strip()
        async with contextlib.AsyncExitStack() as stack:
            sockets = [await stack.enter_async_context(_ws(port, token)) for _ in range(40)]
            for n, ws in enumerate(sockets):
                assert (await _status_over_ws(ws, n + 1))["pid"] == d.proc.pid
        assert not any(e.get("event") == "gateway.refused" for e in log_events(d))
    finally:
        d.stop()
