"""Real agentctl on a pseudo-terminal, its output drawn on a terminal emulator (pyte) as it arrives.

Shared by the live-view tests (tests/integration/test_live_view.py, tests/e2e/test_live_runtimes.py):
they assert on what a person sees at the terminal, and when.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import sys
import termios
import time
from collections.abc import Callable

import pyte

from daemon_harness import Daemon

COLS, ROWS = 100, 300


class Term:
    """One agentctl command on a pseudo-terminal of COLS x ROWS; its output drawn on a pyte screen."""

    def __init__(self, daemon: Daemon, *args: str, env: dict[str, str] | None = None) -> None:
        argv = [sys.executable, "-m", "agentctl", "--socket", str(daemon.socket), *args]
        e = dict(daemon.env if env is None else env)
        e.update(COLUMNS=str(COLS), LINES=str(ROWS), TERM="xterm-256color")
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # pragma: no cover - the child
            os.chdir(daemon.root)
            os.execve(argv[0], argv, e)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        self.screen = pyte.Screen(COLS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.raw = b""
        self.code: int | None = None

    def pump(self, timeout: float = 0.05) -> bool:
        """Read what arrived within ``timeout``; False once the program closed the terminal."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:
            data = b""
        if not data:
            return False
        self.raw += data
        self.stream.feed(data)
        return True

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display).rstrip("\n")

    def wait_for(self, pred: Callable[[str], object], timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred(self.text()):
                return self.text()
            if not self.pump():
                break
        if pred(self.text()):
            return self.text()
        raise AssertionError(f"not seen on the terminal within {timeout}s:\n{self.text()}")

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait_exit(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.pump(0.1):
            pass
        if time.monotonic() >= deadline:
            os.kill(self.pid, signal.SIGKILL)
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        self.code = os.waitstatus_to_exitcode(status)
        return self.code
