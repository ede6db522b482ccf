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
                                 "javascript:alert(1)", "http://[::1/",
                                 # each attempt would fail, retried for the whole window: refused at once
                                 "http://127.0.0.1:99999/a", "http://127.0.0.1:0/a", "http://127.0.0.1:1/a\r\nX: y",
                                 "http://host/a\x00", "http://host/a b", "http://host/\x85"])
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


def test_the_task_list_comes_in_pages_of_bounded_count_and_bytes_that_join_into_every_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tasks are never removed: 12,000 made a list of 74 MB, over what a client reads, and no
    # filter helped. A page stops at its limit or at LIST_PAGE_BYTES, and says where the next starts.
    from agentd import tasks as tasks_mod
    from agentd.config import TasksConfig

    monkeypatch.setattr(tasks_mod, "LIST_PAGE_BYTES", 20_000)
    service = tasks_mod.TaskService(None, None, TasksConfig(), tmp_path)  # type: ignore[arg-type]
    for n in range(120):
        stamp = f"2026-12-07T10:{n // 60:02d}:{n % 60:02d}.000Z"
        service._tasks[f"t{n:04d}"] = wire.TaskRecord(
            id=f"t{n:04d}", provider="script", workdir="/", input="x" * (3000 if n % 7 == 0 else 10),
            created_at=stamp, updated_at=stamp, status=wire.TaskStatus.COMPLETED if n % 2 else wire.TaskStatus.PENDING)
    every = [f"t{n:04d}" for n in range(120)]

    def pages(**kw: object) -> list[list[str]]:
        out, after = [], ""
        while True:
            page, after = service.list(after=after, **kw)  # type: ignore[arg-type]
            out.append([t.id for t in page])
            assert len(msgspec.json.encode(page)) <= 20_000 or len(page) == 1
            if not after:
                return out

    by_count = pages(limit=25)
    assert [i for p in by_count for i in p] == every and [len(p) for p in by_count] == [25, 25, 25, 25, 20]
    by_bytes = pages(limit=1000)
    assert [i for p in by_bytes for i in p] == every and len(by_bytes) > 1
    pending = pages(limit=7, statuses=[wire.TaskStatus.PENDING])
    assert [i for p in pending for i in p] == every[::2]
    with pytest.raises(c.NotFound):
        service.list(after="tnope")
