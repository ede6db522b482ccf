"""Idle release on the real conversation service and script provider: a conversation is idle from
its turn's end, whoever ended the turn (agentd.idle_release; its scans in tests/unit/test_idle_release_scans.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from agentd import idle_release
from inprocess import in_process_service

IDLE_S = 1.0


@pytest.mark.parametrize("ending", ["completed", "runtime_silent"])
async def test_a_conversation_is_released_idle_release_s_after_its_turn_ends(tmp_path: Path, ending: str) -> None:
    script = tmp_path / "turn.toml"
    if ending == "completed":
        script.write_text('[[turn]]\n[[turn.step]]\nkind = "sleep"\nms = 300\n'
                          '[[turn.step]]\nkind = "text"\ntext = "done"\n')
    else:  # the runtime goes silent and ignores the cancel: agentd ends the turn, no event does
        script.write_text('[[turn]]\n[[turn.step]]\nkind = "sleep"\nms = 60000\n')
    work = tmp_path / "work"
    work.mkdir()
    async with in_process_service(tmp_path) as (service, _hub):
        service.silence_timeout_s = 1.0
        service.cancel_timeout_s = 0.2
        async with trio.open_nursery() as nursery:
            await nursery.start(idle_release.run, service, IDLE_S)
            record = await service.create(provider="script", workdir=str(work), model=str(script))
            live = await service.live(record.id)
            conv = live.conv
            assert conv is not None
            closed: list[float] = []
            real_close = conv.close

            async def ignore_cancel() -> None:  # a hung runtime: the cancel is never confirmed
                await trio.lowlevel.checkpoint()

            async def close() -> None:
                closed.append(trio.current_time())
                await real_close()

            if ending == "runtime_silent":
                conv.cancel = ignore_cancel  # type: ignore[method-assign]
            conv.close = close  # type: ignore[method-assign]
            await service.send(record.id, "go")
            with trio.fail_after(10):
                while live.record.active_run:
                    await trio.sleep(0.005)
            ended = trio.current_time()
            assert live.last_run and live.conv is conv and not closed
            with trio.fail_after(3 * IDLE_S + 5):
                while not closed:
                    await trio.sleep(0.005)
            nursery.cancel_scope.cancel()
    # Idle for IDLE_S from the end on, then let go at the scan due then. (Idle from its last event
    # instead, the silent one went at the next scan after its end: anywhere up to IDLE_S after it.)
    assert IDLE_S - 0.02 <= closed[0] - ended <= IDLE_S + idle_release.period(IDLE_S) + 0.3
    assert live.conv is None
