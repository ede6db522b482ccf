"""Records a task holds back, published as soon as that task yields instead of before it may.

The conversation service holds a turn's start records (its prompt, the checkpoint before
it) back to publish them in one write per subscriber, and the rule of a hold is that
nothing stays held while something slow runs (see ``ConversationService.publish_held``).
The provider's ``send`` is such a step only sometimes: it waits when its runtime has to
start, but usually it writes the prompt to a running runtime and returns in the same task
step. Publishing before it wakes every subscriber (a socket write each, and their
processes) while the runtime has yet to get its prompt; :class:`PublishSoon` publishes
after it instead, or, when the step yields first, at the very next scheduler pass: a
waiting subscriber gets the records no later than before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

import trio

__all__ = ["PublishSoon"]

T = TypeVar("T")


class PublishSoon(Generic[T]):
    """Calls ``publish(item)`` for each item :meth:`arm`\\ ed, once the arming task yields.

    ``publish`` must be harmless when the item's holder published already (it then finds
    nothing held). :meth:`run` does the calls; while it is not running, :meth:`arm` calls
    ``publish`` at once.
    """

    def __init__(self, publish: Callable[[T], None]) -> None:
        self._publish = publish
        self._items: list[T] = []
        self._wake: trio.Event | None = None

    def arm(self, item: T) -> None:
        """Have ``item`` published at the next scheduler pass (now, when :meth:`run` is not running)."""
        wake = self._wake
        if wake is None:
            self._publish(item)
            return
        self._items.append(item)
        wake.set()

    async def run(self) -> None:
        """Publish what is armed, a pass after each :meth:`arm`, until cancelled (then at once)."""
        try:
            while True:
                self._wake = wake = trio.Event()
                await wake.wait()
                self._flush()
        finally:
            self._wake = None
            self._flush()

    def _flush(self) -> None:
        items, self._items = self._items, []
        for item in items:
            self._publish(item)
