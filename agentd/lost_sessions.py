"""A runtime that lost a conversation's session: go on in a fresh one, or say its context is gone.

A runtime keeps a conversation's context itself (Copilot's session state, Claude Code's
transcript, a Codex thread, an ACP agent's session store) and saves it when it chooses: the
Copilot CLI in ACP mode, SIGKILLed while its first turn streams, may not have written the
session yet, and the restarted runtime then answers the reopen "not found". agentd's journal
still holds everything, and the conversation record maps agentd's id to the runtime's
(``provider_conversation_id``), so agentd's id never has to be the runtime's.

A runtime killed while it wrote the session can also leave it unreadable: codex-acp then answers
the reload "empty session file". The provider raises SessionUnreadable for any error answer to a
reopen that is not "not found" (a timeout or a crash stays RuntimeUnavailable).

The rules, applied by :func:`reopen_lost` (agentd.conversations calls it when a provider's reopen
raised ConversationNotFound or SessionUnreadable; it is the same for every provider):

* Nothing the runtime could have kept is lost when the journal shows it never held context: no
  turn completed (outside runs a rewind dropped) and the conversation was neither imported from
  nor forked by the runtime. Then a fresh runtime session replaces the lost one: the same agentd
  conversation, id and journal; the new runtime id is saved in the record (before any prompt
  reaches it, so a daemon that dies right after reopens that one); a notice item says so.
* Otherwise the runtime's context of those turns is gone for good. Going on in a fresh session
  would answer a prompt written for that context without it (a script may never read a notice),
  so nothing is made: NotFound says what was lost and what the user can do (the journal stays
  readable; a new conversation starts afresh). An unreadable session with context is not known
  to be gone (the runtime's error may pass): its SessionUnreadable is raised as it is, nothing
  changes, and the next prompt tries the reopen again.
* A prompt is never resent: this runs before the prompt reaches any runtime, and the fresh
  session gets only the prompt that asked for the reopen, once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec
import structlog
import trio

from . import contract as c
from . import wire

if TYPE_CHECKING:
    from .conversations import ConversationService, _Live
    from .store import Journal

log = structlog.get_logger("agentd.lost_sessions")

#: journal lines read at a time while looking for context the runtime held
CHUNK = 512

_head = msgspec.json.Decoder(wire.Record)


class _TurnState(msgspec.Struct):
    state: str = ""


_turn = msgspec.json.Decoder(_TurnState)


async def held_context(journal: "Journal", dropped: "list[str]", upto: int) -> str:
    """Why the runtime held context of this conversation, by the journal's records 1..``upto``:
    "N completed turn(s)", "an imported session", "a fork of a session", or "" (none).

    Reads ``CHUNK`` lines at a time (a checkpoint between them). Raises JournalCorrupt, OSError.
    """
    completed, after = 0, 0
    skip = set(dropped)
    while after < upto:
        lines = await journal.read_after(after, limit=min(CHUNK, upto - after))
        if not lines:
            break
        for line in lines:
            after += 1
            # Cheap filter first: a journal is mostly items and deltas of big texts.
            if b'"import"' in line or b'"forked"' in line:
                head = _head.decode(line)
                if head.type == "import":
                    return "an imported session"
                if head.type == "forked":
                    return "a fork of a session"
            if b'"turn"' in line and b'"completed"' in line:
                head = _head.decode(line)
                if head.type == "turn" and head.run not in skip and _turn.decode(head.data).state == "completed":
                    completed += 1
        await trio.lowlevel.checkpoint()
    if completed:
        return f"{completed} completed turn{'s' if completed != 1 else ''}"
    return ""


async def reopen_lost(
    service: "ConversationService", live: "_Live", request: c.OpenRequest,
    lost: c.ConversationNotFound | c.SessionUnreadable,
) -> c.Conversation:
    """Open a fresh runtime session for ``live`` in place of the one its runtime lost or cannot read
    (``lost``: the reopen's error), when the journal shows the runtime held no context of it (see
    the rules above).

    Saves the new runtime id in the record, then emits a notice item through the conversation's
    sink. Raises NotFound when the runtime's context is gone, ``lost`` itself when it is a
    SessionUnreadable and the runtime held context (nothing is opened in either case),
    InternalError when the record cannot be saved (the fresh session is closed again), and what
    ``Provider.open`` raises.
    """
    record = live.record
    old = record.provider_conversation_id
    why = await held_context(live.journal, record.dropped, live.journal.last_seq)
    if why and isinstance(lost, c.SessionUnreadable):
        log.warning("conversation.runtime_session_unreadable", conversation=record.id, provider=record.provider,
                    runtime_session=old, held=why, error=lost.message)
        raise lost
    if why:
        log.warning("conversation.runtime_context_lost", conversation=record.id, provider=record.provider,
                    runtime_session=old, held=why, error=lost.message)
        raise c.NotFound(
            f"{record.provider} no longer has this conversation's session {old!r} ({lost.message}), which held "
            f"its context of {why}: that context is lost and agentd does not replay it. The journal is kept "
            f"(agentctl history / export {record.id}); continue in a new conversation (agentctl new)")
    conv = await service.runtimes.open(record.provider, msgspec.structs.replace(request, conversation_id=""),
                                       live.sink)
    record.provider_conversation_id = conv.id
    try:
        service.save_record(record)
    except OSError as exc:
        record.provider_conversation_id = old
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await conv.close()
        raise c.InternalError(f"cannot write the conversation record: {exc.strerror or exc}") from None
    log.warning("conversation.runtime_session_replaced", conversation=record.id, provider=record.provider,
                lost=old, fresh=conv.id, error=lost.message)
    live.sink.emit(c.ItemEvent(item=c.Item(
        id=f"notice-session-{conv.id}", kind=c.ItemKind.NOTICE, time=c.utcnow(),
        text=(f"{record.provider} no longer had its session {old!r} of this conversation, or could not read it "
              f"back ({lost.message}). "
              f"No turn of it had completed, so nothing it kept is lost: agentd goes on in a new session "
              f"{conv.id!r}. The prompts of the earlier unfinished turns are not in it (none is resent).")),
    ))
    return conv
