"""The control socket: accepts clients, checks who they are, reads frames, dispatches.

Transport below, API above: this module turns frames into calls on the
:class:`~agentd.conversations.ConversationService` and results back into
frames. Every connection has a bounded outbox written by one writer task;
requests run concurrently, each in its own task, so a slow operation never
holds up a connection's other requests or its subscriptions.
"""

from __future__ import annotations

import errno
import os
import socket as _socket
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import structlog
import trio

from . import __version__
from . import contract as c
from . import wire
from .conversations import ConversationService
from .hub import Hub, Subscription

log = structlog.get_logger("agentd.server")

#: How many journal lines one catch-up read takes before yielding.
CATCHUP_CHUNK = 512


class _Connection:
    """One client: a bounded outbox, its subscriptions, and the requests in flight."""

    def __init__(self, server: "Server", stream: trio.abc.Stream, peer: str, buffer: int) -> None:
        self.server = server
        self.stream = stream
        self.peer = peer
        self.send_channel, self.receive_channel = trio.open_memory_channel[bytes](buffer)
        self.subscriptions: dict[int, Subscription] = {}
        self.nursery: trio.Nursery | None = None
        self.closing = False

    # Outbox protocol (see hub.Outbox) -------------------------------------------
    def offer(self, frame: bytes) -> bool:
        try:
            self.send_channel.send_nowait(frame)
            return True
        except trio.WouldBlock:
            return False
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return True  # the connection is going away; nothing to lag

    def lagged(self, sub: Subscription) -> None:
        self.subscriptions.pop(sub.id, None)
        frame = wire.LaggedFrame(
            sub=sub.id,
            conversation=sub.conversation or "",
            resume_after=sub.cursor,
            positions=dict(sub.positions),
        )
        log.info("subscriber.lagged", peer=self.peer, sub=sub.id, resume_after=sub.cursor)
        if self.nursery is not None and not self.closing:
            self.nursery.start_soon(self.send, wire.encode(frame))

    async def send(self, frame: bytes) -> None:
        """Queue a frame, waiting for room (responses; never used by the publisher)."""
        try:
            await self.send_channel.send(frame)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    # Tasks ----------------------------------------------------------------------
    async def writer(self) -> None:
        async with self.receive_channel:
            async for frame in self.receive_channel:
                batch = [frame]
                # Coalesce what is queued already into one write.
                while len(batch) < 256:
                    try:
                        batch.append(self.receive_channel.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                try:
                    await self.stream.send_all(b"".join(batch))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return

    async def lines(self, max_frame: int) -> Any:
        """Yield complete lines; raise LimitExceeded for a line longer than ``max_frame`` bytes."""
        buf = bytearray()
        while True:
            try:
                chunk = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not chunk:
                return
            buf += chunk
            start = 0
            while True:
                nl = buf.find(b"\n", start)
                if nl < 0:
                    break
                if nl - start > max_frame:
                    raise c.LimitExceeded(f"frame of {nl - start} bytes is over the {max_frame}-byte limit")
                yield bytes(buf[start:nl])
                start = nl + 1
            del buf[:start]
            if len(buf) > max_frame:
                raise c.LimitExceeded(f"frame of more than {max_frame} bytes is over the limit")


class Server:
    """Serves the control protocol on a listening socket until cancelled."""

    def __init__(
        self,
        service: ConversationService,
        hub: Hub,
        *,
        max_frame_bytes: int = wire.DEFAULT_MAX_FRAME_BYTES,
        subscriber_buffer: int = 4096,
        max_connections: int = 1024,
        state_dir: Path,
        socket_path: Path,
        check_uid: bool = True,
    ) -> None:
        self.service = service
        self.hub = hub
        self.max_frame_bytes = max_frame_bytes
        self.subscriber_buffer = subscriber_buffer
        self.max_connections = max_connections
        self.state_dir = state_dir
        self.socket_path = socket_path
        self.check_uid = check_uid
        self.started = time.monotonic()
        self.connections = 0
        self._handlers: dict[type, Callable[[_Connection, Any], Awaitable[Any]]] = {
            wire.Status: self._status,
            wire.Providers: self._providers,
            wire.Models: self._models,
            wire.New: self._new,
            wire.List: self._ls,
            wire.Show: self._show,
            wire.Send: self._send,
            wire.Steer: self._steer,
            wire.Cancel: self._cancel,
            wire.AnswerInteraction: self._answer,
            wire.Close: self._close,
            wire.Remove: self._rm,
            wire.SetTitle: self._title,
            wire.Subscribe: self._subscribe,
            wire.Unsubscribe: self._unsubscribe,
        }

    # ------------------------------------------------------------------ listening

    @staticmethod
    def bind_unix(path: Path) -> trio.socket.SocketType:
        """Create the listening socket: directory 0700, socket 0600, a stale socket file replaced.

        Raises OSError(EADDRINUSE) when something answers on ``path``.
        """
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path.parent, 0o700)
        if path.exists():
            probe = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # stale: nobody listens
            else:
                raise OSError(errno.EADDRINUSE, f"something already listens on {path}")
            finally:
                probe.close()
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is born 0600: no window where others could connect
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(512)
        return trio.socket.from_stdlib_socket(sock)

    async def serve(self, listener: trio.socket.SocketType, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Accept connections on ``listener`` until cancelled."""
        sock_listener = trio.SocketListener(listener)
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                try:
                    stream = await sock_listener.accept()
                except OSError as exc:
                    # EMFILE and friends: keep serving everyone else.
                    log.error("server.accept_failed", error=str(exc))
                    await trio.sleep(0.1)
                    continue
                nursery.start_soon(self._serve_connection, stream)

    async def serve_stream(self, stream: trio.abc.Stream, peer: str) -> None:
        """Serve one already-authenticated stream (the WebSocket gateway adapts to this)."""
        await self._serve(stream, peer)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        peer = "?"
        try:
            sock = stream.socket
            if sock.family == _socket.AF_UNIX:
                creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
                pid, uid, _gid = struct.unpack("3i", creds)
                peer = f"pid {pid} uid {uid}"
                if self.check_uid and uid != os.getuid():
                    log.warning("server.peer_refused", peer=peer, reason="uid mismatch")
                    err = c.Unauthorized(f"uid {uid} may not use this agentd (it runs as uid {os.getuid()})")
                    with trio.move_on_after(1):
                        await stream.send_all(wire.encode_error(None, err))
                    return
            await self._serve(stream, peer)
        finally:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()

    async def _serve(self, stream: trio.abc.Stream, peer: str) -> None:
        if self.connections >= self.max_connections:
            err = c.LimitExceeded(f"too many connections (limit {self.max_connections})")
            with trio.move_on_after(1):
                await stream.send_all(wire.encode_error(None, err))
            return
        self.connections += 1
        conn = _Connection(self, stream, peer, self.subscriber_buffer)
        try:
            async with trio.open_nursery() as nursery:
                conn.nursery = nursery
                nursery.start_soon(conn.writer)
                await conn.send(wire.encode(wire.HelloFrame(protocol=wire.PROTOCOL_VERSION, server=__version__, pid=os.getpid())))
                try:
                    await self._read_loop(conn, nursery)
                finally:
                    conn.closing = True
                    for sub in conn.subscriptions.values():
                        self.hub.remove(sub)
                    conn.subscriptions.clear()
                    # Let queued frames drain briefly, then stop.
                    conn.send_channel.close()
                    nursery.cancel_scope.deadline = trio.current_time() + 2
        finally:
            self.connections -= 1

    async def _read_loop(self, conn: _Connection, nursery: trio.Nursery) -> None:
        greeted = False
        try:
            async for line in conn.lines(self.max_frame_bytes):
                if not line.strip():
                    continue
                try:
                    request = wire.decode_request(line)
                except wire.ProtocolError as exc:
                    await conn.send(wire.encode_error(exc.request_id, exc))
                    continue
                if not greeted:
                    if not isinstance(request, wire.Hello):
                        await conn.send(wire.encode_error(request.id, c.Invalid("the first frame must be hello")))
                        return
                    if request.protocol != wire.PROTOCOL_VERSION:
                        err = c.Invalid(
                            f"protocol mismatch: agentd speaks {wire.PROTOCOL_VERSION}, the client {request.protocol}",
                            details={"server": wire.PROTOCOL_VERSION, "client": request.protocol},
                        )
                        await conn.send(wire.encode_error(request.id, err))
                        return
                    greeted = True
                    await conn.send(wire.encode_result(request.id, {"protocol": wire.PROTOCOL_VERSION}))
                    continue
                if isinstance(request, wire.Hello):
                    await conn.send(wire.encode_error(request.id, c.Invalid("hello was already sent")))
                    continue
                nursery.start_soon(self._dispatch, conn, request)
        except c.LimitExceeded as exc:
            log.warning("server.frame_too_large", peer=conn.peer, error=exc.message)
            await conn.send(wire.encode_error(None, exc))

    async def _dispatch(self, conn: _Connection, request: Any) -> None:
        handler = self._handlers[type(request)]
        try:
            result = await handler(conn, request)
        except c.AgentdError as exc:
            await conn.send(wire.encode_error(request.id, exc))
            return
        except Exception as exc:
            log.exception("server.request_failed", op=type(request).__struct_config__.tag)
            await conn.send(wire.encode_error(request.id, c.InternalError(f"{type(exc).__name__}: {exc}")))
            return
        if result is not _NO_REPLY:
            await conn.send(wire.encode_result(request.id, result))

    # ------------------------------------------------------------------ handlers

    async def _status(self, conn: _Connection, req: wire.Status) -> wire.StatusResult:
        return wire.StatusResult(
            version=__version__,
            protocol=wire.PROTOCOL_VERSION,
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - self.started, 3),
            state_dir=str(self.state_dir),
            socket=str(self.socket_path),
            conversations=len(self.service),
            running=self.service.running(),
            providers=self.service.runtimes.names(),
        )

    async def _providers(self, conn: _Connection, req: wire.Providers) -> list[wire.ProviderInfo]:
        return await self.service.runtimes.describe()

    async def _models(self, conn: _Connection, req: wire.Models) -> list[c.Model]:
        return await self.service.runtimes.models(req.provider)

    async def _new(self, conn: _Connection, req: wire.New) -> wire.ConversationRecord:
        return await self.service.create(
            provider=req.provider, workdir=req.workdir, title=req.title, model=req.model, mode=req.mode
        )

    async def _ls(self, conn: _Connection, req: wire.List) -> list[wire.ConversationRecord]:
        return self.service.list(include_closed=req.all)

    async def _show(self, conn: _Connection, req: wire.Show) -> wire.ConversationInfo:
        return await self.service.info(req.conversation)

    async def _send(self, conn: _Connection, req: wire.Send) -> wire.SendResult:
        return await self.service.send(req.conversation, req.text, if_busy=req.if_busy)

    async def _steer(self, conn: _Connection, req: wire.Steer) -> wire.SendResult:
        return await self.service.steer(req.conversation, req.text)

    async def _cancel(self, conn: _Connection, req: wire.Cancel) -> None:
        await self.service.cancel(req.conversation)

    async def _answer(self, conn: _Connection, req: wire.AnswerInteraction) -> None:
        await self.service.answer(req.conversation, req.interaction, req.answer, by=conn.peer)

    async def _close(self, conn: _Connection, req: wire.Close) -> None:
        await self.service.close(req.conversation)

    async def _rm(self, conn: _Connection, req: wire.Remove) -> None:
        await self.service.delete(req.conversation)

    async def _title(self, conn: _Connection, req: wire.SetTitle) -> None:
        await self.service.set_title(req.conversation, req.title)

    async def _unsubscribe(self, conn: _Connection, req: wire.Unsubscribe) -> None:
        sub = conn.subscriptions.pop(req.subscription, None)
        if sub is None:
            raise c.NotFound(f"no subscription {req.subscription}")
        self.hub.remove(sub)

    async def _subscribe(self, conn: _Connection, req: wire.Subscribe) -> Any:
        """Replay after ``req.after``, switch live with no gap or duplicate, then snapshot."""
        if req.id in conn.subscriptions:
            raise c.Invalid(f"subscription id {req.id} is in use on this connection")
        if req.conversation is None:
            sub = Subscription(req.id, None, conn)
            sub.live = True
            conn.subscriptions[req.id] = sub
            self.hub.add(sub)
            await conn.send(wire.encode_result(req.id, wire.SubscribeResult(subscription=req.id)))
            return _NO_REPLY
        live = await self.service.live(req.conversation)
        cid = live.record.id
        if req.after < 0:
            raise c.Invalid("after must be >= 0")
        sub = Subscription(req.id, cid, conn, after=min(req.after, live.published_seq))
        conn.subscriptions[req.id] = sub
        self.hub.add(sub)
        await conn.send(wire.encode_result(req.id, wire.SubscribeResult(subscription=req.id, last_seq=live.published_seq)))
        # Catch up from the journal. Only records already published are read, so a
        # record being fsynced (fsync always) is never sent before it is durable.
        while not sub.closed:
            target = live.published_seq
            if sub.cursor >= target:
                break
            lines = live.journal.read_after(sub.cursor, limit=min(CATCHUP_CHUNK, target - sub.cursor))
            if not lines:
                break
            for line in lines:
                await conn.send(sub.frame(cid, line))
                sub.cursor += 1
            await trio.lowlevel.checkpoint()
        if sub.closed:
            return _NO_REPLY
        # No checkpoint from the last check above to here: the switch is atomic.
        sub.live = True
        if req.snapshot:
            snap = wire.SnapshotFrame(sub=req.id, conversation=cid, snapshot=self.service.snapshot(live))
            if not conn.offer(wire.encode(snap)):
                self.hub.remove(sub)
                conn.lagged(sub)
        return _NO_REPLY


_NO_REPLY = object()
