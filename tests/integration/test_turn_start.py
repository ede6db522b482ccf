"""A turn's start records (its prompt, the checkpoint before it) reach a subscriber together,
in one write, and never wait behind something slow: a runtime's start or a git run publishes
what is held back first (ConversationService._start, publish_held).

The service runs in-process on the script provider, with real checkpoints (git) of a real
working directory; the subscriber's outbox records each hand-over, which the server writes
to the socket as one write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from agentd import checkpoints as cp
from agentd.conversations import ConversationService
from agentd.hub import Hub

from daemon_harness import REPO
from inprocess import RecordingOutbox, in_process_service, subscribe

ECHO = REPO / "conf" / "scripts" / "echo.toml"


class _Outbox(RecordingOutbox):
    """Each hand-over (one socket write in the server) kept apart, read by run."""

    def types(self, run: str) -> list[list[str]]:
        """The record types of ``run``, write by write (writes without any of them left out)."""
        out = [[r.type for r in batch if r.run == run] for batch in self.writes]
        return [t for t in out if t]

    def delivered(self, run: str, type_: str) -> bool:
        return any(r.run == run and r.type == type_ for r in self.records)


def _service(tmp_path: Path, extra: str = "") -> Any:
    return in_process_service(tmp_path, extra, checkpoints=True)


async def _turn(service: ConversationService, cid: str, text: str) -> str:
    sent = await service.send(cid, text)
    with trio.fail_after(20):
        while service.record(cid).active_run:
            await trio.sleep(0.005)
    return sent.run


def _subscribe(hub: Hub, cid: str) -> _Outbox:
    outbox = _Outbox()
    subscribe(hub, cid, outbox=outbox)
    return outbox


async def test_the_prompt_and_the_checkpoint_before_it_reach_a_subscriber_in_one_write(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("one\n")
    async with _service(tmp_path) as (service, hub):
        record = await service.create(provider="script", workdir=str(work), model=str(ECHO))
        await _turn(service, record.id, "first")  # opens the conversation, records the tree once
        outbox = _subscribe(hub, record.id)
        run = await _turn(service, record.id, "second")  # an unchanged tree: recorded in place
        writes = outbox.types(run)
        assert writes[0] == ["prompt", "checkpoint"], writes
        phases = [msgspec.json.decode(r.data)["phase"] for b in outbox.writes for r in b if r.type == "checkpoint"]
        assert phases == ["before", "after"]
        assert writes[-1][-1] == "turn"  # the turn still ends, its records all delivered
        assert sum(len(w) for w in writes) == len([r for b in outbox.writes for r in b if r.run == run])


async def test_a_prompt_is_delivered_before_the_git_run_of_its_checkpoint_and_before_its_runtime_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # [checkpoints] watch = false: every checkpoint runs git, which the turn waits for; the prompt
    # record must not wait with it. A prompt to a closed conversation waits for its runtime likewise.
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("one\n")
    seen: dict[str, bool] = {}
    async with _service(tmp_path, "[checkpoints]\nwatch = false\n") as (service, hub):
        record = await service.create(provider="script", workdir=str(work), model=str(ECHO))
        outbox = _subscribe(hub, record.id)
        open_ = service.runtimes.open

        async def opening(*args: object, **kwargs: object) -> object:
            run = service.record(record.id).active_run
            seen["open"] = outbox.delivered(run, "prompt")
            return await open_(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(service.runtimes, "open", opening)
        record_git = cp._Shadow.record

        async def recording(shadow: cp._Shadow, job: cp._Job) -> None:
            run = service.record(record.id).active_run
            if job.ref == f"{run}-before":
                seen.setdefault("git", outbox.delivered(run, "prompt"))
            await record_git(shadow, job)

        monkeypatch.setattr(cp._Shadow, "record", recording)
        first = await _turn(service, record.id, "first")  # open since its create: only git is waited for
        assert seen == {"git": True}, seen
        seen.clear()
        assert await service.reopen_later(record.id)  # closed: the next prompt opens it again
        second = await _turn(service, record.id, "second")
        assert seen == {"open": True, "git": True}, seen
        for run in (first, second):
            assert outbox.types(run)[0] == ["prompt"]  # published on its own, ahead of the wait
            assert outbox.delivered(run, "checkpoint") and outbox.delivered(run, "turn")


async def test_the_start_records_follow_the_prompt_to_a_running_runtime_and_precede_a_send_that_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A subscriber woken before the runtime has its prompt competes with it for the CPU: the start
    # records go out once the provider's send is through. A send that waits (a runtime starting)
    # must not hold them back: they go out at the next scheduler pass (agentd._after_step).
    work = tmp_path / "work"
    work.mkdir()
    async with _service(tmp_path) as (service, hub):
        record = await service.create(provider="script", workdir=str(work), model=str(ECHO))
        await _turn(service, record.id, "first")
        outbox = _subscribe(hub, record.id)
        live = await service.live(record.id)
        conv = live.conv
        assert conv is not None
        send = conv.send
        seen: list[tuple[str, bool]] = []
        waits = {"second": False, "third": True}

        async def sending(prompt: Any) -> None:
            run = service.record(record.id).active_run
            seen.append((prompt.text, outbox.delivered(run, "prompt")))
            if waits[prompt.text]:
                await trio.sleep(0.05)
                seen.append(("waited", outbox.delivered(run, "prompt")))
            await send(prompt)

        monkeypatch.setattr(conv, "send", sending)
        second = await _turn(service, record.id, "second")
        third = await _turn(service, record.id, "third")
        assert seen == [("second", False), ("third", False), ("waited", True)], seen
        for run in (second, third):
            assert outbox.types(run)[0] == ["prompt", "checkpoint"]  # still one write
            assert outbox.delivered(run, "turn")


async def test_records_synced_out_of_order_reach_a_subscriber_in_seq_order(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # fsync always: each record is on disk before anyone sees it. Two tasks journaling into one
    # conversation each await a sync; the later one may resume first (trio runs a batch in either
    # order). Its record must not go out ahead of the earlier one, which a subscriber would then
    # never get (the hub skips what is at or below its cursor).
    work = tmp_path / "work"
    work.mkdir()
    calls: list[trio.Event] = []

    async def out_of_order() -> None:
        mine = trio.Event()
        calls.append(mine)
        await sync()
        if len(calls) == 1:
            await mine.wait()  # the first caller resumes only after the second one is through
        else:
            calls[0].set()

    async with _service(tmp_path) as (service, hub):
        service._sync_before_publish = True  # as with [journal] fsync = "always"
        record = await service.create(provider="script", workdir=str(work), model=str(ECHO))
        live = await service.live(record.id)
        outbox = _subscribe(hub, record.id)
        sync = live.journal.sync
        monkeypatch.setattr(live.journal, "sync", out_of_order)
        async with trio.open_nursery() as nursery:
            for text in ("first", "second"):
                nursery.start_soon(service.journal, live, "error", msgspec.json.encode({"message": text}))
                await trio.testing.wait_all_tasks_blocked()
        got = [(r.seq, msgspec.json.decode(r.data)["message"]) for b in outbox.writes for r in b]
        assert [m for _, m in got] == ["first", "second"], got
        assert [s for s, _ in got] == sorted(s for s, _ in got)
