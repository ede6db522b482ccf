"""The pieces of agentctl's live view (agentctl.liveview, Renderer(live=True)), without a daemon.

The live view itself is tested at a pseudo-terminal in tests/integration/test_live_view.py;
these pin down the rules it is built on.
"""

from __future__ import annotations

import io
from typing import Any

import msgspec

from agentctl.liveview import Notifier, commit_point, fit, markdown
from agentctl.render import Renderer
from agentd import contract as c
from agentd import wire

CONV = "c0ffee1234567"


def rec(type_: str, data: Any, ts: str = "2026-11-30T00:00:00Z", run: str = "r1") -> wire.Record:
    return wire.Record(type=type_, ts=ts, data=msgspec.Raw(msgspec.json.encode(data)), run=run)


def test_whole_blocks_are_committed_and_a_code_fence_is_never_cut() -> None:
    assert commit_point("Hello wor") == 0
    assert commit_point("Hello world.\n") == 0  # a paragraph may go on
    assert commit_point("Hello world.\n\nNext") == len("Hello world.\n\n")
    assert commit_point("# Title\nText") == len("# Title\n")
    fenced = "```py\ndef f():\n\n    return 1\n"
    assert commit_point(fenced) == 0  # the blank line is inside the fence
    assert commit_point(fenced + "```\nafter") == len(fenced + "```\n")


def test_fit_counts_wide_characters_twice() -> None:
    assert fit("abcdef", 4) == "abcd"
    assert fit("日本語", 4) == "日本"


def test_markdown_shows_agent_html_as_written() -> None:
    lines = markdown("Some <b>bold</b> words\n\n<div>block</div>\n", 60, False)
    assert lines[0] == "Some <b>bold</b> words"
    assert any("<div>block</div>" in ln for ln in lines)


def test_the_live_region_shows_a_running_tools_newest_lines_then_clears() -> None:
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=True, live=True, width=80)
    r.record(CONV, rec("prompt", wire.PromptRecord(text="go")))
    running = c.Item(id="t1", kind=c.ItemKind.TOOL, tool=c.ToolCall(
        name="bash", input="make", tail=[c.OutputLine(text=f"line {i}") for i in range(8)]))
    r.record(CONV, rec("item", running))
    r.refresh()
    region = out.getvalue().split("make  running\n", 1)[1]
    assert "│ line 7" in region and "│ line 3" in region and "line 2" not in region  # the newest five
    assert "bash running · 0s" in region
    # A runtime that updates the output of a running tool instead (ACP agents) shows that.
    r.record(CONV, rec("item", msgspec.structs.replace(
        running, tool=msgspec.structs.replace(running.tool, tail=[], output="first\nsecond\n"))))
    r.refresh()
    assert out.getvalue().rstrip().endswith("bash running · 0s")
    assert "│ second" in out.getvalue().rsplit("\x1b[2K", 1)[-1]
    done = msgspec.structs.replace(running, tool=c.ToolCall(name="bash", input="make", status=c.ToolStatus.COMPLETED,
                                                            output="ok", exit_code=0))
    r.record(CONV, rec("item", done))
    r.record(CONV, rec("turn", c.Turn(state=c.TurnState.COMPLETED), ts="2026-11-30T00:00:03.5Z"))
    r.refresh()
    assert out.getvalue().endswith("✓ bash make  completed, exit 0\n  ok\n✓ turn completed · 3.5s\n")


def test_the_end_of_turn_line_sums_the_turns_own_model_calls() -> None:
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=True, live=True)
    r.record(CONV, rec("prompt", wire.PromptRecord(text="go"), ts="2026-11-30T00:00:00Z"))
    r.record(CONV, rec("tokens", c.TokenUsage(input=1000, output=200, cost_usd=0.01)))
    r.record(CONV, rec("tokens", c.TokenUsage(input=3000, output=34, cost_usd=0.0023)))
    r.record(CONV, rec("tokens", c.TokenUsage(input=99, output=99, cost_usd=9), run="r0"))  # another turn's
    r.record(CONV, rec("turn", c.Turn(state=c.TurnState.FAILED, error="boom"), ts="2026-11-30T00:01:05Z"))
    assert out.getvalue().endswith("✗ turn failed: boom · 1m05s · 4,234 tokens (4,000 in, 234 out) · $0.0123\n")
    # Not on a terminal: the line scripts read, as it always was.
    plain = io.StringIO()
    p = Renderer(plain, color=False, unicode=True)
    p.record(CONV, rec("turn", c.Turn(state=c.TurnState.COMPLETED)))
    assert plain.getvalue() == "✓ turn completed\n"


def test_the_notifier_rings_once_per_interaction(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no notify-send here
    out = io.StringIO()
    n = Notifier(out)
    n.waiting(CONV, "p1", "permission", "Allow bash?")
    n.waiting(CONV, "p1", "permission", "Allow bash?")
    n.waiting(CONV, "p2", "question", "Colour?")
    assert out.getvalue() == "\a\a"
    quiet = io.StringIO()
    Notifier(quiet, bell=False).waiting(CONV, "p1", "permission", "Allow bash?")
    assert quiet.getvalue() == ""


def test_text_still_streaming_is_shown_wrapped_its_newest_rows_last() -> None:
    from agentctl.liveview import rows

    assert rows("a" * 25, 10, 6) == ["a" * 10, "a" * 10, "a" * 5]
    assert rows("one\ntwo\n" + "x" * 12, 5, 3) == ["xxxxx", "xxxxx", "xx"]
    assert rows("", 5, 3) == [""]


def test_streamed_markdown_is_printed_a_block_at_a_time_and_what_is_held_when_the_turn_ends() -> None:
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=True, live=True, width=80)
    text = "# Plan\n\nFirst **this**.\n\n- one\n- two\n\nThen that"
    for i in range(0, len(text), 4):
        r.delta(c.Delta(item_id="a1", kind=c.ItemKind.ASSISTANT, text=text[i:i + 4]))
    assert out.getvalue() == "Plan\n\nFirst this.\n\n • one\n • two\n"  # whole blocks only
    r.record(CONV, rec("turn", c.Turn(state=c.TurnState.CANCELLED)))  # no item came: the rest is not lost
    assert out.getvalue() == "Plan\n\nFirst this.\n\n • one\n • two\n\nThen that\n⊘ turn cancelled\n"


def test_a_title_made_from_the_prompt_is_not_shown_but_another_is() -> None:
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=True)
    r.record(CONV, rec("title", "fix the build", run=""))
    r.record(CONV, rec("prompt", wire.PromptRecord(text="fix the build\nit fails since Monday")))
    r.record(CONV, rec("title", "Fixing the CI build"))
    assert out.getvalue() == "› fix the build\n  it fails since Monday\n· title: Fixing the CI build\n"
    named = io.StringIO()
    r = Renderer(named, color=False, unicode=True)
    r.record(CONV, rec("title", "Release", run=""))  # agentctl title, nothing follows: shown once quiet
    assert named.getvalue() == ""
    r.settle()
    assert named.getvalue() == "· title: Release\n"
