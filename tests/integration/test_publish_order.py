"""What a subscriber gets when publishing meets a failed sync or a hold across a wait
(ConversationService._append, _publish_synced, publish_held, flush_held; Journal.sync):
never a record twice, never one whose fsync failed as durable, never a burst's live-only
record after the durable ones that followed it.

In-process service on the script provider, as tests/integration/test_turn_start.py builds it.
"""

from __future__ import annotations

import errno
import functools
import os
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from agentd import contract as c
from agentd import journal as journal_mod
from agentd import wire
from agentd.conversations import ConversationService
from agentd.hub import Subscription
from agentd.journal import FsyncPolicy

from daemon_harness import REPO
from inprocess import RecordingOutbox, in_process_service, subscribe

ECHO = REPO / "conf" / "scripts" / "echo.toml"


def _service(tmp_path: Path, fsync: FsyncPolicy) -> Any:
    return in_process_service(tmp_path, fsync=fsync)


async def _conversation(service: ConversationService, tmp_path: Path) -> tuple[Any, Any]:
    """A new script conversation in ``tmp_path/work``, loaded: (its record, its live side)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    record = await service.create(provider="script", workdir=str(work), model=str(ECHO))
    return record, await service.live(record.id)


# --------------------------------------------------------------------------- fsync always, a failed sync


async def _journal_or_refused(service: ConversationService, live: object, data: bytes) -> None:
    """Journal an error record; a journal that refuses it (after a failed sync) is fine too."""
    try:
        await service.journal(live, "error", data)  # type: ignore[arg-type]
    except c.InternalError:
        pass


async def test_a_record_whose_fsync_failed_is_never_published_as_durable_nor_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fsync always, two tasks journaling into one conversation, fsyncs in a worker thread. A's
    # fsync fails (EIO) while B, which journaled after it began, waits to sync. Before, B's own
    # fsync ran alongside and could succeed (Linux reports a writeback error to one fsync of the
    # file only), and B's _publish_synced published A's record as durable, which A's
    # _append_or_publish had also told live (seq 0): twice, once as durable though it is not.
    async with _service(tmp_path, FsyncPolicy.ALWAYS) as (service, hub):
        record, live = await _conversation(service, tmp_path)
        outbox = subscribe(hub, record.id, live.published_seq)

        monkeypatch.setattr(journal_mod._FsyncTimer, "inline", property(lambda self: False))  # thread path
        real = journal_mod._timed_fsync_fds
        calls: list[int] = []
        started, fail = threading.Event(), threading.Event()

        def fsync_fds(jobs: list[tuple[Any, int]]) -> None:
            calls.append(len(jobs))
            if len(calls) == 1:  # A's: fails once B waits too
                started.set()
                fail.wait(5)
                for _, fd in jobs:
                    os.close(fd)
                raise OSError(errno.EIO, "Input/output error")
            real(jobs)

        monkeypatch.setattr(journal_mod, "_timed_fsync_fds", fsync_fds)
        turn = c.Turn(state=c.TurnState.COMPLETED)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(service._append_or_publish, live, "turn", msgspec.json.encode(turn),
                                                 run=""))
            with trio.fail_after(5):
                while not started.is_set():
                    await trio.sleep(0.001)
            nursery.start_soon(_journal_or_refused, service, live, b'{"message":"B"}')
            await trio.testing.wait_all_tasks_blocked()
            fail.set()
        assert calls == [1]  # no fsync ran alongside the failing one, nor after it
        got = [(r.type, r.seq) for r in outbox.records]
        # A's turn record: told live once, never as durable; B's record is not known durable either.
        assert [t for t in got if t[0] == "turn"] == [("turn", 0)], got
        assert [t for t in got if t[0] == "error"] == [], got
        # Nor later: the journal takes no more records, and no sync of it succeeds.
        await _journal_or_refused(service, live, b'{"message":"C"}')
        assert [(r.type, r.seq) for r in outbox.records] == got


async def test_a_sync_without_an_fd_to_hand_over_neither_fails_nor_duplicates_the_record(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fsync always; os.dup of the journal's fd fails (EMFILE) as the sync hands the fsync to a
    # worker thread. Before, the sync raised with the journal still taking records: the record,
    # written, was queued as unjournaled and written again by the next append, and the stale
    # syncing entry published too: the turn end three times to the subscriber, twice on disk.
    # Now the fsync runs on the trio thread instead: the record is durable, published once.
    async with _service(tmp_path, FsyncPolicy.ALWAYS) as (service, hub):
        record, live = await _conversation(service, tmp_path)
        before = live.published_seq
        outbox = subscribe(hub, record.id, before)

        monkeypatch.setattr(journal_mod._FsyncTimer, "inline", property(lambda self: False))
        real_dup = os.dup
        failed: list[int] = []

        def dup(fd: int) -> int:
            if not failed:
                failed.append(fd)
                raise OSError(errno.EMFILE, "Too many open files")
            return real_dup(fd)

        monkeypatch.setattr(journal_mod.os, "dup", dup)
        turn = c.Turn(state=c.TurnState.COMPLETED)
        await service._append_or_publish(live, "turn", msgspec.json.encode(turn), run="")
        assert failed
        await _journal_or_refused(service, live, b'{"message":"later"}')
        got = [(r.type, r.seq) for r in outbox.records]
        on_disk = [msgspec.json.decode(line)["type"] for line in await live.journal.read_after(before)]
        assert on_disk.count("turn") == 1, (on_disk, got)
        assert [t for t in got if t[0] == "turn"] == [("turn", before + 1)], got


# --------------------------------------------------------------------------- the pump's hold across a yield


async def _burst_waiting_on_a_tool_output(service: ConversationService, live: Any, monkeypatch: pytest.MonkeyPatch,
                                          *events: c.Event) -> threading.Event:
    """Hand the pump ``events`` (deltas and others) then a tool's whole output, whose write (a worker
    thread) waits until the returned event is set; returns once the pump waits for it."""
    release = threading.Event()

    def keep(*args: object) -> bool:
        release.wait(5)  # a large output being written
        return True

    monkeypatch.setattr(service.tool_outputs, "keep", keep)
    for event in events:
        if isinstance(event, c.Delta):
            live.events.put_delta(event)
        else:
            live.events.put(event)
    live.events.put(c.ToolOutputEvent(item_id="t1", output="x" * 100))
    await trio.testing.wait_all_tasks_blocked()
    return release


async def _burst_handled(live: Any, release: threading.Event) -> None:
    release.set()
    with trio.fail_after(5):
        while live.events._items or live.held is not None:  # the burst handled, its hold ended
            await trio.sleep(0.01)


async def test_deltas_held_across_a_tool_output_write_are_not_sent_again_after_a_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The pump holds a burst's records until the burst ends (_pump); whatever yields publishes
    # them first. A ToolOutputEvent's handling yielded without that (_keep_output: a worker
    # thread). A subscriber that subscribed meanwhile (server._subscribe: catch up to
    # published_seq, go live, snapshot) got the held deltas' text in its snapshot (live.items
    # has it), then the same deltas again when the hold ended: duplicated text.
    async with _service(tmp_path, FsyncPolicy.BATCH) as (service, hub):
        record, live = await _conversation(service, tmp_path)
        # One burst: the assistant's text, then a tool's whole output (emitted before its item).
        release = await _burst_waiting_on_a_tool_output(
            service, live, monkeypatch, c.Delta(item_id="i1", kind=c.ItemKind.ASSISTANT, text="Let me look at it."))

        # What server._subscribe does: subscribe after published_seq, catch up (nothing), go live,
        # then the snapshot frame.
        outbox = RecordingOutbox()
        sub = Subscription(1, record.id, outbox, after=live.published_seq)
        hub.add(sub)
        assert sub.cursor >= live.published_seq  # nothing to catch up
        sub.live = True
        snap = service.snapshot(live)
        assert [i.text for i in snap.items] == ["Let me look at it."]

        await _burst_handled(live, release)
        deltas = [msgspec.json.decode(r.data)["text"] for r in outbox.records if r.type == "delta"]
        # The snapshot already holds that text: sending its delta after it duplicates it.
        assert deltas == [], deltas


async def test_a_catching_up_subscriber_never_gets_a_held_delta_after_the_item_it_belongs_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Same hold, no snapshot: the burst is a delta of item i1, i1's complete item record (journaled,
    # seq N, held), then a tool's whole output (a worker thread). A subscriber catching up
    # meanwhile read the journal through N (published_seq counts the held record) and went live;
    # when the hold ended, publish_many skipped N for it (at its cursor) but sent the delta: i1's
    # delta after i1's final record, which a client applies to the completed item (text doubled).
    async with _service(tmp_path, FsyncPolicy.BATCH) as (service, hub):
        record, live = await _conversation(service, tmp_path)
        release = await _burst_waiting_on_a_tool_output(
            service, live, monkeypatch, c.Delta(item_id="i1", kind=c.ItemKind.ASSISTANT, text="Let me look at it."),
            c.ItemEvent(item=c.Item(id="i1", kind=c.ItemKind.ASSISTANT, text="Let me look at it.")))

        # server._subscribe with after=0: catch up from the journal to published_seq, then go live.
        outbox = RecordingOutbox()
        sub = Subscription(1, record.id, outbox, after=0)
        hub.add(sub)
        while sub.cursor < live.published_seq:
            lines = await live.journal.read_after(sub.cursor, limit=live.published_seq - sub.cursor)
            outbox.offer_many(b"".join(sub.frame(record.id, line) for line in lines), len(lines))
            sub.cursor += len(lines)
        sub.live = True

        await _burst_handled(live, release)
        got = [(r.type, r.seq) for r in outbox.records if r.type in ("item", "delta")]
        assert got[-1][0] == "item", got  # nothing of i1 streams after its final record


async def test_a_subscriber_going_live_during_a_hold_gets_no_held_live_only_record_after_the_durable_ones(
        tmp_path: Path) -> None:
    # Whatever still holds records back when a subscriber goes live (a burst mid-way), the server
    # flushes them to the live subscribers first (flush_held): the new one read the held durable
    # records from the journal, and a held delta handed to it afterwards would follow them.
    from agentd.server import Server, _Connection

    async with _service(tmp_path, FsyncPolicy.BATCH) as (service, hub):
        record, live = await _conversation(service, tmp_path)
        watching = subscribe(hub, record.id, live.published_seq)
        # A burst mid-way: a delta of item i1, then i1's journaled record, both held back.
        live.held = []
        service._publish_live(live, "delta", b'{"item_id":"i1","kind":"assistant","text":"Hi"}')
        seq = await service.journal(live, "item", msgspec.json.encode(c.Item(id="i1", kind=c.ItemKind.ASSISTANT,
                                                                              text="Hi")))
        assert [s for s, _ in live.held] == [0, seq]

        server = Server(service, hub, state_dir=tmp_path / "state", socket_path=tmp_path / "s.sock", check_uid=False)
        left, _right = trio.testing.memory_stream_pair()
        conn = _Connection(server, left, "test", 4096)
        await server._subscribe(conn, wire.Subscribe(id=7, conversation=record.id, after=0, snapshot=False))
        service.publish_held(live)  # the burst ends

        got = []
        for chunk in conn._frames:
            for line in chunk.splitlines():
                frame = wire.decode_server_frame(line)
                if isinstance(frame, wire.EventFrame):
                    rec = wire.decode_record(frame.record)
                    got.append((rec.type, rec.seq))
        assert got[-1] == ("item", seq), got  # from its catch-up; nothing of i1 after it
        assert [(r.type, r.seq) for r in watching.records][-2:] == [("delta", 0), ("item", seq)]


# --------------------------------------------------------------------------- deltas handled outside the pump


async def test_a_delta_while_the_pump_is_idle_is_published_at_once(tmp_path: Path) -> None:
    # _Sink.emit handles a text delta in the provider's own task when the pump waits for events:
    # published before the emitter yields, with no wake of the pump's task (one per streamed chunk).
    async with _service(tmp_path, FsyncPolicy.BATCH) as (service, hub):
        record, live = await _conversation(service, tmp_path)
        outbox = subscribe(hub, record.id, live.published_seq)
        await trio.testing.wait_all_tasks_blocked()
        assert live.events.waiting()
        before = live.last_event
        live.sink.emit(c.DeltaEvent(delta=c.Delta(item_id="i1", kind=c.ItemKind.ASSISTANT, text="Hello")))
        assert [msgspec.json.decode(r.data)["text"] for r in outbox.records if r.type == "delta"] == ["Hello"]
        assert live.last_event > before  # what the pump stamps (the inactivity watch reads it)
        assert [s.text for s in service.snapshot(live).items] == ["Hello"]


async def test_a_delta_emitted_while_the_pump_handles_an_event_never_overtakes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The pump is busy (a tool's whole output being written in a worker thread), nothing queued
    # behind it: a delta emitted now is queued, not handled at once ahead of that event's records.
    async with _service(tmp_path, FsyncPolicy.BATCH) as (service, hub):
        record, live = await _conversation(service, tmp_path)
        outbox = subscribe(hub, record.id, live.published_seq)
        release = await _burst_waiting_on_a_tool_output(
            service, live, monkeypatch, c.ItemEvent(item=c.Item(id="t1", kind=c.ItemKind.TOOL, text="ls")))
        assert not live.events._items and not live.events.waiting()
        live.sink.emit(c.DeltaEvent(delta=c.Delta(item_id="i2", kind=c.ItemKind.ASSISTANT, text="After it")))
        assert not [r for r in outbox.records if r.type == "delta"]
        await _burst_handled(live, release)
        await trio.testing.wait_all_tasks_blocked()
        kinds = [r.type for r in outbox.records]
        assert kinds == ["item", "delta"], kinds


async def test_deltas_emitted_in_one_step_or_right_after_a_run_go_to_the_pump_as_one_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A burst (several deltas in one step of the emitter) is not handled delta by delta outside
    # the pump: after the first, they are queued, and the pump publishes them in one go (the hub's
    # one join, one write per subscriber), after the first and in order.
    from agentd import conversations

    now = [1000.0]
    monkeypatch.setattr(conversations, "_perf_counter", lambda: now[0])  # time passes only when told

    def emit(*texts: str) -> None:
        for text in texts:
            live.sink.emit(c.DeltaEvent(delta=c.Delta(item_id="i1", kind=c.ItemKind.ASSISTANT, text=text)))

    async with _service(tmp_path, FsyncPolicy.BATCH) as (service, hub):
        record, live = await _conversation(service, tmp_path)
        outbox = subscribe(hub, record.id, live.published_seq)
        await trio.testing.wait_all_tasks_blocked()
        emit(*(f"d{i} " for i in range(5)))
        assert [len(batch) for batch in outbox.writes] == [1]  # the first at once, the rest queued
        now[0] += 0.001  # the pump publishes them a millisecond after the first was handled
        await trio.testing.wait_all_tasks_blocked()
        assert [len(batch) for batch in outbox.writes] == [1, 4]
        # The next burst comes right after the pump published that one (a runtime streaming on as
        # fast as agentd publishes): the pump takes all of it, one write, none handled alone first.
        emit(*(f"d{i} " for i in range(5, 10)))
        assert [len(batch) for batch in outbox.writes] == [1, 4]
        await trio.testing.wait_all_tasks_blocked()
        assert [len(batch) for batch in outbox.writes] == [1, 4, 5]
        # A delta that comes alone, later (a runtime writing a chunk at a time), is handled at once.
        now[0] += 0.001
        emit("alone")
        assert [len(batch) for batch in outbox.writes] == [1, 4, 5, 1]
        assert [msgspec.json.decode(r.data)["text"] for r in outbox.records] == [*(f"d{i} " for i in range(10)), "alone"]


# --------------------------------------------------------------------------- an answer and the reply it starts

ASK = """
model = "ask"
chunk = 4
delay_ms = 1

[[turn]]
[[turn.step]]
kind = "question"
title = "Pick a colour"
text = "Which colour?"
choices = ["red", "blue"]
echo = "Great, {answer} it is."
"""


async def test_a_subscriber_sees_the_answer_before_the_reply_it_starts(tmp_path: Path) -> None:
    # The script provider resumes its turn as soon as it has the answer, in the same scheduler
    # pass as the answering request: its first delta ("Grea") came before the answer record
    # in 11 of 38 live demo runs (agentctl run printed the reply's start above "answered").
    script = tmp_path / "ask.toml"
    script.write_text(ASK)
    async with _service(tmp_path, FsyncPolicy.BATCH) as (service, hub):
        work = tmp_path / "work"
        work.mkdir()
        record = await service.create(provider="script", workdir=str(work), model=str(script))
        live = await service.live(record.id)
        for i in range(12):  # trio runs a pass's tasks in either order: try both, several times
            outbox = subscribe(hub, record.id, live.published_seq)
            await service.send(record.id, f"ask {i}")
            with trio.fail_after(10):
                while not live.pending:
                    await trio.sleep(0.001)
            await service.answer(record.id, next(iter(live.pending)), c.Answer(answers=[["blue"]]))
            with trio.fail_after(10):
                while live.record.active_run:
                    await trio.sleep(0.001)
            kinds = [r.type for r in outbox.records]
            assert "delta" in kinds and kinds.index("answer") < kinds.index("delta"), kinds


async def test_a_provider_slow_to_take_an_answer_holds_the_conversations_events_once_and_briefly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The hold is bounded (RESPOND_HOLD_S) and taken once per answer: a respond that hangs does not
    # make every later event wait its own RESPOND_HOLD_S.
    from agentd import conversations

    monkeypatch.setattr(conversations, "RESPOND_HOLD_S", 0.5)
    async with _service(tmp_path, FsyncPolicy.BATCH) as (service, hub):
        record, live = await _conversation(service, tmp_path)
        outbox = subscribe(hub, record.id, live.published_seq)
        live.responding["q1"] = None  # an answer being handed over, which never completes
        t0 = trio.current_time()
        for i in range(5):
            live.events.put(c.ItemEvent(item=c.Item(id=f"i{i}", kind=c.ItemKind.ASSISTANT, text=f"item {i}")))
        with trio.fail_after(5):
            while len([r for r in outbox.records if r.type == "item"]) < 5:
                await trio.sleep(0.01)
        waited = trio.current_time() - t0
        assert 0.5 <= waited < 1.5, waited  # one hold (0.5 s), not one per event (2.5 s), with room for a loaded machine
        live.responding.clear()
