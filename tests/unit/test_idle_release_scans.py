"""When agentd.idle_release scans: when the next conversation it saw can fall idle, never on a
fixed beat (a thousand idle conversations cost no wake-ups while none can be released)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio

from agentd import idle_release

IDLE_S = 300.0


class _Conv:
    def __init__(self) -> None:
        self.closed_at: float | None = None

    async def close(self) -> None:
        self.closed_at = trio.current_time()


class _Live:
    """What release_idle reads of a loaded conversation."""

    def __init__(self, cid: str, provider: str = "script") -> None:
        self.conv: _Conv | None = _Conv()
        self.first_conv = self.conv
        self.run = self.opening_run = ""
        self.queue: list[Any] = []
        self.pending: dict[str, Any] = {}
        self.last_event = trio.current_time()  # opened now, as ConversationService stamps it
        self.open_lock = trio.Lock()
        self.record = SimpleNamespace(id=cid, provider=provider)


class _Service:
    def __init__(self, reopenable: tuple[str, ...] = ("script",)) -> None:
        self.lives: list[_Live] = []
        self.scans: list[float] = []
        self.runtimes = SimpleNamespace(get=self._get)
        self._reopenable = reopenable

    async def _get(self, provider: str) -> Any:
        reopen = provider in self._reopenable
        return SimpleNamespace(capabilities=lambda: SimpleNamespace(reopen=reopen))

    def loaded(self) -> list[_Live]:
        self.scans.append(trio.current_time())
        return self.lives


async def test_nothing_to_release_costs_one_scan_per_idle_time(autojump_clock: Any) -> None:
    service = _Service()
    async with trio.open_nursery() as nursery:
        await nursery.start(idle_release.run, service, IDLE_S)
        await trio.sleep(10.5 * IDLE_S)  # scans at 0, 300, ..., 3000
        nursery.cancel_scope.cancel()
    # A fixed beat of period(IDLE_S) = 30 s would have scanned 100 times.
    assert len(service.scans) == 11
    assert all(b - a == IDLE_S for a, b in zip(service.scans, service.scans[1:]))


async def test_idle_conversations_that_cannot_be_released_cost_no_extra_scans(autojump_clock: Any) -> None:
    service = _Service(reopenable=())
    service.lives = [_Live(f"c{i}", provider="copilot") for i in range(1000)]
    async with trio.open_nursery() as nursery:
        await nursery.start(idle_release.run, service, IDLE_S)
        for i, live in enumerate(service.lives[:10]):  # events now and then: none of them is due
            await trio.sleep(50)
            live.last_event = trio.current_time()
        await trio.sleep(10.5 * IDLE_S - 500)  # scans at 0, 300, ..., 3000
        nursery.cancel_scope.cancel()
    assert len(service.scans) == 11
    assert all(live.conv is live.first_conv and live.first_conv.closed_at is None for live in service.lives)


async def test_a_conversation_is_released_when_it_falls_idle_within_one_period(autojump_clock: Any) -> None:
    service = _Service()
    gap = idle_release.period(IDLE_S)
    async with trio.open_nursery() as nursery:
        await nursery.start(idle_release.run, service, IDLE_S)
        await trio.sleep(10)
        early = _Live("opened-after-a-scan")  # idle from t=10: due at 310, the scan after 0 comes at 300
        service.lives.append(early)
        await trio.sleep(500)
        busy = _Live("busy")
        busy.run = "run-1"  # a long turn: not idle, whatever its last event
        busy.last_event = 0.0
        service.lives.append(busy)
        await trio.sleep(2000)
        busy.run = ""
        busy.last_event = trio.current_time()  # stamped at the turn's end, whoever ended it (_end_turn)
        ended = busy.last_event
        await trio.sleep(2 * IDLE_S)
        nursery.cancel_scope.cancel()
    assert early.conv is None and early.first_conv.closed_at is not None
    assert 310 <= early.first_conv.closed_at <= 310 + gap
    assert busy.conv is None and busy.first_conv.closed_at is not None
    assert ended + IDLE_S <= busy.first_conv.closed_at <= ended + IDLE_S + gap
    assert all(b - a >= gap for a, b in zip(service.scans, service.scans[1:]))


async def test_activity_moves_the_next_scan_and_the_release_with_it(autojump_clock: Any) -> None:
    service = _Service()
    live = _Live("c1")
    service.lives.append(live)
    async with trio.open_nursery() as nursery:
        await nursery.start(idle_release.run, service, IDLE_S)
        await trio.sleep(200)
        live.last_event = trio.current_time()  # an event at 200: idle from 500
        await trio.sleep(1000)
        nursery.cancel_scope.cancel()
    assert live.first_conv.closed_at is not None
    assert 500 <= live.first_conv.closed_at <= 500 + idle_release.period(IDLE_S)
