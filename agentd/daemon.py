"""The daemon's main task: wires the store, leases, runtimes, service and server together.

Shutdown order is the reverse of start-up, one nursery per layer: the front
(server, conversation service and task service) stops first, closing provider
conversations while their runtimes still run; then the warm pool discards the
conversations it made ahead (agentd.warm_pool); then the runtimes stop; then
leases are released and the journals get their final fsync. Tasks running
then stay ``running`` on disk: the next start records them interrupted.

SIGTERM, SIGINT and the ``shutdown`` request (``agentctl stop``) all take
that one path, systemd's STOPPING notification included.

At start the open-files soft limit is raised to the hard limit (often 1024
soft against 500,000 hard): the caps on connections, not a low default, bound
how many descriptors clients may hold, and the owner's own socket keeps room.
"""

from __future__ import annotations

import os
import resource
import signal
from pathlib import Path
from typing import Any

import structlog
import trio

from . import _trust, agentfs, idle_release, masking, reload, runtime_env, systemd, warm_pool
from .config import Config, Paths, default_config_path
from .conversations import ConversationService, new_id
from .hub import Hub
from .journal import FsyncPolicy
from .runtimes import Runtimes
from .server import Server
from .store import Store, open_store
from .tasks import TaskService

log = structlog.get_logger("agentd")


async def serve(config: Config, paths: Paths, config_path: Path | None = None) -> None:
    """Run the daemon until SIGTERM, SIGINT or a ``shutdown`` request. The caller holds the state-dir lock.

    ``config_path``: the agentd.toml loaded (None: the default one), kept out of agents' reach.
    """
    _raise_open_files_limit()
    owner = f"{new_id('d')}.{os.getpid()}"
    # Keys kept in <config dir>/environment (what the systemd units name as EnvironmentFile) reach an
    # agentd started some other way too; the environment it was started with wins.
    for key, value in _environment_file(config_path).items():
        os.environ.setdefault(key, value)
    # Before any runtime starts or any record is written: the secrets of the environment and config.
    masking.load(os.environ, config.providers)
    runtime_env.configure(config.providers, config.store.backend)
    fsync = FsyncPolicy(config.journal.fsync)
    store = await open_store(config, paths, owner)  # [store] backend: the rest never knows which
    try:
        await _serve(config, paths, config_path, store, owner, fsync)
    finally:
        await store.aclose()
    log.info("agentd.stopped")


async def _serve(config: Config, paths: Paths, config_path: Path | None, store: Store, owner: str,
                 fsync: FsyncPolicy) -> None:
    hub = Hub()
    runtimes = Runtimes(config, paths.state_dir, files=_agent_files(config, paths, config_path))
    runtimes.config_path = config_path  # named in the fixes `providers` prints (agentd.accounts)
    service = ConversationService(
        store=store.conversations,
        leases=store.leases,
        runtimes=runtimes,
        hub=hub,
        fsync=fsync,
        interaction_timeout_s=config.interactions.timeout_s if config.interactions.on_timeout == "deny" else 0.0,
        hang_timeout_s=config.runtimes.hang_timeout_s,
        silence_timeout_s=config.runtimes.silence_timeout_s,
        cancel_timeout_s=config.runtimes.cancel_timeout_s,
        owner=owner,
        pricing=config.pricing,
        budgets=config.budgets,
        attachments=config.attachments,
        tool_output_quota_bytes=config.journal.tool_output_quota_bytes,
    )
    server = Server(
        service,
        hub,
        max_frame_bytes=config.server.max_frame_bytes,
        subscriber_buffer=config.server.subscriber_buffer,
        max_connections=config.server.max_connections,
        outbox_bytes=config.server.outbox_bytes,
        max_requests_in_flight=config.server.max_requests_in_flight,
        max_subscriptions=config.server.max_subscriptions,
        hello_timeout_s=config.server.hello_timeout_s,
        state_dir=paths.state_dir,
        socket_path=paths.socket,
    )
    from .checkpoints import Checkpoints

    files = runtimes.files  # agentd's own paths, as agent file access refuses them
    service.checkpoints = Checkpoints(config.checkpoints, paths.state_dir / "checkpoints", paths.state_dir,
                                      own=tuple(Path(p) for p in (*files.own_dirs, *files.own_files)))
    tasks = TaskService(service, hub, config.tasks, paths.state_dir / "tasks",
                        shared=store.peers.tasks if store.peers is not None else None)
    server.tasks = tasks
    if store.peers is not None:  # a shared store: other hosts' conversations, commands carried to theirs
        store.peers.attach(service, hub, server)
    server.reloader = reloader = reload.Reloader(service, tasks, config, config_path)
    from .mcp import McpRoom

    from .host_tools import HostTools

    server.mcp = McpRoom(config.mcp)  # registers the MCP servers' secrets with masking
    server.host_tools = HostTools(config.mcp, service, str(paths.socket))
    server.mcp.extra = server.host_tools.servers_for
    service.mcp_servers = server.mcp.servers_for
    activated = systemd.listen_fds()
    systemd.take_environment()  # after LISTEN_*: no runtime or tool inherits NOTIFY_SOCKET and the rest
    if activated:
        listener = trio.socket.from_stdlib_socket(activated[0])
        bound = False
    else:
        listener = Server.bind_unix(paths.socket)
        bound = True

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        try:
            async with trio.open_nursery() as infra:
                await infra.start(store.run)  # group commit and lease renewal
                async with trio.open_nursery() as rt:
                    await rt.start(runtimes.run)
                    async with trio.open_nursery() as front:
                        await front.start(service.checkpoints.run)
                        await front.start(service.run)
                        if store.peers is not None:
                            await front.start(store.peers.run)
                        runtimes.warm.hint = warm_pool.hint_from(service)
                        runtimes.warm.prime()  # the records are loaded: the default provider's shape is known
                        await front.start(tasks.run)
                        await front.start(idle_release.run, service, config.runtimes.idle_release_s)
                        if config.websocket.enabled:
                            from .gateway import serve_websocket

                            await front.start(serve_websocket, server, config, paths)
                        # The Unix socket last: once it answers, every listener is up.
                        await front.start(server.serve, listener)
                        interval = systemd.watchdog_interval()
                        if interval:
                            front.start_soon(systemd.watchdog_loop, interval)
                        front.start_soon(_reload_on_sighup, reloader)
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
                    with trio.move_on_after(warm_pool.CLOSE_TIMEOUT_S):
                        await runtimes.warm.forget()  # discarded while their runtimes still run
                    rt.cancel_scope.cancel()
                infra.cancel_scope.cancel()
        finally:
            if bound:
                try:
                    Path(paths.socket).unlink()
                except FileNotFoundError:
                    pass


def _agent_files(config: Config, paths: Paths, config_path: Path | None) -> agentfs.Policy:
    """What agent file access may do, and agentd's own paths it refuses wherever they lie."""
    af = config.agent_files
    default = default_config_path()
    return agentfs.Policy(
        max_bytes=af.max_bytes, timeout_s=af.timeout_s, threads=af.threads,
        own_dirs=(str(paths.state_dir), str(paths.runtime_dir), str(default.parent)),
        # The environment file beside the config holds keys and sets every runtime's environment.
        own_files=(str(paths.socket), str(paths.token_file), str(Path(config_path or default).absolute()),
                   str(reload.environment_file(config_path))),
    )


def _raise_open_files_limit() -> None:
    """Set RLIMIT_NOFILE's soft limit to its hard limit; a refusal is logged, never fatal."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        # The kernel refuses "unlimited" for open files; fs.nr_open is the real ceiling.
        try:
            target = int(Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            target = 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        log.warning("agentd.nofile_limit", soft=soft, hard=hard, error=str(exc))
        return
    log.info("agentd.nofile_limit", soft=target, was=soft)


def _environment_file(config_path: Path | None) -> dict[str, str]:
    # Checked by the trust rule at start (agentd run exits 78 on it); changed since: read nothing.
    try:
        path, text = reload.read_environment(config_path)
    except (OSError, _trust.Untrusted) as exc:
        log.warning("agentd.env_file_unreadable", error=str(exc))
        return {}
    return reload.environment_values(path, text) if text is not None else {}


async def _reload_on_sighup(reloader: reload.Reloader) -> None:
    """SIGHUP (``agentd reload``, ``systemctl --user reload agentd``) restarts in place, as
    ``agentctl restart`` does: after the running turns; a broken config is logged and refused."""
    from .contract import AgentdError

    with trio.open_signal_receiver(signal.SIGHUP) as hups:
        async for _ in hups:
            try:
                await reloader.reload(by="SIGHUP")
            except AgentdError:
                pass  # logged by the reloader; the config in force stays
            except Exception:  # a bug met by one reload must not end the daemon and every turn with it
                log.exception("agentd.reload_failed", by="SIGHUP")


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
