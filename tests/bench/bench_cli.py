"""``agentctl status --json`` wall time against a running agentd, next to ``import click, msgspec``.

Both run as fresh processes with the same interpreter, alternately, so the
difference is what agentctl's imports and one request cost. The same run also
times the imports alone, step by step, to say where the time goes: click and
msgspec (which any click CLI speaking msgspec pays), then agentd.wire (the
frame types), then the rest of what ``agentctl status`` imports. Those steps
end as ``python -c`` does, with the interpreter's teardown; agentctl ends
with ``os._exit`` once its output is flushed (see :func:`agentctl.cli.main`),
so the last step also times its imports ended that way.
"""

from __future__ import annotations

import statistics
import sys
import time

from agentd import wire

from ._common import BenchDaemon, Ctx, Result, agentctl_argv, python_env, wall

#: Every module ``agentctl status --json`` imports (the other commands load only when they run).
STATUS_IMPORTS = "import agentctl.__main__, agentctl.client, agentctl.commands.daemon, agentctl.jsonout"


def bench_status(ctx: Ctx) -> Result:
    repeats = 5 if ctx.quick else 30
    daemon = BenchDaemon(ctx.scratch("agentd-status")).start()
    env = {**python_env(), **{k: v for k, v in daemon.env.items() if k.startswith(("AGENTD_", "NO_COLOR"))}}
    status = [*agentctl_argv(), "--socket", str(daemon.socket), "status", "--json"]
    noop = [sys.executable, "-c", "pass"]
    # Where the time goes: the same interpreter importing click, then click and msgspec (the floor of a
    # click CLI that speaks msgspec), then also the wire types, then everything agentctl status imports,
    # and that again ended as agentctl ends (os._exit, no teardown).
    steps = {
        "click": [sys.executable, "-c", "import click"],
        "floor": [sys.executable, "-c", "import click, msgspec"],
        "wire": [sys.executable, "-c", "import click, msgspec, agentd.wire"],
        "cli": [sys.executable, "-c", STATUS_IMPORTS],
        "cli_exit": [sys.executable, "-c", STATUS_IMPORTS + "; import os; os._exit(0)"],
    }
    ours, base, t_req = [], [], []
    t_step: dict[str, list[float]] = {k: [] for k in steps}
    try:
        wall(status, env)  # warm the page cache for all
        wall(noop, env)
        for argv in steps.values():
            wall(argv, env)
        for _ in range(repeats):
            ours.append(wall(status, env) * 1000)
            base.append(wall(noop, env) * 1000)
            for key, argv in steps.items():
                t_step[key].append(wall(argv, env) * 1000)
            with daemon.client() as client:
                t0 = time.perf_counter()
                client.request(wire.Status)
                t_req.append((time.perf_counter() - t0) * 1000)
    finally:
        daemon.stop()
    floor = t_step["floor"]
    r = Result("`agentctl status --json` wall time", "ms", ours, floor,
               baseline_name="`python -c \"import click, msgspec\"`, the fixed stack's floor", higher=False,
               target="<= baseline + 15 ms")
    r.met = r.median <= r.base_median + 15
    noop_ms = statistics.median(base)
    r.extra["over_floor_ms"] = r.median - r.base_median
    over = {k: statistics.median(v) - noop_ms for k, v in t_step.items()}
    r.extra.update({f"import_{k}_over_baseline_ms": v for k, v in over.items()})
    req = statistics.median(t_req)
    r.notes.append(f"{r.median - r.base_median:.1f} ms over the floor; {repeats} runs each, alternating; "
                   f"`python -c pass` {noop_ms:.0f} ms")
    if not r.met:
        r.notes.append(
            f"why: agentd.wire takes {over['wire'] - over['floor']:.0f} ms over the floor and the rest of agentctl's "
            f"imports {over['cli'] - over['wire']:.0f} ms (with the teardown agentctl skips); the request takes {req:.1f} ms"
        )
    r.notes.append(
        f"in the same run, over `python -c pass` (each with the interpreter's teardown at exit): `import click` "
        f"{over['click']:.0f} ms, `import click, msgspec` {over['floor']:.0f} ms, with agentd.wire (the frame "
        f"types) {over['wire']:.0f} ms, everything `agentctl status` imports (also agentctl's group, its status "
        f"command and the socket client) {over['cli']:.0f} ms, or {over['cli_exit']:.0f} ms ended as agentctl "
        f"ends, without the teardown; parsing, connecting, the hello and the request: the remaining "
        f"{r.median - r.base_median - over['cli_exit']:.0f} ms (the status request on an open connection "
        f"{req:.1f} ms)"
    )
    return r
