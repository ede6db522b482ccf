"""What a person starting and leaving agents feels: the first streamed text from a warm pool, the
memory of idle Claude conversations after idle release, and the first prompt after a release.

All on real runtimes (installed as the e2e tests install them) pointed at tests/e2e's scripted
model server in a process of its own (``_ModelServerProcess`` of tests/bench/_turns.py), answering
with plain streamed text.

* ``warm``: ``agentctl run`` (a new process, as a user types it) on a running daemon with
  ``[runtimes] warm = 1``, spawn until the answer's first text is on its stdout; baseline, the
  Copilot runtime's own cold path in the bench process: a github-copilot-sdk client started (the
  CLI spawned), a session created, the same prompt sent, until its first
  ``assistant.message_delta``. Alternating; before each run the pool has refilled (its log says
  ``warm_pool.ready``), and every run is checked to have taken the pooled session.
* ``claude-idle``: N Claude conversations each opened and given one turn, with
  ``idle_release_s = 1``; once every runtime was released, the RSS of agentd and all its
  children, against one Claude Code process (each conversation's, measured right after its turn:
  the median). Then the first prompt after a release against a prompt to the same conversation
  with its runtime running (send until the turn's end, alternating), the added time.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from agentd import wire

from ._common import BenchDaemon, Client, Ctx, Result, agentctl_argv, descendants, rss_kb, wall
from ._turns import ANSWER, KEY_ENV, MODEL, PROMPT, _ModelServerProcess
from .bench_claude import claude_config, claude_toml
from .bench_copilot import _cli, create_session, sdk_client

FIRST = ANSWER.split()[0].encode()  # the answer's first word, as agentctl prints it


def _log_count(daemon: BenchDaemon, event: str) -> int:
    n = 0
    for line in daemon.log.read_text(errors="replace").splitlines():
        if f'"event":"{event}"' in line:
            n += 1
    return n


def _wait_log(daemon: BenchDaemon, event: str, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while _log_count(daemon, event) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {count} x {event} in agentd's log: {daemon.log.read_text()[-3000:]}")
        time.sleep(0.02)


def _agentctl_first_text(daemon: BenchDaemon, provider: str, work: Path) -> float:
    """Seconds from spawning ``agentctl run`` until the answer's first word is on its stdout; waits for its exit."""
    argv = [*agentctl_argv(), "--socket", str(daemon.socket), "run", "-p", provider, "--cwd", str(work), PROMPT]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    fd, buf, first = proc.stdout.fileno(), b"", 0.0
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        if not first and FIRST in buf:
            first = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else b""
    if proc.wait() != 0 or not first:
        raise RuntimeError(f"agentctl run exited {proc.returncode} (first text seen: {bool(first)}): "
                           f"{buf[-1000:]!r} {err[-1000:]!r}")
    return first


class _ColdCopilot:
    """The Copilot runtime's own cold path, github-copilot-sdk on an asyncio loop in a thread of its own."""

    def __init__(self, cli: str, url: str, home: Path, work: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-cold-copilot", daemon=True)
        self.thread.start()
        self.cli, self.url, self.home, self.work = cli, url, home, work

    def first_text(self) -> float:
        return asyncio.run_coroutine_threadsafe(self._first_text(), self.loop).result(180)

    async def _first_text(self) -> float:
        from copilot.generated.session_events import SessionEventType

        first = asyncio.Event()
        idle = asyncio.Event()

        def on_event(event: Any) -> None:
            if event.type is SessionEventType.ASSISTANT_MESSAGE_DELTA:
                first.set()
            elif event.type is SessionEventType.SESSION_IDLE:
                idle.set()

        t0 = time.perf_counter()
        client = sdk_client(self.cli, self.home, self.work)
        try:
            await client.start()
            session = await create_session(client, self.url, self.work, on_event)
            await session.send(PROMPT)
            await asyncio.wait_for(first.wait(), 120)
            elapsed = time.perf_counter() - t0
            await asyncio.wait_for(idle.wait(), 120)
            return elapsed
        finally:
            await client.stop()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def bench_warm(ctx: Ctx) -> Result:
    name = "first streamed text of `agentctl run`, warm = 1 (Copilot CLI)"
    target = "<= 0.5x baseline"
    try:
        cli = _cli()
    except Exception as exc:
        reason = f"the Copilot CLI could not be installed: {exc}"
        ctx.log(f"  SKIP: {reason}")
        return Result(name, "s", skipped=reason, target=target)
    repeats = 2 if ctx.quick else 10
    root = ctx.scratch("warm")
    server = _ModelServerProcess(root / "model-requests.jsonl")
    os.environ[KEY_ENV] = "sk-agentd-bench-dummy-key"
    work = root / "work"
    for d in ("work", "home", "direct-home"):
        (root / d).mkdir()
    q = json.dumps
    config = (
        '[providers]\ndefault = "copilot"\n'
        "[providers.claude]\nenabled = false\n[providers.codex]\nenabled = false\n"
        f"[providers.copilot]\ncli_path = {q(cli)}\ncopilot_home = {q(str(root / 'home'))}\n"
        "[providers.copilot.byok]\n"
        f'type = "openai"\nbase_url = {q(server.url)}\napi_key_env = {q(KEY_ENV)}\nmodel = {q(MODEL)}\n'
        f"[runtimes]\nwarm = 1\nwarm_workdir = {q(str(work))}\n"
    )
    ours: list[float] = []
    base: list[float] = []
    status: list[float] = []  # agentctl's own start and one request: the part of the figure that is not the turn's
    cold = _ColdCopilot(cli, server.url, root / "direct-home", work)
    daemon = BenchDaemon(ctx.scratch("agentd-warm"), config).start()
    try:
        _wait_log(daemon, "warm_pool.ready", 1)
        cold.first_text()  # warm-up: the SDK's imports and the CLI binary's pages, as a user's second run has them
        for i in range(repeats):
            status.append(wall([*agentctl_argv(), "--socket", str(daemon.socket), "status", "--json"], daemon.env))
            ours.append(_agentctl_first_text(daemon, "copilot", work))
            _wait_log(daemon, "warm_pool.ready", i + 2)  # the pool has refilled: the next run is warm too
            base.append(cold.first_text())
        taken, missed = _log_count(daemon, "warm_pool.taken"), _log_count(daemon, "warm_pool.miss")
    finally:
        daemon.stop()
        cold.close()
        server.stop()
    if taken != repeats or missed:
        raise RuntimeError(f"{taken} of {repeats} runs took the pooled session ({missed} misses)")
    r = Result(name, "s", ours, base, higher=False, target=target,
               baseline_name="the runtime's cold path: SDK client start + session + the same prompt")
    r.met = (r.ratio or 99) <= 0.5 if not ctx.quick else None
    r.notes.append(f"{repeats} runs each, alternating; every run took the pooled session (agentd's log: "
                   f"{taken} warm_pool.taken, 0 misses); the pool refilled before each. The figure includes agentctl's "
                   "own start-up (a new Python process); the baseline starts in a process whose SDK is already "
                   "imported, so it pays neither Python's nor the SDK's start-up")
    r.notes.append(f"of the figure, `agentctl status --json` (agentctl's start and one request, measured before each "
                   f"run) takes {statistics.median(status) * 1000:.0f} ms (median); the rest is the new conversation, "
                   "the prompt's way through agentd to the Copilot CLI and the model, and the first delta's way back")
    return r


def _claude_config(url: str, root: Path) -> str:
    return claude_toml(claude_config(url, root)) + "[runtimes]\nidle_release_s = 1.0\n"


def _claude_pids(agentd: int) -> list[int]:
    """agentd's descendants that are Claude Code itself (not the keeper it runs under)."""
    out = []
    for pid in descendants(agentd):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"claude" in Path(argv[0].decode(errors="replace")).name.encode() and b"_launcher" not in b" ".join(argv):
            out.append(pid)
    return out


def _turn(client: Client, cid: str) -> float:
    """Seconds from ``send`` until the turn's terminal record arrives (what ``agentctl send --follow`` waits for)."""
    t0 = time.perf_counter()
    run = client.request(wire.Send, conversation=cid, text=PROMPT)["run"]
    for rec in client.follow(run, timeout=120):
        if rec.type == "turn" and rec.run == run:
            state = msgspec.json.decode(rec.data)["state"]
            if state != "working":
                if state != "completed":
                    raise RuntimeError(f"the turn ended {state}: {rec.data!r}")
                break
    return time.perf_counter() - t0


def _wait_released(agentd: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while _claude_pids(agentd):
        if time.monotonic() > deadline:
            raise TimeoutError(f"Claude Code still runs under agentd after {timeout} s: {_claude_pids(agentd)}")
        time.sleep(0.05)


def bench_claude_idle(ctx: Ctx) -> list[Result]:
    count, repeats = (3, 2) if ctx.quick else (50, 6)
    rss_name = f"RSS of agentd and its children, {count} idle Claude conversations after idle release"
    reopen_name = "first prompt after an idle release (Claude Code)"
    root = ctx.scratch("claude-idle")
    server = _ModelServerProcess(root / "model-requests.jsonl")
    os.environ[KEY_ENV] = "sk-agentd-bench-dummy-key"
    try:
        config = _claude_config(server.url, root)
    except Exception as exc:
        server.stop()
        ctx.log(f"  SKIP: {exc}")
        return [Result(rss_name, "MB", skipped=str(exc), target="<= 1.2x"),
                Result(reopen_name, "s", skipped=str(exc), target="<= +1.5 s")]
    work = root / "work"
    work.mkdir()
    one_claude: list[float] = []
    after_release: list[float] = []
    running: list[float] = []
    daemon = BenchDaemon(ctx.scratch("agentd-claude"), config).start()
    try:
        assert daemon.proc is not None
        pid = daemon.proc.pid
        with daemon.client() as client:
            client.sock.settimeout(120)
            cids = []
            t = time.perf_counter()
            for _ in range(count):
                before = set(_claude_pids(pid))  # the previous conversations' may not be released yet
                cid = client.request(wire.New, provider="claude", workdir=str(work))["id"]
                client.subscribe(cid, after=1 << 60, snapshot=False)
                _turn(client, cid)
                # right after the turn: this conversation's Claude Code, not yet released
                procs = [p for p in _claude_pids(pid) if p not in before]
                if len(procs) == 1:
                    one_claude.append(rss_kb(procs[0]) / 1024)
                cids.append(cid)
            ctx.log(f"  {count} conversations opened, one turn each, in {time.perf_counter() - t:.0f} s")
            _wait_released(pid)
            time.sleep(1.0)
            idle = []
            for _ in range(3):
                idle.append(rss_kb(pid) / 1024)
                time.sleep(0.3)
            status = client.request(wire.Status)
            for _ in range(repeats):
                _wait_released(pid)
                after_release.append(_turn(client, cids[0]))
                running.append(_turn(client, cids[0]))
    finally:
        daemon.stop()
        server.stop()
    if not one_claude:
        raise RuntimeError("no Claude Code process was seen right after a turn")
    rss = Result(rss_name, "MB", idle, one_claude, higher=False, target="<= 1.2x baseline",
                 baseline_name="one Claude Code process (each conversation's, right after its turn)")
    rss.met = (rss.ratio or 99) <= 1.2 if not ctx.quick else None
    rss.notes.append(f"{status['conversations']} conversations open, each with one completed turn; idle_release_s = 1; "
                     f"measured once no Claude Code process ran under agentd; one Claude Code process: "
                     f"{statistics.median(one_claude):.0f} MB median of {len(one_claude)}")
    reopen = Result(reopen_name, "s", after_release, running, higher=False, target="<= +1.5 s over the baseline",
                    baseline_name="a prompt to the same conversation with its runtime running")
    added = (reopen.median or 0) - (reopen.base_median or 0)
    reopen.met = added <= 1.5 if not ctx.quick else None
    reopen.extra["added_s"] = added
    reopen.notes.append(f"send until the turn's end, {repeats} pairs alternating on one conversation: after each "
                        f"release (no Claude Code running), then at once again (running); added {added:+.2f} s")
    return [rss, reopen]
