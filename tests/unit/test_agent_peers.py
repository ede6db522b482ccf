"""agentd.agent_peers places a connection by the process that opened it: below one of this
agentd's keepers (a real keeper, agentd/_launcher.py, started as agentd starts runtimes) it is an
agent peer, even a setsid-ed orphan's; agentd itself, its other children and strangers are not."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentd import agent_peers, procs
from agentd.gateway import loopback_peer_socket

pytestmark = pytest.mark.skipif(not procs.SUPPORTED, reason="placing peers needs /proc (Linux)")

#: argv: PIDFILE [PORT]. Forks a grandchild that setsid-s and whose parent exits (so the keeper, a
#: subreaper, adopts it); the grandchild writes its pid, connects to PORT when given, and sleeps.
ORPHAN = r'''
import os, socket, sys, time
pidfile = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        sock = None
        if len(sys.argv) > 2:
            sock = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
        time.sleep(60)
    os._exit(0)
os.wait()
time.sleep(60)
'''


def _wait_pid(path: Path) -> int:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, "the orphan never started"
        time.sleep(0.02)
    return int(path.read_text())


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A keeper started as agentd starts a runtime; its runtime leaves a setsid-ed orphan behind."""
    argv = procs.launch_argv([sys.executable, "-c", ORPHAN, str(tmp_path / "orphan.pid")], state_dir=tmp_path, what="test")
    keeper = subprocess.Popen(argv)
    try:
        yield keeper
    finally:
        os.kill(keeper.pid, procs.KILL_ALL)
        keeper.wait(10)


def test_a_setsid_orphan_below_a_keeper_is_an_agent_peer(kept: subprocess.Popen[bytes], tmp_path: Path) -> None:
    orphan = _wait_pid(tmp_path / "orphan.pid")
    deadline = time.monotonic() + 5
    while (agent_peers._stat(orphan) or (b'', 0))[1] != kept.pid:  # its parent exited: adopted by the keeper (subreaper)
        assert time.monotonic() < deadline, f"orphan {orphan} was not adopted by keeper {kept.pid}"
        time.sleep(0.02)
    assert agent_peers.of_process(orphan) == agent_peers.AgentPeer(orphan, kept.pid)


def test_agentd_its_other_children_and_strangers_are_not(kept: subprocess.Popen[bytes], tmp_path: Path) -> None:
    _wait_pid(tmp_path / "orphan.pid")
    assert agent_peers.of_process(os.getpid()) is None
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as child:  # agentctl, say
        try:
            assert agent_peers.of_process(child.pid) is None
        finally:
            child.kill()
    assert agent_peers.of_process(1) is None
    assert agent_peers.of_process(0) is None  # SO_PEERCRED of a peer in a namespace not below ours


def test_a_keeper_of_another_agentd_counts_too(kept: subprocess.Popen[bytes], tmp_path: Path) -> None:
    orphan = _wait_pid(tmp_path / "orphan.pid")
    # Placed by an agentd that is not this process (our parent, say): the keeper is still found.
    assert agent_peers.of_process(orphan, daemon=os.getppid()) == agent_peers.AgentPeer(orphan, kept.pid)
    assert agent_peers.of_process(kept.pid, daemon=os.getppid()) == agent_peers.AgentPeer(kept.pid, kept.pid)


def test_a_chain_deeper_than_any_shell_fails_closed(tmp_path: Path) -> None:
    nest = tmp_path / "nest.sh"
    # Each level a shell of its own (the `; true` keeps a shell from exec-ing its last command).
    nest.write_text('if [ "$1" -eq 0 ]; then echo $$ > "$2.tmp"; mv "$2.tmp" "$2"; exec sleep 60; fi\n'
                    'sh "$0" $(($1 - 1)) "$2"; true\n')
    pidfile = tmp_path / "leaf.pid"
    top = subprocess.Popen(["sh", str(nest), str(agent_peers.MAX_DEPTH + 2), str(pidfile)], start_new_session=True)
    try:
        leaf = _wait_pid(pidfile)
        assert agent_peers.of_process(leaf) == agent_peers.AgentPeer(leaf, 0)
        # The same process placed with a bound above its depth: no keeper, no agent.
        agent_peers.MAX_DEPTH, depth = agent_peers.MAX_DEPTH + 64, agent_peers.MAX_DEPTH
        try:
            assert agent_peers.of_process(leaf) is None
        finally:
            agent_peers.MAX_DEPTH = depth
    finally:
        os.killpg(top.pid, 9)
        top.wait(10)


def test_a_peer_gone_before_it_is_placed_counts_as_an_agent() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert agent_peers.of_process(gone.pid) == agent_peers.AgentPeer(gone.pid, 0)
    refusal = agent_peers.AgentPeer(gone.pid, 0).refusal("answer")
    assert refusal.code == "unauthorized"
    assert "could not place" in refusal.message and "call_host_tool" in refusal.message


def test_the_holder_of_a_loopback_connection_is_found_below_a_keeper(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    argv = procs.launch_argv([sys.executable, "-c", ORPHAN, str(tmp_path / "orphan.pid"), str(port)],
                             state_dir=tmp_path, what="test")
    keeper = subprocess.Popen(argv)
    try:
        conn, address = listener.accept()
        orphan = _wait_pid(tmp_path / "orphan.pid")
        found = loopback_peer_socket(address[:2], conn.getsockname()[:2])
        assert found is not None and found[0] == os.getuid() and found[1] > 0
        assert agent_peers.of_socket(found[1]) == agent_peers.AgentPeer(orphan, keeper.pid)
        # A connection of agentd's own process is no agent's.
        with socket.create_connection(("127.0.0.1", port)) as mine:
            conn2, address2 = listener.accept()
            found2 = loopback_peer_socket(address2[:2], conn2.getsockname()[:2])
            assert found2 is not None and found2[1] != found[1]
            assert agent_peers.of_socket(found2[1]) is None
            assert mine.fileno() >= 0
            conn2.close()
        conn.close()
        # The client's end is the orphan's still; a socket no process agentd can read holds (closed,
        # in flight in a message, in a table of its own) fails closed.
        assert agent_peers.of_socket(found[1]) == agent_peers.AgentPeer(orphan, keeper.pid)
        assert agent_peers.of_socket(0) == agent_peers.AgentPeer(0)
        assert agent_peers.of_socket(1 << 31) == agent_peers.AgentPeer(0)
    finally:
        os.kill(keeper.pid, procs.KILL_ALL)
        keeper.wait(10)
        listener.close()
