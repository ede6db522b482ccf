"""The WebSocket gateway: same frames as the Unix socket, behind a bearer token and an Origin check."""

from __future__ import annotations

import json
import socket
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
