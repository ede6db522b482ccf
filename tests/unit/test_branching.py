"""agentd.branching's journal readings: the turns of a journal, and the rewound view of it."""

from __future__ import annotations

import json

import msgspec

from agentd import branching, wire


def _line(seq: int, type_: str, data: object, run: str = "") -> bytes:
    rec: dict[str, object] = {"type": type_, "ts": "2026-01-01T00:00:00.000Z", "data": data, "seq": seq}
    if run:
        rec["run"] = run
    return json.dumps(rec, separators=(",", ":")).encode()


JOURNAL = [
    _line(1, "conversation", {"provider": "script", "workdir": "/w"}),
    _line(2, "prompt", {"text": "alpha\nsecond line"}, "r1"),
    _line(3, "turn", {"state": "working"}, "r1"),
    _line(4, "item", {"id": "a", "kind": "assistant", "text": "A"}, "r1"),
    _line(5, "turn", {"state": "completed", "marker": "m1"}, "r1"),
    _line(6, "prompt", {"text": "beta"}, "r2"),
    _line(7, "turn", {"state": "failed", "error": "x"}, "r2"),
    _line(8, "prompt", {"text": "gamma"}, "r3"),
    _line(9, "turn", {"state": "working"}, "r3"),
]


def test_turns_are_the_runs_in_order_with_their_end_marker_and_prompt() -> None:
    turns = branching.turns(JOURNAL)
    assert [(t.run, t.end_seq, t.state, t.marker) for t in turns] == [
        ("r1", 5, "completed", "m1"), ("r2", 7, "failed", ""), ("r3", 0, "", "")]
    assert turns[0].brief() == wire.BranchRun(run="r1", seq=5, state="completed", prompt="alpha")
    assert [t.run for t in branching.turns(JOURNAL, dropped={"r2"})] == ["r1", "r3"]


def test_the_rewound_view_leaves_dropped_runs_out_or_marks_them() -> None:
    assert branching.view(JOURNAL, ()) is JOURNAL
    shown = branching.view(JOURNAL, {"r2"})
    assert [wire.decode_record(line).seq for line in shown] == [1, 2, 3, 4, 5, 8, 9]
    marked = branching.view(JOURNAL, {"r2"}, all_=True)
    assert len(marked) == len(JOURNAL)
    recs = [wire.decode_record(line) for line in marked]
    assert [r.seq for r in recs if r.dropped] == [6, 7]
    assert json.loads(marked[5])["dropped"] is True and "dropped" not in json.loads(marked[4])


def test_a_copy_names_its_original_first_and_replaces_an_older_mark() -> None:
    line = _line(4, "item", {"copied": {"conversation": "c0", "seq": 2}, "id": "a", "kind": "assistant"}, "r1")
    type_, data, run = branching._copy(line, "c1")
    assert (type_, run) == ("item", "r1")
    assert data.startswith(b'{"copied":{"conversation":"c1","seq":4}')
    assert msgspec.json.decode(data)["id"] == "a"
    assert branching._copy(_line(3, "usage", {"input_tokens": 1}, "r1"), "c1") is None
    assert branching._copy(_line(3, "title", "a title", "r1"), "c1") is None
