"""agentd.itemids: runtime item ids scoped by run, and the references to them."""

from __future__ import annotations

from agentd import contract as c
from agentd.itemids import ItemIds


def _tool(rid: str, status: c.ToolStatus, agent: str = "") -> c.ItemEvent:
    return c.ItemEvent(item=c.Item(id=rid, kind=c.ItemKind.TOOL, agent_id=agent, tool=c.ToolCall(name="bash", status=status)))


def test_the_same_runtime_id_in_two_runs_is_two_ids_and_references_follow() -> None:
    ids = ItemIds()
    first = ids.scope(_tool("t1", c.ToolStatus.RUNNING), "r1")
    asked = ids.scope(c.InteractionEvent(interaction=c.Interaction(id="p", kind=c.InteractionKind.PERMISSION, title="t", tool_call_id="t1")), "r1")
    sub = ids.scope(c.SubagentEvent(subagent=c.Subagent(id="s", name="x", status=c.SubagentStatus.RUNNING, parent_tool_call_id="t1")), "r1")
    second = ids.scope(_tool("t1", c.ToolStatus.RUNNING), "r2")
    assert first.item.id == asked.interaction.tool_call_id == sub.subagent.parent_tool_call_id == "r1.t1"
    assert second.item.id == "r2.t1"


def test_within_a_run_an_open_call_announced_again_merges_and_an_ended_ones_id_reused_is_a_new_item() -> None:
    ids = ItemIds()
    seen = [ids.scope(_tool("t", s), "r").item.id for s in
            (c.ToolStatus.PENDING, c.ToolStatus.RUNNING, c.ToolStatus.RUNNING, c.ToolStatus.COMPLETED,
             c.ToolStatus.COMPLETED, c.ToolStatus.RUNNING, c.ToolStatus.FAILED, c.ToolStatus.PENDING)]
    assert seen == ["r.t"] * 5 + ["r.t#2", "r.t#2", "r.t#3"]
    delta = ids.scope(c.DeltaEvent(delta=c.Delta(item_id="m", kind=c.ItemKind.ASSISTANT, text="x")), "r")
    item = ids.scope(c.ItemEvent(item=c.Item(id="m", kind=c.ItemKind.ASSISTANT, text="x")), "r")
    assert delta.delta.item_id == item.item.id == "r.m"


def test_outside_a_run_ids_are_the_runtimes() -> None:
    event = _tool("t", c.ToolStatus.RUNNING)
    assert ItemIds().scope(event, "") is event
