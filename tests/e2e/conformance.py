"""What every conformance module shares: the per-runtime fixtures and the agentctl helpers.

A conformance module is ``tests/e2e/test_conformance*.py`` with a ``SCENARIOS`` dict
(scenario -> the capabilities it needs); its tests take the ``runtime`` and
``daemon`` fixtures (tests/e2e/conftest.py) and a ``scenario`` parameter, and the
matrix (tests/e2e/conftest.py) gets one column per scenario.

A module's cells of one runtime share that runtime and one daemon (on one xdist worker);
each cell gets a fresh view of them (no earlier model requests, the log from its start,
its conversations closed after it). A module that needs more in agentd.toml overrides the
module-scoped ``daemon_config`` fixture; a cell that stops or kills the daemon or its
runtime processes, or needs a daemon that never ran anything, is marked
``@pytest.mark.own_daemon``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from daemon_harness import Daemon
from runtimes_e2e import Runtime

# --------------------------------------------------------------------------- helpers


def _json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout)


class Follower:
    """``agentctl send CONV TEXT --follow --json`` in the background, its lines collected as they come."""

    def __init__(self, d: Daemon, cid: str, text: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentctl", "--socket", str(d.socket), "send", cid, text, "--follow", "--json"],
            env=d.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=d.root,
        )
        self.lines: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def wait_for(self, predicate, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if predicate(line):
                    return line
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise TimeoutError(f"no such line; got {[l.get('type') for l in self.lines][-20:]}; stderr: {self.stderr()}")

    def finish(self, timeout: float = 120.0) -> int:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(5)
        return code

    def stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return ""
        return self.proc.stderr.read()

    @property
    def result(self) -> dict[str, Any]:
        return self.lines[-1] if self.lines and self.lines[-1].get("type") == "result" else {}


def _pending(d: Daemon, cid: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = _json(d.agentctl("show", cid, "--json"))
        if info.get("pending"):
            return info["pending"][0]
        time.sleep(0.05)
    raise TimeoutError("no interaction became pending")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _turn_ends(d: Daemon, cid: str) -> list[dict[str, Any]]:
    return [r for r in d.journal(cid) if r["type"] == "turn" and r["data"]["state"] != "working"]


def _supported(d: Daemon, runtime: Runtime, scenario: str, request: pytest.FixtureRequest) -> bool:
    """Whether the runtime can do ``scenario`` by the capabilities the real daemon reports.

    A scenario it cannot do is its matrix cell ``unsupported``: the test checks that the
    runtime says so outright (each capability present and false), and goes no further.
    """
    providers = {p["name"]: p for p in _json(d.agentctl("providers", "--json"))["providers"]}
    info = providers[runtime.provider]
    assert info["available"], f"{runtime.provider} is not available: {info.get('error')}"
    caps = info["capabilities"]
    missing = [cap for cap in request.module.SCENARIOS[scenario] if not caps.get(cap)]
    if not missing:
        return True
    assert all(caps.get(cap) is False for cap in missing), f"{runtime.name} does not report {missing}: {caps}"
    why = f"{runtime.name} reports {', '.join(missing)} = false"
    print(f"\nunsupported: {why}")
    request.node.user_properties.append(("unsupported", why))
    return False


def _new(d: Daemon, runtime: Runtime, workdir: Path, scenario: str, *extra: str) -> str:
    """A new conversation's id (its creation time is kept in ``runtime.created``)."""
    runtime.before_create(scenario)
    runtime.created = time.time()
    args = ["new", "-p", runtime.provider, "--cwd", str(workdir), "--json", *extra]
    model = runtime.model_for(scenario)
    if model:
        args += ["-m", model]
    return _json(d.agentctl(*args))["id"]
