"""``agentctl stop`` and the ``shutdown`` op: a graceful stop, exactly as SIGTERM's, never an autostart."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from trio_websocket import open_websocket_url

from agentd import contract as c
from agentd import wire
from daemon_harness import Client, Daemon

WAIT = Path(__file__).resolve().parents[2] / "conf" / "scripts" / "wait.toml"


def _one_json(cp: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = cp.stdout.splitlines()
    assert len(lines) == 1, cp.stdout
    return json.loads(lines[0])


def _wait_for(predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise TimeoutError("condition not met")


def _log_events(d: Daemon) -> list[dict[str, Any]]:
    out = []
    for line in d.log.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


# --------------------------------------------------------------------------- agentctl stop


def test_stop_stops_the_daemon_and_a_new_one_starts_on_the_same_state_dir(daemon: Daemon) -> None:
    assert daemon.proc is not None
    pid = daemon.proc.pid
    cp = daemon.agentctl("stop")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout == f"stopped agentd (pid {pid})\n"
    # agentctl returned once the process had exited: nothing left to wait for.
    assert daemon.proc.poll() == 0
    assert not daemon.socket.exists()
    stopping = [e for e in _log_events(daemon) if e.get("event") == "agentd.stopping"]
    assert stopping and stopping[-1]["request"] == "shutdown"
    assert any(e.get("event") == "agentd.stopped" for e in _log_events(daemon))
    # The state-dir lock was released: a new daemon starts there.
    daemon.start()
    with daemon.client() as client:
        assert client.request(wire.Status)["pid"] == daemon.proc.pid != pid
    cp = daemon.agentctl("stop", "--json")
    assert cp.returncode == 0, cp.stderr
    body = _one_json(cp)
    assert body["stopped"] is True and body["pid"] == daemon.proc.pid
    assert body["socket"] == str(daemon.socket) and isinstance(body["waited_s"], float)
    assert daemon.proc.poll() == 0


def _interrupted_turn(tmp_path: Path, stop: str) -> list[tuple[str, Any]]:
    """Start a turn that only ends when cancelled, stop the daemon (``stop``), start it again.

    Returns the journal records the stop and the next start left after the
    turn's first output, normalised (no times, ids, owners).
    """
    tmp_path.mkdir()
    d = Daemon(tmp_path).start()
    work = tmp_path / "work"
    work.mkdir()
    try:
        with d.client() as client:
            cid = client.request(wire.New, provider="script", workdir=str(work), model=str(WAIT))["id"]
            run = client.request(wire.Send, conversation=cid, text="wait for me")["run"]
        _wait_for(lambda: any(r["type"] == "item" and r["data"].get("kind") == "assistant" for r in d.journal(cid)))
        before = len(d.journal(cid))
        if stop == "sigterm":
            assert d.stop() == 0
        else:
            cp = d.agentctl("stop")
            assert cp.returncode == 0, cp.stderr
            assert d.proc is not None and d.proc.poll() == 0
        assert len(d.journal(cid)) == before  # the stop itself journals nothing more
        assert d.record(cid)["active_run"] == run  # on disk the turn is still in flight ...
        received = d.state_dir / "providers" / "script" / "received.jsonl"
        prompts = received.read_text().splitlines()
        d.start()
        after = d.journal(cid)[before:]
        assert received.read_text().splitlines() == prompts  # ... and the prompt is never resent
        assert d.record(cid).get("active_run", "") == ""
        with d.client() as client:
            assert client.request(wire.Show, conversation=cid)["record"].get("state", "idle") == "idle"
    finally:
        d.stop()
    ends = [r for r in after if r["type"] == "turn" and r["run"] == run]
    assert len(ends) == 1 and ends[0]["data"]["reason"] == c.RUN_INTERRUPTED
    normalised = []
    for r in after:
        data = dict(r["data"]) if isinstance(r["data"], dict) else r["data"]
        if r["type"] == "lease":
            data.pop("owner", None)
            data.pop("previous_owner", None)
        normalised.append((r["type"], data))
    return normalised


def test_a_turn_running_at_stop_is_recorded_interrupted_by_the_next_start_exactly_as_after_sigterm(
    tmp_path: Path,
) -> None:
    by_stop = _interrupted_turn(tmp_path / "stop", "agentctl")
    by_sigterm = _interrupted_turn(tmp_path / "sigterm", "sigterm")
    assert by_stop == by_sigterm
    # A clean stop released the lease: the next start acquires it, it takes nothing over.
    assert [d["action"] for t, d in by_stop if t == "lease"] == ["acquired"]


def _env_with_autostart(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("AGENTD_NO_AUTOSTART", None)
    env.update(
        AGENTD_STATE_DIR=str(tmp_path / "state"),
        AGENTD_RUNTIME_DIR=str(tmp_path / "run"),
        AGENTD_CONFIG=str(tmp_path / "agentd.toml"),
        NO_COLOR="1",
    )
    env.pop("AGENTD_SOCKET", None)
    (tmp_path / "agentd.toml").write_text("")
    return env


@pytest.mark.parametrize("stale_socket", [False, True], ids=["no-socket", "stale-socket"])
def test_stop_without_a_daemon_says_so_exits_0_and_starts_none(tmp_path: Path, stale_socket: bool) -> None:
    env = _env_with_autostart(tmp_path)  # autostart is on, and must not happen
    sock = tmp_path / "run" / "agentd.sock"
    if stale_socket:  # a socket file nobody listens on: connection refused
        sock.parent.mkdir(mode=0o700)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(sock))
        s.close()

    def agentctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "agentctl", *args], env=env, capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)

    cp = agentctl("stop")
    assert (cp.returncode, cp.stdout, cp.stderr) == (0, "agentd is not running\n", "")
    cp = agentctl("stop", "--json")
    assert cp.returncode == 0, cp.stderr
    assert _one_json(cp) == {"stopped": False, "pid": None, "socket": str(sock), "waited_s": 0.0}
    assert sock.exists() == stale_socket
    assert not (tmp_path / "run" / "agentd.log").exists()  # what an autostart writes first
    assert not (tmp_path / "state").exists()
    # Nothing answers there now either.
    with pytest.raises(OSError):
        Client(sock, timeout=2)


# --------------------------------------------------------------------------- timeout


class _FakeAgentd:
    """A socket that speaks just enough protocol for ``agentctl stop``, for a daemon that does not exit.

    Its status names ``pid`` (a process that goes on running); it answers
    ``shutdown`` and closes the connection, and the process lives on.
    """

    def __init__(self, path: Path, pid: int) -> None:
        self.pid = pid
        self.requests: list[dict[str, Any]] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn, conn.makefile("rb") as f:
            conn.sendall(wire.encode(wire.HelloFrame(protocol=wire.PROTOCOL_VERSION, server="fake", pid=self.pid)))
            for line in f:
                req = json.loads(line)
                self.requests.append(req)
                if req["op"] == "hello":
                    result: Any = {"protocol": wire.PROTOCOL_VERSION}
                elif req["op"] == "status":
                    result = wire.StatusResult(version="0", protocol=wire.PROTOCOL_VERSION, pid=self.pid, uptime_s=1.0,
                                               state_dir="/nowhere", socket="/nowhere", conversations=0, running=0,
                                               providers=[])
                else:
                    conn.sendall(wire.encode_result(req["id"], wire.ShutdownResult(pid=self.pid)))
                    return
                conn.sendall(wire.encode_result(req["id"], result))

    def close(self) -> None:
        self.listener.close()


def test_stop_exits_1_when_the_daemon_has_not_exited_within_the_timeout(tmp_path: Path) -> None:
    stubborn = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    path = tmp_path / "fake.sock"
    fake = _FakeAgentd(path, stubborn.pid)
    try:
        started = time.monotonic()
        cp = subprocess.run([sys.executable, "-m", "agentctl", "--socket", str(path), "stop", "--timeout", "0.5"],
                            capture_output=True, text=True, timeout=60)
        took = time.monotonic() - started
        assert cp.returncode == 1, (cp.stdout, cp.stderr)
        assert cp.stdout == ""
        assert f"agentd (pid {stubborn.pid}) was asked to stop but is still running after 0.5 s" in cp.stderr
        assert took < 10
        assert [r["op"] for r in fake.requests] == ["hello", "status", "shutdown"]
        assert fake.requests[-1]["pid"] == stubborn.pid
    finally:
        fake.close()
        stubborn.kill()
        stubborn.wait()


# --------------------------------------------------------------------------- the op


def test_shutdown_naming_another_pid_is_refused_and_stops_nothing(daemon: Daemon) -> None:
    assert daemon.proc is not None
    with daemon.client() as client:
        with pytest.raises(c.Invalid) as err:
            client.request(wire.Shutdown, pid=daemon.proc.pid + 1)
        assert err.value.details == {"pid": daemon.proc.pid}
        assert client.request(wire.Status)["pid"] == daemon.proc.pid
    assert daemon.proc.poll() is None


def test_shutdown_answers_then_closes_the_connection_and_the_daemon_exits_0(daemon: Daemon) -> None:
    assert daemon.proc is not None
    with daemon.client() as client, daemon.client() as bystander:
        assert client.request(wire.Shutdown, pid=daemon.proc.pid) == {"pid": daemon.proc.pid}
        with pytest.raises((EOFError, ConnectionError)):
            client.read()
        with pytest.raises((EOFError, ConnectionError)):
            bystander.read()
    assert daemon.proc.wait(20) == 0
    assert not daemon.socket.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_the_websocket_gateway_refuses_shutdown(tmp_path: Path) -> None:
    port = _free_port()
    d = Daemon(tmp_path, f"[websocket]\nenabled = true\nport = {port}\n").start()
    try:
        assert d.proc is not None
        token = (d.runtime_dir / "ws-token").read_text().strip()
        # As a browser page would connect: the token in the query, an allowed Origin.
        async with open_websocket_url(f"ws://127.0.0.1:{port}/?token={token}",
                                      extra_headers=[(b"Origin", f"http://127.0.0.1:{port}".encode())]) as ws:
            hello = json.loads(await ws.get_message())
            assert hello["type"] == "hello" and hello["pid"] == d.proc.pid
            await ws.send_message(json.dumps({"id": 0, "op": "hello", "protocol": wire.PROTOCOL_VERSION}))
            assert json.loads(await ws.get_message())["id"] == 0
            await ws.send_message(json.dumps({"id": 1, "op": "shutdown", "pid": d.proc.pid}))
            refused = json.loads(await ws.get_message())
            assert refused["type"] == "error" and refused["id"] == 1
            assert refused["error"]["code"] == "unauthorized"
            assert "Unix socket" in refused["error"]["message"]
            # The connection and the daemon go on.
            await ws.send_message(json.dumps({"id": 2, "op": "status"}))
            assert json.loads(await ws.get_message())["result"]["pid"] == d.proc.pid
        assert d.proc.poll() is None
        with d.client() as client:
            assert client.request(wire.Status)["pid"] == d.proc.pid
        assert any(e.get("event") == "server.shutdown_refused" for e in _log_events(d))
        # agentctl stop, on the Unix socket, still stops it.
        cp = d.agentctl("stop")
        assert cp.returncode == 0, cp.stderr
        assert d.proc.poll() == 0
    finally:
        d.stop()


def test_shutdown_is_a_request_op_of_the_protocol() -> None:
    assert "shutdown" in wire.OPS
    req = wire.decode_request(b'{"id": 3, "op": "shutdown", "pid": 42}')
    assert req == wire.Shutdown(id=3, pid=42)
    for bad in (b'{"id": 3, "op": "shutdown"}', b'{"id": 3, "op": "shutdown", "pid": 0}'):
        with pytest.raises(wire.ProtocolError) as err:
            wire.decode_request(bad)
        assert err.value.code == "invalid"
    assert msgspec.json.decode(wire.encode_result(3, wire.ShutdownResult(pid=42)))["result"] == {"pid": 42}
