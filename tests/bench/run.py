"""Run agentd's benchmarks and write the table: ``python -m tests.bench [--quick]``.

Each benchmark prints its figure (median over repeats), the spread, the
baseline measured in the same run and the ratio; the table, with the machine
it ran on, goes to BENCHMARKS.md at the repository root (``--output`` to
write elsewhere, ``--output -`` not at all). ``--quick`` runs every benchmark
small, in well under a minute (CI runs it so the suite keeps working); its
figures are not the ones to quote. ``--only NAME`` (repeatable) runs the
benchmark whose key is NAME, or when none is, those whose key contains NAME; ``--json PATH`` writes the raw results.

Exit status: 0 when every benchmark produced a number (a target missed is
reported, not an error), 1 when one failed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # run as a script: tests/bench/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "tests.bench"

from ._common import REPO, Ctx, Result, fmt, machine, spread  # noqa: E402

#: key -> "module:function"; a function returns a Result or a list of them.
BENCHMARKS: dict[str, str] = {
    "journal-batch": "bench_journal:bench_journal_batch",
    "journal-always": "bench_journal:bench_journal_always",
    "fanout": "bench_fanout:bench_fanout",
    "latency": "bench_fanout:bench_latency",
    "status": "bench_cli:bench_status",
    "tail": "bench_state:bench_tail",
    "startup": "bench_state:bench_startup",
    "rss": "bench_state:bench_rss",
    "idle": "bench_state:bench_idle",
    "history": "bench_history:bench_history",
    "copilot": "bench_copilot:bench_copilot",
    "codex": "bench_codex:bench_codex",
    "claude": "bench_claude:bench_claude",
    "acp": "bench_acp:bench_acp",
    "warm": "bench_warm:bench_warm",
    "claude-idle": "bench_warm:bench_claude_idle",
    "masking": "bench_masking:bench_masking",
    "checkpoints": "bench_checkpoints:bench_checkpoints",
    "pg-notify": "bench_pg:bench_pg_notify",
    "cross-host": "bench_pg:bench_cross_host",
    "store-append": "bench_store:bench_store_append",
}


def _load(spec: str) -> Callable[[Ctx], Result | list[Result]]:
    import importlib

    module, func = spec.split(":")
    return getattr(importlib.import_module(f".{module}", __package__), func)


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _line(r: Result) -> str:
    if r.skipped:
        return f"{r.name}: SKIPPED ({r.skipped})"
    ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
    met = {True: "met", False: "MISSED", None: "-"}[r.met]
    return (
        f"{r.name}: {fmt(r.median)} {r.unit} [{spread(r.samples)}]  "
        f"baseline {fmt(r.base_median)} {r.unit} [{spread(r.baseline)}] ({r.baseline_name})  "
        f"ratio {ratio}  target {r.target or '-'}: {met}"
    )


def markdown(results: list[Result], info: dict[str, str], quick: bool, elapsed: float) -> str:
    """The BENCHMARKS.md text: machine, then one row per benchmark, then the notes."""
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# agentd benchmarks",
        "",
        f"`python -m tests.bench{' --quick' if quick else ''}` on {when}, {elapsed:.0f} s"
        + (" (quick mode: small sizes, not figures to quote)" if quick else "") + ".",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory']} RAM; {info['python']}; "
        f"{info['kernel']}; load average at start {info['load']}, at the end {_loadavg()}. Bytecode cached (PYTHONPYCACHEPREFIX), as in an "
        "installed agentd.",
        "",
        "Figure and baseline are medians over the repeats, both measured in the same run; the spread is min-max"
        " (and the interquartile range from 4 repeats up). Ratio = figure / baseline.",
        "",
        "| benchmark | figure | spread | baseline | ratio | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        if r.skipped:
            out.append(f"| {r.name} | skipped | | | | {r.target} | {r.skipped} |")
            continue
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else "-"
        met = {True: "yes", False: "**no**", None: "-"}[r.met]
        base = f"{fmt(r.base_median)} {r.unit} ({r.baseline_name})" if r.baseline else (r.baseline_name or "-")
        out.append(
            f"| {r.name} | {fmt(r.median)} {r.unit} | {spread(r.samples)} | {base} | {ratio} | {r.target or '-'} | {met} |"
        )
    notes = [(r.name, n) for r in results for n in r.notes]
    if notes:
        out += ["", "Notes:", ""]
        out += [f"- {name}: {note}" for name, note in notes]
    return "\n".join(out) + "\n"


def _prepare_python() -> None:
    """Let every process the benchmarks start use cached bytecode, as an installed agentd does.

    With PYTHONDONTWRITEBYTECODE (set in some CI and dev shells) each start
    would compile agentd and agentctl from source again, which measures the
    compiler, not agentd. The cache goes to a directory of its own
    (PYTHONPYCACHEPREFIX), never into the source tree; one import of
    everything fills it before the first measurement.
    """
    import subprocess

    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ.setdefault("PYTHONPYCACHEPREFIX", os.path.join(tempfile.gettempdir(), "agentd-bench-pycache"))
    modules = ["agentctl.__main__", "agentctl.render", "agentctl.follow", "agentd.daemon", "agentd.logs",
               "agentd.providers.script", "agentd.providers.copilot", "agentd.providers.claude", "agentd.gateway",
               "trio", "structlog", "msgspec", "click", "platformdirs", "asyncio", "json", "selectors"]
    code = "import importlib\nfor m in %r:\n    try: importlib.import_module(m)\n    except Exception: pass" % modules
    subprocess.run([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, seconds: what CI runs")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="run the benchmark NAME, else those whose key contains NAME")
    p.add_argument("--output", default=None, help="where to write the table (default BENCHMARKS.md; '-' for nowhere)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)

    keys = [k for k in BENCHMARKS if not args.only or any(o == k or (o not in BENCHMARKS and o in k) for o in args.only)]
    if not keys:
        p.error(f"no benchmark matches {args.only}; known: {', '.join(BENCHMARKS)}")
    _prepare_python()
    info = machine()
    print(f"machine: {info['cpu']}, {info['cores']} cores, {info['memory']}; {info['python']}; {info['kernel']}; load {info['load']}")
    print(f"mode: {'quick' if args.quick else 'full'}; benchmarks: {', '.join(keys)}", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="agentd-bench-"))
    results: list[Result] = []
    failed = 0
    t_start = time.perf_counter()
    try:
        for key in keys:
            print(f"-- {key}", flush=True)
            ctx = Ctx(quick=args.quick, tmp=tmp, log=lambda s: print(s, flush=True))
            t0 = time.perf_counter()
            try:
                out = _load(BENCHMARKS[key])(ctx)
            except Exception as exc:
                failed += 1
                traceback.print_exc()
                out = Result(key, "", skipped=f"failed: {type(exc).__name__}: {exc}"[:300])
                out.extra["failed"] = True
            for r in out if isinstance(out, list) else [out]:
                r.extra["key"] = key
                results.append(r)
                print("  " + _line(r), flush=True)
            print(f"   ({time.perf_counter() - t0:.1f} s)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.perf_counter() - t_start
    text = markdown(results, info, args.quick, elapsed)
    output = args.output if args.output is not None else (None if args.only else str(REPO / "BENCHMARKS.md"))
    if output and output != "-":
        Path(output).write_text(text)
        print(f"table written to {output}")
    else:
        print(text)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": info,
                    "quick": args.quick,
                    "results": [
                        {
                            "key": r.extra.get("key"),
                            "name": r.name,
                            "unit": r.unit,
                            "median": r.median,
                            "samples": r.samples,
                            "baseline": r.baseline,
                            "baseline_median": r.base_median,
                            "ratio": r.ratio,
                            "target": r.target,
                            "met": r.met,
                            "skipped": r.skipped,
                            "zero_ok": r.zero_ok,
                            "failed": bool(r.extra.get("failed")),
                            "notes": r.notes,
                        }
                        for r in results
                    ],
                },
                indent=1,
            )
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
