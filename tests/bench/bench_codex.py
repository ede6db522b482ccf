"""A real Codex turn through agentd, against the same turn driven directly on ``codex app-server``.

Both sides run the real Codex CLI (installed from tests/e2e's lock file, as
the e2e tests do) with the same model endpoint: the scripted model server of
tests/e2e on 127.0.0.1, in a process of its own, answering with plain streamed
text (``_ModelServerProcess`` of the Copilot benchmark). Each side has its
app-server started and a thread open before the clock runs (one warm-up turn
each); then their turns alternate.

* through agentd: ``send`` on the socket until the turn's terminal ``turn``
  record arrives on a subscription (what ``agentctl run`` waits for);
* directly: ``turn/start`` written to the app-server's stdin until its
  ``turn/completed`` notification is read from its stdout, by a plain blocking
  client in the bench process (the least a client can do).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ._common import REPO, Ctx, Result
from .bench_copilot import ANSWER, PROMPT, _Cpu, _ModelServerProcess, _ThroughAgentd, alternate

E2E = REPO / "tests" / "e2e"
MODEL = "scripted-model"
KEY_ENV = "AGENTD_BENCH_MODEL_KEY"
#: Codex settings both sides get: its network extras off, no retries
OVERRIDES = ["features.plugins=false", "analytics.enabled=false"]


def _cli() -> str:
    if str(E2E) not in sys.path:
        sys.path.insert(0, str(E2E))
    from installs import install_codex_cli  # tests/e2e/installs.py

    return str(install_codex_cli(E2E))


def _provider_overrides(url: str) -> list[str]:
    """The same ``-c`` options agentd's codex provider passes for a [providers.codex.model_provider]."""
    base = "model_providers.agentd"
    return ['model_provider="agentd"', f'{base}.name="agentd"', f"{base}.base_url={json.dumps(url)}",
            f'{base}.wire_api="responses"', f"{base}.env_key={json.dumps(KEY_ENV)}",
            f"{base}.request_max_retries=0", f"{base}.stream_max_retries=0", *OVERRIDES]


class _Direct:
    """``codex app-server`` spoken to directly: newline-delimited JSON-RPC on its stdio."""

    def __init__(self, cli: str, url: str, home: Path, work: Path) -> None:
        argv = [cli, "app-server"]
        for o in _provider_overrides(url):
            argv += ["-c", o]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env={**os.environ, "CODEX_HOME": str(home)}, cwd=str(work), bufsize=0)
        self._ids = iter(range(1, 1 << 30))
        self._lines = self._reader()
        self.request("initialize", {"clientInfo": {"name": "agentd-bench", "version": "0"}})
        self._write({"method": "initialized"})
        started = self.request("thread/start", {"cwd": str(work), "model": MODEL, "approvalPolicy": "on-request",
                                                "sandbox": "workspace-write"})
        self.thread = started["thread"]["id"]

    def _reader(self) -> Any:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            yield json.loads(line)
        raise RuntimeError("the app-server closed its output")

    def _write(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")

    def request(self, method: str, params: Any) -> Any:
        rid = next(self._ids)
        self._write({"id": rid, "method": method, "params": params})
        for msg in self._lines:
            if msg.get("id") == rid and "method" not in msg:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result")
        raise RuntimeError("no answer")

    def turn(self) -> float:
        t0 = time.perf_counter()
        self._write({"id": next(self._ids), "method": "turn/start",
                     "params": {"threadId": self.thread, "input": [{"type": "text", "text": PROMPT, "text_elements": []}]}})
        for msg in self._lines:
            if msg.get("method") == "turn/completed":
                status = msg["params"]["turn"]["status"]
                if status != "completed":
                    raise RuntimeError(f"the direct turn ended {status}: {msg['params']['turn'].get('error')}")
                return time.perf_counter() - t0
        raise RuntimeError("no end of turn")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _agentd_config(cli: str, url: str, home: Path) -> str:
    q = json.dumps
    return ("[providers.copilot]\nenabled = false\n[providers.claude]\nenabled = false\n"
            f"[providers.codex]\ncli_path = {q(cli)}\ncodex_home = {q(str(home))}\nmodel = {q(MODEL)}\n"
            f"overrides = {q(OVERRIDES)}\n"
            f"[providers.codex.model_provider]\nbase_url = {q(url)}\napi_key_env = {q(KEY_ENV)}\n"
            "request_max_retries = 0\nstream_max_retries = 0\n")


def bench_codex(ctx: Ctx) -> Result:
    name = "Codex turn through agentd (real app-server, scripted model)"
    try:
        cli = _cli()
    except Exception as exc:
        reason = f"the Codex CLI could not be installed: {exc}"
        ctx.log(f"  SKIP: {reason}")
        return Result(name, "s", skipped=reason, target="<= 1.05x baseline")
    turns = 2 if ctx.quick else 10
    root = ctx.scratch("codex")
    server = _ModelServerProcess(root / "model-requests.jsonl")
    os.environ[KEY_ENV] = "sk-agentd-bench-dummy-key"
    cpu = _Cpu()
    ours, base = alternate(
        root, server, cpu, turns,
        lambda home, work: _ThroughAgentd(ctx, cli, server.url, home, work, provider="codex",
                                          config=_agentd_config(cli, server.url, home)),
        lambda home, work: _Direct(cli, server.url, home, work),
        lambda direct, daemon: {"cli": direct.proc.pid})
    r = Result(name, "s", ours, base, baseline_name="the same turn on codex app-server directly", higher=False,
               target="<= 1.05x baseline (median of 10)")
    r.met = (r.ratio or 99) <= 1.05 if not ctx.quick else None
    r.notes.append(f"{turns} turns each, alternating, after one warm-up turn each; "
                   f"{(r.median - r.base_median) * 1000:+.0f} ms per turn through agentd; answer of "
                   f"{len(ANSWER.split())} words, streamed")
    if cpu.ms.get(("agentd", "agentd")):
        per = {key: ms / turns for key, ms in cpu.ms.items()}
        r.notes.append(
            f"CPU per turn (from /proc): through agentd, agentd {per['agentd', 'agentd']:.1f} ms, the app-server "
            f"{per['agentd', 'cli']:.1f} ms, the bench client reading agentd's frames {per['agentd', 'bench']:.1f} ms; "
            f"directly, the bench client {per['direct', 'bench']:.1f} ms, the app-server {per['direct', 'cli']:.1f} ms"
        )
    return r


__all__ = ["bench_codex"]
