"""``agentctl status --json`` wall time against a running agentd, next to ``python -c pass``.

Both run as fresh processes with the same interpreter, alternately, so the
difference is what agentctl's imports and one request cost.
"""

from __future__ import annotations

import statistics
import sys
import time

from agentd import wire

from ._common import BenchDaemon, Ctx, Result, agentctl_argv, python_env, wall


def bench_status(ctx: Ctx) -> Result:
    repeats = 5 if ctx.quick else 30
    daemon = BenchDaemon(ctx.scratch("agentd-status")).start()
    env = {**python_env(), **{k: v for k, v in daemon.env.items() if k.startswith(("AGENTD_", "NO_COLOR"))}}
    status = [*agentctl_argv(), "--socket", str(daemon.socket), "status", "--json"]
    noop = [sys.executable, "-c", "pass"]
    # Where the time goes: the same interpreter importing only click, then all agentctl imports.
    click = [sys.executable, "-c", "import click"]
    cli = [sys.executable, "-c", "import agentctl.__main__"]
    ours, base, t_click, t_cli, t_req = [], [], [], [], []
    try:
        wall(status, env)  # warm the page cache for both
        wall(noop, env)
        for _ in range(repeats):
            ours.append(wall(status, env) * 1000)
            base.append(wall(noop, env) * 1000)
            t_click.append(wall(click, env) * 1000)
            t_cli.append(wall(cli, env) * 1000)
            with daemon.client() as client:
                t0 = time.perf_counter()
                client.request(wire.Status)
                t_req.append((time.perf_counter() - t0) * 1000)
    finally:
        daemon.stop()
    r = Result("`agentctl status --json` wall time", "ms", ours, base, baseline_name="`python -c pass`", higher=False,
               target="<= baseline + 40 ms")
    r.met = r.median <= r.base_median + 40
    r.extra["over_baseline_ms"] = r.median - r.base_median
    r.notes.append(f"{r.median - r.base_median:.1f} ms over the baseline; {repeats} runs each, alternating")
    med = statistics.median
    if not r.met:
        r.notes.append(f"why: agentctl (not agentd: the request takes {med(t_req):.1f} ms) imports click, msgspec and "
                       f"agentd.wire before it does anything; `import click` alone is {med(t_click) - r.base_median:.0f} ms "
                       "of the 40 ms budget here")
    r.notes.append(
        f"in the same run, over `python -c pass`: `import click` {med(t_click) - r.base_median:.0f} ms, every import of "
        f"agentctl (click, msgspec, agentd.wire, socket ...) {med(t_cli) - r.base_median:.0f} ms; the status request "
        f"itself {med(t_req):.1f} ms"
    )
    return r
