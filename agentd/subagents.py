"""Subagents: the agents a conversation's main agent delegated work to, listed and controlled.

Rules (the seed contract's ``Subagent``, ``CancelSubagent`` and ``PromptSubagent``):

* The list is read from the journal, where every ``subagent`` record the provider
  reported is kept (latest record per agent id wins): it takes no lease, starts no
  runtime, and shows subagents of earlier turns and of a daemon since restarted.
  Subagents of runs a rewind dropped are left out (agentd.branching).
* ``cancel`` stops exactly one agent instance; its final status arrives from the
  provider as a ``subagent`` record. ``prompt`` sends text to one idle instance;
  it is not a turn, the main agent does not see it.
* Each is capability-gated (``cancel_subagent``, ``prompt_subagent``): a provider
  that cannot do it answers ``unsupported`` before anything is sent. An agent id the
  journal does not know is ``not_found``; prompting an agent that is not idle, or
  cancelling one that already ended, is ``invalid``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from . import contract as c
from . import wire

if TYPE_CHECKING:
    from collections.abc import Callable

    from .conversations import ConversationService

__all__ = ["cancel", "listing", "prompt"]


class _Head(msgspec.Struct):
    type: str
    run: str = ""
    data: msgspec.Raw = msgspec.Raw(b"{}")


_head = msgspec.json.Decoder(_Head)
_subagent = msgspec.json.Decoder(c.Subagent)


async def _known(service: "ConversationService", ref: str) -> tuple[str, list[c.Subagent]]:
    from .store import scan

    reader = await service.reader(ref)
    dropped = set(reader.record.dropped)
    latest: dict[str, c.Subagent] = {}
    # The whole journal is read, a chunk at a time: subagent records are few, and nothing else keeps them.
    async for lines in scan(reader.journal, reader.published_seq):
        for line in lines:
            if b'"subagent"' not in line:
                continue
            head = _head.decode(line)
            # A run a rewind dropped is out of the conversation: its subagents are neither listed nor
            # merged with a later run's that reuses an id.
            if head.type == "subagent" and head.run not in dropped:
                sub = _subagent.decode(head.data)
                latest.pop(sub.id, None)  # re-inserted: the list is in order of the latest report
                latest[sub.id] = sub
    return reader.record.id, list(latest.values())


async def listing(service: "ConversationService", ref: str) -> wire.SubagentList:
    """The subagents conversation ``ref``'s journal records, each with its latest status.

    Raises NotFound. Sends nothing and opens nothing.
    """
    cid, subs = await _known(service, ref)
    return wire.SubagentList(conversation=cid, subagents=subs)


async def _target(service: "ConversationService", ref: str, agent: str, capability: str,
                  check: Callable[[c.Subagent], None]) -> tuple[c.Subagent, c.SubagentController]:
    """The subagent and the conversation that controls it; ``check`` refuses by its status
    (journaled) before anything else is asked of the conversation (opened or not)."""
    cid, subs = await _known(service, ref)
    live = await service.live(cid, open_only=True)
    if not getattr((await service.runtimes.get(live.record.provider)).capabilities(), capability):
        raise c.Unsupported(f"provider {live.record.provider!r} cannot {capability.replace('_', ' ')}")
    found = next((s for s in subs if s.id == agent), None)
    if found is None:
        raise c.NotFound(f"no subagent {agent!r} in conversation {cid}; agentctl subagents {cid} lists them")
    check(found)
    conv = live.conv
    if conv is None or not isinstance(conv, c.SubagentController):
        raise c.Invalid(f"subagent {agent!r} is {found.status.value}, but its conversation's runtime is not "
                        "running now (it was released or restarted): the runtime no longer holds it")
    return found, conv


def _ended(sub: c.Subagent) -> None:
    if sub.status.terminal:
        raise c.Invalid(f"subagent {sub.id!r} already ended ({sub.status.value})")


def _idle(sub: c.Subagent) -> None:
    if sub.status is not c.SubagentStatus.IDLE:
        raise c.Invalid(f"subagent {sub.id!r} is {sub.status.value}, not idle; only an idle one takes a prompt")


async def cancel(service: "ConversationService", ref: str, agent: str) -> None:
    """Stop only subagent ``agent`` of ``ref``. Raises NotFound, Unsupported, Closed, Invalid
    (it already ended)."""
    _, conv = await _target(service, ref, agent, "cancel_subagent", _ended)
    await conv.cancel_subagent(agent)


async def prompt(service: "ConversationService", ref: str, agent: str, text: str) -> None:
    """Send ``text`` to idle subagent ``agent`` of ``ref``. Raises NotFound, Unsupported, Closed,
    Invalid (empty text, or the subagent is not idle), SubmissionUncertain."""
    if not text.strip():
        raise c.Invalid("the prompt is empty")
    _, conv = await _target(service, ref, agent, "prompt_subagent", _idle)
    await conv.prompt_subagent(agent, text)
