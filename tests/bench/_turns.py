"""What the turn benchmarks share: a real runtime's turn through agentd against the same turn driven directly.

Every turn benchmark (copilot, claude, acp, codex) runs the real runtime,
installed as the e2e tests install it, pointed at tests/e2e's scripted model
server in a process of its own (:class:`_ModelServerProcess`), answering
:data:`ANSWER` as plain streamed text to :data:`PROMPT`. :func:`alternate`
starts both sides (agentd with one conversation open, :class:`_ThroughAgentd`;
the direct driver in the bench process), gives each one warm-up turn, then
alternates their turns (in the order of :data:`ROUNDS`) while :class:`_Cpu` counts the CPU each
process used.
:func:`turn_results` makes the two rows of the table per runtime: the turn's
wall time and agentd's own CPU per turn, each against the direct driver's.

* through agentd: ``send`` on the socket until the turn's terminal ``turn``
  record arrives on a subscription (what ``agentctl run`` waits for);
* directly: whatever the least a client of that runtime does (its SDK, or a
  plain blocking JSON-RPC client on its stdio: :class:`_StdioRpc`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from agentd import wire

from ._common import REPO, BenchDaemon, Ctx, Result, descendants

E2E = REPO / "tests" / "e2e"
MODEL = "scripted-model"
KEY_ENV = "AGENTD_BENCH_MODEL_KEY"
ANSWER = "Hello from the scripted model. " * 8
PROMPT = "Say hello, please."
#: the CPU target of every turn benchmark: agentd's CPU per turn against the direct driver's
CPU_TARGET = 1.3
#: The order of the four sides' turns in :func:`alternate` (0 through agentd, 1 direct, 2 through
#: agentd without checkpoints, 3 direct behind the relay): 12 rounds of one turn per side, repeated.
#: Read as one cycle (each round's last turn followed by the next round's first, the last round's
#: by the first's), each side follows each other side exactly 4 times and never itself, and every
#: side has the same gaps between its own turns (2 to 5 other turns): what a side leaves running
#: after its turn (a runtime's after-turn work, agentd's write-behind) weighs on every other side
#: alike. (Starting each round one side later, as before, had each side follow the same other side
#: in 3 rounds of 4.) Found by a search; tests/bench/test_turn_order.py checks these properties.
ROUNDS: tuple[tuple[int, int, int, int], ...] = (
    (0, 1, 2, 3), (0, 1, 2, 3), (0, 1, 2, 3), (0, 2, 1, 3), (2, 0, 1, 3), (2, 1, 3, 0),
    (2, 1, 0, 3), (2, 0, 3, 1), (0, 2, 1, 3), (2, 0, 3, 1), (0, 2, 3, 1), (0, 3, 1, 2),
)
#: turns per side in a full run: whole cycles of :data:`ROUNDS`. The target asks for a median of at
#: least 10; with 10, one run's 95% interval of a Claude Code ratio spanned 0.94x-1.87x (the turns'
#: own spread), so a 2% budget could not be told from noise. With 60, the interval still spanned
#: +-10 to 15%, and two quiet runs of the same code read Claude Code 1.07x and 1.05x, Gemini CLI
#: 1.01x and 1.05x: 180 (four sides of 20 to 60 ms turns: 15 to 45 s per runtime) narrows it by
#: about sqrt(3).
TURNS = 15 * len(ROUNDS)


def turn_count(ctx: Ctx) -> int:
    """How many turns each side runs: 2 in quick mode, else :data:`TURNS`."""
    return 2 if ctx.quick else TURNS


RELAY = Path(__file__).with_name("_relay.py")


class Relay:
    """Starts a direct side's runtime behind :mod:`._relay` (one more process on every message's path,
    doing the least a supervisor must), its journal file in ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.journal = root / "relay-journal"

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run behind the relay."""
        return [sys.executable, str(RELAY), str(self.journal), *argv]

    def pids(self) -> list[int]:
        """The relay processes started by :meth:`argv` (or :meth:`cli`) that run now: found by their journal's path."""
        relay, mark = os.fsencode(RELAY), os.fsencode(self.journal)
        found = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                        argv = f.read().split(b"\0")
                except OSError:
                    continue
                if len(argv) > 2 and argv[1] == relay and argv[2] == mark:
                    found.append(int(entry.name))
        return found

    def cli(self, cli: str) -> str:
        """An executable that runs ``cli`` (with its arguments) behind the relay, for an SDK that takes a CLI path."""
        script = self.root / "relayed-cli"
        script.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in self.argv([cli])) + ' "$@"\n')
        script.chmod(0o755)
        return str(script)


def e2e_path() -> None:
    """Make tests/e2e's helpers (installs, conftest, acp_agents) importable."""
    if str(E2E) not in sys.path:
        sys.path.insert(0, str(E2E))


class _ThroughAgentd:
    """agentd with ``config``, one conversation of ``provider`` open in ``work``, subscribed to."""

    def __init__(self, ctx: Ctx, work: Path, *, provider: str, config: str, checkpoints: bool = True) -> None:
        if not checkpoints:
            config += "\n[checkpoints]\nenabled = false\n"
        name = f"agentd-{provider.replace(':', '-')}{'' if checkpoints else '-no-checkpoints'}"
        self.daemon = BenchDaemon(ctx.scratch(name), config).start()
        self.client = self.daemon.client()
        self.client.sock.settimeout(120)
        self.cid = self.client.request(wire.New, provider=provider, workdir=str(work), title="bench")["id"]
        self.client.subscribe(self.cid, after=1 << 60, snapshot=False)
        #: per turn, how long the turn waited for agentd's checkpoints (before + after), ms, as their records say
        self.checkpoint_ms: list[float] = []

    def turn(self) -> float:
        t0 = time.perf_counter()
        run = self.client.request(wire.Send, conversation=self.cid, text=PROMPT)["run"]
        waited = 0.0
        for frame in self.client.frames(timeout=120):
            if isinstance(frame, wire.EventFrame):
                rec = wire.decode_record(frame.record)
                if rec.type == "checkpoint" and rec.run == run:
                    waited += msgspec.json.decode(rec.data).get("ms") or 0
                if rec.type == "turn" and rec.run == run:
                    state = msgspec.json.decode(rec.data)["state"]
                    if state != "working":
                        if state != "completed":
                            raise RuntimeError(f"the turn through agentd ended {state}: {rec.data!r}")
                        self.checkpoint_ms.append(waited)
                        return time.perf_counter() - t0
        raise RuntimeError("no end of turn")

    def close(self) -> None:
        self.client.close()
        self.daemon.stop()


class _LoopThread:
    """An asyncio loop in a thread of its own, for a direct driver built on an asyncio SDK."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def call(self, coro: Any, timeout: float = 120) -> Any:
        """Run ``coro`` on the loop and return its result (raises what it raises, TimeoutError)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class _StdioRpc:
    """A plain blocking client of newline-delimited JSON-RPC on a runtime's stdio (Codex app-server, ACP).

    ``on_request(method, params)`` answers the runtime's own requests (its
    result; raise to answer an error); by default every request is an error
    of the bench. ``envelope`` goes into every message written (ACP wants ``"jsonrpc": "2.0"``; Codex's
    app-server speaks JSON-RPC without it).
    """

    envelope: dict[str, str] = {}

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env, cwd=str(cwd), bufsize=0)
        self._ids = iter(range(1, 1 << 30))
        self.lines = self._reader()

    def _reader(self) -> Iterator[dict[str, Any]]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "method" in msg and "id" in msg:  # the runtime asks: answered here, never yielded
                try:
                    self.write({**self.envelope, "id": msg["id"], "result": self.on_request(msg["method"], msg.get("params"))})
                except Exception as exc:
                    self.write({**self.envelope, "id": msg["id"], "error": {"code": -32603, "message": str(exc)}})
                continue
            yield msg
        raise RuntimeError(f"{self.proc.args[0]} closed its output (exit {self.proc.poll()})")

    def on_request(self, method: str, params: Any) -> Any:
        raise RuntimeError(f"the bench turn expects no {method} request")

    def write(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")

    def start(self, method: str, params: Any) -> int:
        """Write a request; returns its id."""
        rid = next(self._ids)
        self.write({**self.envelope, "id": rid, "method": method, "params": params})
        return rid

    def wait(self, rid: int, method: str = "") -> Any:
        """Read until the answer to request ``rid``; its result. Raises RuntimeError on an error answer."""
        for msg in self.lines:
            if msg.get("id") == rid and "method" not in msg:
                if "error" in msg:
                    raise RuntimeError(f"{method or rid}: {msg['error']}")
                return msg.get("result")
        raise RuntimeError("no answer")

    def request(self, method: str, params: Any) -> Any:
        return self.wait(self.start(method, params), method)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


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
    """CPU time a process has used so far (every thread), in ms; 0 when /proc cannot tell (not Linux, or gone).

    The sum of its threads' ``se.sum_exec_runtime`` (/proc/PID/task/*/sched, to the ns); where that is
    unreadable, user + system from /proc/PID/stat, in clock ticks (10 ms steps, too coarse for one turn).
    A thread that ended takes its time with it: none of agentd's ends within a turn (trio's idle workers
    live 10 s).
    """
    total, seen = 0.0, False
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                text = (task / "sched").read_text()
            except OSError:
                continue
            at = text.find("se.sum_exec_runtime")
            if at >= 0:
                total += float(text[at:].split(":", 1)[1].split(None, 1)[0])
                seen = True
    except (OSError, ValueError, IndexError):
        seen = False
    if seen:
        return total
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (to find the runtime each side started); [] where /proc cannot tell."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    return [pid, *descendants(pid)] if pid else []


class _Cpu:
    """CPU ms used during each side's turns, per turn, by process: ``(side, "agentd" | "cli" | "bench")``.

    "bench" is this process (``time.process_time``: every thread); the others
    are read from /proc (:func:`_cpu_ms`), and a name given several pids (a
    runtime and the processes it started) counts them all.
    """

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str], list[float]] = {}
        #: through agentd, per turn: how long the turn waited for agentd's checkpoints, ms
        self.checkpoint_ms: list[float] = []
        #: wall time of each turn through an agentd with [checkpoints] enabled = false, s
        self.no_checkpoints_s: list[float] = []
        #: wall time of each turn of the direct driver with its runtime behind :mod:`._relay`, s
        self.relayed_s: list[float] = []

    @property
    def ms(self) -> dict[tuple[str, str], float]:
        """The totals over every turn."""
        return {key: sum(values) for key, values in self.samples.items()}

    def per_turn(self, side: str, name: str) -> float:
        values = self.samples.get((side, name)) or [0.0]
        return sum(values) / len(values)

    def turn(self, side: str, pids: dict[str, list[int]], fn: Callable[[], float]) -> float:
        """Run one turn (``fn``, returning its wall time), recording the CPU of ``pids`` and of this process."""
        before = {name: sum(_cpu_ms(p) for p in group) for name, group in pids.items()}
        t0 = time.process_time()
        wall = fn()
        used = {name: sum(_cpu_ms(p) for p in group) - before[name] for name, group in pids.items()}
        used["bench"] = (time.process_time() - t0) * 1000
        for name, ms in used.items():
            self.samples.setdefault((side, name), []).append(ms)
        return wall


def alternate(root: Path, server: _ModelServerProcess, cpu: _Cpu, turns: int,
              through_agentd: Callable[..., Any], direct: Callable[..., Any],
              direct_pids: Callable[[Any, int], list[int]]) -> tuple[list[float], list[float]]:
    """Both sides' turn times: each started (home and work under ``root/<side>``), one warm-up turn each,
    then ``turns`` rounds of one turn per side in the order of :data:`ROUNDS` (each side follows each
    other side equally often over whole cycles), CPU counted into ``cpu``. ``direct_pids(direct, agentd_pid)`` names
    the runtime's processes on the direct side. Stops both sides and ``server``.

    Two more sides alternate with them, for the notes: ``through_agentd(home, work, checkpoints=False)``
    (what agentd's checkpoints cost, ``cpu.no_checkpoints_s``) and ``direct(home, work, relay=Relay)``,
    the direct driver with its runtime behind :mod:`._relay` (the floor of any supervisor process,
    ``cpu.relayed_s``)."""
    ours: list[float] = []
    base: list[float] = []
    sides: list[Any] = []
    try:
        for side in ("agentd", "direct", "plain", "relayed"):
            (root / side / "home").mkdir(parents=True)
            (root / side / "work").mkdir()
        sides.append(through_agentd(root / "agentd" / "home", root / "agentd" / "work"))
        sides.append(direct(root / "direct" / "home", root / "direct" / "work"))
        sides.append(through_agentd(root / "plain" / "home", root / "plain" / "work", checkpoints=False))
        relay = Relay(root / "relayed")
        sides.append(direct(root / "relayed" / "home", root / "relayed" / "work", relay=relay))
        ag, di, plain, relayed = sides
        for side in sides:
            side.turn()  # warm-up: the first turn pays for lazy work on every side
        daemon = ag.daemon.proc.pid
        through = {"agentd": [daemon], "cli": descendants(daemon)}
        alone = {"cli": direct_pids(di, daemon)}
        bare = {"agentd": [plain.daemon.proc.pid]}
        behind = {"cli": direct_pids(relayed, daemon)}
        if pids := relay.pids():
            behind["relay"] = pids  # its own CPU: the floor of the CPU rows (turn_results)
        order = [
            lambda: ours.append(cpu.turn("agentd", through, ag.turn)),
            lambda: base.append(cpu.turn("direct", alone, di.turn)),
            lambda: cpu.no_checkpoints_s.append(cpu.turn("plain", bare, plain.turn)),
            lambda: cpu.relayed_s.append(cpu.turn("relayed", behind, relayed.turn)),
        ]
        for i in range(turns):
            for k in ROUNDS[i % len(ROUNDS)]:
                order[k]()
        cpu.checkpoint_ms = ag.checkpoint_ms[1:]  # the warm-up turn's left out
    finally:
        for side in sides:
            side.close()
        server.stop()
    return ours, base


def _iqr_ms(seconds: list[float]) -> float:
    """The interquartile range of ``seconds``, in ms (0 for fewer than two)."""
    if len(seconds) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(seconds, n=4)
    return (q3 - q1) * 1000


def _ratio_interval(ours: list[float], base: list[float], rounds: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of median(ours) / median(base): both resampled with replacement
    ``rounds`` times (a fixed seed, so a run's table is reproducible from its raw figures)."""
    import random

    rng = random.Random(0)
    ratios = sorted(statistics.median(rng.choices(ours, k=len(ours))) / statistics.median(rng.choices(base, k=len(base)))
                    for _ in range(rounds))
    return ratios[int(rounds * 0.025)], ratios[int(rounds * 0.975) - 1]


def turn_results(ctx: Ctx, runtime: str, name: str, ours: list[float], base: list[float], cpu: _Cpu, *,
                 direct: str, cli: str) -> list[Result]:
    """The two rows of one runtime: the turn's wall time through agentd against the direct driver's
    (``direct`` names it), target 1.02x; and agentd's own CPU per turn against the direct driver's
    (the bench process's), target :data:`CPU_TARGET`. ``cli`` names the runtime's processes in the notes."""
    turns = len(ours)
    r = Result(name, "s", ours, base, baseline_name=direct, higher=False, target=f"<= 1.02x baseline (median of {turns})")
    r.met = (r.ratio or 99) <= 1.02 if not ctx.quick else None
    r.notes.append(f"{turns} turns each, alternating (each side follows each other side equally often, tests/bench/_turns.py "
                   f"ROUNDS), after one warm-up turn each; "
                   f"{((r.median or 0) - (r.base_median or 0)) * 1000:+.0f} ms per turn through agentd; answer of "
                   f"{len(ANSWER.split())} words, streamed")
    if cpu.checkpoint_ms:
        r.notes.append(
            f"of that, the turn waited {statistics.median(cpu.checkpoint_ms):.1f} ms (median) for agentd's checkpoints "
            "of the working directory before and after it ([checkpoints] enabled, the default: a git run each unless "
            "[checkpoints] watch saw the directory unchanged; what agentctl diff and revert read), which the direct "
            "driver does not take")
    if turns >= 2 and min(base) > 0:
        lo, hi = _ratio_interval(ours, base)
        r.notes.append(f"how precise the ratio is: its 95% bootstrap interval over these turns is {lo:.2f}x-{hi:.2f}x"
                       + (" (the 1.02x target lies inside it: this run cannot tell the ratio from 1.02x)"
                          if lo <= 1.02 <= hi else ""))
    if r.met is False and r.base_median:
        r.notes.append(
            f"why: the 1.02x budget is {r.base_median * 0.02 * 1000:.1f} ms per turn here, while the middle half of "
            f"the turns spans {_iqr_ms(ours):.1f} ms through agentd and {_iqr_ms(base):.1f} ms directly")
        more = cpu.per_turn("agentd", "agentd") + cpu.per_turn("agentd", "bench") - cpu.per_turn("direct", "bench")
        runtime_ms = cpu.per_turn("direct", "cli")
        r.notes.append(
            f"why, in CPU: through agentd, agentd and the client reading its frames used {more:.1f} ms more CPU per "
            f"turn than the direct driver (means, the CPU row's notes), while {cli} itself used {runtime_ms:.1f} ms "
            f"in a {r.base_median * 1000:.1f} ms turn ({runtime_ms / (r.base_median * 1000):.0%} of a core) on "
            f"{os.cpu_count()} cores: what a second process spends on every streamed chunk competes with the "
            f"runtime's own turn")
    if cpu.no_checkpoints_s and r.base_median:
        plain = statistics.median(cpu.no_checkpoints_s)
        r.notes.append(
            f"the same turn through an agentd with [checkpoints] enabled = false, alternating with both in the same "
            f"run: {plain:.3f} s (median), {plain / r.base_median:.2f}x the direct driver, "
            f"{(plain - r.base_median) * 1000:+.1f} ms per turn; agentd's own CPU per turn there "
            f"{statistics.median(cpu.samples.get(('plain', 'agentd')) or [0]):.1f} ms (median)")
    if cpu.relayed_s and r.base_median and r.median:
        floor = statistics.median(cpu.relayed_s)
        lo, hi = _ratio_interval(cpu.relayed_s, base) if turns >= 2 else (0.0, 0.0)
        r.extra["relay_floor"] = floor / r.base_median
        r.notes.append(
            f"the floor of any supervisor in a process of its own: the direct driver with its runtime behind a bare "
            f"relay process (tests/bench/_relay.py: stdio copied chunk by chunk, each chunk to the runtime fsynced "
            f"first, nothing parsed), alternating in the same run: {floor:.3f} s (median), "
            f"{floor / r.base_median:.2f}x the direct driver (95% interval {lo:.2f}x-{hi:.2f}x), "
            f"{(floor - r.base_median) * 1000:+.1f} ms per turn; agentd is {r.median / floor:.2f}x that floor "
            f"({(r.median - floor) * 1000:+.1f} ms)")
    r.notes.append("a turn's start is its prompt record in the journal (under the journal's fsync policy); the "
                   "conversation record is a checkpoint, written behind the turn's end (agentd.write_behind)")
    c = Result(f"{runtime} turn: agentd's own CPU per turn", "ms", cpu.samples.get(("agentd", "agentd"), []),
               cpu.samples.get(("direct", "bench"), []), higher=False, target=f"<= {CPU_TARGET}x baseline",
               baseline_name="the direct driver's CPU per turn (the bench process)")
    c.met = (c.ratio or 99) <= CPU_TARGET if not ctx.quick else None
    c.notes.append(
        f"per turn (means; agentd and the runtimes from /proc/PID/task/*/sched): through agentd, agentd "
        f"{cpu.per_turn('agentd', 'agentd'):.1f} ms (its SDK threads included), {cli} {cpu.per_turn('agentd', 'cli'):.1f}"
        f" ms, the bench client reading agentd's frames {cpu.per_turn('agentd', 'bench'):.1f} ms; directly, the bench "
        f"process {cpu.per_turn('direct', 'bench'):.1f} ms, {cli} {cpu.per_turn('direct', 'cli'):.1f} ms")
    relay_ms = cpu.samples.get(("relayed", "relay"))
    if relay_ms and c.base_median and c.median:
        # What the relay alone spends is what any supervisor in a process of its own spends on top of the
        # direct driver's own work (which it must do too, parsing what it relays): their sum is its floor.
        spent = statistics.median(relay_ms)
        floor = c.base_median + spent
        c.extra["relay_cpu_ms"] = spent
        c.notes.append(
            f"the bare relay process of the wall row's floor (each chunk read and written on, nothing parsed) "
            f"used {spent:.1f} ms of CPU per turn (median) by itself, {spent / c.base_median:.2f}x the direct "
            f"driver's: a supervisor process that also does the direct driver's work spends at least their sum, "
            f"{floor:.1f} ms, {floor / c.base_median:.2f}x the direct driver; agentd is {c.median / floor:.2f}x that sum")
    return [r, c]


__all__ = ["ANSWER", "E2E", "KEY_ENV", "MODEL", "PROMPT", "ROUNDS", "TURNS", "Relay", "alternate", "e2e_path", "tree", "turn_count", "turn_results"]
