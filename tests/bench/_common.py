"""What every benchmark shares: the result row, statistics, the machine, and daemons to measure.

A benchmark is a function ``(Ctx) -> Result``. It measures its figure and its
baseline in the same run, interleaved repeat by repeat, so a machine that is
busy with something else slows both alike and the ratio stays meaningful.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

from daemon_harness import Client, Daemon  # noqa: E402

#: Text of the ``python -c`` that runs the bench daemon: agentd itself, plus the in-process ``bench`` provider.
BENCHD = "import sys; sys.path.insert(0, {tests!r}); from bench._benchd import main; main()"


@dataclass
class Ctx:
    """How a benchmark should run: ``quick`` (seconds, for CI) or full; ``tmp`` is its scratch dir."""

    quick: bool
    tmp: Path
    log: Callable[[str], None] = print

    def scratch(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.tmp))


@dataclass
class Result:
    """One row of the table.

    ``samples`` are the figure's repeats and ``baseline`` the baseline's, in
    ``unit``; ``higher`` says whether a bigger figure is better. ``ratio`` is
    median(figure) / median(baseline). ``target`` is the human text of the
    target and ``met`` whether the medians meet it (None: not judged).
    ``skipped`` holds the reason when the benchmark could not run.
    ``zero_ok`` says a reading of exactly 0 is a measurement, not a failure to
    measure (an idle daemon may not run at all in a short window).
    """

    name: str
    unit: str
    samples: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    baseline_name: str = ""
    higher: bool = True
    target: str = ""
    met: bool | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""
    zero_ok: bool = False

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def base_median(self) -> float | None:
        return statistics.median(self.baseline) if self.baseline else None

    @property
    def ratio(self) -> float | None:
        m, b = self.median, self.base_median
        if m is None or not b:
            return None
        return m / b


def spread(values: list[float]) -> str:
    """``min-max`` (and the IQR when there are 4 values or more)."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    text = f"{fmt(lo)}-{fmt(hi)}"
    if len(values) >= 4:
        q = statistics.quantiles(values, n=4)
        text += f" (IQR {fmt(q[0])}-{fmt(q[2])})"
    return text


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.2f}M"
    if a >= 1e4:
        return f"{v / 1e3:.0f}k"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile (0-100), nearest rank."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


def machine() -> dict[str, str]:
    """CPU model, cores, memory, Python, kernel and the load when the run started."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        if m:
            mem = f"{int(m.group(1)) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": mem,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "kernel": f"{platform.system()} {platform.release()}",
        "load": load,
    }


def rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` plus all its descendants, in KiB (Linux /proc)."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{p}/status").read_text())
        except OSError:
            continue
        if m:
            total += int(m.group(1))
    return total


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``: the children of each of its threads (a runtime spawned from a
    worker or SDK thread is that thread's child), theirs, and so on."""
    out: list[int] = []
    children: list[str] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            children += (task / "children").read_text().split()
        except OSError:
            continue
    for c in children:
        out.append(int(c))
        out.extend(descendants(int(c)))
    return out


def agentctl_argv() -> list[str]:
    """How a user runs agentctl: the console script next to this interpreter, else ``-m``."""
    script = Path(sys.executable).with_name("agentctl")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "agentctl"]


def wall(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> float:
    """Wall time of one process run, seconds; raises when it fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return elapsed


class BenchDaemon(Daemon):
    """A :class:`Daemon` that can run the bench entry point and notices readiness within a millisecond.

    ``bench=True`` runs agentd with the in-process ``bench`` provider added
    (see :mod:`bench._benchd`); everything else is the real daemon.
    """

    def __init__(self, root: Path, config_text: str = "", *, bench: bool = False, env: dict[str, str] | None = None) -> None:
        super().__init__(root, config_text, env=env)
        self.bench = bench
        self.ready_s = 0.0

    def argv(self) -> list[str]:
        if self.bench:
            return [sys.executable, "-c", BENCHD.format(tests=str(REPO / "tests")), "run"]
        return [sys.executable, "-m", "agentd", "run"]

    def start(self, timeout: float = 60.0) -> "BenchDaemon":
        """Start and return once agentd answers ``hello``; ``ready_s`` is how long that took."""
        logf = open(self.log, "ab")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.argv(), env=self.env, stdout=logf, stderr=subprocess.STDOUT, cwd=self.root)
        logf.close()
        deadline = t0 + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agentd exited with {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")
            if probe_hello(self.socket):
                self.ready_s = time.perf_counter() - t0
                return self
            if time.perf_counter() > deadline:
                self.stop()
                raise TimeoutError(f"agentd did not start within {timeout}s:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.0005)

    def __enter__(self) -> "BenchDaemon":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.stop()


def probe_hello(path: Path) -> bool:
    """Whether something on ``path`` answers with a complete first line (agentd's ``hello``)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(str(path))
        buf = b""
        while b"\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                return False
            buf += chunk
        return True
    except OSError:
        return False
    finally:
        s.close()


def python_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    return env


__all__ = [
    "BenchDaemon",
    "Client",
    "Ctx",
    "Daemon",
    "REPO",
    "Result",
    "agentctl_argv",
    "fmt",
    "machine",
    "percentile",
    "probe_hello",
    "rss_kb",
    "spread",
    "wall",
]
