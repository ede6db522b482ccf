"""A runtime exit ends only the run whose provider turn was open when the runtime exited.

An ACP conversation reports its runtime's exit as a failed turn, then an ExitEvent, and stays
usable: the next send starts a new process. A prompt queued behind the crashed turn is handed
over as that turn ends, and when it was handed over before the pump got to the ExitEvent (a
loaded machine: a CI run failed so), the exit ended it too, though it went to the new process.
Here a provider conversation of the test's own reports exactly that, with the pump held up
after the crashed turn's end so the queued run is handed over first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from agentd import contract as c
from agentd import wire
from agentd.conversations import ConversationService
from inprocess import in_process_service


class _StaysUsable:
    """A provider conversation whose runtime crashes during its first turn and which takes the
    next prompt on a new runtime (as agentd.providers.acp's does); records the prompts sent."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.sent: list[str] = []

    @property
    def id(self) -> str:
        return "stays-usable"

    async def send(self, prompt: c.Prompt) -> None:
        self.sent.append(prompt.text)
        self.sink.emit(c.TurnEvent(turn=c.Turn(state=c.TurnState.WORKING)))
        if len(self.sent) > 1:  # the new runtime answers
            self.sink.emit(c.TurnEvent(turn=c.Turn(state=c.TurnState.COMPLETED)))

    def crash(self) -> None:
        self.sink.emit(c.TurnEvent(turn=c.Turn(state=c.TurnState.FAILED, error="exited with code 3",
                                               reason="runtime_exit")))
        self.sink.emit(c.ExitEvent(error="the agent process exited with code 3"))

    async def close(self) -> None:
        pass


def _ends(service: ConversationService, cid: str, run: str) -> list[dict[str, Any]]:
    import msgspec

    path = service.store.root / cid / "events.jsonl"  # type: ignore[attr-defined]
    records = [msgspec.json.decode(line) for line in path.read_bytes().splitlines()]
    return [r["data"] for r in records if r["type"] == "turn" and r.get("run") == run
            and r["data"]["state"] not in ("working", "requires_action")]


async def test_a_queued_run_handed_over_before_the_exit_was_handled_is_not_ended_by_it(tmp_path: Path) -> None:
    async with in_process_service(tmp_path) as (service, hub):
        work = tmp_path / "work"
        work.mkdir()
        record = await service.create(provider="script", workdir=str(work))
        live = await service.live(record.id)
        fake = _StaysUsable(live.sink)
        live.conv = fake  # type: ignore[assignment]
        crashed = (await service.send(record.id, "crash")).run
        queued = await service.send(record.id, "next, please", if_busy="queue")
        assert queued.disposition == "queued"

        # The pump is held up right after the crashed turn's end, before the ExitEvent: the queued
        # run is handed over meanwhile, as it was on the loaded machine.
        end_turn = service._end_turn

        async def slow_end(live_: Any, turn: c.Turn, run: str, **kw: Any) -> None:
            await end_turn(live_, turn, run, **kw)
            if run == crashed:
                await trio.sleep(0.3)

        service._end_turn = slow_end  # type: ignore[method-assign]
        fake.crash()
        with trio.fail_after(10):
            while not _ends(service, record.id, queued.run):
                await trio.sleep(0.01)
        assert fake.sent == ["crash", "next, please"]
        assert [e["reason"] for e in _ends(service, record.id, crashed)] == ["runtime_exit"]
        assert [e["state"] for e in _ends(service, record.id, queued.run)] == ["completed"]
        assert wire.ConversationState(service.record(record.id).state) is not wire.ConversationState.ERROR
        # The exit is stale by the time it is handled: the provider conversation took a prompt
        # since, so it is still the one in use (not dropped for a second one opened beside it).
        assert live.conv is fake
        third = (await service.send(record.id, "and again")).run
        with trio.fail_after(10):
            while not _ends(service, record.id, third):
                await trio.sleep(0.01)
        assert fake.sent == ["crash", "next, please", "and again"]
