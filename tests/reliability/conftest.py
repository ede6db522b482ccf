"""Fixtures of the reliability and security tests: a real daemon with a fast-starting config."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentd import wire
from daemon_harness import REPO, Client, Daemon
from environment import unavailable

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


#: the scripted ACP agent of these tests (its environment: see its docstring)
FAULT_AGENT = Path(__file__).parent / "acp_fault_agent.py"


def fault_agent_daemon(root: Path, name: str, agent_env: dict[str, Path | str], *, before: str = "",
                       provider: str = "") -> Daemon:
    """A fast daemon (not started) on ``root`` whose provider ``acp:<name>`` runs :data:`FAULT_AGENT`
    with ``agent_env`` (variable -> file it logs to or keeps, or a setting); ``before``: config ahead of that
    provider's table, ``provider``: more of its keys. The agent's prompts log, if given
    (``FAULT_AGENT_PROMPTS``), is what :func:`agent_prompts` reads."""
    env = ", ".join(f"{k} = {json.dumps(str(v))}" for k, v in agent_env.items())
    config = (f"{before}[providers.acp.{name}]\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(FAULT_AGENT))}]\n"
              f"env = {{ {env} }}\nstartup_timeout_s = 10.0\n{provider}")
    d = fast_daemon(root, config)
    d.prompts = agent_env.get("FAULT_AGENT_PROMPTS")  # type: ignore[attr-defined]
    return d


def agent_prompts(d: Daemon) -> list[str]:
    """The prompts the agents of :func:`fault_agent_daemon` received, in order."""
    path: Path | None = d.prompts  # type: ignore[attr-defined]
    return [json.loads(line) for line in path.read_text().splitlines()] if path and path.exists() else []


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


#: a second local user the security tests create (as root) to act as "another local user"
OTHER_USER = "agentd-rt-other"


@pytest.fixture(scope="module")
def other_user() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        unavailable("creating a second user needs root")
    from filelock import FileLock

    # One process at a time: tests run in parallel (pytest-xdist), and a second useradd of the
    # same user fails (or finds /etc/passwd locked).
    with FileLock(os.path.join(tempfile.gettempdir(), f"agentd-tests-{OTHER_USER}.lock"), timeout=120):
        try:
            return pwd.getpwnam(OTHER_USER)
        except KeyError:
            pass
        proc = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            unavailable(f"useradd failed: {proc.stderr.strip()}")
        return pwd.getpwnam(OTHER_USER)
