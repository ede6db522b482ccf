"""Benchmarks of state on disk: tail of a long journal, start-up with many conversations, RSS of many open ones."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from agentd import wire

from ._common import BenchDaemon, Ctx, Result, python_env, rss_kb, wall
from ._state import write_conversations, write_long_journal

#: The default configuration: every provider enabled (each is built on first use).
CONFIG = ""


def _last_lines(path: Path, count: int) -> list[bytes]:
    """The last ``count`` lines of ``path``, read backwards from its end (the baseline)."""
    with open(path, "rb", buffering=0) as f:
        end = f.seek(0, os.SEEK_END)
        pos, buf = end, b""
        while pos > 0 and buf.count(b"\n") <= count:
            step = min(pos, 256 * 1024)
            pos -= step
            f.seek(pos)
            buf = f.read(step) + buf
    return buf.splitlines()[-count:]


def bench_tail(ctx: Ctx) -> Result:
    events, repeats = (100_000, 2) if ctx.quick else (1_000_000, 5)
    after = events - 1000
    root = ctx.scratch("tail")
    daemon = BenchDaemon(root, CONFIG)
    t = time.perf_counter()
    cid = write_long_journal(daemon.state_dir, events)
    ctx.log(f"  wrote a {events}-event journal in {time.perf_counter() - t:.1f} s")
    path = daemon.state_dir / "conversations" / cid / "events.jsonl"
    first, everything, base = [], [], []
    for _ in range(repeats):
        daemon.start()
        try:
            with daemon.client() as client:
                t0 = time.perf_counter()
                client.send_raw(wire.encode(wire.Subscribe(id=7, conversation=cid, after=after, snapshot=False)))
                got = 0
                while got < 1000:
                    line = client.file.readline()
                    if b'"type":"event"' in line:
                        if not got:
                            first.append((time.perf_counter() - t0) * 1000)
                        got += 1
                    elif b'"type":"error"' in line:
                        raise RuntimeError(line.decode())
                everything.append((time.perf_counter() - t0) * 1000)
        finally:
            daemon.stop()
        t0 = time.perf_counter()
        lines = _last_lines(path, 1000)
        base.append((time.perf_counter() - t0) * 1000)
        assert len(lines) == 1000
    r = Result(f"tail after seq {after:,} of {events:,}: first event", "ms", first, base,
               baseline_name="read the last 1,000 lines of the file", higher=False, target="<= 10 ms")
    r.met = r.median <= 10
    r.extra["all_1000_ms"] = sorted(everything)[len(everything) // 2]
    r.notes.append(f"all 1,000 events in {r.extra['all_1000_ms']:.1f} ms (median); a fresh daemon each repeat, {repeats} repeats")
    return r


def bench_startup(ctx: Ctx) -> Result:
    count, repeats = (500, 2) if ctx.quick else (10_000, 5)
    full = BenchDaemon(ctx.scratch("startup"), CONFIG)
    t = time.perf_counter()
    write_conversations(full.state_dir, count)
    ctx.log(f"  wrote {count} conversations in {time.perf_counter() - t:.1f} s")
    empty = BenchDaemon(ctx.scratch("startup-empty"), CONFIG)
    # The first start reads every record.json (no index yet: as after a crash); later ones, after
    # a clean stop, read the one index file. Both are reported; the figure is the usual case.
    full.start()
    cold = full.ready_s * 1000
    full.stop()
    floor_argv = [sys.executable, "-c", "import trio, structlog, click, msgspec, platformdirs"]
    ours, base, floor = [], [], []
    for _ in range(repeats):
        for d, out in ((full, ours), (empty, base)):
            d.start()
            out.append(d.ready_s * 1000)
            d.stop()
        floor.append(wall(floor_argv, python_env()) * 1000)
    r = Result(f"start to ready, {count:,} conversations on disk", "ms", ours, base,
               baseline_name="start to ready, empty state dir", higher=False, target="<= 500 ms")
    r.met = r.median <= 500
    r.extra["cold_ms"] = cold
    r.extra["import_floor_ms"] = statistics.median(floor)
    r.notes.append(f"process spawn until agentd answers hello on its socket, default config; {repeats} repeats each, "
                   f"alternating; the first start after writing the state (no index, as after a crash): {cold:.0f} ms")
    r.notes.append(f"import floor in the same run: `python -c 'import trio, structlog, click, msgspec, platformdirs'` "
                   f"takes {statistics.median(floor):.0f} ms (median) on this machine")
    if not r.met:
        r.notes.append(f"why: the third-party imports alone take {statistics.median(floor):.0f} ms here, and the empty "
                       f"state dir starts in {r.base_median:.0f} ms; the {count:,} conversations add "
                       f"{r.median - r.base_median:.0f} ms (one index file; {cold:.0f} ms without it)")
    return r


def bench_rss(ctx: Ctx) -> Result:
    count = 50 if ctx.quick else 1_000
    daemon = BenchDaemon(ctx.scratch("rss"), CONFIG).start()
    try:
        work = daemon.root / "work"
        work.mkdir()
        time.sleep(0.3)
        assert daemon.proc is not None
        empty = rss_kb(daemon.proc.pid) / 1024
        t = time.perf_counter()
        with daemon.client() as client:
            for _ in range(count):
                client.request(wire.New, provider="script", workdir=str(work))
            elapsed = time.perf_counter() - t
            status = client.request(wire.Status)
        time.sleep(0.3)
        full = rss_kb(daemon.proc.pid) / 1024
    finally:
        daemon.stop()
    assert status["conversations"] == count
    r = Result(f"RSS with {count:,} open conversations (script)", "MB", [full], [empty],
               baseline_name="empty daemon RSS", higher=False, target="<= 150 MB" if count >= 1000 else "(full run: 1,000)")
    r.met = full <= 150 if count >= 1000 else None
    r.notes.append(f"{(full - empty) * 1024 / count:.0f} KiB per open conversation; created in {elapsed:.1f} s")
    return r


def _ticks_s(pid: int) -> float:
    """User + system CPU seconds of ``pid``, all its threads, exited ones included: /proc/PID/stat,
    in clock ticks (each of the two fields truncated to a tick, so a difference is off by up to two)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _thread_run_ns(pid: int, into: dict[str, int]) -> None:
    """Record into ``into`` each live thread's run time so far (ns, /proc/PID/task/TID/schedstat)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            into[task.name] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # it exited between the listing and the read


def _idle_cpu_s(pid: int, window: float, every: float = 0.5) -> tuple[float, float, float]:
    """CPU seconds ``pid`` used over ``window`` seconds: (from schedstat, from ticks, elapsed).

    schedstat counts in ns but only live threads; each thread is sampled every ``every`` s and
    keeps its last reading when it exits, so a worker thread's time stays counted (trio's idle
    workers live 10 s). A thread born and gone between two samples would be missed: the tick
    count, which misses nothing but is 10 ms coarse, is returned as the check.
    """
    first: dict[str, int] = {}
    _thread_run_ns(pid, first)
    last = dict(first)
    ticks0, t0 = _ticks_s(pid), time.monotonic()
    end = t0 + window
    while (now := time.monotonic()) < end:
        time.sleep(min(every, end - now))
        _thread_run_ns(pid, last)
    ticks1, elapsed = _ticks_s(pid), time.monotonic() - t0
    ns = sum(v - first.get(tid, 0) for tid, v in last.items())
    return ns / 1e9, ticks1 - ticks0, elapsed


def bench_idle(ctx: Ctx) -> Result:
    """Daemon CPU while idle with many open conversations, as a share of one core.

    The window spans six of the lease renewal periods a shared store would take (ttl_s / 3, 10 s by
    default); the file store renews nothing, its daemon lock keeping the leases (agentd.leases).
    The baseline is the same daemon, idle with no conversation, over an equal window.
    """
    count, window = (50, 3.0) if ctx.quick else (1_000, 60.0)
    out: dict[str, float] = {}
    ticked: dict[str, float] = {}
    for name, n in (("empty", 0), ("full", count)):
        # quick: were leases renewed, it would be every 0.33 s, so even a 3 s window would see it
        daemon = BenchDaemon(ctx.scratch(f"idle-{name}"), "[leases]\nttl_s = 1.0\n" if ctx.quick else CONFIG).start()
        try:
            work = daemon.root / "work"
            work.mkdir()
            with daemon.client() as client:
                for _ in range(n):
                    client.request(wire.New, provider="script", workdir=str(work))
            assert daemon.proc is not None
            time.sleep(1.0)  # creation's aftermath (record writes, index) settles
            used, ticks, elapsed = _idle_cpu_s(daemon.proc.pid, window)
            out[name] = used / elapsed * 100
            ticked[name] = ticks / elapsed * 100
        finally:
            daemon.stop()
    r = Result(f"daemon CPU idle, {count:,} open conversations", "% of a core", [out["full"]], [out["empty"]],
               baseline_name="the same daemon idle with none open", higher=False, zero_ok=True,
               target="<= 0.05% of a core" if count >= 1000 else "(full run: 1,000)")
    r.met = out["full"] <= 0.05 if count >= 1000 else None
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    r.notes.append(f"CPU over {window:.0f} s of idling, each thread's run time (ns, schedstat) sampled every 0.5 s; "
                   "no lease renewal: the daemon lock keeps the file store's leases (agentd.leases)")
    r.notes.append(f"the check from /proc/PID/stat, which also counts a thread gone between samples but in clock "
                   f"ticks of {tick_ms:.0f} ms (±2 ticks over the window): {ticked['full']:.3f}% with the "
                   f"conversations open, {ticked['empty']:.3f}% with none")
    return r
