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

Connections that have not passed the token check are bounded, so that
another local user's idle connections cannot use up agentd's descriptors:
at most ``[websocket] max_unauthenticated`` in total and
``max_unauthenticated_per_peer`` per peer (past either, a new connection is
closed at once, before agentd reads a byte), each with
``handshake_timeout_s`` to send its handshake. Past the token check the
connection counts against ``[server] max_connections`` and must send
``hello`` within ``[server] hello_timeout_s``, as on the Unix socket.

A peer is the local user behind a loopback connection (the uid the kernel
names for its socket, :func:`loopback_peer_socket`), else its address: every
local user connects from 127.0.0.1, and keyed by address another user's idle
connections took the owner's share.
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import os
import secrets
import socket
import struct
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, WebSocketRequest, WebSocketServer

from . import _trust, agent_peers
from .contract import AgentdError
from .logs import register_secret

if TYPE_CHECKING:
    from .config import Config, Paths
    from .server import Server

log = structlog.get_logger("agentd.gateway")


class GatewayUnavailable(AgentdError):
    """The gateway cannot listen on its ``[websocket]`` host and port; agentd does not start (exit 1:
    a restart can help once the port is free). Example text: ``the WebSocket gateway cannot listen
    on 127.0.0.1:8765: [Errno 98] Address already in use; ...``."""

    code = "internal"
    exit_code = 1

    def __init__(self, host: str, port: int, exc: OSError) -> None:
        hint = ""
        if exc.errno == errno.EADDRINUSE:
            # Another local user may hold it on purpose: clients that connect there hand it the token.
            hint = ("; another process holds that port (`ss -ltnp`), and WebSocket clients that connect "
                    "there would send it their token: free the port or choose another ([websocket] port)")
        super().__init__(f"the WebSocket gateway cannot listen on {host}:{port}: {exc}{hint}",
                         details={"host": host, "port": port})


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


_NETLINK_SOCK_DIAG = 4  # linux/netlink.h
_SOCK_DIAG_BY_FAMILY = 20  # linux/sock_diag.h
_NLM_F_REQUEST = 1
_NLMSG = struct.Struct("=IHHII")  # struct nlmsghdr
_INET_DIAG_NOCOOKIE = 0xFFFFFFFF
#: where inet_diag_msg's idiag_uid (then idiag_inode) lies: after its 4 one-byte fields, the
#: 48-byte socket id and expires, rqueue, wqueue (linux/inet_diag.h)
_UID_AT = _NLMSG.size + 4 + 48 + 12


def loopback_peer_socket(peer: tuple[str, int], local: tuple[str, int]) -> tuple[int, int] | None:
    """(uid, inode) of the TCP socket at ``peer`` (host, port) connected to ``local`` on this
    host, asked of the kernel by sock_diag netlink (what ``ss -e`` shows), one exact lookup;
    None when it cannot say (not Linux, no such socket, a peer on another host).
    """
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(peer[0]).version == 6 else socket.AF_INET

        def addr(host: str) -> bytes:
            return socket.inet_pton(family, host).ljust(16, b"\0")

        # struct inet_diag_req_v2, its id seen from the peer's socket: src = the peer, dst = us
        sockid = struct.pack("!HH", peer[1], local[1]) + addr(peer[0]) + addr(local[0]) \
            + struct.pack("=III", 0, _INET_DIAG_NOCOOKIE, _INET_DIAG_NOCOOKIE)
        req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.sendto(_NLMSG.pack(_NLMSG.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0) + req, (0, 0))
            data = nl.recv(65536)
        if len(data) < _UID_AT + 8 or _NLMSG.unpack_from(data)[1] != _SOCK_DIAG_BY_FAMILY:
            return None  # NLMSG_ERROR: no such socket here
        uid, inode = struct.unpack_from("=II", data, _UID_AT)
        return int(uid), int(inode)
    except (OSError, ValueError, AttributeError):  # AttributeError: no AF_NETLINK (not Linux)
        return None


def _peer(address: str, port: int, stream: trio.SocketStream) -> tuple[str, int]:
    """Whose connection this is, for the per-peer cap: ``uid N`` when the kernel says (the gateway
    listens on loopback, so every client is on this host, whatever its source address), else the
    address; and the inode of the client's socket (0 when the kernel does not say)."""
    local = stream.socket.getsockname()
    found = loopback_peer_socket((address.split("%", 1)[0], port), (local[0], local[1]))
    if found is not None:
        return f"uid {found[0]}", found[1]
    return address, 0


class _Admission:
    """The connections not yet past the token check: counted in total and per peer (_peer)."""

    def __init__(self, total: int, per_peer: int) -> None:
        self.total = total
        self.per_peer = per_peer
        #: "address:port" of the connection -> (its peer, its stream, its client socket's inode or
        #: 0), until it passes or fails the token check
        self.pending: dict[str, tuple[str, trio.SocketStream, int]] = {}
        self.by_peer: dict[str, int] = {}
        self.refused = 0

    def admit(self, name: str, peer: str, stream: trio.SocketStream, inode: int = 0) -> bool:
        self.settle(name)  # the same peer address and port again: the earlier connection is gone
        if len(self.pending) >= self.total or self.by_peer.get(peer, 0) >= self.per_peer:
            self.refused += 1
            return False
        self.pending[name] = (peer, stream, inode)
        self.by_peer[peer] = self.by_peer.get(peer, 0) + 1
        return True

    def settle(self, name: str) -> None:
        """The connection passed or failed the token check, or closed: it no longer counts."""
        entry = self.pending.pop(name, None)
        if entry is None:
            return
        peer = entry[0]
        left = self.by_peer[peer] - 1
        if left:
            self.by_peer[peer] = left
        else:
            del self.by_peer[peer]

    def sweep(self) -> None:
        # A backstop: a connection closed by a path that never called _Counted.aclose.
        for name, (_, stream, _inode) in list(self.pending.items()):
            if stream.socket.fileno() < 0:
                self.settle(name)


class _Counted(trio.abc.HalfCloseableStream):
    """An admitted connection that stops counting the moment it is closed (a handshake that timed
    out included), so a client that sees the close and reconnects at once finds its slot free."""

    def __init__(self, stream: trio.SocketStream, admission: _Admission, name: str) -> None:
        self._stream = stream
        self._admission = admission
        self._name = name

    def __repr__(self) -> str:
        # What trio-websocket's request.remote is for a stream other than its own: the handler
        # settles the connection by it once the token check is done.
        return self._name

    @property
    def socket(self) -> Any:  # trio-websocket reads the peer's address from it
        return self._stream.socket

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._stream.receive_some(max_bytes)

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        self._admission.settle(self._name)
        await self._stream.aclose()


class _AdmittingListener(trio.abc.Listener[trio.SocketStream]):
    """A TCP listener that closes a new connection at once when the unauthenticated caps are full."""

    def __init__(self, inner: trio.SocketListener, admission: _Admission) -> None:
        self.inner = inner
        self.admission = admission

    async def accept(self) -> trio.SocketStream:
        while True:
            stream = await self.inner.accept()
            try:
                address, port, *_ = stream.socket.getpeername()
            except OSError:
                await stream.aclose()
                continue
            name = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
            peer, inode = _peer(address, port, stream)
            if self.admission.admit(name, peer, stream, inode):
                return _Counted(stream, self.admission, name)  # type: ignore[return-value]
            if self.admission.refused % 1000 == 1:  # a flood logs now and then, not once per connection
                log.warning("gateway.refused", peer=name, who=peer,
                            reason="too many unauthenticated connections", refused=self.admission.refused)
            await stream.aclose()

    async def aclose(self) -> None:
        await self.inner.aclose()


def _allowed_origins(host: str, port: int, extra: list[str]) -> set[str]:
    return {f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}", *extra}


async def serve_websocket(server: "Server", config: "Config", paths: "Paths", *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the gateway until cancelled; ``task_status.started(port)`` once listening."""
    ws_config = config.websocket
    token = load_or_create_token(paths.token_file)
    register_secret(token)
    expected = f"Bearer {token}".encode()
    allowed: set[str] = set()  # filled once the port is known

    admission = _Admission(ws_config.max_unauthenticated, ws_config.max_unauthenticated_per_peer)

    async def handler(request: WebSocketRequest) -> None:
        remote = request.remote  # the _Counted stream's name, "address:port"
        entry = admission.pending.get(str(remote))
        inode = entry[2] if entry is not None else 0
        try:
            ws = await _authenticate(request)
        except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
            # The client went away mid-handshake (a reset while the answer was sent): that ends its
            # own connection only. Raised out of here it ended the WebSocket server, and agentd.
            ws = None
        finally:
            admission.settle(str(remote))
        if ws is None:
            # Refused or gone: closed now. trio-websocket (0.12) leaves a refused connection's
            # socket open until the client closes it, and a refused one no longer counts against
            # the caps, so another user could hold every descriptor agentd has that way.
            if entry is not None:
                await entry[1].aclose()  # its reader task sees the close and ends
            return
        # Past the token, as the scan of /proc costs more than the check (agentd.agent_peers).
        agent = await trio.to_thread.run_sync(agent_peers.of_socket, inode)
        peer = f"ws {remote}" if agent is None else f"ws {remote} (agent, keeper {agent.keeper})"
        await server.serve_stream(_MessageStream(ws), peer, agent=agent)

    async def _authenticate(request: WebSocketRequest) -> WebSocketConnection | None:
        headers = {k.lower(): v for k, v in request.headers}
        peer = f"{request.remote}"
        origin = headers.get(b"origin")
        if origin is not None and origin.decode(errors="replace") not in allowed:
            log.warning("gateway.refused", peer=peer, reason="origin", origin=origin.decode(errors="replace"))
            await request.reject(403, body=b"origin not allowed\n")
            return None
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(request.path).query)
        given = headers.get(b"authorization", b"")
        if not given and query.get("token"):
            given = b"Bearer " + query["token"][0].encode()
        if not hmac.compare_digest(given, expected):
            log.warning("gateway.refused", peer=peer, reason="token")
            await request.reject(401, body=b"a bearer token is required\n")
            return None
        return await request.accept()

    try:
        listeners = await trio.open_tcp_listeners(ws_config.port, host=ws_config.host)
    except OSError as exc:
        raise GatewayUnavailable(ws_config.host, ws_config.port, exc) from None
    port = listeners[0].socket.getsockname()[1]
    ws_server = WebSocketServer(
        handler,
        [_AdmittingListener(listener, admission) for listener in listeners],
        max_message_size=config.server.max_frame_bytes,
        connect_timeout=ws_config.handshake_timeout_s,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(ws_server.run)
        allowed.update(_allowed_origins(ws_config.host, port, list(ws_config.allowed_origins)))
        log.info("gateway.listening", host=ws_config.host, port=port, token_file=str(paths.token_file))
        task_status.started(port)
        while True:
            await trio.sleep(min(0.25, ws_config.handshake_timeout_s / 4))
            admission.sweep()
