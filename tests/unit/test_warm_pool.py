"""The warm pool's rules (agentd.warm_pool), on the real Runtimes and the real script provider."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from agentd import contract as c
from agentd.config import ConfigError, parse_config
from agentd.runtimes import Runtimes
from agentd.warm_pool import _Holding


class _Sink:
    def __init__(self) -> None:
        self.events: list[c.Event] = []
        self.keepers: object = None

    def emit(self, event: c.Event) -> None:
        self.events.append(event)

    def runs_under(self, keepers: object) -> None:
        self.keepers = keepers


@asynccontextmanager
async def _serving(tmp_path: Path, warm: int = 1, primed: str = "work") -> AsyncIterator[tuple[Runtimes, Path]]:
    """Runtimes with ``warm`` running on the script provider; with ``primed``, its pool filled for
    new conversations in ``tmp_path/primed`` (made). Yields (runtimes, that dir); stops them after."""
    text = (f'[providers]\ndefault = "script"\n[runtimes]\nwarm = {warm}\n'
            "restart_backoff_initial_s = 0.01\nrestart_backoff_max_s = 0.02\n")
    rt = Runtimes(parse_config(text), tmp_path / "state")
    work = tmp_path / primed
    async with trio.open_nursery() as nursery:
        await nursery.start(rt.run)
        if primed:
            work.mkdir()
            await _primed(rt, work)
        yield rt, work
        nursery.cancel_scope.cancel()


def _pooled(rt: Runtimes, name: str = "script") -> list[str]:
    pool = rt.warm._pools.get(name)
    return [e.conv.id for e in pool.entries] if pool else []


async def _primed(rt: Runtimes, work: Path) -> None:
    rt.warm.hint = lambda name: c.OpenRequest(workdir=str(work))
    rt.warm.prime()
    with trio.fail_after(10):
        await rt.warm.settled("script")


async def test_a_new_conversation_of_the_pooled_shape_takes_the_pooled_one_and_the_pool_refills(tmp_path: Path) -> None:
    async with _serving(tmp_path) as (rt, work):
        [pooled] = _pooled(rt)
        sink = _Sink()
        with trio.fail_after(10):
            conv = await rt.open("script", c.OpenRequest(workdir=str(work), title="mine"), sink)
        assert conv.id == pooled
        assert pooled not in _pooled(rt)  # taken means gone (a refill may already have made another)
        with trio.fail_after(10):
            await rt.warm.settled("script")
        [refilled] = _pooled(rt)
        assert refilled != pooled
        # The conversation taken reports to the sink of the conversation that took it.
        await conv.send(c.Prompt(text="hello"))
        with trio.fail_after(10):
            while not any(isinstance(e, c.TurnEvent) and e.turn.state == c.TurnState.COMPLETED for e in sink.events):
                await trio.sleep(0.01)
        # A second new conversation takes the refilled one, never the first again.
        other = await rt.open("script", c.OpenRequest(workdir=str(work)), _Sink())
        assert other.id == refilled != conv.id


async def test_a_new_conversation_of_another_shape_starts_cold_and_the_pool_moves_to_its_shape(tmp_path: Path) -> None:
    async with _serving(tmp_path) as (rt, work):
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (work / "hi.toml").write_text('[[turn]]\n[[turn.step]]\nkind = "text"\ntext = "hi"\n')
        [pooled] = _pooled(rt)
        pooled_conv = rt.warm._pools["script"].entries[0].conv
        for request in (c.OpenRequest(workdir=str(elsewhere)), c.OpenRequest(workdir=str(work), model="hi.toml"),
                        c.OpenRequest(workdir=str(work), effort="high")):
            conv = await rt.open("script", request, _Sink())
            assert conv.id != pooled
            assert conv.id not in _pooled(rt)
        with trio.fail_after(10):
            await rt.warm.settled("script")
        # The pool now keeps the last shape asked for; the old one was closed, never handed out.
        assert pooled not in _pooled(rt) and len(_pooled(rt)) == 1
        assert rt.warm._pools["script"].entries[0].key == b'{"workdir":"%s","effort":"high"}' % str(work).encode()
        assert pooled_conv._closed  # type: ignore[attr-defined]


async def test_a_reopen_never_takes_a_pooled_conversation(tmp_path: Path) -> None:
    async with _serving(tmp_path) as (rt, work):
        first = await rt.open("script", c.OpenRequest(workdir=str(work)), _Sink())
        with trio.fail_after(10):
            await rt.warm.settled("script")
        [pooled] = _pooled(rt)
        await first.close()
        again = await rt.open("script", c.OpenRequest(workdir=str(work), conversation_id=first.id), _Sink())
        assert again.id == first.id
        assert _pooled(rt) == [pooled]


async def test_shutdown_closes_every_pooled_conversation(tmp_path: Path) -> None:
    async with _serving(tmp_path, warm=3) as (rt, work):
        convs = [e.conv for e in rt.warm._pools["script"].entries]
        assert len(convs) == 3
    assert all(conv._closed for conv in convs)  # type: ignore[attr-defined]
    assert _pooled(rt) == []


async def test_a_reload_closes_the_pooled_conversations_and_refills_from_the_new_provider(tmp_path: Path) -> None:
    async with _serving(tmp_path) as (rt, work):
        old = rt.warm._pools["script"].entries[0]
        await rt.replace(rt.config)
        assert old.conv._closed  # type: ignore[attr-defined]
        with trio.fail_after(10):
            await rt.warm.settled("script")
        [entry] = rt.warm._pools["script"].entries
        assert entry.provider is await rt.get("script") and entry.provider is not old.provider


async def test_warm_zero_makes_nothing_ahead(tmp_path: Path) -> None:
    async with _serving(tmp_path, warm=0, primed="") as (rt, work):
        rt.warm.hint = lambda name: c.OpenRequest(workdir=str(work))
        rt.warm.prime()
        await rt.open("script", c.OpenRequest(workdir=str(work)), _Sink())
        await trio.sleep(0.05)
        assert rt.warm._pools == {}


async def test_a_refill_that_keeps_failing_stops_until_the_next_use(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    async with _serving(tmp_path, primed="") as (rt, _):
        rt.warm.hint = lambda name: c.OpenRequest(workdir=str(missing))
        rt.warm.prime()
        with trio.fail_after(10):
            await rt.warm.settled("script")
        pool = rt.warm._pools["script"]
        assert pool.failures == 3 and pool.entries == []
        assert not pool.wake.is_set()  # nothing scheduled: an idle daemon stays idle
        missing.mkdir()
        await rt.open("script", c.OpenRequest(workdir=str(missing)), _Sink())  # a use: tried again
        with trio.fail_after(10):
            await rt.warm.settled("script")
        assert len(pool.entries) == 1 and pool.failures == 0


def test_the_holding_sink_hands_over_in_order_and_reports_an_exit() -> None:
    dead: list[bool] = []
    holding = _Holding(lambda: dead.append(True))
    first = c.TitleEvent(title="a")
    holding.emit(first)
    assert not dead
    gone = c.ExitEvent(error="the runtime exited")
    holding.emit(gone)
    assert dead == [True] and holding.dead
    sink = _Sink()
    holding.bind(sink)
    later = c.TitleEvent(title="b")
    holding.emit(later)
    assert sink.events == [first, gone, later]


def test_where_a_pooled_conversation_runs_goes_to_the_sink_that_takes_it() -> None:
    # Its host tools answer only processes under the keepers its provider named (agentd.agent_peers).
    holding = _Holding(lambda: None)
    first, second = (lambda: frozenset({11})), (lambda: frozenset({22}))
    holding.runs_under(first)
    sink = _Sink()
    holding.bind(sink)
    assert sink.keepers is first
    holding.runs_under(second)  # the runtime restarted after the take
    assert sink.keepers is second


async def test_a_taken_pooled_conversation_reports_where_it_runs(tmp_path: Path) -> None:
    async with _serving(tmp_path) as (rt, work):
        sink = _Sink()
        with trio.fail_after(10):
            await rt.open("script", c.OpenRequest(workdir=str(work)), sink)
        assert callable(sink.keepers) and sink.keepers() == frozenset()  # no tool command runs


def test_warm_is_bounded_and_warm_workdir_absolute() -> None:
    with pytest.raises(ConfigError):
        parse_config("[runtimes]\nwarm = -1\n")
    with pytest.raises(ConfigError):
        parse_config("[runtimes]\nwarm = 17\n")
    with pytest.raises(ConfigError):
        parse_config('[runtimes]\nwarm_workdir = "relative/dir"\n')
    assert parse_config("[runtimes]\nwarm = 2\n").runtimes.warm == 2
