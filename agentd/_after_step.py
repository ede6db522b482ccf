"""Calls put off until the task that asked for them reaches its next checkpoint.

Two things on a turn's path are better done right after the step that asks for them than
inside it. The conversation service's held start records (a prompt, the checkpoint before
it) go to subscribers once the provider's send has written the prompt, which it usually does
in the same task step; when the send waits instead (a runtime starting), they go at the very
next scheduler pass, so nothing stays held while something slow runs. The journal's hand-off
to its group-commit thread (``SimpleQueue.put``, which wakes the thread to take the GIL at the
trio thread's next system call) waits likewise until the appending step is over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import trio

__all__ = ["AfterStep"]

T = TypeVar("T")


class AfterStep(Generic[T]):
    """Calls ``fn(item)`` for each item :meth:`defer`\\ red, once the deferring task yields.

    :meth:`run` does the calls, in order, a scheduler pass after each :meth:`defer`, and the
    ones left when it is cancelled; while it is not running, :meth:`defer` calls ``fn`` at once.
    ``fn`` must not block, and must be harmless when what it would do was done meanwhile. Use
    from the trio thread only.
    """

    def __init__(self, fn: Callable[[T], None]) -> None:
        self._fn = fn
        self._items: list[T] = []
        self._wake: trio.Event | None = None

    def defer(self, item: T) -> None:
        """Have ``fn(item)`` called at the next scheduler pass (now, when :meth:`run` is not running)."""
        wake = self._wake
        if wake is None:
            self._fn(item)
            return
        self._items.append(item)
        wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Make the deferred calls until cancelled (then those left, at once). Started (``nursery.start``)
        once :meth:`defer` defers."""
        try:
            self._wake = wake = trio.Event()
            task_status.started()
            while True:
                await wake.wait()
                self._flush()
                self._wake = wake = trio.Event()
        finally:
            self._wake = None
            self._flush()

    def _flush(self) -> None:
        items, self._items = self._items, []
        for item in items:
            self._fn(item)
