"""History pages (agentd.history) against a real journal: every item once, in its latest form,
whatever the page size, cursor or id reuse; checked against a whole-journal fold."""

from __future__ import annotations

import functools
import pathlib
from unittest import mock

import msgspec
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from agentd import contract as c
from agentd import history, wire
from agentd.journal import FsyncPolicy, Journal
from agentd.store.file import FileJournal


def _page(j: Journal, *args: object, **kwargs: object) -> wire.HistoryPage:
    """history.page on the file store's journal, from outside the daemon's loop."""
    return trio.run(functools.partial(history.page, FileJournal(j), *args, **kwargs))  # type: ignore[arg-type]


def _item(id_: str, text: str, agent: str = "", done: bool = False) -> bytes:
    tool = c.ToolCall(name="sh", status=c.ToolStatus.COMPLETED if done else c.ToolStatus.RUNNING)
    return msgspec.json.encode(c.Item(id=id_, kind=c.ItemKind.TOOL, text=text, agent_id=agent, tool=tool))


def _write(path: pathlib.Path, turns: list[list[tuple[str, str]]]) -> Journal:
    """A journal of turns; each turn's steps are (item id, agent id): a record of that item.
    Ids repeat within a turn (updates) and across turns (a runtime reusing its own ids)."""
    j = Journal(path, fsync=FsyncPolicy.NEVER)
    j.append("conversation", msgspec.json.encode(wire.ConversationCreated(provider="script", workdir="/")))
    for n, steps in enumerate(turns):
        run = f"r{n}"
        j.append("prompt", msgspec.json.encode(wire.PromptRecord(text=f"prompt {n}")), run=run)
        for k, (iid, agent) in enumerate(steps):
            j.append("item", _item(iid, f"{run}:{iid}:{k}", agent), run=run)
            j.append("usage", b"{}", run=run)
        j.append("turn", msgspec.json.encode(c.Turn(state=c.TurnState.COMPLETED)), run=run)
    return j


def _oracle(j: Journal) -> list[tuple[int, str, str]]:
    """Every entry, folded from the whole journal: (seq, run, text) at each item's last record."""
    last: dict[tuple[str, str, str], tuple[int, str, str]] = {}
    out: list[tuple[int, str, str]] = []
    for line in j.read_after(0):
        rec = wire.decode_record(line)
        if rec.type == "prompt":
            out.append((rec.seq, rec.run, msgspec.json.decode(rec.data, type=wire.PromptRecord).text))
        elif rec.type == "item":
            item = msgspec.json.decode(rec.data, type=c.Item)
            if item.kind is c.ItemKind.USER and item.delivery != "steer":
                continue
            last[(rec.run, item.agent_id, item.id)] = (rec.seq, rec.run, item.text)
    return sorted(out + list(last.values()))


def _flat(p: wire.HistoryPage) -> list[tuple[int, str, str]]:
    return [(e.seq, e.run, e.item.text) for e in p.items]


def _all_backward(j: Journal, limit: int, *, full: bool = True) -> list[tuple[int, str, str]]:
    """Every page from the newest back; ``full``: each page but the last holds ``limit`` entries."""
    got: list[tuple[int, str, str]] = []
    p = _page(j, "c", j.last_seq, limit=limit)
    pages = 0
    while True:
        assert len(p.items) <= limit
        got = _flat(p) + got
        pages += 1
        if not p.before:
            assert p.start
            break
        assert not p.start and (len(p.items) == limit or not full)
        assert not p.items or p.before == p.items[0].seq
        p = _page(j, "c", j.last_seq, limit=limit, before=p.before)
        assert pages < 10_000
    return got


def _all_forward(j: Journal, limit: int, *, full: bool = True) -> list[tuple[int, str, str]]:
    got: list[tuple[int, str, str]] = []
    p = _page(j, "c", j.last_seq, limit=limit, after=0)
    pages = 0
    while True:
        got += _flat(p)
        pages += 1
        if not p.after:
            assert p.end
            break
        assert not p.end and (len(p.items) == limit or not full)
        assert not p.items or p.after == p.items[-1].seq
        p = _page(j, "c", j.last_seq, limit=limit, after=p.after)
        assert pages < 10_000
    return got


_ids = st.sampled_from(["t1", "t2", "t3", "call_0"])
_agents = st.sampled_from(["", "", "sub-a"])
_turns = st.lists(st.lists(st.tuples(_ids, _agents), max_size=12), min_size=0, max_size=12)


@settings(max_examples=150, deadline=None)
@given(turns=_turns, limit=st.integers(1, 7))
def test_pages_backward_and_forward_hold_every_entry_once_in_its_latest_form(
        tmp_path_factory: pytest.TempPathFactory, turns: list[list[tuple[str, str]]], limit: int) -> None:
    j = _write(tmp_path_factory.mktemp("h") / "events.jsonl", turns)
    want = _oracle(j)
    assert _all_backward(j, limit) == want
    assert _all_forward(j, limit) == want
    newest = _page(j, "c", j.last_seq, limit=limit)
    assert _flat(newest) == want[-limit:] and newest.end


@settings(max_examples=100, deadline=None)
@given(turns=_turns, limit=st.integers(1, 7), window=st.integers(1, 2_000))
def test_windows_cut_short_by_their_byte_bound_still_page_every_entry_once(
        tmp_path_factory: pytest.TempPathFactory, turns: list[list[tuple[str, str]]], limit: int, window: int) -> None:
    # A window of `limit` records can be gigabytes (items near the 8 Mi-character cap): it stops at
    # WINDOW_BYTES, nearest the cursor, and the pages around it still hold every entry exactly once.
    j = _write(tmp_path_factory.mktemp("h") / "events.jsonl", turns)
    want = _oracle(j)
    with mock.patch.object(history, "WINDOW_BYTES", window), mock.patch.object(history, "GLANCE_BYTES", window // 3 + 1):
        assert _all_backward(j, limit, full=False) == want
        assert _all_forward(j, limit, full=False) == want


class _Counting(FileJournal):
    """The file store's journal, counting what each read returns."""

    def __init__(self, j: Journal) -> None:
        super().__init__(j)
        self.reads: list[int] = []

    async def read_after(self, after: int, limit: int | None = None, max_bytes: int | None = None) -> list[bytes]:
        lines = await super().read_after(after, limit, max_bytes)
        self.reads.append(sum(map(len, lines)))
        return lines


def test_a_page_of_records_near_the_item_cap_reads_a_bounded_window(tmp_path: pathlib.Path) -> None:
    # 24 completed tool items of 3 MiB in one turn: a page of up to 1,000 entries read its whole
    # window (all 72 MiB, held at once) before it cut the page to 16 MiB.
    big = 3 << 20
    j = Journal(tmp_path / "events.jsonl", fsync=FsyncPolicy.NEVER)
    j.append("conversation", msgspec.json.encode(wire.ConversationCreated(provider="script", workdir="/")))
    j.append("prompt", msgspec.json.encode(wire.PromptRecord(text="go")), run="r1")
    for n in range(24):
        j.append("item", _item(f"t{n}", f"{n % 10}" * big, done=True), run="r1")
    j.append("turn", msgspec.json.encode(c.Turn(state=c.TurnState.COMPLETED)), run="r1")
    want = _oracle(j)
    for direction in ({}, {"after": 0}):
        reader = _Counting(j)
        p = trio.run(functools.partial(history.page, reader, "c", j.last_seq, limit=1000, **direction))
        assert p.items and sum(len(e.item.text) for e in p.items) <= history.MAX_PAGE_BYTES
        # Each read holds at most a window (a first record and WINDOW_BYTES after it), or looking
        # past it for later forms of its items a glance, and one record more. Backward, the
        # window is read once more, narrowed.
        if direction:
            first, window, *glances = reader.reads
            assert window <= history.WINDOW_BYTES and all(g <= history.GLANCE_BYTES + big for g in glances)
        else:
            assert len(reader.reads) == 4 and max(reader.reads) <= history.WINDOW_BYTES, reader.reads
            assert sum(reader.reads) <= 2 * history.WINDOW_BYTES, reader.reads
    assert _all_backward(j, 1000, full=False) == want
    assert _all_forward(j, 1000, full=False) == want


def test_a_rewinds_dropped_runs_are_left_out_or_shown_marked(tmp_path: pathlib.Path) -> None:
    j = _write(tmp_path / "events.jsonl", [[("t1", "")], [("t2", "")], [("t3", "")]])
    kept = [(e.run, e.item.text, e.dropped) for e in _page(j, "c", j.last_seq, dropped=["r1"]).items]
    assert kept == [("r0", "prompt 0", False), ("r0", "r0:t1:0", False), ("r2", "prompt 2", False),
                    ("r2", "r2:t3:0", False)]
    shown = [(e.run, e.dropped) for e in _page(j, "c", j.last_seq, dropped=["r1"], all_=True).items]
    assert shown == [("r0", False), ("r0", False), ("r1", True), ("r1", True), ("r2", False), ("r2", False)]


def test_an_id_reused_by_a_later_turn_keeps_both_items(tmp_path: pathlib.Path) -> None:
    j = _write(tmp_path / "events.jsonl", [[("call_0", ""), ("call_0", "")], [("call_0", "")]])
    texts = [e.item.text for e in _page(j, "c", j.last_seq).items if e.item.kind is c.ItemKind.TOOL]
    assert texts == ["r0:call_0:1", "r1:call_0:0"]


def test_an_item_still_open_in_a_running_turn_shows_its_newest_form_once(tmp_path: pathlib.Path) -> None:
    j = _write(tmp_path / "events.jsonl", [])
    j.append("prompt", msgspec.json.encode(wire.PromptRecord(text="go")), run="live")
    j.append("item", _item("t1", "started"), run="live")
    j.append("item", _item("t1", "halfway"), run="live")
    p = _page(j, "c", j.last_seq, limit=1, before=j.last_seq)  # below the newest record
    assert _flat(p) == [(2, "live", "go")]  # t1's newest form lies above the cursor: not here
    assert [e.item.text for e in _page(j, "c", j.last_seq).items] == ["go", "halfway"]


def test_a_runtime_echo_of_the_prompt_is_shown_once_and_a_steer_is_kept(tmp_path: pathlib.Path) -> None:
    j = _write(tmp_path / "events.jsonl", [])
    j.append("prompt", msgspec.json.encode(wire.PromptRecord(text="go")), run="r1")
    j.append("item", msgspec.json.encode(c.Item(id="u1", kind=c.ItemKind.USER, text="go")), run="r1")
    j.append("item", msgspec.json.encode(c.Item(id="u2", kind=c.ItemKind.USER, text="faster", delivery="steer")),
             run="r1")
    assert [e.item.text for e in _page(j, "c", j.last_seq).items] == ["go", "faster"]


def test_only_records_published_so_far_are_read(tmp_path: pathlib.Path) -> None:
    j = _write(tmp_path / "events.jsonl", [[("t1", "")]])
    published = j.last_seq
    j.append("prompt", msgspec.json.encode(wire.PromptRecord(text="not yet published")), run="r9")
    assert all(e.seq <= published for e in _page(j, "c", published).items)


@pytest.mark.parametrize("kwargs", [{"limit": 0}, {"limit": history.MAX_LIMIT + 1}, {"before": 3, "after": 1},
                                    {"before": 0}, {"after": -1}])
def test_bad_page_requests_are_invalid(tmp_path: pathlib.Path, kwargs: dict[str, int]) -> None:
    j = _write(tmp_path / "events.jsonl", [[("t1", "")]])
    with pytest.raises(c.Invalid):
        _page(j, "c", j.last_seq, **kwargs)


def test_a_page_of_large_prompts_stops_at_its_byte_budget_and_the_next_goes_on(tmp_path: pathlib.Path) -> None:
    # Eight prompts of 5 MB: a page of 50 would be a 40 MB reply, over what a client reads in one
    # frame as the journal grows; a page stops at MAX_PAGE_BYTES (16 MiB) and says where it stopped.
    big = 5 << 20
    j = Journal(tmp_path / "events.jsonl", fsync=FsyncPolicy.NEVER)
    j.append("conversation", msgspec.json.encode(wire.ConversationCreated(provider="script", workdir="/")))
    for n in range(8):
        j.append("prompt", msgspec.json.encode(wire.PromptRecord(text=f"{n}" * big)), run=f"r{n}")
        j.append("turn", msgspec.json.encode(c.Turn(state=c.TurnState.COMPLETED)), run=f"r{n}")
    want = [f"{n}" * big for n in range(8)]

    def texts(p: wire.HistoryPage) -> list[str]:
        assert 1 <= len(p.items) and sum(len(e.item.text) for e in p.items) <= history.MAX_PAGE_BYTES
        assert len(wire.encode(p)) < wire.CLIENT_MAX_FRAME_BYTES
        return [e.item.text for e in p.items]

    p, pages = _page(j, "c", j.last_seq, limit=50), 1
    got = texts(p)
    while p.before:
        assert not p.start
        p = _page(j, "c", j.last_seq, limit=50, before=p.before)
        got, pages = texts(p) + got, pages + 1
    assert p.start and got == want and pages >= 3

    p = _page(j, "c", j.last_seq, limit=50, after=0)
    got = texts(p)
    while p.after:
        assert not p.end
        p = _page(j, "c", j.last_seq, limit=50, after=p.after)
        got += texts(p)
    assert p.end and got == want


def test_one_entry_over_the_byte_budget_is_still_a_page_of_its_own(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "MAX_PAGE_BYTES", 100)
    j = _write(tmp_path / "events.jsonl", [[("t1", "")], [("t2", "")]])
    want = _oracle(j)
    p = _page(j, "c", j.last_seq, limit=10, after=0)
    got = _flat(p)
    while p.after:
        assert len(p.items) == 1
        p = _page(j, "c", j.last_seq, limit=10, after=p.after)
        got += _flat(p)
    assert got == want


def test_an_entry_bigger_than_a_window_is_on_the_newest_page(tmp_path: pathlib.Path) -> None:
    # A 16 MB answer (an item at the cap) was left off the newest page, which held only the
    # records after it: windows were narrowed past the record that did not fit.
    j = _write(tmp_path / "events.jsonl", [[("t1", "")], [("t2", "")]])
    j.append("prompt", msgspec.json.encode(wire.PromptRecord(text="flood")), run="rf")
    j.append("item", _item("big", "x" * 5000, done=True), run="rf")
    j.append("usage", b"{}", run="rf")
    j.append("turn", msgspec.json.encode(c.Turn(state=c.TurnState.COMPLETED)), run="rf")
    with mock.patch.object(history, "WINDOW_BYTES", 1000):
        newest = _page(j, "c", j.last_seq, limit=5)
        assert "x" * 5000 in [e.item.text for e in newest.items] and newest.end
        assert _all_backward(j, 5, full=False) == _oracle(j) == _all_forward(j, 5, full=False)
