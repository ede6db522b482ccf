"""The WebSocket gateway: the control protocol's frames over a WebSocket on loopback.

Off by default (``[websocket] enabled``). Each WebSocket text message carries
one frame (the JSON object, without the newline the Unix socket uses); the
frames and their order are exactly those of the Unix socket, because the
gateway hands each accepted WebSocket to the same :class:`~agentd.server.Server`.

Who may connect: a request must carry the bearer token kept in a 0600 file in
the runtime dir, as ``Authorization: Bearer <token>`` or, for browsers that
cannot set headers on a WebSocket, as the query parameter ``?token=<token>``.
A request with an ``Origin`` header (a browser) must come from an allowed
Origin. Refusals are answered 401/403 before the upgrade and logged.
"""

from __future__ import annotations

import hmac
import os
import secrets
import urllib.parse
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, serve_websocket as _serve

from . import _trust
from .logs import register_secret

if TYPE_CHECKING:
    from .config import Config, Paths
    from .server import Server

log = structlog.get_logger("agentd.gateway")


def load_or_create_token(path: Path) -> str:
    """The bearer token in ``path``; a new random one (256 bits) written 0600 when missing or empty.

    The file and its directory must pass the trust rule (:mod:`agentd._trust`:
    ours, a real file not a symlink, the file readable by us alone); raises
    :class:`~agentd._trust.Untrusted` otherwise, so another user's token is never adopted.
    """
    _trust.private_dir(path.parent, "token dir", narrow=False)
    try:
        fd = _trust.open_file(path, os.O_RDWR, "token file", secret=True)
    except FileNotFoundError:
        fd = _trust.open_file(path, os.O_RDWR | os.O_CREAT, "token file", secret=True)
    try:
        token = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if not token:
            token = secrets.token_urlsafe(32)
            os.ftruncate(fd, 0)
            os.pwrite(fd, token.encode() + b"\n", 0)
    finally:
        os.close(fd)
    return token


class _MessageStream(trio.abc.Stream):
    """A WebSocket seen as a byte stream of newline-delimited frames (one message per frame)."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        try:
            message = await self.ws.get_message()
        except ConnectionClosed:
            return b""
        data = message.encode() if isinstance(message, str) else bytes(message)
        return data + b"\n"

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        try:
            for line in bytes(data).split(b"\n"):
                if line:
                    await self.ws.send_message(line.decode())
        except ConnectionClosed:
            raise trio.BrokenResourceError("the WebSocket closed") from None

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        await self.ws.aclose()

    async def aclose(self) -> None:
        await self.ws.aclose()


def _allowed_origins(host: str, port: int, extra: list[str]) -> set[str]:
    return {f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}", *extra}


async def serve_websocket(server: "Server", config: "Config", paths: "Paths", *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the gateway until cancelled; ``task_status.started(port)`` once listening."""
    ws_config = config.websocket
    token = load_or_create_token(paths.token_file)
    register_secret(token)
    expected = f"Bearer {token}".encode()
    allowed: set[str] = set()  # filled once the port is known

    async def handler(request: WebSocketRequest) -> None:
        headers = {k.lower(): v for k, v in request.headers}
        peer = f"{request.remote}"
        origin = headers.get(b"origin")
        if origin is not None and origin.decode(errors="replace") not in allowed:
            log.warning("gateway.refused", peer=peer, reason="origin", origin=origin.decode(errors="replace"))
            await request.reject(403, body=b"origin not allowed\n")
            return
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
        given = headers.get(b"authorization", b"")
        if not given and query.get("token"):
            given = b"Bearer " + query["token"][0].encode()
        if not hmac.compare_digest(given, expected):
            log.warning("gateway.refused", peer=peer, reason="token")
            await request.reject(401, body=b"a bearer token is required\n")
            return
        ws = await request.accept()
        await server.serve_stream(_MessageStream(ws), f"ws {peer}")

    async with trio.open_nursery() as nursery:
        ws_server = await nursery.start(
            partial(_serve, max_message_size=config.server.max_frame_bytes),
            handler,
            ws_config.host,
            ws_config.port,
            None,
        )
        port = ws_server.port
        allowed.update(_allowed_origins(ws_config.host, port, list(ws_config.allowed_origins)))
        log.info("gateway.listening", host=ws_config.host, port=port, token_file=str(paths.token_file))
        task_status.started(port)
