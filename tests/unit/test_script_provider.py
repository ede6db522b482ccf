"""The script provider, driven directly: a real provider.run in a nursery, a list sink."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
import trio

from agentd import contract as c
from agentd.providers.script import ScriptConfig, ScriptProvider, load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "conf" / "scripts"
DEMO = ROOT / "conf" / "demo.toml"


class ListSink:
    """Collects every event; never blocks."""

    def __init__(self) -> None:
        self.events: list[c.Event] = []

    def emit(self, event: c.Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]

    def turn_states(self) -> list[c.TurnState]:
        return [e.turn.state for e in self.of(c.TurnEvent)]

    def final_items(self) -> dict[tuple[str, str], c.Item]:
        return {(e.item.agent_id, e.item.id): e.item for e in self.of(c.ItemEvent)}

    def interactions(self) -> dict[str, c.Interaction]:
        return {e.interaction.id: e.interaction for e in self.of(c.InteractionEvent)}

    def pending(self) -> list[c.Interaction]:
        return [i for i in self.interactions().values() if i.state is c.InteractionState.PENDING]


async def until(predicate, timeout: float = 3.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.005)


async def turn_ended(sink: ListSink, count: int = 1, timeout: float = 3.0) -> None:
    await until(lambda: sum(s.terminal for s in sink.turn_states()) >= count, timeout)


async def next_pending(sink: ListSink, timeout: float = 3.0) -> c.Interaction:
    await until(lambda: bool(sink.pending()), timeout)
    return sink.pending()[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    return d


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
async def provider(state_dir: Path):
    p = ScriptProvider(ScriptConfig(scripts_dir=str(SCRIPTS)), state_dir=state_dir)
    async with trio.open_nursery() as nursery:
        await nursery.start(p.run)
        yield p
        nursery.cancel_scope.cancel()


async def open_conv(provider: ScriptProvider, workdir: Path, model: str = "", **kw):
    sink = ListSink()
    conv = await provider.open(c.OpenRequest(workdir=str(workdir), model=model, **kw), sink)
    return conv, sink


def received(provider: ScriptProvider) -> list[dict]:
    path = provider.received_path
    return [msgspec.json.decode(line) for line in path.read_bytes().splitlines()] if path.exists() else []


# --------------------------------------------------------------------------- turns


async def test_text_turn_emits_user_item_working_deltas_item_completed_in_order(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "echo")
    await conv.send(c.Prompt(text="hi there"))
    await turn_ended(sink)

    kinds = [type(e).__name__ for e in sink.events]
    assert kinds[0:2] == ["ItemEvent", "TurnEvent"]
    assert kinds[-2:] == ["ItemEvent", "TurnEvent"]
    assert set(kinds[2:-2]) == {"DeltaEvent"}
    user = sink.events[0].item
    assert (user.kind, user.text, user.id) == (c.ItemKind.USER, "hi there", "1-0")
    assert sink.turn_states() == [c.TurnState.WORKING, c.TurnState.COMPLETED]
    streamed = "".join(e.delta.text for e in sink.of(c.DeltaEvent))
    final = sink.events[-2].item
    assert final.kind is c.ItemKind.ASSISTANT and final.text == streamed == "You said: hi there. Earlier: "
    assert all(len(e.delta.text) <= 8 for e in sink.of(c.DeltaEvent))


async def test_empty_model_plays_the_builtin_echo(provider, workdir):
    conv, sink = await open_conv(provider, workdir)
    await conv.send(c.Prompt(text="ping"))
    await turn_ended(sink)
    assert sink.of(c.ItemEvent)[-1].item.text == "You said: ping"


async def test_turn_selection_takes_the_first_match_else_cycles_unmatched(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "cycle.toml")
    answers = []
    for n, text in enumerate(["a", "Hello!", "b", "c", "d"], 1):
        await conv.send(c.Prompt(text=text))
        await turn_ended(sink, n)
        answers.append(sink.of(c.ItemEvent)[-1].item.text)
    # prompts 1, 3, 4, 5 take unmatched entries (n-1) % 2: one, one, two, one
    assert answers == ["one", "Hello to you too.", "one", "two", "one"]


async def test_fail_step_ends_the_turn_failed_with_its_error(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "fail")
    await conv.send(c.Prompt(text="x"))
    await turn_ended(sink)
    end = sink.of(c.TurnEvent)[-1].turn
    assert (end.state, end.error) == (c.TurnState.FAILED, "the script says this turn fails")


async def test_send_during_a_turn_is_busy_and_not_counted(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "wait")
    await conv.send(c.Prompt(text="first"))
    with pytest.raises(c.Busy):
        await conv.send(c.Prompt(text="second"))
    await conv.cancel()
    assert [r["text"] for r in received(provider)] == ["first"]


# --------------------------------------------------------------------------- tools and permissions


async def test_permission_allow_runs_the_command_and_reject_does_not(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "tool")
    await conv.send(c.Prompt(text="go"))
    perm = await next_pending(sink)
    assert perm.kind is c.InteractionKind.PERMISSION and perm.tool_call_id == "1-1"
    assert [o.id for o in perm.options] == ["allow_once", "allow_always", "reject"]
    assert perm.options[0].allow_once and perm.options[2].reject
    assert not (workdir / "agentd-tool.txt").exists()
    with pytest.raises(c.Invalid):
        await conv.respond(perm.id, c.Answer(decision="maybe"))
    await conv.respond(perm.id, c.Answer(decision="allow_once"))
    await turn_ended(sink)
    assert (workdir / "agentd-tool.txt").read_text() == "written by agentd\n"
    tool = sink.final_items()[("", "1-1")].tool
    assert (tool.status, tool.exit_code, tool.output, tool.tail) == (c.ToolStatus.COMPLETED, 0, "done", [])
    assert sink.interactions()[perm.id].state is c.InteractionState.ANSWERED
    with pytest.raises(c.InteractionGone):
        await conv.respond(perm.id, c.Answer(decision="allow_once"))

    (workdir / "agentd-tool.txt").unlink()
    await conv.send(c.Prompt(text="again"))
    perm = await next_pending(sink)
    await conv.respond(perm.id, c.Answer(decision="reject"))
    await turn_ended(sink, 2)
    assert not (workdir / "agentd-tool.txt").exists()
    tool = sink.final_items()[("", "2-1")].tool
    assert (tool.status, tool.output) == (c.ToolStatus.FAILED, "denied")
    assert sink.interactions()[perm.id].state is c.InteractionState.REJECTED
    assert sink.turn_states()[-1] is c.TurnState.COMPLETED


async def test_allow_always_is_remembered_for_the_conversation(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "tool")
    await conv.send(c.Prompt(text="go"))
    await conv.respond((await next_pending(sink)).id, c.Answer(decision="allow_always"))
    await turn_ended(sink)
    await conv.send(c.Prompt(text="again"))
    await turn_ended(sink, 2)
    assert len(sink.of(c.InteractionEvent)) == 2  # pending + answered, never asked again
    assert sink.final_items()[("", "2-1")].tool.status is c.ToolStatus.COMPLETED


async def test_running_command_shows_a_bounded_tail_and_keeps_all_output(provider, workdir):
    script = write(workdir / "t.toml", """
[[turn]]
[[turn.step]]
kind = "tool"
command = "for i in $(seq 1 30); do echo line $i; done; sleep 0.1; echo oops >&2; sleep 0.3"
""")
    conv, sink = await open_conv(provider, workdir, str(script))
    await conv.send(c.Prompt(text="go"))
    await turn_ended(sink)
    running = [e.item.tool for e in sink.of(c.ItemEvent) if e.item.tool and e.item.tool.tail]
    assert running, "a running update with a tail"
    assert all(len(t.tail) <= c.MAX_TAIL_LINES and t.status is c.ToolStatus.RUNNING for t in running)
    assert c.OutputLine(text="oops", err=True) in running[-1].tail
    tool = sink.final_items()[("", "1-1")].tool
    assert tool.output.splitlines()[:30] == [f"line {i}" for i in range(1, 31)]
    assert tool.exit_code == 0 and tool.tail == []


# --------------------------------------------------------------------------- questions, forms, plans


async def test_question_answer_is_validated_then_echoed(provider, workdir):
    script = write(workdir / "q.toml", """
delay_ms = 0
[[turn]]
[[turn.step]]
kind = "question"
text = "Colour?"
choices = ["red", "blue"]
custom = true
echo = true
""")
    conv, sink = await open_conv(provider, workdir, str(script))
    await conv.send(c.Prompt(text="go"))
    q = await next_pending(sink)
    with pytest.raises(c.Invalid):
        await conv.respond(q.id, c.Answer(answers=[["red", "blue"]]))  # not multiple
    assert sink.pending()
    await conv.respond(q.id, c.Answer(answers=[["mauve"]]))  # custom text allowed
    await turn_ended(sink)
    assert sink.interactions()[q.id].resolution == "mauve"
    assert sink.of(c.ItemEvent)[-1].item.text == "You answered: mauve"


async def test_form_invalid_value_stays_pending_and_valid_one_is_answered(provider, workdir):
    script = write(workdir / "f.toml", """
delay_ms = 0
[[turn]]
[[turn.step]]
kind = "form"
title = "Details"
echo = "Got {answer}"
[[turn.step.field]]
name = "age"
type = "integer"
minimum = 1
maximum = 120
required = true
[[turn.step.field]]
name = "email"
format = "email"
[[turn.step.field]]
name = "ok"
type = "boolean"
""")
    conv, sink = await open_conv(provider, workdir, str(script))
    await conv.send(c.Prompt(text="go"))
    form = await next_pending(sink)
    assert form.elicitation is not None and [q.field.name for q in form.questions] == ["age", "email", "ok"]
    for bad in ([["200"], [], []], [["30"], ["not-an-email"], []], [[], [], ["Yes"]]):
        with pytest.raises(c.Invalid):
            await conv.respond(form.id, c.Answer(answers=bad))
        assert [i.id for i in sink.pending()] == [form.id]
    await conv.respond(form.id, c.Answer(answers=[["30"], ["ada@example.org"], ["Yes"]]))
    await turn_ended(sink)
    done = sink.interactions()[form.id]
    assert (done.state, done.resolution) == (c.InteractionState.ANSWERED, "age=30; email=ada@example.org; ok=yes")
    assert sink.of(c.ItemEvent)[-1].item.text == "Got age=30; email=ada@example.org; ok=yes"


async def test_plan_review_takes_an_offered_action_or_feedback(provider, workdir):
    script = write(workdir / "p.toml", """
[[turn]]
[[turn.step]]
kind = "plan"
summary = "Do it"
actions = ["autopilot", "exit_only"]
""")
    conv, sink = await open_conv(provider, workdir, str(script))
    await conv.send(c.Prompt(text="go"))
    plan = await next_pending(sink)
    assert plan.plan.actions == ["autopilot", "exit_only"] and plan.plan.request_id == plan.id
    with pytest.raises(c.Invalid):
        await conv.respond(plan.id, c.Answer(plan=c.PlanAnswer(action="interactive")))
    await conv.respond(plan.id, c.Answer(plan=c.PlanAnswer(feedback="smaller steps")))
    await turn_ended(sink)
    done = sink.interactions()[plan.id]
    assert (done.state, done.resolution) == (c.InteractionState.REJECTED, "smaller steps")


# --------------------------------------------------------------------------- cancel, steer, close


async def test_cancel_of_a_wait_step_ends_cancelled_quickly_and_a_new_prompt_works(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "wait")
    await conv.send(c.Prompt(text="long job"))
    await until(lambda: bool(sink.of(c.DeltaEvent)))
    start = trio.current_time()
    await conv.cancel()
    assert trio.current_time() - start < 0.5
    end = sink.of(c.TurnEvent)[-1].turn
    assert end.state is c.TurnState.CANCELLED and end.reason == ""
    await conv.cancel()  # no turn: a no-op

    await conv.send(c.Prompt(text="next"))
    await until(lambda: sink.turn_states().count(c.TurnState.WORKING) == 2)
    await conv.cancel()
    assert sink.turn_states() == [c.TurnState.WORKING, c.TurnState.CANCELLED] * 2


async def test_cancel_expires_pending_interactions_and_fails_the_running_command(provider, workdir):
    script = write(workdir / "c.toml", """
[[turn]]
match = "ask"
[[turn.step]]
kind = "tool"
command = "touch never"
permission = true
[[turn]]
[[turn.step]]
kind = "tool"
command = "echo started; sleep 30"
""")
    conv, sink = await open_conv(provider, workdir, str(script))
    await conv.send(c.Prompt(text="ask"))
    perm = await next_pending(sink)
    await conv.cancel()
    assert sink.interactions()[perm.id].state is c.InteractionState.EXPIRED
    tool = sink.final_items()[("", "1-1")].tool
    assert (tool.status, tool.output) == (c.ToolStatus.FAILED, "cancelled")
    with pytest.raises(c.InteractionGone):
        await conv.respond(perm.id, c.Answer(decision="allow_once"))

    await conv.send(c.Prompt(text="run"))
    await until(lambda: any(e.item.tool and e.item.tool.tail for e in sink.of(c.ItemEvent)))
    start = trio.current_time()
    await conv.cancel()
    assert trio.current_time() - start < 0.5
    tool = sink.final_items()[("", "2-1")].tool
    assert (tool.status, tool.output) == (c.ToolStatus.FAILED, "started\ncancelled")
    assert sink.turn_states()[-1] is c.TurnState.CANCELLED
    assert not (workdir / "never").exists()


async def test_cancel_mid_stream_finishes_the_item_with_the_text_so_far(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "slow")
    await conv.send(c.Prompt(text="x"))
    await until(lambda: len([e for e in sink.of(c.DeltaEvent) if e.delta.kind is c.ItemKind.ASSISTANT]) >= 3)
    await conv.cancel()
    streamed = "".join(e.delta.text for e in sink.of(c.DeltaEvent) if e.delta.item_id == "1-2")
    item = sink.final_items()[("", "1-2")]
    assert item.text == streamed and item.ended_at is not None
    assert sink.turn_states()[-1] is c.TurnState.CANCELLED
    assert [i.id for i in (await conv.history()).items] == ["1-0", "1-1", "1-2"]


async def test_subagent_items_carry_its_id_and_it_ends_failed_or_cancelled(provider, workdir):
    script = write(workdir / "s.toml", """
delay_ms = 0
[[turn]]
match = "fail"
[[turn.step]]
kind = "subagent"
name = "helper"
text = "partial work"
fail = "ran out of time"
[[turn]]
[[turn.step]]
kind = "subagent"
name = "sleeper"
[[turn.step.step]]
kind = "text"
text = "working"
[[turn.step.step]]
kind = "sleep"
ms = 10000
""")
    conv, sink = await open_conv(provider, workdir, str(script))
    await conv.send(c.Prompt(text="fail please"))
    await turn_ended(sink)
    first, last = sink.of(c.SubagentEvent)[0].subagent, sink.of(c.SubagentEvent)[-1].subagent
    assert (first.status, first.parent_tool_call_id) == (c.SubagentStatus.RUNNING, "1-1")
    assert (last.status, last.error) == (c.SubagentStatus.FAILED, "ran out of time")
    assert sink.final_items()[(first.id, "1-1-1")].text == "partial work"
    task = sink.final_items()[("", "1-1")].tool
    assert (task.name, task.status, task.output) == ("task", c.ToolStatus.FAILED, "ran out of time")
    assert sink.turn_states()[-1] is c.TurnState.COMPLETED

    await conv.send(c.Prompt(text="go"))
    await until(lambda: ("agent-2-1", "2-1-1") in sink.final_items())
    await conv.cancel()
    sub = sink.of(c.SubagentEvent)[-1].subagent
    assert (sub.id, sub.status) == ("agent-2-1", c.SubagentStatus.CANCELLED)
    assert sub.runs[-1].status is c.SubagentStatus.CANCELLED
    assert sink.final_items()[("", "2-1")].tool.status is c.ToolStatus.FAILED
    assert {s.id: s.status for s in (await conv.history()).subagents} == {
        "agent-1-1": c.SubagentStatus.FAILED, "agent-2-1": c.SubagentStatus.CANCELLED}


async def test_set_model_switches_the_script_from_the_next_turn(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "echo")
    with pytest.raises(c.Invalid):
        await conv.set_model("missing-script")
    await conv.set_model("fail")
    assert sink.of(c.ModelSelectionEvent)[-1].selection.model == "fail"
    await conv.send(c.Prompt(text="x"))
    await turn_ended(sink)
    assert sink.turn_states()[-1] is c.TurnState.FAILED


async def test_steer_joins_the_running_turn_and_is_counted(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "wait")
    with pytest.raises(c.Invalid):
        await conv.steer(c.Prompt(text="nothing runs"))
    await conv.send(c.Prompt(text="please steer me"))
    await until(lambda: bool(sink.of(c.DeltaEvent)))
    await conv.steer(c.Prompt(text="left"))
    await turn_ended(sink)
    steer = [e.item for e in sink.of(c.ItemEvent) if e.item.delivery == "steer"]
    assert [(i.kind, i.text) for i in steer] == [(c.ItemKind.USER, "left")]
    assert sink.of(c.ItemEvent)[-1].item.text == "Steered: left"
    assert sink.turn_states()[-1] is c.TurnState.COMPLETED
    assert [(r["text"], r["delivery"]) for r in received(provider)] == [("please steer me", "send"), ("left", "steer")]


async def test_close_expires_pending_and_later_calls_raise_closed(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "tool")
    await conv.send(c.Prompt(text="go"))
    perm = await next_pending(sink)
    await conv.close()
    assert sink.interactions()[perm.id].state is c.InteractionState.EXPIRED
    end = sink.of(c.TurnEvent)[-1].turn
    assert (end.state, end.reason) == (c.TurnState.CANCELLED, "closed")
    for call in (conv.send(c.Prompt(text="x")), conv.history(), conv.cancel(), conv.respond(perm.id, c.Answer())):
        with pytest.raises(c.Closed):
            await call
    await conv.close()  # idempotent
    # closed, not deleted: the id reopens
    again = await provider.open(c.OpenRequest(workdir=str(workdir), conversation_id=conv.id), ListSink())
    assert [i.text for i in (await again.history()).items if i.kind is c.ItemKind.USER] == ["go"]


async def test_stopping_the_provider_cancels_turns_and_closes_conversations(state_dir, workdir):
    p = ScriptProvider(ScriptConfig(scripts_dir=str(SCRIPTS)), state_dir=state_dir)
    sink = ListSink()
    async with trio.open_nursery() as nursery:
        await nursery.start(p.run)
        conv = await p.open(c.OpenRequest(workdir=str(workdir), model="wait"), sink)
        await conv.send(c.Prompt(text="x"))
        await until(lambda: bool(sink.of(c.DeltaEvent)))
        nursery.cancel_scope.cancel()
    end = sink.of(c.TurnEvent)[-1].turn
    assert (end.state, end.reason) == (c.TurnState.CANCELLED, "shutdown")
    with pytest.raises(c.Closed):
        await conv.send(c.Prompt(text="y"))
    with pytest.raises(c.Closed):
        await p.open(c.OpenRequest(workdir=str(workdir)), sink)


# --------------------------------------------------------------------------- persistence


async def test_reopen_by_id_in_a_new_provider_keeps_history(state_dir, workdir):
    config = ScriptConfig(scripts_dir=str(SCRIPTS))
    async with trio.open_nursery() as nursery:
        first = ScriptProvider(config, state_dir=state_dir)
        await nursery.start(first.run)
        conv, sink = await open_conv(first, workdir, "echo")
        for n, text in enumerate(["alpha", "beta"], 1):
            await conv.send(c.Prompt(text=text))
            await turn_ended(sink, n)
        conv_id = conv.id
        nursery.cancel_scope.cancel()

    assert (state_dir / "providers" / "script" / f"{conv_id}.json").is_file()
    async with trio.open_nursery() as nursery:
        second = ScriptProvider(config, state_dir=state_dir)
        await nursery.start(second.run)
        sink = ListSink()
        conv = await second.open(c.OpenRequest(workdir=str(workdir), conversation_id=conv_id), sink)
        assert conv.id == conv_id
        history = await conv.history()
        assert [i.text for i in history.items] == [
            "alpha", "You said: alpha. Earlier: ", "beta", "You said: beta. Earlier: alpha"]
        await conv.send(c.Prompt(text="gamma"))
        await turn_ended(sink)
        last = sink.of(c.ItemEvent)[-1].item
        assert last.text == "You said: gamma. Earlier: alpha | beta"
        assert last.id == "3-1"  # numbering goes on, ids stay unique
        nursery.cancel_scope.cancel()


async def test_reopen_of_an_unknown_id_is_not_found_and_creates_nothing(provider, workdir):
    for bad in ("no-such-id", "../escape"):
        with pytest.raises(c.ConversationNotFound):
            await provider.open(c.OpenRequest(workdir=str(workdir), conversation_id=bad), ListSink())
    assert list(provider.dir.glob("*.json")) == []


async def test_received_jsonl_counts_each_prompt_exactly_once(provider, workdir):
    conv, sink = await open_conv(provider, workdir, "echo")
    other, other_sink = await open_conv(provider, workdir, "echo")
    for n in range(3):
        await conv.send(c.Prompt(text=f"p{n}"))
        await other.send(c.Prompt(text=f"q{n}"))
        await turn_ended(sink, n + 1)
        await turn_ended(other_sink, n + 1)
    lines = received(provider)
    assert sorted(r["text"] for r in lines if r["conversation"] == conv.id) == ["p0", "p1", "p2"]
    assert sorted(r["text"] for r in lines if r["conversation"] == other.id) == ["q0", "q1", "q2"]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT.*Z", r["ts"]) for r in lines)


# --------------------------------------------------------------------------- scripts


async def test_missing_or_invalid_script_is_invalid_naming_file_and_key(provider, workdir):
    with pytest.raises(c.Invalid, match="nope"):
        await open_conv(provider, workdir, "nope")
    bad = write(workdir / "bad.toml", '[[turn]]\n[[turn.step]]\nkind = "text"\ntext = 3\n')
    with pytest.raises(c.Invalid) as info:
        await open_conv(provider, workdir, "bad.toml")
    assert str(bad) in info.value.message and "$.turn[0].step[0].text" in info.value.message
    write(workdir / "typo.toml", '[[turn]]\n[[turn.step]]\nkind = "text"\ntext = "x"\ndelay = 3\n')
    with pytest.raises(c.Invalid, match=r"unknown field `delay` - at `\$\.turn\[0\]\.step\[0\]`"):
        await open_conv(provider, workdir, "typo.toml")


def test_every_shipped_script_parses():
    for path in [DEMO, *SCRIPTS.glob("*.toml")]:
        load_script(path)


async def test_demo_completes_with_every_interaction_answered(provider, workdir, tmp_path):
    # Same script with streaming delays removed, so the test stays fast.
    fast = write(tmp_path / "demo.toml", re.sub(r"(?m)^(\s*)(delay_ms|ms) = \d+", r"\1\2 = 0", DEMO.read_text()))
    conv, sink = await open_conv(provider, workdir, str(fast))
    await conv.send(c.Prompt(text="show me around"))
    answers = {
        c.InteractionKind.PERMISSION: c.Answer(decision="allow_once"),
        c.InteractionKind.PLAN_REVIEW: c.Answer(plan=c.PlanAnswer(action="autopilot")),
    }
    form = c.Answer(answers=[["Ada"], ["ada@example.org"], ["3"], ["No"], ["Tools", "Subagents"]])
    answered = []
    with trio.fail_after(10):
        while not any(s.terminal for s in sink.turn_states()):
            for i in sink.pending():
                if i.id not in answered:
                    answer = answers.get(i.kind) or (form if i.elicitation else c.Answer(answers=[["green"]]))
                    await conv.respond(i.id, answer)
                    answered.append(i.id)
            await trio.sleep(0.005)
    assert sink.turn_states()[-1] is c.TurnState.COMPLETED
    assert len(answered) == 4
    assert (workdir / "agentd-demo.txt").read_text() == "hello from agentd\n"
    assert sink.of(c.TitleEvent)[0].title == "agentd demo tour"
    assert sink.of(c.TodosEvent)[-1].todos.todos[-1].status == "done"
    assert sink.of(c.UsageEvent)[-1].usage.cost_usd == pytest.approx(0.0284)
    assert sink.of(c.ContextEvent)
    subs = [e.subagent for e in sink.of(c.SubagentEvent)]
    assert [s.status for s in subs] == [c.SubagentStatus.RUNNING, c.SubagentStatus.COMPLETED]
    assert {i.agent_id for i in sink.final_items().values()} == {"", subs[0].id}
    items = sink.final_items()
    assert items[("", subs[0].parent_tool_call_id)].tool.output.startswith("agentd-demo.txt contains")
    kinds = {i.kind for i in items.values()}
    assert kinds == {c.ItemKind.USER, c.ItemKind.REASONING, c.ItemKind.ASSISTANT, c.ItemKind.TOOL}
    assert items[("", "1-10")].text.startswith("Thanks, I got: name=Ada; email=ada@example.org; lines=3; verbose=no")
