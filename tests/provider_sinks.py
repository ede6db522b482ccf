"""An event sink for tests that drive a provider directly under trio.

:class:`ListSink` collects every event a conversation emits and waits for
turns, interactions or anything else to show up. A provider test module sets
its own ceiling on those waits by subclassing it with a ``timeout``, or passes
one per sink or per wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from agentd import contract as c

__all__ = ["ListSink"]


class ListSink:
    """Collects a conversation's events.

    ``thread_ok`` turns False if ``emit`` is ever called off the trio thread the
    sink was made on (providers bridging to another event loop must hop back first).
    """

    #: seconds the ``wait_*`` methods wait when not told otherwise
    timeout: float = 30.0

    def __init__(self, timeout: float | None = None) -> None:
        self.events: list[c.Event] = []
        self.thread_ok = True
        if timeout is not None:
            self.timeout = timeout
        try:
            self._trio_token: trio.lowlevel.TrioToken | None = trio.lowlevel.current_trio_token()
        except RuntimeError:  # made outside trio: nothing to compare against
            self._trio_token = None

    def emit(self, event: c.Event) -> None:
        if self._trio_token is not None:
            try:
                if trio.lowlevel.current_trio_token() is not self._trio_token:
                    self.thread_ok = False
            except RuntimeError:
                self.thread_ok = False
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    def turns(self) -> list[c.Turn]:
        return [e.turn for e in self.of(c.TurnEvent)]

    def terminal_turns(self) -> list[c.Turn]:
        return [t for t in self.turns() if t.state.terminal]

    def items(self, kind: c.ItemKind | None = None) -> list[c.Item]:
        """The latest version of each item, in first-seen order."""
        latest: dict[tuple[str, str], c.Item] = {}
        for e in self.of(c.ItemEvent):
            latest[(e.item.agent_id, e.item.id)] = e.item
        return [i for i in latest.values() if kind is None or i.kind is kind]

    def deltas(self, kind: c.ItemKind = c.ItemKind.ASSISTANT) -> str:
        return "".join(e.delta.text for e in self.of(c.DeltaEvent) if e.delta.kind is kind)

    async def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None, what: str = "the event") -> Any:
        """The first truthy value of ``predicate()``, polled; AssertionError (naming ``what``) on timeout."""
        timeout = self.timeout if timeout is None else timeout
        with trio.move_on_after(timeout):
            while True:
                found = predicate()
                if found:
                    return found
                await trio.sleep(0.01)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; events: {[type(e).__name__ for e in self.events]}")

    async def wait_turns(self, count: int = 1, timeout: float | None = None) -> c.Turn:
        """The ``count``-th turn to end."""
        await self.wait_for(lambda: len(self.terminal_turns()) >= count, timeout, f"{count} terminal turn(s)")
        return self.terminal_turns()[count - 1]

    async def wait_interaction(self, kind: c.InteractionKind, timeout: float | None = None) -> c.Interaction:
        """The first pending interaction of ``kind``."""

        def pending() -> c.Interaction | None:
            for e in self.of(c.InteractionEvent):
                if e.interaction.kind is kind and e.interaction.state is c.InteractionState.PENDING:
                    return e.interaction
            return None

        return await self.wait_for(pending, timeout, f"a pending {kind.value} interaction")
