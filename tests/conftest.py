"""Session-wide test hooks: parallel runs (pytest-xdist) and the figures printed at the end.

The suite runs in parallel by default (``-n auto`` in pyproject.toml's addopts;
``-n 0`` runs it in one process). Most of its time is spent waiting on
subprocesses (the real daemon, the real agent runtimes), so ``auto`` here means
more workers than cores (see :func:`pytest_xdist_auto_num_workers`).

Figures the subdirectories gather are merged here, in the process that reports:

* the conformance matrix (tests/e2e): each conformance test's report carries its
  cell (``report.conformance``, set in tests/e2e/conftest.py), so the controller
  sees every worker's cells through ``pytest_runtest_logreport``; the matrix is
  printed at the end, and written to tests/e2e/conformance-matrix.md when every cell ran;
* the reliability counters (tests/reliability: frames fuzzed, faults injected):
  each worker ships its counters at the end of its session
  (``workeroutput``), the controller adds them up in ``pytest_testnodedown``.

Long tests are moved to the front of the collection (:func:`pytest_collection_modifyitems`)
so that, in parallel, they start first and the rest fills in around them.
"""

from __future__ import annotations

import collections
import os
import pathlib
import sys
from typing import Any

import pytest

#: fixtures every directory may use: pg_cluster / pg_db, a real PostgreSQL (tests/pgcluster.py)
pytest_plugins = ["pgcluster"]

TESTS = pathlib.Path(__file__).resolve().parent
MATRIX_FILE = TESTS / "e2e" / "conformance-matrix.md"

#: workers per core for ``-n auto``: the tests mostly wait on subprocesses
WORKERS_PER_CORE = 1.5


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: 1.5 workers per core (3 on 2 cores); PYTEST_XDIST_AUTO_NUM_WORKERS overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(2, round(cores * WORKERS_PER_CORE))


# --------------------------------------------------------------------------- order

#: Run order, by the first of these substrings a node id contains (else last), longest first:
#: with tests handed out one at a time (a conformance group at a time, ``--dist loadgroup``, in
#: this order: ``--no-loadscope-reorder``), long ones started late would set the wall time while
#: the other workers sit idle. acp:gemini's reload scenarios wait for a new UTC minute
#: (tests/e2e/acp_agents.py); the real runtimes take seconds a test, and a runtime's cells of
#: test_conformance.py (one group, tests/e2e/conftest.py) a minute or two on one worker.
RUN_ORDER = [
    "[acp:gemini-restart]",
    "[acp:gemini-runtime_killed]",
    "[acp:gemini-daemon_killed]",
    "tests/reliability/test_crash.py",
    "tests/bench/test_bench_quick.py",
    "tests/reliability/test_load.py",
    "[acp:gemini-",
    "tests/e2e/test_conformance.py::",
    "tests/e2e/",
    "tests/integration/",
    "tests/reliability/",
]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        for i, part in enumerate(RUN_ORDER):
            if part in item.nodeid:
                return i
        return len(RUN_ORDER)

    items.sort(key=rank)  # stable: within a rank, the usual order


# --------------------------------------------------------------------------- conformance matrix

_RANK = {"pass": 0, "unsupported": 1, "skipped": 2, "fail": 3}
#: (runtime, scenario) -> result; the worst of a scenario's variants
_matrix: dict[tuple[str, str], str] = {}
_notes: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
#: runtime/scenario -> its place in the matrix
_order: dict[str, int] = {}
#: how many cells the full matrix has (every runtime x every scenario), as the cells say
_cells_total = 0


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    global _cells_total
    cell = getattr(report, "conformance", None)
    if not cell:
        return
    runtime, scenario, result = cell["runtime"], cell["scenario"], cell["result"]
    _order.setdefault(f"runtime:{runtime}", cell["order"][0])
    _order.setdefault(f"scenario:{scenario}", cell["order"][1])
    _cells_total = cell["cells"]
    key = (runtime, scenario)
    if key not in _matrix or _RANK[result] >= _RANK[_matrix[key]]:
        _matrix[key] = result
    if result == "pass" and cell.get("notes"):
        _notes[key].update(cell["notes"])


def _matrix_table() -> str:
    scenarios = sorted({s for _, s in _matrix}, key=lambda s: _order[f"scenario:{s}"])
    runtimes = sorted({r for r, _ in _matrix}, key=lambda r: _order[f"runtime:{r}"])
    lines = ["| runtime | " + " | ".join(scenarios) + " |", "| --- |" + " --- |" * len(scenarios)]
    for rt in runtimes:
        cells = []
        for s in scenarios:
            cell = _matrix.get((rt, s), "-")
            if cell == "pass" and _notes.get((rt, s)):
                cell = "pass*"
            cells.append(cell)
        lines.append(f"| {rt} | " + " | ".join(cells) + " |")
    notes = sorted({f"* {rt} {s}: {n}" for (rt, s), ns in _notes.items() for n in ns})
    return "\n".join(lines + ([""] + notes if notes else []))


# --------------------------------------------------------------------------- reliability counters

#: label -> (module, counter) filled by tests/reliability
_COUNTERS = {
    "frames fuzzed": ("reliability.fuzz", "FRAMES"),
    "faults injected": ("reliability.figures", "FAULTS"),
}
#: counters shipped by finished workers
_from_workers: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)


def _local_counters() -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for label, (module, name) in _COUNTERS.items():
        mod = sys.modules.get(module)
        counter = getattr(mod, name, None) if mod is not None else None
        if counter:
            out[label] = dict(counter)
    return out


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _is_worker(session.config):
        session.config.workeroutput["agentd_counters"] = _local_counters()  # type: ignore[attr-defined]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    for label, counts in (getattr(node, "workeroutput", None) or {}).get("agentd_counters", {}).items():
        _from_workers[label].update(counts)


# --------------------------------------------------------------------------- summary


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _is_worker(config):
        return
    totals: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for label, counts in _from_workers.items():
        totals[label].update(counts)
    for label, counts in _local_counters().items():
        totals[label].update(counts)
    for label in _COUNTERS:  # RELIABILITY.md quotes these lines
        counts = totals.get(label)
        if counts:
            parts = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
            terminalreporter.write_line(f"agentd reliability: {sum(counts.values())} {label} ({parts})")
    if _matrix:
        table = _matrix_table()
        terminalreporter.write_sep("=", "conformance matrix (runtime x scenario)")
        terminalreporter.write_line(table)
        if len(_matrix) >= _cells_total:
            MATRIX_FILE.write_text(table + "\n")
        else:  # a partial run (-k, one file, -x) must not replace the full matrix in the repo
            terminalreporter.write_line(f"(partial: {len(_matrix)} of {_cells_total} cells; {MATRIX_FILE.name} left as it was)")
