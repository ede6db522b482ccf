"""Runtimes that crash, hang, flood or break the protocol: the turn fails with a reason,
other conversations carry on, the next prompt gets a fresh runtime.

The runtime is ``acp_fault_agent.py``, a tiny ACP agent configured as
``[providers.acp.fault]``; each prompt's first word picks its misbehaviour.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentd import contract as c
from agentd import wire
from daemon_harness import Client, Daemon

from .conftest import ECHO, fast_daemon, new, wait_for
from .figures import FAULTS

AGENT = Path(__file__).parent / "acp_fault_agent.py"
HANG_S = 1.5


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("faults")
    starts = root / "agent-starts.log"
    config = f"""
[runtimes]
hang_timeout_s = {HANG_S}
[providers.acp.fault]
command = [{sys.executable!r}, {str(AGENT)!r}]
env = {{ FAULT_AGENT_LOG = {str(starts)!r} }}
cancel_timeout_s = 1.0
startup_timeout_s = 10.0
[providers.acp.broken]
command = [{sys.executable!r}, {str(AGENT)!r}, "crash-start"]
startup_timeout_s = 10.0
""".replace("'", '"')
    d = fast_daemon(root, config).start()
    d.starts = starts  # type: ignore[attr-defined]
    try:
        yield d
    finally:
        d.stop()


def _workdir(tmp_path: Path, name: str) -> Path:
    w = tmp_path / name
    w.mkdir()
    return w


def _turn(client: Client, cid: str, text: str, timeout: float = 30) -> tuple[dict[str, Any], list[wire.Record]]:
    """Send ``text``; the terminal turn payload and the records, once the turn ended."""
    run = client.request(wire.Send, conversation=cid, text=text)["run"]
    records = client.follow(run, timeout=timeout)
    return msgspec.json.decode(records[-1].data), records


def _texts(records: list[wire.Record]) -> list[str]:
    return [msgspec.json.decode(r.data).get("text", "") for r in records if r.type == "item"]


class _Bystander:
    """Another conversation running turns in a thread meanwhile; records how long each took."""

    def __init__(self, d: Daemon, workdir: Path) -> None:
        self.client = d.client()
        self.cid = new(self.client, workdir, ECHO)
        self.client.subscribe(self.cid)
        self.times: list[float] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            t0 = time.monotonic()
            try:
                end, _ = _turn(self.client, self.cid, f"bystander {n}", timeout=20)
                assert end["state"] == "completed", end
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
                return
            self.times.append(time.monotonic() - t0)

    def __enter__(self) -> "_Bystander":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)
        self.client.close()
        assert not self.errors, self.errors
        assert self.times, "the bystander finished no turn"
        assert max(self.times) < 2.0, f"the other conversation was held up: {max(self.times):.1f}s"


def _starts(d: Daemon) -> int:
    path = d.starts  # type: ignore[attr-defined]
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize(
    "fault, reason, message, restarts",
    [
        ("crash", "runtime_exit", "3", 1),
        ("garbage", "runtime_exit", "JSON", 1),
        ("notrpc", "runtime_exit", "", 1),
        ("bigline", "runtime_exit", "line over", 1),
        ("badresult", "", "invalid result", 0),  # a wrong answer, not a broken stream: the process stays
    ],
)
def test_a_runtime_that_dies_or_breaks_the_protocol_fails_the_turn_and_the_next_prompt_restarts_it(
    faulty: Daemon, tmp_path: Path, fault: str, reason: str, message: str, restarts: int
) -> None:
    with faulty.client() as client, _Bystander(faulty, _workdir(tmp_path, "other")):
        cid = client.request(wire.New, provider="acp:fault", workdir=str(_workdir(tmp_path, "work")))["id"]
        client.subscribe(cid)
        assert _turn(client, cid, "hello")[0]["state"] == "completed"
        starts = _starts(faulty)
        FAULTS[f"runtime {fault}"] += 1
        end, _ = _turn(client, cid, fault)
        assert end["state"] == "failed" and end.get("reason", "") == reason, end
        assert message in end["error"], end
        # The next prompt gets a fresh runtime and works.
        end, records = _turn(client, cid, "after")
        assert end["state"] == "completed", end
        assert "echo:after" in _texts(records)
        assert _starts(faulty) == starts + restarts
    assert rss_mb(faulty.proc.pid) < 400, "the daemon's memory grew with the fault"


def test_a_runtime_that_hangs_is_stopped_after_the_hang_timeout_and_replaced(faulty: Daemon, tmp_path: Path) -> None:
    with faulty.client() as client, _Bystander(faulty, _workdir(tmp_path, "other")):
        cid = client.request(wire.New, provider="acp:fault", workdir=str(_workdir(tmp_path, "work")))["id"]
        client.subscribe(cid)
        starts = _starts(faulty)
        FAULTS["runtime hang"] += 1
        t0 = time.monotonic()
        end, _ = _turn(client, cid, "hang")
        took = time.monotonic() - t0
        assert end["state"] == "failed" and end["reason"] == "runtime_hung", end
        assert f"{HANG_S:g} s" in end["error"]
        assert HANG_S <= took < HANG_S + 5, took
        end, records = _turn(client, cid, "after the hang")
        assert end["state"] == "completed" and "echo:after the hang" in _texts(records)
        assert _starts(faulty) == starts + 1  # the hung process was stopped, a new one started


def test_a_runtime_flooding_output_completes_without_holding_up_others_or_growing_memory(
    faulty: Daemon, tmp_path: Path
) -> None:
    with faulty.client() as client, _Bystander(faulty, _workdir(tmp_path, "other")) as other:
        cid = client.request(wire.New, provider="acp:fault", workdir=str(_workdir(tmp_path, "work")))["id"]
        client.subscribe(cid)
        before = rss_mb(faulty.proc.pid)
        FAULTS["runtime output flood"] += 1
        end, records = _turn(client, cid, "flood 20000", timeout=120)  # 20 MB in 20,000 chunks
        assert end["state"] == "completed", end
        assert sum(len(t) for t in _texts(records)) >= 20_000 * 1024
        assert other.times
    after = rss_mb(faulty.proc.pid)
    assert after - before < 300, f"RSS grew from {before:.0f} to {after:.0f} MB"


def test_a_runtime_that_cannot_start_is_a_clear_error_and_nothing_else_suffers(faulty: Daemon, tmp_path: Path) -> None:
    with faulty.client() as client:
        FAULTS["runtime fails to start"] += 1
        t0 = time.monotonic()
        with pytest.raises(c.AgentdError) as err:
            client.request(wire.New, provider="acp:broken", workdir=str(_workdir(tmp_path, "work")))
        assert time.monotonic() - t0 < 10
        assert err.value.code in ("unsupported", "closed"), err.value
        assert "acp:broken" in err.value.message, err.value.message
        assert client.request(wire.List) is not None
        cid = new(client, _workdir(tmp_path, "other"), ECHO)
        client.subscribe(cid)
        assert _turn(client, cid, "fine")[0]["state"] == "completed"
