"""What `agentctl import` relies on below the daemon: the in-use checks read the runtimes' own
marks (stale ones do not count), Claude Code transcripts give a listing's title and folder, and
an adopted session's earlier items come out of history marked imported, each id once."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import msgspec
import trio

from agentd import adopt, history, wire
from agentd import contract as c
from agentd.journal import FsyncPolicy, Journal
from agentd.store.file import FileJournal
from agentd.providers import _inuse
from agentd.providers.claude._mapping import session_head


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_copilot_session_is_in_use_only_while_a_live_other_process_holds_its_lock(tmp_path: pathlib.Path) -> None:
    for sid in ("held", "stale", "ours", "bare"):
        (tmp_path / "session-state" / sid).mkdir(parents=True)
    (tmp_path / "session-state" / "held" / f"inuse.{os.getppid()}.lock").write_text("")
    (tmp_path / "session-state" / "stale" / f"inuse.{_dead_pid()}.lock").write_text("")
    (tmp_path / "session-state" / "ours" / f"inuse.{os.getpid()}.lock").write_text("")
    got = _inuse.copilot(tmp_path, ["held", "stale", "ours", "bare", "missing"], own={os.getpid()})
    assert got == {"held"}


def test_claude_session_is_in_use_only_while_a_live_process_names_it(tmp_path: pathlib.Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    (sessions / f"{os.getppid()}.json").write_text(json.dumps({"pid": os.getppid(), "sessionId": "a"}))
    (sessions / f"{_dead_pid()}.json").write_text(json.dumps({"sessionId": "b"}))
    (sessions / "123.json.key").write_text("x")
    (sessions / "not-a-pid.json").write_text(json.dumps({"sessionId": "c"}))
    assert _inuse.claude(tmp_path, ["a", "b", "c"], own=set()) == {"a"}
    assert _inuse.claude(tmp_path, ["a"], own={os.getppid()}) == set()
    assert _inuse.claude(tmp_path / "nowhere", ["a"], own=set()) == set()


def test_claude_transcript_head_gives_folder_start_and_the_best_title() -> None:
    lines = [
        json.dumps({"type": "queue-operation", "timestamp": "2026-12-01T10:00:00Z"}),
        json.dumps({"type": "user", "cwd": "/w", "timestamp": "2026-12-01T10:00:01Z",
                    "message": {"role": "user", "content": "<system-reminder>x</system-reminder>"}}),
        json.dumps({"type": "user", "cwd": "/w", "message": {"role": "user", "content": "Fix the build\nplease"}}),
        "not json",
    ]
    head = session_head(lines)
    assert (head.cwd, head.title, head.prompted) == ("/w", "Fix the build", True)
    assert head.created_at is not None and head.created_at.isoformat().startswith("2026-12-01T10:00:00")
    assert session_head([*lines, json.dumps({"type": "summary", "summary": "Build fix"})]).title == "Build fix"
    named = [*lines, json.dumps({"type": "custom-title", "customTitle": "mine"}),
             json.dumps({"type": "summary", "summary": "later"})]
    assert session_head(named).title == "mine"
    assert not session_head(lines[:2]).prompted


def test_imported_items_come_out_of_history_marked_each_id_once(tmp_path: pathlib.Path) -> None:
    runtime_items = [c.Item(id="u1", kind=c.ItemKind.USER, text="earlier prompt"),
                     c.Item(id="a1", kind=c.ItemKind.ASSISTANT, text="earlier answer"),
                     c.Item(id="a1", kind=c.ItemKind.ASSISTANT, text="a reused id")]
    items = adopt._imported_items(runtime_items)
    assert [i.id for i in items] == ["import.u1", "import.a1", "import.a1#2"]
    j = Journal(tmp_path / "events.jsonl", fsync=FsyncPolicy.NEVER)
    j.append("conversation", msgspec.json.encode(wire.ConversationCreated(provider="p", workdir="/")))
    j.append("import", msgspec.json.encode(wire.ImportRecord(provider="p", session="s", in_use=False, items=3)))
    for item in items:
        j.append("item", msgspec.json.encode(item))
    j.append("prompt", msgspec.json.encode(wire.PromptRecord(text="later")), run="r1")
    j.append("item", msgspec.json.encode(c.Item(id="r1.u1", kind=c.ItemKind.USER, text="later")), run="r1")
    page = trio.run(history.page, FileJournal(j), "c1", j.last_seq)
    got = [(e.item.text, e.imported) for e in page.items]
    assert got == [("earlier prompt", True), ("earlier answer", True), ("a reused id", True), ("later", False)]


def test_history_output_tags_imported_items_and_shows_their_control_characters() -> None:
    import io

    from agentctl.render import Renderer

    out = io.StringIO()
    ren = Renderer(out, seq=True, answer_hints=False)
    ren.history_entry(wire.HistoryEntry(seq=3, imported=True,
                                        item=c.Item(id="import.u1", kind=c.ItemKind.USER, text="earlier\x1b[2J")))
    ren.history_entry(wire.HistoryEntry(seq=9, item=c.Item(id="r1.a", kind=c.ItemKind.ASSISTANT, text="later")))
    ren.flush()
    lines = out.getvalue().splitlines()
    assert "[imported]" in lines[0] and "\x1b" not in out.getvalue() and "\\x1b[2J" in lines[0]
    assert "[imported]" not in lines[1]


def test_tail_names_the_adopted_session_before_its_earlier_items() -> None:
    import io

    from agentctl.render import Renderer

    out = io.StringIO()
    ren = Renderer(out, answer_hints=False)
    data = msgspec.json.encode(wire.ImportRecord(provider="claude", session="5f0c", in_use=True, items=2, forced=True))
    ren.record("c1", wire.Record(type="import", ts="2026-12-01T10:00:00Z", seq=2, data=msgspec.Raw(data)))
    ren.flush()
    text = out.getvalue()
    assert "adopted claude session 5f0c" in text and "2 earlier item(s)" in text and "--force" in text


def test_export_shows_an_adopted_sessions_earlier_prompts_and_answers() -> None:
    from agentd import export

    def rec(seq: int, type_: str, payload: object, run: str = "") -> bytes:
        return msgspec.json.encode(wire.Record(type=type_, ts="2026-12-01T10:00:00Z", seq=seq, run=run,
                                               data=msgspec.Raw(msgspec.json.encode(payload))))

    lines = [rec(1, "conversation", wire.ConversationCreated(provider="claude", workdir="/w")),
             rec(2, "import", wire.ImportRecord(provider="claude", session="s", in_use=False, items=2)),
             rec(3, "item", c.Item(id="import.u1", kind=c.ItemKind.USER, text="earlier prompt")),
             rec(4, "item", c.Item(id="import.a1", kind=c.ItemKind.ASSISTANT, text="earlier answer")),
             rec(5, "prompt", wire.PromptRecord(text="later prompt"), run="r1"),
             rec(6, "item", c.Item(id="r1.u", kind=c.ItemKind.USER, text="later prompt"), run="r1")]
    record = wire.ConversationRecord(id="c1", provider="claude", workdir="/w", created_at="", updated_at="")
    t = export.transcript(record, lines)
    assert [(e.role, e.text) for e in t.entries] == [
        ("user", "earlier prompt"), ("assistant", "earlier answer"), ("user", "later prompt")]
