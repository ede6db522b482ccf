"""A turn cancelled while its provider conversation is still being opened is never sent.

Opening can take seconds: a runtime starting, or the restart backoff after a
crash (BACKOFF_S after the first one). A cancel meanwhile ends the turn at once,
cancelled "before the runtime was ready"; when the open finishes, the prompt of
that ended turn must not reach the agent, the Send still returns normally, and
the conversation opened is kept for the next prompt.

A real daemon runs ``acp_fault_agent.py`` as ``acp:fault``; the agent logs its
starts and the text of every prompt it receives. The slow open is the restart
backoff: a ``crash`` ends a turn, the next start is held back BACKOFF_S.
"""

from __future__ import annotations

import json
import os
import shlex
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

from .conftest import FAULT_AGENT, agent_prompts, fast_daemon, fault_agent_daemon, wait_for

BACKOFF_S = 1.0


def _active(d: Daemon, cid: str) -> str:
    """The run the daemon has in flight (its view: on disk the record is a checkpoint, issue 18)."""
    with d.client() as client:
        return client.request(wire.Show, conversation=cid)["record"].get("active_run", "")


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("cancel-opening")
    starts, prompts = root / "agent-starts.log", root / "agent-prompts.log"
    d = fault_agent_daemon(root, "fault", {"FAULT_AGENT_LOG": starts, "FAULT_AGENT_PROMPTS": prompts},
                           before=f"[runtimes]\nrestart_backoff_initial_s = {BACKOFF_S}\n").start()
    d.starts = starts  # type: ignore[attr-defined]
    try:
        yield d
    finally:
        d.stop()


def _starts(d: Daemon) -> int:
    path: Path = d.starts  # type: ignore[attr-defined]
    return len(path.read_text().splitlines()) if path.exists() else 0


def _turn(client: Client, cid: str, text: str) -> dict[str, Any]:
    run = client.request(wire.Send, conversation=cid, text=text)["run"]
    return msgspec.json.decode(client.follow(run, timeout=20)[-1].data)


def _conversation(d: Daemon, client: Client, workdir: Path) -> str:
    workdir.mkdir()
    cid = client.request(wire.New, provider="acp:fault", workdir=str(workdir))["id"]
    client.subscribe(cid)
    assert _turn(client, cid, "hello")["state"] == "completed"
    return cid


def _prompt_run(d: Daemon, cid: str, text: str) -> str:
    """The run of the journaled prompt ``text`` (empty while it is not journaled)."""
    for r in d.journal(cid):
        if r["type"] == "prompt" and r["data"].get("text") == text:
            return r.get("run", "")
    return ""


def _ends(d: Daemon, cid: str, run: str) -> list[dict[str, Any]]:
    """The terminal turn records of ``run``."""
    return [r["data"] for r in d.journal(cid)
            if r["type"] == "turn" and r.get("run") == run and r["data"]["state"] != "working"]


def _in_background(call: Any) -> tuple[threading.Thread, list[Any]]:
    """``call()`` in a started thread; the list gets its result or the exception it raised."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # noqa: BLE001 - the test checks it
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _assert_cancelled_before_ready(d: Daemon, cid: str, run: str) -> None:
    ends = _ends(d, cid, run)
    assert len(ends) == 1, ends
    assert ends[0]["state"] == "cancelled" and ends[0]["reason"] == "cancelled", ends
    assert ends[0]["error"] == "cancelled before the runtime was ready", ends
    # Nothing of the agent's for that run, and no end of a turn nobody runs (a duplicate end).
    journal = d.journal(cid)
    assert not [r for r in journal if r["type"] == "item" and r.get("run") == run]
    assert not [r for r in journal if r["type"] == "turn" and not r.get("run")], journal


def test_a_prompt_cancelled_while_its_runtime_restarts_never_reaches_the_agent(slow: Daemon, tmp_path: Path) -> None:
    with slow.client() as client, slow.client() as sender:
        cid = _conversation(slow, client, tmp_path / "work")
        assert _turn(client, cid, "crash")["reason"] == "runtime_exit"
        starts = _starts(slow)

        # The next prompt waits out the backoff (BACKOFF_S) in the open; it is cancelled meanwhile.
        t0 = time.monotonic()
        thread, sent = _in_background(lambda: sender.request(wire.Send, conversation=cid, text="too late"))
        run = wait_for(lambda: _prompt_run(slow, cid, "too late"), timeout=5)
        assert _active(slow, cid) == run
        assert _starts(slow) == starts  # still held back
        client.request(wire.Cancel, conversation=cid)
        assert time.monotonic() - t0 < BACKOFF_S - 0.2, "cancelled too late to race the open"

        # The Send returns normally once the open finished, without sending the prompt.
        thread.join(10)
        assert not thread.is_alive()
        assert isinstance(sent[0], dict) and sent[0]["run"] == run, sent
        assert sent[0].get("disposition", "started") == "started", sent
        assert _starts(slow) == starts + 1  # the agent was started meanwhile
        time.sleep(0.3)  # the time an agent needs to log a prompt it was sent
        assert "too late" not in agent_prompts(slow), agent_prompts(slow)
        _assert_cancelled_before_ready(slow, cid, run)
        assert slow.record(cid).get("active_run", "") == ""

        # The next prompt uses the agent opened meanwhile, and works.
        end = _turn(client, cid, "after")
        assert end["state"] == "completed", end
        assert agent_prompts(slow)[-2:] == ["crash", "after"], agent_prompts(slow)
        assert _starts(slow) == starts + 1
        _assert_cancelled_before_ready(slow, cid, run)


def test_a_queued_prompt_cancelled_while_its_runtime_restarts_never_reaches_the_agent(
    slow: Daemon, tmp_path: Path
) -> None:
    with slow.client() as client:
        cid = _conversation(slow, client, tmp_path / "work")
        starts = _starts(slow)
        # Prompts queued behind a turn whose agent crashes: the first queued one finds the agent
        # gone, its open waits out the backoff, and it is cancelled then.
        crash = client.request(wire.Send, conversation=cid, text="crash 0.5")["run"]
        texts = ["queued one", "queued two", "queued three"]
        queued = [client.request(wire.Send, conversation=cid, text=t, if_busy="queue") for t in texts]
        assert all(q["disposition"] == "queued" for q in queued), queued
        runs = [q["run"] for q in queued]
        wait_for(lambda: _ends(slow, cid, crash), timeout=10)
        t0 = time.monotonic()
        assert _ends(slow, cid, crash)[0]["reason"] == "runtime_exit"
        # the crash's events are handled, the next queued prompt is opening
        wait_for(lambda: _active(slow, cid) == runs[0], timeout=BACKOFF_S - 0.5)
        victim = _active(slow, cid)
        assert victim == runs[0] and not _ends(slow, cid, victim), (victim, runs, slow.journal(cid))
        assert _starts(slow) == starts  # still held back
        client.request(wire.Cancel, conversation=cid)
        assert time.monotonic() - t0 < BACKOFF_S - 0.2, "cancelled too late to race the open"

        # The queued prompts after it go next, in the conversation opened meanwhile.
        records = client.follow(runs[-1], timeout=20)
        end = msgspec.json.decode(records[-1].data)
        assert texts[runs.index(victim)] not in agent_prompts(slow), agent_prompts(slow)
        assert end["state"] == "completed", end
        after = texts[runs.index(victim) + 1:]
        assert agent_prompts(slow)[-1 - len(after):] == ["crash 0.5", *after], agent_prompts(slow)
        assert texts[runs.index(victim)] not in agent_prompts(slow)
        assert _starts(slow) == starts + 1
        _assert_cancelled_before_ready(slow, cid, victim)

        assert _turn(client, cid, "after")["state"] == "completed"
        assert texts[runs.index(victim)] not in agent_prompts(slow) and agent_prompts(slow)[-1] == "after"
        assert _starts(slow) == starts + 1


def test_a_prompt_queued_behind_a_crashed_turn_goes_to_the_restarted_agent(slow: Daemon, tmp_path: Path) -> None:
    """The agent's exit after its crashed turn ended does not take the queued run along."""
    with slow.client() as client:
        cid = _conversation(slow, client, tmp_path / "work")
        starts = _starts(slow)
        crash = client.request(wire.Send, conversation=cid, text="crash 0.5")["run"]
        queued = client.request(wire.Send, conversation=cid, text="next, please", if_busy="queue")
        assert queued["disposition"] == "queued", queued
        end = msgspec.json.decode(client.follow(queued["run"], timeout=20)[-1].data)
        assert _ends(slow, cid, crash)[0]["reason"] == "runtime_exit"
        assert end["state"] == "completed", (end, slow.journal(cid))
        assert len(_ends(slow, cid, queued["run"])) == 1
        assert agent_prompts(slow)[-1] == "next, please"
        assert _starts(slow) == starts + 1
        # The record follows the end within moments (saved right after the end was sent).
        record = wait_for(lambda: (r := slow.record(cid)).get("active_run", "") == "" and r, timeout=5)
        assert record.get("queued", []) == [], record


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("op", ["close", "rm"])
def test_a_conversation_closed_or_removed_while_its_runtime_restarts_leaves_nothing_running(
    slow: Daemon, tmp_path: Path, op: str
) -> None:
    # The open finished after the close or rm and kept what it had opened: a runtime ran on for a
    # conversation nobody held, and after an rm its record was written again (a ghost that came
    # back, listed, after a restart).
    with slow.client() as client, slow.client() as sender:
        cid = _conversation(slow, client, tmp_path / "work")
        assert _turn(client, cid, "crash")["reason"] == "runtime_exit"
        starts = _starts(slow)
        thread, sent = _in_background(lambda: sender.request(wire.Send, conversation=cid, text="too late"))
        run = wait_for(lambda: _prompt_run(slow, cid, "too late"), timeout=5)
        assert _starts(slow) == starts  # its open waits out the backoff
        if op == "close":
            client.request(wire.Close, conversation=cid)
        else:
            assert client.request(wire.Remove, conversation=cid, force=True)["conversation"] == cid
        thread.join(10)
        assert not thread.is_alive() and sent, sent
        assert _starts(slow) == starts + 1  # the agent was started meanwhile
        pid = int(Path(slow.starts).read_text().splitlines()[-1].split()[1])  # type: ignore[attr-defined]
        wait_for(lambda: not _alive(pid), timeout=10)  # and stopped again
        time.sleep(0.3)
        assert "too late" not in agent_prompts(slow), agent_prompts(slow)
        if op == "close":
            assert isinstance(sent[0], dict) and sent[0]["run"] == run, sent
            assert slow.record(cid)["state"] == "closed"
            ends = _ends(slow, cid, run)
            assert len(ends) == 1 and ends[0]["state"] == "cancelled", ends
        else:
            with slow.client() as other:
                listed = other.request(wire.List, all=True)
            assert cid not in json.dumps(listed)
            assert not (slow.state_dir / "conversations" / cid).exists()
        assert "Traceback" not in slow.log_text()


def test_a_conversation_removed_while_new_starts_its_runtime_is_gone_and_so_is_the_runtime(tmp_path: Path) -> None:
    # An adversarial review found this one: `new` answered with the record of a conversation an
    # rm had removed meanwhile, the record came back on disk (listed again after a restart), and
    # the agent started for it ran on.
    starts = tmp_path / "agent-starts.log"
    agent = f"sleep 1.5; exec {shlex.quote(sys.executable)} {shlex.quote(str(FAULT_AGENT))}"
    d = fast_daemon(tmp_path / "d", f'[providers.acp.late]\ncommand = ["sh", "-c", {json.dumps(agent)}]\n'
                                    f'env = {{ FAULT_AGENT_LOG = {json.dumps(str(starts))} }}\nstartup_timeout_s = 20.0\n').start()
    try:
        work = tmp_path / "work"
        work.mkdir()
        conversations = d.state_dir / "conversations"
        with d.client() as opener, d.client() as client:
            thread, made = _in_background(lambda: opener.request(wire.New, provider="acp:late", workdir=str(work)))
            cid = wait_for(lambda: conversations.exists() and next(
                (p.name for p in conversations.iterdir() if p.is_dir()), ""), timeout=5)
            assert client.request(wire.Remove, conversation=cid, force=True)["conversation"] == cid
            thread.join(20)
        assert not thread.is_alive() and made, made
        assert isinstance(made[0], c.NotFound) and "removed while its runtime started" in made[0].message, made
        pid = int(wait_for(lambda: starts.exists() and starts.read_text(), timeout=10).split()[1])
        wait_for(lambda: not _alive(pid), timeout=10)
        assert not (conversations / cid).exists()
        d.stop()
        d.start()
        with d.client() as client:
            assert cid not in json.dumps(client.request(wire.List, all=True))
        assert "Traceback" not in d.log_text()
    finally:
        d.stop()


def test_a_prompt_sent_while_a_restart_replaces_its_runtime_runs_on_the_new_one(tmp_path: Path) -> None:
    # An adversarial review found this one: during the restart's one step (its conversations'
    # runtimes closed one by one, then the providers replaced) a prompt opened its conversation on
    # the provider about to be replaced; the replacement stopped it under the turn ("cancelled",
    # shutdown), and the conversation kept the stopped one: every later prompt was refused.
    d = fault_agent_daemon(tmp_path / "d", "fault", {"GEN": "0"}).start()  # a change to it: the restart replaces the provider
    try:
        work = tmp_path / "work"
        work.mkdir()
        with d.client() as client:
            ids = [client.request(wire.New, provider="acp:fault", workdir=str(work))["id"] for _ in range(12)]
            for attempt in range(1, 5):
                for cid in ids:  # every conversation's agent running, so the restart closes each
                    client.subscribe(cid)
                    client.follow(client.request(wire.Send, conversation=cid, text="hello")["run"], timeout=20)
                d.config.write_text(d.config.read_text().replace(f'GEN = "{attempt - 1}"', f'GEN = "{attempt}"'))
                with d.client() as restarter:
                    thread, restarted = _in_background(lambda: restarter.request(wire.Restart))
                    time.sleep(0.01 * attempt)  # into the step, while it closes the conversations' agents
                    run = client.request(wire.Send, conversation=ids[0], text="drip 3")["run"]
                    end = msgspec.json.decode(client.follow(run, timeout=30)[-1].data)
                    thread.join(30)
                assert isinstance(restarted[0], dict) and restarted[0]["reopened"] >= 1, restarted
                assert end["state"] == "completed", (attempt, end)
                again = client.request(wire.Send, conversation=ids[0], text="still there?")["run"]
                assert msgspec.json.decode(client.follow(again, timeout=30)[-1].data)["state"] == "completed"
        assert "Traceback" not in d.log_text()
    finally:
        d.stop()
