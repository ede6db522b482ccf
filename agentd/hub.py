"""Fan-out of journal records to subscribers, without ever blocking the publisher.

The conversation service publishes each record once, already encoded; the hub
hands it to every live subscription of that conversation (and to the
all-conversations subscriptions) by a non-blocking put into the subscriber's
bounded outbox. A subscriber whose outbox is full is cut off: it gets a
``lagged`` frame telling where to resume, never a silent gap. Back-pressure is
this decision, written down: the daemon never waits for a slow client.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from . import wire


class Outbox(Protocol):
    """A connection's bounded queue of encoded frames."""

    def offer(self, frame: bytes) -> bool:
        """Queue ``frame`` without blocking; False when the outbox is full."""
        ...

    def offer_many(self, frames: bytes, count: int) -> bool:
        """Queue ``count`` frames joined in ``frames`` without blocking; False (none queued) when they do not fit."""
        ...

    def lagged(self, subscription: "Subscription") -> None:
        """The subscription was cut off for lag; tell the client when there is room."""
        ...


class Subscription:
    """One ``subscribe`` of one connection.

    ``cursor`` is the seq of the last durable record delivered (per
    conversation for an all-conversations subscription, in ``positions``).
    While ``live`` is False the subscription is catching up from the journal
    and live publishes are skipped; the catch-up switches it live with no
    checkpoint between reading the last record and the switch, so nothing is
    lost or duplicated.
    """

    __slots__ = ("id", "conversation", "outbox", "cursor", "live", "closed", "positions", "_prefix")

    def __init__(self, sub_id: int, conversation: str | None, outbox: Outbox, after: int = 0) -> None:
        self.id = sub_id
        self.conversation = conversation
        self.outbox = outbox
        self.cursor = after
        self.live = False
        self.closed = False
        self.positions: dict[str, int] = {}
        self._prefix: dict[str, bytes] = {}

    def frame(self, conversation: str, line: bytes) -> bytes:
        """An ``event`` frame around an already-encoded record, without re-encoding it."""
        prefix = self._prefix.get(conversation)
        if prefix is None:
            prefix = b'{"type":"event","sub":%d,"conversation":%s,"record":' % (
                self.id,
                wire.encode(conversation)[:-1],
            )
            self._prefix[conversation] = prefix
        return b"".join((prefix, line, b"}\n"))

    def prefix(self, conversation: str) -> bytes:
        """What precedes a record in this subscription's ``event`` frames of ``conversation``."""
        prefix = self._prefix.get(conversation)
        if prefix is None:
            self.frame(conversation, b"")
            prefix = self._prefix[conversation]
        return prefix


class LiveRun:
    """Consecutive live-only records (seq 0) that share their start and end: record ``i`` is
    ``head + bodies[i] + tail``.

    What the conversation service holds back for a run of text deltas of one item (the same
    envelope around each encoded text) and hands to :meth:`Hub.publish_many`: one entry for the
    run, each subscriber's frames of it one join, no line made per record. Delivered exactly as
    its records one by one would be, including the outbox's decisions (a record alone is offered
    as one frame). ``bodies`` holds one or more; ``len()`` is their number.
    """

    __slots__ = ("head", "bodies", "tail")

    def __init__(self, head: bytes, bodies: list[bytes], tail: bytes) -> None:
        self.head = head
        self.bodies = bodies
        self.tail = tail

    def __len__(self) -> int:
        return len(self.bodies)

    def lines(self) -> list[bytes]:
        """Each record of the run, encoded."""
        head, tail = self.head, self.tail
        return [b"".join((head, body, tail)) for body in self.bodies]


#: A record handed to Hub.publish_many: its encoded line, or a run of live-only ones.
Line = bytes | LiveRun


def _frames(prefix: bytes, lines: Sequence[Line]) -> bytes:
    """The ``event`` frames of ``lines`` (one or more) with ``prefix``, joined: what Subscription.frame makes of each."""
    sep = b"}\n" + prefix
    if LiveRun not in map(type, lines):  # C speed: no Python frame per line
        return b"".join((prefix, sep.join(lines), b"}\n"))
    parts: list[bytes] = []
    plain: list[bytes] = []
    for line in lines:
        if type(line) is LiveRun:
            if plain:
                parts.append(sep.join(plain))
                plain = []
            head, tail = line.head, line.tail
            parts.append(b"".join((head, (tail + sep + head).join(line.bodies), tail)))
        else:
            plain.append(line)
    if plain:
        parts.append(sep.join(plain))
    return b"".join((prefix, sep.join(parts), b"}\n"))


def _count(lines: Sequence[Line]) -> int:
    """How many records ``lines`` holds (a LiveRun holds several)."""
    if LiveRun not in map(type, lines):
        return len(lines)
    return sum(len(line) if type(line) is LiveRun else 1 for line in lines)


class Hub:
    """Subscriptions by conversation; ``publish`` is synchronous and never blocks."""

    def __init__(self) -> None:
        self._by_conversation: dict[str, set[Subscription]] = {}
        self._all: set[Subscription] = set()
        self.on_lag: Callable[[Subscription], None] | None = None

    def add(self, sub: Subscription) -> None:
        if sub.conversation is None:
            self._all.add(sub)
        else:
            self._by_conversation.setdefault(sub.conversation, set()).add(sub)

    def remove(self, sub: Subscription) -> None:
        sub.closed = True
        if sub.conversation is None:
            self._all.discard(sub)
        else:
            subs = self._by_conversation.get(sub.conversation)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._by_conversation[sub.conversation]

    def subscribers(self, conversation: str) -> int:
        return len(self._by_conversation.get(conversation, ())) + len(self._all)

    def publish(self, conversation: str, seq: int, line: bytes) -> None:
        """Deliver one record (``seq`` 0 for live-only records) to every live subscriber."""
        subs = self._by_conversation.get(conversation)
        if subs:
            for sub in list(subs):
                if not sub.live or (seq and seq <= sub.cursor):
                    continue  # catching up, or already delivered by the catch-up
                if not sub.outbox.offer(sub.frame(conversation, line)):
                    self._lag(sub)
                elif seq:
                    sub.cursor = seq
        for sub in list(self._all):
            if not sub.live:
                continue
            if not sub.outbox.offer(sub.frame(conversation, line)):
                self._lag(sub)
            elif seq:
                sub.positions[conversation] = seq

    def publish_many(self, conversation: str, records: list[tuple[int, Line]]) -> None:
        """Deliver records ``(seq, line)`` in order, as :meth:`publish` one by one would; a line
        may be a :class:`LiveRun` of live-only records (``seq`` 0).

        One ``offer_many`` per subscriber for the whole list: its frames are
        built by one join (C speed) instead of one per record, so fanning a
        burst out costs per subscriber, hardly per record. A subscriber whose
        outbox cannot take them all is cut off (``lagged``) with none of them.
        """
        if len(records) == 1:
            seq, line = records[0]
            if type(line) is not LiveRun:
                self.publish(conversation, seq, line)
                return
            if len(line) == 1:  # one record: the outbox's rule for one frame (offer), as publish
                self.publish(conversation, 0, line.head + line.bodies[0] + line.tail)
                return
        if not records:
            return
        subs = self._by_conversation.get(conversation)
        if not subs and not self._all:
            return
        # Each subscriber's frames: its prefix, the lines joined by "}\n" + prefix, a last "}\n"
        # (two joins at C speed; no Python loop over the records unless some are durable).
        seqs, lines = zip(*records)  # C speed: no Python frame per record
        first = last = 0
        if any(seqs):
            for seq, _ in records:
                if seq:
                    first = first or seq
                    last = seq
        count = _count(lines)
        if subs:
            for sub in list(subs):
                if not sub.live:
                    continue  # catching up
                if first and first <= sub.cursor:
                    # Some were delivered by the catch-up already (rare): one by one, skipping those.
                    for seq, line in records:
                        if sub.closed:
                            break
                        if seq and seq <= sub.cursor:
                            continue
                        for one in line.lines() if type(line) is LiveRun else (line,):
                            if not sub.outbox.offer(sub.frame(conversation, one)):
                                self._lag(sub)
                                break
                            if seq:
                                sub.cursor = seq
                    continue
                if not sub.outbox.offer_many(_frames(sub.prefix(conversation), lines), count):
                    self._lag(sub)
                elif last:
                    sub.cursor = last
        for sub in list(self._all):
            if not sub.live:
                continue
            if not sub.outbox.offer_many(_frames(sub.prefix(conversation), lines), count):
                self._lag(sub)
            elif last:
                sub.positions[conversation] = last

    def _lag(self, sub: Subscription) -> None:
        self.remove(sub)
        sub.outbox.lagged(sub)

    def drop_conversation(self, conversation: str) -> list[Subscription]:
        """Remove and return every subscription of a deleted conversation."""
        subs = list(self._by_conversation.pop(conversation, ()))
        for sub in subs:
            sub.closed = True
        return subs
