"""Restart backoff of ACP agents that keep dying: starts are spaced 1x, 2x, 4x the base delay,
a request past the wait limit fails fast saying when to retry, other conversations carry on.

Drives :class:`AcpProvider` in-process under trio (as the daemon does: a conversation whose
agent exited is reopened by id) against ``acp_fault_agent.py``, behind a shell wrapper that
makes every start crash before ``initialize`` while a flag file exists. The policy is the
default one scaled down (0.1 s doubling, waits up to 0.5 s) so that the test takes seconds;
tests/unit/test_restart_backoff.py checks the default numbers on trio's MockClock.
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import trio

from agentd import contract as c
from agentd.config import AcpAgentConfig
from agentd.providers._restart import RestartPolicy, RuntimeRestarting
from agentd.providers.acp import AcpConversation, AcpProvider

AGENT = pathlib.Path(__file__).parent / "acp_fault_agent.py"
POLICY = RestartPolicy(initial_s=0.1, max_s=3.2, healthy_s=60.0, wait_limit_s=0.5)
#: while $FAULT_CRASH_FLAG exists, every start of the agent exits (status 4) before initialize
WRAPPER = 'if [ -e "$FAULT_CRASH_FLAG" ]; then exec "$0" "$1" crash-start; else exec "$0" "$1"; fi'
#: slack for a clock read in another process, seconds
SLACK = 0.02
#: a delay counts from the failure, a little before the next request began: slack for that
LATE = 0.05


class Sink:
    def __init__(self) -> None:
        self.events: list[c.Event] = []

    def emit(self, event: c.Event) -> None:
        self.events.append(event)

    def turns(self) -> list[c.Turn]:
        return [e.turn for e in self.events if isinstance(e, c.TurnEvent) and e.turn.state.terminal]

    def texts(self) -> list[str]:
        return [e.item.text for e in self.events if isinstance(e, c.ItemEvent)]

    async def wait_turns(self, n: int, timeout: float = 20.0) -> c.Turn:
        with trio.fail_after(timeout):
            while len(self.turns()) < n:
                await trio.sleep(0.01)
        return self.turns()[n - 1]


class Fault:
    """The fault agent's config, its start log and the crash-at-start flag."""

    def __init__(self, tmp_path: pathlib.Path, cwd_policy: str = "workdir") -> None:
        self.log = tmp_path / "starts.log"
        self.flag = tmp_path / "crash-at-start"
        self.config = msgspec.convert({
            "command": ["/bin/sh", "-c", WRAPPER, sys.executable, str(AGENT)],
            "env": {"FAULT_AGENT_LOG": str(self.log), "FAULT_CRASH_FLAG": str(self.flag)},
            "cwd_policy": cwd_policy,
            "startup_timeout_s": 10.0,
        }, AcpAgentConfig)
        self.state = tmp_path / "state"

    def crash_at_start(self, on: bool) -> None:
        if on:
            self.flag.touch()
        else:
            self.flag.unlink(missing_ok=True)

    def starts(self) -> list[tuple[float, bool]]:
        """(wall time, crashed at start) of every start so far."""
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            stamp, _pid, *args = line.split()
            out.append((float(stamp), args == ["crash-start"]))
        return out


async def serve(nursery: trio.Nursery, fault: Fault) -> AcpProvider:
    provider = AcpProvider(fault.config, state_dir=fault.state, name="acp:fault", restart_policy=POLICY)
    await nursery.start(provider.run)
    return provider


def workdir(tmp_path: pathlib.Path, name: str) -> pathlib.Path:
    w = tmp_path / name
    w.mkdir()
    return w


async def turn(conv: AcpConversation, sink: Sink, text: str) -> c.Turn:
    n = len(sink.turns())
    await conv.send(c.Prompt(text=text))
    return await sink.wait_turns(n + 1)


async def timed(fn: Callable[[], Any]) -> tuple[float, BaseException | None, Any]:
    """(seconds taken, the exception raised or None, the result)."""
    t0 = trio.current_time()
    try:
        result = await fn()
    except c.AgentdError as exc:
        return trio.current_time() - t0, exc, None
    return trio.current_time() - t0, None, result


class Bystander:
    """Another conversation of the same provider running turns meanwhile."""

    def __init__(self, conv: AcpConversation, sink: Sink) -> None:
        self.conv, self.sink = conv, sink
        self.times: list[float] = []
        self.stop = trio.Event()
        self.done = trio.Event()

    async def run(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                t0 = trio.current_time()
                end = await turn(self.conv, self.sink, f"bystander {n}")
                assert end.state is c.TurnState.COMPLETED, end
                self.times.append(trio.current_time() - t0)
        finally:
            self.done.set()


async def test_a_conversation_whose_agent_keeps_dying_restarts_with_backoff_while_others_carry_on(
    tmp_path: pathlib.Path, nursery: trio.Nursery
) -> None:
    fault = Fault(tmp_path)
    provider = await serve(nursery, fault)
    sink_a, sink_b = Sink(), Sink()
    a = await provider.open(c.OpenRequest(workdir=str(workdir(tmp_path, "a"))), sink_a)
    b = await provider.open(c.OpenRequest(workdir=str(workdir(tmp_path, "b"))), sink_b)
    assert (await turn(a, sink_a, "hello")).state is c.TurnState.COMPLETED
    other = Bystander(b, sink_b)
    nursery.start_soon(other.run)

    fault.crash_at_start(True)
    end = await turn(a, sink_a, "crash")
    crashed_at = time.time()
    assert end.state is c.TurnState.FAILED and end.reason == "runtime_exit", end
    assert provider._restarts.failures(a.id) == 1

    # The daemon reopens the conversation for each new prompt. Each start crashes: the
    # attempts are held back 0.1, 0.2, 0.4 s, each a failure of its own (the start's error).
    before = len(fault.starts())
    outcomes = []
    for delay in (0.1, 0.2, 0.4):
        took, exc, _ = await timed(lambda: provider.open(c.OpenRequest(workdir="", conversation_id=a.id), Sink()))
        outcomes.append((delay, took, exc))
    for delay, took, exc in outcomes:
        assert isinstance(exc, c.RuntimeUnavailable) and not isinstance(exc, RuntimeRestarting), exc
        assert "initialize" in exc.message, exc.message
        assert took >= delay - LATE, (delay, took)
    starts = fault.starts()[before:]
    assert [crashed for _, crashed in starts] == [True, True, True]
    stamps = [crashed_at] + [t for t, _ in starts]
    gaps = [later - earlier for earlier, later in zip(stamps, stamps[1:])]
    assert gaps[0] >= 0.1 - LATE  # from when the test saw the crash (a little after it)
    # Between two starts: exact, since each failure came after its own start.
    assert gaps[1] >= 0.2 - SLACK and gaps[2] >= 0.4 - SLACK, gaps

    # 0.8 s is past the 0.5 s wait limit: the next prompt fails at once, and nothing is spawned.
    took, exc, _ = await timed(lambda: provider.open(c.OpenRequest(workdir="", conversation_id=a.id), Sink()))
    assert isinstance(exc, RuntimeRestarting) and exc.code == "unsupported", exc
    assert took < 0.1
    assert f"the acp:fault agent of conversation {a.id} is restarting after 4 failures in a row" in exc.message
    assert "exited with code 4" in exc.message and "retry then" in exc.message
    assert 0.5 < exc.details["retry_after_s"] <= 0.8
    assert len(fault.starts()) == before + 3

    # A new conversation is not held back by another one's backoff: its start goes ahead (and crashes).
    took, exc, _ = await timed(lambda: provider.open(c.OpenRequest(workdir=str(workdir(tmp_path, "c"))), Sink()))
    assert isinstance(exc, c.RuntimeUnavailable) and not isinstance(exc, RuntimeRestarting), exc
    assert len(fault.starts()) == before + 4 and provider._restarts.failures() == 1

    # Fixed: the prompt after the delay gets a fresh agent; a completed turn clears the backoff.
    fault.crash_at_start(False)
    await trio.sleep(provider._restarts.remaining(a.id))
    sink_a2 = Sink()
    a2 = await provider.open(c.OpenRequest(workdir="", conversation_id=a.id), sink_a2)
    assert (await turn(a2, sink_a2, "after")).state is c.TurnState.COMPLETED
    assert "echo:after" in sink_a2.texts()
    assert provider._restarts.failures(a.id) == 0

    other.stop.set()
    with trio.fail_after(10):
        await other.done.wait()
    assert other.times, "the other conversation finished no turn"
    assert max(other.times) < 2.0, other.times  # never held up by the restarts next door
    assert len(other.times) >= 5


async def test_new_conversations_on_an_agent_that_cannot_start_are_paced_too(
    tmp_path: pathlib.Path, nursery: trio.Nursery
) -> None:
    fault = Fault(tmp_path)
    fault.crash_at_start(True)
    provider = await serve(nursery, fault)
    work = workdir(tmp_path, "w")
    results = []
    for _ in range(4):  # held back 0, 0.1, 0.2, 0.4 s
        results.append(await timed(lambda: provider.open(c.OpenRequest(workdir=str(work)), Sink())))
    for took, exc, _ in results:
        assert isinstance(exc, c.RuntimeUnavailable) and not isinstance(exc, RuntimeRestarting), exc
    assert all(took >= d - LATE for (took, _, _), d in zip(results, (0.0, 0.1, 0.2, 0.4))), results
    stamps = [t for t, crashed in fault.starts()]
    gaps = [later - earlier for earlier, later in zip(stamps, stamps[1:])]
    assert len(gaps) == 3 and all(g >= d - SLACK for g, d in zip(gaps, (0.1, 0.2, 0.4))), gaps
    # 0.8 s left: fail fast, and `agentctl providers` (check) never waits.
    took, exc, _ = await timed(lambda: provider.open(c.OpenRequest(workdir=str(work)), Sink()))
    assert isinstance(exc, RuntimeRestarting) and "the acp:fault agent is restarting after 4 failures" in exc.message
    with pytest.raises(RuntimeRestarting):
        await provider.check()
    assert len(fault.starts()) == 4
    # Fixed: after the delay a new conversation opens, and the count starts over.
    fault.crash_at_start(False)
    await trio.sleep(provider._restarts.remaining())
    sink = Sink()
    conv = await provider.open(c.OpenRequest(workdir=str(work)), sink)
    assert provider._restarts.failures() == 0
    assert (await turn(conv, sink, "hi")).state is c.TurnState.COMPLETED


async def test_the_shared_agent_is_restarted_with_backoff(tmp_path: pathlib.Path, nursery: trio.Nursery) -> None:
    fault = Fault(tmp_path, cwd_policy="shared")
    provider = await serve(nursery, fault)
    sink_a, sink_b = Sink(), Sink()
    a = await provider.open(c.OpenRequest(workdir=str(workdir(tmp_path, "a"))), sink_a)
    b = await provider.open(c.OpenRequest(workdir=str(workdir(tmp_path, "b"))), sink_b)
    fault.crash_at_start(True)
    end = await turn(a, sink_a, "crash")
    assert end.state is c.TurnState.FAILED and end.reason == "runtime_exit"
    await trio.sleep(0.05)
    assert any(isinstance(e, c.ExitEvent) for e in sink_b.events)  # one process: b lost it too
    before = len(fault.starts())
    took_a, exc_a, _ = await timed(lambda: a.send(c.Prompt(text="again")))
    took_b, exc_b, _ = await timed(lambda: b.send(c.Prompt(text="again")))
    assert isinstance(exc_a, c.RuntimeUnavailable) and took_a >= 0.1 - LATE
    assert isinstance(exc_b, c.RuntimeUnavailable) and took_b >= 0.2 - LATE
    fault.crash_at_start(False)
    took, exc, _ = await timed(lambda: b.send(c.Prompt(text="back")))
    assert exc is None and took >= 0.4 - LATE
    assert (await sink_b.wait_turns(1)).state is c.TurnState.COMPLETED
    starts = fault.starts()[before:]
    assert [crashed for _, crashed in starts] == [True, True, False]
    gaps = [later - earlier for (earlier, _), (later, _) in zip(starts, starts[1:])]
    assert gaps[0] >= 0.2 - SLACK and gaps[1] >= 0.4 - SLACK, gaps
    assert provider._restarts.failures() == 0


# --------------------------------------------------------------------------- claude


FAKE_CLAUDE = pathlib.Path(__file__).parent / "claude_fake_cli.py"


async def test_a_claude_conversation_whose_cli_keeps_dying_restarts_with_backoff_while_others_carry_on(
    tmp_path: pathlib.Path, nursery: trio.Nursery
) -> None:
    from agentd.config import ClaudeConfig
    from agentd.providers.claude import ClaudeProvider

    cli = tmp_path / "claude"
    cli.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_CLAUDE}" "$@"\n')
    cli.chmod(0o755)
    log, flag = tmp_path / "claude-starts.log", tmp_path / "crash-at-start"
    config = msgspec.convert({
        "cli_path": str(cli), "config_dir": str(tmp_path / "claude-config"), "api_key_env": "",
        "env": {"FAKE_CLAUDE_LOG": str(log), "FAKE_CLAUDE_CRASH_FLAG": str(flag)},
    }, ClaudeConfig)
    provider = ClaudeProvider(config, state_dir=tmp_path / "state", name="claude", restart_policy=POLICY)
    await nursery.start(provider.run)

    def starts() -> list[tuple[float, bool]]:
        return [(float(x.split()[0]), x.split()[2] == "crash-start") for x in log.read_text().splitlines()]

    sink_a, sink_b = Sink(), Sink()
    with trio.fail_after(60):  # the first open imports the SDK
        a = await provider.open(c.OpenRequest(workdir=str(workdir(tmp_path, "a"))), sink_a)
    b = await provider.open(c.OpenRequest(workdir=str(workdir(tmp_path, "b"))), sink_b)
    assert (await turn(a, sink_a, "hello")).state is c.TurnState.COMPLETED
    flag.touch()
    end = await turn(a, sink_a, "crash")
    assert end.state is c.TurnState.FAILED and end.reason == "runtime_exit", end
    assert "exit status 3" in end.error or "3" in end.error, end.error
    assert provider._restarts.failures(a.id) == 1

    # The daemon reopens the conversation by id for each prompt; each start crashes.
    before = len(starts())
    for delay in (0.1, 0.2, 0.4):
        took, exc, _ = await timed(lambda: provider.open(c.OpenRequest(workdir="", conversation_id=a.id), Sink()))
        assert isinstance(exc, c.RuntimeUnavailable) and not isinstance(exc, RuntimeRestarting), exc
        assert took >= delay - LATE, (delay, took)
    stamps = [t for t, _ in starts()[before:]]
    assert [crashed for _, crashed in starts()[before:]] == [True] * 3
    gaps = [later - earlier for earlier, later in zip(stamps, stamps[1:])]
    assert gaps[0] >= 0.2 - SLACK and gaps[1] >= 0.4 - SLACK, gaps
    took, exc, _ = await timed(lambda: provider.open(c.OpenRequest(workdir="", conversation_id=a.id), Sink()))
    assert isinstance(exc, RuntimeRestarting) and took < 0.1, exc
    assert f"Claude Code of conversation {a.id} is restarting after 4 failures in a row" in exc.message
    assert len(starts()) == before + 3

    # The other conversation's CLI is up and serves meanwhile.
    t0 = trio.current_time()
    assert (await turn(b, sink_b, "still here?")).state is c.TurnState.COMPLETED
    assert trio.current_time() - t0 < 2.0

    flag.unlink()
    await trio.sleep(provider._restarts.remaining(a.id))
    sink_a2 = Sink()
    a2 = await provider.open(c.OpenRequest(workdir="", conversation_id=a.id), sink_a2)
    assert (await turn(a2, sink_a2, "back")).state is c.TurnState.COMPLETED
    assert provider._restarts.failures(a.id) == 0


async def test_a_provider_that_crashes_hands_its_conversations_an_exit_so_they_reopen(tmp_path: pathlib.Path) -> None:
    # A crash of the provider (not a stop) closes its conversations; without an ExitEvent the
    # daemon kept each closed object and every later send was refused "provider stopped".
    fault = Fault(tmp_path)
    provider = AcpProvider(fault.config, state_dir=fault.state, name="acp:fault", restart_policy=POLICY)
    sink = Sink()

    async def boom() -> None:
        raise RuntimeError("a bug in the provider")

    with pytest.raises(BaseException) as crashed:
        async with trio.open_nursery() as nursery:
            await nursery.start(provider.run)
            conv = await provider.open(c.OpenRequest(workdir=str(workdir(tmp_path, "a"))), sink)
            assert (await turn(conv, sink, "hello")).state is c.TurnState.COMPLETED
            provider._spawn(boom)
            await trio.sleep_forever()
    assert crashed.group_contains(RuntimeError)
    exits = [e for e in sink.events if isinstance(e, c.ExitEvent)]
    assert len(exits) == 1 and "provider acp:fault failed" in exits[0].error
