"""Control connections that come from an agent's own processes, and the little they may ask.

The agent itself is untrusted (DESIGN.md, Trust), yet it runs as the user, and
so could connect to agentd's socket like any client of the user's: answer its
own permission requests, prompt other conversations, read their history, close
them. A shell command the user allowed once could grant every later request.

So a connection is placed by the process that opened it. Every runtime process
starts under a keeper that agentd forked (``agentd/_launcher.py``, a child
subreaper: whatever the runtime forks, ``setsid``-ed or orphaned, stays below
it), and the keeper names itself :data:`KEEPER_NAME`, a name only it can give
itself. A peer with such a keeper among its parents (any agentd's: an agent of
another agentd of the user's is an agent here too) is an *agent peer*: it may
use :data:`OPS`, what agentd's own MCP relay (``agentd.host_tools_relay``,
which the runtime starts) needs, naming its conversation by its full id, and
nothing else; every other request is answered ``unauthorized``. And only for a
conversation whose runtime runs under that very keeper, as its provider reports
it (``runs_under``, agentd.providers._common): an agent that learned another
conversation's id cannot call the tools a client offers there. Conversations
that share one runtime process (a provider's one Copilot CLI or Codex
app-server, an ACP agent serving several sessions) share its keeper, and so each other's host tools.

* Unix socket: the connecting pid from ``SO_PEERCRED`` (:func:`of_process`).
* WebSocket gateway (loopback only): the processes holding the client's end of
  the TCP connection, by the socket's inode from the kernel (:func:`of_socket`).

Where agentd cannot tell, it fails closed: a peer gone before agentd looks, a
chain of parents deeper than :data:`MAX_DEPTH`, a gateway socket found in no
descriptor table agentd can read, are agent peers. Agent peers together hold at
most ``[server] max_connections`` less :func:`kept_for_users`, and those of one
keeper at most :func:`share_of_one`.

Linux only (``/proc``); elsewhere nothing is an agent peer. What this does not
stop, as the agent runs as the user: an agent that kills its own keeper (its
runtime dies with it; what it left behind is reparented away), one that may
ptrace (Yama ``ptrace_scope`` 0: it could rewrite agentd itself), one that
changes the user's files agentd runs from or reads the user's credentials, or
asks another of the user's services to run a command for it. Against those the
runtime needs a sandbox or a user of its own.
"""

from __future__ import annotations

import os

import msgspec

from . import contract as c
from . import _launcher, procs, wire

#: the requests an agent peer may make: agentd's MCP relay listing and calling host tools
OPS: frozenset[type] = frozenset({wire.ListHostTools, wire.CallHostTool})
#: at most this many of ``[server] max_connections`` are kept for the user's own clients: agents'
#: processes together get the rest, so an agent that opens connections in a loop cannot lock the
#: user out of the daemon (an agent's relay holds one connection, and one more per call in flight)
USER_CONNECTIONS = 64
#: what one relay may hold at once: its watcher, a listing and one connection per call in flight
#: (agentd.host_tools_relay.MAX_CALLS)
RELAY_CONNECTIONS = 18
#: a chain of parents deeper than this makes an agent peer: deeper than any shell a person works
#: in, and it bounds the reads an agent can make agentd do per connection
MAX_DEPTH = 64
#: the process name every keeper gives itself (agentd/_launcher.py)
KEEPER_NAME = _launcher.NAME.encode()


class AgentPeer(msgspec.Struct, frozen=True):
    """A connection from an agent's processes.

    ``pid``: the process that connected (or holds the connection; 0 when none was found).
    ``keeper``: the keeper it runs under (any agentd's); 0 when agentd could not place the
    process (gone, too deep, or a gateway socket no readable descriptor table holds).
    """

    pid: int
    keeper: int = 0

    @property
    def _where(self) -> str:
        """``pid P, under runtime keeper pid K`` (or that agentd could not place it), for messages."""
        return f"pid {self.pid}, " + (f"under runtime keeper pid {self.keeper}" if self.keeper
                                      else "which agentd could not place")

    def refusal(self, op: str) -> c.Unauthorized:
        """The error for request ``op`` (its wire tag) from this peer."""
        allowed = ", ".join(sorted(t.__struct_config__.tag for t in OPS))  # type: ignore[attr-defined]
        return c.Unauthorized(
            f"{op} refused: this connection comes from an agent's own processes ({self._where}); "
            f"an agent may use only its host tools ({allowed})",
            details={"pid": self.pid, "keeper": self.keeper},
        )

    def refusal_of(self, op: str, conversation: str) -> c.Unauthorized:
        """The error for host tool request ``op`` (its wire tag) on ``conversation``, which does not
        run under this peer's keeper: an agent calls its own conversation's host tools only."""
        return c.Unauthorized(
            f"{op} refused: conversation {conversation} does not run in this agent's processes ({self._where}); "
            "an agent may call only its own conversation's host tools",
            details={"pid": self.pid, "keeper": self.keeper, "conversation": conversation},
        )


def kept_for_users(max_connections: int) -> int:
    """How many of ``max_connections`` agent peers may not take: :data:`USER_CONNECTIONS`, at
    most a quarter of them, at least one."""
    return max(1, min(USER_CONNECTIONS, max_connections // 4))


def share_of_one(max_connections: int) -> int:
    """How many connections the agent peers under one keeper may hold: a quarter of the agents'
    share, so one agent cannot take the others' relays' connections, yet at least
    :data:`RELAY_CONNECTIONS` (never more than the agents' share)."""
    share = max_connections - kept_for_users(max_connections)
    return min(share, max(RELAY_CONNECTIONS, share // 4))


def _stat(pid: int) -> tuple[bytes, int] | None:
    """(name, parent) of PID from /proc/PID/stat (fields 2 and 4); None when PID is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        close = data.rindex(b")")
        return data[data.index(b"(") + 1:close], int(data[close + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def of_process(pid: int, *, daemon: int | None = None) -> AgentPeer | None:
    """The agent peer that process ``pid`` is, or None for any other process.

    Reads /proc/PID/stat up the chain of parents, looking for a keeper of any agentd
    (its name, :data:`KEEPER_NAME`): an agent under another agentd of the user is an
    agent here too. Stops at ``daemon`` (default: this process), whose own children
    outside a keeper are not agents, and at the top. Fails closed: a chain deeper than
    :data:`MAX_DEPTH`, or a process found gone at the start, is an agent peer (``keeper``
    0). A pid of 0 (``SO_PEERCRED`` of a peer in a pid namespace that is not below
    agentd's, which no agent can create) is no agent peer.
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
                return None  # agentd itself, or one of its children outside a keeper (git)
            found = _stat(current)
            if found is None:
                break
            name, parent = found
            if name == KEEPER_NAME:
                return AgentPeer(pid, current)
            if parent == 0:
                return None  # the top (pid 1, or a namespace's top)
            current = parent
        else:
            return AgentPeer(pid)  # deeper than any shell a person works in
        if current == pid:
            return AgentPeer(pid)  # gone before agentd looked
    return AgentPeer(pid)


def of_socket(inode: int) -> AgentPeer | None:
    """The agent peer behind the socket with inode ``inode`` (the client's end of a loopback
    connection), or None when a process holding it was found and none holding it is an agent.

    Fails closed: a socket found in no process's descriptor table agentd can read (held
    only by a thread with a table of its own, by a process agentd may not look into, in
    flight in a unix socket message, or closed) is an agent peer with ``pid`` and
    ``keeper`` 0. Scans /proc, blocking (tens of ms with hundreds of processes): call it
    from a worker thread.
    """
    if not procs.SUPPORTED:
        return None
    if inode <= 0:
        return AgentPeer(0)
    target = f"socket:[{inode}]"
    holders = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") == target:
                    holders.append(int(name))
                    break
            except OSError:
                continue
    if not holders:
        return AgentPeer(0)
    for pid in holders:
        if (peer := of_process(pid)) is not None:
            return peer
    return None
