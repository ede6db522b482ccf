"""Adopting a runtime's earlier sessions: list them, and bind a new conversation to one.

A runtime keeps sessions of its own, made before agentd or beside it (the Copilot CLI's
session store, Claude Code's project transcripts, an ACP agent's ``session/list``, Codex's
threads). The seed contract's ``Importer`` lists them per folder and tells which another
client holds open; this room turns that into two operations:

* :func:`candidates` lists the sessions recorded for a folder, newest first, each with
  ``in_use`` true, false or ``"unknown"`` (the provider has no ``in_use`` check). Sessions
  an agentd conversation is already bound to are left out: they are not "outside agentd".
* :func:`adopt` makes a new conversation bound to exactly one of them. It is refused
  ``busy`` while another client holds the session (unless ``force``), ``not_found`` when
  the runtime no longer lists it or cannot resume it; then nothing is left behind: agentd
  never creates a replacement session and never sends a prompt. Once the provider resumed
  the session, its earlier turns (the provider conversation's ``history()``) are journaled
  **once**, right after an ``import`` record, as ``item`` records outside any run whose ids
  are ``import.<runtime id>`` (agentd.history marks them ``imported``). A provider that
  resumes a session but cannot show its past (``history()`` is Unsupported) journals none
  and says so (``history: false``). The next prompt goes to the same runtime session, which
  carries the earlier turns to the model itself.

Rules kept: capability-gated (``Capabilities.import_``; otherwise ``unsupported``); the
conversation service gets one narrow hook (``create(provider_conversation_id=...)``).
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import TYPE_CHECKING, Any

import msgspec

from . import _fsutil, runtime_output
from . import contract as c
from . import wire
from .titles import runtime_title

if TYPE_CHECKING:
    from .conversations import ConversationService

__all__ = ["IMPORT_PREFIX", "adopt", "candidates"]

#: Item ids of a session's earlier turns start with this.
IMPORT_PREFIX = "import."

_json = runtime_output.encoder
_UNKNOWN = "this runtime does not say whether another client holds a session open (unknown)"


_utc = runtime_output.utc


def _time(value: _dt.datetime | None) -> str:
    value = _utc(value)
    return "" if value is None else value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _check_workdir(workdir: str) -> str:
    if not os.path.isabs(workdir) or not os.path.isdir(workdir):
        raise c.Invalid(f"workdir {workdir!r} is not an existing absolute directory")
    return os.path.normpath(workdir)


def _here_only(sessions: list[c.PreviousConversation], workdir: str) -> list[c.PreviousConversation]:
    """The ``sessions`` recorded for ``workdir`` itself (same real path) or for no folder: a runtime
    that names another folder must not get it (the conversation is confined to ``workdir``)."""
    real = _fsutil.real_path(workdir)
    return [msgspec.structs.replace(s, workdir=workdir) for s in sessions
            if not s.workdir or (real is not None and _fsutil.real_path(s.workdir) == real)]


async def _previous(prov: Any, workdir: str) -> list[c.PreviousConversation]:
    import trio

    sessions = await prov.previous(workdir)
    return await trio.to_thread.run_sync(_here_only, sessions, workdir)


async def _importer(service: "ConversationService", provider: str) -> Any:
    """The provider, when it can list and resume its sessions; NotFound, Unsupported otherwise."""
    prov = await service.runtimes.get(provider)
    if not prov.capabilities().import_:
        await prov.check()  # an ACP agent's capabilities are known once it started (RuntimeUnavailable)
    if not prov.capabilities().import_ or not hasattr(prov, "previous"):
        raise c.Unsupported(f"provider {provider!r} cannot list or resume the sessions its runtime keeps")
    return prov


def _bound(service: "ConversationService", provider: str) -> dict[str, str]:
    """Runtime session id -> the agentd conversation bound to it, for ``provider``."""
    return {r.provider_conversation_id: r.id for r in service.list(include_closed=True)
            if r.provider == provider and r.provider_conversation_id}


async def _in_use(prov: Any, ids: list[str]) -> dict[str, wire.InUse]:
    check = getattr(prov, "in_use", None)
    if check is None or not ids:
        return {i: "unknown" for i in ids}
    held = await check(ids)
    return {i: i in held for i in ids}


async def candidates(service: "ConversationService", provider: str, workdir: str) -> wire.ImportListResult:
    """The sessions ``provider``'s runtime recorded for ``workdir`` that no agentd conversation
    is bound to, newest first (by last update, else creation).

    Raises NotFound (unknown provider), Unsupported (no import capability; also an agent
    that does not list), Invalid (workdir not an absolute directory), RuntimeUnavailable.
    """
    workdir = _check_workdir(workdir)
    prov = await _importer(service, provider)
    bound = _bound(service, provider)
    sessions = [s for s in await _previous(prov, workdir) if s.id not in bound]
    busy = await _in_use(prov, [s.id for s in sessions])
    epoch = _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)

    def newest(s: c.PreviousConversation) -> _dt.datetime:
        return _utc(s.updated_at) or _utc(s.created_at) or epoch

    sessions.sort(key=newest, reverse=True)
    return wire.ImportListResult(
        provider=provider, workdir=workdir,
        in_use_check=getattr(prov, "in_use_check", "") or _UNKNOWN,
        sessions=[wire.ImportCandidate(id=s.id, in_use=busy[s.id], title=runtime_title(s.title),
                                       workdir=workdir, created_at=_time(s.created_at),
                                       updated_at=_time(s.updated_at)) for s in sessions])


def _imported_items(items: list[c.Item]) -> list[c.Item]:
    """``items`` with ids ``import.<runtime id>``, each id once (a reused one gets ``#2``, ...), their
    text and tool input and output cut at runtime_output.MAX_ITEM_TEXT_CHARS (so each record fits the
    frame a client reads) and their times in UTC (None where a time has no UTC value)."""
    cut = runtime_output.cut_text
    seen: dict[tuple[str, str], int] = {}
    out: list[c.Item] = []
    for item in items:
        key = (item.agent_id, item.id)
        n = seen.get(key, 0) + 1
        seen[key] = n
        tool = item.tool and msgspec.structs.replace(item.tool, input=cut(item.tool.input), output=cut(item.tool.output))
        out.append(msgspec.structs.replace(item, id=f"{IMPORT_PREFIX}{item.id}" + (f"#{n}" if n > 1 else ""),
                                           text=cut(item.text), tool=tool, time=_utc(item.time),
                                           ended_at=_utc(item.ended_at)))
    return out


async def adopt(service: "ConversationService", provider: str, session: str, workdir: str, *,
                force: bool = False) -> wire.ImportResult:
    """A new conversation bound to ``provider``'s runtime session ``session`` (listed for
    ``workdir``), with its earlier turns journaled; see the module docstring.

    Returns once the provider resumed the session and its past is journaled. Raises NotFound
    (unknown provider; the runtime lists no such session for workdir, or cannot resume it),
    Busy (another client holds it open and not ``force``; another request adopts it now), Invalid (bad workdir; the session is
    already an agentd conversation), Unsupported, RuntimeUnavailable, InternalError (disk).
    Whatever fails after the conversation was made removes it again.
    """
    workdir = _check_workdir(workdir)
    prov = await _importer(service, provider)
    if not session:
        raise c.Invalid("give the id of the runtime session to adopt")
    key = (id(service), provider, session)
    if key in _adopting:
        raise c.Busy(f"{provider} session {session} is being adopted by another request")
    _adopting.add(key)
    try:
        return await _adopt(service, prov, provider, session, workdir, force)
    finally:
        _adopting.discard(key)


#: (service, provider, session) of adoptions under way: a second one at once would bind two
#: conversations to one session
_adopting: set[tuple[int, str, str]] = set()


async def _adopt(service: "ConversationService", prov: Any, provider: str, session: str, workdir: str,
                 force: bool) -> wire.ImportResult:
    if (cid := _bound(service, provider).get(session)) is not None:
        raise c.Invalid(f"session {session} is already agentd conversation {cid}", details={"conversation": cid})
    found = next((s for s in await _previous(prov, workdir) if s.id == session), None)
    if found is None:
        raise c.NotFound(f"{provider} has no session {session!r} recorded for {workdir} "
                         "(agentctl import --provider P --cwd DIR lists them)")
    in_use = (await _in_use(prov, [session]))[session]
    if in_use is True and not force:
        raise c.Busy(f"another client holds {provider} session {session} open; adopting it now could mix "
                     "two writers: close it there, or pass --force", details={"session": session})
    # the folder asked for, never the runtime's: agentd confines the conversation's files to it
    record = await service.create(provider=provider, workdir=workdir, provider_conversation_id=session)
    try:
        live = await service.live(record.id)
        conv = await service.open_conversation(live)
        try:
            items, history = _imported_items((await conv.history()).items), True
        except c.Unsupported:
            items, history = [], False
        title = runtime_title(found.title)
        await service.journal(live, "import", _json.encode(wire.ImportRecord(
            provider=provider, session=session, in_use=in_use, items=len(items), history=history,
            forced=force and in_use is True, title=title)))
        for item in items:
            await service.journal(live, "item", _json.encode(item))
        if title and not record.title:
            record.title, record.title_source = title, "provider"
            await service.journal(live, "title", _json.encode(title))
            service.save_record(record)
    except BaseException:
        import trio

        with trio.CancelScope(shield=True):
            try:
                await service.delete(record.id)
            except Exception:
                pass
        raise
    return wire.ImportResult(conversation=record, session=session, in_use=in_use, items=len(items), history=history)
