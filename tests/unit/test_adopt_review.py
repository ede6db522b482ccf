"""What `agentctl import` takes from a runtime's files and lists, held to the rules for untrusted
runtime output: readers that never block or read without end, lines nested too deeply or with
odd bytes that count as malformed, times at the edge of datetime's range, items cut like live
ones, and listings that keep to the folder asked for."""

from __future__ import annotations

import datetime as _dt
import json
import os
import pathlib
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from agentd import adopt, export, runtime_output
from agentd import contract as c
from agentd.config import ClaudeConfig, CopilotConfig
from agentd.providers import _inuse
from agentd.providers.claude import _mapping as claude_mapping
from agentd.providers.copilot import _mapping as copilot_mapping
from agentd.providers.claude._provider import ClaudeProvider
from agentd.providers.copilot._provider import CopilotProvider

EDGE_LOW = "0001-01-01T00:00:00+01:00"  # in range, but its UTC value is not
EDGE_HIGH = "9999-12-31T23:00:00-05:00"
DEEP = "[" * 200_000


def _prompt(cwd: str, text: str = "hello", **more: Any) -> str:
    return json.dumps({"type": "user", "cwd": cwd, "timestamp": "2024-01-01T00:00:00Z", "uuid": "u1",
                       "message": {"role": "user", "content": text}, **more}) + "\n"


def _claude(tmp_path: pathlib.Path) -> tuple[ClaudeProvider, pathlib.Path]:
    home = tmp_path / "claude"
    (home / "projects").mkdir(parents=True)
    return ClaudeProvider(ClaudeConfig(config_dir=str(home)), state_dir=tmp_path / "state"), home / "projects"


def _slug(path: pathlib.Path | str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9]", "-", str(path))


# --------------------------------------------------------------------------- items and times


def test_imported_items_are_cut_like_live_ones() -> None:
    big = "x" * (runtime_output.MAX_ITEM_TEXT_CHARS + 1000)
    items = adopt._imported_items([
        c.Item(id="a", kind=c.ItemKind.ASSISTANT, text=big),
        c.Item(id="t", kind=c.ItemKind.TOOL, tool=c.ToolCall(name="Write", input=big, output=big)),
        c.Item(id="s", kind=c.ItemKind.USER, text="small")])
    assert items[0].text == runtime_output.cut_text(big) and len(items[0].text) < len(big)
    assert items[1].tool is not None
    assert items[1].tool.input == runtime_output.cut_text(big) and items[1].tool.output == runtime_output.cut_text(big)
    assert items[2].text == "small"


def test_times_at_the_edge_of_datetimes_range_are_dropped_not_raised() -> None:
    low = _dt.datetime.fromisoformat(EDGE_LOW)
    high = _dt.datetime.fromisoformat(EDGE_HIGH)
    assert adopt._time(low) == "" and adopt._time(high) == ""
    assert adopt._time(_dt.datetime(2024, 1, 1, 12, tzinfo=_dt.timezone(_dt.timedelta(hours=2)))) == "2024-01-01T10:00:00.000Z"
    parse = runtime_output.parse_utc
    assert parse(EDGE_LOW) is None and parse(EDGE_HIGH) is None and parse("no time") is None and parse(7) is None
    assert parse("2024-01-01T00:00:00Z") == _dt.datetime(2024, 1, 1, tzinfo=_dt.timezone.utc)
    assert parse("2024-01-01T02:00:00+02:00") == _dt.datetime(2024, 1, 1, tzinfo=_dt.timezone.utc)
    assert claude_mapping._time(EDGE_LOW) is None and claude_mapping._time(EDGE_HIGH) is None
    # a live Copilot event at the edge takes the time it reached agentd, as one with no time does
    before = _dt.datetime.now(_dt.timezone.utc)
    assert before <= copilot_mapping.utc(high) <= _dt.datetime.now(_dt.timezone.utc)
    assert copilot_mapping.utc(_dt.datetime(2024, 1, 1)) == _dt.datetime(2024, 1, 1, tzinfo=_dt.timezone.utc)
    # a journal written before this fix may hold one: the export falls back to the record's time
    assert export._time(low, "2024-05-01T12:00:00.123Z") == "2024-05-01T12:00:00Z"
    imported = adopt._imported_items([c.Item(id="a", kind=c.ItemKind.ASSISTANT, text="hi", time=low, ended_at=high)])
    assert imported[0].time is None and imported[0].ended_at is None


def test_a_listing_keeps_to_the_folder_asked_for_whatever_the_provider_lists(tmp_path: pathlib.Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "link").symlink_to(work)
    sessions = [c.PreviousConversation(id="root", workdir="/"), c.PreviousConversation(id="up", workdir=str(tmp_path)),
                c.PreviousConversation(id="odd", workdir="\ud83d\x00"), c.PreviousConversation(id="none"),
                c.PreviousConversation(id="link", workdir=str(tmp_path / "link")),
                c.PreviousConversation(id="here", workdir=str(work) + "/")]

    class Provider:  # one that does not filter by folder itself
        def capabilities(self) -> c.Capabilities:
            return c.Capabilities(import_=True)

        async def previous(self, workdir: str) -> list[c.PreviousConversation]:
            return sessions

    async def get(name: str) -> Provider:
        return Provider()

    service: Any = SimpleNamespace(runtimes=SimpleNamespace(get=get), list=lambda include_closed: [])
    got = trio.run(adopt.candidates, service, "p", str(work))
    assert sorted(s.id for s in got.sessions) == ["here", "link", "none"]
    assert {s.workdir for s in got.sessions} == {str(work)}


# --------------------------------------------------------------------------- decoding transcript lines


def test_claude_transcript_lines_nested_too_deeply_are_malformed_ones() -> None:
    lines = [_prompt("/w"), DEEP + "\n",
             json.dumps({"type": "assistant", "uuid": "a1", "message": {"id": "m1", "content": [
                 {"type": "tool_use", "id": "t1", "name": "X", "input": {"k": json.loads("[" * 400 + "]" * 400)}}]}}) + "\n",
             json.dumps({"type": "assistant", "uuid": "a2", "message": {"id": "m2", "content": [{"type": "text", "text": "after"}]}})]
    items = claude_mapping.transcript_items(lines)
    assert [i.text for i in items if i.kind in (c.ItemKind.USER, c.ItemKind.ASSISTANT)] == ["hello", "after"]
    head = claude_mapping.session_head([DEEP, *lines])
    assert (head.cwd, head.prompted, head.title) == ("/w", True, "hello")


def test_claude_transcript_strings_with_a_lone_surrogate_are_cleaned() -> None:
    lines = [_prompt("/w", "hi \\ud83d there").replace("\\\\ud83d", "\\ud83d").encode(),
             b'{"type":"custom-title","customTitle":"nice \\ud83d title"}\n',
             b'{"type":"assistant","uuid":"a1","message":{"id":"m1","content":[{"type":"text","text":"x\\udc00y"}]}}\n']
    head = claude_mapping.session_head(lines)
    assert head.title == "nice \ufffd title"
    texts = [i.text for i in claude_mapping.transcript_items(lines)]
    assert texts == ["hi \ufffd there", "x\ufffdy"]
    for text in [head.title, *texts]:
        text.encode("utf-8")  # what no reply could encode before


def test_claude_in_use_check_skips_a_session_file_nested_too_deeply(tmp_path: pathlib.Path) -> None:
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    (sessions / f"{os.getppid()}.json").write_text("[" * 60_000)
    (sessions / f"{os.getpid()}.json").write_text(json.dumps({"sessionId": "a"}))
    assert _inuse.claude(tmp_path, ["a"], own=set()) == {"a"}


# --------------------------------------------------------------------------- reading Claude's files


def test_claude_transcript_is_read_only_from_a_regular_file_and_a_huge_line_left_out(tmp_path: pathlib.Path) -> None:
    prov, projects = _claude(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    folder = projects / _slug(work)
    folder.mkdir()
    sid = str(uuid.uuid4())
    path = folder / f"{sid}.jsonl"
    with open(path, "wb") as f:
        f.write(_prompt(str(work)).encode())
        f.truncate(f.tell() + runtime_output.MAX_MESSAGE_BYTES + 10)  # a line of NULs over the ceiling (sparse)
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + json.dumps({"type": "assistant", "uuid": "a1", "message": {
            "id": "m1", "content": [{"type": "text", "text": "after the big line"}]}}).encode() + b"\n")
    items = trio.run(prov.transcript, sid)
    assert items is not None
    assert [i.kind for i in items] == [c.ItemKind.USER, c.ItemKind.NOTICE, c.ItemKind.ASSISTANT]
    assert "left out one line" in items[1].text and items[2].text == "after the big line"
    # listed too: only the head and the tail of it are read
    listed = trio.run(prov.previous, str(work))
    assert [p.id for p in listed] == [sid]
    # a transcript behind a symlink is not followed
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(_prompt(str(work), "through a symlink"))
    sid2 = str(uuid.uuid4())
    (folder / f"{sid2}.jsonl").symlink_to(elsewhere)
    with pytest.raises(c.ConversationNotFound, match="cannot be read"):
        trio.run(prov.transcript, sid2)
    assert sid2 not in [p.id for p in trio.run(prov.previous, str(work))]


def test_claude_listing_takes_a_late_title_from_the_end_of_a_big_transcript(tmp_path: pathlib.Path) -> None:
    prov, projects = _claude(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (projects / _slug(work)).mkdir()
    sid = str(uuid.uuid4())
    filler = json.dumps({"type": "assistant", "message": {"id": "m", "content": [{"type": "text", "text": "x" * 1000}]}}) + "\n"
    (projects / _slug(work) / f"{sid}.jsonl").write_text(
        _prompt(str(work), "first prompt") + filler * 8000 + json.dumps({"type": "custom-title", "customTitle": "renamed"}) + "\n")
    [listed] = trio.run(prov.previous, str(work))
    assert (listed.id, listed.title) == (sid, "renamed")


# --------------------------------------------------------------------------- Copilot


def _copilot_listing(tmp_path: pathlib.Path, listed: list[Any]) -> CopilotProvider:
    """A Copilot provider whose CLI's ``list_sessions`` answers ``listed``."""
    prov = CopilotProvider(CopilotConfig(copilot_home=str(tmp_path / "copilot")), state_dir=tmp_path / "state")

    async def runtime() -> Any:
        return SimpleNamespace(client=SimpleNamespace(list_sessions=lambda _filter: listed))

    async def call(what: str, fn: Any, *args: Any) -> Any:
        return fn(*args)

    prov._ensure_runtime = runtime  # type: ignore[method-assign]
    prov._call = call  # type: ignore[method-assign]
    return prov


def _copilot_session(sid: str, cwd: str | None, start: _dt.datetime | None = None) -> Any:
    from copilot.client import SessionContext, SessionMetadata

    start = start or _dt.datetime(2024, 1, 1, tzinfo=_dt.timezone.utc)
    return SessionMetadata(session_id=sid, start_time=start, modified_time=start, is_remote=False, summary=sid,
                           context=SessionContext(working_directory=cwd) if cwd is not None else None)


def test_copilot_listing_drops_a_time_with_no_utc_value(tmp_path: pathlib.Path) -> None:
    prov = _copilot_listing(tmp_path, [_copilot_session("odd", None, _dt.datetime.fromisoformat(EDGE_LOW)),
                                       _copilot_session("fine", None)])
    got = {p.id: p for p in trio.run(prov.previous, str(tmp_path))}
    assert got["odd"].created_at is None and got["odd"].updated_at is None
    assert got["fine"].created_at == _dt.datetime(2024, 1, 1, tzinfo=_dt.timezone.utc)


def test_copilot_stored_events_are_read_only_from_a_regular_file(tmp_path: pathlib.Path) -> None:
    prov = CopilotProvider(CopilotConfig(copilot_home=str(tmp_path / "copilot")), state_dir=tmp_path / "state")
    folder = tmp_path / "copilot" / "session-state" / "s1"
    folder.mkdir(parents=True)
    real = tmp_path / "events.jsonl"
    real.write_text('{"type": "x"}\n')
    (folder / "events.jsonl").symlink_to(real)
    with pytest.raises(c.ConversationNotFound, match="cannot be read"):
        trio.run(prov._stored_events, "s1")
    (folder / "events.jsonl").unlink()
    with open(folder / "events.jsonl", "wb") as f:
        f.write(b'{"a": 1}\n')
        f.truncate(f.tell() + runtime_output.MAX_MESSAGE_BYTES + 10)  # one line over the ceiling (sparse)
        f.seek(0, os.SEEK_END)
        f.write(b'\n{"b": 2}')
    assert trio.run(prov._stored_events, "s1") == [b'{"a": 1}\n', b'{"b": 2}']


def test_copilot_stored_events_have_lone_surrogates_replaced() -> None:
    from agentd.providers.copilot import _mapping as copilot_mapping

    line = (b'{"type": "user.message", "data": {"content": "hi \\ud83d x"}, "timestamp": "2024-01-01T00:00:00Z",'
            b' "id": "27ba8409-ba20-41d9-a87e-82055935ec03", "parentId": null}\n')
    [event] = copilot_mapping.parse_events_jsonl([line, DEEP.encode()])
    assert event.data.content == "hi \ufffd x"
