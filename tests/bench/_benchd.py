"""agentd with one more provider, ``bench``: the producer of the fan-out and latency benchmarks.

Everything but the provider is the real daemon (``agentd run``: config,
journal, hub, server, socket). The provider stands in for a runtime whose
events arrive as fast as a benchmark asks: a prompt is a JSON object

    {"n": 100000, "burst": 64, "size": 200, "rate": 0}

and the turn emits ``n`` text deltas of about ``size`` bytes each, ``burst`` at
a time with a checkpoint between bursts (``rate`` > 0 paces single deltas at
that many per second instead), then ends the turn ``completed``. Each delta's
text holds ``@<time.monotonic_ns() at emit>@`` so a subscriber can measure
emit -> receive latency; the last one also holds ``@@END@@``.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

import trio

from agentd import contract as c

END = "@@END@@"


class BenchConversation:
    def __init__(self, provider: "BenchProvider", sink: c.EventSink, conversation_id: str) -> None:
        self._provider = provider
        self._sink = sink
        self._id = conversation_id
        self._scope: trio.CancelScope | None = None

    @property
    def id(self) -> str:
        return self._id

    async def send(self, prompt: c.Prompt) -> None:
        if self._scope is not None:
            raise c.Busy("a bench turn is running")
        spec = json.loads(prompt.text)
        self._scope = trio.CancelScope()
        assert self._provider.nursery is not None
        self._provider.nursery.start_soon(self._play, spec, self._scope)

    async def _play(self, spec: dict[str, Any], scope: trio.CancelScope) -> None:
        n = int(spec.get("n", 1000))
        burst = max(1, int(spec.get("burst", 1)))
        size = int(spec.get("size", 200))
        rate = float(spec.get("rate", 0))
        emit = self._sink.emit
        item = f"i{uuid.uuid4().hex[:8]}"
        kind = c.ItemKind.ASSISTANT
        # A delta frame carries ~120 bytes of envelope around its text.
        pad = "x" * max(0, size - 120 - 30)
        state = c.TurnState.CANCELLED
        with scope:
            emit(c.TurnEvent(turn=c.Turn(state=c.TurnState.WORKING)))
            if rate > 0:
                start = trio.current_time()
                for i in range(n):
                    await trio.sleep_until(start + i / rate)
                    end = END if i == n - 1 else ""
                    emit(c.DeltaEvent(delta=c.Delta(item_id=item, kind=kind, text=f"@{time.monotonic_ns()}@{pad}{end}")))
            else:
                for i in range(n):
                    end = END if i == n - 1 else ""
                    emit(c.DeltaEvent(delta=c.Delta(item_id=item, kind=kind, text=f"@{time.monotonic_ns()}@{pad}{end}")))
                    if i % burst == burst - 1:
                        await trio.lowlevel.checkpoint()
            state = c.TurnState.COMPLETED
        self._scope = None
        emit(c.TurnEvent(turn=c.Turn(state=state)))

    async def steer(self, prompt: c.Prompt) -> None:
        raise c.Unsupported("bench cannot steer")

    async def cancel(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    async def respond(self, interaction_id: str, answer: c.Answer) -> None:
        raise c.InteractionGone("bench never asks")

    async def history(self) -> c.HistoryRecord:
        raise c.Unsupported("bench keeps no history")

    async def set_model(self, model: str, effort: str = "") -> None:
        raise c.Unsupported("bench has one model")

    async def set_title(self, title: str) -> None:
        raise c.Unsupported("bench has no titles")

    async def close(self) -> None:
        await self.cancel()


class BenchProvider:
    name = "bench"
    display_name = "bench (benchmark producer)"

    def __init__(self) -> None:
        self.nursery: trio.Nursery | None = None

    def capabilities(self) -> c.Capabilities:
        return c.Capabilities(cancel=True)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def check(self) -> None:
        return None

    async def models(self) -> list[c.Model]:
        raise c.Unsupported("bench has one model")

    async def open(self, request: c.OpenRequest, sink: c.EventSink) -> BenchConversation:
        return BenchConversation(self, sink, request.conversation_id or f"bench-{uuid.uuid4().hex[:12]}")


def main() -> None:
    """``agentd <args>`` with the bench provider registered next to the configured ones."""
    from agentd import runtimes

    declare = runtimes.Runtimes._declare

    def _declare(self: runtimes.Runtimes) -> None:
        declare(self)
        self._slots["bench"] = runtimes._Slot("bench", BenchProvider)

    runtimes.Runtimes._declare = _declare  # type: ignore[method-assign]
    from agentd.__main__ import cli

    cli(sys.argv[1:], prog_name="agentd")


if __name__ == "__main__":
    main()
