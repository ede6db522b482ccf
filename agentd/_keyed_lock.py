"""One trio lock per key, kept only while some task holds or waits for it.

``async with locks(key):`` runs the block with ``key``'s lock held: tasks on one key take turns
(trio.Lock: first come, first served), tasks on different keys do not wait for each other. A key's
entry is dropped when its last user leaves, however it leaves (returns, raises, is cancelled while
waiting), so a map of locks per conversation does not grow with every conversation ever touched.
"""

from __future__ import annotations

from collections.abc import Hashable
from types import TracebackType
from typing import Generic, TypeVar

import trio

__all__ = ["KeyedLock"]

K = TypeVar("K", bound=Hashable)


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = trio.Lock()
        #: tasks holding or waiting for ``lock``
        self.users = 0


class KeyedLock(Generic[K]):
    """Locks by key: ``async with locks(key):``; ``key in locks`` while a task holds or waits for it."""

    def __init__(self) -> None:
        self._entries: dict[K, _Entry] = {}

    def __call__(self, key: K) -> _Held[K]:
        return _Held(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def locked(self, key: K) -> bool:
        """Whether a task holds ``key``'s lock now."""
        entry = self._entries.get(key)
        return entry is not None and entry.lock.locked()

    def _leave(self, key: K, entry: _Entry) -> None:
        entry.users -= 1
        if not entry.users:
            del self._entries[key]


class _Held(Generic[K]):
    __slots__ = ("_entry", "_key", "_locks")

    def __init__(self, locks: KeyedLock[K], key: K) -> None:
        self._locks, self._key = locks, key
        self._entry: _Entry | None = None

    async def __aenter__(self) -> None:
        entries = self._locks._entries
        entry = entries.get(self._key)
        if entry is None:
            entry = entries[self._key] = _Entry()
        entry.users += 1
        try:
            await entry.lock.acquire()
        except BaseException:  # cancelled while waiting: no longer a user
            self._locks._leave(self._key, entry)
            raise
        self._entry = entry

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        entry, self._entry = self._entry, None
        assert entry is not None
        entry.lock.release()
        self._locks._leave(self._key, entry)
