"""set-model against a close, a send and the provider's refusal (agentd.models), in-process on the
script provider, where the test holds each interleaving: a close or a prompt that comes while a
choice is being checked or applied, a queued choice the provider refuses at the next prompt, and
a refused choice's journal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from agentd import contract as c
from agentd import models, wire
from agentd.conversations import ConversationService
from agentd.providers.script import ScriptConversation

from inprocess import in_process_service

SCRIPT = '''
[[models]]
id = "fast"
[[models]]
id = "slow"
[[turn]]
match = "wait"
[[turn.step]]
kind = "wait"
[[turn]]
[[turn.step]]
kind = "text"
text = "ok {prompt}"
delay_ms = 0
'''


async def _new(service: ConversationService, tmp_path: Path) -> str:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    script = tmp_path / "s.toml"
    script.write_text(SCRIPT)
    return (await service.create(provider="script", workdir=str(work), model=str(script))).id


async def _idle(service: ConversationService, cid: str) -> None:
    with trio.fail_after(20):
        while service.record(cid).active_run:
            await trio.sleep(0.005)


async def _turn(service: ConversationService, cid: str, text: str) -> str:
    run = (await service.send(cid, text)).run
    await _idle(service, cid)
    return run


def _journal(tmp_path: Path, cid: str) -> list[dict[str, Any]]:
    path = tmp_path / "state" / "conversations" / cid / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _picks(journal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in journal if r["type"] == "model_selection" and r["data"].get("source") == "user"]


def _loaded(service: ConversationService, cid: str) -> Any:
    return next(live for live in service.loaded() if live.record.id == cid)


async def _select(service: ConversationService, cid: str, model: str, out: dict[str, Any], **kw: Any) -> None:
    try:
        out["result"] = await models.select(service, cid, model, **kw)
    except c.AgentdError as exc:
        out["result"] = exc


def _gate_catalog(monkeypatch: pytest.MonkeyPatch) -> tuple[trio.Event, trio.Event]:
    """The catalog check (slow on a big scripts_dir) held until the test opens the gate."""
    entered, gate = trio.Event(), trio.Event()
    real = models.catalog

    async def catalog(runtimes: Any, provider: str) -> Any:
        entered.set()
        await gate.wait()
        return await real(runtimes, provider)

    monkeypatch.setattr(models, "catalog", catalog)
    return entered, gate


async def test_a_close_during_the_catalog_check_leaves_the_closed_conversation_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with in_process_service(tmp_path) as (service, _hub):
        cid = await _new(service, tmp_path)
        await _turn(service, cid, "one")
        model = service.record(cid).model
        entered, gate = _gate_catalog(monkeypatch)
        out: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_select, service, cid, "slow", out)
            await entered.wait()
            await service.close(cid)
            gate.set()
        assert isinstance(out["result"], c.Closed), out
        journal = _journal(tmp_path, cid)
        closed = max(i for i, r in enumerate(journal) if r["type"] == "state" and r["data"]["state"] == "closed")
        assert [(r["type"], r["data"].get("action")) for r in journal[closed + 1:]] == [("lease", "released")]
        assert _picks(journal) == []
        record = service.record(cid)
        assert record.state is wire.ConversationState.CLOSED and record.model == model
        assert _loaded(service, cid).conv is None  # not reopened on its runtime


async def test_a_close_while_set_model_opens_the_runtime_closes_what_it_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with in_process_service(tmp_path) as (service, _hub):
        cid = await _new(service, tmp_path)
        await _turn(service, cid, "one")
        assert await service.detach(_loaded(service, cid))  # idle, not open on its runtime
        model = service.record(cid).model
        entered, gate = trio.Event(), trio.Event()
        real_open = service.runtimes.open

        async def slow_open(*args: Any, **kw: Any) -> Any:
            entered.set()
            await gate.wait()
            return await real_open(*args, **kw)

        monkeypatch.setattr(service.runtimes, "open", slow_open)
        out: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_select, service, cid, "slow", out)
            await entered.wait()
            await service.close(cid)  # finds nothing open to close
            gate.set()
        assert isinstance(out["result"], c.Closed), out
        journal = _journal(tmp_path, cid)
        assert journal[-1]["type"] == "lease" and journal[-2]["data"] == {"state": "closed"}
        assert _picks(journal) == []
        assert service.record(cid).model == model
        assert _loaded(service, cid).conv is None  # what set_model opened was closed again


async def test_a_prompt_sent_while_a_choice_is_applied_waits_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with in_process_service(tmp_path) as (service, _hub):
        cid = await _new(service, tmp_path)
        await _turn(service, cid, "one")
        entered, gate = trio.Event(), trio.Event()
        real = ScriptConversation.set_model

        async def slow_set_model(self: ScriptConversation, *args: Any, **kw: Any) -> None:
            entered.set()
            await gate.wait()
            await real(self, *args, **kw)

        monkeypatch.setattr(ScriptConversation, "set_model", slow_set_model)
        out: dict[str, Any] = {}
        sent: dict[str, Any] = {}

        async def send() -> None:
            sent["run"] = (await service.send(cid, "two")).run

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_select, service, cid, "slow", out)
            await entered.wait()
            nursery.start_soon(send)
            await trio.sleep(0.3)  # the prompt may not start under the choice being applied
            assert service.record(cid).active_run == ""
            gate.set()
        assert isinstance(out["result"], wire.ConversationRecord), out
        await _idle(service, cid)
        journal = _journal(tmp_path, cid)
        pick = _picks(journal)[-1]
        prompt = next(r for r in journal if r["type"] == "prompt" and r.get("run") == sent["run"])
        assert pick["seq"] < prompt["seq"] and not pick.get("run")
        working = next(r for r in journal if r["type"] == "turn" and r.get("run") == sent["run"])
        assert working["data"].get("model") == "slow"  # the turn ran with the choice made before it


async def test_a_queued_choice_the_provider_refuses_is_dropped_and_the_prompt_goes_on(tmp_path: Path) -> None:
    async with in_process_service(tmp_path) as (service, _hub):
        cid = await _new(service, tmp_path)
        model = service.record(cid).model
        await service.send(cid, "wait")
        missing = str(tmp_path / "missing.toml")
        queued = await models.select(service, cid, missing, after_turn=True)
        assert queued.next_model is not None and queued.next_model.model == missing
        await service.cancel(cid)
        await _idle(service, cid)
        run = await _turn(service, cid, "hello")
        journal = _journal(tmp_path, cid)
        ends = [r["data"]["state"] for r in journal if r["type"] == "turn" and r.get("run") == run]
        assert ends[-1] == "completed", journal[-5:]
        errors = [r for r in journal if r["type"] == "error" and r.get("run") == run]
        assert len(errors) == 1 and missing in errors[0]["data"]["message"]
        assert "dropped" in errors[0]["data"]["message"] and errors[0]["data"]["code"] == "invalid"
        record = service.record(cid)
        assert record.next_model is None and record.model == model
        await _turn(service, cid, "again")  # nothing left queued: no second refusal
        assert len([r for r in _journal(tmp_path, cid) if r["type"] == "error"]) == 1
        assert [p["data"].get("queued") for p in _picks(_journal(tmp_path, cid))] == [True]


async def test_a_choice_the_provider_refuses_is_not_journaled_as_made(tmp_path: Path) -> None:
    async with in_process_service(tmp_path) as (service, _hub):
        cid = await _new(service, tmp_path)
        await _turn(service, cid, "one")
        with pytest.raises(c.Invalid):
            await models.select(service, cid, str(tmp_path / "missing.toml"))
        assert _picks(_journal(tmp_path, cid)) == []
        await models.select(service, cid, "slow")
        assert [p["data"]["model"] for p in _picks(_journal(tmp_path, cid))] == ["slow"]
        assert service.record(cid).model == "slow"


async def test_a_model_name_too_long_for_a_path_is_invalid_not_internal(tmp_path: Path) -> None:
    async with in_process_service(tmp_path) as (service, _hub):
        cid = await _new(service, tmp_path)
        await _turn(service, cid, "one")
        with pytest.raises(c.Invalid) as refused:
            await models.select(service, cid, "x" * 100_000)
        assert len(refused.value.message) < 2000  # names the model, does not carry it whole
        with pytest.raises(c.Invalid):
            await service.create(provider="script", workdir=str(tmp_path / "work"), model="y" * 5000)
