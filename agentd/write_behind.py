"""Write-behind of conversation records whose news the journal already holds.

A conversation's record is a checkpoint of its journal (see :mod:`agentd.conversations`):
what a turn's end changes in it (the active run cleared, ``turn_after``, ``error``, the
running ``usage``) is in the journal's tail as the run's terminal ``turn`` and ``usage``
records, which recovery reads past the record's ``journal_end``. Such a save need not
block the turn's end on two fsyncs: :class:`WriteBehind` says which conversations owe
one, coalesced (one save per conversation, whatever came meanwhile) and due
``delay_s`` after the first change, so a busy conversation is still checkpointed every
``delay_s`` and its journal's unread tail stays short. A save made at once (settings,
close, release, a turn's start without a checkpoint) supersedes the one owed.

The Claude provider keeps one too, for its own records whose running cost alone changed
(``COST_WRITE_DELAY_S`` in :mod:`agentd.providers.claude._provider`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
import trio

__all__ = ["DELAY_S", "WriteBehind"]

log = structlog.get_logger("agentd.write_behind")

#: how long a record's save may wait after the change that made it owed, in seconds
DELAY_S = 2.0


class WriteBehind:
    """Which conversations owe a record save, and when it is due (trio clock)."""

    def __init__(self, delay_s: float = DELAY_S) -> None:
        self.delay_s = delay_s
        self._due: dict[str, float] = {}  # conversation id -> trio time its save is due, oldest first
        self._wake = trio.Event()

    def mark(self, cid: str) -> None:
        """``cid`` owes a save; due ``delay_s`` from now unless one was already owed (that one stays due)."""
        if cid not in self._due:
            self._due[cid] = trio.current_time() + self.delay_s
            self._wake.set()

    def discard(self, cid: str) -> None:
        """``cid`` owes none any more (saved at once, deleted, lost)."""
        self._due.pop(cid, None)

    def owed(self) -> list[str]:
        """The conversations owing a save, and forget them (the caller saves them now)."""
        cids, self._due = list(self._due), {}
        return cids

    def __contains__(self, cid: str) -> bool:
        return cid in self._due

    async def run(self, save: Callable[[str], Awaitable[None]]) -> None:
        """Call ``save(cid)`` for each save as it falls due, one at a time, until cancelled.

        ``save`` must log its own errors; one that raises is logged and dropped (the
        journal still holds what the record would have said).
        """
        while True:
            if not self._due:
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            cid, due = next(iter(self._due.items()))  # marked in order, each due delay_s after: the oldest
            await trio.sleep_until(due)
            if self._due.get(cid) != due:
                continue  # saved at once, or deleted, meanwhile
            del self._due[cid]
            try:
                await save(cid)
            except Exception:
                log.exception("record.write_behind_failed", conversation=cid)
