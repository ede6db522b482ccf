"""History pages over a journal holding records of valid JSON but the wrong payload shape (a
journal damaged by hand): skipped, as export skips them, never an internal error."""

from __future__ import annotations

import functools
import pathlib

import msgspec
import trio
from structlog.testing import capture_logs

from agentd import contract as c
from agentd import history, wire
from agentd.journal import FsyncPolicy, Journal
from agentd.store.file import FileJournal


def _page(j: Journal, **kwargs: object) -> wire.HistoryPage:
    return trio.run(functools.partial(history.page, FileJournal(j), "c", j.last_seq, **kwargs))  # type: ignore[arg-type]


def _item(id_: str, text: str) -> bytes:
    return msgspec.json.encode(c.Item(id=id_, kind=c.ItemKind.ASSISTANT, text=text))


def test_records_whose_payload_does_not_decode_are_skipped_and_logged(tmp_path: pathlib.Path) -> None:
    j = Journal(tmp_path / "events.jsonl", fsync=FsyncPolicy.NEVER)
    j.append("conversation", msgspec.json.encode(wire.ConversationCreated(provider="script", workdir="/")))
    j.append("prompt", msgspec.json.encode(wire.PromptRecord(text="first")), run="r0")
    j.append("item", b'{"id":5,"kind":"assistant"}', run="r0")  # id an int
    j.append("item", _item("a", "kept"), run="r0")
    j.append("turn", b'"not a turn"', run="r0")  # a string where a turn goes
    j.append("prompt", b'{"text":["not","text"]}', run="r1")
    j.append("prompt", msgspec.json.encode(wire.PromptRecord(text="second")), run="r2")
    j.append("item", _item("b", "also kept"), run="r2")
    j.append("turn", msgspec.json.encode(c.Turn(state=c.TurnState.COMPLETED)), run="r2")
    want = ["first", "kept", "second", "also kept"]
    with capture_logs() as logs:
        newest = _page(j)
    assert [e.item.text for e in newest.items] == want and newest.start and newest.end
    skipped = [e for e in logs if e["event"] == "history.records_skipped"]
    assert len(skipped) == 1 and skipped[0]["count"] == 3 and skipped[0]["seqs"] == [3, 5, 6]
    assert [e.item.text for e in _page(j, after=0).items] == want
    one_by_one = []
    after = 0
    while True:  # the look-ahead past a page reads the damaged records too
        page = _page(j, after=after, limit=1)
        one_by_one += [e.item.text for e in page.items]
        if page.end:
            break
        after = page.after
    assert one_by_one == want
