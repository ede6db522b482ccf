"""Runtime hygiene: one end per turn, a bound on every wait, item ids unique per conversation.

Through the real daemon, on ``acp_turn_agent.py`` (a tiny ACP agent configured as
``[providers.acp.turns]``) whose prompts pick a misbehaviour: a runtime that goes silent, one
whose end comes after agentd ended the turn, one that ignores a cancel, and one that reuses a
tool call id across turns or announces an open tool call twice.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentd import wire
from daemon_harness import Client, Daemon

from .conftest import fast_daemon, log_events, wait_for
from .figures import FAULTS

AGENT = Path(__file__).parent / "acp_turn_agent.py"
#: the inactivity deadline and the cancel grace of the daemon under test, seconds
SILENCE_S = 2.0
GRACE_S = 1.0


@pytest.fixture(scope="module")
def hygiene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root = tmp_path_factory.mktemp("hygiene")
    # The agent's own cancel grace is long, so agentd's is the one that applies.
    config = f"""
[runtimes]
silence_timeout_s = {SILENCE_S}
cancel_timeout_s = {GRACE_S}
[providers.acp.turns]
command = [{json.dumps(sys.executable)}, {json.dumps(str(AGENT))}]
cancel_timeout_s = 60.0
startup_timeout_s = 10.0
"""
    d = fast_daemon(root, config).start()
    try:
        yield d
    finally:
        d.stop()


def _new(client: Client, tmp_path: Path, name: str = "work") -> str:
    w = tmp_path / name
    w.mkdir()
    cid = client.request(wire.New, provider="acp:turns", workdir=str(w))["id"]
    client.subscribe(cid)
    return cid


def _turn(client: Client, cid: str, text: str, timeout: float = 30) -> tuple[str, dict[str, Any], list[wire.Record]]:
    run = client.request(wire.Send, conversation=cid, text=text)["run"]
    records = client.follow(run, timeout=timeout)
    return run, msgspec.json.decode(records[-1].data), records


def _ends(d: Daemon, cid: str) -> dict[str, list[dict[str, Any]]]:
    """Terminal turn records of the journal, by run."""
    out: dict[str, list[dict[str, Any]]] = {}
    for rec in d.journal(cid):
        if rec["type"] == "turn" and rec["data"]["state"] != "working":
            out.setdefault(rec.get("run", ""), []).append(rec["data"])
    return out


def _texts(records: list[wire.Record]) -> list[str]:
    return [msgspec.json.decode(r.data).get("text", "") for r in records if r.type == "item"]


def test_a_silent_runtime_ends_failed_inferred_at_the_deadline_but_a_turn_waiting_on_a_person_does_not(
    hygiene: Daemon, tmp_path: Path
) -> None:
    with hygiene.client() as client:
        cid = _new(client, tmp_path)
        FAULTS["runtime silent past the inactivity deadline"] += 1
        t0 = time.monotonic()
        run, end, _ = _turn(client, cid, "silent")
        took = time.monotonic() - t0
        assert end["state"] == "failed" and end["reason"] == "runtime_silent" and end["inferred"] is True, end
        assert f"{SILENCE_S:g} s" in end["error"]
        assert SILENCE_S <= took < SILENCE_S + GRACE_S + 5, took
        print(f"silent runtime: turn ended runtime_silent {took:.2f} s after the prompt (deadline {SILENCE_S:g} s)")
        # The provider still runs its turn (its own grace is 60 s): the next prompt is not refused busy.
        _, end, records = _turn(client, cid, "after the silence")
        assert end["state"] == "completed", end
        assert "echo:after the silence" in _texts(records)

        # A permission waits on a person: twice the deadline passes, the turn goes on.
        run = client.request(wire.Send, conversation=cid, text="ask")["run"]
        inter = wait_for(lambda: (client.request(wire.Show, conversation=cid).get("pending") or [None])[0])
        time.sleep(2 * SILENCE_S + 0.5)
        info = client.request(wire.Show, conversation=cid)
        assert info["record"].get("active_run") == run and info["pending"], info
        client.request(wire.AnswerInteraction, conversation=cid, interaction=inter["id"], answer={"decision": "allow"})
        records = client.follow(run)
        assert msgspec.json.decode(records[-1].data)["state"] == "completed"
        assert "answered:allow" in _texts(records)
    assert all(len(e) == 1 for e in _ends(hygiene, cid).values()), _ends(hygiene, cid)


def test_a_permission_request_offering_no_option_is_refused_and_says_so_in_the_journal(
    hygiene: Daemon, tmp_path: Path
) -> None:
    with hygiene.client() as client:
        cid = _new(client, tmp_path)
        run, end, records = _turn(client, cid, "ask-none")
        assert end["state"] == "completed", end
        assert "answered:cancelled" in _texts(records)
        notices = [msgspec.json.decode(r.data) for r in records if r.type == "item"
                   and msgspec.json.decode(r.data)["kind"] == "notice"]
        assert len(notices) == 1 and "rm -rf build" in notices[0]["text"] and "no option" in notices[0]["text"]
        assert not client.request(wire.Show, conversation=cid).get("pending")
    journaled = [r for r in hygiene.journal(cid) if r["type"] == "item" and r.get("run") == run]
    assert any(r["data"]["kind"] == "notice" and "no option" in r["data"]["text"] for r in journaled)
    # The tool call it asked about is journaled too.
    assert any(r["data"]["kind"] == "tool" and "rm -rf build" in json.dumps(r["data"]) for r in journaled)


@pytest.mark.parametrize("as_json", [False, True], ids=["human", "json"])
def test_a_cancel_the_runtime_ignores_ends_cancel_timeout_agentctl_says_so_and_its_late_end_is_dropped(
    hygiene: Daemon, tmp_path: Path, as_json: bool
) -> None:
    with hygiene.client() as client:
        cid = _new(client, tmp_path)
        run = client.request(wire.Send, conversation=cid, text="late 3")["run"]
        FAULTS["cancel ignored by the runtime"] += 1
        t0 = time.monotonic()
        cp = hygiene.agentctl("cancel", cid, *(["--json"] if as_json else []))
        took = time.monotonic() - t0
        assert took < GRACE_S + 5, took
        print(f"ignored cancel: agentctl cancel exited {cp.returncode} after {took:.2f} s (grace {GRACE_S:g} s)")
        assert cp.returncode == 9, (cp.returncode, cp.stdout, cp.stderr)
        if as_json:
            out = json.loads(cp.stdout)
            assert out == {"ok": False, "conversation": cid, "cancelled": True, "run": run, "state": "cancelled",
                           "reason": "cancel_timeout", "inferred": True}, out
        else:
            assert "did not confirm the cancel" in cp.stderr and "cancel_timeout" in cp.stderr, cp.stderr
            assert f"run {run}" in cp.stderr
        end = msgspec.json.decode(client.follow(run)[-1].data)
        assert (end["state"], end["reason"], end["inferred"]) == ("cancelled", "cancel_timeout", True), end
        # The runtime's own end arrives later: dropped, never journaled.
        wait_for(lambda: any(e.get("event") == "turn.late_end_dropped" and e.get("run") == run
                             for e in log_events(hygiene)), timeout=10)
        _, end, records = _turn(client, cid, "next")
        assert end["state"] == "completed" and "echo:next" in _texts(records), end
    ends = _ends(hygiene, cid)
    assert len(ends[run]) == 1 and "" not in ends, ends


def test_a_prompt_right_after_agentd_ended_a_turn_the_runtime_still_runs_is_not_refused_busy(
    hygiene: Daemon, tmp_path: Path
) -> None:
    with hygiene.client() as client:
        cid = _new(client, tmp_path)
        first = client.request(wire.Send, conversation=cid, text="silent")["run"]
        FAULTS["prompt after a turn the runtime never ended"] += 1
        result = client.request(wire.Cancel, conversation=cid)
        assert (result["run"], result["reason"]) == (first, "cancel_timeout"), result
        sent = client.request(wire.Send, conversation=cid, text="right after")
        assert sent.get("disposition", "started") == "started", sent
        records = client.follow(sent["run"])
        end = msgspec.json.decode(records[-1].data)
        assert end["state"] == "completed" and "echo:right after" in _texts(records), end
    ends = _ends(hygiene, cid)
    assert [len(ends[first]), len(ends[sent["run"]])] == [1, 1] and "" not in ends, ends


def test_a_tool_call_id_reused_in_a_later_turn_is_a_new_item_and_one_announced_twice_while_open_is_one(
    hygiene: Daemon, tmp_path: Path
) -> None:
    with hygiene.client() as client:
        cid = _new(client, tmp_path)
        FAULTS["tool call id reused across turns"] += 1
        texts = ("tool call_1 first", "tool call_1 second", "reannounce call_1", "twice call_1")
        runs = [_turn(client, cid, text)[0] for text in texts]
    tools: dict[str, list[dict[str, Any]]] = {}
    for rec in hygiene.journal(cid):
        if rec["type"] == "item" and rec["data"]["kind"] == "tool":
            tools.setdefault(rec["data"]["id"], []).append(rec)
    # the id used again within one turn, after its call ended: two items of that run
    again = [recs[-1]["data"]["tool"]["output"] for recs in tools.values() if recs[-1]["run"] == runs[3]]
    assert again == ["out:one", "out:two"], again
    tools = {k: v for k, v in tools.items() if v[-1]["run"] != runs[3]}
    # one item per turn, each with its own id, its records all in its own run
    assert len(tools) == 3, list(tools)
    assert sorted({r["run"] for rec in tools.values() for r in rec}) == sorted(runs[:3])
    assert all(len({r["run"] for r in recs}) == 1 for recs in tools.values())
    outputs = {recs[-1]["run"]: recs[-1]["data"]["tool"]["output"] for recs in tools.values()}
    assert [outputs[r] for r in runs[:3]] == ["out:first", "out:second", "out:reannounced"]
    reannounced = next(recs for recs in tools.values() if recs[-1]["run"] == runs[2])
    assert reannounced[-1]["data"]["tool"]["title"] == "announced again"

    md = hygiene.agentctl("export", cid, "--include-tools")
    assert md.returncode == 0, md.stderr
    assert md.stdout.count("out:first") == 1 and md.stdout.count("out:second") == 1, md.stdout
    assert md.stdout.count("out:reannounced") == 1
    assert md.stdout.count("out:one") == 1 and md.stdout.count("out:two") == 1, md.stdout
    shown = hygiene.agentctl("tail", cid, "--no-follow")
    assert shown.returncode == 0, shown.stderr
    for out in ("out:first", "out:second", "out:reannounced", "out:one", "out:two"):
        assert shown.stdout.count(out) == 1, shown.stdout
