"""Control connections that come from an agent's own processes, and the little they may ask.

The agent itself is untrusted (DESIGN.md, Trust), yet it runs as the user, and
so could connect to agentd's socket like any client of the user's: answer its
own permission requests, prompt other conversations, read their history, close
them. A shell command the user allowed once could grant every later request.

So a connection is placed by the process that opened it. Every runtime process
starts under a keeper that agentd itself forked (``agentd/_launcher.py``, a child
subreaper: whatever the runtime forks, ``setsid``-ed or orphaned, stays below
it). A peer whose chain of parents passes through such a keeper to this agentd
is an *agent peer*: it may use :data:`OPS`, what agentd's own MCP relay
(``agentd.host_tools_relay``, which the runtime starts) needs, and nothing else;
every other request is answered ``unauthorized``. A peer agentd cannot place (it
is gone by the time agentd looks) is treated as an agent peer too. Agent peers
together hold at most ``[server] max_connections`` less :func:`kept_for_users`.

* Unix socket: the connecting pid from ``SO_PEERCRED`` (:func:`of_process`).
* WebSocket gateway, from loopback: the process holding the client's end of the
  TCP connection, by the socket's inode from the kernel (:func:`of_socket`).

Linux only (``/proc``); elsewhere nothing is an agent peer. What this does not
stop: an agent that kills its own keeper (its runtime dies with it, and what it
left behind is then reparented away from agentd), or one that changes the user's
files agentd runs from, or asks another of the user's services to run a command
for it. Against those the runtime needs a sandbox or a user of its own.
"""

from __future__ import annotations

import os

import msgspec
import structlog

from . import contract as c
from . import procs, wire

log = structlog.get_logger("agentd.agent_peers")

#: the requests an agent peer may make: agentd's MCP relay listing and calling host tools
OPS: frozenset[type] = frozenset({wire.ListHostTools, wire.CallHostTool})
#: at most this many of ``[server] max_connections`` are kept for the user's own clients: agents'
#: processes together get the rest, so an agent that opens connections in a loop cannot lock the
#: user out of the daemon (an agent's relay holds one connection, and one more per call in flight)
USER_CONNECTIONS = 64
#: a chain of parents longer than this is not followed (a pid chain is finite; this bounds the reads)
MAX_DEPTH = 4096
_LAUNCHER = procs.LAUNCHER.encode()


class AgentPeer(msgspec.Struct, frozen=True):
    """A connection from an agent's processes.

    ``pid``: the process that connected (or holds the connection). ``keeper``: the
    runtime's keeper it runs under, agentd's child; 0 when agentd could not place the
    process (it was gone).
    """

    pid: int
    keeper: int = 0

    def refusal(self, op: str) -> c.Unauthorized:
        """The error for request ``op`` (its wire tag) from this peer."""
        where = f"under runtime keeper pid {self.keeper}" if self.keeper else "which agentd could not place (gone)"
        allowed = ", ".join(sorted(t.__struct_config__.tag for t in OPS))  # type: ignore[attr-defined]
        return c.Unauthorized(
            f"{op} refused: this connection comes from an agent's own processes (pid {self.pid}, {where}); "
            f"an agent may use only its host tools ({allowed})",
            details={"pid": self.pid, "keeper": self.keeper},
        )


def kept_for_users(max_connections: int) -> int:
    """How many of ``max_connections`` agent peers may not take: :data:`USER_CONNECTIONS`, at
    most a quarter of them, at least one."""
    return max(1, min(USER_CONNECTIONS, max_connections // 4))


def _parent(pid: int) -> int | None:
    """PID's parent from /proc/PID/stat (field 4); None when PID is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _is_keeper(pid: int) -> bool:
    """PID runs agentd's keeper (``python -I -S .../_launcher.py ...``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return _LAUNCHER in argv[:4]


def of_process(pid: int, *, daemon: int | None = None) -> AgentPeer | None:
    """The agent peer that process ``pid`` is, or None for any other process.

    ``daemon``: the agentd whose keepers count (default: this process). Reads
    /proc/PID/stat up the chain of parents (at most :data:`MAX_DEPTH`); a process
    found gone at the start is an agent peer with ``keeper`` 0 (it cannot be told
    apart from one). A pid of 0 (``SO_PEERCRED`` of a peer in a pid namespace that
    is not below agentd's, which no agent can create) is no agent peer.
    """
    if not procs.SUPPORTED or pid <= 0:
        return None
    me = os.getpid() if daemon is None else daemon
    # Twice at most: a parent that exits while it is read reparents its children (to the
    # keeper, a subreaper, when it is below one), so a second walk sees where they went.
    for _ in range(2):
        current = pid
        for _ in range(MAX_DEPTH):
            if current == me:
                return None  # agentd itself (a client in agentd's own process)
            parent = _parent(current)
            if parent is None:
                break
            if parent == me:
                return AgentPeer(pid, current) if _is_keeper(current) else None
            if parent <= 1:
                return None
            current = parent
        else:
            return None
        if current == pid:
            return AgentPeer(pid)  # gone before agentd looked
    return AgentPeer(pid)


def of_socket(inode: int, *, daemon: int | None = None) -> AgentPeer | None:
    """The agent peer holding the socket with inode ``inode`` open, or None when no process
    below one of agentd's keepers holds it.

    Scans /proc: each process's parent, then the descriptors of the processes below
    agentd's keepers only. Blocking (a few ms with hundreds of processes): call it
    from a worker thread.
    """
    if not procs.SUPPORTED or inode <= 0:
        return None
    me = os.getpid() if daemon is None else daemon
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = _parent(int(name))
            if parent is not None:
                children.setdefault(parent, []).append(int(name))
    target = f"socket:[{inode}]"
    for keeper in children.get(me, []):
        if not _is_keeper(keeper):
            continue
        below = [keeper]
        for pid in below:  # grows as it goes: breadth first over the keeper's descendants
            below.extend(children.get(pid, []))
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return AgentPeer(pid, keeper)
                except OSError:
                    continue
    return None
