"""The daemon's main task: wires the store, leases, runtimes, service and server together.

Shutdown order is the reverse of start-up, one nursery per layer: the front
(server, conversation service and task service) stops first, closing provider
conversations while their runtimes still run; then the runtimes stop; then
leases are released and the journals get their final fsync. Tasks running
then stay ``running`` on disk: the next start records them interrupted.

SIGTERM, SIGINT and the ``shutdown`` request (``agentctl stop``) all take
that one path, systemd's STOPPING notification included.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import structlog
import trio

from . import systemd
from .config import Config, Paths
from .conversations import ConversationService, new_id
from .hub import Hub
from .journal import FsyncPolicy, JournalStore
from .leases import FileLeaseStore
from .runtimes import Runtimes
from .server import Server
from .tasks import TaskService

log = structlog.get_logger("agentd")


async def serve(config: Config, paths: Paths) -> None:
    """Run the daemon until SIGTERM, SIGINT or a ``shutdown`` request. The caller holds the state-dir lock."""
    owner = f"{new_id('d')}.{os.getpid()}"
    conversations_dir = paths.state_dir / "conversations"
    fsync = FsyncPolicy(config.journal.fsync)
    store = JournalStore(conversations_dir, fsync=fsync, batch_ms=config.journal.batch_ms)
    leases = FileLeaseStore(conversations_dir, owner=owner, ttl_s=config.leases.ttl_s, exclusive=True)
    hub = Hub()
    runtimes = Runtimes(config, paths.state_dir)
    service = ConversationService(
        store=store,
        leases=leases,
        runtimes=runtimes,
        hub=hub,
        fsync=fsync,
        interaction_timeout_s=config.interactions.timeout_s if config.interactions.on_timeout == "deny" else 0.0,
        hang_timeout_s=config.runtimes.hang_timeout_s,
        owner=owner,
        pricing=config.pricing,
        budgets=config.budgets,
        attachments=config.attachments,
    )
    server = Server(
        service,
        hub,
        max_frame_bytes=config.server.max_frame_bytes,
        subscriber_buffer=config.server.subscriber_buffer,
        max_connections=config.server.max_connections,
        state_dir=paths.state_dir,
        socket_path=paths.socket,
    )
    tasks = TaskService(service, hub, config.tasks, paths.state_dir / "tasks")
    server.tasks = tasks
    activated = systemd.listen_fds()
    if activated:
        listener = trio.socket.from_stdlib_socket(activated[0])
        bound = False
    else:
        listener = Server.bind_unix(paths.socket)
        bound = True

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        try:
            async with trio.open_nursery() as infra:
                await infra.start(store.run)
                await infra.start(leases.run)
                async with trio.open_nursery() as rt:
                    await rt.start(runtimes.run)
                    async with trio.open_nursery() as front:
                        await front.start(service.run)
                        await front.start(tasks.run)
                        if config.websocket.enabled:
                            from .gateway import serve_websocket

                            await front.start(serve_websocket, server, config, paths)
                        # The Unix socket last: once it answers, every listener is up.
                        await front.start(server.serve, listener)
                        interval = systemd.watchdog_interval()
                        if interval:
                            front.start_soon(systemd.watchdog_loop, interval)
                        systemd.ready(f"serving {len(service)} conversations on {paths.socket}")
                        log.info(
                            "agentd.ready",
                            pid=os.getpid(),
                            socket=str(paths.socket),
                            state_dir=str(paths.state_dir),
                            conversations=len(service),
                            providers=runtimes.names(),
                        )
                        why = await _stop_wanted(signals, server)
                        log.info("agentd.stopping", **why)
                        systemd.stopping()
                        front.cancel_scope.cancel()
                    rt.cancel_scope.cancel()
                infra.cancel_scope.cancel()
        finally:
            if bound:
                try:
                    Path(paths.socket).unlink()
                except FileNotFoundError:
                    pass
            await store.aclose()
    log.info("agentd.stopped")


async def _stop_wanted(signals: Any, server: Server) -> dict[str, str]:
    """Wait for SIGTERM or SIGINT, or a client's ``shutdown`` request; say which, for the log."""
    why: dict[str, str] = {}
    async with trio.open_nursery() as nursery:

        async def on_signal() -> None:
            async for signum in signals:
                why.setdefault("signal", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                return

        nursery.start_soon(on_signal)
        await server.stop_requested.wait()
        why.setdefault("request", "shutdown")
        why.setdefault("peer", server.stop_requested_by)
        nursery.cancel_scope.cancel()
    return why
