"""No runtime outlives agentd, even a SIGKILLed one (issue 13, items 1 and 7).

The runtime is ``acp_fault_agent.py orphans``: an ACP agent that ignores
stdin EOF and SIGTERM, with a SIGTERM-ignoring child in its process group and
another that ``setsid``-ed itself away, mid tool call. agentd is SIGKILLed;
nothing of the runtime may be left, the restarted daemon ends the cut turn and
its running tool item (``failed``, ``run_interrupted``) and takes a new prompt.
A record whose pid now belongs to another process (pid reuse) is not touched.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from agentd import wire
from daemon_harness import Daemon

from .conftest import fast_daemon, log_events, wait_for
from .figures import FAULTS

AGENT = Path(__file__).parent / "acp_fault_agent.py"


def _config() -> str:
    return f"""
[providers.acp.fault]
command = ["{sys.executable}", "{AGENT}"]
startup_timeout_s = 10.0
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count: it runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _start_orphans(d: Daemon, tmp_path: Path) -> tuple[str, str, dict[str, int], dict[str, Any]]:
    """A conversation on acp:fault mid tool call in the ``orphans`` command; (cid, run, pids, keeper record)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    pidfile = tmp_path / "pids.json"
    with d.client() as client:
        cid = client.request(wire.New, provider="acp:fault", workdir=str(work))["id"]
        run = client.request(wire.Send, conversation=cid, text=f"orphans {pidfile}")["run"]
    pids = wait_for(lambda: pidfile.exists() and json.loads(pidfile.read_text() or "null"), timeout=20)
    # The tool item is journaled (durable) before the kill.
    wait_for(lambda: any(r["type"] == "item" and "tool" in r["data"] and r["data"]["tool"].get("status", "running") == "running"
                         for r in d.journal(cid)), timeout=10)
    records = [json.loads(p.read_text()) for p in (d.state_dir / "runtimes").glob("*.json")]
    keeper = next(r for r in records if r["runtime_pid"] == pids["agent"])
    assert keeper["pgid"] == keeper["pid"] and keeper["start"] == start_time(keeper["pid"])
    assert keeper["runtime_start"] == start_time(pids["agent"]) and keeper["what"] == "acp:fault"
    return cid, run, pids, keeper


def _assert_recovered(d: Daemon, cid: str, run: str) -> None:
    """The cut turn ended run_interrupted with its tool item failed, and the conversation goes on."""
    records = [r for r in d.journal(cid) if r.get("run") == run]
    assert [r["data"]["reason"] for r in records if r["type"] == "turn" and r["data"]["state"] != "working"] == [
        "run_interrupted"]
    last_tool = [r["data"] for r in records if r["type"] == "item" and r["data"].get("tool")][-1]
    assert last_tool["tool"]["status"] == "failed" and last_tool["tool"]["output"].endswith("run_interrupted")
    assert last_tool.get("ended_at")
    shown = json.loads(d.agentctl("show", cid, "--json").stdout)
    assert shown["record"]["state"] == "idle" and not shown["record"]["active_run"] and not shown["pending"]
    exported = json.loads(d.agentctl("export", cid, "--format", "json", "--include-tools").stdout)
    tools = [e["tool"] for e in exported["entries"] if e.get("run") == run and e["role"] == "tool"]
    assert [(t["status"], t["output"]) for t in tools] == [("failed", "run_interrupted")], tools
    with d.client() as client:
        client.subscribe(cid)
        next_run = client.request(wire.Send, conversation=cid, text="hello again")["run"]
        end = client.follow(next_run, timeout=30)[-1]
        assert msgspec.json.decode(end.data)["state"] == "completed"


def test_sigkill_of_agentd_leaves_no_process_of_a_runtime_that_ignores_eof_and_sigterm(tmp_path: Path) -> None:
    d = fast_daemon(tmp_path, _config()).start()
    try:
        cid, run, pids, keeper = _start_orphans(d, tmp_path)
        t0 = time.monotonic()
        d.kill()
        everyone = [keeper["pid"], *pids.values()]
        # The keeper's watch: SIGTERM, then SIGKILL after its 2 s grace; the setsid-ed child too.
        wait_for(lambda: not any(alive(p) for p in everyone), timeout=15)
        gone_s = time.monotonic() - t0
        assert gone_s < 10, gone_s
        print(f"\nSIGKILL of agentd -> its runtime's 4 processes gone in {gone_s:.2f} s")
        FAULTS["agentd SIGKILLed mid tool call (orphans)"] += 1
        d.start()
        _assert_recovered(d, cid, run)
        assert not list((d.state_dir / "runtimes").glob("*.json")) or all(
            json.loads(p.read_text())["parent"] == d.proc.pid for p in (d.state_dir / "runtimes").glob("*.json"))
    finally:
        d.stop()
        for p in pids.values() if "pids" in locals() else ():
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_restart_reaps_the_groups_a_killed_agentd_left_running(tmp_path: Path) -> None:
    """The keeper is frozen (SIGSTOP) when agentd dies, so its own watch cannot act: the next start
    ends the group and the keeper's descendants (the setsid-ed child too) and logs each group."""
    d = fast_daemon(tmp_path, _config()).start()
    try:
        cid, run, pids, keeper = _start_orphans(d, tmp_path)
        os.kill(keeper["pid"], signal.SIGSTOP)
        d.kill()
        time.sleep(3.0)  # longer than the keeper's grace: nothing ended them
        everyone = [keeper["pid"], *pids.values()]
        assert all(alive(p) for p in everyone)
        t0 = time.monotonic()
        d.start()
        start_s = time.monotonic() - t0
        assert not any(alive(p) for p in everyone)
        reaped = [e for e in log_events(d) if e.get("event") == "runtime.reaped"]
        assert len(reaped) == 1, reaped
        assert reaped[0]["pid"] == keeper["pid"] and reaped[0]["pgid"] == keeper["pgid"]
        assert reaped[0]["what"] == "acp:fault" and reaped[0]["processes"] == 4
        assert start_s < 10, start_s
        print(f"\nrestart with a frozen runtime left: reaped {reaped[0]['processes']} processes, start took {start_s:.2f} s")
        FAULTS["agentd SIGKILLed with its runtime frozen (reaped at start)"] += 1
        _assert_recovered(d, cid, run)
    finally:
        d.stop()
        for p in pids.values() if "pids" in locals() else ():
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_recorded_pid_that_now_names_another_process_is_not_killed(tmp_path: Path) -> None:
    """pid reuse: the record's pid runs, in a group of its own, but its start time is not the recorded one."""
    bystander = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        records = tmp_path / "state" / "runtimes"
        records.mkdir(parents=True, mode=0o700)
        (tmp_path / "state").chmod(0o700)
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pid = bystander.pid
        (records / f"{pid}.json").write_text(json.dumps({
            "pid": pid, "pgid": pid, "start": start_time(pid) - 1, "runtime_pid": pid,
            "runtime_start": start_time(pid) - 1, "parent": 1, "boot_id": boot, "what": "acp:fault",
            "command": "sleep"}))
        d = fast_daemon(tmp_path, _config()).start()
        try:
            time.sleep(0.5)
            assert bystander.poll() is None and alive(pid)
            stale = [e for e in log_events(d) if e.get("event") == "runtime.record_stale"]
            assert [e["pid"] for e in stale] == [pid]
            assert not [e for e in log_events(d) if e.get("event") == "runtime.reaped"]
            assert not (records / f"{pid}.json").exists()
            FAULTS["stale runtime record (pid reused)"] += 1
        finally:
            d.stop()
    finally:
        bystander.kill()
        bystander.wait()



def test_a_runtime_outlives_the_thread_that_spawned_it(tmp_path: Path) -> None:
    """The parent-death signal fires when the spawning *thread* ends (trio's idle worker threads end
    after 10 s): the keeper must tell that from agentd's death, so the agent keeps running."""
    starts = tmp_path / "starts.log"
    d = fast_daemon(tmp_path, _config() + f'env = {{ FAULT_AGENT_LOG = "{starts}" }}\n').start()
    try:
        work = tmp_path / "work"
        work.mkdir()
        with d.client() as client:
            cid = client.request(wire.New, provider="acp:fault", workdir=str(work))["id"]
            client.subscribe(cid)
            for text in ("before", "after"):
                run = client.request(wire.Send, conversation=cid, text=text)["run"]
                end = client.follow(run, timeout=30)[-1]
                assert msgspec.json.decode(end.data)["state"] == "completed"
                if text == "before":
                    time.sleep(12)  # past trio's 10 s thread-cache idle timeout
        assert len(starts.read_text().splitlines()) == 1, starts.read_text()
    finally:
        d.stop()
