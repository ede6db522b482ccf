"""Start the real ``agentd`` process on a temp socket and state dir, and talk to it.

Shared by the integration, e2e and reliability tests. Nothing here is faked:
the daemon is ``python -m agentd run`` in a subprocess; the client speaks the
wire protocol over the real Unix socket.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from agentd import wire

REPO = Path(__file__).resolve().parents[1]


class Daemon:
    """One agentd process with its own state dir, runtime dir and config."""

    def __init__(self, root: Path, config_text: str = "", env: dict[str, str] | None = None) -> None:
        self.root = root
        self.state_dir = root / "state"
        self.runtime_dir = root / "run"
        self.socket = self.runtime_dir / "agentd.sock"
        self.config = root / "agentd.toml"
        self.log = root / "agentd.log"
        self.config.write_text(config_text)
        self.extra_env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        #: where :meth:`log_text` starts reading the log (bytes; :meth:`mark_log`)
        self.log_mark = 0

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            AGENTD_STATE_DIR=str(self.state_dir),
            AGENTD_RUNTIME_DIR=str(self.runtime_dir),
            AGENTD_SOCKET=str(self.socket),
            AGENTD_CONFIG=str(self.config),
            AGENTD_NO_AUTOSTART="1",
            NO_COLOR="1",
        )
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 15.0) -> "Daemon":
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentd", "run"],
            env=self.env,
            stdout=logf,
            stderr=subprocess.STDOUT,
            cwd=self.root,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agentd exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                with Client(self.socket):
                    return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"agentd did not start within {timeout}s:\n{self.log.read_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def mark_log(self) -> None:
        """From now on :meth:`log_text` reads only what the daemon logs after this (a test of a shared daemon)."""
        self.log_mark = self.log.stat().st_size if self.log.exists() else 0

    def log_text(self) -> str:
        """The daemon's log since :meth:`mark_log` (all of it when never marked)."""
        with self.log.open("rb") as f:
            f.seek(self.log_mark)
            return f.read().decode(errors="replace")

    def log_events(self) -> list[dict[str, Any]]:
        """The daemon's JSON log lines (its whole log), decoded; other lines (a runtime's own stderr) skipped."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                out.append(msgspec.json.decode(line))
            except msgspec.DecodeError:
                pass
        return out

    def close_all(self) -> None:
        """Close every open conversation (a running turn is cancelled, the runtime lets it go).

        Raises AssertionError when the daemon is no longer running (it is then left stopped).
        """
        assert self.proc is not None and self.proc.poll() is None, f"agentd exited with {self.proc and self.proc.returncode}"
        with Client(self.socket, timeout=60) as client:
            for conv in client.request(wire.List):
                client.request(wire.Close, conversation=conv["id"])

    def client(self) -> "Client":
        return Client(self.socket)

    def agentctl(self, *args: str, input: str | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "agentctl", "--socket", str(self.socket), *args],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
        )

    def journal(self, conversation: str) -> list[dict[str, Any]]:
        path = self.state_dir / "conversations" / conversation / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def record(self, conversation: str) -> dict[str, Any]:
        """The conversation's record: the running daemon's (``show``), else ``record.json`` on disk.

        On disk the record is a checkpoint that a running turn does not update (the journal is the
        durable start marker); use :meth:`disk_record` to read exactly what is on disk.
        """
        if self.proc is not None and self.proc.poll() is None:
            try:
                with Client(self.socket) as client:
                    from agentd import wire

                    return client.request(wire.Show, conversation=conversation)["record"]
            except Exception:  # not answering (starting, stopping) or no such conversation: the disk says
                pass
        return self.disk_record(conversation)

    def disk_record(self, conversation: str) -> dict[str, Any]:
        return json.loads((self.state_dir / "conversations" / conversation / "record.json").read_text())


class Client:
    """A minimal blocking client of the control protocol, for tests."""

    def __init__(self, path: Path, *, hello: bool = True, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        self.next_id = 1
        self.pushed: list[Any] = []
        first = self.read()
        assert isinstance(first, wire.HelloFrame), first
        if hello:
            self.send_raw(wire.encode(wire.Hello(id=0, protocol=wire.PROTOCOL_VERSION, client="tests")))
            reply = self.read()
            assert isinstance(reply, wire.ResultFrame), reply

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.file.close()
            self.sock.close()
        except OSError:
            pass

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> Any:
        line = self.file.readline()
        if not line:
            raise EOFError("agentd closed the connection")
        return wire.decode_server_frame(line.rstrip(b"\n"))

    def request(self, op: type, **fields: Any) -> Any:
        """Send one request and return its decoded result (raw JSON value); raise on error.

        Frames pushed meanwhile are kept in ``self.pushed``.
        """
        rid = self.next_id
        self.next_id += 1
        self.send_raw(wire.encode(op(id=rid, **fields)))
        while True:
            frame = self.read()
            if isinstance(frame, (wire.ResultFrame, wire.ErrorFrame)) and frame.id == rid:
                if isinstance(frame, wire.ErrorFrame):
                    raise wire.error_from_body(frame.error)
                return msgspec.json.decode(frame.result)
            self.pushed.append(frame)

    def subscribe(self, conversation: str | None, after: int = 0, snapshot: bool = True) -> int:
        rid = self.next_id
        self.request(wire.Subscribe, conversation=conversation, after=after, snapshot=snapshot)
        return rid

    def frames(self, timeout: float = 10.0) -> Iterator[Any]:
        """Pushed frames, first those buffered, then as they arrive, until ``timeout`` of silence."""
        while self.pushed:
            yield self.pushed.pop(0)
        self.sock.settimeout(timeout)
        while True:
            yield self.read()

    def follow(self, until_run: str, timeout: float = 30.0) -> list[wire.Record]:
        """Records of pushed event frames until the turn ``until_run`` ends."""
        records: list[wire.Record] = []
        deadline = time.monotonic() + timeout
        for frame in self.frames(timeout):
            if isinstance(frame, wire.LaggedFrame):
                # Nothing more comes for that subscription: say so now, not after `timeout` of silence.
                raise AssertionError(f"cut off for lag while following turn {until_run}: {frame}")
            if isinstance(frame, wire.EventFrame):
                rec = wire.decode_record(frame.record)
                records.append(rec)
                if rec.type == "turn" and rec.run == until_run:
                    state = msgspec.json.decode(rec.data)["state"]
                    if state != "working":
                        return records
            if time.monotonic() > deadline:
                raise TimeoutError(f"turn {until_run} did not end; got {[r.type for r in records]}")
        return records


def drive_pty(argv: list[str], env: dict[str, str], cwd: Path, replies: list[tuple[str, str]],
              timeout: float = 30.0) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal, typing each reply when its prompt shows."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.chdir(cwd)
        os.execve(argv[0], argv, env)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:
                break
            if not data:
                break
            out += data
            if replies and replies[0][0].encode() in out.rsplit(b"\n", 1)[-1]:
                os.write(fd, replies.pop(0)[1].encode() + b"\n")
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")
