"""A trio lock that takes no scheduler pass when nobody holds it.

``trio.Lock.acquire`` is a checkpoint even when the lock is free: the task yields, and every
other runnable task (and an I/O poll) runs before it goes on. A turn's prompt passes three
such locks on its way to the runtime (a conversation's send and open locks, a provider's
start or attach lock), each costing its user a full pass of the run loop. :class:`QuickLock`
takes a free lock at once and waits (trio.Lock's fair, first come first served wait) only
when it is held, so it is no checkpoint then: use it only where the block it guards, or the
code around it, checkpoints anyway.
"""

from __future__ import annotations

from types import TracebackType

import trio

__all__ = ["QuickLock"]


class QuickLock:
    """``async with lock:`` as with a ``trio.Lock``, without yielding when the lock is free."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = trio.Lock()

    async def __aenter__(self) -> None:
        try:
            self._lock.acquire_nowait()  # free, and nobody waiting (a released lock passes to its waiter)
        except trio.WouldBlock:
            await self._lock.acquire()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._lock.release()

    def locked(self) -> bool:
        """Whether some task holds it."""
        return self._lock.locked()
