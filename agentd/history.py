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
A window holds at most :data:`WINDOW_BYTES` of records besides its first: where
``limit`` records are more than that (items near the 10 Mi-character cap), the
window is narrowed to its part nearest the cursor and the page ends there, with a
cursor to the next (it may then hold fewer than ``limit`` entries, or none but a
cursor).
Deciding that an item's record is its latest needs the records after it up to
its turn's terminal ``turn`` record (no provider updates an item after its turn
ended), so the look-ahead past a page is at most the rest of one turn; it is
read :data:`GLANCE_BYTES` at a time, keeping only ids.

A rewind's dropped runs (``dropped``) are left out, or with ``all_`` shown
marked ``dropped`` (agentd.branching). A record whose payload does not decode (a
journal damaged by hand) is skipped and logged, as export skips it.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import msgspec
import structlog

from . import contract as c
from . import wire

log = structlog.get_logger("agentd.history")

__all__ = ["MAX_LIMIT", "page"]

#: Most entries one page may ask for (``history --limit``).
MAX_LIMIT = 1000
#: A page holds at most this many bytes of records (and always one entry): far below the
#: 64 MiB frame a client reads (wire.CLIENT_MAX_FRAME_BYTES), with room for a page of large
#: prompts (each up to server.max_frame_bytes); the next page starts where it stopped.
MAX_PAGE_BYTES = 16 << 20
#: A window of records a page is cut from holds at most this many bytes of them (and always
#: one record): with every record near the item cap, ``limit`` records would be gigabytes.
WINDOW_BYTES = MAX_PAGE_BYTES
#: The look-ahead past a window reads at most this many bytes of records at a time.
GLANCE_BYTES = 4 << 20

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


class _ItemKey(msgspec.Struct):
    """What the look-ahead needs of an item record: its key, never its text."""

    id: str
    agent_id: str = ""
    kind: c.ItemKind = c.ItemKind.ASSISTANT
    delivery: str = ""


_head = msgspec.json.Decoder(_Head)
_item = msgspec.json.Decoder(c.Item)
_item_key = msgspec.json.Decoder(_ItemKey)
_prompt = msgspec.json.Decoder(wire.PromptRecord)
_turn = msgspec.json.Decoder(_TurnHead)


class JournalReader(Protocol):
    """What a page is read from: ``read_after(after, limit, max_bytes)`` gives the encoded
    records with seq > after, oldest first, at most ``limit`` of them and at most ``max_bytes``
    of lines but the first (agentd.store.Journal)."""

    async def read_after(self, after: int, limit: int | None = None, max_bytes: int | None = None) -> list[bytes]: ...


class _Rec(msgspec.Struct):
    seq: int
    run: str
    key: _Key | None
    entry: wire.HistoryEntry | None
    #: the run's terminal turn record
    ends_run: bool = False
    #: the record's length in bytes (an entry's share of a page, a window's weight)
    size: int = 0


class _View(msgspec.Struct):
    """How records are read: the runs a rewind dropped, and whether to show them (marked)."""

    dropped: frozenset[str] = frozenset()
    all_: bool = False
    #: seqs of records whose payload did not decode (damaged by hand, say): skipped, as export skips them
    skipped: set[int] = msgspec.field(default_factory=set)


def _echo(item: c.Item | _ItemKey, run: str) -> bool:
    """Whether ``item`` is a runtime's echo of its run's prompt (the prompt record holds it);
    text steered into the running turn is not."""
    return item.kind is c.ItemKind.USER and bool(run) and item.delivery != "steer"


def _parse(line: bytes, view: _View) -> _Rec:
    head = _head.decode(line)
    size = len(line)
    if head.run in view.dropped:
        if not view.all_:
            return _Rec(head.seq, head.run, None, None, size=size)
        head.dropped = True
    try:
        return _parse_payload(head, size)
    except (msgspec.DecodeError, msgspec.ValidationError):
        view.skipped.add(head.seq)  # one damaged record does not take the whole history down
        return _Rec(head.seq, head.run, None, None, size=size)


def _parse_payload(head: _Head, size: int) -> _Rec:
    if head.type == "item":
        item = _item.decode(head.data)
        if _echo(item, head.run):
            return _Rec(head.seq, head.run, None, None, size=size)
        # A runtime session's earlier turns, journaled once when it was adopted (agentd.adopt).
        imported = not head.run and item.id.startswith("import.")
        entry = wire.HistoryEntry(seq=head.seq, run=head.run, item=item, imported=imported, dropped=head.dropped,
                                  copied=bytes(head.data).startswith(b'{"copied":'))
        return _Rec(head.seq, head.run, (head.run, item.agent_id, item.id), entry, size=size)
    if head.type == "prompt":
        prompt = _prompt.decode(head.data)
        item = c.Item(id=f"prompt-{head.seq}", kind=c.ItemKind.USER, text=prompt.text,
                      attachments=list(prompt.attachments))
        return _Rec(head.seq, head.run, None, wire.HistoryEntry(seq=head.seq, run=head.run, item=item, dropped=head.dropped,
                                                                copied=bytes(head.data).startswith(b'{"copied":')),
                    size=size)
    if head.type == "turn" and head.run:
        ends = _turn.decode(head.data).state.terminal
        return _Rec(head.seq, head.run, None, None, ends_run=ends, size=size)
    return _Rec(head.seq, head.run, None, None, size=size)


async def _read(journal: JournalReader, view: _View, lo: int, hi: int) -> tuple[list[_Rec], bool]:
    """Records with lo < seq < hi, oldest first: the first whatever its size, then at most
    WINDOW_BYTES of the others; and whether they are all of them. (The first is free so that one
    record over the budget, an item near the cap, is a window of its own with those after it.)"""
    if hi <= lo + 1:
        return [], True
    lines = await journal.read_after(lo, limit=1)
    if hi > lo + 2 and lines:
        lines += await journal.read_after(lo + 1, limit=hi - lo - 2, max_bytes=WINDOW_BYTES)
    return [_parse(line, view) for line in lines], len(lines) == hi - lo - 1


def _glance(line: bytes, view: _View) -> tuple[int, str, _Key | None, bool]:
    """(seq, run, item key or None, ends its run) of a record, its text left undecoded."""
    head = _head.decode(line)
    if head.run in view.dropped and not view.all_:
        return head.seq, head.run, None, False
    try:
        if head.type == "item":
            item = _item_key.decode(head.data)
            if _echo(item, head.run):
                return head.seq, head.run, None, False
            return head.seq, head.run, (head.run, item.agent_id, item.id), False
        if head.type == "turn" and head.run:
            return head.seq, head.run, None, _turn.decode(head.data).state.terminal
    except (msgspec.DecodeError, msgspec.ValidationError):
        view.skipped.add(head.seq)
    return head.seq, head.run, None, False


async def _latest(journal: JournalReader, view: _View, recs: list[_Rec], last_seq: int, hi: int) -> list[_Rec]:
    """The records of ``recs`` (records with seq < ``hi``) holding an entry that is its item's latest record.

    A record is superseded by a later one of the same key, in ``recs`` or after them: the
    journal past ``hi - 1`` is read (GLANCE_BYTES at a time, ids only) until every run with a
    candidate item has ended.
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
        lines = await journal.read_after(after, limit=min(last_seq - after, window), max_bytes=GLANCE_BYTES)
        if not lines:
            break
        for line in lines:
            after, run, key, ends = _glance(line, view)
            if key is not None and key in last:
                beyond.add(key)
            if ends:
                open_runs.discard(run)
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
               limit: int = 50, before: int | None = None, after: int | None = None,
               dropped: Collection[str] = (), all_: bool = False) -> wire.HistoryPage:
    """One page of ``conversation``'s history from ``journal``, whose last published seq is
    ``last_seq``: the oldest ``limit`` entries with seq > ``after`` when it is given, else the
    newest ``limit`` entries with seq < ``before`` (or of all, without it). The records of
    ``dropped`` runs (a rewind's) are left out, or with ``all_`` shown marked. Read-only; on the
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
    view = _View(frozenset(dropped), all_)
    try:
        if after is not None:
            return await _forward(journal, view, conversation, last_seq, limit, min(after, last_seq))
        hi = min(before, last_seq + 1) if before is not None else last_seq + 1
        return await _backward(journal, view, conversation, last_seq, limit, hi)
    finally:
        if view.skipped:
            log.warning("history.records_skipped", conversation=conversation, count=len(view.skipped),
                        seqs=sorted(view.skipped)[:20], note="their payload does not decode")


async def _backward(journal: JournalReader, view: _View, conversation: str, last_seq: int, limit: int,
                    hi: int) -> wire.HistoryPage:
    # Widen the window below hi until it holds `limit` entries or reaches seq 1, or until it
    # would pass WINDOW_BYTES: then narrow it to its newest part that fits, and stop there.
    width = max(64, limit * 4)
    best: tuple[int, list[_Rec]] | None = None  # the widest window read whole: (lo, its entries)
    narrowed = False
    while True:
        lo = max(0, hi - 1 - width)
        recs, whole = await _read(journal, view, lo, hi)
        if whole:
            best = lo, await _latest(journal, view, recs, last_seq, hi)
            if len(best[1]) > limit or lo == 0 or narrowed:
                break
            width *= 4
            continue
        narrowed = True
        # Narrower: from what the part read weighs per record (at least halved), and never below
        # the record that did not fit, which then starts the window (a window's first record is
        # read whatever its size). Each round moves lo up; a window of one record is read whole.
        estimate = max(1, WINDOW_BYTES * len(recs) // (2 * sum(r.size for r in recs)))
        width = hi - 1 - max(recs[-1].seq, hi - 1 - min(width // 2, estimate))
        if best is not None and width <= hi - 1 - best[0]:
            break  # no narrower window holds more than the widest one read whole
    lo, kept = best
    more = len(kept) > limit or lo > 0
    if len(kept) > limit:
        kept = kept[-limit:]
    fit = _within_bytes(kept[::-1])  # the newest first
    more = more or fit < len(kept)
    entries = [r.entry for r in kept[len(kept) - fit:] if r.entry is not None]
    # `before` names the oldest entry shown (or where the window stopped): the next page is what lies below it.
    return wire.HistoryPage(
        conversation=conversation, items=entries,
        before=(entries[0].seq if entries else lo + 1) if more else 0,
        after=max(hi - 1, 0) if hi <= last_seq else 0,
        start=not more, end=hi > last_seq)


async def _forward(journal: JournalReader, view: _View, conversation: str, last_seq: int, limit: int,
                   after: int) -> wire.HistoryPage:
    # Widen the window above `after` until it holds `limit` entries or reaches the end, or until
    # it passes WINDOW_BYTES: the window is then what was read, and the page stops there.
    width = max(64, limit * 4)
    while True:
        hi = min(last_seq, after + width) + 1
        recs, whole = await _read(journal, view, after, hi)
        if not whole:
            hi = recs[-1].seq + 1
        kept = await _latest(journal, view, recs, last_seq, hi)
        if len(kept) > limit or hi > last_seq or not whole:
            break
        width *= 4
    more = len(kept) > limit or hi <= last_seq
    if len(kept) > limit:
        kept = kept[:limit]
    fit = _within_bytes(kept)
    more = more or fit < len(kept)
    entries = [r.entry for r in kept[:fit] if r.entry is not None]
    # `after` names the newest entry shown (or where the window stopped): the next page is what lies above it.
    return wire.HistoryPage(
        conversation=conversation, items=entries,
        before=after + 1 if after > 0 else 0,
        after=(entries[-1].seq if entries else hi - 1) if more else 0,
        start=after == 0, end=not more)
