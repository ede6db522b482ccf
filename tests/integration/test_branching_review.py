"""Fork, rewind and what reads around them (agentd.branching, agentd.subagents, agentd.usage),
in-process on the script provider: a preview that reads only, set-model and budget refusing a
closed conversation without loading it, a rewind's dropped subagents, a fork's kept tool outputs,
and a budget of -0.0."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from agentd import branching, models, subagents, tool_outputs, usage, wire
from agentd import contract as c
from agentd.conversations import ConversationService

from inprocess import in_process_service

SCRIPT = '''
model = "branching"
[[turn]]
[[turn.step]]
kind = "subagent"
name = "helper"
text = "helped"
[[turn.step]]
kind = "text"
text = "ok {prompt}"
delay_ms = 0
'''

TOOL = '''
model = "tool"
[[turn]]
[[turn.step]]
kind = "tool"
command = "seq 1 40000"
[[turn.step]]
kind = "text"
text = "done"
delay_ms = 0
'''


async def _new(service: ConversationService, tmp_path: Path, script: str = SCRIPT, **kw: Any) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    path = tmp_path / "s.toml"
    path.write_text(script)
    return (await service.create(provider="script", workdir=str(work), model=str(path), **kw)).id


async def _turn(service: ConversationService, cid: str, text: str) -> str:
    run = (await service.send(cid, text)).run
    with trio.fail_after(20):
        while service.record(cid).active_run:
            await trio.sleep(0.005)
    return run


def _journal(tmp_path: Path, cid: str) -> list[dict[str, Any]]:
    path = tmp_path / "state" / "conversations" / cid / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_a_preview_reads_only_and_a_closed_conversation_is_refused_unloaded(tmp_path: Path) -> None:
    async with in_process_service(tmp_path) as (service, _hub):
        closed = await _new(service, tmp_path)
        await _turn(service, closed, "a")
        await _turn(service, closed, "b")
        await service.close(closed)
        idle = await _new(service, tmp_path)
        r1 = await _turn(service, idle, "a")
        await _turn(service, idle, "b")
    sizes = {cid: len(_journal(tmp_path, cid)) for cid in (closed, idle)}
    async with in_process_service(tmp_path) as (service, _hub):  # a restart: neither is loaded
        with pytest.raises(c.Closed):
            await branching.rewind(service, closed, "1", preview=True)
        with pytest.raises(c.Closed):
            await branching.rewind(service, closed, "1")
        with pytest.raises(c.Closed):
            await models.select(service, closed, "other")
        with pytest.raises(c.Closed):
            await usage.set_budget(service, closed, wire.Budget(max_cost_usd=1.0))
        preview = await branching.rewind(service, idle, "1", preview=True)
        assert preview.preview and preview.kept.run == r1 and len(preview.dropped) == 1 and preview.seq == 0
        assert not service.is_loaded(closed) and not service.is_loaded(idle)  # no lease taken
        # Read through a loaded conversation too: still nothing journaled.
        await service.live(idle)
        loaded = len(_journal(tmp_path, idle))
        assert (await branching.rewind(service, idle, r1, preview=True)).dropped == preview.dropped
        assert len(_journal(tmp_path, idle)) == loaded
        done = await branching.rewind(service, idle, r1)
        assert not done.preview and done.seq == _journal(tmp_path, idle)[-1]["seq"]
    assert len(_journal(tmp_path, closed)) == sizes[closed]


async def test_subagents_of_runs_a_rewind_dropped_are_not_listed_nor_merged(tmp_path: Path) -> None:
    async with in_process_service(tmp_path) as (service, _hub):
        cid = await _new(service, tmp_path)
        for text in ("one", "two", "three"):
            await _turn(service, cid, text)
        listed = (await subagents.listing(service, cid)).subagents
        assert [s.id for s in listed] == ["agent-1-1", "agent-2-1", "agent-3-1"]
        await branching.rewind(service, cid, "1")
        assert [s.id for s in (await subagents.listing(service, cid)).subagents] == ["agent-1-1"]
        with pytest.raises(c.NotFound):
            await subagents.cancel(service, cid, "agent-3-1")
        # The script numbers the next turn 2 again: its subagent reuses the dropped one's id.
        run = await _turn(service, cid, "four")
        listed = (await subagents.listing(service, cid)).subagents
        assert [s.id for s in listed] == ["agent-1-1", "agent-2-1"]
        latest = [r for r in _journal(tmp_path, cid) if r["type"] == "subagent" and r.get("run") == run][-1]
        assert listed[-1] == msgspec.json.decode(json.dumps(latest["data"]).encode(), type=c.Subagent)


async def test_a_fork_keeps_the_whole_output_of_the_tool_items_it_copied(tmp_path: Path) -> None:
    async with in_process_service(tmp_path) as (service, _hub):
        cid = await _new(service, tmp_path, TOOL)
        await _turn(service, cid, "a")
        tool = [r for r in _journal(tmp_path, cid) if r["type"] == "item" and r["data"].get("tool")][-1]["data"]
        assert tool["tool"]["cut"] > 0
        source = await tool_outputs.show_item(service, cid, tool["id"])
        assert source.kept
        fork = (await branching.fork(service, cid)).conversation.id
        shown = await tool_outputs.show_item(service, fork, tool["id"])
        assert shown.kept and shown.full_bytes == source.full_bytes and shown.full_output == source.full_output
        await service.delete(cid)  # the fork's copy is its own
        assert (await tool_outputs.show_item(service, fork, tool["id"])).kept


def test_copied_outputs_stay_within_the_forks_quota(tmp_path: Path) -> None:
    outputs = tool_outputs.ToolOutputs(tmp_path, quota_bytes=4000)
    assert outputs.keep("csrc", "", "a", "a" * 1000) and outputs.keep("csrc", "", "b", "b" * 1000)
    for n, item in enumerate("ab"):  # a is the older, whatever the file system's clock resolution
        os.utime(tmp_path / "csrc" / tool_outputs.OUTPUT_DIR / f"{tool_outputs._key('', item)}.txt",
                 ns=(10**9 * (n + 1),) * 2)
    small = tool_outputs.ToolOutputs(tmp_path, quota_bytes=1500)
    assert small.copy("csrc", "cdst", [("", "a"), ("", "b"), ("", "missing")]) == 2
    assert small.read_all("cdst", "", "a") is None  # the older one made room
    assert small.read_all("cdst", "", "b") == "b" * 1000
    assert outputs.read_all("csrc", "", "a") == "a" * 1000  # the source keeps its own


async def test_a_budget_of_minus_zero_is_kept_as_zero(tmp_path: Path) -> None:
    async with in_process_service(tmp_path) as (service, _hub):
        cid = await _new(service, tmp_path, budget=wire.Budget(max_cost_usd=-0.0))
        budget = service.record(cid).budget
        assert budget is not None and math.copysign(1.0, budget.max_cost_usd) == 1.0
        record = await usage.set_budget(service, cid, wire.Budget(max_cost_usd=-0.0))
        assert record.budget is not None and math.copysign(1.0, record.budget.max_cost_usd) == 1.0
        journaled = [r["data"]["budget"]["max_cost_usd"] for r in _journal(tmp_path, cid) if r["type"] == "budget"]
        assert journaled == [0.0, 0.0] and all(math.copysign(1.0, v) == 1.0 for v in journaled)
