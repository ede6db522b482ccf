"""The task service's small parts: callback URLs, the record store, following a turn's records."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from agentd import contract as c
from agentd import wire
from agentd.tasks import TaskStore, _Tracker, check_callback

_enc = msgspec.json.Encoder()


def record(type_: str, payload: object, run: str = "r1", seq: int = 1) -> wire.Record:
    return wire.Record(type=type_, ts="2025-01-01T00:00:00.000Z", data=msgspec.Raw(_enc.encode(payload)),
                       seq=seq, run=run)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/hook", "https://example.com/a?b=c", "HTTP://host"])
def test_http_and_https_callbacks_are_accepted(url: str) -> None:
    check_callback(url)


@pytest.mark.parametrize("url", ["ftp://host/x", "file:///etc/passwd", "host:80/x", "http://", "https:///path",
                                 "javascript:alert(1)", "http://[::1/"])
def test_other_callbacks_are_invalid(url: str) -> None:
    with pytest.raises(c.Invalid):
        check_callback(url)


def test_store_round_trips_records_oldest_first_and_skips_what_it_cannot_read(tmp_path: Path) -> None:
    store = TaskStore(tmp_path / "tasks")
    assert store.load() == []
    newer = wire.TaskRecord(id="t2", provider="script", workdir="/", input="b", created_at="2025-01-02T00:00:00.000Z",
                            updated_at="x")
    older = wire.TaskRecord(id="t1", provider="script", workdir="/", input="a", created_at="2025-01-01T00:00:00.000Z",
                            updated_at="x", status=wire.TaskStatus.RUNNING)
    store.save(newer)
    store.save(older)
    (tmp_path / "tasks" / "broken.json").write_text("{not json")
    (tmp_path / "tasks" / ".t3.json.123.tmp").write_text("{}")
    assert [t.id for t in store.load()] == ["t1", "t2"]
    assert store.load()[0].status is wire.TaskStatus.RUNNING
    assert (tmp_path / "tasks").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "tasks" / "t1.json").stat().st_mode & 0o777 == 0o600


def test_tracker_keeps_the_last_main_agent_message_of_its_run_and_its_pending_interactions() -> None:
    t = _Tracker("r1")
    t.feed(record("item", c.Item(id="1", kind=c.ItemKind.ASSISTANT, text="first")))
    t.feed(record("item", c.Item(id="2", kind=c.ItemKind.ASSISTANT, text="second")))
    t.feed(record("item", c.Item(id="3", kind=c.ItemKind.ASSISTANT, text="from a subagent", agent_id="a1")))
    t.feed(record("item", c.Item(id="4", kind=c.ItemKind.ASSISTANT, text="another run"), run="r0"))
    t.feed(record("item", c.Item(id="1", kind=c.ItemKind.ASSISTANT, text="first, updated")))
    assert t.result == "second"
    ask = c.Interaction(id="i1", kind=c.InteractionKind.QUESTION, title="?")
    t.feed(record("interaction", ask))
    assert t.pending == {"i1"}
    t.feed(record("interaction", msgspec.structs.replace(ask, state=c.InteractionState.ANSWERED)))
    assert t.pending == set() and t.turn is None
    t.feed(record("turn", c.Turn(state=c.TurnState.WORKING)))
    assert t.turn is None
    t.feed(record("turn", c.Turn(state=c.TurnState.FAILED, error="boom")))
    assert t.turn is not None and t.turn.error == "boom"


def test_tracker_usage_sums_calls_and_prefers_the_daemons_totals() -> None:
    t = _Tracker("r1")
    assert t.usage() is None
    t.feed(record("tokens", c.TokenUsage(input=100, output=10, cache_read=40, cost_usd=0.01)))
    t.feed(record("tokens", c.TokenUsage(input=50, output=5, cost_usd=0.02)))
    u = t.usage()
    assert u is not None
    assert (u.input_tokens, u.output_tokens, u.cached_tokens) == (150, 15, 40)
    assert u.cost_usd == pytest.approx(0.03)
    t.feed(record("usage", {"ai_units": 2.0, "cost_usd": 0.5, "input_tokens": 200, "output_tokens": 20,
                            "cached_tokens": 40, "estimated": True}))
    u = t.usage()
    assert u is not None
    assert (u.input_tokens, u.output_tokens, u.cost_usd, u.ai_units, u.estimated) == (200, 20, 0.5, 2.0, True)
