"""Paging through a conversation's history, from its journal, without opening it on its runtime.

The seed contract's ``HistoryPager`` reads one agent's recorded transcript a
window at a time, sending nothing and changing nothing. agentd's own record of
a conversation is its journal, so a page is cut from there: reading takes no
lease, starts no runtime, and leaves an idle conversation unloaded.

What a page holds (:class:`agentd.wire.HistoryEntry`):

* the user's prompts (``prompt`` records), as ``user`` items (a runtime's own echo of a
  run's prompt is left out; text steered into a running turn is kept);
* an adopted session's earlier turns (``item`` records outside any run, ids ``import.<id>``,
  agentd.adopt), marked ``imported``;
* the provider's items (``item`` records), each **once**, in the form of its
  latest record and at that record's ``seq`` (a tool call announced, then
  completed, appears where it completed, completed). An item is keyed by
  ``(run, agent_id, id)``: a runtime that reuses its own ids in a later turn
  never makes a later turn's item hide an earlier one.

Cursors are journal sequence numbers (``seq``). ``before=S`` gives the newest
``limit`` entries whose seq is below S, ``after=S`` the oldest ``limit`` above
it (``after=0``: the first page); neither gives the newest page. A page says where the next one starts
(``HistoryPage.before`` / ``HistoryPage.after``) and whether it reached either
end of the record (``start`` / ``end``).

A page holds at most ``limit`` entries and :data:`MAX_PAGE_BYTES` of records (one entry at
least): a page of huge prompts stops early and says where the next starts, so no page is ever
a reply too large for a client to read.

Cost: a page reads the journal through its offset index in windows of seq,
growing from ``limit`` records, so a page near the end of a 100,000-record
journal reads a few hundred lines, not the file (tests/bench/bench_history.py).
Deciding that an item's record is its latest needs the records after it up to
its turn's terminal ``turn`` record (no provider updates an item after its turn
ended), so the look-ahead past a page is at most the rest of one turn.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from . import contract as c
from . import wire

__all__ = ["MAX_LIMIT", "page"]

#: Most entries one page may ask for (``history --limit``).
MAX_LIMIT = 1000
#: A page holds at most this many bytes of records (and always one entry): far below the
#: 64 MiB frame a client reads (wire.CLIENT_MAX_FRAME_BYTES), with room for a page of large
#: prompts (each up to server.max_frame_bytes); the next page starts where it stopped.
MAX_PAGE_BYTES = 16 << 20

_Key = tuple[str, str, str]  # (run, agent_id, item id)


class _Head(msgspec.Struct):
    type: str
    seq: int = 0
    run: str = ""
    data: msgspec.Raw = msgspec.Raw(b"{}")
    #: a turn a rewind dropped (agentd.branching.view marks it)
    dropped: bool = False


class _TurnHead(msgspec.Struct):
    state: c.TurnState


_head = msgspec.json.Decoder(_Head)
_item = msgspec.json.Decoder(c.Item)
_prompt = msgspec.json.Decoder(wire.PromptRecord)
_turn = msgspec.json.Decoder(_TurnHead)


class JournalReader(Protocol):
    """What a page is read from: ``read_after(after, limit)`` gives the encoded records with
    seq > after, oldest first, at most ``limit`` of them (agentd.journal.Journal)."""

    async def read_after(self, after: int, limit: int | None = None) -> list[bytes]: ...


class _Rec(msgspec.Struct):
    seq: int
    run: str
    key: _Key | None
    entry: wire.HistoryEntry | None
    #: the run's terminal turn record
    ends_run: bool = False
    #: the record's length in bytes (an entry's share of a page)
    size: int = 0


def _parse(line: bytes) -> _Rec:
    head = _head.decode(line)
    if head.type == "item":
        item = _item.decode(head.data)
        if item.kind is c.ItemKind.USER and head.run and item.delivery != "steer":
            # The runtime's echo of the run's prompt: the prompt record already holds it.
            return _Rec(head.seq, head.run, None, None)
        # A runtime session's earlier turns, journaled once when it was adopted (agentd.adopt).
        imported = not head.run and item.id.startswith("import.")
        entry = wire.HistoryEntry(seq=head.seq, run=head.run, item=item, imported=imported, dropped=head.dropped,
                                  copied=bytes(head.data).startswith(b'{"copied":'))
        return _Rec(head.seq, head.run, (head.run, item.agent_id, item.id), entry, size=len(line))
    if head.type == "prompt":
        prompt = _prompt.decode(head.data)
        item = c.Item(id=f"prompt-{head.seq}", kind=c.ItemKind.USER, text=prompt.text,
                      attachments=list(prompt.attachments))
        return _Rec(head.seq, head.run, None, wire.HistoryEntry(seq=head.seq, run=head.run, item=item, dropped=head.dropped,
                                                                copied=bytes(head.data).startswith(b'{"copied":')),
                    size=len(line))
    if head.type == "turn" and head.run:
        ends = _turn.decode(head.data).state.terminal
        return _Rec(head.seq, head.run, None, None, ends_run=ends)
    return _Rec(head.seq, head.run, None, None)


async def _read(journal: JournalReader, lo: int, hi: int) -> list[_Rec]:
    """Records with lo < seq < hi, oldest first."""
    if hi <= lo + 1:
        return []
    return [_parse(line) for line in await journal.read_after(lo, limit=hi - lo - 1)]


async def _latest(journal: JournalReader, recs: list[_Rec], last_seq: int, hi: int) -> list[_Rec]:
    """The records of ``recs`` (records with seq < ``hi``) holding an entry that is its item's latest record.

    A record is superseded by a later one of the same key, in ``recs`` or after them: the
    journal past ``hi - 1`` is read only until every run with a candidate item has ended.
    """
    last: dict[_Key, int] = {}
    for rec in recs:
        if rec.key is not None:
            last[rec.key] = rec.seq
    open_runs = {k[0] for k in last}
    for rec in recs:
        if rec.ends_run:
            open_runs.discard(rec.run)
    beyond: set[_Key] = set()
    after, window = hi - 1, 256
    while open_runs and after < last_seq:
        chunk = await _read(journal, after, min(last_seq, after + window) + 1)
        if not chunk:
            break
        for rec in chunk:
            if rec.key is not None and rec.key in last:
                beyond.add(rec.key)
            if rec.ends_run:
                open_runs.discard(rec.run)
        after = chunk[-1].seq
        window *= 2
    return [r for r in recs if r.entry is not None
            and (r.key is None or (last[r.key] == r.seq and r.key not in beyond))]


def _within_bytes(recs: list[_Rec]) -> int:
    """How many of ``recs``, from the first, fit in MAX_PAGE_BYTES (at least one)."""
    total = 0
    for n, rec in enumerate(recs):
        total += rec.size
        if total > MAX_PAGE_BYTES and n:
            return n
    return len(recs)


async def page(journal: JournalReader, conversation: str, last_seq: int, *,
         limit: int = 50, before: int | None = None, after: int | None = None) -> wire.HistoryPage:
    """One page of ``conversation``'s history from ``journal``, whose last published seq is
    ``last_seq``: the oldest ``limit`` entries with seq > ``after`` when it is given, else the
    newest ``limit`` entries with seq < ``before`` (or of all, without it). Read-only; on the
    file store every read answers inline (agentd.store).

    Raises Invalid for a limit outside 1..MAX_LIMIT, for both cursors at once or a cursor out
    of range; the journal's own errors (JournalCorrupt, OSError) for a damaged journal.
    """
    if not 1 <= limit <= MAX_LIMIT:
        raise c.Invalid(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    if before is not None and after is not None:
        raise c.Invalid("give at most one of before and after")
    if (before is not None and before < 1) or (after is not None and after < 0):
        raise c.Invalid("history cursors are journal seqs: before >= 1, after >= 0")
    if after is not None:
        return await _forward(journal, conversation, last_seq, limit, min(after, last_seq))
    hi = min(before, last_seq + 1) if before is not None else last_seq + 1
    return await _backward(journal, conversation, last_seq, limit, hi)


async def _backward(journal: JournalReader, conversation: str, last_seq: int, limit: int, hi: int) -> wire.HistoryPage:
    # Widen the window below hi until it holds `limit` entries or reaches seq 1.
    width = max(64, limit * 4)
    while True:
        lo = max(0, hi - 1 - width)
        recs = await _read(journal, lo, hi)
        kept = await _latest(journal, recs, last_seq, hi)
        if len(kept) > limit or lo == 0:
            break
        width *= 4
    more = len(kept) > limit
    if more:
        kept = kept[-limit:]
    fit = _within_bytes(kept[::-1])  # the newest first
    more = more or fit < len(kept)
    entries = [r.entry for r in kept[len(kept) - fit:] if r.entry is not None]
    # `before` names the oldest entry shown: the next page is what lies below it.
    return wire.HistoryPage(
        conversation=conversation, items=entries,
        before=entries[0].seq if more and entries else 0,
        after=max(hi - 1, 0) if hi <= last_seq else 0,
        start=not more, end=hi > last_seq)


async def _forward(journal: JournalReader, conversation: str, last_seq: int, limit: int, after: int) -> wire.HistoryPage:
    width = max(64, limit * 4)
    while True:
        hi = min(last_seq, after + width) + 1
        recs = await _read(journal, after, hi)
        kept = await _latest(journal, recs, last_seq, hi)
        if len(kept) > limit or hi > last_seq:
            break
        width *= 4
    more = len(kept) > limit
    if more:
        kept = kept[:limit]
    fit = _within_bytes(kept)
    more = more or fit < len(kept)
    entries = [r.entry for r in kept[:fit] if r.entry is not None]
    # `after` names the newest entry shown: the next page is what lies above it.
    return wire.HistoryPage(
        conversation=conversation, items=entries,
        before=after + 1 if after > 0 else 0,
        after=entries[-1].seq if more and entries else 0,
        start=after == 0, end=not more)
