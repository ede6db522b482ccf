"""A runtime that died before it saved its session: the conversation goes on when nothing was lost,
and says so clearly when the runtime's context of completed turns is gone (agentd.lost_sessions).

The runtime is ``acp_fault_agent.py`` with a session store of its own (``$FAULT_SESSIONS``) that it
writes only as a turn ends, like Copilot CLI: killed during the first turn, it never wrote the
session, and its next process answers the load "resource not found" or, as codex-acp does for a
session file it created and never wrote, an internal error "empty session file" (``unreadable``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentd import contract as c
from agentd import wire
from daemon_harness import Client, Daemon

from .conftest import agent_prompts, fault_agent_daemon


def _forgetful(tmp_path: Path, unsaved: str) -> Iterator[Daemon]:
    root = tmp_path / "daemon"
    sessions, prompts = tmp_path / "agent-sessions", tmp_path / "agent-prompts"
    env: dict[str, Path | str] = {"FAULT_SESSIONS": sessions, "FAULT_AGENT_PROMPTS": prompts, "FAULT_UNSAVED": unsaved}
    d = fault_agent_daemon(root, "forgetful", env, provider="cancel_timeout_s = 1.0\n").start()
    d.sessions = sessions  # type: ignore[attr-defined]
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(params=["not_found", "empty"])
def forgetful(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """The agent answers the load of a session it never saved "not found" or "empty session file"."""
    yield from _forgetful(tmp_path, request.param)


@pytest.fixture
def not_found(tmp_path: Path) -> Iterator[Daemon]:
    yield from _forgetful(tmp_path, "not_found")


@pytest.fixture
def unreadable(tmp_path: Path) -> Iterator[Daemon]:
    yield from _forgetful(tmp_path, "empty")


def _turn(client: Client, cid: str, text: str) -> tuple[dict[str, Any], list[wire.Record]]:
    run = client.request(wire.Send, conversation=cid, text=text)["run"]
    records = client.follow(run, timeout=30)
    return msgspec.json.decode(records[-1].data), records


def _texts(records: list[wire.Record], kind: str) -> list[str]:
    items = [msgspec.json.decode(r.data) for r in records if r.type == "item"]
    return [i.get("text", "") for i in items if i.get("kind") == kind]


def _new(client: Client, tmp_path: Path) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    cid = client.request(wire.New, provider="acp:forgetful", workdir=str(work))["id"]
    client.subscribe(cid)
    return cid


def test_a_runtime_killed_before_it_saved_the_session_gets_a_fresh_one_and_the_conversation_goes_on(
    forgetful: Daemon, tmp_path: Path
) -> None:
    with forgetful.client() as client:
        cid = _new(client, tmp_path)
        lost = forgetful.record(cid)["provider_conversation_id"]
        end, _ = _turn(client, cid, "crash")  # dies during the session's first turn: never saved
        assert end["state"] == "failed" and end.get("reason") == "runtime_exit", end
        assert not forgetful.sessions.exists()  # type: ignore[attr-defined]

        end, records = _turn(client, cid, "after")
        assert end["state"] == "completed", end
        assert "echo:after" in _texts(records, "assistant")
        notices = _texts(records, "notice")
        assert any(lost in n and "nothing it kept is lost" in n for n in notices), notices
        fresh = forgetful.record(cid)["provider_conversation_id"]
        assert fresh and fresh != lost
        assert forgetful.disk_record(cid)["provider_conversation_id"] == fresh  # durable before the prompt went
        assert agent_prompts(forgetful) == ["crash", "after"]  # the failed prompt was never resent

    # The same agentd conversation reopens the fresh session after a daemon restart.
    forgetful.stop()
    forgetful.start()
    with forgetful.client() as client:
        client.subscribe(cid, after=forgetful.journal(cid)[-1]["seq"])
        end, records = _turn(client, cid, "again")
        assert end["state"] == "completed", end
        assert not _texts(records, "notice")
        assert forgetful.record(cid)["provider_conversation_id"] == fresh
    assert agent_prompts(forgetful) == ["crash", "after", "again"]


def test_a_runtime_that_lost_a_session_with_completed_turns_is_a_clear_error_not_a_fresh_start(
    not_found: Daemon, tmp_path: Path
) -> None:
    forgetful = not_found
    with forgetful.client() as client:
        cid = _new(client, tmp_path)
        sid = forgetful.record(cid)["provider_conversation_id"]
        assert _turn(client, cid, "hello")[0]["state"] == "completed"
        forgetful.sessions.unlink()  # type: ignore[attr-defined]  # the runtime's store is gone
        assert _turn(client, cid, "crash")[0]["state"] == "failed"

        with pytest.raises(c.NotFound) as err:
            client.request(wire.Send, conversation=cid, text="do you remember?")
        message = err.value.message
        assert sid in message and "1 completed turn" in message and "context is lost" in message, message
        assert "agentctl new" in message
        assert forgetful.record(cid)["provider_conversation_id"] == sid  # nothing was swapped in
        assert agent_prompts(forgetful) == ["hello", "crash"]
        ends = [r["data"] for r in forgetful.journal(cid) if r["type"] == "turn" and r["data"]["state"] != "working"]
        assert ends[-1]["state"] == "failed" and "context is lost" in ends[-1]["error"], ends[-1]


def test_a_session_lost_by_an_agent_agentd_restarted_itself_is_replaced_at_the_next_send(
    forgetful: Daemon, tmp_path: Path
) -> None:
    """The agent is stopped by agentd (its cancel timed out), not by an exit the conversation saw:
    the open conversation finds the session gone at ``send``, before anything is sent."""
    with forgetful.client() as client:
        cid = _new(client, tmp_path)
        lost = forgetful.record(cid)["provider_conversation_id"]
        run = client.request(wire.Send, conversation=cid, text="hang")["run"]
        for frame in client.frames(10):
            if isinstance(frame, wire.EventFrame) and wire.decode_record(frame.record).type == "delta":
                break
        client.request(wire.Cancel, conversation=cid)
        ends = [r for r in client.follow(run) if r.type == "turn" and r.run == run]
        assert msgspec.json.decode(ends[-1].data)["reason"] == "cancel_timeout"

        end, records = _turn(client, cid, "after")
        assert end["state"] == "completed", end
        assert "echo:after" in _texts(records, "assistant")
        assert any(lost in n for n in _texts(records, "notice"))
        assert forgetful.record(cid)["provider_conversation_id"] not in ("", lost)
        assert agent_prompts(forgetful) == ["hang", "after"]


def test_a_session_with_completed_turns_the_runtime_cannot_read_stays_its_own_and_a_later_prompt_retries(
    unreadable: Daemon, tmp_path: Path
) -> None:
    """An error answer to the reload is not known to mean the context is gone: the runtime's own
    error reaches the user, nothing is swapped in, and once the runtime reads the session again
    the conversation goes on in it."""
    with unreadable.client() as client:
        cid = _new(client, tmp_path)
        sid = unreadable.record(cid)["provider_conversation_id"]
        assert _turn(client, cid, "hello")[0]["state"] == "completed"
        store = unreadable.sessions  # type: ignore[attr-defined]
        store.write_text("")  # the runtime can no longer read the session back
        assert _turn(client, cid, "crash")[0]["state"] == "failed"

        with pytest.raises(c.AgentdError) as err:
            client.request(wire.Send, conversation=cid, text="do you remember?")
        assert err.value.code == "unsupported", err.value
        assert "empty session file" in err.value.message and sid in err.value.message, err.value.message
        assert unreadable.record(cid)["provider_conversation_id"] == sid
        assert agent_prompts(unreadable) == ["hello", "crash"]
        journal = unreadable.journal(cid)
        assert not [r for r in journal if r["type"] == "item" and r["data"].get("kind") == "notice"], journal

        store.write_text(sid + "\n")  # readable again
        end, records = _turn(client, cid, "again")
        assert end["state"] == "completed", end
        assert "echo:again" in _texts(records, "assistant")
        assert unreadable.record(cid)["provider_conversation_id"] == sid
    assert agent_prompts(unreadable) == ["hello", "crash", "again"]
