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
from agentd import runtime_output, wire
from daemon_harness import Client, Daemon

from .conftest import ECHO, fast_daemon, log_events, new
from .figures import FAULTS

AGENT = Path(__file__).parent / "acp_fault_agent.py"
#: the daemon's hang timeout here: long enough for the 80 MB ``bigline`` to arrive and be refused
#: (64 MB read before the line counts as too long: over 1.5 s with the suite's workers on 2 cores)
HANG_S = 4.0
#: acp:flaky runs the fault agent through this: while $FAULT_CRASH_FLAG exists, every start crashes
CRASH_WRAPPER = 'if [ -e "$FAULT_CRASH_FLAG" ]; then exec "$0" "$1" crash-start; else exec "$0" "$1"; fi'


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("faults")
    starts = root / "agent-starts.log"
    flaky_starts = root / "flaky-starts.log"
    crash_flag = root / "crash-at-start"
    # The flood test's reader takes 20,000 deltas in one turn; on a loaded machine a Python reader
    # can stall long enough to be cut off for lag (right, but not what that test is about).
    config = f"""
[server]
subscriber_buffer = 32768
[runtimes]
hang_timeout_s = {HANG_S}
[providers.acp.fault]
command = [{sys.executable!r}, {str(AGENT)!r}]
env = {{ FAULT_AGENT_LOG = {str(starts)!r} }}
cancel_timeout_s = 1.0
startup_timeout_s = 10.0
[providers.acp.sharedfault]
command = [{sys.executable!r}, {str(AGENT)!r}]
cwd_policy = "shared"
cancel_timeout_s = 0.5
startup_timeout_s = 10.0
[providers.acp.broken]
command = [{sys.executable!r}, {str(AGENT)!r}, "crash-start"]
startup_timeout_s = 10.0
""".replace("'", '"') + f"""
[providers.acp.flaky]
command = ["/bin/sh", "-c", '{CRASH_WRAPPER}', "{sys.executable}", "{AGENT}"]
env = {{ FAULT_AGENT_LOG = "{flaky_starts}", FAULT_CRASH_FLAG = "{crash_flag}" }}
startup_timeout_s = 10.0
"""
    d = fast_daemon(root, config).start()
    d.starts = starts  # type: ignore[attr-defined]
    d.flaky_starts = flaky_starts  # type: ignore[attr-defined]
    d.crash_flag = crash_flag  # type: ignore[attr-defined]
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

    def __init__(self, d: Daemon, workdir: Path, provider: str = "script") -> None:
        self.client = d.client()
        if provider == "script":
            self.cid = new(self.client, workdir, ECHO)
        else:
            self.cid = self.client.request(wire.New, provider=provider, workdir=str(workdir))["id"]
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
        # Roomy for a loaded CI machine (a turn takes ~0.1 s here); a loop the fault blocks holds it far longer.
        assert max(self.times) < 4.0, f"the other conversation was held up: {max(self.times):.1f}s"


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


def test_json_nested_too_deeply_fails_its_own_turn_and_no_other_on_the_same_provider(
        faulty: Daemon, tmp_path: Path) -> None:
    # Both decoders recurse: such a line raised RecursionError in the reader, which took the whole
    # provider down (every other conversation's turn ended "shutdown", then each send refused).
    with faulty.client() as client, _Bystander(faulty, _workdir(tmp_path, "other"), provider="acp:fault") as other:
        cid = client.request(wire.New, provider="acp:fault", workdir=str(_workdir(tmp_path, "work")))["id"]
        client.subscribe(cid)
        FAULTS["runtime deep JSON"] += 1
        end, _ = _turn(client, cid, "deep")
        assert end["state"] == "failed" and end.get("reason") == "runtime_exit", end
        assert "nested too deeply" in end["error"], end
        end, records = _turn(client, cid, "after")
        assert end["state"] == "completed" and "echo:after" in _texts(records), end
        time.sleep(0.5)
        assert other.times, "the other conversation on the provider finished no turn"
    assert not any(e.get("event") == "provider.failed" for e in faulty.log_events())


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
        # One message of 20 MB: kept up to the bound of an item, with a line saying what was cut
        # (kept whole, one 800 MB answer made a record no page of history could carry).
        (message,) = [t for t in _texts(records) if t.startswith("x")]
        bound = runtime_output.MAX_ITEM_TEXT_CHARS
        assert message[:bound] == ("x" * 1023 + "\n") * (bound // 1024)
        assert message[bound:] == runtime_output.cut_note(20_000 * 1024 - bound)
        page = client.request(wire.History, conversation=cid, limit=5)
        assert any(e["item"]["text"] == message for e in page["items"])
        assert other.times
    after = rss_mb(faulty.proc.pid)
    assert after - before < 300, f"RSS grew from {before:.0f} to {after:.0f} MB"


def test_a_shared_agent_still_running_a_cancelled_turn_gets_no_prompt_and_its_output_is_not_the_next_turns(
        faulty: Daemon, tmp_path: Path) -> None:
    # The shared agent process is not restarted for one conversation when a cancel times out: what
    # it streamed afterwards was journaled as the next turn's (the agent took the prompt into it).
    work = _workdir(tmp_path, "work")
    with faulty.client() as client:
        cid = client.request(wire.New, provider="acp:sharedfault", workdir=str(work))["id"]
        client.subscribe(cid)
        # 4 s of chunks, then a file written: no later turn's checkpoint would own it
        run = client.request(wire.Send, conversation=cid, text=f"drip 40 {work / 'late.txt'}")["run"]
        time.sleep(0.5)
        FAULTS["cancel ignored by a shared runtime"] += 1
        client.request(wire.Cancel, conversation=cid)
        end = msgspec.json.decode(client.follow(run)[-1].data)
        assert end["state"] == "cancelled" and end.get("reason") == "cancel_timeout", end
        with pytest.raises(c.Busy, match="has not ended the turn it was asked to cancel"):
            client.request(wire.Send, conversation=cid, text="too soon")
        deadline = time.monotonic() + 30
        while True:  # until the agent ends the dripping turn (4 s; longer on a loaded machine)
            try:
                run = client.request(wire.Send, conversation=cid, text="after")["run"]
                break
            except c.Busy:
                assert time.monotonic() < deadline, "the agent never ended the cancelled turn"
                time.sleep(0.2)
        records = client.follow(run, timeout=30)
        end = msgspec.json.decode(records[-1].data)
        assert end["state"] == "completed", end
        assert _texts(records)[-1] == "echo:after" and not any("[old" in t for t in _texts(records)), _texts(records)
    assert not (work / "late.txt").exists()
    assert any(e.get("event") == "acp.fs_after_cancel" for e in faulty.log_events())


def test_updates_for_sessions_that_never_come_are_held_within_a_byte_bound(faulty: Daemon, tmp_path: Path) -> None:
    # Held until their session is known, they were bounded in count only: 500 of up to 64 MiB.
    with faulty.client() as client:
        cid = client.request(wire.New, provider="acp:fault", workdir=str(_workdir(tmp_path, "work")))["id"]
        client.subscribe(cid)
        assert _turn(client, cid, "hello")[0]["state"] == "completed"
        before = rss_mb(faulty.proc.pid)
        FAULTS["runtime updates for unknown sessions"] += 1
        end, records = _turn(client, cid, "ghosts 30 10000000", timeout=120)  # 300 MB of them
        assert end["state"] == "completed" and "ghosts sent" in _texts(records), end
        after = rss_mb(faulty.proc.pid)
    assert after - before < 100, f"RSS grew from {before:.0f} to {after:.0f} MB holding them"
    assert any(e.get("event") == "acp.early_update_dropped" for e in faulty.log_events())


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


def test_a_runtime_that_keeps_dying_is_restarted_with_backoff_while_other_conversations_carry_on(
    faulty: Daemon, tmp_path: Path
) -> None:
    """The real pacing (1 s, then 2 s): each prompt to a conversation whose agent keeps dying
    waits out the delay before its start; another conversation on the same provider (its own
    agent process) and one on another provider are served meanwhile."""
    flag: Path = faulty.crash_flag  # type: ignore[attr-defined]
    log: Path = faulty.flaky_starts  # type: ignore[attr-defined]

    def starts() -> list[tuple[float, bool]]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [(float(line.split()[0]), line.split()[2:] == ["crash-start"]) for line in lines]

    with faulty.client() as client, _Bystander(faulty, _workdir(tmp_path, "peer"), "acp:flaky"), \
            _Bystander(faulty, _workdir(tmp_path, "other")):
        cid = client.request(wire.New, provider="acp:flaky", workdir=str(_workdir(tmp_path, "work")))["id"]
        client.subscribe(cid)
        assert _turn(client, cid, "hello")[0]["state"] == "completed"
        flag.touch()
        FAULTS["runtime keeps dying at start"] += 1
        end, _ = _turn(client, cid, "crash")
        crashed_at = time.time()
        assert end["state"] == "failed" and end["reason"] == "runtime_exit", end
        before = len(starts())

        # 1 s after the crash the next prompt's start is let through; it crashes again.
        t0 = time.monotonic()
        with pytest.raises(c.AgentdError) as err:
            client.request(wire.Send, conversation=cid, text="again")
        took = time.monotonic() - t0
        assert err.value.code == "unsupported" and "initialize" in err.value.message, err.value
        assert "exited with code 4" in err.value.message
        assert took >= 0.9, took

        # Fixed meanwhile: the next start waits 2 s, then the conversation is back.
        flag.unlink()
        t0 = time.monotonic()
        end, records = _turn(client, cid, "after")
        took = time.monotonic() - t0
        assert end["state"] == "completed" and "echo:after" in _texts(records), end
        assert took >= 1.9, took

    new_starts = starts()[before:]
    assert [crashed for _, crashed in new_starts] == [True, False]
    (first, _), (second, _) = new_starts
    assert first - crashed_at >= 0.9 and second - first >= 2.0 - 0.05, (first - crashed_at, second - first)
    journal = faulty.journal(cid)
    failed = [r["data"] for r in journal if r["type"] == "turn" and r["data"].get("reason") == "send_failed"]
    assert len(failed) == 1 and "initialize" in failed[0]["error"], failed
    waits = [e for e in log_events(faulty) if e.get("event") == "acp.restart_backoff" and e.get("provider") == "acp:flaky"]
    assert [round(e["wait_s"]) for e in waits] == [1, 2], waits  # logged, with the conversation's id
    assert all(e.get("conversation") for e in waits), waits
