"""The WebSocket gateway: same frames as the Unix socket, behind a bearer token and an Origin check."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path

import pytest
from trio_websocket import HandshakeError, open_websocket_url

from agentd import wire
from daemon_harness import Daemon


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gateway(tmp_path: Path):
    port = _free_port()
    d = Daemon(tmp_path, f"[websocket]\nenabled = true\nport = {port}\n").start()
    try:
        token_file = d.runtime_dir / "ws-token"
        yield d, port, token_file.read_text().strip()
    finally:
        d.stop()


def test_token_file_is_private(gateway) -> None:
    d, _port, token = gateway
    assert (d.runtime_dir / "ws-token").stat().st_mode & 0o777 == 0o600
    assert len(token) >= 32


async def test_the_same_frames_flow_over_the_websocket_with_the_token(gateway) -> None:
    d, port, token = gateway
    url = f"ws://127.0.0.1:{port}/"
    async with open_websocket_url(url, extra_headers=[(b"Authorization", f"Bearer {token}".encode())]) as ws:
        hello = json.loads(await ws.get_message())
        assert hello["type"] == "hello" and hello["protocol"] == wire.PROTOCOL_VERSION
        await ws.send_message(json.dumps({"id": 0, "op": "hello", "protocol": wire.PROTOCOL_VERSION}))
        # The hello result also says how big a frame and an attachment the daemon takes
        # (server.max_frame_bytes, attachments.max_bytes).
        assert json.loads(await ws.get_message()) == {"type": "result", "id": 0, "result": {
            "protocol": 1, "max_frame_bytes": 16 << 20, "max_attachment_bytes": 10 << 20}}
        await ws.send_message(json.dumps({"id": 1, "op": "status"}))
        status = json.loads(await ws.get_message())
        assert status["id"] == 1 and status["result"]["pid"] == d.proc.pid
        await ws.send_message('{"id": 2, "op": "nope"}')
        assert json.loads(await ws.get_message())["error"]["code"] == "unsupported"


async def test_token_in_the_query_works_for_browsers(gateway) -> None:
    _d, port, token = gateway
    async with open_websocket_url(f"ws://127.0.0.1:{port}/?token={token}",
                                  extra_headers=[(b"Origin", f"http://localhost:{port}".encode())]) as ws:
        assert json.loads(await ws.get_message())["type"] == "hello"


@pytest.mark.parametrize("headers, status", [
    ([], 401),
    ([(b"Authorization", b"Bearer wrong")], 401),
    ([(b"Origin", b"https://evil.example")], 403),
])
async def test_requests_without_the_token_or_from_a_foreign_origin_are_refused(gateway, headers, status) -> None:
    _d, port, token = gateway
    if status == 403:
        headers = headers + [(b"Authorization", f"Bearer {token}".encode())]
    with pytest.raises(HandshakeError) as err:
        async with open_websocket_url(f"ws://127.0.0.1:{port}/", extra_headers=headers):
            pass
    assert getattr(err.value, "status_code", None) == status


def _upgrade(port: int, token: str = "wrong") -> bytes:
    return (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {token}\r\n\r\n").encode()


def test_refused_connections_are_closed_by_agentd_even_when_the_client_keeps_them(gateway) -> None:
    # trio-websocket left a refused connection open until its client closed it, and a refused one
    # no longer counts against the unauthenticated caps: another local user held 600 that way,
    # every descriptor agentd had, and the owner's agentctl got no answer.
    d, port, _token = gateway
    held = []
    try:
        for _ in range(40):  # past max_unauthenticated_per_peer (16)
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(_upgrade(port))
            held.append(s)
        for s in held:
            answer = b""
            while True:  # the whole answer, then the end agentd gives it
                chunk = s.recv(4096)
                if not chunk:
                    break
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 401") and answer.endswith(b"a bearer token is required\n"), answer
    finally:
        for s in held:
            s.close()
    assert d.agentctl("status", "--json").returncode == 0


def test_clients_that_reset_during_the_handshake_cost_only_their_own_connection(gateway) -> None:
    # A reset while agentd wrote its 401 raised ConnectionClosed out of the handler, through the
    # WebSocket server, and stopped agentd (49 and 76 such connections in two runs): no token needed.
    d, port, token = gateway
    for _ in range(400):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.sendall(_upgrade(port))
        s.close()  # a reset, at once
    assert d.proc is not None and d.proc.poll() is None, d.log_text()[-3000:]
    assert d.agentctl("status", "--json").returncode == 0
    assert "Traceback" not in d.log_text()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # the owner still gets in
        s.sendall(_upgrade(port, token))
        assert s.recv(4096).startswith(b"HTTP/1.1 101")
