"""agentctl's terminal rendering, answer building and exit codes, without a daemon."""

from __future__ import annotations

import io
from typing import Any

import msgspec
import pytest

from agentctl import exitcodes
from agentctl.cli import Fail
from agentctl.commands.answer import _build_answer
from agentctl.prompting import Prompter
from agentctl.render import Renderer, answer_commands, answer_summary, full, json_record, use_color
from agentd import contract as c
from agentd import wire

CONV = "c0ffee1234567"


def rec(type_: str, data: Any, seq: int = 0, run: str = "r1") -> wire.Record:
    return wire.Record(
        type=type_, ts="2026-11-30T00:00:00Z", data=msgspec.Raw(msgspec.json.encode(data)), seq=seq, run=run
    )


def render(records: list[wire.Record], **kw: Any) -> str:
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=True, **kw)
    for x in records:
        r.record(CONV, x)
    r.end_line()
    return out.getvalue()


PERMISSION = c.Interaction(
    id="p1",
    kind=c.InteractionKind.PERMISSION,
    title="Allow bash?",
    detail="rm -rf build",
    options=[
        c.Option(id="once", label="Allow once", allow_once=True),
        c.Option(id="always", label="Always allow"),
        c.Option(id="no", label="Reject", reject=True),
    ],
)

TOOL_RUNNING = c.Item(id="t1", kind=c.ItemKind.TOOL, tool=c.ToolCall(name="bash", input="rm -rf build"))
TOOL_DONE = c.Item(
    id="t1", kind=c.ItemKind.TOOL, tool=c.ToolCall(name="bash", input="rm -rf build", status=c.ToolStatus.COMPLETED, exit_code=0)
)

A_TURN = [
    rec("conversation", wire.ConversationCreated(provider="script", workdir="/w"), seq=1, run=""),
    rec("prompt", wire.PromptRecord(text="clean up"), seq=2),
    rec("item", c.Item(id="u", kind=c.ItemKind.USER, text="clean up"), seq=3),
    rec("turn", c.Turn(state=c.TurnState.WORKING), seq=4),
    rec("delta", c.Delta(item_id="r", kind=c.ItemKind.REASONING, text="Let me ")),
    rec("delta", c.Delta(item_id="r", kind=c.ItemKind.REASONING, text="think.")),
    rec("item", c.Item(id="r", kind=c.ItemKind.REASONING, text="Let me think."), seq=5),
    rec("delta", c.Delta(item_id="a", kind=c.ItemKind.ASSISTANT, text="I will ")),
    rec("item", c.Item(id="a", kind=c.ItemKind.ASSISTANT, text="I will remove it."), seq=6),
    rec("item", TOOL_RUNNING, seq=7),
    rec("interaction", PERMISSION, seq=8),
    rec("answer", c.AnswerRecord(interaction_id="p1", answer=c.Answer(decision="once")), seq=9),
    rec("interaction", msgspec.structs.replace(PERMISSION, state=c.InteractionState.ANSWERED, resolution="once"), seq=10),
    rec("item", TOOL_DONE, seq=11),
    rec("subagent", c.Subagent(id="s1", name="checker", status=c.SubagentStatus.RUNNING, description="check it"), seq=12),
    rec("item", c.Item(id="sa", kind=c.ItemKind.ASSISTANT, text="all clean", agent_id="s1"), seq=13),
    rec("subagent", c.Subagent(id="s1", name="checker", status=c.SubagentStatus.COMPLETED), seq=14),
    rec("usage", c.Usage(ai_units=1.0), seq=15),
    rec("activity", c.Activity(intent="finishing")),
    rec("turn", c.Turn(state=c.TurnState.COMPLETED), seq=16),
]


def test_a_recorded_turn_renders_as_plain_text_without_ansi() -> None:
    text = render(A_TURN)
    assert "\x1b" not in text
    assert text == (
        "· conversation c0ffee1234567 (script, /w)\n"
        "› clean up\n"
        "┊ Let me think.\n"
        "I will remove it.\n"
        "⚙ bash rm -rf build  running\n"
        "? permission: Allow bash?\n"
        "  rm -rf build\n"
        "  1) Allow once  [--allow]\n"
        "  2) Always allow  [--option always]\n"
        "  3) Reject  [--deny]\n"
        "  answer with: agentctl answer c0ffee1234567 p1 --allow\n"
        "          or: agentctl answer c0ffee1234567 p1 --deny\n"
        "          or: agentctl answer c0ffee1234567 p1 --option always\n"
        "  ↳ answered p1 (Allow bash?): Allow once\n"
        "✓ bash rm -rf build  completed, exit 0\n"
        "▸ subagent checker started: check it\n"
        "[checker] all clean\n"
        "◂ subagent checker completed\n"
        "✓ turn completed\n"
    )


def test_ascii_glyphs_when_the_terminal_is_not_utf8() -> None:
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=False)
    r.record(CONV, rec("turn", c.Turn(state=c.TurnState.FAILED, error="boom")))
    r.record(CONV, rec("turn", c.Turn(state=c.TurnState.CANCELLED)))
    assert out.getvalue() == "x turn failed: boom\n- turn cancelled\n"


def test_no_color_disables_ansi_even_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_color(Tty()) is True
    assert use_color(io.StringIO()) is False  # not a terminal
    monkeypatch.setenv("NO_COLOR", "1")
    assert use_color(Tty()) is False
    out = Tty()
    r = Renderer(out)
    r.record(CONV, rec("turn", c.Turn(state=c.TurnState.COMPLETED)))
    assert "\x1b" not in out.getvalue()


def test_colour_dims_reasoning_and_rewrites_a_finished_tool_line() -> None:
    out = io.StringIO()
    r = Renderer(out, color=True, unicode=True)
    r.record(CONV, rec("delta", c.Delta(item_id="r", kind=c.ItemKind.REASONING, text="hmm")))
    r.record(CONV, rec("item", TOOL_RUNNING))
    r.record(CONV, rec("item", TOOL_DONE))
    text = out.getvalue()
    assert "\x1b[2;3mhmm\x1b[0m" in text
    assert "\x1b[1A\r\x1b[2K" in text  # the running line is replaced, not repeated


def test_text_streamed_before_a_snapshot_is_not_printed_twice() -> None:
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=True)
    r.record(CONV, rec("delta", c.Delta(item_id="a", kind=c.ItemKind.ASSISTANT, text="Hel")))
    snap = wire.Snapshot(
        state=wire.ConversationState.REQUIRES_ACTION,
        last_seq=3,
        items=[wire.InFlightItem(id="a", kind="assistant", text="Hello wor")],
        pending=[PERMISSION],
    )
    r.snapshot(CONV, snap)
    r.record(CONV, rec("delta", c.Delta(item_id="a", kind=c.ItemKind.ASSISTANT, text="ld")))
    r.snapshot(CONV, snap)  # a second snapshot (after a resubscription) changes nothing
    r.end_line()
    text = out.getvalue()
    assert text.startswith("Hello wor\n? permission: Allow bash?\n")
    assert text.count("Allow bash?") == 1
    assert text.endswith("ld\n")


def test_a_snapshot_shows_only_text_still_streaming_not_what_was_journaled() -> None:
    # tail --after 6 on a turn in flight: items r and a were journaled at 5 and 6, before the
    # replay started; item b streams on. The snapshot holds all three.
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=True, replay=True)
    r.record(CONV, rec("item", TOOL_RUNNING, seq=7))
    snap = wire.Snapshot(
        state=wire.ConversationState.RUNNING, last_seq=7, run="r1",
        items=[wire.InFlightItem(id="r", kind="reasoning", text="Let me think."),
               wire.InFlightItem(id="a", kind="assistant", text="I will remove it."),
               wire.InFlightItem(id="b", kind="assistant", text="Now I ")],
    )
    assert [it.id for it in r.unshown_items(snap)] == ["r", "a", "b"]
    r.journaled({("", "r"), ("", "a")})
    r.snapshot(CONV, snap)
    r.record(CONV, rec("delta", c.Delta(item_id="b", kind=c.ItemKind.ASSISTANT, text="check.")))
    r.record(CONV, rec("item", c.Item(id="b", kind=c.ItemKind.ASSISTANT, text="Now I check."), seq=8))
    r.end_line()
    assert out.getvalue() == "⚙ bash rm -rf build  running\nNow I check.\n"
    # what the replay itself showed is never shown again by a snapshot, whatever its text there
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=True, replay=True)
    r.record(CONV, rec("item", c.Item(id="a", kind=c.ItemKind.ASSISTANT, text="I will remove it."), seq=6))
    r.snapshot(CONV, wire.Snapshot(state=wire.ConversationState.RUNNING, last_seq=6,
                                   items=[wire.InFlightItem(id="a", kind="assistant", text="I will remove it!")]))
    r.end_line()
    assert out.getvalue() == "I will remove it.\n"


def test_seq_marks_the_first_line_of_each_durable_record() -> None:
    journal = [x for x in A_TURN if x.seq]  # as tail replays it: no deltas
    lines = render(journal, seq=True).splitlines()
    assert lines[:5] == [
        "#1 · conversation c0ffee1234567 (script, /w)",
        "#2 › clean up",
        "#5 ┊ Let me think.",
        "#6 I will remove it.",
        "#7 ⚙ bash rm -rf build  running",
    ]
    assert lines[5] == "#8 ? permission: Allow bash?" and lines[6] == "  rm -rf build"  # the first line only
    assert lines[-1] == "#16 ✓ turn completed"
    assert "#" not in render(journal)  # off by default
    # live-only records (seq 0) carry none
    assert render([rec("delta", c.Delta(item_id="x", kind=c.ItemKind.ASSISTANT, text="hi"))], seq=True) == "hi\n"


def test_a_prompt_shows_the_files_sent_with_it() -> None:
    att = [c.Attachment(name="build.log", mime="text/plain", size=10), c.Attachment(name="a.png", mime="image/png")]
    text = render([rec("prompt", wire.PromptRecord(text="what is wrong here?", attachments=att)),
                   rec("item", c.Item(id="u1", kind=c.ItemKind.USER, text="what is wrong here?"))])
    assert text == "› what is wrong here?  [attached: build.log, a.png]\n"


def test_resolutions_read_like_agentctl_answer_says_them() -> None:
    question = c.Interaction(id="q1", kind=c.InteractionKind.QUESTION, title="Pick a colour",
                             questions=[c.Question(text="Colour?", choices=["red", "green", "blue"])])
    records = [
        rec("interaction", question, seq=1),
        rec("answer", c.AnswerRecord(interaction_id="q1", answer=c.Answer(answers=[["green"]]), by="pid 7 uid 1"), seq=2),
        rec("interaction", PERMISSION, seq=3),
        rec("interaction", msgspec.structs.replace(PERMISSION, state=c.InteractionState.EXPIRED,
                                                   resolution="turn ended"), seq=4),
    ]
    text = render(records, answer_hints=False)
    assert "  ↳ answered q1 (Pick a colour): green\n" in text  # who answered: only with --verbose
    assert "  ↳ expired p1 (Allow bash?): turn ended\n" in text
    assert "  ↳ answered q1 (Pick a colour): green by pid 7 uid 1\n" in render(records, answer_hints=False, verbose=True)
    form = c.Interaction(id="f1", kind=c.InteractionKind.QUESTION, title="Form", elicitation=c.Elicitation(),
                         questions=[c.Question(text="Lines", field=c.Field(name="lines", type="integer"))])
    assert answer_summary(c.Answer(cancel=True), form) == "dismissed"
    assert answer_summary(c.Answer(answers=[["3"]]), form) == "lines=3"
    two = msgspec.structs.replace(form, questions=[
        c.Question(text="Name", field=c.Field(name="name", type="string", required=True)),
        c.Question(text="Email", field=c.Field(name="email", type="string")),
        *form.questions])
    assert answer_summary(c.Answer(answers=[["Ada"], [], ["3"]]), two) == "name=Ada; lines=3"  # email left out
    assert answer_summary(c.Answer(answers=[[], [], []]), two) == "accepted"


def test_a_user_item_echoing_the_prompt_is_shown_once_but_a_steer_is_shown() -> None:
    text = render([
        rec("prompt", wire.PromptRecord(text="go")),
        rec("item", c.Item(id="u1", kind=c.ItemKind.USER, text="go")),
        rec("item", c.Item(id="u2", kind=c.ItemKind.USER, text="left", delivery="steer")),
    ])
    assert text == "› go\n› left (steer)\n"


def test_yolo_conversations_show_no_answer_hints_for_permissions() -> None:
    text = render([
        rec("conversation", wire.ConversationCreated(provider="script", workdir="/w", mode="yolo"), seq=1),
        rec("interaction", PERMISSION),
        rec("answer", c.AnswerRecord(interaction_id="p1", answer=c.Answer(decision="once"), auto=True)),
    ])
    assert "answer with" not in text
    assert "↳ answered p1 (Allow bash?): Allow once (yolo)" in text
    # agentd marks a permission it is about to answer itself: no prompt is shown for it
    auto = msgspec.structs.replace(PERMISSION, auto=True)
    text = render([
        rec("interaction", auto),
        rec("interaction", msgspec.structs.replace(PERMISSION, state=c.InteractionState.ANSWERED, resolution="once")),
    ])
    assert text == "  ↳ answered p1 (Allow bash?): Allow once (yolo)\n"


def replay(records: list[wire.Record], snap: wire.Snapshot, live: list[wire.Record] = ()) -> str:
    """Render as ``tail``/``attach`` do: a journal replay up to a snapshot, then live records."""
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=True, replay=True)
    for x in records:
        r.record(CONV, x)
    r.snapshot(CONV, snap)
    for x in live:
        r.record(CONV, x)
    r.end_line()
    return out.getvalue()


HINTS = (
    "  answer with: agentctl answer c0ffee1234567 p1 --allow\n"
    "          or: agentctl answer c0ffee1234567 p1 --deny\n"
    "          or: agentctl answer c0ffee1234567 p1 --option always\n"
)


def test_a_replay_shows_no_answer_hints_under_an_interaction_answered_later_in_it() -> None:
    text = replay(A_TURN, wire.Snapshot(state=wire.ConversationState.IDLE, last_seq=16))
    assert "answer with" not in text
    # the rest is rendered as live: the interaction, its options, then its answer
    assert text == render(A_TURN).replace(HINTS, "")


def test_a_replay_gives_the_hints_of_an_interaction_still_pending_at_its_end() -> None:
    pending = wire.Snapshot(state=wire.ConversationState.REQUIRES_ACTION, last_seq=8, pending=[PERMISSION])
    # the interaction is the last thing shown: its hints follow it, as when following live
    text = replay(A_TURN[:11], pending)
    assert text == render(A_TURN[:11])
    assert text.endswith("  3) Reject  [--deny]\n" + HINTS)
    # other lines came after it: the hints come at the end, saying which interaction they answer
    text = replay([*A_TURN[:11], rec("title", "cleanup", seq=9)], pending)
    assert text.endswith("· title: cleanup\n? still pending: Allow bash?\n" + HINTS)
    assert text.count("answer with") == 1
    # once caught up, a new interaction gets its hints at once
    question = c.Interaction(id="q1", kind=c.InteractionKind.QUESTION, title="Which?",
                             questions=[c.Question(text="Which?", choices=["a", "b"])])
    text = replay([], wire.Snapshot(state=wire.ConversationState.RUNNING, last_seq=0),
                  live=[rec("interaction", question, seq=1)])
    assert "answer with: agentctl answer c0ffee1234567 q1 --choice 'N|TEXT'" in text


def test_a_replay_drops_the_hints_of_interactions_the_turn_ended() -> None:
    turn_failed = rec("turn", c.Turn(state=c.TurnState.FAILED, error="boom"), seq=9)
    text = replay([*A_TURN[:11], turn_failed], wire.Snapshot(state=wire.ConversationState.IDLE, last_seq=9))
    assert "answer with" not in text and "still pending" not in text


def test_unreadable_or_unknown_records_are_skipped() -> None:
    broken = wire.Record(type="turn", ts="t", data=msgspec.Raw(b'{"state": "exploded"}'))
    text = render([broken, rec("future_kind", {"x": 1})])
    assert text == ""


def test_answer_commands_for_forms_questions_and_plans() -> None:
    form = c.Interaction(
        id="f1",
        kind=c.InteractionKind.QUESTION,
        title="Details",
        elicitation=c.Elicitation(),
        questions=[
            c.Question(text="Name", field=c.Field(name="name", type="string", required=True)),
            c.Question(text="Lines", field=c.Field(name="lines", type="integer")),
            c.Question(text="Topics", choices=["Tools", "Subagents"], multiple=True,
                       field=c.Field(name="topics", type="array")),
        ],
    )
    assert answer_commands("c1", form) == [
        "agentctl answer c1 f1 --field name=TEXT --field lines=INTEGER --field 'topics=Tools|Subagents[,...]'",
        "agentctl answer c1 f1 --reject",
        "agentctl answer c1 f1 --dismiss",
    ]
    plan = c.Interaction(
        id="pl", kind=c.InteractionKind.PLAN_REVIEW, title="Plan",
        plan=c.PlanReview(request_id="x", actions=["autopilot"]),
    )
    assert answer_commands("c1", plan, socket="/tmp/a b.sock") == [
        "agentctl --socket '/tmp/a b.sock' answer c1 pl --action autopilot",
        "agentctl --socket '/tmp/a b.sock' answer c1 pl --feedback TEXT",
    ]


# ---------------------------------------------------------------------- answers


def build(inter: c.Interaction, **kw: Any) -> c.Answer:
    args: dict[str, Any] = dict(
        option=None, allow=False, deny=False, choices=[], texts=[], fields=[], reject=False,
        dismiss=False, accept=False, action=None, feedback=None,
    )
    args.update(kw)
    return _build_answer(inter, **args)


def test_allow_and_deny_pick_the_marked_options() -> None:
    assert build(PERMISSION, allow=True) == c.Answer(decision="once")
    assert build(PERMISSION, deny=True) == c.Answer(decision="no")
    assert build(PERMISSION, option="always") == c.Answer(decision="always")


def test_answer_options_of_the_wrong_kind_are_refused_as_invalid() -> None:
    with pytest.raises(Fail) as exc:
        build(PERMISSION, choices=["red"])
    assert exc.value.code == exitcodes.INVALID
    with pytest.raises(Fail) as exc:
        build(PERMISSION)
    assert exc.value.code == exitcodes.USAGE


def test_choices_texts_and_fields_go_to_their_questions() -> None:
    inter = c.Interaction(
        id="q",
        kind=c.InteractionKind.QUESTION,
        title="Q",
        questions=[
            c.Question(text="Colour", choices=["red", "blue"], custom=True),
            c.Question(text="Why"),
            c.Question(text="Age", field=c.Field(name="age", type="integer")),
            c.Question(text="Tags", field=c.Field(name="tags", type="array")),
        ],
    )
    a = build(inter, choices=["blue"], texts=["because"], fields=["age=7", "tags=a", "tags=b"])
    assert a.answers == [["blue"], ["because"], ["7"], ["a", "b"]]
    # several choices of an array field in one flag, split at commas as the terminal prompt does
    assert build(inter, fields=["tags=a, b", "tags=c"]).answers[3] == ["a", "b", "c"]
    with pytest.raises(Fail) as exc:
        build(inter, fields=["height=3"])
    assert exc.value.code == exitcodes.INVALID
    assert build(inter, reject=True) == c.Answer(reject=True)


COLOUR = c.Interaction(
    id="q1", kind=c.InteractionKind.QUESTION, title="Pick a colour",
    questions=[c.Question(text="Which colour?", choices=["red", "green", "blue"], custom=True)],
)


def test_a_field_given_to_a_question_without_fields_says_how_a_question_is_answered() -> None:
    # It said "q1 has no field 'a' (fields: none)", as if the question were a form.
    with pytest.raises(Fail) as exc:
        build(COLOUR, fields=["a=b"])
    assert exc.value.code == exitcodes.INVALID
    assert "q1 is a question, with no fields: use --choice N|TEXT, --text TEXT, or --reject" in exc.value.message


def test_a_number_given_to_choice_picks_that_choice_as_the_prompt_lists_them() -> None:
    assert build(COLOUR, choices=["2"]) == c.Answer(answers=[["green"]])
    assert build(COLOUR, choices=["blue"]) == c.Answer(answers=[["blue"]])
    assert build(COLOUR, texts=["2"]) == c.Answer(answers=[["2"]])  # free text stays --text
    # a choice whose text is the number wins
    sizes = c.Interaction(id="s", kind=c.InteractionKind.QUESTION, title="Size",
                          questions=[c.Question(text="Size?", choices=["4", "8", "16"], multiple=True)])
    assert build(sizes, choices=["4", "2"]) == c.Answer(answers=[["4", "8"]])
    # with several questions a number goes to the next one offering choices without an answer
    two = c.Interaction(id="t", kind=c.InteractionKind.QUESTION, title="Two", questions=[
        c.Question(text="Why?"),
        c.Question(text="Colour?", choices=["red", "green"]),
        c.Question(text="Size?", choices=["S", "M", "L"]),
    ])
    assert build(two, choices=["2", "3"], texts=["because"]).answers == [["because"], ["green"], ["L"]]


def test_a_number_that_is_no_choice_is_refused_naming_the_choices() -> None:
    for bad in ("4", "0"):
        with pytest.raises(Fail) as exc:
            build(COLOUR, choices=[bad])
        assert exc.value.code == exitcodes.INVALID
        assert exc.value.message == (f"--choice {bad} is not one of the choices: give 1-3 or the text of one "
                                     f'(1) red, 2) green, 3) blue); to answer in words, use --text "{bad}"')


def test_a_choice_text_that_is_no_choice_is_refused_also_where_free_text_is_taken() -> None:
    with pytest.raises(Fail) as exc:
        build(COLOUR, choices=["purple"])
    assert exc.value.code == exitcodes.INVALID
    assert "not one of the choices" in exc.value.message and '--text "purple"' in exc.value.message
    assert build(COLOUR, texts=["purple"]) == c.Answer(answers=[["purple"]])


def test_a_form_answered_with_the_wrong_options_says_it_is_a_form_and_names_its_fields() -> None:
    form = c.Interaction(id="f1", kind=c.InteractionKind.QUESTION, title="Details", elicitation=c.Elicitation(),
                         questions=[c.Question(text="Name", field=c.Field(name="name", type="string", required=True)),
                                    c.Question(text="Lines", field=c.Field(name="lines", type="integer",
                                                                           required=True))])
    for kw in ({"choices": ["blue"]}, {"texts": ["x"]}, {"choices": ["1"], "fields": ["name=a"]}, {"allow": True}):
        with pytest.raises(Fail) as exc:
            build(form, **kw)
        assert exc.value.code == exitcodes.INVALID, kw
        assert exc.value.message.startswith("f1 is a form: use --field NAME=VALUE (fields: name, lines)"), kw
    with pytest.raises(Fail) as exc:
        build(form)
    assert exc.value.code == exitcodes.USAGE
    assert exc.value.message.startswith("give an answer for form f1: use --field NAME=VALUE (fields: name, lines)")
    assert build(form, fields=["name=a", "lines=3"]).answers == [["a"], ["3"]]
    with pytest.raises(Fail) as exc:
        build(COLOUR, allow=True)
    assert exc.value.message == "q1 is a question: use --choice N|TEXT, --text TEXT, or --reject"


def test_every_terminal_prompt_says_ctrl_d_answers_later() -> None:
    plan = c.Interaction(id="pl", kind=c.InteractionKind.PLAN_REVIEW, title="Plan",
                         plan=c.PlanReview(request_id="x", actions=["autopilot"]))
    for inter in (PERMISSION, COLOUR, plan):
        said: list[str] = []

        def decline(prompt: str) -> str:
            raise EOFError

        with pytest.raises(EOFError):
            Prompter(decline, said.append).ask(inter)
        assert any("Ctrl-D to answer later" in line for line in said), inter.kind


def test_a_form_prompt_re_asks_a_field_until_it_fits() -> None:
    inter = c.Interaction(
        id="f",
        kind=c.InteractionKind.QUESTION,
        title="Form",
        elicitation=c.Elicitation(),
        questions=[
            c.Question(text="Lines", field=c.Field(name="lines", type="integer", minimum=1, maximum=20, required=True)),
            c.Question(text="Verbose", field=c.Field(name="verbose", type="boolean")),
            c.Question(text="Topics", choices=["Tools", "Subagents"],
                       field=c.Field(name="topics", type="array", values=["tools", "subagents"], min_items=1)),
        ],
    )
    replies = iter(["", "50", "abc", "5", "y", "1,2"])
    said: list[str] = []
    prompts: list[str] = []
    p = Prompter(lambda prompt: prompts.append(prompt) or next(replies), said.append)
    answer = p.ask(inter)
    assert answer.answers == [["5"], ["yes"], ["Tools", "Subagents"]]
    assert prompts[-1] == "  topics (array, >= 1 choices if given, optional, numbers or names, comma-separated): "
    c.validate_answer(inter, answer)
    assert any("required" in s for s in said)
    assert any("<= 20" in s for s in said)


def test_a_permission_prompt_takes_a_number_or_an_option_id() -> None:
    replies = iter(["9", "2"])
    assert Prompter(lambda _: next(replies), lambda _: None).ask(PERMISSION) == c.Answer(decision="always")
    assert Prompter(lambda _: "no", lambda _: None).ask(PERMISSION) == c.Answer(decision="no")


def test_a_number_that_is_not_a_choice_is_re_asked_not_taken_as_free_text() -> None:
    q = c.Question(text="Colour?", choices=["red", "green"], custom=True)
    inter = c.Interaction(id="q", kind=c.InteractionKind.QUESTION, title="Pick", questions=[q])
    replies = iter(["3", "0", "2"])
    said: list[str] = []
    assert Prompter(lambda _: next(replies), said.append).ask(inter) == c.Answer(answers=[["green"]])
    assert "  3 is not one of the choices: type a number from 1 to 2, or an answer in words\n" in said
    assert "  0 is not one of the choices: type a number from 1 to 2, or an answer in words\n" in said
    # free text that is not a bare number is still an answer of its own
    assert Prompter(lambda _: "dark teal 3", lambda _: None).ask(inter) == c.Answer(answers=[["dark teal 3"]])
    # several choices: each number must be one; a choice written out counts, numbers included
    sizes = c.Question(text="Sizes?", choices=["4", "8", "16"], multiple=True, custom=True)
    inter = c.Interaction(id="q", kind=c.InteractionKind.QUESTION, title="Sizes", questions=[sizes])
    replies = iter(["1, 7", "16, 1"])
    said = []
    assert Prompter(lambda _: next(replies), said.append).ask(inter) == c.Answer(answers=[["16", "4"]])
    assert any("7 is not one of the choices: type a number from 1 to 3" in s for s in said)
    # without free text the number is refused the same way
    closed = c.Interaction(id="q", kind=c.InteractionKind.QUESTION, title="Pick",
                           questions=[c.Question(text="Colour?", choices=["red", "green"])])
    replies = iter(["5", "teal", "1"])
    said = []
    assert Prompter(lambda _: next(replies), said.append).ask(closed) == c.Answer(answers=[["red"]])
    assert "  5 is not one of the choices: type a number from 1 to 2\n" in said
    assert "  type a number from 1 to 2\n" in said


# ---------------------------------------------------------------------- JSON and exit codes


def test_json_output_names_every_field_and_records_carry_their_conversation() -> None:
    record = wire.ConversationRecord(id="c", provider="p", workdir="/", created_at="t", updated_at="t")
    assert msgspec.json.decode(msgspec.json.encode(full(record)))["state"] == "idle"
    line = msgspec.json.decode(json_record(CONV, rec("title", "hi", seq=4, run="")))
    assert line == {"type": "title", "conversation": CONV, "seq": 4, "ts": "2026-11-30T00:00:00Z", "run": "", "data": "hi"}


@pytest.mark.parametrize(
    "error, code",
    [
        (c.NotFound("x"), exitcodes.NOT_FOUND),
        (c.ConversationNotFound("x"), exitcodes.NOT_FOUND),
        (c.InteractionGone("x"), exitcodes.NOT_FOUND),
        (c.Busy("x"), exitcodes.BUSY),
        (c.Invalid("x"), exitcodes.INVALID),
        (c.Closed("x"), exitcodes.FAILED),
        (c.Unsupported("x"), exitcodes.FAILED),
        (c.SubmissionUncertain("x"), exitcodes.FAILED),
        (c.InternalError("x"), exitcodes.FAILED),
        (RuntimeError("x"), exitcodes.FAILED),
    ],
)
def test_error_codes_map_to_documented_exit_codes(error: BaseException, code: int) -> None:
    assert exitcodes.for_error(error) == code


def test_wire_errors_map_through_their_code() -> None:
    err = wire.error_from_body(wire.ErrorBody(code="busy", message="a turn runs"))
    assert exitcodes.for_error(err) == 7


def test_turn_outcomes_map_to_exit_codes() -> None:
    assert exitcodes.for_turn(c.TurnState.COMPLETED) == 0
    assert exitcodes.for_turn(c.TurnState.FAILED) == 1
    assert exitcodes.for_turn(c.TurnState.CANCELLED) == 3
    assert exitcodes.for_turn("cancelled") == 3
    assert (exitcodes.NEEDS_ACTION, exitcodes.UNREACHABLE, exitcodes.USAGE) == (4, 5, 2)


def test_a_finished_tool_shows_the_end_of_its_output_and_todos_show_progress() -> None:
    done = c.Item(id="t2", kind=c.ItemKind.TOOL, tool=c.ToolCall(
        name="bash", input="make", status=c.ToolStatus.COMPLETED, exit_code=0,
        output="cc -c a.c\n\ncc -c b.c\ncc -o app a.o b.o\nbuilt app\n"))
    todos = c.TodoList(todos=[c.Todo(id="1", title="Build", status="done"), c.Todo(id="2", title="Test", status="in_progress"),
                              c.Todo(id="3", title="Ship", status="blocked")])
    text = render([rec("item", done), rec("todos", todos), rec("todos", todos),
                   rec("todos", c.TodoList(known=False))])
    assert text == (
        "✓ bash make  completed, exit 0\n"
        "  cc -c b.c\n"
        "  cc -o app a.o b.o\n"
        "  built app\n"
        "· todos: 1/3 done; now: Test; 1 blocked\n"  # shown once while it stays the same; unknown: nothing
    )


def test_an_item_streamed_without_a_terminal_starts_on_its_own_line_without_a_blank_one() -> None:
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=True)
    r.record(CONV, rec("delta", c.Delta(item_id="a", kind=c.ItemKind.ASSISTANT, text="Summary:")))
    r.record(CONV, rec("delta", c.Delta(item_id="b", kind=c.ItemKind.ASSISTANT, text="\n")))
    r.record(CONV, rec("delta", c.Delta(item_id="b", kind=c.ItemKind.ASSISTANT, text="- one,\n\n- two")))
    r.record(CONV, rec("delta", c.Delta(item_id="c", kind=c.ItemKind.ASSISTANT, text="\n- three")))
    r.end_line()
    # Within an item its own blank lines stay; between items none is made of a leading newline.
    assert out.getvalue() == "Summary:\n- one,\n\n- two\n- three\n"


def test_a_subagent_known_only_by_its_id_is_named_by_it_whole_or_cut_visibly() -> None:
    # A history page holds items only: the demo's agent-1-16 read "[agent-1-]", cut at 8.
    out = io.StringIO()
    r = Renderer(out, color=False, unicode=True)
    for agent in ("agent-1-16", "toolu_01ABCDEFGHIJKLMNOPQRSTUV"):
        r.history_entry(wire.HistoryEntry(seq=3, run="r1", item=c.Item(
            id="x", kind=c.ItemKind.ASSISTANT, text="checked", agent_id=agent)))
    text = out.getvalue()
    assert "[agent-1-16] " in text and "[toolu_01ABCD…] " in text


def test_seq_tags_a_title_shown_late_with_its_own_seq() -> None:
    # A title journaled before a prompt waits for it: shown before the next record, it keeps its seq.
    created = rec("conversation", wire.ConversationCreated(provider="script", workdir="/w"), seq=1, run="")
    title = rec("title", "tidy the build", seq=2, run="")
    other = rec("prompt", wire.PromptRecord(text="clean up"), seq=3)
    lines = render([created, title, other], seq=True).splitlines()
    assert lines[1:] == ["#2 · title: tidy the build", "#3 › clean up"]
    at_end = render([created, title], seq=True).splitlines()
    assert at_end[1:] == []  # held for its prompt: nothing yet
    r_out = io.StringIO()
    r = Renderer(r_out, color=False, unicode=True, seq=True)
    for x in (created, title):
        r.record(CONV, x)
    r.settle()
    assert r_out.getvalue().splitlines()[1:] == ["#2 · title: tidy the build"]


def test_a_model_set_by_a_person_shows_once_and_a_confirmation_only_when_it_differs() -> None:
    # `set-model` showed "model: big (high)" twice: the request, then the runtime's confirmation.
    text = render([
        rec("model_selection", {"model": "big", "effort": "high", "source": "user"}, 3),
        rec("model_selection", {"model": "big", "effort": "high"}, 4),
        rec("model_selection", {"model": "small", "source": "user", "queued": True}, 5),
        rec("model_selection", {"model": "small-2025"}, 6),  # the runtime chose otherwise: said
    ])
    lines = [ln.split(" ", 1)[1] for ln in text.splitlines()]
    assert lines == ["model set to big (high)", "model set to small, from the next turn", "model: small-2025"], text
