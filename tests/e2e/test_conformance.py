"""One conformance suite over every runtime, through the real daemon and agentctl.

Each scenario is written once and runs unchanged against every runtime:
``script``, ``copilot``, ``claude``, ``codex``, ``acp:claude``, ``acp:gemini``,
``acp:copilot``, ``acp:codex``. The runtimes are the real programs installed from the package
registries; only the model is scripted (tests/e2e/modelserver.py on 127.0.0.1).
A scenario a runtime cannot do is reported ``unsupported`` from the
capabilities the provider reports (``agentctl providers --json``), never from a
hand-kept list. The matrix of results is printed at the end of the run (see
conftest.py) and written to tests/e2e/conformance-matrix.md.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from daemon_harness import Daemon
from runtimes_e2e import Runtime

pytestmark = pytest.mark.e2e

#: scenario -> the capabilities it needs
SCENARIOS: dict[str, tuple[str, ...]] = {
    "text": (),
    "permission": ("permissions",),
    "yolo": ("permissions",),
    "cancel": ("cancel",),
    "restart": ("reopen",),
    "runtime_killed": ("runtime_process",),
    "model_fails": ("model_endpoint",),
    "large_output": ("permissions",),
    "unknown_event": (),
    "daemon_killed": (),
}

#: large_output: 8 MiB of numbered lines from the runtime's own shell tool
BIG_BYTES = 8 << 20
BIG_COMMAND = f"seq 1 2000000 | head -c {BIG_BYTES}"

#: the markers of agentd's own display cuts of a tool's output
AGENTD_CUT = re.compile(r"\[\d+ (?:more|earlier) (?:characters|bytes) cut\]|… \(\d+ bytes cut\) …")

FILE = "conformance.txt"
COMMAND = f"echo conformance > {FILE}"
#: a tool call still running when agentd is SIGKILLed (``tail -f /dev/null`` is what the test looks for;
#: Claude Code refuses ``sleep N; ...``; ``timeout`` moves itself to a process group of its own; on a pipe,
#: ``tail -f`` would notice its reader gone and end by itself)
SLOW_COMMAND = f"timeout 321 tail -f /dev/null > /dev/null; echo conformance > {FILE}"
SLOW_ARGV = ["tail", "-f", "/dev/null"]


from conformance import Follower, _descendants, _new, _pending, _supported, _turn_ends


# --------------------------------------------------------------------------- scenarios


@pytest.mark.parametrize("scenario", ["text"])
def test_text_turn_is_streamed_and_journaled(runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        return
    runtime.text_only("Hello from the conformance suite, streamed in pieces.")
    cid = _new(daemon, runtime, workdir, scenario)
    follower = Follower(daemon, cid, "Say hello")
    assert follower.finish() == 0, follower.stderr()
    assert any(line.get("type") == "delta" for line in follower.lines), "nothing was streamed"
    journal = daemon.journal(cid)
    items = [r["data"] for r in journal if r["type"] == "item"]
    assert any(i["kind"] == "user" and "Say hello" in i.get("text", "") for i in items)
    assistant = [i for i in items if i["kind"] == "assistant"]
    assert assistant and "conformance suite" in assistant[-1]["text"]
    assert _turn_ends(daemon, cid)[-1]["data"]["state"] == "completed"


@pytest.mark.parametrize("scenario", ["permission"])
def test_permission_allow_runs_the_tool_and_deny_does_not(runtime: Runtime, daemon: Daemon, tmp_path: Path, scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        return
    runtime.call_tool(COMMAND)
    for decision in ("--allow", "--deny"):
        workdir = tmp_path / f"work{decision}"
        workdir.mkdir()
        cid = _new(daemon, runtime, workdir, scenario)
        follower = Follower(daemon, cid, "Run the command")
        inter = _pending(daemon, cid)
        assert inter["kind"] == "permission"
        answered = daemon.agentctl("answer", cid, inter["id"], decision)
        assert answered.returncode == 0, answered.stderr
        code = follower.finish()
        if decision == "--allow":
            assert code == 0, follower.stderr()
            assert (workdir / FILE).read_text().strip() == "conformance"
            tools = [r["data"] for r in daemon.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "tool"]
            assert any("conformance" in (t.get("tool", {}).get("input", "") + json.dumps(t)) for t in tools)
        else:
            assert code in (0, 3), follower.stderr()  # some runtimes end the turn on a denial
            assert not (workdir / FILE).exists(), "a denied command ran"


@pytest.mark.parametrize("scenario", ["yolo"])
def test_yolo_answers_the_permission_allow_once_with_no_person(runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        return
    runtime.call_tool(COMMAND)
    cid = _new(daemon, runtime, workdir, scenario, "--yolo")
    follower = Follower(daemon, cid, "Run the command")
    assert follower.finish() == 0, follower.stderr()
    assert (workdir / FILE).exists()
    answers = [r["data"] for r in daemon.journal(cid) if r["type"] == "answer"]
    assert answers and all(a["auto"] and a["by"] == "yolo" for a in answers)
    asked = {r["data"]["id"]: r["data"] for r in daemon.journal(cid) if r["type"] == "interaction"}
    options = {o["id"]: o for i in asked.values() for o in i.get("options", [])}
    assert all(options[a["answer"]["decision"]].get("allow_once") for a in answers)


@pytest.mark.parametrize("scenario", ["cancel"])
def test_cancel_during_a_slow_answer_ends_cancelled_within_a_second(runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        return
    runtime.slow_text()
    cid = _new(daemon, runtime, workdir, scenario)
    follower = Follower(daemon, cid, "Tell me a long story")
    follower.wait_for(lambda line: line.get("type") == "delta")
    # The bound is on agentd and the runtime: allow for agentctl's own start, measured now.
    s0 = time.monotonic()
    daemon.agentctl("status", "--json")
    agentctl_start = time.monotonic() - s0
    t0 = time.monotonic()
    cancelled = daemon.agentctl("cancel", cid)
    assert cancelled.returncode == 0, cancelled.stderr
    assert follower.finish(timeout=10) == 3, follower.stderr()
    elapsed = time.monotonic() - t0
    assert _turn_ends(daemon, cid)[-1]["data"]["state"] == "cancelled"
    assert elapsed < 1.0 + agentctl_start, f"cancel took {elapsed:.2f}s (agentctl itself {agentctl_start:.2f}s)"
    runtime.text_only("Back again.")
    again = Follower(daemon, cid, "Another prompt")
    assert again.finish() == 0, again.stderr()


@pytest.mark.parametrize("scenario", ["restart"])
@pytest.mark.own_daemon  # it stops or kills the daemon or its runtime processes
def test_restart_reopens_by_id_and_the_follow_up_carries_the_earlier_turns(runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        return
    runtime.text_only("Nice to meet you.")
    cid = _new(daemon, runtime, workdir, scenario)
    first = Follower(daemon, cid, "My name is Ada Lovelace")
    assert first.finish() == 0, first.stderr()
    daemon.stop()
    daemon.start()
    reloaded_at = time.time()
    second = Follower(daemon, cid, "What is my name?")
    assert second.finish() == 0, second.stderr()
    runtime.check_reload(daemon, reloaded_at)
    assert runtime.saw_earlier_turn(daemon, cid, "My name is Ada Lovelace", "What is my name?")


@pytest.mark.parametrize("scenario", ["runtime_killed"])
@pytest.mark.own_daemon  # it stops or kills the daemon or its runtime processes
def test_runtime_killed_mid_turn_fails_the_turn_and_the_next_prompt_works(runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest) -> None:
    if not _supported(daemon, runtime, scenario, request):
        return
    runtime.slow_text()
    cid = _new(daemon, runtime, workdir, scenario)
    follower = Follower(daemon, cid, "Tell me a long story")
    follower.wait_for(lambda line: line.get("type") == "delta")
    victims = _descendants(daemon.proc.pid)
    assert victims, "the runtime process was not found under agentd"
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert follower.finish(timeout=60) == 1, follower.stderr()
    end = _turn_ends(daemon, cid)[-1]["data"]
    assert end["state"] == "failed" and end.get("error"), end
    runtime.text_only("Alive again.")
    reloaded_at = time.time()
    again = Follower(daemon, cid, "Are you there?")
    assert again.finish() == 0, again.stderr()
    runtime.check_reload(daemon, reloaded_at)


@pytest.mark.parametrize("scenario", ["model_fails"])
@pytest.mark.parametrize("failure", ["http_500", "dropped_stream"])
def test_model_endpoint_failure_ends_the_turn_with_the_runtime_report(
    runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, failure: str, request
) -> None:
    """Nothing hangs, the scripted answer never arrives whole, and agentd reports what the runtime said.

    Most runtimes fail the turn with their error text. Some ACP agents report a
    model failure as answer text and end the turn normally; agentd passes that
    on faithfully (it never invents a failure), and the matrix notes it.
    """
    if not _supported(daemon, runtime, scenario, request):
        return
    answer = "This answer never arrives whole, it is cut or refused."
    runtime.text_only(answer)
    if failure == "http_500":
        runtime.server.fail_with(500, retry_after=0)
    else:
        runtime.server.drop_stream(after_chunks=2)
    cid = _new(daemon, runtime, workdir, scenario)
    follower = Follower(daemon, cid, "Say something")
    code = follower.finish(timeout=120)
    end = _turn_ends(daemon, cid)[-1]["data"]
    texts = [r["data"].get("text", "") for r in daemon.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "assistant"]
    assert answer not in texts
    if end["state"] == "failed":
        assert code == 1 and end.get("error"), end
    else:
        assert end["state"] == "completed" and code == 0, (code, end)
        request.node.user_properties.append(("note", "the runtime reports it as an answer"))


def _big_expected() -> str:
    return "".join(f"{n}\n" for n in range(1, 2000001)).encode()[:BIG_BYTES].decode()


@pytest.mark.parametrize("scenario", ["large_output"])
def test_a_tool_result_of_8_mib_passes_through_and_the_whole_output_is_readable(
    runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest
) -> None:
    """The turn completes, the next prompt works, and ``show --item --full`` gives what the runtime passed on.

    agentd keeps whatever the runtime hands it whole. A runtime that cuts its
    own tool's output before agentd sees it is noted in the matrix with how
    much it passed on.
    """
    if not _supported(daemon, runtime, scenario, request):
        return
    runtime.call_tool(BIG_COMMAND)
    cid = _new(daemon, runtime, workdir, scenario, "--yolo")
    follower = Follower(daemon, cid, "Run the command")
    assert follower.finish(timeout=240) == 0, follower.stderr()
    tools = [r["data"] for r in daemon.journal(cid) if r["type"] == "item" and r["data"]["kind"] == "tool"]
    ran = [t for t in tools if "seq 1 2000000" in json.dumps(t)]
    assert ran, f"the command was not run: {tools}"
    done = ran[-1]
    full = daemon.agentctl("show", cid, "--item", done["id"], *(["--agent", done["agent_id"]] if done.get("agent_id") else []),
                           "--full", timeout=120)
    assert full.returncode == 0, full.stderr
    whole = full.stdout.rstrip("\n")
    expected = _big_expected().rstrip("\n")
    if done["tool"].get("cut"):
        assert len(whole.encode()) >= done["tool"]["cut"], "less kept than the record says was cut"
    # agentd's own display cuts (agentd/providers/*: bound, the Claude and Copilot cuts): what it was handed
    # must come back whole, so none of them may be in what `show --full` gives
    assert not AGENTD_CUT.search(whole), f"agentd kept only its own display cut: {AGENTD_CUT.search(whole)[0]!r}"
    if whole == expected:
        pass  # the whole 8 MiB, as the runtime passed it on
    else:
        # The runtime cut it before agentd saw it: agentd has what it was given.
        print(f"\n{runtime.name}: tool item {json.dumps(done)[:2000]}")
        passed = len(whole.encode())
        request.node.user_properties.append(("note", (
            f"the runtime passes on {passed:,} bytes of the 8 MiB (it cuts its tool's output itself)" if passed else
            "the runtime passes on none of its shell tool's output")))
    runtime.text_only("Still here.")
    again = Follower(daemon, cid, "Are you still there?")
    assert again.finish() == 0, again.stderr()
    assert _turn_ends(daemon, cid)[-1]["data"]["state"] == "completed"


@pytest.mark.parametrize("scenario", ["unknown_event"])
def test_a_kind_agentd_does_not_know_becomes_an_unknown_record_with_its_type_name(
    runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest
) -> None:
    """A tool turn on the real runtime; every kind agentd does not act on is an ``unknown`` record.

    The script provider emits one on purpose (its ``unknown_event`` step). A
    real runtime that sends no kind agentd does not know in such a turn cannot
    be made to by the model alone: its provider's mapping is then checked with
    an event of a new type in that runtime's real shape (:meth:`Runtime.unknown_shape`),
    and the cell notes it.
    """
    if not _supported(daemon, runtime, scenario, request):
        return
    runtime.call_tool(COMMAND)
    runtime.emit_unknown("future.kind")
    cid = _new(daemon, runtime, workdir, scenario, "--yolo")
    follower = Follower(daemon, cid, "Run the command")
    assert follower.finish(timeout=120) == 0, follower.stderr()
    unknown = [r for r in daemon.journal(cid) if r["type"] == "unknown"]
    for rec in unknown:
        assert rec["data"]["provider"] == runtime.provider and rec["data"]["type"], rec
    tail = daemon.agentctl("tail", cid, "--no-follow")
    assert tail.returncode == 0, tail.stderr
    if unknown:
        names = sorted({r["data"]["type"] for r in unknown})
        assert all(repr(n) in tail.stdout for n in names), tail.stdout
        # agentd warns once per (provider, kind) in its life: on a shared daemon an earlier cell's turn may
        # have been the first, so the whole log is read, for a warning naming each kind.
        warned = {(e.get("provider"), e.get("type")) for e in daemon.log_events()
                  if isinstance(e, dict) and e.get("event") == "runtime.unknown_kind"}
        assert all((runtime.provider, n) in warned for n in names), (names, warned)
        if runtime.name != "script":
            request.node.user_properties.append(("note", "the runtime sent: " + ", ".join(names)))
    else:
        assert runtime.name != "script", "the script's unknown_event step left no record"
        runtime.check_unknown_mapping()
        request.node.user_properties.append(
            ("note", "the runtime sent no unknown kind; its provider's mapping was checked with one in its real shape"))

def _proc(pid: int) -> tuple[int, list[str]] | None:
    """(start time in clock ticks after boot, argv) of a live, non-zombie ``pid``; None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if stat[0] == "Z":
        return None
    return int(stat[19]), [a.decode(errors="replace") for a in argv if a]


def _ours(pid: int, root: Path) -> bool:
    """Whether ``pid`` belongs to this test's daemon: its environment names our state dir, or it runs under our root."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return f"AGENTD_STATE_DIR={root}".encode() in environ or cwd.startswith(str(root))


@pytest.mark.parametrize("scenario", ["daemon_killed"])
@pytest.mark.own_daemon  # it stops or kills the daemon or its runtime processes
def test_daemon_killed_mid_tool_call_leaves_no_runtime_process_and_the_next_prompt_works(
    runtime: Runtime, daemon: Daemon, workdir: Path, scenario: str, request: pytest.FixtureRequest
) -> None:
    """SIGKILL of agentd while the runtime runs a tool: nothing of the old runtime stays alive
    (by the pids and groups agentd recorded, and by a /proc scan for its commands started since
    the old daemon started), and after a restart the conversation takes a new prompt."""
    if not _supported(daemon, runtime, scenario, request):
        return
    runtime.call_tool(SLOW_COMMAND)
    cid = _new(daemon, runtime, workdir, scenario, "--yolo")
    follower = Follower(daemon, cid, "Run the command")
    old_pid = daemon.proc.pid
    old_start = _proc(old_pid)[0]

    def tool_running() -> list[int]:
        return [p for p in _descendants(old_pid) if (_proc(p) or (0, []))[1] == SLOW_ARGV]

    deadline = time.monotonic() + 90
    while not tool_running():
        seen = [line.get("type") for line in follower.lines]
        assert time.monotonic() < deadline and "result" not in seen, (
            f"the tool never ran; follower saw {seen}; tools: "
            f"{[r['data'] for r in daemon.journal(cid) if r['type'] == 'item' and r['data'].get('tool')][-1:]}")
        time.sleep(0.05)
    old = {p: _proc(p) for p in _descendants(old_pid)}
    old = {p: v for p, v in old.items() if v is not None}
    records = [json.loads(f.read_text()) for f in (daemon.state_dir / "runtimes").glob("*.json")]
    commands = {tuple(argv) for _, argv in old.values()}
    daemon.kill()
    follower.finish(timeout=30)

    def left() -> list[str]:
        out = []
        for pid, (start, argv) in old.items():
            now = _proc(pid)
            if now is not None and now[0] == start:
                out.append(f"{pid} {' '.join(argv)[:120]}")
        for r in records:
            for pid in (r["pid"], r["runtime_pid"]):
                now = _proc(pid)
                if now is not None and now[0] in (r["start"], r["runtime_start"]):
                    out.append(f"recorded {pid}")
            try:
                os.killpg(r["pgid"], 0)
                out.append(f"group {r['pgid']}")
            except OSError:
                pass
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                now = _proc(int(entry))
                if (now is not None and now[0] >= old_start and tuple(now[1]) in commands
                        and _ours(int(entry), daemon.root)):
                    out.append(f"scan {entry} {' '.join(now[1])[:120]}")
        return sorted(set(out))

    killed_at = time.monotonic()
    deadline = killed_at + 20
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left(), left()
    print(f"\n{runtime.name}: {len(old)} processes under agentd, none left {time.monotonic() - killed_at:.1f} s after its SIGKILL")
    assert records, "agentd recorded no runtime process"
    assert all(r["parent"] == old_pid for r in records)
    daemon.start()
    runtime.text_only("Alive again.")
    again = Follower(daemon, cid, "Are you there?")
    assert again.finish() == 0, again.stderr()
    tools: dict[str, dict[str, Any]] = {}
    first_run = next(r["run"] for r in daemon.journal(cid) if r["type"] == "prompt")
    for r in daemon.journal(cid):
        if r["type"] == "item" and r.get("run") == first_run and r["data"].get("tool"):
            tools[r["data"]["id"]] = r["data"]["tool"]
    assert all(t.get("status", "running") in ("completed", "failed") for t in tools.values()), tools
