"""The control socket: accepts clients, checks who they are, reads frames, dispatches.

Transport below, API above: this module turns frames into calls on the
:class:`~agentd.conversations.ConversationService` and results back into
frames. Every connection has a bounded outbox written by one writer task;
requests run concurrently, each in its own task, so a slow operation never
holds up a connection's other requests or its subscriptions.

Every client is bounded (issue 12, "bounded clients"), so one that pipelines
without reading, subscribes without end or never speaks costs agentd a fixed
amount: at most ``server.max_requests_in_flight`` requests of a connection run
at once, and past that agentd stops reading from it (the kernel's socket
buffers then push back on the client); the outbox holds at most
``server.subscriber_buffer`` frames and ``server.outbox_bytes`` bytes (a
response waits for room, a subscriber past it gets ``lagged``); at most
``server.max_subscriptions`` subscriptions per connection (past it: ``limit``);
a connection that has not sent ``hello`` within ``server.hello_timeout_s`` is
sent an ``invalid`` error and closed, and before it, a frame may be at most
:data:`PRE_HELLO_MAX_FRAME_BYTES`. A reply that may be large (:data:`LARGE_REPLIES`:
an export, a history page, a tool's output, the task list) is built one at a time
per connection, only once the outbox has room (the client took the one before;
a subscription's catch-up counts as one),
and exports render :data:`EXPORTS_AT_ONCE` at a time daemon-wide; a reply over
the frame a client reads (``wire.CLIENT_MAX_FRAME_BYTES``) is a ``limit`` error
saying so, never a frame the client must refuse.
"""

from __future__ import annotations

import errno
import math
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

from . import __version__, _trust, agent_peers
from . import contract as c
from . import masking, wire
from . import tool_outputs as _tool_outputs
from .conversations import ConversationService
from .hub import Hub, Subscription

log = structlog.get_logger("agentd.server")

#: How many journal lines one catch-up read takes before yielding.
CATCHUP_CHUNK = 512


class _Connection:
    """One client: a bounded outbox, its subscriptions, and the requests in flight."""

    def __init__(self, server: "Server", stream: trio.abc.Stream, peer: str, buffer: int, *, may_stop: bool = False,
                 buffer_bytes: int = 32 << 20, in_flight: int = 64, agent: agent_peers.AgentPeer | None = None) -> None:
        self.server = server
        self.stream = stream
        self.peer = peer
        #: this client may stop the daemon (``shutdown``): it came through the Unix socket with
        #: the daemon's own uid; never a WebSocket gateway client
        self.may_stop = may_stop
        #: set when an agent's own processes opened this connection: it may make
        #: agent_peers.OPS only (logged once when it asks for more)
        self.agent = agent
        self.agent_refused = False
        # The outbox: frames queued for the writer, at most ``buffer`` of them. A plain list and
        # two events rather than a memory channel: offer() runs once per frame per subscriber
        # on the publisher's path, and the writer takes the whole list in one go. An entry may
        # hold several frames (offer_many); _count counts frames, _bytes their size.
        self._frames: list[bytes] = []
        self._count = 0
        self._bytes = 0
        self._limit = buffer
        self._byte_limit = buffer_bytes
        #: requests of this connection running now; the reader waits for a slot (back-pressure)
        self.in_flight = trio.Semaphore(in_flight)
        self._wake: trio.Event | None = None  # the writer waits for frames
        self._room: trio.Event | None = None  # send() waits for room
        self._shut = False  # no frame is queued any more: the connection is going away
        self._sending = False  # the writer is inside send_all
        self._ended = False  # the writer returned
        # A plain socket is written through while its writer is idle (see _queue).
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        self.subscriptions: dict[int, Subscription] = {}
        self.nursery: trio.Nursery | None = None
        self.closing = False
        #: set once the last request read has begun: lines() reads the socket again only then
        self.read_after: trio.Event | None = None
        #: hello was answered: lines() takes frames of server.max_frame_bytes, not PRE_HELLO_MAX_FRAME_BYTES
        self.greeted = False
        #: held while a reply that may be large (LARGE_REPLIES) is built and queued: one at a time
        self.large_reply = trio.Lock()

    # Outbox protocol (see hub.Outbox) -------------------------------------------
    def offer(self, frame: bytes) -> bool:
        if self._shut:
            return True  # the connection is going away; nothing to lag
        if self._full():
            return False
        self._queue(frame, 1)
        return True

    def offer_many(self, frames: bytes, count: int) -> bool:
        if self._shut:
            return True
        # An empty outbox takes a burst of any size (at most PUMP_BATCH frames past the limit):
        # a subscriber that keeps up is never cut off because a burst outgrew its buffer.
        if self._count and (self._count + count > self._limit or self._bytes + len(frames) > self._byte_limit):
            return False
        self._queue(frames, count)
        return True

    def _full(self) -> bool:
        # An empty outbox takes one frame of any size (a large response still goes out).
        return self._count >= self._limit or (self._count > 0 and self._bytes >= self._byte_limit)

    def _queue(self, data: bytes, count: int) -> None:
        wake = self._wake
        if wake is None:
            self._frames.append(data)  # the writer is busy (or not started): it takes it next
            self._count += count
            self._bytes += len(data)
            return
        # The writer is idle, so nothing is queued: write through now, as asyncio's transports
        # do, saving a task switch per frame (latency); only what the socket does not take
        # right away waits for the writer. A socket error is left for the writer to report.
        if self._fd >= 0:
            try:
                n = os.write(self._fd, data)
            except OSError:
                n = 0
            if n == len(data):
                return
            data = data[n:]
        self._frames.append(data)
        self._count += count
        self._bytes += len(data)
        self._wake = None
        wake.set()

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

    async def room(self) -> None:
        """Wait until the outbox has room for a frame (or the connection is going away)."""
        while not self._shut and self._full():
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()

    async def send(self, frame: bytes) -> None:
        """Queue a frame, waiting for room (responses and catch-up; never used by the publisher).

        Yields only to wait for room (raising Cancelled then, as any
        checkpoint); dropped once the connection is going away.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        await self.room()
        if not self.offer(frame):  # pragma: no cover - room was just checked, with no checkpoint since
            raise AssertionError("outbox full after waiting for room")

    async def send_many(self, frames: bytes, count: int) -> None:
        """Queue ``count`` frames joined in ``frames``, waiting for room for all of them (or an empty outbox)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._shut and self._count and (
            self._count + count > self._limit or self._bytes + len(frames) > self._byte_limit
        ):
            if self._room is None:
                self._room = trio.Event()
            await self._room.wait()
        if not self._shut:
            self._queue(frames, count)

    def shut(self) -> None:
        """Accept no more frames; the writer sends what is queued, then returns."""
        self._shut = True
        for event in (self._wake, self._room):
            if event is not None:
                event.set()
        self._wake = self._room = None

    async def drain(self, timeout: float = 1.0) -> None:
        """Wait (``timeout`` at most) until every frame queued so far was handed to the socket."""
        with trio.move_on_after(timeout):
            while (self._frames or self._sending) and not self._ended:
                await trio.sleep(0.005)

    # Tasks ----------------------------------------------------------------------
    async def writer(self) -> None:
        """Send queued frames, everything queued at once in one ``send_all``, until shut and drained."""
        try:
            while True:
                frames = self._frames
                if not frames:
                    if self._shut:
                        return
                    self._wake = wake = trio.Event()
                    await wake.wait()
                    continue
                self._frames = []
                self._count = 0
                self._bytes = 0
                room = self._room
                if room is not None:
                    self._room = None
                    room.set()
                self._sending = True
                try:
                    await self.stream.send_all(frames[0] if len(frames) == 1 else b"".join(frames))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                finally:
                    self._sending = False
        finally:
            self._ended = True
            self.shut()
            self._frames = []
            self._count = 0
            self._bytes = 0

    async def lines(self) -> Any:
        """Yield complete lines; raise LimitExceeded for a line longer than PRE_HELLO_MAX_FRAME_BYTES
        before hello, server.max_frame_bytes after (:meth:`_max_frame`, read at each line)."""
        buf = bytearray()
        while True:
            if self.read_after is not None:
                await self.read_after.wait()
                self.read_after = None
            try:
                chunk = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not chunk:
                return
            scan = len(buf)  # the bytes before were searched already: no quadratic rescans of a long frame
            buf += chunk
            start = 0
            max_frame = self._max_frame()
            while True:
                nl = buf.find(b"\n", max(start, scan))
                if nl < 0:
                    break
                if nl - start > max_frame:
                    raise c.LimitExceeded(_too_long(nl - start, max_frame, greeted=self.greeted))
                yield bytes(buf[start:nl])
                start = nl + 1
                max_frame = self._max_frame()
            del buf[:start]
            if len(buf) > max_frame:
                raise c.LimitExceeded(_too_long(len(buf), max_frame, greeted=self.greeted, at_least=True))

    def _max_frame(self) -> int:
        return self.server.max_frame_bytes if self.greeted else PRE_HELLO_MAX_FRAME_BYTES


#: The longest frame a connection may send before its hello is answered, bytes. A hello is a few
#: dozen bytes; without this, every connection could hold server.max_frame_bytes (16 MiB) of an
#: unfinished first frame, 16 GiB over max_connections, before saying who it is.
PRE_HELLO_MAX_FRAME_BYTES = 64 << 10


def _too_long(size: int, limit: int, *, greeted: bool, at_least: bool = False) -> str:
    what = f"frame of {'more than ' if at_least else ''}{size} bytes is over the {limit}-byte limit"
    if not greeted:
        return f"{what} before hello (the first frame must be hello)"
    return f"{what} (server.max_frame_bytes; a prompt's attachments count, base64-encoded)"


def _snapshot_frame(sub: int, cid: str, snapshot: wire.Snapshot) -> bytes:
    """The snapshot frame, never over what a client accepts (wire.CLIENT_MAX_FRAME_BYTES).

    An in-flight item holds every delta streamed so far, up to the provider's 64 MiB ceiling,
    so a frame of it could pass the client's limit (agentctl then gives up on the connection:
    a slow follower resubscribing after a lag mid-way through a huge answer). Each text then
    keeps only its latest part, behind a line saying how much was cut; the item's own record,
    when it ends, carries what the provider kept.
    """
    frame = masking.mask_json(wire.encode(wire.SnapshotFrame(sub=sub, conversation=cid, snapshot=snapshot)))
    keep = wire.CLIENT_MAX_FRAME_BYTES // 8
    while len(frame) > wire.CLIENT_MAX_FRAME_BYTES and keep:
        cut = [
            msgspec.structs.replace(item, text=f"[{len(item.text) - keep:,} characters before this cut from the "
                                               "snapshot]\n" + item.text[-keep:])
            if len(item.text) > keep else item
            for item in snapshot.items
        ]
        trimmed = msgspec.structs.replace(snapshot, items=cut)
        frame = masking.mask_json(wire.encode(wire.SnapshotFrame(sub=sub, conversation=cid, snapshot=trimmed)))
        keep //= 4
    return frame


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
        outbox_bytes: int = 32 << 20,
        max_requests_in_flight: int = 64,
        max_subscriptions: int = 256,
        hello_timeout_s: float = 5.0,
        state_dir: Path,
        socket_path: Path,
        check_uid: bool = True,
    ) -> None:
        self.service = service
        self.hub = hub
        self.max_frame_bytes = max_frame_bytes
        self.subscriber_buffer = subscriber_buffer
        self.max_connections = max_connections
        self.outbox_bytes = outbox_bytes
        self.max_requests_in_flight = max_requests_in_flight
        self.max_subscriptions = max_subscriptions
        self.hello_timeout_s = hello_timeout_s
        self.state_dir = state_dir
        self.socket_path = socket_path
        self.check_uid = check_uid
        self.started = time.monotonic()
        self.connections = 0
        #: of those, the connections of agent peers (agentd.agent_peers), in all and by keeper
        self.agent_connections = 0
        self._agent_by_keeper: dict[int, int] = {}
        self._exports = trio.CapacityLimiter(EXPORTS_AT_ONCE)
        self._handlers: dict[type, Callable[[_Connection, Any], Awaitable[Any]]] = {
            wire.Status: self._status,
            wire.Hosts: self._hosts,
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
            wire.SetBudget: self._budget,
            wire.Continue: self._continue,
            wire.Export: self._export,
            wire.History: self._history,
            wire.SetModel: self._set_model,
            wire.ImportList: self._import_list,
            wire.ImportSession: self._import_session,
            wire.Restart: self._restart,
            wire.Fork: self._fork,
            wire.Rewind: self._rewind,
            wire.ListCommands: self._commands,
            wire.RunCommand: self._run_command,
            wire.ListSubagents: self._subagents,
            wire.CancelSubagent: self._subagent_cancel,
            wire.PromptSubagent: self._subagent_prompt,
            wire.AccountRequest: self._account,
            wire.Login: self._login,
            wire.LoginWait: self._login_wait,
            wire.Logout: self._logout,
            wire.QuotaRequest: self._quota,
            wire.Diff: self._diff,
            wire.Revert: self._revert,
            wire.McpList: self._mcp_ls,
            wire.McpStatus: self._mcp_status,
            wire.RegisterTool: self._register_tool,
            wire.UnregisterTool: self._unregister_tool,
            wire.NextToolCall: self._next_tool_call,
            wire.ToolResult: self._tool_result,
            wire.ListHostTools: self._list_host_tools,
            wire.CallHostTool: self._call_host_tool,

            wire.ShowItem: self._show_item,
            wire.TaskCreate: self._task_create,
            wire.TaskList: self._task_ls,
            wire.TaskShow: self._task_show,
            wire.TaskCancel: self._task_cancel,
            wire.TaskAddComment: self._task_comment,
            wire.Shutdown: self._shutdown,
        }
        #: the daemon's TaskService (set by the daemon; None = task ops answer unsupported)
        self.tasks: Any = None
        #: the daemon's agentd.reload.Reloader (None = restart answers unsupported)
        self.reloader: Any = None
        #: the daemon's agentd.mcp.McpRoom (set by the daemon; None = no MCP servers)
        self.mcp: Any = None
        #: the daemon's agentd.host_tools.HostTools (set by the daemon; None = host tool ops unsupported)
        self.host_tools: Any = None
        #: on a shared store, agentd.hosts.Peers (it carries runtime commands to the conversation's host)
        self.peers: Any = None
        #: set once a client asked the daemon to stop (``shutdown``), after its answer was sent;
        #: the daemon then stops as on SIGTERM (see agentd.daemon)
        self.stop_requested = trio.Event()
        #: who asked, for the log
        self.stop_requested_by = ""

    # ------------------------------------------------------------------ listening

    @staticmethod
    def bind_unix(path: Path) -> trio.socket.SocketType:
        """Create the listening socket: socket 0600, a stale socket file replaced.

        The path and its directory must pass the trust rule (:mod:`agentd._trust`);
        raises :class:`~agentd._trust.Untrusted` when the path is too long for
        AF_UNIX or something other than a socket is there (it is never deleted),
        OSError(EADDRINUSE) when something answers on ``path``.
        """
        _trust.private_dir(path.parent, "socket dir", narrow=False)
        if _trust.check_socket_path(path):
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
        old = os.umask(0o177)  # the socket is born 0600 (no chmod after): no window where others could connect
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
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

    async def serve_stream(self, stream: trio.abc.Stream, peer: str, *, agent: agent_peers.AgentPeer | None = None) -> None:
        """Serve one already-authenticated stream (the WebSocket gateway adapts to this).

        Such a client may use every op but ``shutdown``: only the Unix socket's
        own-uid clients may stop the daemon. ``agent``: the stream comes from an agent's
        own processes, which may make :data:`agent_peers.OPS` only.
        """
        await self._serve(stream, peer, agent=agent)

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        peer = "?"
        may_stop = False
        agent = None
        try:
            sock = stream.socket
            if sock.family == _socket.AF_UNIX:
                creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, struct.calcsize("3i"))
                pid, uid, _gid = struct.unpack("3i", creds)
                peer = f"pid {pid} uid {uid}"
                if self.check_uid and uid != os.getuid():
                    log.warning("server.peer_refused", peer=peer, reason="uid mismatch")
                    err = c.Unauthorized(f"uid {uid} may not use this agentd (it runs as uid {os.getuid()})")
                    await _refuse(stream, err)
                    return
                agent = agent_peers.of_process(pid)
                may_stop = uid == os.getuid()
                if agent is not None:
                    peer = f"{peer} (agent, keeper {agent.keeper})"
            await self._serve(stream, peer, may_stop=may_stop, agent=agent)
        finally:
            with trio.move_on_after(1) as scope:
                scope.shield = True
                await stream.aclose()

    async def _serve(self, stream: trio.abc.Stream, peer: str, *, may_stop: bool = False,
                     agent: agent_peers.AgentPeer | None = None) -> None:
        if self.connections >= self.max_connections:
            err = c.LimitExceeded(f"too many connections (limit {self.max_connections})")
            await _refuse(stream, err)
            return
        if agent is not None and (err := self._agent_limit(agent)) is not None:
            log.warning("server.agent_refused", peer=peer, op="connect", connections=self.agent_connections)
            await _refuse(stream, err)
            return
        self.connections += 1
        if agent is not None:
            self.agent_connections += 1
            self._agent_by_keeper[agent.keeper] = self._agent_by_keeper.get(agent.keeper, 0) + 1
        conn = _Connection(self, stream, peer, self.subscriber_buffer, may_stop=may_stop,
                           buffer_bytes=self.outbox_bytes, in_flight=self.max_requests_in_flight, agent=agent)
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
                    conn.shut()
                    nursery.cancel_scope.deadline = trio.current_time() + 2
        except Exception:
            # A bug met by one connection ends that connection, never the daemon.
            log.exception("server.connection_failed", peer=peer)
        finally:
            self.connections -= 1
            if agent is not None:
                self.agent_connections -= 1
                if left := self._agent_by_keeper[agent.keeper] - 1:
                    self._agent_by_keeper[agent.keeper] = left
                else:
                    del self._agent_by_keeper[agent.keeper]

    def _agent_limit(self, agent: agent_peers.AgentPeer) -> c.LimitExceeded | None:
        """Why one more connection of ``agent`` is refused, or None (agent_peers.kept_for_users, share_of_one)."""
        limit = self.max_connections
        if self.agent_connections >= limit - agent_peers.kept_for_users(limit):
            return c.LimitExceeded(f"agents' processes hold {self.agent_connections} connections, all of "
                                   f"[server] max_connections = {limit} but those kept for you")
        held = self._agent_by_keeper.get(agent.keeper, 0)
        if held >= agent_peers.share_of_one(limit):
            return c.LimitExceeded(f"this agent's processes hold {held} connections, one agent's share of "
                                   f"[server] max_connections = {limit}")
        return None

    async def _read_loop(self, conn: _Connection, nursery: trio.Nursery) -> None:
        # Until hello: a connection that says nothing holds a descriptor and a slot for nobody.
        hello_scope = trio.CancelScope(deadline=trio.current_time() + self.hello_timeout_s)
        try:
            with hello_scope:
                async for line in conn.lines():
                    if not line.strip():
                        continue
                    try:
                        request = wire.decode_request(line)
                    except wire.ProtocolError as exc:
                        await conn.send(wire.encode_error(exc.request_id, exc))
                        continue
                    if not conn.greeted:
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
                        conn.greeted = True
                        hello_scope.deadline = math.inf
                        hello = {"protocol": wire.PROTOCOL_VERSION, "max_frame_bytes": self.max_frame_bytes,
                                 "max_attachment_bytes": self.service.attachments.max_bytes}
                        await conn.send(wire.encode_result(request.id, hello))
                        continue
                    if isinstance(request, wire.Hello):
                        await conn.send(wire.encode_error(request.id, c.Invalid("hello was already sent")))
                        continue
                    # Back-pressure: with every slot taken, stop reading; the client's writes then
                    # block on full socket buffers instead of agentd holding a task per line. A free
                    # slot is taken without a scheduler pass (reading the next line waits anyway).
                    try:
                        conn.in_flight.acquire_nowait()
                    except trio.WouldBlock:
                        await conn.in_flight.acquire()
                    # The request's first step runs before this reader reads the socket again
                    # (conn.lines): a prompt then reaches its runtime (journaled and written to its
                    # stdin in that one step) without waiting behind the read and its re-arming.
                    conn.read_after = started = trio.Event()
                    nursery.start_soon(self._dispatch, conn, request, started)
        except c.LimitExceeded as exc:
            log.warning("server.frame_too_large", peer=conn.peer, error=exc.message)
            await conn.send(wire.encode_error(None, exc))
        if hello_scope.cancelled_caught:
            log.warning("server.hello_timeout", peer=conn.peer, timeout_s=self.hello_timeout_s)
            err = c.Invalid(f"no hello within {self.hello_timeout_s:g} s (server.hello_timeout_s); closing")
            conn.offer(wire.encode_error(None, err))

    async def _dispatch(self, conn: _Connection, request: Any, started: trio.Event) -> None:
        started.set()
        try:
            await self._answer_request(conn, request)
        finally:
            conn.in_flight.release()

    async def _answer_request(self, conn: _Connection, request: Any) -> None:
        if type(request) not in LARGE_REPLIES:
            await self._reply(conn, request)
            return
        # A reply that may be tens of MB is built only once the client took the last one, and one
        # at a time: a client that asks for many and reads none holds one, not max_requests_in_flight.
        async with conn.large_reply:
            await conn.room()
            await self._reply(conn, request)

    async def _reply(self, conn: _Connection, request: Any) -> None:
        handler = self._handlers[type(request)]
        try:
            if conn.agent is not None:
                self._check_agent(conn, request)
            if self.peers is not None and type(request) in self.peers.carried:
                # A shared store: the host that runs the conversation answers (agentd.hosts).
                frame = await self.peers.carry(request)
                if frame is not None:
                    if len(frame) - 1 > wire.CLIENT_MAX_FRAME_BYTES:  # as a reply built here would be
                        frame = _too_large(request, len(frame) - 1)
                    await conn.send(frame)
                    return
            result = await handler(conn, request)
        except c.AgentdError as exc:
            await conn.send(masking.mask_json(wire.encode_error(request.id, exc)))
            return
        except Exception as exc:
            log.exception("server.request_failed", op=type(request).__struct_config__.tag)
            await conn.send(masking.mask_json(wire.encode_error(request.id, c.InternalError(f"{type(exc).__name__}: {exc}"))))
            return
        if result is not _NO_REPLY:
            # Answers carry state kept from agent text (titles, errors, interactions): secrets out.
            try:
                frame = masking.mask_json(wire.encode_result(request.id, result))
            except Exception as exc:  # text no reply can hold: this request fails, the connection stays
                log.exception("server.reply_unencodable", op=type(request).__struct_config__.tag)
                frame = wire.encode_error(request.id, c.InternalError(f"the reply could not be encoded: {type(exc).__name__}"))
            if len(frame) - 1 > wire.CLIENT_MAX_FRAME_BYTES:
                frame = _too_large(request, len(frame) - 1)
            await conn.send(frame)

    def _check_agent(self, conn: _Connection, request: Any) -> None:
        """Raise for what an agent peer may not ask (agentd.agent_peers): an op other than its
        host tools', a conversation not named by its full id (no prefix search that lists ids),
        or one whose runtime does not run under the peer's keeper (another agent's tools)."""
        assert conn.agent is not None
        op = type(request).__struct_config__.tag
        if type(request) in agent_peers.OPS:
            try:
                named = self.service.resolve(request.conversation)
            except c.AgentdError:
                named = ""
            if named != request.conversation:
                raise c.NotFound(f"no conversation {request.conversation!r} (an agent names its conversation by its full id)")
            if conn.agent.keeper and conn.agent.keeper in self.service.keepers(named):
                return
            refusal = conn.agent.refusal_of(str(op), named)
            why = {"conversation": named, "reason": "the conversation does not run under this agent's keeper"}
        else:
            refusal, why = conn.agent.refusal(str(op)), {}
        if not conn.agent_refused:  # once per connection: an agent asking in a loop does not fill the log
            conn.agent_refused = True
            log.warning("server.agent_refused", peer=conn.peer, op=op, **why)
        raise refusal

    # ------------------------------------------------------------------ handlers

    async def _status(self, conn: _Connection, req: wire.Status) -> wire.StatusResult:
        closed = self.service.closed()
        return wire.StatusResult(
            version=__version__,
            protocol=wire.PROTOCOL_VERSION,
            pid=os.getpid(),
            uptime_s=round(time.monotonic() - self.started, 3),
            state_dir=str(self.state_dir),
            socket=str(self.socket_path),
            conversations=len(self.service) - closed,
            running=self.service.running(),
            closed=closed,
            providers=self.service.runtimes.names(),
        )

    async def _hosts(self, conn: _Connection, req: wire.Hosts) -> wire.HostsResult:
        if self.peers is None:
            raise c.Unsupported('this agentd keeps its conversations in files: it is the only host '
                                '(several hosts share a [store] backend = "postgres"; docs/scale-out.md)')
        return await self.peers.hosts()

    async def _providers(self, conn: _Connection, req: wire.Providers) -> list[wire.ProviderInfo]:
        from . import accounts

        return await accounts.describe(self.service.runtimes, req.provider)

    async def _models(self, conn: _Connection, req: wire.Models) -> list[c.Model]:
        return await self.service.runtimes.models(req.provider)

    async def _new(self, conn: _Connection, req: wire.New) -> wire.ConversationRecord:
        from . import models

        provider = self.service.runtimes.pick(req.provider)
        if req.model or req.effort or req.context_tier:
            await models.check_choice(self.service.runtimes, provider, req.model, req.effort, req.context_tier)
        mcp = None
        if self.mcp is not None:
            caps = (await self.service.runtimes.get(provider)).capabilities()
            mcp = self.mcp.choose(provider, caps, req.mcp)
        elif req.mcp:
            raise c.Invalid("no MCP servers are configured")
        return await self.service.create(
            provider=provider, workdir=req.workdir, title=req.title, model=req.model, effort=req.effort,
            mode=req.mode, budget=req.budget, context_tier=req.context_tier, mcp=mcp,
        )

    async def _restart(self, conn: _Connection, req: wire.Restart) -> wire.RestartResult:
        if self.reloader is None:
            raise c.Unsupported("this agentd cannot restart in place")
        if not conn.may_stop:
            raise c.Unauthorized("restart is accepted only on agentd's Unix socket, from its own uid")
        return await self.reloader.reload(now=req.now, by=conn.peer)

    async def _mcp_ls(self, conn: _Connection, req: wire.McpList) -> wire.McpListResult:
        if self.mcp is None:
            return wire.McpListResult()
        infos = await self.service.runtimes.describe()
        return self.mcp.listing([i.name for i in infos if i.capabilities.mcp])

    def _tools(self) -> Any:
        if self.host_tools is None:
            raise c.Unsupported("host tools are not set up in this daemon")
        return self.host_tools

    async def _register_tool(self, conn: _Connection, req: wire.RegisterTool) -> wire.HostToolInfo:
        return await self._tools().register(conn, req)

    async def _unregister_tool(self, conn: _Connection, req: wire.UnregisterTool) -> None:
        await self._tools().unregister(conn, req)

    async def _next_tool_call(self, conn: _Connection, req: wire.NextToolCall) -> wire.HostToolCallInfo | None:
        return await self._tools().next_call(conn, req)

    async def _tool_result(self, conn: _Connection, req: wire.ToolResult) -> None:
        await self._tools().result(conn, req)

    async def _list_host_tools(self, conn: _Connection, req: wire.ListHostTools) -> wire.HostToolList:
        return await self._tools().list(req)

    async def _call_host_tool(self, conn: _Connection, req: wire.CallHostTool) -> wire.HostToolCallResult:
        return await self._tools().call(req)

    async def _mcp_status(self, conn: _Connection, req: wire.McpStatus) -> wire.McpStatusResult:
        if self.mcp is None:
            raise c.Unsupported("MCP is not set up in this daemon")
        return await self.mcp.status(self.service, req.conversation)

    async def _set_model(self, conn: _Connection, req: wire.SetModel) -> wire.ConversationRecord:
        from . import models

        return await models.select(self.service, req.conversation, req.model, req.effort, after_turn=req.after_turn,
                                   context_tier=req.context_tier)

    async def _account(self, conn: _Connection, req: wire.AccountRequest) -> list[wire.AccountInfo]:
        from . import accounts

        return await accounts.account(self.service.runtimes, req.provider)

    async def _login(self, conn: _Connection, req: wire.Login) -> wire.LoginResult:
        from . import accounts

        # A device flow lives in the connection's nursery: the client going away cancels it.
        return await accounts.login(self.service.runtimes, req.provider, token=req.token, device=req.device,
                                    nursery=conn.nursery, store_plaintext=req.store_plaintext)

    async def _login_wait(self, conn: _Connection, req: wire.LoginWait) -> wire.LoginResult:
        from . import accounts

        return await accounts.login_wait(req.flow, req.timeout_s)

    async def _logout(self, conn: _Connection, req: wire.Logout) -> wire.LoginResult:
        from . import accounts

        return await accounts.logout(self.service.runtimes, req.provider)

    async def _quota(self, conn: _Connection, req: wire.QuotaRequest) -> list[wire.QuotaInfo]:
        from . import accounts

        return await accounts.quota(self.service.runtimes, req.provider)

    async def _import_list(self, conn: _Connection, req: wire.ImportList) -> wire.ImportListResult:
        from . import adopt

        return await adopt.candidates(self.service, req.provider, req.workdir)

    async def _import_session(self, conn: _Connection, req: wire.ImportSession) -> wire.ImportResult:
        from . import adopt

        return await adopt.adopt(self.service, req.provider, req.session, req.workdir, force=req.force)
    async def _fork(self, conn: _Connection, req: wire.Fork) -> wire.ForkResult:
        from . import branching

        return await branching.fork(self.service, req.conversation, req.at, title=req.title)

    async def _rewind(self, conn: _Connection, req: wire.Rewind) -> wire.RewindResult:
        from . import branching

        return await branching.rewind(self.service, req.conversation, req.to, preview=req.preview)
    async def _commands(self, conn: _Connection, req: wire.ListCommands) -> wire.CommandList:
        from . import slash_commands

        return await slash_commands.listing(self.service, req.conversation)

    async def _run_command(self, conn: _Connection, req: wire.RunCommand) -> wire.SendResult:
        from . import slash_commands

        return await slash_commands.run(self.service, req.conversation, req.name, req.args, if_busy=req.if_busy)

    async def _subagents(self, conn: _Connection, req: wire.ListSubagents) -> wire.SubagentList:
        from . import subagents

        return await subagents.listing(self.service, req.conversation)

    async def _subagent_cancel(self, conn: _Connection, req: wire.CancelSubagent) -> None:
        from . import subagents

        await subagents.cancel(self.service, req.conversation, req.agent)

    async def _subagent_prompt(self, conn: _Connection, req: wire.PromptSubagent) -> None:
        from . import subagents

        await subagents.prompt(self.service, req.conversation, req.agent, req.text)

    async def _diff(self, conn: _Connection, req: wire.Diff) -> wire.DiffResult:
        return await self._checkpoints().diff(self.service, req.conversation, req.run, stat=req.stat)

    async def _revert(self, conn: _Connection, req: wire.Revert) -> wire.RevertResult:
        return await self._checkpoints().revert(self.service, req.conversation, req.run, dry_run=req.dry_run,
                                                by=conn.peer)

    def _checkpoints(self) -> Any:
        if self.service.checkpoints is None:
            raise c.Unsupported("this agentd takes no checkpoints")
        return self.service.checkpoints

    async def _ls(self, conn: _Connection, req: wire.List) -> list[wire.ConversationRecord]:
        return self.service.list(include_closed=req.all)

    async def _show(self, conn: _Connection, req: wire.Show) -> wire.ConversationInfo:
        return await self.service.info(req.conversation)

    async def _show_item(self, conn: _Connection, req: wire.ShowItem) -> wire.ItemInfo:
        return await _tool_outputs.show_item(self.service, req.conversation, req.item, agent_id=req.agent_id,
                                             offset=req.offset)

    async def _send(self, conn: _Connection, req: wire.Send) -> wire.SendResult:
        return await self.service.send(req.conversation, req.text, if_busy=req.if_busy,
                                       attachments=list(req.attachments))

    async def _steer(self, conn: _Connection, req: wire.Steer) -> wire.SendResult:
        return await self.service.steer(req.conversation, req.text)

    async def _cancel(self, conn: _Connection, req: wire.Cancel) -> wire.CancelResult:
        return await self.service.cancel(req.conversation)

    async def _answer(self, conn: _Connection, req: wire.AnswerInteraction) -> None:
        await self.service.answer(req.conversation, req.interaction, req.answer, by=conn.peer)

    async def _close(self, conn: _Connection, req: wire.Close) -> dict[str, str]:
        cid = self.service.resolve(req.conversation)
        await self.service.close(cid)
        return {"conversation": cid}

    async def _rm(self, conn: _Connection, req: wire.Remove) -> dict[str, str]:
        record = self.service.record(req.conversation)
        if record.active_run and not req.force:
            raise c.Busy(f"cannot remove {record.id}: it has a running turn ({record.active_run}); "
                         "cancel it first, or remove it anyway with --force", details={"run": record.active_run})
        await self.service.delete(record.id)
        if self.host_tools is not None:
            self.host_tools.forget(record.id)
        return {"conversation": record.id}

    async def _title(self, conn: _Connection, req: wire.SetTitle) -> dict[str, str]:
        cid = self.service.resolve(req.conversation)
        return {"conversation": cid, "title": await self.service.set_title(cid, req.title)}

    async def _budget(self, conn: _Connection, req: wire.SetBudget) -> wire.ConversationRecord:
        from . import usage

        return await usage.set_budget(self.service, req.conversation, req.budget, by=conn.peer)

    async def _continue(self, conn: _Connection, req: wire.Continue) -> wire.ConversationRecord:
        from . import usage

        return await usage.resume(self.service, req.conversation)

    async def _export(self, conn: _Connection, req: wire.Export) -> wire.ExportResult:
        async with self._exports:
            return await self.service.export(req.conversation, req.format, include_tools=req.include_tools, all_=req.all)

    async def _history(self, conn: _Connection, req: wire.History) -> wire.HistoryPage:
        from . import history

        reader = await self.service.reader(req.conversation)  # reading takes no lease and opens no runtime
        return await history.page(reader.journal, reader.record.id, reader.published_seq, limit=req.limit,
                                  before=req.before, after=req.after, dropped=reader.record.dropped, all_=req.all)

    def _task_service(self) -> Any:
        if self.tasks is None:
            raise c.Unsupported("this agentd runs no task service")
        return self.tasks

    async def _task_create(self, conn: _Connection, req: wire.TaskCreate) -> wire.TaskRecord:
        return await self._task_service().create(
            provider=req.provider, workdir=req.workdir, input=req.input, model=req.model, callback=req.callback,
            mode=req.mode, budget=req.budget,
        )

    async def _task_ls(self, conn: _Connection, req: wire.TaskList) -> wire.TaskListResult:
        await self._task_service().refresh()  # a shared store: every host's tasks
        tasks, nxt = self._task_service().list(req.status, after=req.after, limit=req.limit)
        return wire.TaskListResult(tasks=tasks, next=nxt)

    async def _task_show(self, conn: _Connection, req: wire.TaskShow) -> wire.TaskInfo:
        await self._task_service().refresh()
        return await self._task_service().info(req.task)

    async def _task_cancel(self, conn: _Connection, req: wire.TaskCancel) -> wire.TaskCancelResult:
        await self._task_service().refresh()
        return await self._task_service().cancel(req.task)

    async def _task_comment(self, conn: _Connection, req: wire.TaskAddComment) -> wire.TaskCommentResult:
        await self._task_service().refresh()
        return await self._task_service().comment(req.task, req.text)

    async def _shutdown(self, conn: _Connection, req: wire.Shutdown) -> Any:
        """Answer, see the answer onto the socket, then have the daemon stop as on SIGTERM."""
        if not conn.may_stop:
            log.warning("server.shutdown_refused", peer=conn.peer)
            raise c.Unauthorized("shutdown is accepted only on agentd's Unix socket, from its own uid")
        pid = os.getpid()
        if req.pid != pid:
            raise c.Invalid(f"this agentd is pid {pid}, not {req.pid}; nothing was stopped", details={"pid": pid})
        await conn.send(wire.encode_result(req.id, wire.ShutdownResult(pid=pid)))
        # Stopping closes every connection: the answer must be on its way first.
        await conn.drain()
        if not self.stop_requested.is_set():
            self.stop_requested_by = conn.peer
            self.stop_requested.set()
        return _NO_REPLY

    async def _unsubscribe(self, conn: _Connection, req: wire.Unsubscribe) -> None:
        sub = conn.subscriptions.pop(req.subscription, None)
        if sub is None:
            raise c.NotFound(f"no subscription {req.subscription}")
        self.hub.remove(sub)

    async def _subscribe(self, conn: _Connection, req: wire.Subscribe) -> Any:
        """Replay after ``req.after``, switch live with no gap or duplicate, then snapshot."""
        if req.id in conn.subscriptions:
            raise c.Invalid(f"subscription id {req.id} is in use on this connection")
        if len(conn.subscriptions) >= self.max_subscriptions:
            raise c.LimitExceeded(
                f"this connection has {len(conn.subscriptions)} subscriptions, the limit "
                "(server.max_subscriptions); unsubscribe one first, or subscribe to all conversations at once"
            )
        if req.conversation is None:
            sub = Subscription(req.id, None, conn)
            sub.live = True
            conn.subscriptions[req.id] = sub
            self.hub.add(sub)
            await conn.send(wire.encode_result(req.id, wire.SubscribeResult(subscription=req.id)))
            return _NO_REPLY
        live = await self.service.reader(req.conversation)  # reading takes no lease: an idle conversation stays unloaded
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
            try:
                lines = await live.journal.read_after(sub.cursor, limit=min(CATCHUP_CHUNK, target - sub.cursor))
            except c.AgentdError as exc:
                await self._end_damaged(conn, sub, live, exc)
                raise
            if not lines:
                break
            read = len(lines)
            if live.record.dropped:
                from . import branching

                lines = branching.view(lines, live.record.dropped, req.all)  # the rewound view
            prefix = sub.prefix(cid)
            # Masked again: a journal written before a secret was known (or by an older agentd).
            mask = masking.mask_json
            if lines:
                await conn.send_many(b"".join([b"%s%s}\n" % (prefix, mask(line)) for line in lines]), len(lines))
            sub.cursor += read
            await trio.lowlevel.checkpoint()
        if sub.closed:
            return _NO_REPLY
        # No checkpoint from the last check above to here: the switch is atomic. What a burst holds
        # back goes to the live subscribers first: this one read its durable records from the journal.
        self.service.flush_held(cid)
        sub.live = True
        if req.snapshot:
            if not conn.offer(_snapshot_frame(req.id, cid, self.service.snapshot(live))):
                self.hub.remove(sub)
                conn.lagged(sub)
        return _NO_REPLY


    async def _end_damaged(self, conn: _Connection, sub: Subscription, live: Any, exc: c.AgentdError) -> None:
        """A journal line cannot be read: send the records before it, then end the subscription.

        The caller raises ``exc``, so the client gets an ``error`` frame with
        the subscription's id naming the line (``details.line``); the journal
        is left exactly as it is.
        """
        self.hub.remove(sub)
        conn.subscriptions.pop(sub.id, None)
        line = exc.details.get("line") if isinstance(exc.details, dict) else None
        log.error("journal.corrupt", conversation=sub.conversation, error=exc.message, line=line)
        if isinstance(line, int) and line - 1 > sub.cursor:
            try:
                before = await live.journal.read_after(sub.cursor, limit=line - 1 - sub.cursor)
            except c.AgentdError:
                before = []
            for good in before:
                await conn.send(sub.frame(sub.conversation, good))
                sub.cursor += 1


async def _refuse(stream: trio.abc.Stream, err: c.AgentdError) -> None:
    """Send one error frame and end the connection so that the client reads it.

    Closing with the client's hello still unread would reset the connection
    and lose the frame; so: send, shut our side, discard what the client
    sends until it closes too (one second at most, a few KB at most).
    """
    with trio.move_on_after(1):
        try:
            await stream.send_all(wire.encode_error(None, err))
            if isinstance(stream, trio.SocketStream):
                await stream.send_eof()
                seen = 0
                while seen < 65536:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    seen += len(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass


_NO_REPLY = object()

#: Requests whose reply may be large (a whole transcript, a page of big items, every task with
#: its comments, a subscription's catch-up from the journal): built one at a time per
#: connection, once the client took the reply before.
LARGE_REPLIES = frozenset({wire.Export, wire.History, wire.ShowItem, wire.TaskList, wire.TaskShow, wire.Subscribe})
#: Exports rendered at once, daemon-wide: each holds a whole journal and its rendering in memory.
EXPORTS_AT_ONCE = 2

_LARGE_HINTS = {
    wire.Export: "; export without --include-tools, or page through it with `agentctl history`",
    wire.TaskList: "; list fewer at once (--limit, --status)",
}


def _too_large(request: Any, size: int) -> bytes:
    """The error frame sent instead of a reply of ``size`` bytes that no client would read."""
    op = type(request).__struct_config__.tag
    err = c.LimitExceeded(
        f"the reply to {op} is {size:,} bytes, over the {wire.CLIENT_MAX_FRAME_BYTES:,} a client reads in one "
        f"frame{_LARGE_HINTS.get(type(request), '')}", details={"bytes": size, "limit": wire.CLIENT_MAX_FRAME_BYTES})
    log.warning("server.reply_too_large", op=op, bytes=size)
    return wire.encode_error(request.id, err)
