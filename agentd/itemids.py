"""Item identity: an item id is unique within its conversation, whatever ids the runtime reuses.

Runtimes name items with ids of their own and reuse them: a tool call id comes back in a
later turn (issue 13, item 4). The journal, the transcript (``agentctl tail``) and exports key
an item by (agent id, item id), and a later record with the same key replaces the earlier one;
so the conversation service journals each item under an id scoped by the run it belongs to:

* ``<run>.<runtime id>``: within one run the same runtime id is one item, so a tool call
  announced again while it is still open merges into that item;
* ``<run>.<runtime id>#2``, ``#3`` ...: the runtime reused the id of a tool call that already
  ended within the same run (it announces it again as pending or running): a new call, a new item.

References to an item are scoped the same way: a delta's ``item_id``, a kept tool output's
``item_id``, an interaction's ``tool_call_id``, a subagent's ``parent_tool_call_id``. Events outside any run keep the
runtime's ids. Pure and synchronous: no I/O, never raises; memory is one turn's item keys.
"""

from __future__ import annotations

import msgspec

from . import contract as c

_OPEN = (c.ToolStatus.PENDING, c.ToolStatus.RUNNING)


class ItemIds:
    """One conversation's scoping of runtime item ids (see the module docstring)."""

    __slots__ = ("run", "_ids", "_calls", "_ended")

    def __init__(self) -> None:
        self.run = ""
        #: (agent id, runtime id) -> the id journaled for it in ``run``
        self._ids: dict[tuple[str, str], str] = {}
        #: (agent id, runtime id) -> how many tool calls of ``run`` used that runtime id (when over 1)
        self._calls: dict[tuple[str, str], int] = {}
        #: (agent id, runtime id) of tool calls of ``run`` that ended
        self._ended: set[tuple[str, str]] = set()

    def _begin(self, run: str) -> None:
        self.run = run
        self._ids.clear()
        self._calls.clear()
        self._ended.clear()

    def _id(self, agent_id: str, rid: str) -> str:
        key = (agent_id, rid)
        scoped = self._ids.get(key)
        if scoped is None:
            scoped = self._ids[key] = f"{self.run}.{rid}"
        return scoped

    def _tool(self, item: c.Item) -> str:
        key = (item.agent_id, item.id)
        status = item.tool.status if item.tool is not None else None
        if key in self._ended and status in _OPEN:  # the id reused for a new call in the same run
            self._ended.discard(key)
            calls = self._calls[key] = self._calls.get(key, 1) + 1
            self._ids[key] = f"{self.run}.{item.id}#{calls}"
        elif status is not None and status not in _OPEN:
            self._ended.add(key)
        return self._id(item.agent_id, item.id)

    def scope_delta(self, d: c.Delta, run: str) -> c.Delta:
        """``d`` with its item id scoped by ``run`` (:meth:`scope` of its DeltaEvent, without the event)."""
        if not run:
            return d
        if run != self.run:
            self._begin(run)
        key = (d.agent_id, d.item_id)
        scoped = self._ids.get(key)  # _id, inlined: this runs once per streamed delta
        if scoped is None:
            scoped = self._ids[key] = f"{run}.{d.item_id}"
        return msgspec.structs.replace(d, item_id=scoped)

    def scope(self, event: c.Event, run: str) -> c.Event:
        """``event`` with its item ids (and references to items) scoped by ``run``."""
        if not run:
            return event
        if run != self.run:
            self._begin(run)
        if type(event) is c.DeltaEvent:
            return c.DeltaEvent(delta=self.scope_delta(event.delta, run))
        if type(event) is c.ItemEvent:
            item = event.item
            scoped = self._tool(item) if item.kind is c.ItemKind.TOOL else self._id(item.agent_id, item.id)
            return c.ItemEvent(item=msgspec.structs.replace(item, id=scoped))
        if type(event) is c.ToolOutputEvent:  # the whole output of the tool item that follows it
            return msgspec.structs.replace(event, item_id=self._id(event.agent_id, event.item_id))
        if type(event) is c.InteractionEvent and event.interaction.tool_call_id:
            inter = event.interaction
            tool = self._id(inter.agent_id, inter.tool_call_id)
            return c.InteractionEvent(interaction=msgspec.structs.replace(inter, tool_call_id=tool))
        if type(event) is c.SubagentEvent and event.subagent.parent_tool_call_id:
            sub = event.subagent
            return c.SubagentEvent(subagent=msgspec.structs.replace(
                sub, parent_tool_call_id=self._id("", sub.parent_tool_call_id)))
        return event
