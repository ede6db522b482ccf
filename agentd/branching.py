"""Fork and rewind: branching a conversation off one of its turns, and going back to one.

The seed contract's ``Forker`` and ``HistoryRewinder``. Rules kept here:

* Only the runtime's own operation does it (a Claude Code session fork / resume at a
  message, Codex ``thread/fork`` / ``thread/revert``, ...). A provider that has none says
  ``fork`` / ``rewind`` false in its capabilities and the op answers ``unsupported``.
  Nothing is ever replayed: no prompt is sent again, to the new conversation or the old.
* A turn is named by its run. The runtime's handle for it is the ``marker`` its terminal
  ``turn`` record carries (``Turn.marker``); a run without one (it never reached the
  runtime, or was recorded before markers existed) cannot be forked at or rewound to.
* The journal stays append-only. A fork's journal begins with a ``forked`` record naming
  the source conversation, run and seq; the source's records up to that turn follow, each
  payload carrying a ``copied`` key ``{conversation, seq}`` that names its original. A
  rewind appends a ``rewind`` record naming the run kept and the runs dropped, and the
  conversation record lists the dropped runs (``ConversationRecord.dropped``): history,
  tail, attach and export leave their records out unless asked for ``all``, then each is
  marked ``dropped``.
* A rewind is refused ``busy`` while a turn runs, and holds the conversation's send lock
  while it works, so no prompt starts meanwhile. ``preview`` reads and changes nothing.
* An outcome the runtime left unknown (``SubmissionUncertain``) is surfaced, never retried:
  the conversation's journal gets an ``error`` record (code ``uncertain``) and nothing else.

The conversation service stays the turn state machine: this module reads its records and
journals through the narrow surface it offers (``reader``, ``live``, ``published_lines``,
``open_conversation``, ``journal``, ``note``, ``save_record``, ``adopt``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
import trio

from . import contract as c
from . import wire
from .titles import fork_title, user_title

if TYPE_CHECKING:
    from .conversations import ConversationService

__all__ = ["fork", "rewind", "view", "turns"]

#: Record types a fork copies (with their run): the transcript and how its turns went, and the
#: checkpoints of its turns (the fork shares the working directory: diff and revert of a copied turn).
#: Spend (usage, tokens), leases, budgets and states belong to the source alone.
COPIED_TYPES = frozenset({"prompt", "item", "turn", "interaction", "answer", "subagent", "unknown", "model_selection",
                          "checkpoint"})

_json = msgspec.json.Encoder()
log = structlog.get_logger("agentd.branching")


class _Head(msgspec.Struct):
    type: str = ""
    seq: int = 0
    run: str = ""
    data: msgspec.Raw = msgspec.Raw(b"{}")


class _TurnEnd(msgspec.Struct):
    state: c.TurnState = c.TurnState.WORKING
    marker: str = ""


class _Prompt(msgspec.Struct):
    text: str = ""
    disposition: str = "started"


class _RunOnly(msgspec.Struct):
    run: str = ""


_head = msgspec.json.Decoder(_Head)
_turn_end = msgspec.json.Decoder(_TurnEnd)
_prompt = msgspec.json.Decoder(_Prompt)
_run_only = msgspec.json.Decoder(_RunOnly)


class Turn(msgspec.Struct):
    """One run of a conversation as read from its journal."""

    run: str
    #: seq of its terminal ``turn`` record (0 while it runs)
    end_seq: int = 0
    state: str = ""
    marker: str = ""
    prompt: str = ""

    def brief(self) -> wire.BranchRun:
        first = next((ln for ln in self.prompt.splitlines() if ln.strip()), "")
        return wire.BranchRun(run=self.run, seq=self.end_seq, state=self.state, prompt=wire.clip(first, 80))


def turns(lines: Iterable[bytes], dropped: Collection[str] = ()) -> list[Turn]:
    """The runs of journal ``lines`` in the order they began, those in ``dropped`` left out."""
    out: dict[str, Turn] = {}
    for line in lines:
        head = _head.decode(line)
        run = head.run
        if not run or run in dropped:
            continue
        if head.type == "prompt":
            p = _prompt.decode(head.data)
            t = out.get(run)
            if t is None:
                out[run] = Turn(run=run, prompt=p.text)
            elif not t.prompt:
                t.prompt = p.text
        elif head.type == "turn":
            end = _turn_end.decode(head.data)
            t = out.setdefault(run, Turn(run=run))
            if end.state.terminal and not t.end_seq:
                t.end_seq, t.state, t.marker = head.seq, end.state.value, end.marker
    return list(out.values())


def is_turn_number(ref: str) -> bool:
    """Whether ``ref`` is a turn number N (ASCII digits) rather than a run id, which begins with a letter."""
    return ref.isascii() and ref.isdigit()  # str.isdigit also takes '²', which int() refuses


def numbered(runs: list[Turn], ref: str, cid: str) -> Turn | None:
    """The turn ``ref`` names when it is a turn number N (the Nth of ``runs``, 1 the first:
    :func:`is_turn_number`), else None. Raises NotFound for a number past the last turn."""
    if not is_turn_number(ref):
        return None
    n = int(ref)
    if not 1 <= n <= len(runs):
        raise c.NotFound(f"conversation {cid} has {len(runs)} turn(s), no turn {n}")
    return runs[n - 1]


def _find(runs: list[Turn], ref: str, dropped: Collection[str], cid: str) -> Turn:
    """The run ``ref`` names among ``runs``: an exact run id, a unique prefix of one, or a turn
    number N (:func:`numbered`, of the rewound view)."""
    if (turn := numbered(runs, ref, cid)) is not None:
        return turn
    exact = [t for t in runs if t.run == ref]
    found = exact or [t for t in runs if t.run.startswith(ref)]
    if not found:
        if any(r == ref or r.startswith(ref) for r in dropped):
            raise c.Invalid(f"run {ref!r} of {cid} was dropped by a rewind")
        raise c.NotFound(f"conversation {cid} has no run {ref!r}")
    if len(found) > 1:
        raise c.Invalid(f"run {ref!r} is ambiguous: {', '.join(t.run for t in found[:5])}")
    return found[0]


def _usable(t: Turn, cid: str, what: str) -> None:
    if not t.end_seq:
        raise c.Busy(f"run {t.run} of {cid} is still running; {what} a turn that ended")
    if not t.marker:
        raise c.Invalid(f"run {t.run} of {cid} has no point its runtime named (it {t.state} before reaching "
                        f"the runtime, or was recorded by an older agentd); {what} another turn")


def _copy(line: bytes, source: str) -> tuple[str, bytes, str] | None:
    """(type, payload with its ``copied`` key, run) of a source record a fork copies, else None."""
    head = _head.decode(line)
    if head.type not in COPIED_TYPES or not head.run:
        return None
    payload = msgspec.json.decode(head.data)
    if not isinstance(payload, dict):
        return None
    payload.pop("copied", None)  # a copy of a copy names the conversation it came from last
    payload = {"copied": {"conversation": source, "seq": head.seq}, **payload}
    return head.type, _json.encode(payload), head.run


async def fork(service: "ConversationService", ref: str, at: str = "", *, title: str = "") -> wire.ForkResult:
    """A new conversation holding ``ref``'s history up to and including run ``at`` (default: the
    last completed turn), made by the provider's own fork; the source is not opened.

    Returns the new record, where it branched off and what it holds. Raises NotFound (no such
    conversation or run), Invalid (a run dropped by a rewind, or with no runtime marker),
    Busy (that run still runs), Unsupported (the provider cannot fork), SubmissionUncertain
    (the runtime may have made a fork whose id was lost: never retried), InternalError.
    """
    title = user_title(title)
    reader = await service.reader(ref)
    record = reader.record
    title = title or fork_title(record.title)
    cid = record.id
    provider = await service.runtimes.get(record.provider)
    if not provider.capabilities().fork or not isinstance(provider, c.Forker):
        raise c.Unsupported(f"provider {record.provider!r} cannot fork a conversation")
    lines = await service.published_lines(reader)
    runs = turns(lines, record.dropped)
    if at:
        target = _find(runs, at, record.dropped, cid)
    else:
        done = [t for t in runs if t.state == c.TurnState.COMPLETED.value]
        if not done:
            raise c.Invalid(f"conversation {cid} has no completed turn to fork at")
        target = done[-1]
    _usable(target, cid, "fork at")
    if not record.provider_conversation_id:
        raise c.Invalid(f"conversation {cid} was never opened on its runtime")
    request = c.OpenRequest(workdir=record.workdir, title=title, model=record.model,
                            effort=record.effort, context_tier=record.context_tier)
    try:
        new_id = await provider.fork(record.provider_conversation_id, target.marker, request)
    except c.SubmissionUncertain as exc:
        await _uncertain(service, cid, exc)
        raise
    kept = {t.run for t in runs[: runs.index(target) + 1]}
    copies = []
    for line in lines:
        head = _run_only.decode(line)
        if head.run not in kept:
            continue
        copy = _copy(line, cid)
        if copy is not None and _head.decode(line).seq <= target.end_seq:
            copies.append(copy)
    forked = wire.ForkedRecord(source=cid, run=target.run, seq=target.end_seq, provider=record.provider,
                               provider_conversation_id=record.provider_conversation_id)
    try:
        new = await service.adopt(
            provider=record.provider, workdir=record.workdir, title=title, model=record.model,
            effort=record.effort, mode=record.mode, budget=record.budget, provider_conversation_id=new_id,
            forked_from=cid, forked_at=target.run, context_tier=record.context_tier,
            mcp=list(record.mcp) if record.mcp is not None else None,
            first=("forked", _json.encode(forked), ""), records=copies)
    except BaseException as exc:
        # The runtime's fork exists but agentd keeps no conversation of it: say which, once.
        log.error("fork.adopt_failed", conversation=cid, run=target.run, provider=record.provider,
                  provider_conversation_id=new_id, error=getattr(exc, "message", None) or str(exc))
        raise
    await _copy_outputs(service, cid, new.id, copies)
    log.info("fork.made", conversation=cid, run=target.run, fork=new.id, copied=len(copies))
    return wire.ForkResult(conversation=new, source=cid, run=target.run, seq=target.end_seq, copied=len(copies),
                           turns=[t.brief() for t in runs if t.run in kept])


class _ToolItem(msgspec.Struct):
    id: str = ""
    agent_id: str = ""
    tool: dict[str, Any] | None = None


_tool_item = msgspec.json.Decoder(_ToolItem)


async def _copy_outputs(service: "ConversationService", source: str, fork_id: str,
                        copies: list[tuple[str, bytes, str]]) -> None:
    """Give the fork the whole outputs the source keeps of the tool items it copied (their records
    carry only a display cut, agentd.tool_outputs). A failure is logged: the fork stands, and its
    records' cut still says what is missing."""
    items: dict[tuple[str, str], None] = {}
    for type_, data, _run in copies:
        if type_ == "item":
            try:
                item = _tool_item.decode(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            if item.tool and item.tool.get("cut"):
                items[(item.agent_id, item.id)] = None
    if not items:
        return
    try:
        n = await trio.to_thread.run_sync(service.tool_outputs.copy, source, fork_id, list(items))
    except (OSError, ValueError) as exc:
        log.error("fork.tool_outputs_not_copied", conversation=source, fork=fork_id, error=str(exc))
        return
    log.info("fork.tool_outputs_copied", conversation=source, fork=fork_id, outputs=n)


async def rewind(service: "ConversationService", ref: str, to: str, *, preview: bool = False) -> wire.RewindResult:
    """Discard ``ref``'s turns after run ``to`` in its runtime (the provider's own rewind) and in
    agentd's view; ``preview`` says what would be dropped and changes nothing.

    Appends a ``rewind`` record and lists the dropped runs in the conversation record. Raises
    NotFound, Invalid (a dropped run, no marker, nothing after it), Busy (a turn runs),
    Closed, Unsupported, SubmissionUncertain (the runtime's outcome is unknown: nothing is
    recorded, never retried), InternalError.
    """
    if preview:
        # Reads only: no lease is taken and nothing is journaled (a closed one is not loaded either).
        reader = await service.reader(ref)
        _rewindable(reader.record, reader.record.active_run)
        await _can_rewind(service, reader.record)
        return _plan(reader.record, turns(await service.published_lines(reader), reader.record.dropped), to)[2]
    live = await service.live(ref, open_only=True)  # a closed one is refused before it is loaded
    record = live.record
    cid = record.id
    _rewindable(record, live.run)
    await _can_rewind(service, record)
    async with live.send_lock:
        _rewindable(record, live.run)
        target, dropped, result = _plan(record, turns(await service.published_lines(live), record.dropped), to)
        conv = await service.open_conversation(live)
        if record.state is wire.ConversationState.CLOSED:
            await service.detach(live)  # closed while it was opened: close() found nothing open to close
            _rewindable(record, "")
        if not isinstance(conv, c.Rewinder):
            raise c.Unsupported(f"provider {record.provider!r} cannot rewind a conversation")
        try:
            await conv.rewind(target.marker)
        except c.SubmissionUncertain as exc:
            await _uncertain(service, cid, exc)
            raise
        record.dropped = [*record.dropped, *(t.run for t in dropped)]
        service.save_record(record)
        rec = wire.RewindRecord(kept=target.run, seq=target.end_seq, dropped=[t.run for t in dropped])
        seq = await service.journal(live, "rewind", _json.encode(rec))
        log.info("rewind.made", conversation=cid, kept=target.run, dropped=rec.dropped)
        return msgspec.structs.replace(result, preview=False, seq=seq)


def _rewindable(record: wire.ConversationRecord, run: str) -> None:
    """Raise Closed or Busy unless conversation ``record`` can be rewound now."""
    if record.state is wire.ConversationState.CLOSED:
        raise c.Closed(f"conversation {record.id} is closed")
    if run:
        raise c.Busy(f"a turn is running in {record.id} (run {run}); rewind after it ends "
                     f"(or agentctl cancel {record.id})")


async def _can_rewind(service: "ConversationService", record: wire.ConversationRecord) -> None:
    if not (await service.runtimes.get(record.provider)).capabilities().rewind:
        raise c.Unsupported(f"provider {record.provider!r} cannot rewind a conversation")


def _plan(record: wire.ConversationRecord, runs: list[Turn], to: str) -> tuple[Turn, list[Turn], wire.RewindResult]:
    """Rewinding ``record`` (whose runs are ``runs``) to run ``to``: the run kept, the runs dropped,
    and the preview saying so. Raises NotFound, Invalid (see :func:`rewind`)."""
    cid = record.id
    target = _find(runs, to, record.dropped, cid)
    _usable(target, cid, "rewind to")
    dropped = runs[runs.index(target) + 1:]
    if not dropped:
        raise c.Invalid(f"run {target.run} is the last turn of {cid}: there is nothing to rewind")
    preview = wire.RewindResult(conversation=cid, kept=target.brief(), dropped=[t.brief() for t in dropped],
                                preview=True)
    return target, dropped, preview


async def _uncertain(service: "ConversationService", cid: str, exc: c.SubmissionUncertain) -> None:
    """Journal that a fork or rewind may or may not have happened (an ``error`` record, code
    ``uncertain``), as for a prompt: surfaced, never retried."""
    try:
        await service.note(cid, "error", _json.encode(wire.ErrorRecord(code=exc.code, message=exc.message)))
    except c.AgentdError as err:
        log.error("branching.uncertain_not_journaled", conversation=cid, error=err.message)


# --------------------------------------------------------------------------- the rewound view


def view(lines: list[bytes], dropped: Collection[str], all_: bool = False) -> list[bytes]:
    """``lines`` without the records of ``dropped`` runs; with ``all_``, those too, each with
    ``"dropped": true`` added (wire.Record.dropped). Cheap when nothing was dropped."""
    if not dropped:
        return lines
    out = []
    for line in lines:
        if _run_only.decode(line).run in dropped:
            if all_:
                out.append(line[:-1] + b',"dropped":true}')
        else:
            out.append(line)
    return out
