"""Fan-out to 1/10/100 subscribers and emit -> receive latency, on the real socket.

agentd runs as a process (``agentd run`` with the ``bench`` provider added,
see :mod:`bench._benchd`); the subscribers are another process
(:mod:`bench._subscribers`) that says hello and subscribes like any client.
The provider's deltas go the whole way: sink -> conversation pump -> hub ->
each connection's outbox -> its writer -> the socket.

The baseline is :mod:`bench._bare`: a bare trio server writing frames of the
same shape and size, produced in the same bursts, to the same subscriber
process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from agentd import wire

from ._common import HERE, BenchDaemon, Ctx, Result, fmt, percentile

SIZE = 200
BURST = 64
#: events per repeat, by subscriber count
QUICK_EVENTS = {1: 5_000, 10: 2_000, 100: 1_000}
FULL_EVENTS = {1: 1_000_000, 10: 100_000, 100: 20_000}
#: Outboxes as deep as the bare server's (unbounded) buffers: this measures delivery, not the lag policy
#: (a subscriber slower than an unthrottled producer is cut off with ``lagged`` at the default 4096).
CONFIG = """
[server]
subscriber_buffer = 10000000
"""


def _spawn(argv: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line not in ("ready", "listening"):
        proc.kill()
        raise RuntimeError(f"{argv[1:3]} did not start: {line!r} {proc.stderr.read()[-2000:] if proc.stderr else ''}")
    return proc


def _result(proc: subprocess.Popen[str], timeout: float = 300) -> dict:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"subscriber process failed ({proc.returncode}): {err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _subscribers(mode: str, socket: Path, subs: int = 1, conversation: str | None = None) -> subprocess.Popen[str]:
    argv = [sys.executable, str(HERE / "_subscribers.py"), mode, str(socket), "--subs", str(subs)]
    if conversation:
        argv += ["--conversation", conversation]
    return _spawn(argv)


def _bare(ctx: Ctx, mode: str, **opts: object) -> tuple[subprocess.Popen[str], Path]:
    sock = ctx.scratch(f"bare-{mode}") / "bare.sock"
    argv = [sys.executable, str(HERE / "_bare.py"), mode, str(sock)]
    for k, v in opts.items():
        argv += [f"--{k}", str(v)]
    return _spawn(argv), sock


class _Agentd:
    """A bench daemon with one conversation on the bench provider."""

    def __init__(self, ctx: Ctx) -> None:
        self.daemon = BenchDaemon(ctx.scratch("agentd-bench"), CONFIG, bench=True).start()
        self.client = self.daemon.client()
        work = self.daemon.root / "work"
        work.mkdir()
        self.conversation = self.client.request(wire.New, provider="bench", workdir=str(work))["id"]

    def turn(self, spec: dict) -> None:
        """Start a bench turn (returns once the provider took the prompt)."""
        self.client.request(wire.Send, conversation=self.conversation, text=json.dumps(spec))

    def wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.client.request(wire.Show, conversation=self.conversation)
            if not info["record"].get("active_run"):
                return
            time.sleep(0.02)
        raise TimeoutError("the bench turn did not end")

    def close(self) -> None:
        self.client.close()
        self.daemon.stop()


def _fanout_once(ctx: Ctx, agentd: _Agentd, subs: int, n: int) -> tuple[float, float]:
    """(agentd deliveries/s, bare deliveries/s) for one repeat."""
    proc = _subscribers("fanout", agentd.daemon.socket, subs, agentd.conversation)
    agentd.turn({"n": n, "burst": BURST, "size": SIZE})
    res = _result(proc)
    agentd.wait_idle()
    if res["lagged"] or res["unfinished"]:
        raise RuntimeError(f"agentd fan-out to {subs}: {res['lagged']} subscribers lagged, {res['unfinished']} unfinished")
    ours = n * subs / (res["last"] - res["first"])

    server, sock = _bare(ctx, "fanout", subs=subs, n=n, burst=BURST, size=SIZE)
    proc = _subscribers("fanout", sock, subs)
    res = _result(proc)
    server.wait(60)
    bare = n * subs / (res["last"] - res["first"])
    return ours, bare


def bench_fanout(ctx: Ctx) -> list[Result]:
    repeats = 2 if ctx.quick else 5
    agentd = _Agentd(ctx)
    results = []
    try:
        for subs in (1, 10, 100):
            n = (QUICK_EVENTS if ctx.quick else FULL_EVENTS)[subs]
            ours, bare = [], []
            for _ in range(repeats):
                a, b = _fanout_once(ctx, agentd, subs, n)
                ours.append(a)
                bare.append(b)
            r = Result(
                f"fan-out, {subs} subscriber{'s' if subs > 1 else ''}",
                "deliveries/s",
                ours,
                bare,
                baseline_name="bare trio server, same frames and bursts",
            )
            r.notes.append(f"{n} events of ~{SIZE} bytes in bursts of {BURST}, {repeats} repeats; "
                           "server.subscriber_buffer raised so a momentarily slow reader is not cut off")
            if subs > 1:
                r.notes.append("the bare server builds each connection's frames one by one; agentd builds a "
                               "subscriber's share of a burst with one join")
            if subs == 1:  # one person tailing one conversation
                r.target = ">= 0.5x baseline"
                r.met = (r.ratio or 0) >= 0.5
            if subs == 100:
                r.target = ">= 1M deliveries/s and >= 0.5x baseline"
                r.met = r.median >= 1_000_000 and (r.ratio or 0) >= 0.5
            results.append(r)
    finally:
        agentd.close()
    return results


def bench_latency(ctx: Ctx) -> list[Result]:
    n, repeats, rate = (500, 1, 1000.0) if ctx.quick else (5000, 3, 1000.0)
    agentd = _Agentd(ctx)
    p50, p99, b50, b99 = [], [], [], []
    try:
        for _ in range(repeats):
            proc = _subscribers("latency", agentd.daemon.socket, 1, agentd.conversation)
            agentd.turn({"n": n, "rate": rate, "size": SIZE})
            lat = _result(proc)["lat_us"]
            agentd.wait_idle()
            p50.append(percentile(lat, 50))
            p99.append(percentile(lat, 99))

            server, sock = _bare(ctx, "latency", n=n, rate=rate, size=SIZE)
            proc = _subscribers("latency", sock, 1)
            lat = _result(proc)["lat_us"]
            server.wait(60)
            b50.append(percentile(lat, 50))
            b99.append(percentile(lat, 99))
    finally:
        agentd.close()
    r50 = Result("latency emit -> receive, p50", "us", p50, b50, baseline_name="bare trio server", higher=False)
    r99 = Result("latency emit -> receive, p99", "us", p99, b99, baseline_name="bare trio server", higher=False,
                 target="p99 <= 2 ms")
    r99.met = r99.median <= 2000
    if not r99.met and r99.base_median and r99.base_median > 1000:
        r99.notes.append(f"why: the bare trio server's own p99 is {r99.base_median / 1000:.1f} ms in the same run: "
                         "on this machine p99 is scheduling noise (other processes on 2 cores), not agentd")
    for r in (r50, r99):
        r.notes.append(f"{n} events at {fmt(rate)}/s, {repeats} repeats")
    return [r50, r99]
