"""A real Copilot turn through agentd, against the same turn driven directly with github-copilot-sdk.

Both sides run the real Copilot CLI (installed from tests/e2e's lock file,
as the e2e tests do) with bring-your-own-key pointed at the scripted model
server of tests/e2e on 127.0.0.1 (a process of its own), answering with
plain streamed text. Each
side has its CLI started and a session open before the clock runs (one
warm-up turn each); then their turns alternate.

* through agentd: ``send`` on the socket until the turn's terminal ``turn``
  record arrives on a subscription (what ``agentctl run`` waits for);
* directly: ``session.send`` until the SDK reports ``session.idle``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import msgspec

from agentd import wire

from ._common import REPO, BenchDaemon, Ctx, Result

E2E = REPO / "tests" / "e2e"
MODEL = "scripted-model"
KEY_ENV = "AGENTD_BENCH_MODEL_KEY"
ANSWER = "Hello from the scripted model. " * 8
PROMPT = "Say hello, please."


def _cli() -> str:
    if str(E2E) not in sys.path:
        sys.path.insert(0, str(E2E))
    from conftest import install_copilot_cli  # tests/e2e/conftest.py

    return str(install_copilot_cli(E2E))


def sdk_client(cli: str, home: Path, work: Path) -> Any:
    """A github-copilot-sdk client (not started) for the CLI at ``cli``, its state in ``home``."""
    from copilot import CopilotClient, RuntimeConnection

    return CopilotClient(
        connection=RuntimeConnection.for_stdio(path=cli),
        working_directory=str(work),
        env={k: v for k, v in os.environ.items() if k != KEY_ENV},
        base_directory=str(home),
        use_logged_in_user=False,
        client_info={"application_name": "agentd"},
    )


async def create_session(client: Any, url: str, work: Path, on_event: Callable[[Any], None]) -> Any:
    """A session on ``client`` with the same options as agentd's copilot provider: the same handlers
    (which give the agent the same tools), streaming, a title, bring-your-own-key to ``url``; only
    the callbacks differ."""

    def on_permission(request: Any, invocation: Any) -> Any:
        raise RuntimeError("the bench turn asks no permission")

    async def on_question(*args: Any) -> Any:
        raise RuntimeError("the bench turn asks no question")

    return await client.create_session(
        on_event=on_event,
        on_permission_request=on_permission,
        on_user_input_request=on_question,
        on_elicitation_request=on_question,
        on_exit_plan_mode_request=on_question,
        streaming=True,
        working_directory=str(work),
        client_name="agentd",
        name="bench",
        provider={"type": "openai", "base_url": url, "api_key": os.environ[KEY_ENV]},
        model=MODEL,
    )


class _Direct:
    """The SDK driven directly, on an asyncio loop in a thread of its own."""

    def __init__(self, cli: str, url: str, home: Path, work: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-copilot-sdk", daemon=True)
        self.thread.start()
        self.cli, self.url, self.home, self.work = cli, url, home, work
        self.idle: asyncio.Event | None = None
        self.call(self._start())

    def call(self, coro: Any, timeout: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        from copilot.generated.session_events import SessionEventType

        self.client = sdk_client(self.cli, self.home, self.work)
        await self.client.start()
        self.idle = asyncio.Event()

        def on_event(event: Any) -> None:
            if event.type is SessionEventType.SESSION_IDLE:
                assert self.idle is not None
                self.idle.set()

        self.session = await create_session(self.client, self.url, self.work, on_event)

    async def _turn(self) -> float:
        assert self.idle is not None
        self.idle.clear()
        t0 = time.perf_counter()
        await self.session.send(PROMPT)
        await self.idle.wait()
        return time.perf_counter() - t0

    def turn(self) -> float:
        return self.call(self._turn())

    def close(self) -> None:
        try:
            self.call(self.client.stop(), timeout=30)
        except Exception:
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class _ThroughAgentd:
    """agentd with ``provider`` configured (by default the Copilot CLI with ``cli`` and ``home``), one conversation open."""

    def __init__(self, ctx: Ctx, cli: str, url: str, home: Path, work: Path, *, provider: str = "copilot",
                 config: str = "") -> None:
        q = json.dumps
        config = config or (
            "[providers.copilot]\n"
            f"cli_path = {q(cli)}\ncopilot_home = {q(str(home))}\n"
            "\n[providers.copilot.byok]\n"
            f'type = "openai"\nbase_url = {q(url)}\napi_key_env = {q(KEY_ENV)}\nmodel = {q(MODEL)}\n'
        )
        self.daemon = BenchDaemon(ctx.scratch(f"agentd-{provider}"), config).start()
        self.client = self.daemon.client()
        self.client.sock.settimeout(120)
        self.cid = self.client.request(wire.New, provider=provider, workdir=str(work), title="bench")["id"]
        self.client.subscribe(self.cid, after=1 << 60, snapshot=False)

    def turn(self) -> float:
        t0 = time.perf_counter()
        run = self.client.request(wire.Send, conversation=self.cid, text=PROMPT)["run"]
        for frame in self.client.frames(timeout=120):
            if isinstance(frame, wire.EventFrame):
                rec = wire.decode_record(frame.record)
                if rec.type == "turn" and rec.run == run:
                    state = msgspec.json.decode(rec.data)["state"]
                    if state != "working":
                        if state != "completed":
                            raise RuntimeError(f"the turn through agentd ended {state}: {rec.data!r}")
                        return time.perf_counter() - t0
        raise RuntimeError("no end of turn")

    def close(self) -> None:
        self.client.close()
        self.daemon.stop()


class _ModelServerProcess:
    """tests/e2e's scripted model server in a process of its own, as a model API would be.

    In the benchmark's own process it would share a GIL with whichever side's
    client runs there (the SDK's event parsing, or the reading of agentd's
    frames), and each side's work would slow the model's stream differently.
    """

    def __init__(self, log: Path) -> None:
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); from modelserver import ModelServer\n"
            "s = ModelServer(sys.argv[2], model=sys.argv[3]).start(); s.answer_text_only(sys.argv[4])\n"
            "print(s.url, flush=True); sys.stdin.read(); s.stop()\n"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(E2E), str(log), MODEL, ANSWER],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url:
            raise RuntimeError(f"the scripted model server did not start (exit {self.proc.wait()})")

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _cpu_ms(pid: int) -> float:
    """CPU time (user + system) a process has used so far, in ms; 0 when /proc cannot tell (not Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (to find the Copilot CLI each side started); [] where /proc cannot tell."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


class _Cpu:
    """CPU ms used during each side's turns, by process: ``(side, "agentd" | "cli" | "bench")``."""

    def __init__(self) -> None:
        self.ms: dict[tuple[str, str], float] = {}

    def turn(self, side: str, pids: dict[str, int], fn: Callable[[], float]) -> float:
        """Run one turn (``fn``, returning its wall time), adding the CPU of ``pids`` and of this process."""
        before = {name: _cpu_ms(pid) for name, pid in pids.items()}
        t0 = time.process_time()
        wall = fn()
        used = {name: _cpu_ms(pid) - before[name] for name, pid in pids.items()}
        used["bench"] = (time.process_time() - t0) * 1000
        for name, ms in used.items():
            self.ms[side, name] = self.ms.get((side, name), 0.0) + ms
        return wall


def alternate(root: Path, server: _ModelServerProcess, cpu: _Cpu, turns: int,
              through_agentd: Callable[[Path, Path], Any], direct: Callable[[Path, Path], Any],
              direct_pids: Callable[[Any, int], dict[str, int]]) -> tuple[list[float], list[float]]:
    """Both sides' turn times: each started (home and work under ``root/<side>``), one warm-up turn each,
    then ``turns`` turns alternating, CPU counted into ``cpu``. Stops both sides and ``server``."""
    ours: list[float] = []
    base: list[float] = []
    sides: list[Any] = []
    try:
        for side in ("agentd", "direct"):
            (root / side / "home").mkdir(parents=True)
            (root / side / "work").mkdir()
        sides.append(through_agentd(root / "agentd" / "home", root / "agentd" / "work"))
        sides.append(direct(root / "direct" / "home", root / "direct" / "work"))
        ag, di = sides
        ag.turn()  # warm-up: the first turn pays for lazy work on both sides
        di.turn()
        daemon = ag.daemon.proc.pid
        through = {"agentd": daemon, "cli": next(iter(_children(daemon)), 0)}
        alone = direct_pids(di, daemon)
        for _ in range(turns):
            ours.append(cpu.turn("agentd", through, ag.turn))
            base.append(cpu.turn("direct", alone, di.turn))
    finally:
        for side in sides:
            side.close()
        server.stop()
    return ours, base


def bench_copilot(ctx: Ctx) -> Result:
    name = "Copilot turn through agentd (real CLI, scripted model)"
    try:
        cli = _cli()
    except Exception as exc:
        reason = f"the Copilot CLI could not be installed: {exc}"
        ctx.log(f"  SKIP: {reason}")
        return Result(name, "s", skipped=reason, target="<= 1.02x baseline")
    turns = 2 if ctx.quick else 10
    root = ctx.scratch("copilot")
    server = _ModelServerProcess(root / "model-requests.jsonl")
    os.environ[KEY_ENV] = "sk-agentd-bench-dummy-key"
    cpu = _Cpu()

    def direct_pids(direct: _Direct, daemon: int) -> dict[str, int]:
        cli = [p for p in _children(os.getpid()) if p not in (daemon, server.proc.pid)]
        return {"cli": cli[0] if len(cli) == 1 else 0}

    ours, base = alternate(root, server, cpu, turns,
                           lambda home, work: _ThroughAgentd(ctx, cli, server.url, home, work),
                           lambda home, work: _Direct(cli, server.url, home, work), direct_pids)
    r = Result(name, "s", ours, base, baseline_name="the same turn with github-copilot-sdk directly", higher=False,
               target="<= 1.02x baseline (median of 10)")
    r.met = (r.ratio or 99) <= 1.02 if not ctx.quick else None
    r.notes.append(f"{turns} turns each, alternating, after one warm-up turn each; "
                   f"{(r.median - r.base_median) * 1000:+.0f} ms per turn through agentd")
    if cpu.ms.get(("agentd", "agentd")):
        per = {key: ms / turns for key, ms in cpu.ms.items()}
        r.notes.append(
            f"CPU per turn (from /proc): through agentd, agentd {per['agentd', 'agentd']:.1f} ms (its SDK thread "
            f"included), the Copilot CLI {per['agentd', 'cli']:.1f} ms, the bench client reading agentd's frames "
            f"{per['agentd', 'bench']:.1f} ms; directly, the bench process (the SDK) {per['direct', 'bench']:.1f} ms, "
            f"the Copilot CLI {per['direct', 'cli']:.1f} ms"
        )
    r.notes.append("a turn's start is its prompt record in the journal (under the journal's fsync policy); "
                   "the conversation record is a checkpoint written at the turn's end, after the end was sent")
    if r.met is False:
        budget = r.base_median * 0.02 * 1000
        extra_cpu = (cpu.ms.get(("agentd", "agentd"), 0.0) - cpu.ms.get(("direct", "bench"), 0.0)) / turns
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        r.notes.append(
            f"why: the 1.02x budget is {budget:.1f} ms per turn here. "
            "The request and the hops between threads and processes (client -> agentd -> SDK thread -> CLI and back) "
            f"take about 1.5 ms more (timestamps). And CPU: the CLI keeps one of the {cores} cores busy for the whole "
            f"turn, while agentd spends {extra_cpu:.0f} ms of CPU per turn more than the SDK alone (the CPU line above: "
            "taking each event into trio, journaling and publishing it, writing it to the client), on the core that "
            "the SDK's thread and the client share. Profiled with py-spy and per-function thread CPU time, no single "
            "part of that dominates"
        )
    return r
