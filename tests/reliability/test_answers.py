"""Answers that do not fit their interaction are ``invalid``; answers to one that is gone are ``gone``.

Every refusal leaves the interaction pending and writes nothing: no answer
record, nothing handed to the provider; the right answer then goes through.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentd import contract as c
from agentd import wire
from daemon_harness import Client, Daemon

from .conftest import SCRIPTS, new, wait_for

ASK = SCRIPTS / "ask.toml"

BAD: dict[str, list[dict[str, Any]]] = {
    "perm": [
        {"decision": "maybe"},  # unknown option
        {},  # no decision
        {"answers": [["allow_once"]]},  # a question's answer to a permission
        {"decision": ""},
    ],
    "question": [
        {"answers": []},  # wrong number of answers: none for one question
        {"answers": [["red"], ["blue"]]},  # two for one question
        {"answers": [["green"]]},  # not offered, no custom text allowed
        {"answers": [["red", "blue"]]},  # two for a single-choice question
        {"answers": [[""]]},  # empty
        {"reject": True, "answers": [["red"]]},  # both
        {"cancel": True},  # only elicitations can be cancelled
    ],
    "form": [
        {"answers": [["0"], [], ["Europe"], []]},  # replicas below its minimum
        {"answers": [["11"], [], ["Europe"], []]},  # above its maximum
        {"answers": [["2.5"], [], ["Europe"], []]},  # not an integer
        {"answers": [["lots"], [], ["Europe"], []]},
        {"answers": [[], [], ["Europe"], []]},  # required
        {"answers": [["3"], ["not-an-email"], ["Europe"], []]},
        {"answers": [["3"], ["a" * 40 + "@example.com"], ["Europe"], []]},  # over max_length
        {"answers": [["3"], [], [], []]},  # required, and under min_items
        {"answers": [["3"], [], ["Europe", "America", "Asia"], []]},  # over max_items
        {"answers": [["3"], [], ["Antarctica"], []]},  # not a choice
        {"answers": [["3"], [], ["Europe", "Europe"], []]},  # repeated
        {"answers": [["3"], [], ["Europe"], ["2024-02-30"]]},  # no such date
        {"answers": [["3"], [], ["Europe"]]},  # one answer short
        {"answers": [["3", "4"], [], ["Europe"], []]},  # two values for one field
    ],
    "plan": [
        {"plan": {"action": "exit_only"}},  # not offered
        {"plan": {"action": "autopilot", "feedback": "and also"}},  # both
        {"plan": {"feedback": "   "}},  # blank feedback
        {},  # nothing
    ],
}
GOOD = {
    "perm": {"decision": "allow_once"},
    "question": {"answers": [["blue"]]},
    "form": {"answers": [["3"], ["ops@example.com"], ["Europe", "Asia"], ["2024-02-29"]]},
    "plan": {"plan": {"action": "interactive"}},
}


def _pending(client: Client, cid: str) -> list[dict[str, Any]]:
    return client.request(wire.Show, conversation=cid).get("pending", [])


def _answers_journaled(d: Daemon, cid: str) -> list[dict[str, Any]]:
    return [r["data"] for r in d.journal(cid) if r["type"] == "answer"]


@pytest.mark.parametrize("kind", list(BAD))
def test_answers_that_do_not_fit_are_invalid_and_change_nothing(daemon: Daemon, workdir: Path, kind: str) -> None:
    with daemon.client() as client:
        cid = new(client, workdir, ASK)
        client.subscribe(cid)
        run = client.request(wire.Send, conversation=cid, text=kind)["run"]
        inter = wait_for(lambda: _pending(client, cid))[0]
        for answer in BAD[kind]:
            with pytest.raises(c.Invalid):
                client.request(wire.AnswerInteraction, conversation=cid, interaction=inter["id"], answer=answer)
            assert [p["id"] for p in _pending(client, cid)] == [inter["id"]], f"{answer} changed the interaction"
        assert _answers_journaled(daemon, cid) == []
        client.request(wire.AnswerInteraction, conversation=cid, interaction=inter["id"], answer=GOOD[kind])
        records = client.follow(run)
        # Answered once; a second answer finds it gone.
        with pytest.raises(c.InteractionGone):
            client.request(wire.AnswerInteraction, conversation=cid, interaction=inter["id"], answer=GOOD[kind])
    assert records[-1].type == "turn"
    assert [a["interaction_id"] for a in _answers_journaled(daemon, cid)] == [inter["id"]]


def test_answer_to_an_interaction_of_a_cancelled_turn_is_gone(daemon: Daemon, workdir: Path) -> None:
    with daemon.client() as client:
        cid = new(client, workdir, ASK)
        client.subscribe(cid)
        run = client.request(wire.Send, conversation=cid, text="perm")["run"]
        inter = wait_for(lambda: _pending(client, cid))[0]
        client.request(wire.Cancel, conversation=cid)
        client.follow(run)
        with pytest.raises(c.InteractionGone):
            client.request(wire.AnswerInteraction, conversation=cid, interaction=inter["id"], answer=GOOD["perm"])
        with pytest.raises(c.InteractionGone):
            client.request(wire.AnswerInteraction, conversation=cid, interaction="no-such-interaction",
                           answer=GOOD["perm"])
    assert _answers_journaled(daemon, cid) == []


def test_answer_to_an_interaction_of_a_turn_cut_by_a_crash_is_gone(tmp_path: Path, workdir: Path) -> None:
    from .conftest import fast_daemon

    d = fast_daemon(tmp_path).start()
    with d.client() as client:
        cid = new(client, workdir, ASK)
        client.request(wire.Send, conversation=cid, text="question")
        inter = wait_for(lambda: _pending(client, cid))[0]
    d.kill()
    d.start()
    try:
        with d.client() as client:
            with pytest.raises(c.InteractionGone):
                client.request(wire.AnswerInteraction, conversation=cid, interaction=inter["id"],
                               answer=GOOD["question"])
            assert _pending(client, cid) == []
        states = [r["data"].get("state") for r in d.journal(cid) if r["type"] == "interaction"]
        assert states[-1] == "expired"
    finally:
        d.stop()
