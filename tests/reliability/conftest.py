"""Fixtures of the reliability and security tests: a real daemon with a fast-starting config."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentd import wire
from daemon_harness import REPO, Client, Daemon

SCRIPTS = Path(__file__).parent / "scripts"
WAIT = REPO / "conf" / "scripts" / "wait.toml"
ECHO = REPO / "conf" / "scripts" / "echo.toml"

#: The SDK-backed providers are off: importing them costs seconds per daemon start.
FAST = """\
[providers.copilot]
enabled = false
[providers.claude]
enabled = false
"""


def fast_daemon(root: Path, extra: str = "", env: dict[str, str] | None = None) -> Daemon:
    root.mkdir(parents=True, exist_ok=True)
    return Daemon(root, FAST + extra, env=env)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = fast_daemon(tmp_path).start()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    w = tmp_path / "work"
    w.mkdir()
    return w


def new(client: Client, workdir: Path, script: Path | str = ECHO, **kw: Any) -> str:
    return client.request(wire.New, provider="script", workdir=str(workdir), model=str(script), **kw)["id"]


def turn_state(rec: wire.Record) -> str:
    return msgspec.json.decode(rec.data)["state"]


def run_turn(client: Client, cid: str, text: str, timeout: float = 30) -> list[wire.Record]:
    """Send ``text`` to a conversation ``client`` subscribes to; the records until its turn ends."""
    run = client.request(wire.Send, conversation=cid, text=text)["run"]
    return client.follow(run, timeout=timeout)


def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError("condition not met")


def log_events(d: Daemon) -> list[dict[str, Any]]:
    """The daemon's JSON log lines, decoded (other lines skipped)."""
    return d.log_events()


# The figures RELIABILITY.md quotes (frames fuzzed: fuzz.FRAMES, faults injected: figures.FAULTS) are
# printed after a run by tests/conftest.py, which adds up those of every pytest-xdist worker.
